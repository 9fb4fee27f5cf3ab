// What the LayerNormLinear / LayerNormMLP API tests (test_layernorm_linear.cpp,
// test_layernorm_mlp.cpp) share on top of api_test_util.h, linear_test_util.h and
// module_reference.h:
//
//  - RAII handles of both modules and their backward contexts; the recipe a test mode runs;
//  - state witnesses: the serialized FP8 state (state_save bytes) and scaling snapshots;
//  - the values of a residual view the library owns (dequantized per block, by its own
//    scaling mode), back in [rows, cols] order;
//  - Bounded: fp64 forward error analysis. A quantity is carried as its exact fp64 value on
//    the high-precision inputs plus a componentwise bound on how far the library's value may
//    be from it, propagated through each rounding step the library takes (FP8 quantization,
//    storage in the activation dtype, fp32 GEMM accumulation, the norm's backward). The bounds
//    are derived from the formats' unit roundoffs, so a check against them is a proof obligation,
//    not a tuned tolerance: see each operation's comment.
#pragma once

#include "linear_test_util.h"
#include "module_reference.h"

#include <cfloat>
#include <functional>

namespace te_test {

// ---- handles ------------------------------------------------------------------------------

struct LnLinearDeleter { void operator()(te_layernorm_linear *m) const { te_layernorm_linear_destroy(m); } };
struct LnLinearBwdDeleter {
  void operator()(te_layernorm_linear_backward_ctx *b) const { te_layernorm_linear_backward_ctx_destroy(b); }
};
struct MlpDeleter { void operator()(te_layernorm_mlp *m) const { te_layernorm_mlp_destroy(m); } };
struct MlpBwdDeleter {
  void operator()(te_layernorm_mlp_backward_ctx *b) const { te_layernorm_mlp_backward_ctx_destroy(b); }
};
using LnLinearPtr = std::unique_ptr<te_layernorm_linear, LnLinearDeleter>;
using LnLinearBwdPtr = std::unique_ptr<te_layernorm_linear_backward_ctx, LnLinearBwdDeleter>;
using MlpPtr = std::unique_ptr<te_layernorm_mlp, MlpDeleter>;
using MlpBwdPtr = std::unique_ptr<te_layernorm_mlp_backward_ctx, MlpBwdDeleter>;

inline LnLinearPtr make_ln_linear(te_context *ctx, const te_layernorm_linear_options &o) {
  te_layernorm_linear *m = nullptr;
  EXPECT_TE_OK(te_layernorm_linear_create(&m, ctx, &o));
  return LnLinearPtr(m);
}
inline MlpPtr make_mlp(te_context *ctx, const te_layernorm_mlp_options &o) {
  te_layernorm_mlp *m = nullptr;
  EXPECT_TE_OK(te_layernorm_mlp_create(&m, ctx, &o));
  return MlpPtr(m);
}

// How a test's forward runs: outside any scope (high precision), in an enabled scope of one of
// the three recipe kinds, or in a calibrating scope (high precision, amaxes recorded).
enum class Mode { HighPrecision, Delayed, Current, Block, Calibrating };
inline const char *mode_name(Mode m) {
  switch (m) {
    case Mode::HighPrecision: return "HighPrecision";
    case Mode::Delayed: return "Delayed";
    case Mode::Current: return "Current";
    case Mode::Block: return "Block";
    case Mode::Calibrating: return "Calibrating";
  }
  return "?";
}
inline bool is_fp8_mode(Mode m) { return m == Mode::Delayed || m == Mode::Current || m == Mode::Block; }
// The recipe of a mode (te_recipe_options_init's defaults for its kind; delayed and calibrating
// with a short history, so that saved states stay small); NULL for high precision.
inline RecipePtr recipe_for(Mode m) {
  switch (m) {
    case Mode::HighPrecision: return RecipePtr();
    case Mode::Delayed: case Mode::Calibrating: return make_recipe(TE_RECIPE_DELAYED_SCALING, 16);
    case Mode::Current: return make_recipe(TE_RECIPE_CURRENT_SCALING);
    case Mode::Block: return make_recipe(TE_RECIPE_BLOCK_SCALING);
  }
  return RecipePtr();
}
// The scope a mode runs its forward in (none for high precision).
inline std::unique_ptr<AutocastScope> scope_for(te_context *ctx, Mode m, const te_recipe *r) {
  if (m == Mode::HighPrecision) return nullptr;
  if (m == Mode::Calibrating) return std::unique_ptr<AutocastScope>(new AutocastScope(ctx, r, 0, 1));
  return std::unique_ptr<AutocastScope>(new AutocastScope(ctx, r));
}

// ---- state witnesses ----------------------------------------------------------------------

inline std::vector<unsigned char> module_state(te_context *ctx, const te_layernorm_linear *m) {
  size_t size = 0;
  EXPECT_TE_OK(te_layernorm_linear_state_save(ctx, m, nullptr, 0, &size));
  std::vector<unsigned char> buf(size);
  size_t written = 0;
  EXPECT_TE_OK(te_layernorm_linear_state_save(ctx, m, buf.data(), buf.size(), &written));
  EXPECT_EQ(written, size);
  return buf;
}
inline std::vector<unsigned char> module_state(te_context *ctx, const te_layernorm_mlp *m) {
  size_t size = 0;
  EXPECT_TE_OK(te_layernorm_mlp_state_save(ctx, m, nullptr, 0, &size));
  std::vector<unsigned char> buf(size);
  size_t written = 0;
  EXPECT_TE_OK(te_layernorm_mlp_state_save(ctx, m, buf.data(), buf.size(), &written));
  EXPECT_EQ(written, size);
  return buf;
}

// Two byte buffers (saved states) are the same; otherwise where they first differ.
inline ::testing::AssertionResult SameBytes(const std::vector<unsigned char> &a, const std::vector<unsigned char> &b) {
  if (a == b) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return ::testing::AssertionFailure() << "buffers of " << a.size() << " and " << b.size()
                                       << " bytes differ from byte " << i;
}

inline ScalingSnapshot scaling_state(te_context *ctx, const te_layernorm_linear *m, te_tensor_role role,
                                     size_t history_cap = 64) {
  ScalingSnapshot s;
  std::memset(&s.info, 0, sizeof s.info);
  s.info.struct_size = sizeof s.info;
  s.history.assign(history_cap, -7.0f);
  EXPECT_TE_OK(te_layernorm_linear_get_scaling_state(ctx, m, role, &s.info, s.history.data(), history_cap));
  s.history.resize(std::min(history_cap, static_cast<size_t>(std::max(0, s.info.amax_history_len))));
  return s;
}
inline ScalingSnapshot scaling_state(te_context *ctx, const te_layernorm_mlp *m, te_mlp_gemm gemm,
                                     te_tensor_role role, size_t history_cap = 64) {
  ScalingSnapshot s;
  std::memset(&s.info, 0, sizeof s.info);
  s.info.struct_size = sizeof s.info;
  s.history.assign(history_cap, -7.0f);
  EXPECT_TE_OK(te_layernorm_mlp_get_scaling_state(ctx, m, gemm, role, &s.info, s.history.data(), history_cap));
  s.history.resize(std::min(history_cap, static_cast<size_t>(std::max(0, s.info.amax_history_len))));
  return s;
}

inline float amax_of(const std::vector<double> &v) {
  double a = 0;
  for (double x : v) a = std::max(a, std::fabs(x));
  return static_cast<float>(a);
}

// ---- residual views -----------------------------------------------------------------------

// The values (dequantized per block by its own scaling mode when FP8) of a [rows, cols] view
// the library owns.
inline Vec view_values(const te_tensor &t) {
  const HostTensor h = copy_tensor(t);
  return dequantize_ref(h);
}
// A residual that holds a transposed matrix ([cols, rows] of the matrix wanted), back in
// [rows, cols] order.
inline Vec untransposed(const te_tensor &t) {
  EXPECT_EQ(t.ndim, 2);
  return ref_transpose(view_values(t), t.shape[0], t.shape[1]);
}

// ---- forward error analysis -----------------------------------------------------------------
//
// Two bounds are carried for the library's deviation from the fp64 high-precision value v:
//  - e, a worst-case componentwise bound (every rounding error at its maximum, all aligned): a
//    rigorous check of every element, but for the long dot products of a GEMM it exceeds the
//    typical error by about sqrt(k), too loose to tell a wrong result from a right one;
//  - s2, the variance of the error under the standard probabilistic model of rounding (Higham &
//    Mary, "A new approach to probabilistic rounding error analysis", 2019): each rounding
//    error is independent, mean zero and at most h in magnitude, so of variance <= h^2 / 3.
//    The sum of s2 over a matrix is the expected squared Frobenius norm of its error (by
//    linearity, whatever the correlations between elements), and ||error||_F^2 sums thousands
//    of such terms, so it concentrates near that mean: the normwise check allows
//    kNormwiseLambda = 2 times its square root (a factor 4 in squared norm). The model itself
//    is pessimistic (every rounding at its largest variance, h^2 / 3 with h the largest
//    possible error): the errors measured here are 0.6-0.75 of its sqrt(sum s2).
// A check then requires both, and that the normwise bound is small (< 0.35 of ||v||), so that
// a gradient of the wrong sign (off by 2 ||v||) or one computed from a transposed or swapped
// operand (off by about sqrt(2) ||v|| for unrelated data) fails it.

constexpr double kU32 = 5.9604644775390625e-08;  // 2^-24, fp32 unit roundoff
constexpr double kNormwiseLambda = 2.0;

// Unit roundoff of a storage dtype (round to nearest: half an ulp relative) and the absolute
// error below its normal range (half the smallest subnormal spacing).
inline double unit_roundoff(te_dtype t) {
  switch (t) {
    case TE_DTYPE_F32: return std::ldexp(1.0, -24);
    case TE_DTYPE_F16: return std::ldexp(1.0, -11);
    case TE_DTYPE_BF16: return std::ldexp(1.0, -8);
    case TE_DTYPE_E4M3: return std::ldexp(1.0, -4);  // 3 mantissa bits
    case TE_DTYPE_E5M2: return std::ldexp(1.0, -3);  // 2 mantissa bits
  }
  return 1;
}
inline double underflow_error(te_dtype t) {
  switch (t) {
    case TE_DTYPE_F32: return std::ldexp(1.0, -150);
    case TE_DTYPE_F16: return std::ldexp(1.0, -25);
    case TE_DTYPE_BF16: return std::ldexp(1.0, -134);
    case TE_DTYPE_E4M3: return std::ldexp(1.0, -10);  // subnormal spacing 2^-9
    case TE_DTYPE_E5M2: return std::ldexp(1.0, -17);  // subnormal spacing 2^-16
  }
  return 1;
}

// A matrix [rows, cols]: its exact fp64 value `v`, the worst-case bound `e` (|library - v| <= e
// elementwise) and the error variance `s2` of the probabilistic model.
struct Bounded {
  Vec v, e, s2;
  int64_t rows = 0, cols = 0;
  static Bounded exact(Vec v, int64_t rows, int64_t cols) {
    Bounded b;
    b.e.assign(v.size(), 0.0);
    b.s2.assign(v.size(), 0.0);
    b.v = std::move(v);
    b.rows = rows;
    b.cols = cols;
    return b;
  }
  size_t at(int64_t r, int64_t c) const { return static_cast<size_t>(r * cols + c); }
};

// Rounding to a format whose unit roundoff is u (relative) with absolute error a below its
// normal range: the library rounds its own value w (|w - v| <= e), so
// |fl(w) - v| <= e + u |w| + a <= e + u (|v| + e) + a. In the probabilistic model w is
// within kNormwiseLambda standard deviations of v, and the new rounding error, at most
// u (|v| + 3 sqrt(s2)) + a, adds its square / 3 to the variance. Saturation never happens in
// these tests (scales are 1 on fresh delayed states with |values| far below 448, or
// amax-derived).
inline Bounded rounded(const Bounded &x, double u, double a) {
  Bounded r = x;
  for (size_t i = 0; i < r.v.size(); ++i) {
    const double h = u * (std::fabs(x.v[i]) + x.e[i]) + a;
    const double hp = u * (std::fabs(x.v[i]) + kNormwiseLambda * std::sqrt(x.s2[i])) + a;
    r.e[i] = x.e[i] + h;
    r.s2[i] = x.s2[i] + hp * hp / 3;
  }
  return r;
}
// Storage in a high-precision dtype.
inline Bounded stored(const Bounded &x, te_dtype dt) { return rounded(x, unit_roundoff(dt), underflow_error(dt)); }
// FP8 quantization with scale_inv <= `max_scale_inv` (per tensor, or the largest of any block):
// a code is fl8(w * s) and stands for code * scale_inv; relative error u8 of the FP8 rounding
// plus 3 fp32 roundings (w * s, 1/s, and the GEMM's rescale, counted here once more as slack),
// absolute error half the FP8 subnormal spacing times scale_inv.
inline Bounded quantized(const Bounded &x, te_dtype f8, double max_scale_inv) {
  return rounded(x, unit_roundoff(f8) + 4 * kU32, underflow_error(f8) * max_scale_inv);
}
// max scale_inv of a recipe's quantization of values with amax `amax`: delayed on a fresh state
// uses scale 1; current scaling 448/amax (so scale_inv = amax / fp8_max, rounded); block
// scaling's power-of-2 scales are at most a factor 2 below the exact one, and a block's amax is
// at most the tensor's.
inline double max_scale_inv(Mode m, te_dtype f8, double amax) {
  const double fmax = fp8_max(f8);
  switch (m) {
    case Mode::Delayed: return 1.0;
    case Mode::Current: return amax / fmax * (1 + 4 * kU32);
    case Mode::Block: return 2 * amax / fmax * (1 + 4 * kU32);
    default: return 0.0;
  }
}

// C = op(A) op(B) with fp32 accumulation of k products (any order): the product of perturbed
// operands errs by |A| eB + eA |B| + eA eB (variance A^2 s2B + s2A B^2 + s2A s2B, the k terms
// independent), and the fp32 sum of k rounded products (with up to 2 rescalings) by
// (k + 4) u32 sum |A'||B'| over the library's operands A' (|A'| <= |A| + eA).
// kind: "nt" C[m,n] = A[m,k] B[n,k]^T; "nn" C = A[m,k] B[k,n]; "tn" C = A[k,m]^T B[k,n].
inline Bounded gemm(const Bounded &a, const Bounded &b, const char *kind) {
  const std::string k(kind);
  int64_t m, n, kk;
  Vec (*f)(const Vec &, const Vec &, int64_t, int64_t, int64_t);
  if (k == "nt") { m = a.rows; kk = a.cols; n = b.rows; f = ref_nt; EXPECT_EQ(b.cols, kk); }
  else if (k == "nn") { m = a.rows; kk = a.cols; n = b.cols; f = ref_nn; EXPECT_EQ(b.rows, kk); }
  else { m = a.cols; kk = a.rows; n = b.cols; f = ref_tn; EXPECT_EQ(b.rows, kk); }
  auto map = [](const Vec &x, const Vec &y, double (*g)(double, double)) {
    Vec r(x.size());
    for (size_t i = 0; i < x.size(); ++i) r[i] = g(x[i], y[i]);
    return r;
  };
  const Vec abs_a = map(a.v, a.v, [](double x, double) { return std::fabs(x); });
  const Vec abs_b = map(b.v, b.v, [](double x, double) { return std::fabs(x); });
  const Vec abs_a2 = map(a.v, a.e, [](double x, double e) { return std::fabs(x) + e; });
  const Vec abs_b2 = map(b.v, b.e, [](double x, double e) { return std::fabs(x) + e; });
  const Vec sq_a = map(a.v, a.v, [](double x, double) { return x * x; });
  const Vec sq_b = map(b.v, b.v, [](double x, double) { return x * x; });
  Bounded c;
  c.rows = m;
  c.cols = n;
  c.v = f(a.v, b.v, m, n, kk);
  const Vec t1 = f(abs_a, b.e, m, n, kk), t2 = f(a.e, abs_b, m, n, kk), t3 = f(a.e, b.e, m, n, kk);
  const Vec acc = f(abs_a2, abs_b2, m, n, kk);
  const Vec v1 = f(sq_a, b.s2, m, n, kk), v2 = f(a.s2, sq_b, m, n, kk), v3 = f(a.s2, b.s2, m, n, kk);
  c.e.resize(c.v.size());
  c.s2.resize(c.v.size());
  for (size_t i = 0; i < c.v.size(); ++i) {
    const double accumulation = static_cast<double>(kk + 4) * kU32 * acc[i];
    c.e[i] = t1[i] + t2[i] + t3[i] + accumulation;
    c.s2[i] = v1[i] + v2[i] + v3[i] + accumulation * accumulation / 3;
  }
  return c;
}
// C + bias[n] (fp32 add: one more rounding of |C| + |bias|).
inline Bounded plus_bias(const Bounded &c, const Vec &bias) {
  Bounded r = c;
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < c.cols; ++j) {
      const size_t k = c.at(i, j);
      const double h = kU32 * (std::fabs(c.v[k]) + c.e[k] + std::fabs(bias[static_cast<size_t>(j)]));
      r.v[k] += bias[static_cast<size_t>(j)];
      r.e[k] += h;
      r.s2[k] += h * h / 3;
    }
  return r;
}
// Column sums over rows (db, dbeta) of the library's values: fp32 summation of `rows` terms.
inline Bounded column_sums(const Bounded &x) {
  Bounded r = Bounded::exact(Vec(static_cast<size_t>(x.cols), 0.0), 1, x.cols);
  Vec abs(static_cast<size_t>(x.cols), 0.0);
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t j = 0; j < x.cols; ++j) {
      r.v[static_cast<size_t>(j)] += x.v[x.at(i, j)];
      r.e[static_cast<size_t>(j)] += x.e[x.at(i, j)];
      r.s2[static_cast<size_t>(j)] += x.s2[x.at(i, j)];
      abs[static_cast<size_t>(j)] += std::fabs(x.v[x.at(i, j)]) + x.e[x.at(i, j)];
    }
  for (int64_t j = 0; j < x.cols; ++j) {
    const double h = static_cast<double>(x.rows + 2) * kU32 * abs[static_cast<size_t>(j)];
    r.e[static_cast<size_t>(j)] += h;
    r.s2[static_cast<size_t>(j)] += h * h / 3;
  }
  return r;
}

