// te_norm_forward / te_norm_backward (LayerNorm and RMSNorm) through the public API only:
// forward against an fp64 reference (with error bounds derived below), FP8 outputs against the
// F32 output of the same call path cast by the reference encoder, current scaling, backward
// against the fp64 gradient formulas and against central finite differences of the forward,
// determinism, and every argument's rejection (status, message, outputs untouched).
#include <functional>

#include "api_test_util.h"

using namespace te_test;

namespace {

const double kU32 = std::ldexp(1.0, -24);  // unit roundoff of fp32

// Unit roundoff of storing into `t`, and the absolute error of storing a value near its
// subnormal range (half its smallest spacing).
double unit_roundoff(te_dtype t) {
  return t == TE_DTYPE_F32 ? kU32 : t == TE_DTYPE_F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}
double tiny(te_dtype t) { return t == TE_DTYPE_F16 ? std::ldexp(1.0, -25) : std::ldexp(1.0, -130); }

// The library sums a row in the fixed order of te's norm numerics: 256 lanes each summing n/256
// terms in sequence, then a tree of 8 levels. Such a sum of terms t_i errs by at most
// k * u * sum|t_i| with k = ceil(n / 256) + 8 (one rounding per addition a term goes through).
double sum_depth(int64_t n) { return static_cast<double>((n + 255) / 256 + 8); }

// ---- fp64 reference -------------------------------------------------------------------------

struct Ref {
  int64_t rows = 0, n = 0;
  std::vector<double> y, mu, rsigma, xhat, g;
};

// x [rows, n], gamma and beta [n] as the values the tensors hold; g = gamma or 1 + gamma.
Ref ref_forward(te_norm_kind kind, double eps, bool zcg, const std::vector<double> &x, int64_t rows, int64_t n,
                const std::vector<double> &gamma, const std::vector<double> *beta) {
  Ref r;
  r.rows = rows;
  r.n = n;
  r.g.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) r.g[j] = zcg ? 1.0 + gamma[j] : gamma[j];
  r.y.resize(x.size());
  r.xhat.resize(x.size());
  for (int64_t i = 0; i < rows; ++i) {
    const double *xr = &x[static_cast<size_t>(i * n)];
    double mu = 0, second = 0;
    if (kind == TE_NORM_LAYERNORM) {
      for (int64_t j = 0; j < n; ++j) mu += xr[j];
      mu /= static_cast<double>(n);
      for (int64_t j = 0; j < n; ++j) second += (xr[j] - mu) * (xr[j] - mu);
    } else {
      for (int64_t j = 0; j < n; ++j) second += xr[j] * xr[j];
    }
    const double rs = 1.0 / std::sqrt(second / static_cast<double>(n) + eps);
    r.mu.push_back(mu);
    r.rsigma.push_back(rs);
    for (int64_t j = 0; j < n; ++j) {
      const double xh = (xr[j] - mu) * rs;
      r.xhat[static_cast<size_t>(i * n + j)] = xh;
      r.y[static_cast<size_t>(i * n + j)] = xh * r.g[j] + (beta ? (*beta)[j] : 0.0);
    }
  }
  return r;
}

struct RefGrad {
  std::vector<double> dx, dgamma, dbeta;
  // error-bound ingredients, per element / per column
  std::vector<double> dx_scale, dgamma_scale, dbeta_scale;
};

// The gradients of sum(dy * y) for the forward above, with the exact fp64 statistics:
//   dx = rsigma * (dyg - x_hat * mean(dyg * x_hat) - mean(dyg))    (RMSNorm: no mean(dyg))
//   dgamma = sum_rows dy * x_hat, dbeta = sum_rows dy, dyg = dy * g.
// dx_scale etc. collect the magnitudes the library's fp32 rounding errors are proportional to.
RefGrad ref_backward(te_norm_kind kind, const Ref &r, const std::vector<double> &dy) {
  const int64_t rows = r.rows, n = r.n;
  const bool layer = kind == TE_NORM_LAYERNORM;
  RefGrad g;
  g.dx.resize(dy.size());
  g.dx_scale.resize(dy.size());
  g.dgamma.assign(static_cast<size_t>(n), 0.0);
  g.dbeta.assign(static_cast<size_t>(n), 0.0);
  g.dgamma_scale.assign(static_cast<size_t>(n), 0.0);
  g.dbeta_scale.assign(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double c1 = 0, c2 = 0, s1 = 0, s2 = 0;
    for (int64_t j = 0; j < n; ++j) {
      const size_t k = static_cast<size_t>(i * n + j);
      const double dyg = dy[k] * r.g[j];
      c1 += dyg * r.xhat[k];
      c2 += dyg;
      s1 += std::fabs(dyg * r.xhat[k]);
      s2 += std::fabs(dyg);
    }
    c1 /= n;
    c2 = layer ? c2 / n : 0.0;
    s1 /= n;
    s2 /= n;
    const double rs = r.rsigma[i], mu_term = std::fabs(r.mu[i]) * rs;
    for (int64_t j = 0; j < n; ++j) {
      const size_t k = static_cast<size_t>(i * n + j);
      const double dyg = dy[k] * r.g[j];
      g.dx[k] = rs * (dyg - r.xhat[k] * c1 - c2);
      g.dx_scale[k] = rs * (std::fabs(dyg) + (std::fabs(r.xhat[k]) + mu_term + 1.0) * (std::fabs(c1) + s1 + s2)) +
                      std::fabs(g.dx[k]);
      g.dgamma[j] += dy[k] * r.xhat[k];
      g.dbeta[j] += dy[k];
      g.dgamma_scale[j] += std::fabs(dy[k]) * (std::fabs(r.xhat[k]) + mu_term);
      g.dbeta_scale[j] += std::fabs(dy[k]);
    }
  }
  return g;
}

// ---- error bounds ---------------------------------------------------------------------------
//
// Forward, one element: the mean errs by <= k u mean|x| (k = sum_depth), so x - mu by that plus
// u |x - mu|; the variance's terms are non-negative, so it errs relatively by <= (k + 3) u and
// rsigma = 1/sqrt(var + eps) by <= ((k + 3)/2 + 2) u; x_hat = (x - mu) * rsigma then errs by
// <= u (|x_hat| (k/2 + 6) + rsigma |mu| k), and y = x_hat * g + beta adds |g| times that and
// two roundings (|x_hat g| u + |y| u; 1 + gamma adds |g| |x_hat| u). We allow twice that, with
// k + 8 in place of each k-multiple, and add half an ulp of the output dtype (and its subnormal
// spacing) for the final store. Inputs enter exactly: the reference reads the values the tensors
// hold.
double forward_tolerance(int64_t n, double xhat, double mu, double rsigma, double g, double y, te_dtype out) {
  const double k = sum_depth(n);
  const double fp32 = 2.0 * kU32 *
                      (std::fabs(g) * ((k + 8) * std::fabs(xhat) + (k + 8) * rsigma * std::fabs(mu)) +
                       2.0 * std::fabs(xhat * g) + std::fabs(y) + 1e-30);
  return fp32 + unit_roundoff(out) * std::fabs(y) + tiny(out);
}

// Backward: the two row sums c1, c2 err by (k + 2) u of their magnitudes s1, s2, x_hat carries
// the forward's error above (the library uses its own fp32 mu/rsigma), and dx adds a handful of
// roundings: 4 (k + 8) u times dx_scale bounds it with room. dgamma/dbeta sum over rows in an
// order the header leaves open (GPUs tile): (rows + k + 16) u of the sum of |terms|, twice.
double dx_tolerance(int64_t n, double scale, double dx, te_dtype out) {
  return 4.0 * (sum_depth(n) + 8) * kU32 * scale + unit_roundoff(out) * std::fabs(dx) + tiny(out);
}
double column_tolerance(int64_t rows, int64_t n, double scale, double v, te_dtype out) {
  return 2.0 * static_cast<double>(rows + sum_depth(n) + 16) * kU32 * scale + unit_roundoff(out) * std::fabs(v) +
         tiny(out);
}

