// Multi-tensor AdamW on the CPU: the reference the CUDA kernels reproduce bit for bit. The grad
// norm follows the reduction order defined in training_args.h (chunks of kAdamwChunk, 256 lanes,
// binary trees), emulated here lane by lane; the element update is the formula there, each
// operation separately rounded (the core is built with -ffp-contract=off).
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_convert.h"
#include "base/check.h"

namespace te {

namespace {

// lane[0] after the tree: lane l += lane l + s for s = kAdamwLanes/2 ... 1.
float tree_sum(float *lane) {
  for (int s = kAdamwLanes / 2; s >= 1; s /= 2)
    for (int l = 0; l < s; ++l) lane[l] = lane[l] + lane[l + s];
  return lane[0];
}

// The global L2 norm of every gradient of the list.
float grad_norm(const AdamwArgs &a) {
  float g[kAdamwChunk];
  float lane[kAdamwLanes];
  float total_lane[kAdamwLanes] = {};
  int64_t chunk_index = 0;  // across the list
  for (int i = 0; i < a.count; ++i) {
    const AdamwTensor &t = a.tensors[i];
    for (int64_t start = 0; start < t.numel; start += kAdamwChunk, ++chunk_index) {
      const int64_t n = t.numel - start < kAdamwChunk ? t.numel - start : kAdamwChunk;
      cpu::load_floats(t.grad, t.grad_dtype, start, n, g);
      for (int l = 0; l < kAdamwLanes; ++l) lane[l] = 0.0f;
      for (int64_t k = 0; k < n; ++k) {
        const float sq = g[k] * g[k];
        float &acc = lane[k % kAdamwLanes];
        acc = acc + sq;
      }
      const float partial = tree_sum(lane);
      float &acc = total_lane[chunk_index % kAdamwLanes];
      acc = acc + partial;
    }
  }
  return std::sqrt(tree_sum(total_lane));
}

}  // namespace

namespace cpu {

// The step itself, apart from the backend object (a kernel harness compares against it alone).
void adamw(const AdamwArgs &a) {
  float clip = 1.0f;
  if (a.needs_norm()) {
    const float norm = grad_norm(a);
    if (a.grad_norm) *a.grad_norm = norm;
    if (a.max_grad_norm > 0.0f) {
      if (!std::isfinite(norm)) return;  // skip the whole step
      const float c = a.max_grad_norm / (norm + 1e-6f);
      clip = c < 1.0f ? c : 1.0f;
    }
  }
  float g[kAdamwChunk];
  for (int i = 0; i < a.count; ++i) {
    const AdamwTensor &t = a.tensors[i];
    for (int64_t start = 0; start < t.numel; start += kAdamwChunk) {
      const int64_t n = t.numel - start < kAdamwChunk ? t.numel - start : kAdamwChunk;
      cpu::load_floats(t.grad, t.grad_dtype, start, n, g);
      float *p = t.param + start, *m = t.exp_avg + start, *v = t.exp_avg_sq + start;
      for (int64_t k = 0; k < n; ++k) {
        const float gk = g[k] * clip;
        float pk = p[k];
        if (t.decay) pk = pk - a.lr_wd * pk;
        const float mk = a.beta1 * m[k] + a.one_minus_beta1 * gk;
        const float vk = a.beta2 * v[k] + a.one_minus_beta2 * (gk * gk);
        const float mhat = mk / a.bias_correction1;
        const float denom = std::sqrt(vk / a.bias_correction2) + a.eps;
        pk = pk - (a.lr * mhat) / denom;
        m[k] = mk;
        v[k] = vk;
        p[k] = pk;
      }
      if (t.model_weight) cpu::store_floats(p, n, t.model_weight, t.model_dtype, start);
    }
  }
}

}  // namespace cpu

void CpuBackend::adamw(const AdamwArgs &a) { cpu::adamw(a); }

}  // namespace te