// The norm's forward in fp32 (numerics/norm.h: two-pass statistics, sums of n terms in a tree of
// depth <= n/256 + 8): each of mu, var, rsigma within (n + 16) u32 relative of its scale, so
// y_j = x_hat_j g_j + b_j within 4 (n + 16) u32 ((1 + |mu| rsigma + |x_hat_j|) |g_j| + |b_j|).
inline Bounded norm_forward_bounded(const NormRef &r, const Vec &x, const Vec &gamma, const Vec &beta, int64_t rows,
                                    int64_t n, bool layer, bool zero_centered) {
  Bounded b = Bounded::exact(r.y, rows, n);
  const double c = 4.0 * static_cast<double>(n + 16) * kU32;
  for (int64_t i = 0; i < rows; ++i) {
    double mu = 0;
    if (layer) {
      for (int64_t j = 0; j < n; ++j) mu += x[static_cast<size_t>(i * n + j)];
      mu /= static_cast<double>(n);
    }
    const double rs = r.rsigma[static_cast<size_t>(i)];
    for (int64_t j = 0; j < n; ++j) {
      const size_t k = static_cast<size_t>(i * n + j);
      const double g = zero_centered ? 1.0 + gamma[static_cast<size_t>(j)] : gamma[static_cast<size_t>(j)];
      const double bj = layer && !beta.empty() ? beta[static_cast<size_t>(j)] : 0.0;
      b.e[k] = c * ((1.0 + std::fabs(mu) * rs + std::fabs(r.x_hat[k])) * std::fabs(g) + std::fabs(bj));
      b.s2[k] = b.e[k] * b.e[k] / 3;
    }
  }
  return b;
}