// Compares got with want element-wise under tol(i); reports the first few misses.
::testing::AssertionResult Near(const std::vector<double> &got, const std::vector<double> &want,
                                const std::function<double(size_t)> &tol, const char *what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values, expected " << want.size();
  int bad = 0;
  std::ostringstream s;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(got[i] - want[i]), t = tol(i);
    if (!(d <= t)) {
      if (bad++ < 4) s << " [" << i << "] got " << got[i] << " want " << want[i] << " (|diff| " << d << " > " << t << ");";
    } else if (t > 0) {
      worst = std::max(worst, d / t);
    }
  }
  if (bad) return ::testing::AssertionFailure() << what << ": " << bad << " of " << want.size() << " off:" << s.str();
  return ::testing::AssertionSuccess() << what << ": worst error " << worst << " of the bound";
}

// ---- calls ----------------------------------------------------------------------------------

te_norm_options norm_opts(te_norm_kind kind, float eps = 1e-5f, int zcg = 0) {
  te_norm_options o;
  std::memset(&o, 0x5A, sizeof o);
  EXPECT_TE_OK(te_norm_options_init(&o));
  o.kind = kind;
  o.eps = eps;
  o.zero_centered_gamma = zcg;
  return o;
}

te_norm_forward_args fwd_args() {
  te_norm_forward_args a;
  std::memset(&a, 0x5A, sizeof a);
  EXPECT_TE_OK(te_norm_forward_args_init(&a));
  return a;
}

te_quantize_options qopts() {
  te_quantize_options o;
  std::memset(&o, 0x5A, sizeof o);
  EXPECT_TE_OK(te_quantize_options_init(&o));
  return o;
}

std::vector<int64_t> shape_of(const HostTensor &t) { return std::vector<int64_t>(t.t.shape, t.t.shape + t.t.ndim); }

// One norm problem: x [..., n], gamma, beta (LayerNorm), dy, in `dtype`.
struct Problem {
  te_norm_kind kind;
  te_dtype dtype;
  std::vector<int64_t> shape;
  int64_t rows, n;
  HostTensor x, gamma, beta, dy;
  Problem(te_norm_kind k, te_dtype dt, std::vector<int64_t> s, uint32_t seed, float xlo = -2, float xhi = 2)
      : kind(k), dtype(dt), shape(s) {
    n = s.back();
    rows = 1;
    for (size_t i = 0; i + 1 < s.size(); ++i) rows *= s[i];
    x = random_tensor(dt, s, xlo, xhi, seed);
    gamma = random_tensor(dt, {n}, 0.5f, 1.5f, seed + 1);
    beta = random_tensor(dt, {n}, -0.5f, 0.5f, seed + 2);
    dy = random_tensor(dt, s, -1, 1, seed + 3);
  }
  bool layer() const { return kind == TE_NORM_LAYERNORM; }
  const te_tensor *beta_arg() const { return layer() ? beta.get() : nullptr; }
  Ref ref(float eps, bool zcg) const {
    std::vector<double> b = beta.values();
    return ref_forward(kind, eps, zcg, x.values(), rows, n, gamma.values(), layer() ? &b : nullptr);
  }
};

// Runs the forward with a high-precision output of `out_dtype`; fills mu/rsigma.
struct Forward {
  HostTensor y, mu, rsigma;
};
Forward run_forward(te_context *ctx, const Problem &p, te_dtype out_dtype, const te_norm_options &o,
                    std::vector<int64_t> out_shape = {}) {
  Forward f;
  f.y = make_tensor(out_dtype, out_shape.empty() ? p.shape : out_shape);
  f.mu = make_tensor(TE_DTYPE_F32, {p.rows});
  f.rsigma = make_tensor(TE_DTYPE_F32, {p.rows});
  te_norm_forward_args a = fwd_args();
  a.input = p.x.get();
  a.weight = p.gamma.get();
  a.bias = p.beta_arg();
  a.output = f.y.get();
  a.mu = p.layer() ? f.mu.get() : nullptr;
  a.rsigma = f.rsigma.get();
  a.quantize = nullptr;
  EXPECT_TE_OK(te_norm_forward(ctx, &o, &a));
  return f;
}

void check_forward(const Problem &p, const Forward &f, const te_norm_options &o, te_dtype out_dtype) {
  const Ref r = p.ref(o.eps, o.zero_centered_gamma);
  const int64_t n = p.n;
  EXPECT_TRUE(Near(f.y.values(), r.y,
                   [&](size_t i) {
                     const size_t row = i / static_cast<size_t>(n);
                     return forward_tolerance(n, r.xhat[i], r.mu[row], r.rsigma[row], r.g[i % static_cast<size_t>(n)], r.y[i], out_dtype);
                   },
                   "y"));
  // The statistics: the mean errs by k u mean|x| (absolute), rsigma by ((k + 3)/2 + 2) u relatively.
  std::vector<double> xv = p.x.values();
  std::vector<double> mean_abs(static_cast<size_t>(p.rows), 0.0);
  for (int64_t i = 0; i < p.rows * n; ++i) mean_abs[static_cast<size_t>(i / n)] += std::fabs(xv[i]) / n;
  const double k = sum_depth(n);
  EXPECT_TRUE(Near(f.rsigma.values(), r.rsigma, [&](size_t i) { return 2 * (k + 8) * kU32 * r.rsigma[i]; }, "rsigma"));
  if (p.layer())
    EXPECT_TRUE(Near(f.mu.values(), r.mu, [&](size_t i) { return 2 * (k + 1) * kU32 * mean_abs[i]; }, "mu"));
}

class Norm : public CpuContextTest {};

// ---- options --------------------------------------------------------------------------------

TEST_F(Norm, OptionsDefaults) {
  te_norm_options o;
  std::memset(&o, 0x5A, sizeof o);
  ASSERT_TE_OK(te_norm_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof(te_norm_options));
  EXPECT_EQ(o.kind, TE_NORM_LAYERNORM);
  EXPECT_EQ(o.eps, 1e-5f);
  EXPECT_EQ(o.zero_centered_gamma, 0);
  te_norm_forward_args a;
  std::memset(&a, 0x5A, sizeof a);
  ASSERT_TE_OK(te_norm_forward_args_init(&a));
  EXPECT_EQ(a.struct_size, sizeof(te_norm_forward_args));
  EXPECT_EQ(a.input, nullptr);
  EXPECT_EQ(a.weight, nullptr);
  EXPECT_EQ(a.bias, nullptr);
  EXPECT_EQ(a.output, nullptr);
  EXPECT_EQ(a.output_t, nullptr);
  EXPECT_EQ(a.mu, nullptr);
  EXPECT_EQ(a.rsigma, nullptr);
  EXPECT_EQ(a.quantize, nullptr);
}

TEST_F(Norm, NullOptionsAreTheDefaults) {
  Problem p(TE_NORM_LAYERNORM, TE_DTYPE_F32, {5, 40}, 7);
  Forward with = run_forward(ctx_, p, TE_DTYPE_F32, norm_opts(TE_NORM_LAYERNORM));
  HostTensor y = make_tensor(TE_DTYPE_F32, p.shape);
  te_norm_forward_args a = fwd_args();
  a.input = p.x.get();
  a.weight = p.gamma.get();
  a.bias = p.beta.get();
  a.output = y.get();
  ASSERT_TE_OK(te_norm_forward(ctx_, nullptr, &a));
  EXPECT_TRUE(bitwise_equal(y, with.y));
}

// ---- forward numerics -----------------------------------------------------------------------

