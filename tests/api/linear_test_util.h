// What only the te_linear_* API tests need on top of api_test_util.h: the fp64 reference of a
// linear layer's GEMMs with its own error bound (fp32 accumulation plus bias add), and the
// layer's serialized state as a "nothing changed" witness.
#pragma once

#include "api_test_util.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

namespace te_test {

// C[m, n] = sum_k A[m, k] * B[n, k] (both K-major, as x W^T), with |A||B| sums for the bound.
struct RefResult {
  std::vector<double> value, abs_sum;
  int64_t k = 0;
};
inline RefResult ref_gemm_nt(const std::vector<double> &a, const std::vector<double> &b,
                             int64_t m, int64_t n, int64_t k) {
  RefResult r;
  r.k = k;
  r.value = ref_gemm(a, b, m, n, k, /*transa=*/false, /*transb=*/true, &r.abs_sum);
  return r;
}

// Tolerance of one output element computed as fp32 accumulation of k products then rounded to
// `out_dtype`: the recursive-summation bound |err| <= k * 2^-24 * sum|a||b| (a few extra ulps
// for the two scale_inv multiplications and the bias add), then the output rounding:
// 2^-8 relative for BF16 (8-bit significand, round to nearest), 2^-24 for F32.
// Not gemm_tolerance (api_test_util.h): that one bounds a bare te_gemm (2(k+1) u32 accumulation,
// half-ulp output), this one a linear layer ((k+4) u32 with the bias add); each test keeps the
// bound it was written against.
inline double fp32_gemm_tol(double abs_sum, double ref, int64_t k, te_dtype out_dtype) {
  const double acc = static_cast<double>(k + 4) * std::ldexp(1.0, -24) * abs_sum;
  const double out_rel = out_dtype == TE_DTYPE_BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -23);
  return acc * (1.0 + out_rel) + out_rel * std::fabs(ref) + 1e-30;
}

inline ::testing::AssertionResult CloseToRef(const HostTensor &got, const RefResult &ref,
                                             const char *what) {
  if (got.numel() != static_cast<int64_t>(ref.value.size()))
    return ::testing::AssertionFailure() << what << ": size " << got.numel() << " vs "
                                         << ref.value.size();
  int64_t bad = 0;
  double worst = 0.0;
  std::ostringstream first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.at(i), w = ref.value[static_cast<size_t>(i)];
    const double tol = fp32_gemm_tol(ref.abs_sum[static_cast<size_t>(i)], w, ref.k, got.t.dtype);
    const double err = std::fabs(g - w);
    if (!(err <= tol)) {
      if (bad++ < 4)
        first << " [" << i << "]: got " << g << " expected " << w << " (err " << err << " > tol "
              << tol << ");";
    }
    worst = std::max(worst, tol > 0 ? err / tol : err);
  }
  if (bad)
    return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.numel()
                                         << " elements outside fp32-accumulation tolerance"
                                         << first.str();
  return ::testing::AssertionSuccess() << what << ": worst err/tol " << worst;
}

// Normwise relative error ||got - ref|| / ||ref||, for "FP8 is close to high precision".
inline double rel_norm_error(const HostTensor &got, const std::vector<double> &ref) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double d = got.at(i) - ref[static_cast<size_t>(i)];
    num += d * d;
    den += ref[static_cast<size_t>(i)] * ref[static_cast<size_t>(i)];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The layer's serialized FP8 state: a cheap "nothing changed" witness.
inline std::vector<unsigned char> saved_state(te_context *ctx, const te_linear *lin) {
  size_t size = 0;
  EXPECT_TE_OK(te_linear_state_save(ctx, lin, nullptr, 0, &size));
  std::vector<unsigned char> buf(size);
  size_t written = 0;
  EXPECT_TE_OK(te_linear_state_save(ctx, lin, buf.data(), buf.size(), &written));
  EXPECT_EQ(written, size);
  return buf;
}

}  // namespace te_test
