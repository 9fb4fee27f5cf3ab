// The definition of libte's LayerNorm and RMSNorm numerics. Every backend computes a row's
// statistics in exactly this order of fp32 operations, so that statistics, normalised outputs
// and the FP8 codes a fused norm+cast writes are bit-identical across backends (checked by the
// gpu tests). The order is the one a CUDA block of 256 threads computes naturally:
//   1. lane l (0..255) sums its elements l, l + 256, l + 512, ... in that order, from +0;
//   2. within each warp of 32 lanes, for off = 16, 8, 4, 2, 1: lane i < off adds lane i + off
//      (what __shfl_down_sync leaves in lane 0);
//   3. the 8 warp totals combine the same way for off = 4, 2, 1.
// Every product and sum is rounded on its own (no fused multiply-add), divisions and square
// roots are IEEE (correctly rounded). The formulas:
//   LayerNorm: mu = sum(x) / n, var = sum((x - mu) * (x - mu)) / n, rsigma = 1 / sqrt(var + eps)
//              y = ((x - mu) * rsigma) * g + beta
//   RMSNorm:   rsigma = 1 / sqrt(sum(x * x) / n + eps),  y = (x * rsigma) * g
//   g = gamma, or (1 + gamma) with zero-centred gamma (computed in fp32 as 1.0f + gamma).
// Backward (per row, in the same summation order; not bit-identical across backends for the
// column sums dgamma/dbeta, which GPUs accumulate in tiles):
//   x_hat = (x - mu) * rsigma (RMSNorm: x * rsigma), dyg = dy * g
//   c1 = sum(dyg * x_hat) / n, c2 = sum(dyg) / n (LayerNorm only)
//   dx = (dyg - (x_hat * c1 + c2)) * rsigma    (RMSNorm: (dyg - x_hat * c1) * rsigma)
//   dgamma = sum over rows of dy * x_hat, dbeta = sum over rows of dy.
#pragma once

#include <cstdint>

namespace te {

enum class NormKind : int { LayerNorm = 0, RMSNorm = 1 };

constexpr int kNormLanes = 256;

// Sums n floats produced by f(i), i = 0..n-1, in the order above.
template <typename F>
float norm_ordered_sum(int64_t n, F f) {
  float lane[kNormLanes];
  for (int l = 0; l < kNormLanes; ++l) {
    float acc = 0.0f;
    for (int64_t i = l; i < n; i += kNormLanes) acc = acc + f(i);
    lane[l] = acc;
  }
  float warp[kNormLanes / 32];
  for (int w = 0; w < kNormLanes / 32; ++w) {
    float *p = lane + 32 * w;
    for (int off = 16; off >= 1; off >>= 1)
      for (int i = 0; i < off; ++i) p[i] = p[i] + p[i + off];
    warp[w] = p[0];
  }
  for (int off = kNormLanes / 64; off >= 1; off >>= 1)
    for (int i = 0; i < off; ++i) warp[i] = warp[i] + warp[i + off];
  return warp[0];
}

// Row statistics of x[0..n) (fp32 values): *mu (0 for RMSNorm) and *rsigma.
void norm_row_stats(NormKind kind, const float *x, int64_t n, float eps, float *mu, float *rsigma);

// The effective gamma of one column.
inline float norm_gamma(float gamma, bool zero_centered) { return zero_centered ? 1.0f + gamma : gamma; }

}  // namespace te