TEST_F(Norm, ForwardMatchesFp64Reference) {
  const std::vector<std::vector<int64_t>> shapes = {{6, 1}, {7, 100}, {4, 4096}, {2, 3, 100}, {1, 2, 2, 33}, {300}};
  for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM})
    for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16})
      for (const auto &shape : shapes) {
        SCOPED_TRACE(std::string(kind == TE_NORM_LAYERNORM ? "LayerNorm " : "RMSNorm ") + dtype_name(dt) + " hidden " +
                     std::to_string(shape.back()) + " ndim " + std::to_string(shape.size()));
        Problem p(kind, dt, shape, 11 + static_cast<uint32_t>(shape.back()));
        const te_norm_options o = norm_opts(kind);
        check_forward(p, run_forward(ctx_, p, dt, o), o, dt);
        // The output dtype need not be x's: F32 out of a 16-bit input.
        if (dt != TE_DTYPE_F32) check_forward(p, run_forward(ctx_, p, TE_DTYPE_F32, o), o, TE_DTYPE_F32);
      }
}

TEST_F(Norm, ForwardOtherEpsAndOffsetInputs) {
  // Inputs with a large common offset (LayerNorm removes it) and a large eps (it dominates a
  // small variance).
  for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM})
    for (float eps : {1e-5f, 1e-2f, 4.0f}) {
      Problem p(kind, TE_DTYPE_F32, {9, 257}, 19, 9.0f, 11.0f);
      const te_norm_options o = norm_opts(kind, eps);
      check_forward(p, run_forward(ctx_, p, TE_DTYPE_F32, o), o, TE_DTYPE_F32);
    }
}

TEST_F(Norm, HiddenOne) {
  // One element per row: LayerNorm's variance is 0, so y = beta exactly; RMSNorm gives
  // x / sqrt(x^2 + eps) * gamma.
  Problem p(TE_NORM_LAYERNORM, TE_DTYPE_F32, {8, 1}, 23);
  Forward f = run_forward(ctx_, p, TE_DTYPE_F32, norm_opts(TE_NORM_LAYERNORM));
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(f.y.at(i), p.beta.at(0)) << i;
    EXPECT_EQ(f.mu.at(i), p.x.at(i)) << i;
    EXPECT_EQ(f.rsigma.at(i), static_cast<double>(1.0f / std::sqrt(1e-5f))) << i;
  }
  Problem q(TE_NORM_RMSNORM, TE_DTYPE_F32, {8, 1}, 24);
  const te_norm_options o = norm_opts(TE_NORM_RMSNORM);
  check_forward(q, run_forward(ctx_, q, TE_DTYPE_F32, o), o, TE_DTYPE_F32);
}

TEST_F(Norm, ZeroCenteredGamma) {
  for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM})
    for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16}) {
      SCOPED_TRACE(dtype_name(dt));
      Problem p(kind, dt, {6, 130}, 29);
      fill_uniform(p.gamma, -0.5f, 0.5f, 30);
      const te_norm_options z = norm_opts(kind, 1e-5f, 1);
      Forward fz = run_forward(ctx_, p, dt, z);
      check_forward(p, fz, z, dt);
      // The library forms 1.0f + gamma in fp32: with that gamma and the option off, the same bits.
      if (dt == TE_DTYPE_F32) {
        Problem q = p;
        for (int64_t j = 0; j < p.n; ++j) q.gamma.set(j, 1.0f + static_cast<float>(p.gamma.at(j)));
        Forward f1 = run_forward(ctx_, q, dt, norm_opts(kind));
        EXPECT_TRUE(bitwise_equal(fz.y, f1.y));
      }
      // gamma = 0 is the identity scale.
      Problem zero = p;
      for (int64_t j = 0; j < p.n; ++j) zero.gamma.set(j, 0.0f);
      Forward f0 = run_forward(ctx_, zero, TE_DTYPE_F32, z);
      const Ref r = zero.ref(1e-5f, true);
      for (int64_t i = 0; i < p.rows * p.n; ++i) EXPECT_NEAR(f0.y.at(i), r.y[i], 1e-5 * (1 + std::fabs(r.y[i]))) << i;
    }
}

TEST_F(Norm, OutputShapesAndStatisticShapes) {
  // A 3-D x: output as x's shape or as [rows, hidden]; mu/rsigma as [rows] or x's leading dims.
  Problem p(TE_NORM_LAYERNORM, TE_DTYPE_BF16, {2, 3, 48}, 31);
  const te_norm_options o = norm_opts(TE_NORM_LAYERNORM);
  Forward a = run_forward(ctx_, p, TE_DTYPE_BF16, o);
  Forward b = run_forward(ctx_, p, TE_DTYPE_BF16, o, {6, 48});
  EXPECT_TRUE(bitwise_equal(a.y, b.y));
  HostTensor y = make_tensor(TE_DTYPE_BF16, p.shape), mu = make_tensor(TE_DTYPE_F32, {2, 3}),
             rs = make_tensor(TE_DTYPE_F32, {2, 3});
  te_norm_forward_args args = fwd_args();
  args.input = p.x.get();
  args.weight = p.gamma.get();
  args.bias = p.beta.get();
  args.output = y.get();
  args.mu = mu.get();
  args.rsigma = rs.get();
  ASSERT_TE_OK(te_norm_forward(ctx_, &o, &args));
  EXPECT_TRUE(bitwise_equal(y, a.y));
  EXPECT_TRUE(bitwise_equal(mu, a.mu));
  EXPECT_TRUE(bitwise_equal(rs, a.rsigma));
  // Statistics are optional.
  args.mu = nullptr;
  args.rsigma = nullptr;
  HostTensor y2 = make_tensor(TE_DTYPE_BF16, p.shape);
  args.output = y2.get();
  ASSERT_TE_OK(te_norm_forward(ctx_, &o, &args));
  EXPECT_TRUE(bitwise_equal(y2, a.y));
}

TEST_F(Norm, NanInARowStaysInThatRow) {
  Problem p(TE_NORM_LAYERNORM, TE_DTYPE_F32, {4, 20}, 37);
  p.x.set(2 * 20 + 5, NAN);
  Forward f = run_forward(ctx_, p, TE_DTYPE_F32, norm_opts(TE_NORM_LAYERNORM));
  for (int64_t i = 0; i < 80; ++i) EXPECT_EQ(std::isnan(f.y.at(i)), i / 20 == 2) << i;
}

// ---- FP8 outputs ------------------------------------------------------------------------------

// out holds fp8(v * scale) of the F32 values v (product rounded to fp32 first, as every cast),
// out_t (when given) is its byte transpose, and both scale_inv are 1 / scale.
void expect_fp8_of(const HostTensor &v, const HostTensor *out, const HostTensor *out_t, float scale, int64_t rows,
                   int64_t n) {
  const HostTensor &any = out ? *out : *out_t;
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) {
      const float prod = static_cast<float>(v.at(r * n + c)) * scale;
      const uint8_t want = fp8_encode(prod, any.t.dtype);
      const uint8_t got = out ? out->code(r * n + c) : out_t->code(c * rows + r);
      // Byte equality, except that a NaN may keep its sign (fp8_encode writes the positive one).
      const bool both_nan = std::isnan(prod) && std::isnan(fp8_to_double(got, any.t.dtype));
      if (want != got && !both_nan && bad++ < 4)
        ADD_FAILURE() << "[" << r << "," << c << "] v=" << v.at(r * n + c) << " v*scale=" << prod << " code 0x"
                      << std::hex << int(got) << ", expected 0x" << int(want) << std::dec;
      if (out && out_t && out_t->code(c * rows + r) != out->code(r * n + c) && bad++ < 4)
        ADD_FAILURE() << "output_t[" << c << "," << r << "] is not output[" << r << "," << c << "]";
    }
  EXPECT_EQ(bad, 0);
  if (out) EXPECT_EQ(float_to_bits(out->scale_inv[0]), float_to_bits(1.0f / scale));
  if (out_t) EXPECT_EQ(float_to_bits(out_t->scale_inv[0]), float_to_bits(1.0f / scale));
}

