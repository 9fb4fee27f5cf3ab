#include "te/core/handle.h"

#include <atomic>
#include <mutex>
#include <new>
#include <vector>

#include "te/core/check.h"

namespace te {

namespace {

// id = generation << 25 | slot << 1 | 1. Odd, so no object address is ever a valid handle; at
// most 2^24 live handles; generations up to 2^38 keep ids below 2^63 (safe in signed FFIs).
constexpr unsigned kSlotBits = 24;
constexpr unsigned kChunkBits = 12;
constexpr uint32_t kChunkSize = 1u << kChunkBits;
constexpr uint32_t kChunks = 1u << (kSlotBits - kChunkBits);
constexpr uint64_t kMaxGeneration = (uint64_t{1} << 38) - 1;

struct Slot {
  std::atomic<uint64_t> state{0};  // generation << 8 | kind (Dead when retired)
  std::atomic<Handle *> object{nullptr};
};

struct Table {
  std::mutex mu;
  std::vector<uint32_t> free_slots;
  uint32_t next_unused = 0;
  uint64_t live = 0;
  std::atomic<Slot *> chunks[kChunks] = {};

  Slot &slot(uint32_t i) { return chunks[i >> kChunkBits].load(std::memory_order_acquire)[i & (kChunkSize - 1)]; }

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
    ++live;
    return i;
  }

  void give(uint32_t i, bool reusable) {
    std::lock_guard<std::mutex> lock(mu);
    if (reusable) free_slots.push_back(i);  // capacity reserved in take()
    --live;
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

Handle *resolve_handle(const void *value, HandleKind kind, HandleFault *fault, HandleKind *actual) {
  const auto v = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(value));
  *fault = HandleFault::None;
  if (v == 0) { *fault = HandleFault::Null; return nullptr; }
  if (!(v & 1)) { *fault = HandleFault::NotAHandle; return nullptr; }
  const uint32_t index = static_cast<uint32_t>(v >> 1) & ((1u << kSlotBits) - 1);
  const uint64_t gen = v >> (kSlotBits + 1);
  Table &t = table();
  Slot *chunk = t.chunks[index >> kChunkBits].load(std::memory_order_acquire);
  if (!chunk) { *fault = HandleFault::NotAHandle; return nullptr; }
  Slot &s = chunk[index & (kChunkSize - 1)];
  const uint64_t state = s.state.load(std::memory_order_acquire);
  if (generation_of(state) != gen || kind_of(state) == HandleKind::Dead) {
    // An older generation was issued once and is dead; a newer one never was.
    *fault = gen != 0 && gen <= generation_of(state) ? HandleFault::Destroyed : HandleFault::NotAHandle;
    return nullptr;
  }
  if (kind_of(state) != kind) {
    *fault = HandleFault::WrongKind;
    *actual = kind_of(state);
    return nullptr;
  }
  return s.object.load(std::memory_order_relaxed);
}

uint64_t live_handle_slots() {
  Table &t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.live;
}

}  // namespace te