// The norm's backward from d(norm output) `dln`. With dyg = dln * g, c1 = mean(dyg x_hat),
// c2 = mean(dyg) (LayerNorm):
//   dx_j = rs (dyg_j - x_hat_j c1 - c2)  =>  |d dx_j| <= rs (|g_j| e_j + |x_hat_j| mean(|g| e |x_hat|)
//                                                        + mean(|g| e))
//   dgamma_j = sum_rows dln x_hat        =>  |d dgamma_j| <= sum_rows e |x_hat|
//   dbeta_j = sum_rows dln               =>  |d dbeta_j| <= sum_rows e
// (variances alike, with squares: rs^2 (g_j^2 s2_j + x_hat_j^2 Var(c1) + Var(c2)), ...), plus
// the fp32 evaluation (statistics as in the forward, sums of n or rows terms): slack
// 4 (max(n, rows) + 16) u32 times the same expressions on |values| + bounds.
struct NormGradBounded {
  Bounded dx, dgamma, dbeta;
};
inline NormGradBounded norm_backward_bounded(const Bounded &dln, const NormRef &f, const Vec &gamma, int64_t rows,
                                             int64_t n, bool layer, bool zero_centered) {
  NormGradBounded out;
  const NormGradRef g = ref_norm_backward(dln.v, f, gamma, rows, n, layer, zero_centered);
  out.dx = Bounded::exact(g.dx, rows, n);
  out.dgamma = Bounded::exact(g.dgamma, 1, n);
  out.dbeta = Bounded::exact(g.dbeta, 1, n);
  const double c = 4.0 * static_cast<double>(std::max(n, rows) + 16) * kU32;
  auto gm = [&](int64_t j) {
    return std::fabs(zero_centered ? 1.0 + gamma[static_cast<size_t>(j)] : gamma[static_cast<size_t>(j)]);
  };
  Vec mag_gamma(static_cast<size_t>(n), 0.0), mag_beta(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    // Worst case: mean(|g| e |x_hat|), mean(|g| e), and the same on magnitudes; variance:
    // Var(c1) = sum (g x_hat)^2 s2 / n^2, Var(c2) = sum g^2 s2 / n^2.
    double m1 = 0, m2 = 0, a1 = 0, a2 = 0, v1 = 0, v2 = 0;
    for (int64_t j = 0; j < n; ++j) {
      const size_t k = static_cast<size_t>(i * n + j);
      const double xh = std::fabs(f.x_hat[k]), mag = std::fabs(dln.v[k]) + dln.e[k];
      m1 += gm(j) * dln.e[k] * xh;
      m2 += gm(j) * dln.e[k];
      a1 += gm(j) * mag * xh;
      a2 += gm(j) * mag;
      v1 += gm(j) * gm(j) * xh * xh * dln.s2[k];
      v2 += gm(j) * gm(j) * dln.s2[k];
      out.dgamma.e[static_cast<size_t>(j)] += dln.e[k] * xh;
      out.dgamma.s2[static_cast<size_t>(j)] += dln.s2[k] * xh * xh;
      out.dbeta.e[static_cast<size_t>(j)] += dln.e[k];
      out.dbeta.s2[static_cast<size_t>(j)] += dln.s2[k];
      mag_gamma[static_cast<size_t>(j)] += mag * (xh + c);
      mag_beta[static_cast<size_t>(j)] += mag;
    }
    const double dn = static_cast<double>(n);
    m1 /= dn;
    a1 /= dn;
    v1 /= dn * dn;
    m2 = layer ? m2 / dn : 0.0;
    a2 = layer ? a2 / dn : 0.0;
    v2 = layer ? v2 / (dn * dn) : 0.0;
    const double rs = f.rsigma[static_cast<size_t>(i)];
    for (int64_t j = 0; j < n; ++j) {
      const size_t k = static_cast<size_t>(i * n + j);
      const double xh = std::fabs(f.x_hat[k]), mag = std::fabs(dln.v[k]) + dln.e[k];
      const double h = c * rs * (gm(j) * mag + (xh + c) * a1 + a2);
      out.dx.e[k] = rs * (gm(j) * dln.e[k] + xh * m1 + m2) + h;
      out.dx.s2[k] = rs * rs * (gm(j) * gm(j) * dln.s2[k] + xh * xh * v1 + v2) + h * h / 3;
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    const double hg = c * mag_gamma[static_cast<size_t>(j)], hb = c * mag_beta[static_cast<size_t>(j)];
    out.dgamma.e[static_cast<size_t>(j)] += hg;
    out.dgamma.s2[static_cast<size_t>(j)] += hg * hg / 3;
    out.dbeta.e[static_cast<size_t>(j)] += hb;
    out.dbeta.s2[static_cast<size_t>(j)] += hb * hb / 3;
  }
  return out;
}

// The check against a Bounded reference: every element within its worst-case bound (times
// `slack` >= 1 for what the analysis leaves out, e.g. fp32 evaluation of transcendental
// functions), and the normwise relative error ||got - v|| / ||v|| within
// kNormwiseLambda sqrt(sum s2) / ||v||, which must itself be below max_rel_bound for the check
// to mean anything. The negated reference is checked to fail.
inline ::testing::AssertionResult WithinBound(const std::vector<double> &got, const Bounded &ref, const char *what,
                                              double slack = 1.0, double max_rel_bound = 0.35) {
  if (got.size() != ref.v.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, expected " << ref.v.size();
  double num = 0, den = 0, var = 0, worst = 0;
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = got[i] - ref.v[i], tol = slack * ref.e[i] + 1e-30;
    num += d * d;
    den += ref.v[i] * ref.v[i];
    var += ref.s2[i];
    if (!(std::fabs(d) <= tol)) {
      if (bad++ < 4)
        first << " [" << i << "]: got " << got[i] << " expected " << ref.v[i] << " +- " << tol << ";";
    }
    if (std::fabs(d) / tol > worst || std::isnan(d)) worst = std::isnan(d) ? INFINITY : std::fabs(d) / tol;
  }
  const double norm = std::sqrt(den);
  const double rel = den > 0 ? std::sqrt(num) / norm : std::sqrt(num);
  const double rel_bound = (kNormwiseLambda * slack * std::sqrt(var) + 1e-30) / (den > 0 ? norm : 1.0);
  if (bad)
    return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size()
                                         << " elements outside their worst-case error bound (normwise relative "
                                            "error "
                                         << rel << ", bound " << rel_bound << "):" << first.str();
  if (!(rel <= rel_bound))
    return ::testing::AssertionFailure() << what << ": normwise relative error " << rel << " > bound " << rel_bound;
  if (!(rel_bound < max_rel_bound))
    return ::testing::AssertionFailure() << what << ": the normwise error bound " << rel_bound
                                         << " is too loose to tell a wrong result from a right one";
  if (den > 0 && !(2.0 > rel_bound))
    return ::testing::AssertionFailure() << what << ": the bound would accept a gradient of the wrong sign";
  // TE_TEST_PRINT_BOUNDS=1 prints every check's margins, to review how tight the bounds are.
  if (std::getenv("TE_TEST_PRINT_BOUNDS"))
    std::printf("[bound] %-34s normwise %.3g of bound %.3g; worst element %.3g of its worst case\n", what, rel,
                rel_bound, worst);
  return ::testing::AssertionSuccess() << what << ": normwise relative error " << rel << " (bound " << rel_bound
                                       << "), worst element at " << worst << " of its bound";
}

}  // namespace te_test