double max_abs(const HostTensor &v) {
  double m = 0;
  for (int64_t i = 0; i < v.numel(); ++i) m = std::max(m, std::fabs(v.at(i)));
  return m;
}

TEST_F(Norm, Fp8OutputWithGivenScaleIsTheCastOfTheF32Output) {
  for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM})
    for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16})
      for (te_dtype f8 : {TE_DTYPE_E4M3, TE_DTYPE_E5M2})
        for (std::vector<int64_t> shape : {std::vector<int64_t>{32, 64}, {2, 5, 33}, {3, 1}}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + " -> " + dtype_name(f8) + " hidden " + std::to_string(shape.back()));
          Problem p(kind, dt, shape, 41);
          const te_norm_options o = norm_opts(kind, 1e-5f, 0);
          Forward v = run_forward(ctx_, p, TE_DTYPE_F32, o);  // the F32 path: v
          for (float scale : {1.0f, 37.5f, 3000.0f}) {        // 3000: some codes saturate
            HostTensor out = make_tensor(f8, p.shape), out_t = make_tensor(f8, {p.n, p.rows});
            HostTensor mu = make_tensor(TE_DTYPE_F32, {p.rows}), rs = make_tensor(TE_DTYPE_F32, {p.rows});
            float s = scale, amax = 0.25f;
            te_quantize_options q = qopts();
            q.scale = &s;
            q.amax = &amax;
            te_norm_forward_args a = fwd_args();
            a.input = p.x.get();
            a.weight = p.gamma.get();
            a.bias = p.beta_arg();
            a.output = out.get();
            a.output_t = out_t.get();
            a.mu = p.layer() ? mu.get() : nullptr;
            a.rsigma = rs.get();
            a.quantize = &q;
            ASSERT_TE_OK(te_norm_forward(ctx_, &o, &a));
            expect_fp8_of(v.y, &out, &out_t, scale, p.rows, p.n);
            EXPECT_EQ(amax, static_cast<float>(std::max(0.25, max_abs(v.y))));
            EXPECT_TRUE(bitwise_equal(rs, v.rsigma));
            if (p.layer()) EXPECT_TRUE(bitwise_equal(mu, v.mu));
            EXPECT_EQ(s, scale) << "the caller's scale changed";
          }
        }
}

TEST_F(Norm, Fp8TransposeAloneOrBesideAHighPrecisionOutput) {
  for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM}) {
    Problem p(kind, TE_DTYPE_BF16, {24, 40}, 43);
    const te_norm_options o = norm_opts(kind);
    float s = 20.0f;
    te_quantize_options q = qopts();
    q.scale = &s;
    // output F32 + output_t FP8 in one call: out_t is the cast of that very output.
    HostTensor y = make_tensor(TE_DTYPE_F32, p.shape), out_t = make_tensor(TE_DTYPE_E4M3, {40, 24});
    te_norm_forward_args a = fwd_args();
    a.input = p.x.get();
    a.weight = p.gamma.get();
    a.bias = p.beta_arg();
    a.output = y.get();
    a.output_t = out_t.get();
    a.quantize = &q;
    ASSERT_TE_OK(te_norm_forward(ctx_, &o, &a));
    expect_fp8_of(y, nullptr, &out_t, s, 24, 40);
    EXPECT_TRUE(bitwise_equal(y, run_forward(ctx_, p, TE_DTYPE_F32, o).y));
    // output_t alone.
    HostTensor out_t2 = make_tensor(TE_DTYPE_E4M3, {40, 24});
    a.output = nullptr;
    a.output_t = out_t2.get();
    ASSERT_TE_OK(te_norm_forward(ctx_, &o, &a));
    EXPECT_TRUE(same_contents(out_t, out_t2));
  }
}

TEST_F(Norm, CurrentScalingTakesTheScaleFromTheAmax) {
  struct Mode { float eps; int pow2; };
  for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM})
    for (te_dtype f8 : {TE_DTYPE_E4M3, TE_DTYPE_E5M2})
      for (Mode m : {Mode{0.0f, 0}, Mode{0.0f, 1}, Mode{100.0f, 0}})
        for (bool null_quantize : {false, true}) {
          if (null_quantize && (m.eps != 0 || m.pow2)) continue;
          SCOPED_TRACE(std::string(dtype_name(f8)) + " eps " + std::to_string(m.eps) + " pow2 " + std::to_string(m.pow2) +
                       (null_quantize ? " quantize NULL" : ""));
          Problem p(kind, TE_DTYPE_BF16, {3, 16, 48}, 47);
          const te_norm_options o = norm_opts(kind);
          Forward v = run_forward(ctx_, p, TE_DTYPE_F32, o);
          const float amax_v = static_cast<float>(max_abs(v.y));
          const float scale = scale_from_amax(amax_v, static_cast<float>(fp8_max(f8)), m.pow2, m.eps);
          HostTensor out = make_tensor(f8, {p.rows, p.n}), out_t = make_tensor(f8, {p.n, p.rows});
          float amax = 0.0f;
          te_quantize_options q = qopts();
          q.amax = &amax;
          q.amax_epsilon = m.eps;
          q.power_of_2_scales = m.pow2;
          te_norm_forward_args a = fwd_args();
          a.input = p.x.get();
          a.weight = p.gamma.get();
          a.bias = p.beta_arg();
          a.output = out.get();
          a.output_t = out_t.get();
          a.quantize = null_quantize ? nullptr : &q;
          ASSERT_TE_OK(te_norm_forward(ctx_, &o, &a));
          expect_fp8_of(v.y, &out, &out_t, scale, p.rows, p.n);
          if (!null_quantize) EXPECT_EQ(amax, amax_v);
          if (m.pow2) EXPECT_EQ(float_to_bits(scale) & 0x7FFFFF, 0u);
        }
}

TEST_F(Norm, CurrentScalingOfNanOrZeroFallsBackToScaleOne) {
  // amax NaN (a NaN input) or 0 (gamma = 0, beta = 0): scale 1, as every current-scaling cast.
  Problem p(TE_NORM_LAYERNORM, TE_DTYPE_F32, {4, 32}, 53);
  p.x.set(7, NAN);
  HostTensor out = make_tensor(TE_DTYPE_E4M3, p.shape);
  te_norm_forward_args a = fwd_args();
  a.input = p.x.get();
  a.weight = p.gamma.get();
  a.bias = p.beta.get();
  a.output = out.get();
  const te_norm_options o = norm_opts(TE_NORM_LAYERNORM);
  ASSERT_TE_OK(te_norm_forward(ctx_, &o, &a));
  EXPECT_EQ(out.scale_inv[0], 1.0f);
  expect_fp8_of(run_forward(ctx_, p, TE_DTYPE_F32, o).y, &out, nullptr, 1.0f, 4, 32);
  Problem z(TE_NORM_LAYERNORM, TE_DTYPE_F32, {4, 32}, 54);
  for (int64_t j = 0; j < z.n; ++j) {
    z.gamma.set(j, 0.0f);
    z.beta.set(j, 0.0f);
  }
  a.input = z.x.get();
  a.weight = z.gamma.get();
  a.bias = z.beta.get();
  ASSERT_TE_OK(te_norm_forward(ctx_, &o, &a));
  EXPECT_EQ(out.scale_inv[0], 1.0f);
}

