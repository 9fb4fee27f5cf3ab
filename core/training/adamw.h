// te_adamw_step's core: one fused multi-tensor AdamW update (backends' adamw), then the FP8
// weight caches of the modules that own the updated weights are re-quantized from the new
// weights exactly as their next forward would, so that a forward with weight_unchanged casts
// nothing and gives bit-identical results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "context/context.h"
#include "modules/projection/projection.h"

namespace te {

// One parameter, validated by the caller (capi/src/adamw.cpp): every tensor on the context's
// device, one element count, distinct memory for everything written.
struct AdamwParam {
  TensorView param;         // F32
  TensorView grad;          // F32/F16/BF16
  TensorView exp_avg;       // F32
  TensorView exp_avg_sq;    // F32
  TensorView model_weight;  // data null: none; F32/F16/BF16
  bool decay = true;
  // The projection whose FP8 weight cache holds this weight (null: none), and that weight's
  // shape [rows, cols] (= the param's shape). The projection belongs to a module of this context.
  ProjectionState *owner = nullptr;
  int64_t rows = 0, cols = 0;
};

struct AdamwHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  int64_t step = 1;
  float max_grad_norm = 0.0f;
  float *grad_norm = nullptr;  // optional device float
};

// The bias correction 1 - beta^step, computed in double and rounded once to float (the same
// float reaches every backend).
float adamw_bias_correction(float beta, int64_t step);

// Strong guarantee: everything that can fail (scratch, new caches) happens before the first
// kernel; afterwards only a device failure can throw.
// The refresh does to an owner's weight state what the next forward's cast would: under delayed
// scaling it max-accumulates the new weight's amax into the state's current-amax slot (read back
// as history[0] until the next scope-end update), under current scaling it computes the state's
// scale from the new weight. Owners are dropped instead of refreshed (the next forward recasts,
// with identical results) when: an autocast scope is open (the amax would join that scope's
// pass), the cache was made under current scaling with an amax all-reduced over a multi-rank
// group (one rank cannot redo the collective alone, and the group may be gone), or the weight
// state no longer matches the cache's recipe.
void adamw_step(Context &ctx, const AdamwHyper &h, const AdamwParam *params, size_t count);

}  // namespace te
