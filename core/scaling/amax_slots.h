// Where the delayed-scaling states of one context accumulate their current amax (their history's
// slot 0): side by side in device chunks, handed out in the order states are first used. The
// states of a bucket were usually first used together (a model's layers, in order), so their
// slots form one contiguous range, which the NCCL all-reduce then reduces in place: no gather
// kernel, no staging buffer, one collective over exactly the bucket's amaxes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/backend.h"

namespace te {

class AmaxSlots {
 public:
  explicit AmaxSlots(Backend &be) : be_(be) {}
  AmaxSlots(const AmaxSlots &) = delete;
  AmaxSlots &operator=(const AmaxSlots &) = delete;

  // A zeroed slot; its address is stable until release (chunks never move, so captured CUDA
  // graphs stay valid). Throws OutOfMemory before anything changes.
  float *acquire();
  void release(float *slot);

  // When the items' amax slots are n distinct slots making up exactly one contiguous range of
  // one chunk: its first slot (the items may be in any order). Else null: the caller gathers.
  float *contiguous_range(const ScaleUpdateItem *items, int n) const;

  static constexpr size_t kSlotsPerChunk = 1024;

 private:
  const Buffer *chunk_of(uintptr_t slot) const;

  Backend &be_;
  std::vector<Buffer> chunks_;
  size_t next_in_last_ = kSlotsPerChunk;  // the last chunk's first never-used slot
  std::vector<float *> free_;  // a min-heap by address
};

// A state's slot, given back when the state goes away.
class AmaxSlot {
 public:
  AmaxSlot() = default;
  ~AmaxSlot() { reset(); }
  AmaxSlot(const AmaxSlot &) = delete;
  AmaxSlot &operator=(const AmaxSlot &) = delete;
  AmaxSlot(AmaxSlot &&o) noexcept : owner_(o.owner_), slot_(o.slot_) { o.slot_ = nullptr; }
  AmaxSlot &operator=(AmaxSlot &&o) noexcept {
    if (this != &o) {
      reset();
      owner_ = o.owner_;
      slot_ = o.slot_;
      o.slot_ = nullptr;
    }
    return *this;
  }
  void acquire(AmaxSlots &slots) {
    reset();
    slot_ = slots.acquire();
    owner_ = &slots;
  }
  void reset() {
    if (slot_) owner_->release(slot_);
    slot_ = nullptr;
  }
  float *get() const { return slot_; }

 private:
  AmaxSlots *owner_ = nullptr;
  float *slot_ = nullptr;
};

}  // namespace te