TEST_F(Norm, AmaxOfAHighPrecisionOutputIsMaxAccumulated) {
  for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM}) {
    Problem p(kind, TE_DTYPE_F16, {10, 70}, 59);
    const te_norm_options o = norm_opts(kind);
    Forward v = run_forward(ctx_, p, TE_DTYPE_F32, o);
    const float want = static_cast<float>(max_abs(v.y));
    for (float start : {0.0f, 0.5f * want, 2.0f * want}) {
      HostTensor y = make_tensor(TE_DTYPE_F16, p.shape);
      float amax = start;
      te_quantize_options q = qopts();
      q.amax = &amax;
      te_norm_forward_args a = fwd_args();
      a.input = p.x.get();
      a.weight = p.gamma.get();
      a.bias = p.beta_arg();
      a.output = y.get();
      a.quantize = &q;
      ASSERT_TE_OK(te_norm_forward(ctx_, &o, &a));
      EXPECT_EQ(amax, std::max(start, want));
      EXPECT_TRUE(bitwise_equal(y, run_forward(ctx_, p, TE_DTYPE_F16, o).y));
    }
  }
}

// ---- backward -------------------------------------------------------------------------------

struct Backward {
  HostTensor dx, dgamma, dbeta;
};
Backward run_backward(te_context *ctx, const Problem &p, const Forward &f, const te_norm_options &o) {
  Backward b;
  b.dx = make_tensor(p.dtype, p.shape);
  b.dgamma = make_tensor(p.dtype, {p.n});
  b.dbeta = make_tensor(p.dtype, {p.n});
  EXPECT_TE_OK(te_norm_backward(ctx, &o, p.dy.get(), p.x.get(), p.gamma.get(), p.layer() ? f.mu.get() : nullptr,
                                f.rsigma.get(), b.dx.get(), b.dgamma.get(), p.layer() ? b.dbeta.get() : nullptr));
  return b;
}

void check_backward(const Problem &p, const Backward &b, const te_norm_options &o) {
  const Ref r = p.ref(o.eps, o.zero_centered_gamma);
  const RefGrad g = ref_backward(p.kind, r, p.dy.values());
  EXPECT_TRUE(Near(b.dx.values(), g.dx, [&](size_t i) { return dx_tolerance(p.n, g.dx_scale[i], g.dx[i], p.dtype); },
                   "dx"));
  EXPECT_TRUE(Near(b.dgamma.values(), g.dgamma,
                   [&](size_t j) { return column_tolerance(p.rows, p.n, g.dgamma_scale[j], g.dgamma[j], p.dtype); },
                   "dgamma"));
  if (p.layer())
    EXPECT_TRUE(Near(b.dbeta.values(), g.dbeta,
                     [&](size_t j) { return column_tolerance(p.rows, p.n, g.dbeta_scale[j], g.dbeta[j], p.dtype); },
                     "dbeta"));
}

TEST_F(Norm, BackwardMatchesFp64Reference) {
  const std::vector<std::vector<int64_t>> shapes = {{6, 1}, {7, 100}, {4, 4096}, {2, 3, 100}, {300}};
  for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM})
    for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16})
      for (int zcg : {0, 1})
        for (const auto &shape : shapes) {
          SCOPED_TRACE(std::string(kind == TE_NORM_LAYERNORM ? "LayerNorm " : "RMSNorm ") + dtype_name(dt) + " hidden " +
                       std::to_string(shape.back()) + " zcg " + std::to_string(zcg));
          Problem p(kind, dt, shape, 61 + static_cast<uint32_t>(shape.size()));
          if (zcg) fill_uniform(p.gamma, -0.5f, 0.5f, 62);
          const te_norm_options o = norm_opts(kind, 1e-5f, zcg);
          Forward f = run_forward(ctx_, p, dt, o);
          check_backward(p, run_backward(ctx_, p, f, o), o);
        }
}

// Central differences of L = sum(dy * y) with respect to x, gamma and beta: of the library's own
// F32 forward (step 1e-2; the fp32 rounding of L, ~1e-6, over 2e-2 and the O(h^2) truncation both
// stay below 2e-3) and of the fp64 reference (step 1e-5: agreement to 1e-6 checks the reference
// formulas themselves).
TEST_F(Norm, BackwardMatchesFiniteDifferencesOfTheForward) {
  for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM})
    for (int zcg : {0, 1}) {
      SCOPED_TRACE(std::string(kind == TE_NORM_LAYERNORM ? "LayerNorm" : "RMSNorm") + " zcg " + std::to_string(zcg));
      Problem p(kind, TE_DTYPE_F32, {3, 8}, 67);
      const te_norm_options o = norm_opts(kind, 1e-3f, zcg);
      Backward b = run_backward(ctx_, p, run_forward(ctx_, p, TE_DTYPE_F32, o), o);
      std::vector<double> dy = p.dy.values();
      auto loss_lib = [&](const Problem &q) {
        Forward f = run_forward(ctx_, q, TE_DTYPE_F32, o);
        double l = 0;
        for (size_t i = 0; i < dy.size(); ++i) l += dy[i] * f.y.at(static_cast<int64_t>(i));
        return l;
      };
      auto loss_ref = [&](const std::vector<double> &x, const std::vector<double> &g, const std::vector<double> &be) {
        Ref r = ref_forward(kind, o.eps, zcg, x, p.rows, p.n, g, kind == TE_NORM_LAYERNORM ? &be : nullptr);
        double l = 0;
        for (size_t i = 0; i < dy.size(); ++i) l += dy[i] * r.y[i];
        return l;
      };
      // perturbs element i of one of the three tensors
      auto check = [&](HostTensor Problem::*which, const HostTensor &grad, const char *what) {
        for (int64_t i = 0; i < grad.numel(); ++i) {
          Problem hi = p, lo = p;
          const float v = static_cast<float>((p.*which).at(i));
          (hi.*which).set(i, v + 1e-2f);
          (lo.*which).set(i, v - 1e-2f);
          const double fd = (loss_lib(hi) - loss_lib(lo)) / (static_cast<double>(v + 1e-2f) - static_cast<double>(v - 1e-2f));
          EXPECT_NEAR(grad.at(i), fd, 2e-3 * (1 + std::fabs(fd))) << what << "[" << i << "] (library forward)";
          std::vector<double> x = p.x.values(), g = p.gamma.values(), be = p.beta.values();
          std::vector<double> *t = which == &Problem::x ? &x : which == &Problem::gamma ? &g : &be;
          std::vector<double> th = *t, tl = *t;
          th[i] += 1e-5;
          tl[i] -= 1e-5;
          std::vector<double> *sv = t;
          *sv = th;
          const double lh = loss_ref(x, g, be);
          *sv = tl;
          const double ll = loss_ref(x, g, be);
          EXPECT_NEAR(grad.at(i), (lh - ll) / 2e-5, 1e-5 * (1 + std::fabs(grad.at(i)))) << what << "[" << i << "] (fp64)";
        }
      };
      check(&Problem::x, b.dx, "dx");
      check(&Problem::gamma, b.dgamma, "dgamma");
      if (p.layer()) check(&Problem::beta, b.dbeta, "dbeta");
    }
}

