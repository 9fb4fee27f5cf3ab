// Handles: the identity of every object the C API hands out.
//
// A public handle is not the object's address but an id issued from a process-wide slot table:
// (generation, slot) packed into one odd 64-bit value. Destroying an object (or returning a pooled
// one to its pool) bumps its slot's generation, so an old handle stays dead even when the memory,
// the slot or the pooled object is reused — the address reuse that let a destroyed backward
// context "come back to life" (and that TE suffers from with id(group)). Resolving a handle never
// dereferences the caller's value: garbage, a handle of another type and a destroyed handle are
// all told apart and reported.
//
// The slot table is the library's one process-wide structure besides id counters; it holds only
// identities, no training state. Issuing and retiring take a lock only when a slot is taken from
// or given back to the free list (object creation and final destruction); a pooled object keeps
// its slot, so the per-step reissue of a backward context is two atomic stores.
#pragma once

#include <atomic>
#include <cstdint>

namespace te {

enum class HandleKind : uint8_t {
  Dead = 0,
  Context = 1,
  Recipe = 2,
  Group = 3,
  Linear = 4,
  BackwardCtx = 5,
  Residuals = 6,  // te_linear_residuals::internal
  LayerNormLinear = 7,
  LayerNormLinearBackwardCtx = 8,
  LayerNormLinearResiduals = 9,
  LayerNormMlp = 10,
  LayerNormMlpBackwardCtx = 11,
  LayerNormMlpResiduals = 12,
  GroupedLinear = 13,
  GroupedLinearBackwardCtx = 14,
  GroupedLinearResiduals = 15,
  Attention = 16,
  AttentionBackwardCtx = 17,
  AttentionResiduals = 18,
  Checkpoint = 19,
};

// Why a value did not resolve.
enum class HandleFault { None, Null, NotAHandle, Destroyed, WrongKind };

class Handle {
 public:
  explicit Handle(HandleKind kind);
  ~Handle();
  Handle(const Handle &) = delete;
  Handle &operator=(const Handle &) = delete;

  // The public value (0 while retired).
  uint64_t id() const { return id_; }
  template <class P>
  P *as_public() const { return reinterpret_cast<P *>(static_cast<uintptr_t>(id_)); }

  // For pooled objects: retire() kills the current id (the object stays, with its slot);
  // reissue() gives the object a new id that no earlier handle equals. retire() is idempotent.
  void retire();
  void reissue();

 private:
  uint32_t slot_;
  uint64_t id_ = 0;
  HandleKind kind_;
};

namespace handle_table {
// id = generation << 25 | slot << 1 | 1. Odd, so no object address is ever a valid handle; at
// most 2^24 live handles; generations up to 2^38 keep ids below 2^63 (safe in signed FFIs).
constexpr unsigned kSlotBits = 24;
constexpr unsigned kChunkBits = 12;
constexpr uint32_t kChunkSize = 1u << kChunkBits;
constexpr uint32_t kChunks = 1u << (kSlotBits - kChunkBits);

struct Slot {
  std::atomic<uint64_t> state{0};  // generation << 8 | kind (Dead when retired)
  std::atomic<Handle *> object{nullptr};
};
// Zero-initialised at load time (no guard on the lookup path); chunks are never freed.
extern std::atomic<Slot *> chunks[kChunks];
[[gnu::cold]] Handle *fault(uint64_t value, uint64_t state, HandleKind kind, HandleFault *fault, HandleKind *actual);
}  // namespace handle_table

// The live object behind `value` if it is a handle of `kind`; otherwise nullptr with *fault (and
// *actual, the live kind, for WrongKind) set. Inline: every API call resolves its handles.
inline Handle *resolve_handle(const void *value, HandleKind kind, HandleFault *fault, HandleKind *actual) {
  using namespace handle_table;
  const auto v = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(value));
  const uint32_t index = static_cast<uint32_t>(v >> 1) & ((1u << kSlotBits) - 1);
  Slot *chunk = (v & 1) ? chunks[index >> kChunkBits].load(std::memory_order_acquire) : nullptr;
  const uint64_t state = chunk ? chunk[index & (kChunkSize - 1)].state.load(std::memory_order_acquire) : 0;
  if (chunk && state == ((v >> (kSlotBits + 1)) << 8 | static_cast<uint64_t>(kind))) {
    *fault = HandleFault::None;
    return chunk[index & (kChunkSize - 1)].object.load(std::memory_order_relaxed);
  }
  return handle_table::fault(v, chunk ? state : 0, kind, fault, actual);
}

}  // namespace te
