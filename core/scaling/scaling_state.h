// The scaling state of one quantized tensor role (a layer's input, weight or grad_output): amax
// history, scale and scale_inv on the context's device, plus scratch for current scaling. The
// history's slot 0, where the current step's amax accumulates, lives apart in the context's
// AmaxSlots (amax_slots.h), so that a bucket's amaxes sit side by side for the all-reduce.
#pragma once

#include <cstdint>

#include "scaling/amax_slots.h"
#include "backends/backend.h"
#include "scaling/recipe.h"

namespace te {

class ScalingState {
 public:
  // Makes the state ready for `recipe` producing `fp8_dtype`. The first use, or a change of
  // history length or FP8 type, (re)initialises it: history zeroed, scale 1 (TE's start).
  // Allocates only then.
  void prepare(Backend &be, AmaxSlots &slots, const Recipe &recipe, DType fp8_dtype) {
    commit(be, stage(be, slots, recipe, fp8_dtype));
  }
  // prepare() in two steps, for an operation that prepares several states and must change none
  // of them if it runs out of memory: stage() allocates what prepare would need and changes
  // nothing; commit() applies it and cannot fail.
  struct Staged {
    bool reinit = false;
    Buffer mem;
    AmaxSlot slot;  // a new amax slot, when the state had none
    int len = 0;
    DType dtype = DType::E4M3;
    int margin = 0;
    AmaxAlgo algo = AmaxAlgo::Max;
    float amax_value = 0.0f;  // the current amax the state starts with
  };
  Staged stage(Backend &be, AmaxSlots &slots, const Recipe &recipe, DType fp8_dtype) const;
  void commit(Backend &be, Staged &&s);  // throws only for a device failure
  bool initialized() const { return len_ > 0; }

  // Device layout: history[len] | scale | scale_inv | amax scratch. history[0] is unused: the
  // current amax (history slot 0 as TE has it) is *amax(), which casts max-accumulate into.
  float *history() const { return mem_.floats(); }
  float *amax() const { return amax_.get(); }
  float *scale() const { return mem_.floats() + len_; }
  float *scale_inv() const { return mem_.floats() + len_ + 1; }
  float *amax_scratch() const { return mem_.floats() + len_ + 2; }
  int history_len() const { return len_; }
  DType fp8_dtype() const { return dtype_; }
  int margin() const { return margin_; }
  AmaxAlgo algo() const { return algo_; }

  ScaleUpdateItem update_item() const {
    return ScaleUpdateItem{history(), amax(), scale(), scale_inv(), len_, margin_, algo_, fp8_max(dtype_)};
  }

  // Host copies, for inspection and serialisation (they synchronise); history[0] is the current
  // amax.
  void read(Backend &be, float *scale, float *scale_inv, float *history, int history_cap) const;
  // Replaces the whole state (used by state_load); allocation happens before anything changes.
  // stage_assign + commit do it in two steps, for a load of several states.
  Staged stage_assign(Backend &be, AmaxSlots &slots, int len, DType dtype, float scale, float scale_inv,
                      const float *history) const;
  void assign(Backend &be, AmaxSlots &slots, int len, DType dtype, float scale, float scale_inv,
              const float *history);

  // Autocast bookkeeping: the pass this state was last registered in (registration dedupe).
  uint64_t registered_pass = 0;

 private:
  Buffer mem_;
  AmaxSlot amax_;
  int len_ = 0;
  DType dtype_ = DType::E4M3;
  int margin_ = 0;
  AmaxAlgo algo_ = AmaxAlgo::Max;
};

}  // namespace te
