// Process groups for amax reduction. A group with one rank reduces nothing; multi-rank groups
// (NCCL, core/src/dist) implement Communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/handle.h"
#include "base/ref.h"

namespace te {

class Backend;

// A collective over the ranks of a group, enqueued on the backend's stream.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual void allreduce_max(float *buf, size_t count, Backend &backend) = 0;
  // Ends the communicator's pending and future work (te_group_abort); may run on another
  // thread while the owner waits on the stream. Throws InvalidState where that is not ours to do.
  virtual void abort() = 0;
};

// Reference counted: te_group_destroy drops the caller's reference, and every autocast scope,
// bucket and saved forward that uses the group holds one, so a group destroyed while a pending
// backward still needs it stays alive (its communicator too) until that backward is done.
class Group : public Handle, public RefCounted<Group> {
 public:
  Group(int rank, int size, std::unique_ptr<Communicator> comm);
  uint64_t id() const { return id_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool needs_reduction() const { return size_ > 1; }
  // In-place MAX over the group; a no-op for one rank.
  void allreduce_max(float *buf, size_t count, Backend &backend) const;
  // Throws InvalidState for a group without a communicator of its own to abort.
  void abort();

 private:
  uint64_t id_;
  int rank_, size_;
  std::unique_ptr<Communicator> comm_;
};

using GroupRef = Ref<const Group>;

// Ids are drawn from a process-wide counter: never 0, never reused (TE keyed on Python's id(),
// which is reused after free, so a new group could inherit a dead one's buckets).
uint64_t next_group_id();

}  // namespace te