TEST_F(Norm, BackwardTwiceIsBitIdenticalAndOutputsAreOptional) {
  for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM}) {
    Problem p(kind, TE_DTYPE_BF16, {33, 200}, 71);
    const te_norm_options o = norm_opts(kind);
    Forward f = run_forward(ctx_, p, TE_DTYPE_BF16, o);
    Backward b1 = run_backward(ctx_, p, f, o), b2 = run_backward(ctx_, p, f, o);
    EXPECT_TRUE(bitwise_equal(b1.dx, b2.dx));
    EXPECT_TRUE(bitwise_equal(b1.dgamma, b2.dgamma));
    EXPECT_TRUE(bitwise_equal(b1.dbeta, b2.dbeta));
    // Each output alone gives the same bits; none at all is a valid no-op.
    HostTensor dx = make_tensor(p.dtype, {p.rows, p.n}), dg = make_tensor(p.dtype, {p.n});
    const te_tensor *mu = p.layer() ? f.mu.get() : nullptr;
    ASSERT_TE_OK(te_norm_backward(ctx_, &o, p.dy.get(), p.x.get(), p.gamma.get(), mu, f.rsigma.get(), dx.get(), nullptr,
                                  nullptr));
    EXPECT_EQ(dx.bytes, b1.dx.bytes);
    ASSERT_TE_OK(te_norm_backward(ctx_, &o, p.dy.get(), p.x.get(), p.gamma.get(), mu, f.rsigma.get(), nullptr, dg.get(),
                                  nullptr));
    EXPECT_TRUE(bitwise_equal(dg, b1.dgamma));
    if (p.layer()) {
      HostTensor db = make_tensor(p.dtype, {p.n});
      ASSERT_TE_OK(te_norm_backward(ctx_, &o, p.dy.get(), p.x.get(), p.gamma.get(), mu, f.rsigma.get(), nullptr, nullptr,
                                    db.get()));
      EXPECT_TRUE(bitwise_equal(db, b1.dbeta));
    }
    ASSERT_TE_OK(te_norm_backward(ctx_, &o, p.dy.get(), p.x.get(), p.gamma.get(), mu, f.rsigma.get(), nullptr, nullptr,
                                  nullptr));
    // NULL options are the defaults (LayerNorm).
    if (p.layer()) {
      HostTensor dx2 = make_tensor(p.dtype, p.shape);
      ASSERT_TE_OK(te_norm_backward(ctx_, nullptr, p.dy.get(), p.x.get(), p.gamma.get(), mu, f.rsigma.get(), dx2.get(),
                                    nullptr, nullptr));
      EXPECT_EQ(dx2.bytes, b1.dx.bytes);
    }
  }
}

TEST_F(Norm, BackwardOfZeroCenteredGammaIsThatOfOnePlusGamma) {
  for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM}) {
    Problem p(kind, TE_DTYPE_F32, {5, 64}, 73);
    fill_uniform(p.gamma, -0.5f, 0.5f, 74);
    Problem q = p;
    for (int64_t j = 0; j < p.n; ++j) q.gamma.set(j, 1.0f + static_cast<float>(p.gamma.at(j)));
    const te_norm_options z = norm_opts(kind, 1e-5f, 1), plain = norm_opts(kind);
    Backward bz = run_backward(ctx_, p, run_forward(ctx_, p, TE_DTYPE_F32, z), z);
    Backward b1 = run_backward(ctx_, q, run_forward(ctx_, q, TE_DTYPE_F32, plain), plain);
    EXPECT_TRUE(bitwise_equal(bz.dx, b1.dx));
    EXPECT_TRUE(bitwise_equal(bz.dgamma, b1.dgamma));
    if (p.layer()) EXPECT_TRUE(bitwise_equal(bz.dbeta, b1.dbeta));
  }
}

// ---- bad input ------------------------------------------------------------------------------

// A valid forward (LayerNorm or RMSNorm, F32 -> FP8 out and out_t with a given scale, mu,
// rsigma, amax) whose pieces the cases below break one at a time.
struct ForwardCall {
  te_norm_kind kind;
  Problem p;
  HostTensor out, out_t, mu, rsigma;
  float scale = 4.0f, amax = 0.125f;
  te_norm_options o;
  te_quantize_options q;
  te_norm_forward_args a;
  explicit ForwardCall(te_norm_kind k)
      : kind(k), p(k, TE_DTYPE_F32, {2, 3, 16}, 79), out(make_tensor(TE_DTYPE_E4M3, {2, 3, 16})),
        out_t(make_tensor(TE_DTYPE_E4M3, {16, 6})), mu(make_tensor(TE_DTYPE_F32, {6})),
        rsigma(make_tensor(TE_DTYPE_F32, {6})) {
    o = norm_opts(k);
    q = qopts();
    q.scale = &scale;
    q.amax = &amax;
    a = fwd_args();
    a.input = p.x.get();
    a.weight = p.gamma.get();
    a.bias = p.beta_arg();
    a.output = out.get();
    a.output_t = out_t.get();
    a.mu = k == TE_NORM_LAYERNORM ? mu.get() : nullptr;
    a.rsigma = rsigma.get();
    a.quantize = &q;
  }
  ForwardCall(const ForwardCall &) = delete;
};

// The call fails with INVALID_ARGUMENT, te_last_error() is "<fn>: argument '<...arg...>': ..."
// and nothing in `outputs` (nor *amax) changed.
#define EXPECT_NORM_FAIL(fn, arg, call, outputs, amax_ptr)                                    \
  do {                                                                                        \
    std::vector<HostTensor> before_;                                                          \
    for (const HostTensor *t_ : outputs) before_.push_back(*t_);                              \
    const float amax_before_ = *(amax_ptr);                                                   \
    ::te_test::prime_last_error(fn);                                                          \
    EXPECT_TRUE(::te_test::IsError((call), TE_ERROR_INVALID_ARGUMENT, fn, arg)) << #call;     \
    for (size_t i_ = 0; i_ < before_.size(); ++i_)                                            \
      EXPECT_TRUE(same_contents(*(outputs)[i_], before_[i_])) << "output " << i_ << " written"; \
    EXPECT_EQ(float_to_bits(*(amax_ptr)), float_to_bits(amax_before_)) << "amax written";    \
  } while (0)

TEST_F(Norm, InitFunctionsRejectNull) {
  EXPECT_TRUE(IsError(te_norm_options_init(nullptr), TE_ERROR_INVALID_ARGUMENT, "te_norm_options_init", "opts"));
  EXPECT_TRUE(IsError(te_norm_forward_args_init(nullptr), TE_ERROR_INVALID_ARGUMENT, "te_norm_forward_args_init", "args"));
}

