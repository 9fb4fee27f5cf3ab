// What a backend's training-step ops take: the embedding gather and its deterministic
// scatter-add, the fused softmax cross-entropy and the multi-tensor AdamW update. The core
// validates everything first (shapes, dtypes, devices, ids in range on the CPU).
#pragma once

#include <cstdint>

#include "base/types.h"

namespace te {

// y[t, :] = table[ids[t], :]; ids I32 (n tokens); an id outside [0, vocab) gives a zero row.
struct EmbeddingForwardArgs {
  TensorView table;  // [vocab, dim], F32/F16/BF16
  TensorView ids;    // I32, n elements
  TensorView y;      // table's dtype, n * dim elements
};

// dtable[ids[t], :] (+)= dy[t, :], each row summing its tokens in increasing t in fp32 (the
// order is the definition: bit-identical across backends); out-of-range ids are skipped.
struct EmbeddingBackwardArgs {
  TensorView ids;     // I32, n elements
  TensorView dy;      // F32/F16/BF16, n * dim elements
  TensorView dtable;  // F32 [vocab, dim]
  bool accumulate = false;
};

// Mean softmax cross-entropy over the rows whose target != ignore_index, and dlogits.
struct CrossEntropyArgs {
  TensorView logits;   // [n, vocab], F32/F16/BF16
  TensorView targets;  // I32, n elements
  float *loss = nullptr;  // one float on the device
  TensorView dlogits;  // data null: not wanted; may alias logits
  int32_t ignore_index = -100;
  float grad_scale = 1.0f;
};

// One tensor of a multi-tensor AdamW step (numel elements each).
struct AdamwTensor {
  float *param = nullptr;
  const void *grad = nullptr;
  DType grad_dtype = DType::F32;
  float *exp_avg = nullptr;
  float *exp_avg_sq = nullptr;
  void *model_weight = nullptr;  // optional
  DType model_dtype = DType::F32;
  int64_t numel = 0;
  bool decay = true;
};

struct AdamwArgs {
  const AdamwTensor *tensors = nullptr;  // host array
  int count = 0;
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  float bias_correction1 = 1.0f, bias_correction2 = 1.0f;  // 1 - beta^step, rounded to float
  float max_grad_norm = 0.0f;                              // > 0: clip
  float *grad_norm = nullptr;                              // optional device output
};

}  // namespace te
