// The definition of libte's attention and rotary-embedding numerics. The CPU backend computes
// these formulas row by row, accumulating dot products and sums in fp64 (scores, P and the
// outputs are rounded to fp32); GPU kernels compute them in fp32 in another order (tiles, online
// softmax), so attention agrees with the CPU within rounding, not bit for bit. RoPE is bit-exact.
//
// Attention forward, per sequence, query head h (kv head g = h / (heads / kv_heads)), query i:
//   S[i, j]  = scale * dot(q[i], k[j])  for the keys j the mask lets i see (fp32 dot; FP8:
//              dot of the E4M3 codes' values times q.scale_inv * k.scale_inv, then * scale)
//   m[i]     = max_j S[i, j];  l[i] = sum_j exp(S[i, j] - m[i]);  LSE[i] = m[i] + log(l[i])
//   P[i, j]  = exp(S[i, j] - LSE[i])
//   O[i]     = sum_j P[i, j] v[j]   (FP8: P quantized, P8 = e4m3(P * s_scale), and
//              O[i] = (sum_j P8[i, j] v8[j]) * s_scale_inv * v.scale_inv)
//   No visible key: O[i] = 0, LSE[i] = -inf.
// Backward, with D[i] = sum_d dO[i, d] * O[i, d] (fp32 over the high-precision tensors):
//   dP[i, j] = dot(dO[i], v[j])              (FP8: of dO8 and v8, times their scale_invs)
//   dS[i, j] = P[i, j] * (dP[i, j] - D[i])   (FP8: dS8 = fp8(dS * dp_scale), dequantized by
//                                             dp_scale_inv in the GEMMs below)
//   dQ[i] = scale * sum_j dS[i, j] k[j];  dK[j] = scale * sum_{i, h in g} dS[i, j] q[i]
//   dV[j] = sum_{i, h in g} P[i, j] dO[i]   (FP8: P8 and dO8, times s_scale_inv, dO.scale_inv)
// The tolerances of the CPU/GPU comparisons are stated in the gpu tests.
//
// RoPE: c = (float)cos((double)angle), s = (float)sin((double)angle), so that CPU and GPU get
// the same c and s (double sin/cos round to the same float except in rare near-ties); then
// y1 = x1 * c - x2 * s and y2 = x2 * c + x1 * s, each product and difference rounded on its own
// (no fused multiply-add), in fp32, then rounded to the output dtype: bit-identical across
// backends whenever c and s are.
#pragma once

#include <cmath>

namespace te {

inline void rope_cos_sin(float angle, bool inverse, float *c, float *s) {
  const double a = static_cast<double>(angle);
  *c = static_cast<float>(std::cos(a));
  *s = static_cast<float>(std::sin(a));
  if (inverse) *s = -*s;
}

}  // namespace te
