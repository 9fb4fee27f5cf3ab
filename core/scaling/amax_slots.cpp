#include "scaling/amax_slots.h"

#include <algorithm>
#include <cstdint>

namespace te {

namespace {
// free_ is a min-heap of addresses: the lowest free slot is reused first, so a model made after
// another was destroyed gets its slots in creation order again (one range per bucket).
bool higher(const float *a, const float *b) {
  return reinterpret_cast<uintptr_t>(a) > reinterpret_cast<uintptr_t>(b);
}
}  // namespace

float *AmaxSlots::acquire() {
  if (!free_.empty()) {
    float *slot = free_.front();
    be_.fill_floats(slot, 0.0f, 1);  // it held the amax of a state that is gone
    std::pop_heap(free_.begin(), free_.end(), higher);
    free_.pop_back();
    return slot;
  }
  if (next_in_last_ == kSlotsPerChunk) {
    // Reserved first, so that the push below cannot fail after the allocation and release
    // (which runs in destructors) never allocates.
    chunks_.reserve(chunks_.size() + 1);
    free_.reserve((chunks_.size() + 1) * kSlotsPerChunk);
    Buffer chunk(&be_, sizeof(float) * kSlotsPerChunk);
    be_.fill_floats(chunk.floats(), 0.0f, kSlotsPerChunk);
    chunks_.push_back(std::move(chunk));
    next_in_last_ = 0;
  }
  return chunks_.back().floats() + next_in_last_++;
}

void AmaxSlots::release(float *slot) {
  free_.push_back(slot);  // within the capacity reserved when its chunk was made
  std::push_heap(free_.begin(), free_.end(), higher);
}

// Addresses compared as integers: slots of different chunks are unrelated pointers.
const Buffer *AmaxSlots::chunk_of(uintptr_t slot) const {
  for (const Buffer &c : chunks_) {
    const auto begin = reinterpret_cast<uintptr_t>(c.floats());
    if (slot >= begin && slot < begin + sizeof(float) * kSlotsPerChunk) return &c;
  }
  return nullptr;
}

float *AmaxSlots::contiguous_range(const ScaleUpdateItem *items, int n) const {
  if (n <= 0) return nullptr;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < n; ++i) {
    const auto a = reinterpret_cast<uintptr_t>(items[i].amax);
    lo = std::min(lo, a);
    hi = std::max(hi, a);
  }
  // Bucket members are distinct states with distinct slots, so n slots spanning n places are
  // exactly that range.
  if (hi - lo != sizeof(float) * static_cast<uintptr_t>(n - 1)) return nullptr;
  const Buffer *c = chunk_of(lo);
  return c != nullptr && c == chunk_of(hi) ? reinterpret_cast<float *>(lo) : nullptr;
}

}  // namespace te
