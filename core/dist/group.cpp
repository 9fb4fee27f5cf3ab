#include "dist/group.h"

#include <atomic>

#include "base/check.h"

namespace te {

uint64_t next_group_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

Group::Group(int rank, int size, std::unique_ptr<Communicator> comm)
    : Handle(HandleKind::Group), id_(next_group_id()), rank_(rank), size_(size), comm_(std::move(comm)) {}

void Group::allreduce_max(float *buf, size_t count, Backend &backend) const {
  if (size_ > 1 && comm_) comm_->allreduce_max(buf, count, backend);
}

void Group::abort() {
  if (!comm_) fail(Status::InvalidState, "argument 'g': a single-rank group has no communicator to abort");
  comm_->abort();
}

}  // namespace te
