// te_cross_entropy: argument checks (shapes, dtypes, devices, and on the CPU every target in
// range), then the scratch the backend plans, then one backend call.
#pragma once

#include "context/context.h"

namespace te {

struct CrossEntropyCall {
  TensorView logits;   // [..., vocab] F32/F16/BF16
  TensorView targets;  // I32, rows(logits) elements
  TensorView loss;     // F32, one element
  TensorView dlogits;  // data null: not wanted; else logits' dtype and shape (may be logits)
  int32_t ignore_index = -100;
  float grad_scale = 1.0f;
};

void cross_entropy(Context &ctx, const CrossEntropyCall &call);

}  // namespace te
