// Activations (ReLU, GELU, SReLU; the gated SwiGLU and GEGLU) and their gradients in fp32, the
// formulas of cpu/cpu_activation_math.h (TE's). Products and sums use the _rn intrinsics so that
// nothing is contracted into an FMA: the CPU reference rounds each operation, and only tanhf /
// expf may then differ from it (in the last ulp; ReLU and SReLU are bit-identical). Shared by the
// activation kernels and the casts that take an activation's output without storing it.
#pragma once

#include "backends/backend.h"

namespace te::cuda::act_math {

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }

__device__ __forceinline__ float relu(float x) { return x < 0.0f ? 0.0f : x; }
__device__ __forceinline__ float drelu(float x) { return x > 0.0f ? 1.0f : 0.0f; }
__device__ __forceinline__ float srelu(float x) { return mul(relu(x), relu(x)); }
__device__ __forceinline__ float dsrelu(float x) { return x > 0.0f ? mul(2.0f, x) : 0.0f; }

__device__ __forceinline__ float gelu(float x) {
  // x * (0.5 + 0.5 * tanh(x * (0.79788456 + 0.03567741 * x * x)))
  const float inner = mul(x, add(0.79788456f, mul(mul(0.03567741f, x), x)));
  return mul(x, add(0.5f, mul(0.5f, tanhf(inner))));
}

__device__ __forceinline__ float dgelu(float x) {
  const float tanh_out = tanhf(mul(mul(0.79788456f, x), add(1.0f, mul(mul(0.044715f, x), x))));
  const float a = mul(mul(0.5f, x), mul(sub(1.0f, mul(tanh_out, tanh_out)), add(0.79788456f, mul(mul(0.1070322243f, x), x))));
  return add(a, mul(0.5f, add(1.0f, tanh_out)));
}

// 1 / y correctly rounded for y in [1, kReciprocalLimit): the approximate reciprocal and the two
// refinement steps that __fdiv_rn(1.0f, y) takes when its range check passes, so the same bits
// (CudaExhaustiveMath compares map_sigmoid with the division for every float x) without the
// check's branch and the call to the division's slow path, whose clobbered registers cost the
// activation kernels more than the division itself.
constexpr float kReciprocalLimit = 0x1p64f;
__device__ __forceinline__ float reciprocal_in_range(float y) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
  r = __fmaf_rn(r, __fmaf_rn(-y, r, 1.0f), r);
  return __fmaf_rn(r, __fmaf_rn(-y, r, 1.0f), r);
}
__device__ __forceinline__ float reciprocal(float y) {
  return y < kReciprocalLimit && y >= 1.0f ? reciprocal_in_range(y) : __fdiv_rn(1.0f, y);
}

// SiLU and its derivative from x and s = sigmoid(x) (= 1 / (1 + exp(-x))).
__device__ __forceinline__ float silu_of(float x, float s) { return mul(x, s); }
__device__ __forceinline__ float dsilu_of(float x, float s) { return add(mul(mul(x, s), sub(1.0f, s)), s); }

__device__ __forceinline__ float sigmoid(float x) { return reciprocal(add(1.0f, expf(-x))); }
__device__ __forceinline__ float silu(float x) { return silu_of(x, sigmoid(x)); }
__device__ __forceinline__ float dsilu(float x) { return dsilu_of(x, sigmoid(x)); }

// f[k] = fn(k, sigmoid(x[k])) for N elements, with one test for the whole group, made before any
// element is computed (so that no input lives longer than its element): for x >= -44,
// 1 + exp(-x) lies in [1, 1.3e19], inside reciprocal_in_range's range, and the group needs
// neither branch nor call per element; a group with a smaller x (or a NaN) takes sigmoid(), which
// tests each element and divides where the range is left.
constexpr float kSigmoidInRange = -44.0f;
template <int N, class Fn>
__device__ __forceinline__ void map_sigmoid(const float (&x)[N], float (&f)[N], Fn &&fn) {
  bool in_range = true;
#pragma unroll
  for (int k = 0; k < N; ++k) in_range &= x[k] >= kSigmoidInRange;
  if (in_range) {
#pragma unroll
    for (int k = 0; k < N; ++k) f[k] = fn(k, reciprocal_in_range(add(1.0f, expf(-x[k]))));
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) f[k] = fn(k, sigmoid(x[k]));
  }
}

__device__ __forceinline__ float apply(Activation act, float x) {
  return act == Activation::ReLU ? relu(x) : act == Activation::SReLU ? srelu(x) : gelu(x);
}
__device__ __forceinline__ float apply_grad(Activation act, float x) {
  return act == Activation::ReLU ? drelu(x) : act == Activation::SReLU ? dsrelu(x) : dgelu(x);
}
// The gate of a gated activation: SiLU (SwiGLU) or GELU (GEGLU).
__device__ __forceinline__ float gate(Activation act, float a) { return act == Activation::GeGLU ? gelu(a) : silu(a); }
__device__ __forceinline__ float dgate(Activation act, float a) { return act == Activation::GeGLU ? dgelu(a) : dsilu(a); }

}  // namespace te::cuda::act_math