TEST_F(Norm, ForwardRejectsEachBadArgument) {
  const char *fn = "te_norm_forward";
  struct Case {
    const char *name;
    const char *arg;
    te_norm_kind kind;
    std::function<void(ForwardCall &, te_context *&, const te_norm_options *&)> mutate;
  };
  te_context *dead = nullptr;
  {
    ContextPtr c = make_cpu_context();
    dead = c.get();
  }
  const auto LN = TE_NORM_LAYERNORM, RMS = TE_NORM_RMSNORM;
  using F = ForwardCall;
  using Ctx = te_context *&;
  using Opt = const te_norm_options *&;
  static HostTensor keep[8];  // tensors the cases swap in (alive past the lambda)
  const std::vector<Case> cases = {
      {"ctx NULL", "ctx", LN, [](F &, Ctx c, Opt) { c = nullptr; }},
      {"ctx destroyed", "ctx", LN, [dead](F &, Ctx c, Opt) { c = dead; }},
      {"opts struct_size 0", "opts", LN, [](F &f, Ctx, Opt) { f.o.struct_size = 0; }},
      {"opts struct_size short", "opts", LN, [](F &f, Ctx, Opt) { f.o.struct_size = sizeof(te_norm_options) - 1; }},
      {"opts kind -1", "opts->kind", LN, [](F &f, Ctx, Opt) { std::memset(&f.o.kind, 0xFF, sizeof f.o.kind); }},
      {"opts kind 2", "opts->kind", LN, [](F &f, Ctx, Opt) { f.o.kind = static_cast<te_norm_kind>(2); }},
      {"eps 0", "opts->eps", LN, [](F &f, Ctx, Opt) { f.o.eps = 0.0f; }},
      {"eps -0", "opts->eps", LN, [](F &f, Ctx, Opt) { f.o.eps = -0.0f; }},
      {"eps negative", "opts->eps", RMS, [](F &f, Ctx, Opt) { f.o.eps = -1e-5f; }},
      {"eps NaN", "opts->eps", LN, [](F &f, Ctx, Opt) { f.o.eps = std::nanf(""); }},
      {"eps inf", "opts->eps", RMS, [](F &f, Ctx, Opt) { f.o.eps = INFINITY; }},
      {"zero_centered_gamma 2", "opts->zero_centered_gamma", LN, [](F &f, Ctx, Opt) { f.o.zero_centered_gamma = 2; }},
      {"args struct_size short", "args", LN, [](F &f, Ctx, Opt) { f.a.struct_size = sizeof(te_norm_forward_args) - 1; }},
      {"input NULL", "args->input", LN, [](F &f, Ctx, Opt) { f.a.input = nullptr; }},
      {"input data NULL", "args->input", LN, [](F &f, Ctx, Opt) { f.p.x.t.data = nullptr; }},
      {"input FP8", "args->input", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_E4M3, {2, 3, 16});
         f.a.input = keep[0].get();
       }},
      {"input ndim 0", "args->input", RMS, [](F &f, Ctx, Opt) { f.p.x.t.ndim = 0; }},
      {"input on CUDA", "args->input", LN, [](F &f, Ctx, Opt) { f.p.x.t.device.type = TE_DEVICE_CUDA; }},
      {"weight NULL", "args->weight", LN, [](F &f, Ctx, Opt) { f.a.weight = nullptr; }},
      {"weight dtype", "args->weight", RMS, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_BF16, {16});
         f.a.weight = keep[0].get();
       }},
      {"weight shape", "args->weight", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_F32, {17});
         f.a.weight = keep[0].get();
       }},
      {"weight 2-D", "args->weight", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_F32, {1, 16});
         f.a.weight = keep[0].get();
       }},
      {"LayerNorm without beta", "args->bias", LN, [](F &f, Ctx, Opt) { f.a.bias = nullptr; }},
      {"RMSNorm with beta", "args->bias", RMS, [](F &f, Ctx, Opt) { f.a.bias = f.p.beta.get(); }},
      {"bias dtype", "args->bias", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_F16, {16});
         f.a.bias = keep[0].get();
       }},
      {"bias shape", "args->bias", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_F32, {8});
         f.a.bias = keep[0].get();
       }},
      {"no output at all", "args->output", LN, [](F &f, Ctx, Opt) {
         f.a.output = nullptr;
         f.a.output_t = nullptr;
       }},
      {"output shape", "args->output", LN, [](F &f, Ctx, Opt) { f.out.reshape({3, 2, 16}); }},
      {"output hidden", "args->output", RMS, [](F &f, Ctx, Opt) { f.out.t.shape[2] = 8; }},
      {"output 1x128 blocks", "args->output", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_E4M3, {2, 3, 16}, TE_SCALING_BLOCK_1X128);
         f.a.output = keep[0].get();
       }},
      {"output 128x128 blocks", "args->output", RMS, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_E4M3, {2, 3, 16}, TE_SCALING_BLOCK_128X128);
         f.a.output = keep[0].get();
       }},
      {"output FP8 without scale_inv", "args->output", LN, [](F &f, Ctx, Opt) { f.out.t.scale_inv = nullptr; }},
      {"output_t high precision", "args->output_t", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_F32, {16, 6});
         f.a.output_t = keep[0].get();
       }},
      {"output_t not transposed", "args->output_t", LN, [](F &f, Ctx, Opt) { f.out_t.reshape({6, 16}); }},
      {"output_t 3-D", "args->output_t", RMS, [](F &f, Ctx, Opt) { f.out_t.reshape({16, 2, 3}); }},
      {"output_t 1x128 blocks", "args->output_t", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_E4M3, {16, 6}, TE_SCALING_BLOCK_1X128);
         f.a.output_t = keep[0].get();
       }},
      {"FP8 outputs of two dtypes", "args->output_t", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_E5M2, {16, 6});
         f.a.output_t = keep[0].get();
       }},
      {"RMSNorm with mu", "args->mu", RMS, [](F &f, Ctx, Opt) { f.a.mu = f.mu.get(); }},
      {"mu dtype", "args->mu", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_BF16, {6});
         f.a.mu = keep[0].get();
       }},
      {"mu shape", "args->mu", LN, [](F &f, Ctx, Opt) { f.mu.reshape({3, 2}); }},
      {"rsigma dtype", "args->rsigma", RMS, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_F16, {6});
         f.a.rsigma = keep[0].get();
       }},
      {"rsigma shape", "args->rsigma", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_F32, {5});
         f.a.rsigma = keep[0].get();
       }},
      {"rsigma device", "args->rsigma", LN, [](F &f, Ctx, Opt) { f.rsigma.t.device.index = 1; }},
      {"quantize struct_size", "args->quantize", LN, [](F &f, Ctx, Opt) { f.q.struct_size = 0; }},
      {"amax_epsilon negative", "args->quantize->amax_epsilon", LN, [](F &f, Ctx, Opt) { f.q.amax_epsilon = -1; }},
      {"amax_epsilon inf", "args->quantize->amax_epsilon", LN, [](F &f, Ctx, Opt) { f.q.amax_epsilon = INFINITY; }},
      {"amax_epsilon NaN", "args->quantize->amax_epsilon", RMS,
       [](F &f, Ctx, Opt) { f.q.amax_epsilon = std::nanf(""); }},
      {"power_of_2_scales 2", "args->quantize->power_of_2_scales", LN,
       [](F &f, Ctx, Opt) { f.q.power_of_2_scales = 2; }},
      {"scale with a high-precision output only", "args->quantize->scale", LN, [](F &f, Ctx, Opt) {
         keep[0] = make_tensor(TE_DTYPE_F32, {2, 3, 16});
         f.a.output = keep[0].get();
         f.a.output_t = nullptr;
       }},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    ForwardCall f(c.kind);
    te_context *ctx = ctx_;
    const te_norm_options *opts = &f.o;
    c.mutate(f, ctx, opts);
    const std::vector<const HostTensor *> outs = {&f.out, &f.out_t, &f.mu, &f.rsigma, &keep[0]};
    EXPECT_NORM_FAIL(fn, c.arg, te_norm_forward(ctx, opts, &f.a), outs, &f.amax);
  }
  // NULL args.
  ForwardCall f(TE_NORM_LAYERNORM);
  const std::vector<const HostTensor *> outs = {&f.out, &f.out_t, &f.mu, &f.rsigma};
  EXPECT_NORM_FAIL(fn, "args", te_norm_forward(ctx_, &f.o, nullptr), outs, &f.amax);
  // The unbroken call succeeds (the cases above break exactly one thing).
  for (te_norm_kind k : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM}) {
    ForwardCall ok(k);
    EXPECT_TE_OK(te_norm_forward(ctx_, &ok.o, &ok.a));
  }
}

// A valid backward whose arguments the cases break one at a time.
struct BackwardCall {
  te_norm_kind kind;
  Problem p;
  HostTensor mu, rsigma, dx, dgamma, dbeta;
  te_norm_options o;
  const te_tensor *a_dy, *a_x, *a_gamma, *a_mu, *a_rsigma;
  te_tensor *a_dx, *a_dgamma, *a_dbeta;
  explicit BackwardCall(te_norm_kind k)
      : kind(k), p(k, TE_DTYPE_BF16, {4, 24}, 83), mu(random_tensor(TE_DTYPE_F32, {4}, -0.1f, 0.1f, 84)),
        rsigma(random_tensor(TE_DTYPE_F32, {4}, 0.5f, 1.5f, 85)), dx(make_tensor(TE_DTYPE_BF16, {4, 24})),
        dgamma(make_tensor(TE_DTYPE_BF16, {24})), dbeta(make_tensor(TE_DTYPE_BF16, {24})) {
    o = norm_opts(k);
    a_dy = p.dy.get();
    a_x = p.x.get();
    a_gamma = p.gamma.get();
    a_mu = k == TE_NORM_LAYERNORM ? mu.get() : nullptr;
    a_rsigma = rsigma.get();
    a_dx = dx.get();
    a_dgamma = dgamma.get();
    a_dbeta = k == TE_NORM_LAYERNORM ? dbeta.get() : nullptr;
  }
  te_status call(te_context *ctx, const te_norm_options *opts) {
    return te_norm_backward(ctx, opts, a_dy, a_x, a_gamma, a_mu, a_rsigma, a_dx, a_dgamma, a_dbeta);
  }
  BackwardCall(const BackwardCall &) = delete;
};

