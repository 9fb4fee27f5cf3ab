#include "base/handle.h"

#include <atomic>
#include <mutex>
#include <new>
#include <vector>

#include "base/check.h"

namespace te {

namespace handle_table {
std::atomic<Slot *> chunks[kChunks] = {};
}  // namespace handle_table

namespace {

using namespace handle_table;
constexpr uint64_t kMaxGeneration = (uint64_t{1} << 38) - 1;

struct Table {
  std::mutex mu;
  std::vector<uint32_t> free_slots;
  uint32_t next_unused = 0;

  static Slot &slot(uint32_t i) { return chunks[i >> kChunkBits].load(std::memory_order_acquire)[i & (kChunkSize - 1)]; }

  uint32_t take() {
    std::lock_guard<std::mutex> lock(mu);
    free_slots.reserve(free_slots.size() + 1);  // so that give() never allocates
    uint32_t i;
    if (!free_slots.empty()) {
      i = free_slots.back();
      free_slots.pop_back();
    } else {
      if (next_unused == kChunks * kChunkSize)
        fail(Status::OutOfMemory, "too many live libte handles (%u)", next_unused);
      std::atomic<Slot *> &chunk = chunks[next_unused >> kChunkBits];
      if (!chunk.load(std::memory_order_relaxed)) chunk.store(new Slot[kChunkSize], std::memory_order_release);
      i = next_unused++;
    }
    return i;
  }

  void give(uint32_t i, bool reusable) {
    std::lock_guard<std::mutex> lock(mu);
    if (reusable) free_slots.push_back(i);  // capacity reserved in take()
  }
};

// Never destroyed: handles may be released from static destructors of other libraries.
Table &table() {
  static Table *t = new Table;
  return *t;
}

uint64_t generation_of(uint64_t state) { return state >> 8; }
HandleKind kind_of(uint64_t state) { return static_cast<HandleKind>(state & 0xFF); }

}  // namespace

Handle::Handle(HandleKind kind) : slot_(table().take()), kind_(kind) { reissue(); }

Handle::~Handle() {
  retire();
  Table &t = table();
  t.give(slot_, generation_of(t.slot(slot_).state.load(std::memory_order_relaxed)) < kMaxGeneration);
}

void Handle::retire() {
  if (!id_) return;
  Slot &s = table().slot(slot_);
  const uint64_t gen = generation_of(s.state.load(std::memory_order_relaxed)) + 1;
  s.state.store(gen << 8 | static_cast<uint64_t>(HandleKind::Dead), std::memory_order_release);
  id_ = 0;
}

void Handle::reissue() {
  retire();
  Table &t = table();
  uint64_t gen = generation_of(t.slot(slot_).state.load(std::memory_order_relaxed)) + 1;
  if (gen > kMaxGeneration) {  // this slot has issued all its ids: move to a fresh one for good
    const uint32_t fresh = t.take();
    t.give(slot_, false);
    slot_ = fresh;
    gen = generation_of(t.slot(slot_).state.load(std::memory_order_relaxed)) + 1;
  }
  Slot &s = t.slot(slot_);
  s.object.store(this, std::memory_order_relaxed);
  s.state.store(gen << 8 | static_cast<uint64_t>(kind_), std::memory_order_release);
  id_ = gen << (kSlotBits + 1) | uint64_t{slot_} << 1 | 1;
}

Handle *handle_table::fault(uint64_t v, uint64_t state, HandleKind kind, HandleFault *fault, HandleKind *actual) {
  const uint64_t gen = v >> (kSlotBits + 1);
  if (v == 0) *fault = HandleFault::Null;
  else if (!(v & 1) || state == 0) *fault = HandleFault::NotAHandle;  // never issued
  else if (generation_of(state) != gen || kind_of(state) == HandleKind::Dead)
    // An older generation was issued once and is dead; a newer one never was.
    *fault = gen != 0 && gen <= generation_of(state) ? HandleFault::Destroyed : HandleFault::NotAHandle;
  else {
    *fault = HandleFault::WrongKind;
    *actual = kind_of(state);
  }
  (void)kind;
  return nullptr;
}

}  // namespace te
