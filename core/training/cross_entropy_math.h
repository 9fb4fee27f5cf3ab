// The arithmetic of the fused softmax cross-entropy, shared by the CPU reference
// (cpu_cross_entropy.cpp) and the CUDA kernels (cross_entropy_kernels.cu) so that both give the
// same bits: the same operations (each rounded once: _rn intrinsics on the device, plain float
// operations on the host, where the core is built with -ffp-contract=off), in the same order.
//
// Orders (the CUDA block layout, which the CPU replays lane by lane):
//   per row: lane u (of kRowLanes) walks columns u, u + kRowLanes, ... keeping an online pair
//     (m = max so far, s = sum of exp(x - m)); within each group of 32 lanes the pairs are
//     combined as a tree (offsets 16, 8, 4, 2, 1: lane i takes lane i + off), then the groups'
//     pairs likewise (offsets 8, 4, 2, 1 over kRowLanes / 32 = 16 groups);
//   loss: lane u (of kLossLanes) sums the row losses u, u + kLossLanes, ... from 0, then a tree
//     (offsets 512 ... 1); loss = total / count.
// exp is softmax_exp below (Cephes' expf: Cody-Waite reduction and a degree-6 polynomial, about
// 1 ulp), not the platform's expf, which differs between the host and CUDA. log is taken once
// per row in double and rounded to float on both (double log is faithful on both sides, so the
// float results agree except in the rarest halfway cases).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TE_CE_HD __host__ __device__ __forceinline__
#else
#define TE_CE_HD inline
#endif

namespace te::ce {

constexpr int kRowLanes = 512;    // threads of the CUDA row block
constexpr int kWarp = 32;
constexpr int kLossLanes = 1024;  // threads of the CUDA loss block

TE_CE_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TE_CE_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TE_CE_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TE_CE_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// 2^k for -126 <= k <= 127, from its bits.
TE_CE_HD float pow2(int k) {
  const uint32_t bits = static_cast<uint32_t>(k + 127) << 23;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// e^x, about 1 ulp, identical on the host and the device. NaN stays NaN; below about -103.97
// the result is 0 (e^x < 2^-150 rounds to 0), above 88.72 +inf.
TE_CE_HD float softmax_exp(float x) {
  if (x != x) return x;
  if (x < -104.0f) return 0.0f;
  if (x > 88.72283935546875f) return INFINITY;
  const float k = rintf(mul(x, 1.44269504088896341f));
  // ln 2 = C1 + C2 with C1 = 0.693359375 (9 bits: k * C1 is exact for |k| <= 150).
  const float r = sub(sub(x, mul(k, 0.693359375f)), mul(k, -2.12194440e-4f));
  const float z = mul(r, r);
  float p = 1.9875691500e-4f;
  p = add(mul(p, r), 1.3981999507e-3f);
  p = add(mul(p, r), 8.3334519073e-3f);
  p = add(mul(p, r), 4.1665795894e-2f);
  p = add(mul(p, r), 1.6666665459e-1f);
  p = add(mul(p, r), 5.0000001201e-1f);
  p = add(add(mul(p, z), r), 1.0f);
  const int ki = static_cast<int>(k);
  if (ki >= -126) return mul(p, pow2(ki));  // a normal result: multiplying by 2^k is exact
  return ldexpf(p, ki);                     // subnormal: one rounding, the same on both sides
}

TE_CE_HD float softmax_log(float s) { return static_cast<float>(log(static_cast<double>(s))); }

// Online (max, sum of exp(x - max)) over a set of columns; m = -inf: the empty set (s = 0).
struct MaxSum {
  float m = -INFINITY, s = 0.0f;
};

// Adds column value x (not NaN: the caller flags NaN rows separately).
TE_CE_HD void push(MaxSum &v, float x) {
  if (x > v.m) {
    v.s = v.m == -INFINITY ? 1.0f : add(mul(v.s, softmax_exp(sub(v.m, x))), 1.0f);
    v.m = x;
  } else if (v.m != -INFINITY) {
    v.s = add(v.s, softmax_exp(sub(x, v.m)));
  }  // else x = m = -inf: nothing (e^-inf = 0 once a finite max exists)
}

// The pair of two disjoint column sets. Symmetric (combine(a, b) == combine(b, a) bit for bit),
// so a butterfly leaves the tree's value in every lane.
TE_CE_HD MaxSum combine(MaxSum a, MaxSum b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = a.m > b.m ? a.m : b.m;
  MaxSum r;
  r.m = m;
  r.s = add(mul(a.s, softmax_exp(sub(a.m, m))), mul(b.s, softmax_exp(sub(b.m, m))));
  return r;
}

// A counted row's loss: log(s) + (m - x[target]) (m - x[target] >= 0, exact when close).
TE_CE_HD float row_loss(MaxSum v, float x_target) { return add(softmax_log(v.s), sub(v.m, x_target)); }

// dlogits[j] = (e^(x_j - m) / s - onehot) * factor, factor = grad_scale / count.
TE_CE_HD float grad(float x, MaxSum v, bool is_target, float factor) {
  const float p = div(softmax_exp(sub(x, v.m)), v.s);
  return mul(sub(p, is_target ? 1.0f : 0.0f), factor);
}

TE_CE_HD float grad_factor(float grad_scale, int64_t count) { return div(grad_scale, static_cast<float>(count)); }

}  // namespace te::ce

#undef TE_CE_HD
