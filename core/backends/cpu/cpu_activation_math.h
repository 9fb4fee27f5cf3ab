// The activation functions and their derivatives in float, written as NVIDIA TE writes them
// (transformer_engine/common/util/math.h), so the CPU reference and the GEMM's GELU epilogue
// compute the same function as the GPU kernels up to the libm's tanhf/expf.
#pragma once

#include <cmath>

namespace te {
namespace cpu {

inline float relu(float x) { return x < 0.0f ? 0.0f : x; }  // NaN passes through
inline float drelu(float x) { return x > 0.0f ? 1.0f : 0.0f; }  // 0 at x == 0

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), factored as TE does.
inline float gelu(float x) {
  return x * (0.5f + 0.5f * std::tanh(x * (0.79788456f + 0.03567741f * x * x)));
}

inline float dgelu(float x) {
  const float tanh_out = std::tanh(0.79788456f * x * (1.0f + 0.044715f * x * x));
  return 0.5f * x * ((1.0f - tanh_out * tanh_out) * (0.79788456f + 0.1070322243f * x * x)) +
         0.5f * (1.0f + tanh_out);
}

// Squared ReLU, max(x, 0)^2 (NaN passes through, as in relu); derivative 2x for x > 0.
inline float srelu(float x) {
  const float r = relu(x);
  return r * r;
}
inline float dsrelu(float x) { return x > 0.0f ? 2.0f * x : 0.0f; }

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x * sigmoid(x); }
inline float dsilu(float x) {
  const float s = sigmoid(x);
  return x * s * (1.0f - s) + s;
}

}  // namespace cpu
}  // namespace te
