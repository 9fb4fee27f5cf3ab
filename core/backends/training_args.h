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

// The grad-norm reduction order, the same on every backend (so the norm, the clip coefficient
// and therefore every update are bit-identical): each tensor is cut into chunks of kAdamwChunk
// elements, numbered across the list in order (tensor by tensor); within a chunk, lane
// l < kAdamwLanes sums g^2 of elements l, l + kAdamwLanes, ... in increasing order in fp32
// (g*g and the sum each rounded), then the lanes are summed as a binary tree (lane l += lane
// l + s for s = kAdamwLanes/2, ..., 1). The chunk partials are then reduced the same way: lane
// l sums partials l, l + kAdamwLanes, ... in increasing chunk order, then the tree.
// norm = sqrt(total) correctly rounded.
constexpr int64_t kAdamwChunk = 4096;
constexpr int kAdamwLanes = 256;
inline int64_t adamw_chunks(int64_t numel) { return (numel + kAdamwChunk - 1) / kAdamwChunk; }

// The element update, every operation rounded separately (no FMA), in this order:
//   g = grad * clip
//   p = p - lr_wd * p                                   (decay only)
//   m = beta1 * m + one_minus_beta1 * g
//   v = beta2 * v + one_minus_beta2 * (g * g)
//   p = p - (lr * (m / bias_correction1)) / (sqrt(v / bias_correction2) + eps)
//   model_weight = p rounded to nearest even to its dtype
// clip = min(1, max_grad_norm / (norm + 1e-6)) when max_grad_norm > 0 (a non-finite norm: the
// whole step is skipped, nothing is written but grad_norm), else 1.
struct AdamwArgs {
  const AdamwTensor *tensors = nullptr;  // host array
  int count = 0;
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  float bias_correction1 = 1.0f, bias_correction2 = 1.0f;  // 1 - beta^step, rounded to float
  // Derived on the host once by the core (so every backend multiplies by the same floats):
  float lr_wd = 0.0f;            // lr * weight_decay, rounded to float
  float one_minus_beta1 = 0.1f;  // 1 - beta1, rounded to float
  float one_minus_beta2 = 0.001f;
  float max_grad_norm = 0.0f;                              // > 0: clip
  float *grad_norm = nullptr;                              // optional device output
  int64_t total_chunks = 0;  // sum of adamw_chunks(numel) over the list (the norm's scratch)
  bool needs_norm() const { return max_grad_norm > 0.0f || grad_norm != nullptr; }
};

}  // namespace te