TEST_F(Norm, BackwardRejectsEachBadArgument) {
  const char *fn = "te_norm_backward";
  using B = BackwardCall;
  using Ctx = te_context *&;
  struct Case {
    const char *name;
    const char *arg;
    te_norm_kind kind;
    std::function<void(B &, Ctx)> mutate;
  };
  const auto LN = TE_NORM_LAYERNORM, RMS = TE_NORM_RMSNORM;
  static HostTensor keep;
  te_recipe *not_a_context = nullptr;
  ASSERT_TE_OK(te_recipe_create(&not_a_context, nullptr));
  RecipePtr recipe_owner(not_a_context);
  const std::vector<Case> cases = {
      {"ctx NULL", "ctx", LN, [](B &, Ctx c) { c = nullptr; }},
      {"ctx of another type", "ctx", LN, [not_a_context](B &, Ctx c) { c = reinterpret_cast<te_context *>(not_a_context); }},
      {"opts struct_size", "opts", LN, [](B &b, Ctx) { b.o.struct_size = 1; }},
      {"opts kind 7", "opts->kind", RMS, [](B &b, Ctx) { b.o.kind = static_cast<te_norm_kind>(7); }},
      {"eps 0", "opts->eps", LN, [](B &b, Ctx) { b.o.eps = 0; }},
      {"eps NaN", "opts->eps", RMS, [](B &b, Ctx) { b.o.eps = std::nanf(""); }},
      {"zero_centered_gamma -1", "opts->zero_centered_gamma", LN, [](B &b, Ctx) { b.o.zero_centered_gamma = -1; }},
      {"dy NULL", "dy", LN, [](B &b, Ctx) { b.a_dy = nullptr; }},
      {"dy dtype", "dy", LN, [](B &b, Ctx) {
         keep = make_tensor(TE_DTYPE_F32, {4, 24});
         b.a_dy = keep.get();
       }},
      {"dy shape", "dy", RMS, [](B &b, Ctx) { b.p.dy.reshape({2, 48}); }},
      {"dy malformed", "dy", LN, [](B &b, Ctx) { b.p.dy.t.shape[0] = -4; }},
      {"x NULL", "x", LN, [](B &b, Ctx) { b.a_x = nullptr; }},
      {"x FP8", "x", RMS, [](B &b, Ctx) {
         keep = make_tensor(TE_DTYPE_E5M2, {4, 24});
         b.a_x = keep.get();
       }},
      {"gamma NULL", "gamma", LN, [](B &b, Ctx) { b.a_gamma = nullptr; }},
      {"gamma dtype", "gamma", LN, [](B &b, Ctx) {
         keep = make_tensor(TE_DTYPE_F16, {24});
         b.a_gamma = keep.get();
       }},
      {"gamma shape", "gamma", RMS, [](B &b, Ctx) {
         keep = make_tensor(TE_DTYPE_BF16, {25});
         b.a_gamma = keep.get();
       }},
      {"LayerNorm without mu", "mu", LN, [](B &b, Ctx) { b.a_mu = nullptr; }},
      {"RMSNorm with mu", "mu", RMS, [](B &b, Ctx) { b.a_mu = b.mu.get(); }},
      {"mu dtype", "mu", LN, [](B &b, Ctx) {
         keep = make_tensor(TE_DTYPE_BF16, {4});
         b.a_mu = keep.get();
       }},
      {"mu shape", "mu", LN, [](B &b, Ctx) {
         keep = make_tensor(TE_DTYPE_F32, {24});
         b.a_mu = keep.get();
       }},
      {"rsigma NULL", "rsigma", LN, [](B &b, Ctx) { b.a_rsigma = nullptr; }},
      {"rsigma NULL (RMSNorm)", "rsigma", RMS, [](B &b, Ctx) { b.a_rsigma = nullptr; }},
      {"rsigma dtype", "rsigma", RMS, [](B &b, Ctx) {
         keep = make_tensor(TE_DTYPE_BF16, {4});
         b.a_rsigma = keep.get();
       }},
      {"rsigma shape", "rsigma", LN, [](B &b, Ctx) { b.rsigma.reshape({2, 2}); }},
      {"dx dtype", "dx", LN, [](B &b, Ctx) {
         keep = make_tensor(TE_DTYPE_F32, {4, 24});
         b.a_dx = keep.get();
       }},
      {"dx shape", "dx", RMS, [](B &b, Ctx) { b.dx.reshape({24, 4}); }},
      {"dx malformed", "dx", LN, [](B &b, Ctx) { b.dx.t.data = nullptr; }},
      {"dgamma dtype", "dgamma", LN, [](B &b, Ctx) {
         keep = make_tensor(TE_DTYPE_F32, {24});
         b.a_dgamma = keep.get();
       }},
      {"dgamma shape", "dgamma", RMS, [](B &b, Ctx) { b.dgamma.reshape({2, 12}); }},
      {"RMSNorm with dbeta", "dbeta", RMS, [](B &b, Ctx) { b.a_dbeta = b.dbeta.get(); }},
      {"dbeta shape", "dbeta", LN, [](B &b, Ctx) {
         keep = make_tensor(TE_DTYPE_BF16, {23});
         b.a_dbeta = keep.get();
       }},
      {"dbeta device", "dbeta", LN, [](B &b, Ctx) { b.dbeta.t.device.type = TE_DEVICE_CUDA; }},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    BackwardCall b(c.kind);
    te_context *ctx = ctx_;
    c.mutate(b, ctx);
    const std::vector<const HostTensor *> outs = {&b.dx, &b.dgamma, &b.dbeta, &keep};
    float no_amax = 0;
    EXPECT_NORM_FAIL(fn, c.arg, b.call(ctx, &b.o), outs, &no_amax);
  }
  for (te_norm_kind k : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM}) {
    BackwardCall ok(k);
    EXPECT_TE_OK(ok.call(ctx_, &ok.o));
  }
}

}  // namespace

namespace {

// An int32 output is not a float: refused, not written (found by the API fuzzer: an I32 output
// of fewer bytes than F32 rows was overflowed).
TEST(NormForwardInt32Output, Refused) {
  ContextPtr ctx = make_cpu_context();
  HostTensor x = random_tensor(TE_DTYPE_F32, {4, 8}, -1, 1, 1);
  HostTensor g = random_tensor(TE_DTYPE_F32, {8}, -1, 1, 2);
  HostTensor y = make_tensor(TE_DTYPE_I32, {4, 8});
  const HostTensor before = y;
  te_norm_options o;
  ASSERT_TE_OK(te_norm_options_init(&o));
  o.kind = TE_NORM_RMSNORM;
  te_norm_forward_args a;
  ASSERT_TE_OK(te_norm_forward_args_init(&a));
  a.input = x.get();
  a.weight = g.get();
  a.output = y.get();
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_norm_forward", "output", te_norm_forward(ctx.get(), &o, &a));
  EXPECT_EQ(y.bytes, before.bytes);
}

}  // namespace
