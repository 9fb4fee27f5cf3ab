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

__device__ __forceinline__ float sigmoid(float x) { return __fdiv_rn(1.0f, add(1.0f, expf(-x))); }
__device__ __forceinline__ float silu(float x) { return mul(x, sigmoid(x)); }
__device__ __forceinline__ float dsilu(float x) {
  const float s = sigmoid(x);
  return add(mul(mul(x, s), sub(1.0f, s)), s);
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
