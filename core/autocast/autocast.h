// Autocast: a per-context stack of scopes and the buckets of scaling states used inside them.
//
// A *pass* is the span from the first recording scope (enabled or calibrating) opened with no
// recording scope around it, to that scope's end. Scaling states used in a pass are bucketed by
// (recipe key, group id). When the pass ends, each forward bucket gets one amax all-reduce (for
// multi-rank groups with reduce_amax) and one fused scale update. Backward buckets collect the
// grad_output states of the pass's backward calls and are updated when the backward of the
// pass's first module completes, or on flush_backward.
//
// One launch per set: the buckets of a set that reduce nothing share one scale-update launch.
// And a forward set that reduces nothing, ended on a stream that is not capturing, is *deferred*:
// its update joins the launch of the next backward set to complete, so that a training step pays
// one scale-update launch, not two. Nothing reads or writes those states in between (a backward
// uses the scale_inv its forward saved, and touches only grad_output states), and every call
// that would (the next pass's begin, state reads, loads and stats, AdamW's weight refresh, a new
// stream, a synchronize) calls settle() first, which enqueues it. A deferred update is never
// enqueued into a capture (it would repeat at every replay): settle() under capture fails with
// InvalidState instead, and nothing changes.
//
// Begin and end never allocate: the stack is a fixed array and bucket storage is pooled (it
// grows only the first time a pass uses more buckets or states than any pass before).
#pragma once

#include <cstdint>
#include <vector>

#include "scaling/amax_slots.h"
#include "backends/backend.h"
#include "dist/group.h"
#include "scaling/recipe.h"
#include "scaling/scaling_state.h"

namespace te {

constexpr int kAutocastMaxDepth = 64;

struct AutocastStats {
  uint64_t scopes_closed = 0;
  uint64_t bucket_updates = 0;
  uint64_t amax_reductions = 0;
  uint64_t states_updated = 0;
  // Scale updates enqueued, each a backend scale_update call or carried by a norm backward
  // (updates_carried of them): buckets and deferred sets share them.
  uint64_t update_launches = 0;
  uint64_t updates_carried = 0;
};

// The scope holds references to its recipe and group (retained at begin, released at end), so
// the caller may let go of both while the scope is open.
struct AutocastScope {
  uint64_t token = 0;
  bool enabled = false;
  bool calibrating = false;
  const Recipe *recipe = nullptr;
  const Group *group = nullptr;
};

// Where a module's forward sits: its pass (0: none) and whether it was the pass's first module.
struct PassTicket {
  uint64_t pass = 0;
  bool first = false;
};

class Autocast {
 public:
  Autocast(Backend &be, AutocastStats &stats, const AmaxSlots &slots);
  ~Autocast();

  uint64_t begin(bool enabled, bool calibrating, const Recipe *recipe, const Group *group);
  void end(uint64_t token);
  int depth() const { return depth_; }
  const AutocastScope *innermost() const { return depth_ ? &stack_[depth_ - 1] : nullptr; }
  bool recording() const { return innermost() && (innermost()->enabled || innermost()->calibrating); }

  // A module calls reserve_* before it changes anything, so that the register_* calls after its
  // compute cannot run out of memory: room for `n` more states in the open pass's forward
  // buckets, or in the backward buckets of `pass` (whose set it makes pending).
  void reserve_forward(int n);
  void reserve_backward(uint64_t pass, int n);

  // Called by a module's forward inside a recording scope.
  PassTicket enter_module();
  void register_forward(ScalingState *state);
  // Called by a module's backward for the pass its forward ran in.
  void register_backward(uint64_t pass, const Recipe *recipe, const Group *group, ScalingState *state);
  // Whether `state` sits in an open pass's or a pending backward pass's bucket.
  bool holds(const ScalingState *state) const { return state->registered_pass != 0; }
  // Ends `pass`: its backward set's update (with a deferred forward set's, outside capture) is
  // enqueued, unless `carried`: then the norm backward that carry_backward_update filled in has
  // enqueued it, and the sets are only cleared.
  void finish_backward_pass(uint64_t pass, bool carried = false);
  // When finishing `pass` would be one plain scale-update launch (no bucket all-reduces) of at
  // most kCarriedUpdateItems states: points nb->then_update at its items, so that the module's
  // norm backward (its last launch) carries it, and returns true. The items stay valid until
  // finish_backward_pass(pass, true), which must follow with no other autocast call in between.
  bool carry_backward_update(uint64_t pass, NormBackwardArgs *nb);
  void flush_backward();  // every pending backward pass, and a deferred forward update
  // Enqueues a deferred forward update (see the header comment); under capture it fails, as
  // settle_check does, before anything changes.
  void settle();
  void settle_check() const;
  bool deferred() const { return deferred_.pass != 0; }
  // A scaling state that is going away leaves every bucket.
  void forget(const ScalingState *state);

 private:
  struct Bucket {
    uint64_t recipe_key = 0, group_id = 0;
    RecipeRef recipe;
    GroupRef group;  // kept alive until the bucket is updated
    std::vector<ScalingState *> states;
  };
  struct BucketSet {
    uint64_t pass = 0;  // 0: free slot
    std::vector<Bucket> buckets;
    size_t used = 0;
    void add(const Recipe *recipe, const Group *group, ScalingState *state);
    void reserve(int n);
    void clear();
    size_t states() const;
  };

  // Updates `set` (and `also`, when given, in the same launch) and clears it.
  void update(BucketSet &set, BucketSet *also = nullptr);
  static bool reduces(const Bucket &b);
  void update_reduced_bucket(Bucket &b);
  bool can_defer(const BucketSet &set) const;
  BucketSet *deferred_if_eager();  // the deferred set, unless the stream is capturing
  BucketSet &backward_set(uint64_t pass);
  BucketSet *pending_backward_set(uint64_t pass);  // nullptr: none

  Backend &be_;
  AutocastStats &stats_;
  const AmaxSlots &slots_;
  AutocastScope stack_[kAutocastMaxDepth];
  int depth_ = 0;
  int recording_depth_ = 0;
  uint64_t token_prefix_;        // unique to this stack: tokens are unique in the process
  uint64_t tokens_issued_ = 0;
  uint64_t next_pass_ = 1;
  uint64_t pass_ = 0;
  int modules_in_pass_ = 0;
  BucketSet forward_;
  BucketSet deferred_;  // an ended pass's forward set, its update not yet enqueued (pass 0: none)
  std::vector<BucketSet> backward_;  // pending backward passes (pooled)
  std::vector<ScaleUpdateItem> items_;  // capacity >= every state registered: update never allocates
  BucketSet *carried_also_ = nullptr;   // carry_backward_update's deferred set, when it took one
  Buffer packed_amax_;
};

}  // namespace te
