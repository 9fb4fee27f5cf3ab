// te_layernorm_mlp_*, tested as a hostile reviewer would: public API only. The same plan as
// test_layernorm_linear.cpp (numerics in every mode against fp64, ln_out, gradient subsets,
// lifecycle, bookkeeping, state, bad input), for y = fc2(act(fc1(norm(x)))) with every
// activation (ReLU, GELU, SwiGLU, GEGLU, SReLU).
#include "layernorm_modules_test_util.h"

namespace lt = te_test;
using lt::Bounded;
using lt::HostTensor;
using lt::Mode;
using lt::Vec;

namespace {

// 3-D inputs [kB, kS, hidden]; hidden = 160 (a partial 1x128 block and 128x128 tile), ffn = 96
// (fc1 gives 192 columns under the gated activations); every dimension a multiple of 16.
constexpr int64_t kB = 2, kS = 16, kTokens = kB * kS, kHidden = 160, kFfn = 96;

bool gated(te_activation a) { return a == TE_ACTIVATION_SWIGLU || a == TE_ACTIVATION_GEGLU; }
const char *act_name(te_activation a) {
  switch (a) {
    case TE_ACTIVATION_RELU: return "ReLU";
    case TE_ACTIVATION_GELU: return "GELU";
    case TE_ACTIVATION_SWIGLU: return "SwiGLU";
    case TE_ACTIVATION_GEGLU: return "GEGLU";
    case TE_ACTIVATION_SRELU: return "SReLU";
  }
  return "?";
}
const te_activation kAllActivations[] = {TE_ACTIVATION_RELU, TE_ACTIVATION_GELU, TE_ACTIVATION_SWIGLU,
                                         TE_ACTIVATION_GEGLU, TE_ACTIVATION_SRELU};

te_layernorm_mlp_options options(int64_t hidden, int64_t ffn, te_activation act, te_dtype dt, te_norm_kind kind,
                                 int zc, int bias, int fuse = 0) {
  te_layernorm_mlp_options o;
  EXPECT_TE_OK(te_layernorm_mlp_options_init(&o));
  o.hidden_size = hidden;
  o.ffn_hidden_size = ffn;
  o.activation = act;
  o.activation_dtype = dt;
  o.normalization = kind;
  o.zero_centered_gamma = zc;
  o.bias = bias;
  o.fuse_wgrad_accumulation = fuse;
  return o;
}

// The caller's tensors of one module call.
struct Data {
  te_dtype dt;
  te_activation act;
  bool layer, zc, bias;
  int64_t hidden, ffn, fc1_out;
  HostTensor x, gamma, beta, w1, b1, w2, b2, dy;
  Data(te_dtype d, te_activation a, te_norm_kind kind, bool zero_centered, bool with_bias, uint32_t seed,
       int64_t h = kHidden, int64_t f = kFfn, std::vector<int64_t> lead = {kB, kS})
      : dt(d), act(a), layer(kind == TE_NORM_LAYERNORM), zc(zero_centered), bias(with_bias), hidden(h), ffn(f),
        fc1_out(gated(a) ? 2 * f : f) {
    std::vector<int64_t> xs = lead;
    xs.push_back(h);
    x = lt::random_tensor(d, xs, -2.0f, 3.0f, seed + 1);
    gamma = zc ? lt::random_tensor(d, {h}, -0.5f, 0.5f, seed + 2) : lt::random_tensor(d, {h}, 0.5f, 1.5f, seed + 2);
    beta = lt::random_tensor(d, {h}, -0.5f, 0.5f, seed + 3);
    w1 = lt::random_tensor(d, {fc1_out, h}, -0.15f, 0.15f, seed + 4);
    b1 = lt::random_tensor(d, {fc1_out}, -0.5f, 0.5f, seed + 5);
    w2 = lt::random_tensor(d, {h, f}, -0.2f, 0.2f, seed + 6);
    b2 = lt::random_tensor(d, {h}, -0.5f, 0.5f, seed + 7);
    dy = lt::random_tensor(d, xs, -1.0f, 1.0f, seed + 8);
  }
  te_layernorm_mlp_forward_args args(te_tensor *ln_out = nullptr, int weight_unchanged = 0) {
    te_layernorm_mlp_forward_args a;
    EXPECT_TE_OK(te_layernorm_mlp_forward_args_init(&a));
    a.input = x.get();
    a.ln_weight = gamma.get();
    a.ln_bias = layer ? beta.get() : nullptr;
    a.fc1_weight = w1.get();
    a.fc1_bias = bias ? b1.get() : nullptr;
    a.fc2_weight = w2.get();
    a.fc2_bias = bias ? b2.get() : nullptr;
    a.weight_unchanged = weight_unchanged;
    a.ln_out = ln_out;
    return a;
  }
  int64_t tokens() const { return x.rows(); }
  HostTensor x_like() const { return lt::make_tensor(dt, std::vector<int64_t>(x.t.shape, x.t.shape + x.t.ndim)); }
};

struct Grads {
  HostTensor dx, dgamma, dbeta, dw1, db1, dw2, db2;
  Grads(const Data &d, te_dtype dw_dtype)
      : dx(d.x_like()),
        dgamma(lt::make_tensor(d.dt, {d.hidden})),
        dbeta(lt::make_tensor(d.dt, {d.hidden})),
        dw1(lt::make_tensor(dw_dtype, {d.fc1_out, d.hidden})),
        db1(lt::make_tensor(d.dt, {d.fc1_out})),
        dw2(lt::make_tensor(dw_dtype, {d.hidden, d.ffn})),
        db2(lt::make_tensor(d.dt, {d.hidden})) {}
  explicit Grads(const Data &d) : Grads(d, d.dt) {}
  te_layernorm_mlp_grads all(const Data &d) {
    te_layernorm_mlp_grads g;
    EXPECT_TE_OK(te_layernorm_mlp_grads_init(&g));
    g.dx = dx.get();
    g.dln_weight = dgamma.get();
    g.dln_bias = d.layer ? dbeta.get() : nullptr;
    g.dfc1_weight = dw1.get();
    g.dfc1_bias = d.bias ? db1.get() : nullptr;
    g.dfc2_weight = dw2.get();
    g.dfc2_bias = d.bias ? db2.get() : nullptr;
    return g;
  }
  std::vector<const HostTensor *> list() const { return {&dx, &dgamma, &dbeta, &dw1, &db1, &dw2, &db2}; }
};

bool same(const HostTensor &a, const HostTensor &b) { return lt::bitwise_equal(a, b); }
bool same_grads(const Grads &a, const Grads &b) {
  const auto la = a.list(), lb = b.list();
  for (size_t i = 0; i < la.size(); ++i)
    if (!same(*la[i], *lb[i])) return false;
  return true;
}

te_layernorm_mlp_residuals new_residuals() {
  te_layernorm_mlp_residuals r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  return r;
}

// ---- the activations in fp64, with their error propagation --------------------------------------

// f, f' and sup |f'|, sup |f''| (over the reals; computed numerically: GELU (tanh form) 1.129 and
// 0.798, SiLU 1.0998 and 0.5). ReLU's f' jumps at 0 (handled apart); SReLU's f' = 2 max(x, 0) is
// 2-Lipschitz.
double act_f(te_activation a, double x) {
  switch (a) {
    case TE_ACTIVATION_RELU: return x > 0 ? x : 0;
    case TE_ACTIVATION_GELU: case TE_ACTIVATION_GEGLU: return lt::ref_gelu(x);
    case TE_ACTIVATION_SWIGLU: return lt::ref_silu(x);
    case TE_ACTIVATION_SRELU: return x > 0 ? x * x : 0;
  }
  return 0;
}
double act_df(te_activation a, double x) {
  switch (a) {
    case TE_ACTIVATION_RELU: return x > 0 ? 1 : 0;
    case TE_ACTIVATION_GELU: case TE_ACTIVATION_GEGLU: {
      const double k = 0.7978845608028654, t = std::tanh(k * (x + 0.044715 * x * x * x));
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
    }
    case TE_ACTIVATION_SWIGLU: {
      const double s = 1 / (1 + std::exp(-x));
      return s * (1 + x * (1 - s));
    }
    case TE_ACTIVATION_SRELU: return x > 0 ? 2 * x : 0;
  }
  return 0;
}
// sup |f'| over [x - e, x + e] (the forward's sensitivity near x, by the mean value theorem):
// ReLU 1 or 0, SReLU 2 max(x + e, 0), the smooth ones |f'(x)| + e sup|f''| (capped by sup|f'|).
double act_l1(te_activation a, double x, double e) {
  switch (a) {
    case TE_ACTIVATION_RELU: return x + e > 0 ? 1 : 0;
    case TE_ACTIVATION_GELU: case TE_ACTIVATION_GEGLU: return std::min(1.13, std::fabs(act_df(a, x)) + 0.8 * e);
    case TE_ACTIVATION_SWIGLU: return std::min(1.1, std::fabs(act_df(a, x)) + 0.5 * e);
    case TE_ACTIVATION_SRELU: return 2 * std::max(x + e, 0.0);
  }
  return 0;
}
// sup |f''| (ReLU: none, its f' jumps).
double act_l2(te_activation a) {
  switch (a) {
    case TE_ACTIVATION_GELU: case TE_ACTIVATION_GEGLU: return 0.8;
    case TE_ACTIVATION_SWIGLU: return 0.5;
    case TE_ACTIVATION_SRELU: return 2;
    default: return 0;
  }
}
// The variance of f(x + d) - f(x) for d of variance s2: f'(x)^2 s2 to first order, plus the
// second-order term (sup|f''|)^2 s2^2; ReLU: f' may be either 0 or 1 within 3 sigma of 0.
double act_var(te_activation a, double x, double s2) {
  if (a == TE_ACTIVATION_RELU) return std::fabs(x) <= 3 * std::sqrt(s2) ? s2 : (x > 0 ? s2 : 0.0);
  const double d = act_df(a, x), l2 = act_l2(a);
  return d * d * s2 + l2 * l2 * s2 * s2;
}
// The fp32 evaluation of f and f' (tanh/exp within a few ulps, a dozen roundings): 32 u32
// relative to the magnitudes involved.
constexpr double kActEval = 32 * lt::kU32;

// act(h) for h [rows, fc1_out] -> [rows, ffn]: |f(h') - f(h)| <= L1 e_h; gated: f(a) b with
// |d(f(a) b)| <= |f(a)| e_b + L1 e_a (|b| + e_b); variances alike (act_var).
Bounded act_forward_bounded(te_activation act, const Bounded &h, int64_t ffn) {
  const bool g = gated(act);
  Bounded r = Bounded::exact(Vec(static_cast<size_t>(h.rows * ffn)), h.rows, ffn);
  for (int64_t i = 0; i < h.rows; ++i)
    for (int64_t j = 0; j < ffn; ++j) {
      const size_t ka = h.at(i, j), kb = h.at(i, g ? ffn + j : j), k = r.at(i, j);
      const double a = h.v[ka], ea = h.e[ka], sa = h.s2[ka];
      const double fa = act_f(act, a), l1 = act_l1(act, a, ea), va = act_var(act, a, sa);
      // fp32 evaluation: f(a) = a (0.5 + 0.5 tanh(.)) and a sigma(a) cancel for negative a, so
      // the slack is relative to |a|, not to the (small) result.
      if (!g) {
        r.v[k] = fa;
        const double ev = kActEval * (std::fabs(fa) + std::fabs(a));
        r.e[k] = l1 * ea + ev;
        r.s2[k] = va + ev * ev / 3;
      } else {
        const double b = h.v[kb], eb = h.e[kb], sb = h.s2[kb];
        r.v[k] = fa * b;
        const double ev = kActEval * (std::fabs(fa) + std::fabs(a)) * std::fabs(b);
        r.e[k] = std::fabs(fa) * eb + l1 * ea * (std::fabs(b) + eb) + ev;
        r.s2[k] = fa * fa * sb + va * (b * b + sb) + ev * ev / 3;
      }
    }
  return r;
}

// d fc1_out = f'(h) d_act (gated: [d_act b f'(a) | d_act f(a)]). The library's h' is within
// e_h of h: |f'(h') - f'(h)| <= sup|f''| e_h for smooth f; ReLU's f' can flip (by 1) only where
// |h| <= e_h (worst case), or within 3 sigma of 0 (the probabilistic model).
Bounded act_backward_bounded(te_activation act, const Bounded &h, const Bounded &dact) {
  const bool g = gated(act);
  const int64_t ffn = dact.cols;
  Bounded r = Bounded::exact(Vec(h.v.size()), h.rows, h.cols);
  auto dfprime = [&](double x, double e, double s2, double *worst, double *var) {
    if (act == TE_ACTIVATION_RELU) {
      *worst = std::fabs(x) <= e ? 1.0 : 0.0;
      *var = std::fabs(x) <= 3 * std::sqrt(s2) ? 1.0 / 3 : 0.0;
    } else {
      *worst = act_l2(act) * e;
      *var = act_l2(act) * act_l2(act) * s2;
    }
  };
  for (int64_t i = 0; i < h.rows; ++i)
    for (int64_t j = 0; j < ffn; ++j) {
      const size_t kd = dact.at(i, j), ka = h.at(i, j);
      const double dv = dact.v[kd], de = dact.e[kd], ds = dact.s2[kd];
      const double a = h.v[ka], ea = h.e[ka], sa = h.s2[ka];
      double wf, vf;
      dfprime(a, ea, sa, &wf, &vf);
      const double fp = act_df(act, a);
      const double mag_fp = std::fabs(fp) + wf;
      // f' in fp32: its terms are up to 1 + |a| + 0.11 |a|^3 (GELU's tanh form), cancelling.
      const double dterms = 1 + std::fabs(a) + 0.11 * std::fabs(a) * a * a;
      if (!g) {
        r.v[ka] = fp * dv;
        const double ev = kActEval * dterms * std::fabs(dv) + kActEval * (std::fabs(dv) + de) * wf;
        r.e[ka] = std::fabs(fp) * de + wf * (std::fabs(dv) + de) + ev;
        r.s2[ka] = fp * fp * ds + vf * (dv * dv + ds) + ev * ev / 3;
      } else {
        const size_t kb = h.at(i, ffn + j);
        const double b = h.v[kb], eb = h.e[kb], sb = h.s2[kb];
        const double fa = act_f(act, a), l1 = act_l1(act, a, ea), va = act_var(act, a, sa);
        // d gate = d_act * b * f'(a)
        r.v[ka] = dv * b * fp;
        const double ev1 = kActEval * dterms * std::fabs(dv * b);
        r.e[ka] = (std::fabs(dv) + de) * (std::fabs(b) + eb) * mag_fp - std::fabs(dv * b * fp) + ev1;
        r.s2[ka] = (b * b + sb) * (fp * fp + vf) * ds + dv * dv * (fp * fp + vf) * sb + dv * dv * b * b * vf +
                   ev1 * ev1 / 3;
        // d linear = d_act * f(a)
        r.v[kb] = dv * fa;
        const double ev2 = kActEval * (std::fabs(fa) + std::fabs(a)) * std::fabs(dv);
        r.e[kb] = (std::fabs(dv) + de) * (std::fabs(fa) + l1 * ea) - std::fabs(dv * fa) + ev2;
        r.s2[kb] = (fa * fa + va) * ds + dv * dv * va + ev2 * ev2 / 3;
      }
    }
  return r;
}

// fc1's output of every token, [rows, fc1_out] -> the activation in fp64 on the library's values.
Vec act_values(te_activation act, const Vec &h, int64_t rows, int64_t ffn) {
  const Bounded b = act_forward_bounded(act, Bounded::exact(h, rows, gated(act) ? 2 * ffn : ffn), ffn);
  return b.v;
}

// ---- 1. numerics --------------------------------------------------------------------------------

using NumericsParam = std::tuple<Mode, te_activation, te_dtype, bool>;  // mode, activation, dtype, bias

class LnMlpNumerics : public ::testing::TestWithParam<NumericsParam> {};

// Every (mode, activation, dtype, bias) runs; the norm kind and zero-centred gamma alternate over
// the cases so that each value of each meets every mode and activation.
te_norm_kind norm_of(const NumericsParam &p) {
  return (static_cast<int>(std::get<1>(p)) + std::get<2>(p) + std::get<3>(p)) % 2 ? TE_NORM_RMSNORM
                                                                                  : TE_NORM_LAYERNORM;
}
bool zc_of(const NumericsParam &p) { return (static_cast<int>(std::get<0>(p)) + std::get<3>(p)) % 2 == 1; }

TEST_P(LnMlpNumerics, ForwardAndBackwardAgainstFp64) {
  const Mode mode = std::get<0>(GetParam());
  const te_activation act = std::get<1>(GetParam());
  const te_dtype dt = std::get<2>(GetParam());
  const bool bias = std::get<3>(GetParam());
  const te_norm_kind kind = norm_of(GetParam());
  const bool zc = zc_of(GetParam()), layer = kind == TE_NORM_LAYERNORM, fp8 = lt::is_fp8_mode(mode);
  const int64_t T = kTokens, H = kHidden, F = kFfn, F1 = gated(act) ? 2 * kFfn : kFfn;
  const uint32_t seed = 3000 + 41 * static_cast<uint32_t>(mode) + 7 * act + 3 * dt + (bias ? 100 : 0);
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = lt::recipe_for(mode);
  lt::MlpPtr m = lt::make_mlp(ctx.get(), options(H, F, act, dt, kind, zc, bias));
  ASSERT_NE(m, nullptr) << "te_layernorm_mlp_create refused activation " << act_name(act);
  Data d(dt, act, kind, zc, bias, seed);
  HostTensor y = d.x_like(), ln_out = d.x_like();
  te_layernorm_mlp_forward_args a = d.args(ln_out.get());
  te_layernorm_mlp_residuals res = new_residuals();
  {
    auto scope = lt::scope_for(ctx.get(), mode, recipe.get());
    ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), m.get(), &a, y.get(), &res))
        << "activation " << act_name(act);
  }
  ASSERT_EQ(res.fp8, fp8 ? 1 : 0);

  // ---- the norm ----
  const Vec xv = d.x.values(), gv = d.gamma.values(), bv = layer ? d.beta.values() : Vec();
  const lt::NormRef nr = lt::ref_norm(xv, gv, bv, T, H, 1e-5, layer, zc);
  const Bounded ln32 = lt::norm_forward_bounded(nr, xv, gv, bv, T, H, layer, zc);
  EXPECT_TRUE(lt::WithinBound(ln_out.values(), lt::stored(ln32, dt), "ln_out", 1.0, 1e-2));
  EXPECT_EQ(res.mu.data != nullptr, layer) << "mu: LayerNorm only";
  const Vec rs_got = lt::view_values(res.rsigma);
  for (int64_t i = 0; i < T; ++i)
    EXPECT_NEAR(rs_got[i], nr.rsigma[i], 4 * (H + 16) * lt::kU32 * nr.rsigma[i]) << "rsigma[" << i << "]";

  // ---- the residual operands: the quantizations, and each GEMM on them ----
  const Vec w1v = d.w1.values(), w2v = d.w2.values();
  const std::vector<float> ln_f = ln_out.values_f32();
  Vec ln_q, w1_q, w2_q;
  if (!fp8) {
    EXPECT_EQ(res.fc1_weight_t.data, d.w1.get()->data) << "high precision references the caller's fc1 W";
    EXPECT_EQ(res.fc2_weight_t.data, d.w2.get()->data) << "high precision references the caller's fc2 W";
    EXPECT_TRUE(lt::bitwise_equal(lt::copy_tensor(res.ln_out_t), [&] {
      HostTensor l = ln_out;
      l.reshape({T, H});
      return l;
    }()));
    ln_q = ln_out.values();
    w1_q = w1v;
    w2_q = w2v;
  } else {
    const te_scaling_mode wmode = mode == Mode::Block ? TE_SCALING_BLOCK_128X128 : TE_SCALING_PER_TENSOR;
    const te_scaling_mode amode = mode == Mode::Block ? TE_SCALING_BLOCK_1X128 : TE_SCALING_PER_TENSOR;
    const bool pow2 = mode == Mode::Block;
    auto w_scale = [&](const Vec &w) {
      return mode == Mode::Delayed ? 1.0f : lt::scale_from_amax(lt::amax_of(w), 448.0f, false, 0.0f);
    };
    EXPECT_TRUE(lt::SameQuantization(lt::copy_tensor(res.fc1_weight_t),
                                     lt::quantize_ref(lt::transpose(d.w1.values_f32(), F1, H), H, F1, TE_DTYPE_E4M3,
                                                      wmode, w_scale(w1v), pow2, 0.0f)))
        << "fc1 weight";
    EXPECT_TRUE(lt::SameQuantization(lt::copy_tensor(res.fc2_weight_t),
                                     lt::quantize_ref(lt::transpose(d.w2.values_f32(), H, F), F, H, TE_DTYPE_E4M3,
                                                      wmode, w_scale(w2v), pow2, 0.0f)))
        << "fc2 weight";
    if (mode != Mode::Delayed) {
      const float s = mode == Mode::Current ? lt::scale_from_amax(lt::amax_of(ln_out.values()), 448.0f, false, 0.0f) : 0;
      EXPECT_TRUE(lt::SameQuantization(lt::copy_tensor(res.ln_out_t),
                                       lt::quantize_ref(lt::transpose(ln_f, T, H), H, T, TE_DTYPE_E4M3, amode, s, pow2, 0.0f)))
          << "norm output";
    } else {
      // The fused norm's codes: fl8 of the fp32 output (scale 1), within one rounding of ln_out.
      const HostTensor q = lt::copy_tensor(res.ln_out_t);
      EXPECT_EQ(q.scale_inv[0], 1.0f);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < H; ++j) {
          const double v = ln_out.at(t * H + j), half = dt == TE_DTYPE_BF16 ? std::ldexp(std::fabs(v), -9) : 0;
          const uint8_t c = q.code(j * T + t);
          ASSERT_TRUE(c == lt::fp8_encode(v - half, TE_DTYPE_E4M3) || c == lt::fp8_encode(v + half, TE_DTYPE_E4M3))
              << "fused code of (" << t << "," << j << ")";
        }
    }
    ln_q = mode == Mode::Block
               ? lt::dequantize_ref(lt::quantize_ref(ln_f, T, H, TE_DTYPE_E4M3, TE_SCALING_BLOCK_1X128, 0, true, 0.0f))
               : lt::untransposed(res.ln_out_t);
    w1_q = lt::untransposed(res.fc1_weight_t);
    w2_q = lt::untransposed(res.fc2_weight_t);
  }
  // fc1's output (kept in the activation dtype) on its quantized operands.
  const HostTensor fc1_got = lt::copy_tensor(res.fc1_out);
  ASSERT_EQ(fc1_got.t.dtype, dt);
  ASSERT_EQ(fc1_got.rows(), T);
  ASSERT_EQ(fc1_got.cols(), F1);
  lt::RefResult h_r = lt::ref_gemm_nt(ln_q, w1_q, T, F1, H);
  if (bias)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < F1; ++j) {
        h_r.value[i * F1 + j] += d.b1.at(j);
        h_r.abs_sum[i * F1 + j] += std::fabs(d.b1.at(j));
      }
  EXPECT_TRUE(lt::CloseToRef(fc1_got, h_r, "fc1 output on the quantized operands"));
  // The activation's output as fc2 used it: act of the library's fc1 output in fp32, stored in
  // the activation dtype, then (FP8) quantized for fc2.
  const Vec h_got = fc1_got.values();
  const Bounded act_lib = act_forward_bounded(act, Bounded::exact(h_got, T, F1), F);
  const double msi_act = lt::max_scale_inv(mode, TE_DTYPE_E4M3, lt::amax_of(act_lib.v) * 1.01);
  const Bounded act_used_b = fp8 ? lt::quantized(lt::stored(act_lib, dt), TE_DTYPE_E4M3, msi_act) : lt::stored(act_lib, dt);
  const Vec act_used = fp8 ? lt::untransposed(res.act_out_t) : lt::view_values(res.act_out_t);
  EXPECT_TRUE(lt::WithinBound(act_used, act_used_b, "activation output on the library's fc1 output", 1.0, 0.2));
  if (mode != Mode::Block) {
    // (Block: fc2 used the activation quantized along its rows, which no residual holds.)
    lt::RefResult y_r = lt::ref_gemm_nt(act_used, w2_q, T, H, F);
    if (bias)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < H; ++j) {
          y_r.value[i * H + j] += d.b2.at(j);
          y_r.abs_sum[i * H + j] += std::fabs(d.b2.at(j));
        }
    EXPECT_TRUE(lt::CloseToRef(y, y_r, "y on the quantized operands"));
  }

  // ---- forward against fp64 high precision ----
  const Vec dyv = d.dy.values();
  Bounded ln_b, w1_b = Bounded::exact(w1v, F1, H), w2_b = Bounded::exact(w2v, H, F), dy_b = Bounded::exact(dyv, T, H);
  switch (mode) {
    case Mode::HighPrecision: ln_b = lt::stored(ln32, dt); break;
    case Mode::Delayed: ln_b = lt::quantized(ln32, TE_DTYPE_E4M3, 1.0); break;
    default:
      ln_b = lt::quantized(lt::stored(ln32, dt), TE_DTYPE_E4M3,
                           lt::max_scale_inv(mode, TE_DTYPE_E4M3, lt::amax_of(nr.y) * 1.01));
  }
  if (fp8) {
    w1_b = lt::quantized(w1_b, TE_DTYPE_E4M3, lt::max_scale_inv(mode, TE_DTYPE_E4M3, lt::amax_of(w1v)));
    w2_b = lt::quantized(w2_b, TE_DTYPE_E4M3, lt::max_scale_inv(mode, TE_DTYPE_E4M3, lt::amax_of(w2v)));
    dy_b = lt::quantized(dy_b, TE_DTYPE_E5M2, lt::max_scale_inv(mode, TE_DTYPE_E5M2, lt::amax_of(dyv)));
  }
  Bounded h_b = lt::gemm(ln_b, w1_b, "nt");
  if (bias) h_b = lt::plus_bias(h_b, d.b1.values());
  h_b = lt::stored(h_b, dt);
  EXPECT_TRUE(lt::WithinBound(h_got, h_b, "fc1 output vs fp64 high precision"));
  Bounded a_b = lt::stored(act_forward_bounded(act, h_b, F), dt);
  if (fp8) a_b = lt::quantized(a_b, TE_DTYPE_E4M3, lt::max_scale_inv(mode, TE_DTYPE_E4M3, lt::amax_of(a_b.v) * 1.1));
  Bounded y_b = lt::gemm(a_b, w2_b, "nt");
  if (bias) y_b = lt::plus_bias(y_b, d.b2.values());
  EXPECT_TRUE(lt::WithinBound(y.values(), lt::stored(y_b, dt), "y vs fp64 high precision"));

  // ---- backward ----
  te_layernorm_mlp_backward_ctx *raw = nullptr;
  ASSERT_TE_OK(te_layernorm_mlp_forward_save(ctx.get(), m.get(), &res, &raw));
  lt::MlpBwdPtr bwd(raw);
  Grads g(d);
  te_layernorm_mlp_grads gr = g.all(d);
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), raw, d.dy.get(), &gr, nullptr)) << "activation " << act_name(act);
  // The chain, in the library's order: fc2 (dgrad into d_act, wgrad, dbias), the activation's
  // backward on the saved fc1 output, fc1 (dy = d fc1_out quantized), the norm. The deeper
  // gradients carry more independent roundings (two E5M2 and two E4M3 quantizations and the
  // activation's sensitivity): their normwise bound may reach 0.5 of ||v||, still well below a
  // wrong sign's 2 or a transposed operand's ~1.4.
  const double loose = 0.5;
  const Bounded dw2_b = lt::stored(lt::gemm(dy_b, a_b, "tn"), dt);
  EXPECT_TRUE(lt::WithinBound(g.dw2.values(), dw2_b, "dfc2_weight vs fp64 high precision"));
  EXPECT_FALSE(lt::WithinBound(lt::ref_transpose(dw2_b.v, H, F), dw2_b, "transposed dfc2_weight"))
      << "the check would accept a transposed operand";
  const Bounded dact_b = lt::stored(lt::gemm(dy_b, w2_b, "nn"), dt);
  // ReLU's derivative jumps at 0: where the library's fc1 output and the fp64 one straddle 0
  // (a few percent of the elements at FP8 precision) no bound on the difference of the
  // high-precision gradients exists. Its backward is checked at the library's own forward point
  // (the saved fc1 output, exact), which is what a backward owes: the gradient of the function
  // its forward computed.
  const Bounded h_grad = act == TE_ACTIVATION_RELU ? Bounded::exact(h_got, T, F1) : h_b;
  Bounded dh_b = lt::stored(act_backward_bounded(act, h_grad, dact_b), dt);
  const Bounded dh_q = fp8 ? lt::quantized(dh_b, TE_DTYPE_E5M2, lt::max_scale_inv(mode, TE_DTYPE_E5M2, lt::amax_of(dh_b.v) * 1.5))
                           : dh_b;
  const Bounded dw1_b = lt::stored(lt::gemm(dh_q, ln_b, "tn"), dt);
  EXPECT_TRUE(lt::WithinBound(g.dw1.values(), dw1_b, "dfc1_weight vs fp64 high precision", 1.0, loose));
  const Bounded dln_b = lt::stored(lt::gemm(dh_q, w1_b, "nn"), dt);
  const lt::NormGradBounded ng = lt::norm_backward_bounded(dln_b, nr, gv, T, H, layer, zc);
  EXPECT_TRUE(lt::WithinBound(g.dx.values(), lt::stored(ng.dx, dt), "dx vs fp64 high precision", 1.0, loose));
  EXPECT_TRUE(lt::WithinBound(g.dgamma.values(), lt::stored(ng.dgamma, dt), "dgamma vs fp64 high precision", 1.0, loose));
  if (layer)
    EXPECT_TRUE(lt::WithinBound(g.dbeta.values(), lt::stored(ng.dbeta, dt), "dbeta vs fp64 high precision", 1.0, loose));
  if (bias) {
    EXPECT_TRUE(lt::WithinBound(g.db2.values(), lt::stored(lt::column_sums(Bounded::exact(dyv, T, H)), dt), "dfc2_bias"));
    EXPECT_TRUE(lt::WithinBound(g.db1.values(), lt::stored(lt::column_sums(dh_b), dt), "dfc1_bias", 1.0, loose));
  } else {
    EXPECT_TRUE(std::all_of(g.db1.bytes.begin(), g.db1.bytes.end(), [](unsigned char c) { return c == 0xA5; }));
  }
  // (Exact-ish checks with a dy exact in E5M2: LnMlpExact below.)
  // Retain-graph: the same backward again gives the same bits.
  Grads g2(d);
  te_layernorm_mlp_grads gr2 = g2.all(d);
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), raw, d.dy.get(), &gr2, nullptr));
  EXPECT_TRUE(same_grads(g, g2)) << "a second backward differs";
}

INSTANTIATE_TEST_SUITE_P(
    All, LnMlpNumerics,
    ::testing::Combine(::testing::Values(Mode::HighPrecision, Mode::Delayed, Mode::Current, Mode::Block),
                       ::testing::ValuesIn(kAllActivations), ::testing::Values(TE_DTYPE_F32, TE_DTYPE_BF16),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<NumericsParam> &i) {
      return std::string(lt::mode_name(std::get<0>(i.param))) + "_" + act_name(std::get<1>(i.param)) + "_" +
             lt::dtype_name(std::get<2>(i.param)) + (std::get<3>(i.param) ? "_Bias" : "_NoBias") + "_" +
             (norm_of(i.param) == TE_NORM_LAYERNORM ? "LayerNorm" : "RMSNorm") +
             (zc_of(i.param) ? "_ZeroCentered" : "");
    });

// Delayed scaling with dy exactly representable in E5M2 (fresh state, scale 1): fc2's wgrad and
// dbias are then exact-ish on the residual operands (fp32 accumulation of exact products; the
// column sums of multiples of 1/8 below 2^7 are exact in fp32).
TEST(LnMlpExact, DelayedWgradAndDbiasOnResidualOperands) {
  for (te_activation act : kAllActivations) {
    SCOPED_TRACE(act_name(act));
    lt::ContextPtr ctx = lt::make_cpu_context();
    lt::RecipePtr recipe = lt::recipe_for(Mode::Delayed);
    lt::MlpPtr m = lt::make_mlp(ctx.get(), options(kHidden, kFfn, act, TE_DTYPE_F32, TE_NORM_LAYERNORM, 0, 1));
    Data d(TE_DTYPE_F32, act, TE_NORM_LAYERNORM, false, true, 3500);
    static const float vals[] = {-1.5f, -1.0f, -0.5f, -0.25f, 0.0f, 0.125f, 0.375f, 0.75f, 1.25f};
    for (int64_t i = 0; i < d.dy.numel(); ++i) d.dy.set(i, vals[(i * 7 + i / 5) % 9]);
    HostTensor y = d.x_like();
    te_layernorm_mlp_forward_args a = d.args();
    te_layernorm_mlp_residuals res = new_residuals();
    {
      lt::AutocastScope scope(ctx.get(), recipe.get());
      ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), m.get(), &a, y.get(), &res));
    }
    const Vec act_q = lt::untransposed(res.act_out_t);
    te_layernorm_mlp_backward_ctx *raw = nullptr;
    ASSERT_TE_OK(te_layernorm_mlp_forward_save(ctx.get(), m.get(), &res, &raw));
    lt::MlpBwdPtr bwd(raw);
    Grads g(d);
    te_layernorm_mlp_grads gr = g.all(d);
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), raw, d.dy.get(), &gr, nullptr));
    const Vec dyv = d.dy.values();
    const lt::RefResult dw2 =
        lt::ref_gemm_nt(lt::ref_transpose(dyv, kTokens, kHidden), lt::ref_transpose(act_q, kTokens, kFfn), kHidden, kFfn, kTokens);
    EXPECT_TRUE(lt::CloseToRef(g.dw2, dw2, "dfc2_weight on the residual operands"));
    for (int64_t j = 0; j < kHidden; ++j) {
      double s = 0;
      for (int64_t t = 0; t < kTokens; ++t) s += dyv[t * kHidden + j];
      EXPECT_EQ(g.db2.at(j), s) << "dfc2_bias[" << j << "]";
    }
  }
}

// ---- 2. ln_out and gradient subsets -------------------------------------------------------------

class LnMlpLnOut : public ::testing::TestWithParam<std::tuple<te_dtype, te_norm_kind, te_activation>> {};

TEST_P(LnMlpLnOut, IsTheNormOutputInEveryMode) {
  const te_dtype dt = std::get<0>(GetParam());
  const te_norm_kind kind = std::get<1>(GetParam());
  const te_activation act = std::get<2>(GetParam());
  lt::ContextPtr ctx = lt::make_cpu_context();
  Data d(dt, act, kind, true, true, 3600);
  HostTensor want = d.x_like();
  {
    te_norm_options no;
    ASSERT_TE_OK(te_norm_options_init(&no));
    no.kind = kind;
    no.zero_centered_gamma = 1;
    te_norm_forward_args na;
    ASSERT_TE_OK(te_norm_forward_args_init(&na));
    na.input = d.x.get();
    na.weight = d.gamma.get();
    na.bias = d.layer ? d.beta.get() : nullptr;
    na.output = want.get();
    ASSERT_TE_OK(te_norm_forward(ctx.get(), &no, &na));
  }
  HostTensor y_hp = d.x_like();
  for (Mode mode : {Mode::HighPrecision, Mode::Calibrating, Mode::Delayed, Mode::Current, Mode::Block}) {
    SCOPED_TRACE(lt::mode_name(mode));
    lt::RecipePtr recipe = lt::recipe_for(mode);
    const te_layernorm_mlp_options o = options(kHidden, kFfn, act, dt, kind, 1, 1);
    lt::MlpPtr m = lt::make_mlp(ctx.get(), o), twin = lt::make_mlp(ctx.get(), o);
    HostTensor ln_out = d.x_like(), y = d.x_like(), y2 = d.x_like();
    te_layernorm_mlp_forward_args a = d.args(ln_out.get()), a2 = d.args();
    te_layernorm_mlp_backward_ctx *b1 = nullptr, *b2 = nullptr;
    {
      auto scope = lt::scope_for(ctx.get(), mode, recipe.get());
      ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), m.get(), &a, y.get(), &b1));
      ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), twin.get(), &a2, y2.get(), &b2));
    }
    lt::MlpBwdPtr h1(b1), h2(b2);
    EXPECT_TRUE(same(ln_out, want)) << "ln_out differs from te_norm_forward's output";
    EXPECT_TRUE(same(y, y2)) << "requesting ln_out changed y";
    if (mode == Mode::HighPrecision) y_hp = y;
    if (mode == Mode::Calibrating) EXPECT_TRUE(same(y, y_hp)) << "calibrating must compute in high precision";
    Grads g1(d), g2(d);
    te_layernorm_mlp_grads r1 = g1.all(d), r2 = g2.all(d);
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), b1, d.dy.get(), &r1, nullptr));
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), b2, d.dy.get(), &r2, nullptr));
    EXPECT_TRUE(same_grads(g1, g2)) << "requesting ln_out changed the gradients";
  }
}

INSTANTIATE_TEST_SUITE_P(All, LnMlpLnOut,
                         ::testing::Combine(::testing::Values(TE_DTYPE_F32, TE_DTYPE_BF16),
                                            ::testing::Values(TE_NORM_LAYERNORM, TE_NORM_RMSNORM),
                                            ::testing::Values(TE_ACTIVATION_GELU, TE_ACTIVATION_SWIGLU)));

using ModeAct = std::tuple<Mode, te_activation>;
class LnMlpModes : public ::testing::TestWithParam<ModeAct> {
 protected:
  Mode mode() const { return std::get<0>(GetParam()); }
  te_activation act() const { return std::get<1>(GetParam()); }
};

// Each subset of the seven gradients: requested ones bitwise the full backward's, the others
// not written.
TEST_P(LnMlpModes, GradientSubsets) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = lt::recipe_for(mode());
  lt::MlpPtr m = lt::make_mlp(ctx.get(), options(kHidden, kFfn, act(), TE_DTYPE_BF16, TE_NORM_LAYERNORM, 0, 1));
  Data d(TE_DTYPE_BF16, act(), TE_NORM_LAYERNORM, false, true, 3700);
  HostTensor y = d.x_like();
  te_layernorm_mlp_forward_args a = d.args();
  te_layernorm_mlp_backward_ctx *raw = nullptr;
  {
    auto scope = lt::scope_for(ctx.get(), mode(), recipe.get());
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), m.get(), &a, y.get(), &raw));
  }
  lt::MlpBwdPtr bwd(raw);
  Grads full(d);
  te_layernorm_mlp_grads gf = full.all(d);
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), raw, d.dy.get(), &gf, nullptr));
  const Grads untouched(d);
  const char *names[7] = {"dx", "dgamma", "dbeta", "dfc1_weight", "dfc1_bias", "dfc2_weight", "dfc2_bias"};
  for (int mask = 0; mask < 128; ++mask) {
    SCOPED_TRACE("gradients requested (bits dx .. dfc2_bias): " + std::to_string(mask));
    Grads g(d);
    te_layernorm_mlp_grads gr;
    ASSERT_TE_OK(te_layernorm_mlp_grads_init(&gr));
    HostTensor *mine[7] = {&g.dx, &g.dgamma, &g.dbeta, &g.dw1, &g.db1, &g.dw2, &g.db2};
    te_tensor **slot[7] = {&gr.dx, &gr.dln_weight, &gr.dln_bias, &gr.dfc1_weight, &gr.dfc1_bias, &gr.dfc2_weight,
                           &gr.dfc2_bias};
    for (int i = 0; i < 7; ++i)
      if (mask & (1 << i)) *slot[i] = mine[i]->get();
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), raw, d.dy.get(), &gr, nullptr));
    const auto want = full.list(), sentinel = untouched.list();
    for (int i = 0; i < 7; ++i) {
      if (mask & (1 << i))
        EXPECT_TRUE(same(*mine[i], *want[static_cast<size_t>(i)])) << names[i] << " differs from the full backward's";
      else
        EXPECT_TRUE(same(*mine[i], *sentinel[static_cast<size_t>(i)])) << names[i] << " written without being requested";
    }
  }
  EXPECT_TE_OK(te_layernorm_mlp_backward(ctx.get(), raw, d.dy.get(), nullptr, nullptr));
}

// te_layernorm_mlp_forward gives bitwise what compute + save give.
TEST_P(LnMlpModes, ForwardEqualsComputePlusSave) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = lt::recipe_for(mode());
  const te_layernorm_mlp_options o = options(kHidden, kFfn, act(), TE_DTYPE_BF16, TE_NORM_RMSNORM, 1, 1);
  lt::MlpPtr a = lt::make_mlp(ctx.get(), o), b = lt::make_mlp(ctx.get(), o);
  Data d(TE_DTYPE_BF16, act(), TE_NORM_RMSNORM, true, true, 3800);
  HostTensor ya = d.x_like(), yb = d.x_like();
  te_layernorm_mlp_forward_args fa = d.args();
  te_layernorm_mlp_backward_ctx *ba = nullptr, *bb = nullptr;
  {
    auto scope = lt::scope_for(ctx.get(), mode(), recipe.get());
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), a.get(), &fa, ya.get(), &ba));
    te_layernorm_mlp_residuals res = new_residuals();
    ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), b.get(), &fa, yb.get(), &res));
    ASSERT_TE_OK(te_layernorm_mlp_forward_save(ctx.get(), b.get(), &res, &bb));
    EXPECT_EQ(res.internal, nullptr);
  }
  lt::MlpBwdPtr ha(ba), hb(bb);
  EXPECT_TRUE(same(ya, yb));
  Grads ga(d), gb(d);
  te_layernorm_mlp_grads ra = ga.all(d), rb = gb.all(d);
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), bb, d.dy.get(), &rb, nullptr));
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), ba, d.dy.get(), &ra, nullptr));
  EXPECT_TRUE(same_grads(ga, gb));
  EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx.get(), a.get()), lt::module_state(ctx.get(), b.get())));
}

TEST_P(LnMlpModes, BackwardOnceThenInvalidState) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = lt::recipe_for(mode());
  const te_layernorm_mlp_options o = options(kHidden, kFfn, act(), TE_DTYPE_BF16, TE_NORM_LAYERNORM, 0, 1);
  lt::MlpPtr a = lt::make_mlp(ctx.get(), o), b = lt::make_mlp(ctx.get(), o);
  Data d(TE_DTYPE_BF16, act(), TE_NORM_LAYERNORM, false, true, 3900);
  HostTensor y = d.x_like();
  te_layernorm_mlp_forward_args fa = d.args();
  te_layernorm_mlp_backward_ctx *ra = nullptr, *rb = nullptr;
  {
    auto scope = lt::scope_for(ctx.get(), mode(), recipe.get());
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), a.get(), &fa, y.get(), &ra));
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), b.get(), &fa, y.get(), &rb));
  }
  lt::MlpBwdPtr ha(ra), hb(rb);
  te_linear_backward_args once;
  ASSERT_TE_OK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE;
  Grads g_once(d), g_ref(d);
  te_layernorm_mlp_grads r1 = g_once.all(d), r2 = g_ref.all(d);
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), rb, d.dy.get(), &r1, &once));
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), ra, d.dy.get(), &r2, nullptr));
  EXPECT_TRUE(same_grads(g_once, g_ref));
  const std::vector<unsigned char> state = lt::module_state(ctx.get(), b.get());
  Grads again(d);
  const Grads sentinel(d);
  te_layernorm_mlp_grads r3 = again.all(d);
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_backward(ctx.get(), rb, d.dy.get(), &r3, nullptr), TE_ERROR_INVALID_STATE,
                          "te_layernorm_mlp_backward", nullptr));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_backward(ctx.get(), rb, d.dy.get(), &r3, &once), TE_ERROR_INVALID_STATE,
                          "te_layernorm_mlp_backward", nullptr));
  EXPECT_TRUE(same_grads(again, sentinel));
  EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx.get(), b.get()), state));
}

// weight_unchanged = 1 reuses both cached FP8 weights: changing either W in place gives the old
// result; 0 requantizes both.
TEST_P(LnMlpModes, WeightCachesReusedOnlyWhenUnchanged) {
  if (!lt::is_fp8_mode(mode())) GTEST_SKIP() << "no FP8 weights in high precision";
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = lt::recipe_for(mode());
  const te_layernorm_mlp_options o = options(kHidden, kFfn, act(), TE_DTYPE_BF16, TE_NORM_LAYERNORM, 0, 1);
  lt::MlpPtr m = lt::make_mlp(ctx.get(), o);
  Data d(TE_DTYPE_BF16, act(), TE_NORM_LAYERNORM, false, true, 4000);
  const HostTensor w1_new = lt::random_tensor(TE_DTYPE_BF16, {d.fc1_out, kHidden}, -0.2f, 0.2f, 4001);
  const HostTensor w2_new = lt::random_tensor(TE_DTYPE_BF16, {kHidden, kFfn}, -0.3f, 0.3f, 4002);
  auto fwd = [&](te_layernorm_mlp *mod, int unchanged) {
    HostTensor y = d.x_like();
    te_layernorm_mlp_residuals res = new_residuals();
    te_layernorm_mlp_forward_args a = d.args(nullptr, unchanged);
    EXPECT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), mod, &a, y.get(), &res));
    te_layernorm_mlp_residuals_release(&res);
    return y;
  };
  lt::AutocastScope scope(ctx.get(), recipe.get());
  const HostTensor y1 = fwd(m.get(), 0);
  d.w1.bytes = w1_new.bytes;
  EXPECT_TRUE(same(fwd(m.get(), 1), y1)) << "fc1's cached FP8 weight must be reused";
  d.w2.bytes = w2_new.bytes;
  EXPECT_TRUE(same(fwd(m.get(), 1), y1)) << "fc2's cached FP8 weight must be reused";
  const HostTensor y3 = fwd(m.get(), 0);
  EXPECT_FALSE(same(y3, y1)) << "weight_unchanged=0 must requantize";
  lt::MlpPtr fresh = lt::make_mlp(ctx.get(), o), first = lt::make_mlp(ctx.get(), o);
  EXPECT_TRUE(same(fwd(fresh.get(), 0), y3)) << "the refreshed caches must equal a fresh quantization";
  EXPECT_TRUE(same(fwd(first.get(), 1), y3)) << "no cache yet: weight_unchanged=1 quantizes";
}

// Backward contexts keep the FP8 weights of their forward after a later forward refreshed the
// caches; and they outlive the module and the context.
TEST_P(LnMlpModes, BackwardContextKeepsItsWeightsAndOutlivesModuleAndContext) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = lt::recipe_for(mode());
  const te_layernorm_mlp_options o = options(kHidden, kFfn, act(), TE_DTYPE_F32, TE_NORM_LAYERNORM, 0, 1);
  lt::MlpPtr m = lt::make_mlp(ctx.get(), o), twin = lt::make_mlp(ctx.get(), o);
  Data d(TE_DTYPE_F32, act(), TE_NORM_LAYERNORM, false, true, 4100);
  Data d2 = d;  // other weights in their own storage (high precision references the caller's)
  d2.w1 = lt::random_tensor(TE_DTYPE_F32, {d.fc1_out, kHidden}, -0.2f, 0.2f, 4101);
  d2.w2 = lt::random_tensor(TE_DTYPE_F32, {kHidden, kFfn}, -0.3f, 0.3f, 4102);
  HostTensor y = d.x_like();
  te_layernorm_mlp_backward_ctx *b1 = nullptr, *b2 = nullptr, *t1 = nullptr;
  te_layernorm_mlp_residuals res = new_residuals();
  {
    auto scope = lt::scope_for(ctx.get(), mode(), recipe.get());
    te_layernorm_mlp_forward_args a = d.args(), a2 = d2.args();
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), twin.get(), &a, y.get(), &t1));
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), m.get(), &a, y.get(), &b1));
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), m.get(), &a2, y.get(), &b2));
    ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), m.get(), &a, y.get(), &res));
  }
  m.reset();
  Grads g1(d), gt(d);
  te_layernorm_mlp_grads r1 = g1.all(d), rt = gt.all(d);
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), b1, d.dy.get(), &r1, nullptr));
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), t1, d.dy.get(), &rt, nullptr));
  EXPECT_TRUE(same(g1.dx, gt.dx)) << "dgrad of the first context must use the weights of its forward";
  te_context *dead = ctx.release();
  te_context_destroy(dead);
  Grads g2(d);
  te_layernorm_mlp_grads r2 = g2.all(d);
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_backward(dead, b2, d.dy.get(), &r2, nullptr), TE_ERROR_INVALID_ARGUMENT,
                          "te_layernorm_mlp_backward", "ctx"));
  te_layernorm_mlp_residuals_release(&res);
  te_layernorm_mlp_backward_ctx_destroy(b2);
  te_layernorm_mlp_backward_ctx_destroy(b1);
  te_layernorm_mlp_backward_ctx_destroy(t1);
  twin.reset();
}

// Fused wgrad accumulation: both weight gradients are added into F32 main_grads.
TEST_P(LnMlpModes, FusedWgradAccumulatesIntoMainGrads) {
  for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16}) {
    SCOPED_TRACE(lt::dtype_name(dt));
    lt::ContextPtr ctx = lt::make_cpu_context();
    lt::RecipePtr recipe = lt::recipe_for(mode());
    lt::MlpPtr fused = lt::make_mlp(ctx.get(), options(kHidden, kFfn, act(), dt, TE_NORM_LAYERNORM, 0, 1, 1));
    lt::MlpPtr plain = lt::make_mlp(ctx.get(), options(kHidden, kFfn, act(), dt, TE_NORM_LAYERNORM, 0, 1, 0));
    Data d(dt, act(), TE_NORM_LAYERNORM, false, true, 4200);
    HostTensor y = d.x_like();
    te_layernorm_mlp_forward_args a = d.args();
    te_layernorm_mlp_backward_ctx *bf = nullptr, *bp = nullptr;
    {
      auto scope = lt::scope_for(ctx.get(), mode(), recipe.get());
      ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), fused.get(), &a, y.get(), &bf));
      ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), plain.get(), &a, y.get(), &bp));
    }
    lt::MlpBwdPtr hf(bf), hp(bp);
    Grads gp(d), gf(d, TE_DTYPE_F32);
    gf.dw1 = lt::random_tensor(TE_DTYPE_F32, {d.fc1_out, kHidden}, -1, 1, 4201);
    gf.dw2 = lt::random_tensor(TE_DTYPE_F32, {kHidden, kFfn}, -1, 1, 4202);
    const std::vector<float> m1_0 = gf.dw1.values_f32(), m2_0 = gf.dw2.values_f32();
    te_layernorm_mlp_grads rp = gp.all(d), rf = gf.all(d);
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), bp, d.dy.get(), &rp, nullptr));
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), bf, d.dy.get(), &rf, nullptr));
    EXPECT_TRUE(same(gp.dx, gf.dx)) << "fusing wgrad accumulation must not change dx";
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), bf, d.dy.get(), &rf, nullptr));
    const double u = lt::unit_roundoff(dt);
    for (int which = 0; which < 2; ++which) {
      const HostTensor &mg = which ? gf.dw2 : gf.dw1, &dw = which ? gp.dw2 : gp.dw1;
      const std::vector<float> &m0 = which ? m2_0 : m1_0;
      int bad = 0;
      for (int64_t i = 0; i < mg.numel() && bad < 3; ++i) {
        const double g = dw.at(i);
        // Twice the fp32 dW (the unfused one rounded to dt: half an ulp), plus the fp32 adds.
        const double tol = 2 * u * std::fabs(g) + 8 * lt::kU32 * (std::fabs(m0[i]) + 2 * std::fabs(g)) + 1e-30;
        if (!(std::fabs(mg.at(i) - (m0[i] + 2 * g)) <= tol)) {
          ++bad;
          ADD_FAILURE() << (which ? "dfc2" : "dfc1") << " main_grad[" << i << "] = " << mg.at(i) << ", expected "
                        << m0[i] << " + 2*" << g;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, LnMlpModes,
                         ::testing::Combine(::testing::Values(Mode::HighPrecision, Mode::Delayed, Mode::Current,
                                                              Mode::Block),
                                            ::testing::Values(TE_ACTIVATION_GELU, TE_ACTIVATION_SWIGLU,
                                                              TE_ACTIVATION_SRELU)),
                         [](const ::testing::TestParamInfo<ModeAct> &i) {
                           return std::string(lt::mode_name(std::get<0>(i.param))) + "_" + act_name(std::get<1>(i.param));
                         });

// Residual ownership, as for LayerNormLinear.
TEST(LnMlpResiduals, OwnershipRules) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  const te_layernorm_mlp_options o = options(kHidden, kFfn, TE_ACTIVATION_GELU, TE_DTYPE_BF16, TE_NORM_LAYERNORM, 0, 1);
  lt::MlpPtr m = lt::make_mlp(ctx.get(), o), other = lt::make_mlp(ctx.get(), o);
  Data d(TE_DTYPE_BF16, TE_ACTIVATION_GELU, TE_NORM_LAYERNORM, false, true, 4300);
  HostTensor y = d.x_like();
  te_layernorm_mlp_forward_args a = d.args();
  te_layernorm_mlp_backward_ctx *const sentinel = reinterpret_cast<te_layernorm_mlp_backward_ctx *>(0x1234);
  const char *fn = "te_layernorm_mlp_forward_save";
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    SCOPED_TRACE(fp8 ? "FP8" : "high precision");
    std::unique_ptr<lt::AutocastScope> scope;
    if (fp8) scope.reset(new lt::AutocastScope(ctx.get(), nullptr));
    te_layernorm_mlp_residuals res = new_residuals();
    ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), m.get(), &a, y.get(), &res));
    EXPECT_EQ(res.fp8, fp8);
    te_layernorm_mlp_residuals_release(&res);
    EXPECT_EQ(res.internal, nullptr);
    te_layernorm_mlp_residuals_release(&res);
    te_layernorm_mlp_backward_ctx *out = sentinel;
    EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_save(ctx.get(), m.get(), &res, &out), TE_ERROR_INVALID_ARGUMENT, fn,
                            "residuals"));
    EXPECT_EQ(out, sentinel);
    for (int copy_first = 0; copy_first < 2; ++copy_first) {
      te_layernorm_mlp_residuals orig = new_residuals();
      ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), m.get(), &a, y.get(), &orig));
      te_layernorm_mlp_residuals copy = orig;
      te_layernorm_mlp_residuals &first = copy_first ? copy : orig, &second = copy_first ? orig : copy;
      te_layernorm_mlp_backward_ctx *b = nullptr;
      ASSERT_TE_OK(te_layernorm_mlp_forward_save(ctx.get(), m.get(), &first, &b));
      lt::MlpBwdPtr hold(b);
      out = sentinel;
      EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_save(ctx.get(), m.get(), &second, &out), TE_ERROR_INVALID_ARGUMENT,
                              fn, "residuals"));
      EXPECT_EQ(out, sentinel);
      te_layernorm_mlp_residuals_release(&second);
      Grads g(d);
      te_layernorm_mlp_grads gr = g.all(d);
      EXPECT_TE_OK(te_layernorm_mlp_backward(ctx.get(), b, d.dy.get(), &gr, nullptr));
    }
    te_layernorm_mlp_residuals theirs = new_residuals();
    ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), other.get(), &a, y.get(), &theirs));
    EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_save(ctx.get(), m.get(), &theirs, &out), TE_ERROR_INVALID_ARGUMENT, fn,
                            "residuals"));
    EXPECT_NE(theirs.internal, nullptr);
    // A LayerNormLinear's residual handle in an MLP residuals struct.
    te_layernorm_linear_options lo;
    ASSERT_TE_OK(te_layernorm_linear_options_init(&lo));
    lo.in_features = kHidden;
    lo.out_features = kHidden;
    lo.activation_dtype = TE_DTYPE_BF16;
    lt::LnLinearPtr lnl = lt::make_ln_linear(ctx.get(), lo);
    te_layernorm_linear_forward_args la;
    ASSERT_TE_OK(te_layernorm_linear_forward_args_init(&la));
    la.input = d.x.get();
    la.ln_weight = d.gamma.get();
    la.ln_bias = d.beta.get();
    HostTensor w_sq = lt::random_tensor(TE_DTYPE_BF16, {kHidden, kHidden}, -0.1f, 0.1f, 4301);
    HostTensor b_sq = lt::random_tensor(TE_DTYPE_BF16, {kHidden}, -0.1f, 0.1f, 4302);
    la.weight = w_sq.get();
    la.bias = b_sq.get();
    te_layernorm_linear_residuals lres;
    std::memset(&lres, 0, sizeof lres);
    lres.struct_size = sizeof lres;
    HostTensor ly = d.x_like();
    ASSERT_TE_OK(te_layernorm_linear_forward_compute(ctx.get(), lnl.get(), &la, ly.get(), &lres));
    te_layernorm_mlp_residuals forged = new_residuals();
    forged.internal = lres.internal;
    EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_save(ctx.get(), m.get(), &forged, &out), TE_ERROR_INVALID_ARGUMENT, fn,
                            "residuals"));
    te_layernorm_mlp_residuals_release(&forged);  // another type's handle: ignored
    EXPECT_NE(lres.internal, nullptr);
    te_layernorm_linear_residuals_release(&lres);
    te_layernorm_mlp_residuals_release(&theirs);
    EXPECT_EQ(out, sentinel);
  }
  te_layernorm_mlp_residuals late = new_residuals();
  {
    lt::AutocastScope scope(ctx.get(), nullptr);
    ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), m.get(), &a, y.get(), &late));
  }
  m.reset();
  other.reset();
  ctx.reset();
  te_layernorm_mlp_residuals_release(&late);
  EXPECT_EQ(late.internal, nullptr);
  te_layernorm_mlp_residuals_release(nullptr);
  te_layernorm_mlp_backward_ctx_destroy(nullptr);
  te_layernorm_mlp_destroy(nullptr);
}

// ---- 3b. amax / scale bookkeeping ---------------------------------------------------------------

// Delayed scaling: fc1's INPUT records the norm output's amax (the fused norm), fc2's INPUT the
// activation output's, the WEIGHTs their W's; one bucket update of 4 states at the scope end;
// the (only) module's backward updates both GRAD_OUTPUTs (fc2's from dy) in one more.
TEST(LnMlpBookkeeping, DelayedScalingRecordsAndUpdatesEveryState) {
  for (te_activation act : kAllActivations) {
    SCOPED_TRACE(act_name(act));
    lt::ContextPtr ctx = lt::make_cpu_context();
    lt::RecipePtr recipe = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 16);
    lt::MlpPtr m = lt::make_mlp(ctx.get(), options(kHidden, kFfn, act, TE_DTYPE_F32, TE_NORM_LAYERNORM, 0, 1));
    Data d(TE_DTYPE_F32, act, TE_NORM_LAYERNORM, false, true, 4400);
    HostTensor y = d.x_like(), ln_out = d.x_like();
    te_layernorm_mlp_forward_args a = d.args(ln_out.get());
    te_layernorm_mlp_residuals res = new_residuals();
    const te_context_stats st0 = lt::context_stats(ctx.get());
    float amax_act = 0;
    {
      lt::AutocastScope scope(ctx.get(), recipe.get());
      ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), m.get(), &a, y.get(), &res));
      EXPECT_EQ(lt::scaling_state(ctx.get(), m.get(), TE_MLP_FC1, TE_ROLE_INPUT).history.at(0),
                lt::amax_of(ln_out.values()))
          << "fc1 INPUT: the norm output's amax";
      EXPECT_EQ(lt::scaling_state(ctx.get(), m.get(), TE_MLP_FC1, TE_ROLE_WEIGHT).history.at(0), lt::amax_of(d.w1.values()));
      EXPECT_EQ(lt::scaling_state(ctx.get(), m.get(), TE_MLP_FC2, TE_ROLE_WEIGHT).history.at(0), lt::amax_of(d.w2.values()));
      amax_act = lt::scaling_state(ctx.get(), m.get(), TE_MLP_FC2, TE_ROLE_INPUT).history.at(0);
      // The activation of the saved fc1 output in fp64: within the fp32 evaluation error.
      const float want = lt::amax_of(act_values(act, lt::copy_tensor(res.fc1_out).values(), kTokens, kFfn));
      EXPECT_NEAR(amax_act, want, 4 * kActEval * want) << "fc2 INPUT: the activation output's amax";
    }
    const te_context_stats st1 = lt::context_stats(ctx.get());
    EXPECT_EQ(st1.bucket_updates - st0.bucket_updates, 1u);
    EXPECT_EQ(st1.states_updated - st0.states_updated, 4u) << "fc1 and fc2 INPUT and WEIGHT";
    EXPECT_EQ(lt::scaling_state(ctx.get(), m.get(), TE_MLP_FC2, TE_ROLE_INPUT).info.scale, 448.0f / amax_act);
    EXPECT_EQ(lt::scaling_state(ctx.get(), m.get(), TE_MLP_FC1, TE_ROLE_INPUT).info.scale,
              448.0f / lt::amax_of(ln_out.values()));
    te_layernorm_mlp_backward_ctx *raw = nullptr;
    ASSERT_TE_OK(te_layernorm_mlp_forward_save(ctx.get(), m.get(), &res, &raw));
    lt::MlpBwdPtr bwd(raw);
    Grads g(d);
    te_layernorm_mlp_grads gr = g.all(d);
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), raw, d.dy.get(), &gr, nullptr));
    const te_context_stats st2 = lt::context_stats(ctx.get());
    EXPECT_EQ(st2.bucket_updates - st1.bucket_updates, 1u);
    EXPECT_EQ(st2.states_updated - st1.states_updated, 2u) << "fc1 and fc2 GRAD_OUTPUT";
    const lt::ScalingSnapshot go2 = lt::scaling_state(ctx.get(), m.get(), TE_MLP_FC2, TE_ROLE_GRAD_OUTPUT);
    EXPECT_EQ(go2.info.scale, 57344.0f / lt::amax_of(d.dy.values()));
    EXPECT_EQ(go2.info.fp8_dtype, TE_DTYPE_E5M2);
    const lt::ScalingSnapshot go1 = lt::scaling_state(ctx.get(), m.get(), TE_MLP_FC1, TE_ROLE_GRAD_OUTPUT);
    EXPECT_EQ(go1.info.amax_history_len, 16);
    EXPECT_GT(go1.history.back(), 0.0f) << "fc1 GRAD_OUTPUT recorded d(fc1 output)'s amax";
    EXPECT_EQ(go1.info.scale, 57344.0f / go1.history.back());
  }
}

// The first module's backward ends the pass even when it quantizes no dy (only a bias gradient
// requested, or nothing): the other module's GRAD_OUTPUTs are updated then.
TEST(LnMlpBookkeeping, FirstModuleBackwardFinishesThePassEvenWhenItQuantizesNothing) {
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant ? "first module's backward: dfc2_bias only" : "first module's backward: grads NULL");
    lt::ContextPtr ctx = lt::make_cpu_context();
    lt::RecipePtr recipe = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 16);
    const te_layernorm_mlp_options o = options(kHidden, kFfn, TE_ACTIVATION_GELU, TE_DTYPE_F32, TE_NORM_LAYERNORM, 0, 1);
    lt::MlpPtr first = lt::make_mlp(ctx.get(), o), second = lt::make_mlp(ctx.get(), o);
    Data d(TE_DTYPE_F32, TE_ACTIVATION_GELU, TE_NORM_LAYERNORM, false, true, 4500);
    HostTensor y = d.x_like();
    te_layernorm_mlp_forward_args a = d.args();
    te_layernorm_mlp_backward_ctx *b1 = nullptr, *b2 = nullptr;
    {
      lt::AutocastScope scope(ctx.get(), recipe.get());
      ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), first.get(), &a, y.get(), &b1));
      ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), second.get(), &a, y.get(), &b2));
    }
    lt::MlpBwdPtr h1(b1), h2(b2);
    Grads g(d);
    te_layernorm_mlp_grads all = g.all(d);
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), b2, d.dy.get(), &all, nullptr));
    EXPECT_EQ(lt::scaling_state(ctx.get(), second.get(), TE_MLP_FC2, TE_ROLE_GRAD_OUTPUT).info.scale, 1.0f);
    const te_context_stats before = lt::context_stats(ctx.get());
    te_layernorm_mlp_grads bias_only;
    ASSERT_TE_OK(te_layernorm_mlp_grads_init(&bias_only));
    bias_only.dfc2_bias = g.db2.get();
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), b1, d.dy.get(), variant ? &bias_only : nullptr, nullptr));
    EXPECT_EQ(lt::context_stats(ctx.get()).bucket_updates - before.bucket_updates, 1u)
        << "the pass's backward bucket was not updated";
    EXPECT_EQ(lt::scaling_state(ctx.get(), second.get(), TE_MLP_FC2, TE_ROLE_GRAD_OUTPUT).info.scale,
              57344.0f / lt::amax_of(d.dy.values()));
  }
}

// Several modules in a scope (two MLPs and a LayerNormLinear): one bucket update per pass.
TEST(LnMlpBookkeeping, OneBucketUpdatePerPassWithEveryModulesStates) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 16);
  const te_layernorm_mlp_options o = options(kHidden, kFfn, TE_ACTIVATION_SWIGLU, TE_DTYPE_F32, TE_NORM_RMSNORM, 0, 0);
  lt::MlpPtr a = lt::make_mlp(ctx.get(), o), b = lt::make_mlp(ctx.get(), o);
  te_layernorm_linear_options lo;
  ASSERT_TE_OK(te_layernorm_linear_options_init(&lo));
  lo.in_features = kHidden;
  lo.out_features = kHidden;
  lo.activation_dtype = TE_DTYPE_F32;
  lo.normalization = TE_NORM_RMSNORM;
  lo.bias = 0;
  lt::LnLinearPtr qkv = lt::make_ln_linear(ctx.get(), lo);
  Data d(TE_DTYPE_F32, TE_ACTIVATION_SWIGLU, TE_NORM_RMSNORM, false, false, 4600);
  HostTensor w_sq = lt::random_tensor(TE_DTYPE_F32, {kHidden, kHidden}, -0.1f, 0.1f, 4601);
  HostTensor y = d.x_like();
  te_layernorm_mlp_forward_args fa = d.args();
  te_layernorm_linear_forward_args la;
  ASSERT_TE_OK(te_layernorm_linear_forward_args_init(&la));
  la.input = d.x.get();
  la.ln_weight = d.gamma.get();
  la.weight = w_sq.get();
  te_layernorm_mlp_backward_ctx *ba = nullptr, *bb = nullptr;
  te_layernorm_linear_backward_ctx *bq = nullptr;
  const te_context_stats st0 = lt::context_stats(ctx.get());
  {
    lt::AutocastScope scope(ctx.get(), recipe.get());
    ASSERT_TE_OK(te_layernorm_linear_forward(ctx.get(), qkv.get(), &la, y.get(), &bq));
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), a.get(), &fa, y.get(), &ba));
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), b.get(), &fa, y.get(), &bb));
  }
  lt::MlpBwdPtr ha(ba), hb(bb);
  lt::LnLinearBwdPtr hq(bq);
  const te_context_stats st1 = lt::context_stats(ctx.get());
  EXPECT_EQ(st1.bucket_updates - st0.bucket_updates, 1u);
  EXPECT_EQ(st1.states_updated - st0.states_updated, 10u) << "2 MLPs x 4 + LayerNormLinear x 2";
  Grads g(d);
  te_layernorm_mlp_grads gr = g.all(d);
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), bb, d.dy.get(), &gr, nullptr));
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), ba, d.dy.get(), &gr, nullptr));
  EXPECT_EQ(lt::context_stats(ctx.get()).bucket_updates, st1.bucket_updates) << "the first module is qkv";
  HostTensor dx = d.x_like();
  te_layernorm_linear_grads lg;
  ASSERT_TE_OK(te_layernorm_linear_grads_init(&lg));
  lg.dx = dx.get();
  ASSERT_TE_OK(te_layernorm_linear_backward(ctx.get(), bq, d.dy.get(), &lg, nullptr));
  const te_context_stats st2 = lt::context_stats(ctx.get());
  EXPECT_EQ(st2.bucket_updates - st1.bucket_updates, 1u);
  EXPECT_EQ(st2.states_updated - st1.states_updated, 5u);
}

// ---- 4. state --------------------------------------------------------------------------------------

void exercise(te_context *ctx, te_layernorm_mlp *m, te_activation act, const te_recipe *r, int steps, uint32_t seed) {
  for (int k = 0; k < steps; ++k) {
    Data d(TE_DTYPE_BF16, act, TE_NORM_LAYERNORM, false, true, seed + 10 * k);
    HostTensor y = d.x_like();
    te_layernorm_mlp_forward_args a = d.args();
    te_layernorm_mlp_backward_ctx *raw = nullptr;
    {
      lt::AutocastScope scope(ctx, r);
      ASSERT_TE_OK(te_layernorm_mlp_forward(ctx, m, &a, y.get(), &raw));
    }
    lt::MlpBwdPtr bwd(raw);
    Grads g(d);
    te_layernorm_mlp_grads gr = g.all(d);
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx, raw, d.dy.get(), &gr, nullptr));
  }
}

TEST(LnMlpState, FreshModuleAndRoundTrip) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 16);
  const te_layernorm_mlp_options o = options(kHidden, kFfn, TE_ACTIVATION_GEGLU, TE_DTYPE_BF16, TE_NORM_LAYERNORM, 0, 1);
  lt::MlpPtr a = lt::make_mlp(ctx.get(), o);
  for (te_mlp_gemm gemm : {TE_MLP_FC1, TE_MLP_FC2})
    for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT}) {
      const lt::ScalingSnapshot s = lt::scaling_state(ctx.get(), a.get(), gemm, role);
      EXPECT_EQ(s.info.scale, 1.0f);
      EXPECT_EQ(s.info.amax_history_len, 0);
    }
  exercise(ctx.get(), a.get(), TE_ACTIVATION_GEGLU, recipe.get(), 3, 4700);
  size_t size = 0;
  ASSERT_TE_OK(te_layernorm_mlp_state_save(ctx.get(), a.get(), nullptr, 0, &size));
  std::vector<unsigned char> buf(size + 8, 0xEE);
  size_t written = 0;
  ASSERT_TE_OK(te_layernorm_mlp_state_save(ctx.get(), a.get(), buf.data(), buf.size(), &written));
  EXPECT_EQ(written, size);
  for (size_t i = size; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xEE);
  EXPECT_EQ(std::memcmp(buf.data(), "TEMP", 4), 0);
  lt::ContextPtr ctx2 = lt::make_cpu_context();
  lt::MlpPtr b = lt::make_mlp(ctx2.get(), o);
  ASSERT_TE_OK(te_layernorm_mlp_state_load(ctx2.get(), b.get(), buf.data(), size));
  for (te_mlp_gemm gemm : {TE_MLP_FC1, TE_MLP_FC2})
    for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT}) {
      const lt::ScalingSnapshot sa = lt::scaling_state(ctx.get(), a.get(), gemm, role);
      EXPECT_EQ(sa.info.amax_history_len, 16);
      EXPECT_TRUE(lt::SameState(sa, lt::scaling_state(ctx2.get(), b.get(), gemm, role)));
    }
  EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx2.get(), b.get()), std::vector<unsigned char>(buf.begin(), buf.begin() + size)));
}

struct Trainer {
  te_activation act;
  lt::ContextPtr ctx;
  lt::RecipePtr recipe;
  lt::MlpPtr m;
  std::vector<float> w1, b1, w2, b2, gamma, beta;
  std::vector<HostTensor> ys;
  explicit Trainer(te_activation a) : act(a) { restart(); }
  void restart() {
    m.reset();
    ctx = lt::make_cpu_context();
    recipe = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 16);
    m = lt::make_mlp(ctx.get(), options(kHidden, kFfn, act, TE_DTYPE_BF16, TE_NORM_LAYERNORM, 0, 1));
  }
  void init() {
    const int64_t f1 = gated(act) ? 2 * kFfn : kFfn;
    w1 = lt::random_tensor(TE_DTYPE_F32, {f1, kHidden}, -0.15f, 0.15f, 4800).values_f32();
    b1 = lt::random_tensor(TE_DTYPE_F32, {f1}, -0.1f, 0.1f, 4801).values_f32();
    w2 = lt::random_tensor(TE_DTYPE_F32, {kHidden, kFfn}, -0.15f, 0.15f, 4802).values_f32();
    b2 = lt::random_tensor(TE_DTYPE_F32, {kHidden}, -0.1f, 0.1f, 4803).values_f32();
    gamma = lt::random_tensor(TE_DTYPE_F32, {kHidden}, 0.8f, 1.2f, 4804).values_f32();
    beta = lt::random_tensor(TE_DTYPE_F32, {kHidden}, -0.1f, 0.1f, 4805).values_f32();
  }
  static void load(HostTensor &t, const std::vector<float> &v) {
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v[static_cast<size_t>(i)]);
  }
  static void sgd(std::vector<float> &p, const HostTensor &g, float lr) {
    for (int64_t i = 0; i < g.numel(); ++i) p[static_cast<size_t>(i)] -= lr * static_cast<float>(g.at(i));
  }
  void step(int k) {
    Data d(TE_DTYPE_BF16, act, TE_NORM_LAYERNORM, false, true, 5000 + 10 * k);
    load(d.w1, w1);
    load(d.b1, b1);
    load(d.w2, w2);
    load(d.b2, b2);
    load(d.gamma, gamma);
    load(d.beta, beta);
    const HostTensor target = lt::random_tensor(TE_DTYPE_F32, {kTokens, kHidden}, -1, 1, 6000 + k);
    HostTensor y = d.x_like();
    te_layernorm_mlp_forward_args a = d.args();
    te_layernorm_mlp_backward_ctx *raw = nullptr;
    {
      lt::AutocastScope scope(ctx.get(), recipe.get());
      ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), m.get(), &a, y.get(), &raw));
    }
    lt::MlpBwdPtr bwd(raw);
    const float n = static_cast<float>(y.numel());
    for (int64_t i = 0; i < y.numel(); ++i) d.dy.set(i, 2.0f * static_cast<float>(y.at(i) - target.at(i)) / n);
    Grads g(d);
    te_layernorm_mlp_grads gr = g.all(d);
    te_linear_backward_args once;
    ASSERT_TE_OK(te_linear_backward_args_init(&once));
    once.flags = TE_BACKWARD_ONCE;
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), raw, d.dy.get(), &gr, &once));
    sgd(w1, g.dw1, 2.0f);
    sgd(b1, g.db1, 2.0f);
    sgd(w2, g.dw2, 2.0f);
    sgd(b2, g.db2, 2.0f);
    sgd(gamma, g.dgamma, 2.0f);
    sgd(beta, g.dbeta, 2.0f);
    ys.push_back(y);
  }
};

class LnMlpResume : public ::testing::TestWithParam<te_activation> {};

TEST_P(LnMlpResume, ResumedTrainingReproducesTheUninterruptedRunBitwise) {
  const int N = 5, K = 2;
  Trainer full(GetParam());
  full.init();
  for (int k = 0; k < N; ++k) full.step(k);
  ASSERT_FALSE(HasFatalFailure());
  Trainer part(GetParam());
  part.init();
  for (int k = 0; k < K; ++k) part.step(k);
  const std::vector<unsigned char> state = lt::module_state(part.ctx.get(), part.m.get());
  part.restart();
  ASSERT_TE_OK(te_layernorm_mlp_state_load(part.ctx.get(), part.m.get(), state.data(), state.size()));
  for (int k = K; k < N; ++k) part.step(k);
  ASSERT_FALSE(HasFatalFailure());
  for (int k = K; k < N; ++k) EXPECT_TRUE(same(part.ys[static_cast<size_t>(k)], full.ys[static_cast<size_t>(k)])) << "y of step " << k;
  EXPECT_EQ(part.w1, full.w1);
  EXPECT_EQ(part.w2, full.w2);
  EXPECT_EQ(part.gamma, full.gamma);
  EXPECT_TRUE(lt::SameBytes(lt::module_state(part.ctx.get(), part.m.get()), lt::module_state(full.ctx.get(), full.m.get())));
  Trainer cold(GetParam());
  cold.init();
  for (int k = 0; k < K; ++k) cold.step(k);
  cold.restart();
  cold.step(K);
  EXPECT_FALSE(same(cold.ys.back(), full.ys[K])) << "a restart without the state gives the same y: the test proves nothing";
}

INSTANTIATE_TEST_SUITE_P(Activations, LnMlpResume, ::testing::Values(TE_ACTIVATION_GELU, TE_ACTIVATION_SWIGLU),
                         [](const ::testing::TestParamInfo<te_activation> &i) { return std::string(act_name(i.param)); });

TEST(LnMlpState, LoadRejectsBadBuffersAndChangesNothing) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 16);
  const te_layernorm_mlp_options o = options(kHidden, kFfn, TE_ACTIVATION_GELU, TE_DTYPE_BF16, TE_NORM_LAYERNORM, 0, 1);
  lt::MlpPtr src = lt::make_mlp(ctx.get(), o), m = lt::make_mlp(ctx.get(), o);
  exercise(ctx.get(), src.get(), TE_ACTIVATION_GELU, recipe.get(), 2, 4900);
  exercise(ctx.get(), m.get(), TE_ACTIVATION_GELU, recipe.get(), 1, 4910);
  const std::vector<unsigned char> good = lt::module_state(ctx.get(), src.get());
  const std::vector<unsigned char> before = lt::module_state(ctx.get(), m.get());
  auto expect_rejected = [&](te_layernorm_mlp *target, const std::vector<unsigned char> &buf, size_t size,
                             const char *what) {
    SCOPED_TRACE(what);
    const std::vector<unsigned char> target_before = lt::module_state(ctx.get(), target);
    EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_load(ctx.get(), target, buf.data(), size), TE_ERROR_INVALID_ARGUMENT,
                            "te_layernorm_mlp_state_load", nullptr));
    EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx.get(), target), target_before)) << "state changed by a rejected load";
  };
  expect_rejected(m.get(), good, good.size() - 1, "truncated by one byte");
  expect_rejected(m.get(), good, good.size() / 2, "truncated to half");
  expect_rejected(m.get(), good, 0, "empty");
  std::vector<unsigned char> longer = good;
  longer.push_back(7);
  expect_rejected(m.get(), longer, longer.size(), "trailing byte");
  std::vector<unsigned char> magic = good;
  magic[3] = 'X';
  expect_rejected(m.get(), magic, magic.size(), "another magic");
  std::vector<unsigned char> version = good;
  version[4] ^= 3;
  expect_rejected(m.get(), version, version.size(), "another version");
  // The last state (fc2 grad_output) corrupted: everything before it parsed fine, nothing may
  // have been applied.
  std::vector<unsigned char> tail = good;
  const float nan = NAN;
  std::memcpy(tail.data() + tail.size() - 4, &nan, 4);
  expect_rejected(m.get(), tail, tail.size(), "a NaN in the last state's history");
  // Modules of other shapes: hidden, ffn, and the gated form (fc1's weight has 2 ffn rows).
  lt::MlpPtr wide = lt::make_mlp(ctx.get(), options(kHidden + 16, kFfn, TE_ACTIVATION_GELU, TE_DTYPE_BF16, TE_NORM_LAYERNORM, 0, 1));
  lt::MlpPtr longer_ffn = lt::make_mlp(ctx.get(), options(kHidden, kFfn + 16, TE_ACTIVATION_GELU, TE_DTYPE_BF16, TE_NORM_LAYERNORM, 0, 1));
  lt::MlpPtr swiglu = lt::make_mlp(ctx.get(), options(kHidden, kFfn, TE_ACTIVATION_SWIGLU, TE_DTYPE_BF16, TE_NORM_LAYERNORM, 0, 1));
  expect_rejected(wide.get(), good, good.size(), "hidden_size differs");
  expect_rejected(longer_ffn.get(), good, good.size(), "ffn_hidden_size differs");
  expect_rejected(swiglu.get(), good, good.size(), "a gated module (fc1 weight [2 ffn, hidden]) loading a GELU one's");
  // Other modules' states.
  te_layernorm_linear_options lo;
  ASSERT_TE_OK(te_layernorm_linear_options_init(&lo));
  lo.in_features = kHidden;
  lo.out_features = kFfn;
  lt::LnLinearPtr lnl = lt::make_ln_linear(ctx.get(), lo);
  const std::vector<unsigned char> lnl_state = lt::module_state(ctx.get(), lnl.get());
  expect_rejected(m.get(), lnl_state, lnl_state.size(), "a te_layernorm_linear state");
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kHidden, kFfn, 1, TE_DTYPE_BF16);
  const std::vector<unsigned char> lin_state = lt::saved_state(ctx.get(), lin.get());
  expect_rejected(m.get(), lin_state, lin_state.size(), "a te_linear state");
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_load(ctx.get(), m.get(), nullptr, 4), TE_ERROR_INVALID_ARGUMENT,
                          "te_layernorm_mlp_state_load", "buf"));
  EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx.get(), m.get()), before));
  ASSERT_TE_OK(te_layernorm_mlp_state_load(ctx.get(), m.get(), good.data(), good.size()));
  EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx.get(), m.get()), good));
  exercise(ctx.get(), m.get(), TE_ACTIVATION_GELU, recipe.get(), 1, 4920);
}

TEST(LnMlpState, LoadWhileStatesAreHeldIsInvalidState) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 16);
  const te_layernorm_mlp_options o = options(kHidden, kFfn, TE_ACTIVATION_RELU, TE_DTYPE_BF16, TE_NORM_LAYERNORM, 0, 1);
  lt::MlpPtr m = lt::make_mlp(ctx.get(), o), first = lt::make_mlp(ctx.get(), o);
  exercise(ctx.get(), m.get(), TE_ACTIVATION_RELU, recipe.get(), 1, 5100);
  const std::vector<unsigned char> good = lt::module_state(ctx.get(), m.get());
  Data d(TE_DTYPE_BF16, TE_ACTIVATION_RELU, TE_NORM_LAYERNORM, false, true, 5101);
  HostTensor y = d.x_like();
  te_layernorm_mlp_forward_args a = d.args();
  auto expect_held = [&](const char *when) {
    SCOPED_TRACE(when);
    const std::vector<unsigned char> before = lt::module_state(ctx.get(), m.get());
    EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_load(ctx.get(), m.get(), good.data(), good.size()),
                            TE_ERROR_INVALID_STATE, "te_layernorm_mlp_state_load", "m"));
    EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx.get(), m.get()), before));
  };
  te_layernorm_mlp_backward_ctx *b1 = nullptr, *b2 = nullptr;
  {
    lt::AutocastScope scope(ctx.get(), recipe.get());
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), first.get(), &a, y.get(), &b1));
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), m.get(), &a, y.get(), &b2));
    expect_held("inside the scope that used it");
  }
  lt::MlpBwdPtr h1(b1), h2(b2);
  Grads g(d);
  te_layernorm_mlp_grads gr = g.all(d);
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), b2, d.dy.get(), &gr, nullptr));
  expect_held("pending backward pass");
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), b1, d.dy.get(), &gr, nullptr));
  EXPECT_TE_OK(te_layernorm_mlp_state_load(ctx.get(), m.get(), good.data(), good.size()));
  EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx.get(), m.get()), good));
}

// ---- 5. bad input -------------------------------------------------------------------------------

template <class E>
void poke_enum(E *field, int32_t v) {
  static_assert(sizeof(E) == sizeof(int32_t), "enums are int-sized on the platforms libte targets");
  std::memcpy(field, &v, sizeof v);
}

constexpr int64_t kBadT = 32, kBadH = 32, kBadF = 16;
constexpr te_dtype kAct = TE_DTYPE_BF16;

class LnMlpBadInput : public ::testing::Test {
 protected:
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 16);
  lt::MlpPtr m = lt::make_mlp(ctx.get(), options(kBadH, kBadF, TE_ACTIVATION_GELU, kAct, TE_NORM_LAYERNORM, 0, 1));
  lt::MlpPtr gated_m = lt::make_mlp(ctx.get(), options(kBadH, kBadF, TE_ACTIVATION_SWIGLU, kAct, TE_NORM_LAYERNORM, 0, 1));
  lt::MlpPtr nobias = lt::make_mlp(ctx.get(), options(kBadH, kBadF, TE_ACTIVATION_GELU, kAct, TE_NORM_LAYERNORM, 0, 0));
  lt::MlpPtr rms = lt::make_mlp(ctx.get(), options(kBadH, kBadF, TE_ACTIVATION_GELU, kAct, TE_NORM_RMSNORM, 0, 1));
  lt::MlpPtr fused = lt::make_mlp(ctx.get(), options(kBadH, kBadF, TE_ACTIVATION_GELU, kAct, TE_NORM_LAYERNORM, 0, 1, 1));
  Data d{kAct, TE_ACTIVATION_GELU, TE_NORM_LAYERNORM, false, true, 5200, kBadH, kBadF, {2, kBadT / 2}};
  HostTensor y = d.x_like(), ln_out = d.x_like();
  Grads g{d};
  std::vector<const HostTensor *> watch_;

  std::vector<te_layernorm_mlp *> modules() { return {m.get(), gated_m.get(), nobias.get(), rms.get(), fused.get()}; }
  LnMlpBadInput() {
    const te_activation acts[] = {TE_ACTIVATION_GELU, TE_ACTIVATION_SWIGLU, TE_ACTIVATION_GELU, TE_ACTIVATION_GELU,
                                  TE_ACTIVATION_GELU};
    const te_norm_kind kinds[] = {TE_NORM_LAYERNORM, TE_NORM_LAYERNORM, TE_NORM_LAYERNORM, TE_NORM_RMSNORM,
                                  TE_NORM_LAYERNORM};
    const bool biases[] = {true, true, false, true, true};
    for (int i = 0; i < 5; ++i) {
      Data dd(kAct, acts[i], kinds[i], false, biases[i], 5210 + i, kBadH, kBadF, {2, kBadT / 2});
      HostTensor yy = dd.x_like();
      te_layernorm_mlp_forward_args a = dd.args();
      te_layernorm_mlp_backward_ctx *raw = nullptr;
      {
        lt::AutocastScope scope(ctx.get(), recipe.get());
        EXPECT_TE_OK(te_layernorm_mlp_forward(ctx.get(), modules()[static_cast<size_t>(i)], &a, yy.get(), &raw));
      }
      lt::MlpBwdPtr bwd(raw);
      Grads gg(dd, i == 4 ? TE_DTYPE_F32 : kAct);
      te_layernorm_mlp_grads gr = gg.all(dd);
      EXPECT_TE_OK(te_layernorm_mlp_backward(ctx.get(), raw, dd.dy.get(), &gr, nullptr));
    }
  }
  std::vector<unsigned char> all_states() {
    std::vector<unsigned char> all;
    for (te_layernorm_mlp *mod : modules()) {
      const std::vector<unsigned char> s = lt::module_state(ctx.get(), mod);
      all.insert(all.end(), s.begin(), s.end());
    }
    return all;
  }
  std::vector<unsigned char> outputs() const {
    std::vector<unsigned char> all = y.bytes;
    all.insert(all.end(), ln_out.bytes.begin(), ln_out.bytes.end());
    for (const HostTensor *t : g.list()) all.insert(all.end(), t->bytes.begin(), t->bytes.end());
    for (const HostTensor *t : watch_) all.insert(all.end(), t->bytes.begin(), t->bytes.end());
    return all;
  }
  void expect_forward_fails(te_layernorm_mlp *mod, const te_layernorm_mlp_forward_args *a, te_tensor *yy,
                            te_status want, const char *arg, bool also_hp = true, te_context *c = nullptr,
                            bool null_residuals = false) {
    if (!c) c = ctx.get();
    for (int fp8 = also_hp ? 0 : 1; fp8 < 2; ++fp8) {
      SCOPED_TRACE(fp8 ? "inside an FP8 scope" : "outside any scope");
      const std::vector<unsigned char> before = all_states(), outputs0 = outputs();
      {
        std::unique_ptr<lt::AutocastScope> scope;
        if (fp8) scope.reset(new lt::AutocastScope(ctx.get(), recipe.get()));
        te_layernorm_mlp_residuals res;
        std::memset(&res, 0x3C, sizeof res);
        res.struct_size = sizeof res;
        const te_layernorm_mlp_residuals res0 = res;
        EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_compute(c, mod, a, yy, null_residuals ? nullptr : &res), want,
                                "te_layernorm_mlp_forward_compute", arg));
        EXPECT_EQ(0, std::memcmp(&res, &res0, sizeof res)) << "residuals written on failure";
        if (!null_residuals) {
          te_layernorm_mlp_backward_ctx *const sentinel = reinterpret_cast<te_layernorm_mlp_backward_ctx *>(0x5678);
          te_layernorm_mlp_backward_ctx *out = sentinel;
          EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward(c, mod, a, yy, &out), want, "te_layernorm_mlp_forward", arg));
          EXPECT_EQ(out, sentinel) << "out written on failure";
        }
        EXPECT_TRUE(outputs() == outputs0) << "an output written on failure";
        EXPECT_TRUE(lt::SameBytes(all_states(), before)) << "state changed inside the scope";
      }
      EXPECT_TRUE(lt::SameBytes(all_states(), before)) << "state changed at the scope end";
    }
  }
  void expect_backward_fails(te_context *c, te_layernorm_mlp_backward_ctx *bwd, const te_tensor *dy,
                             const te_layernorm_mlp_grads *gr, const te_linear_backward_args *a, const char *arg,
                             te_status want = TE_ERROR_INVALID_ARGUMENT) {
    const std::vector<unsigned char> before = all_states(), outputs0 = outputs();
    EXPECT_TRUE(lt::IsError(te_layernorm_mlp_backward(c, bwd, dy, gr, a), want, "te_layernorm_mlp_backward", arg));
    EXPECT_TRUE(outputs() == outputs0) << "a gradient written on failure";
    EXPECT_TRUE(lt::SameBytes(all_states(), before)) << "state changed by a failed backward";
  }
};

TEST_F(LnMlpBadInput, InitFunctionsRejectNullAndFillDefaults) {
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_options_init(nullptr), TE_ERROR_INVALID_ARGUMENT, "te_layernorm_mlp_options_init", "opts"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_args_init(nullptr), TE_ERROR_INVALID_ARGUMENT,
                          "te_layernorm_mlp_forward_args_init", "args"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_grads_init(nullptr), TE_ERROR_INVALID_ARGUMENT, "te_layernorm_mlp_grads_init", "grads"));
  te_layernorm_mlp_options o;
  std::memset(&o, 0x5A, sizeof o);
  ASSERT_TE_OK(te_layernorm_mlp_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.hidden_size, 0);
  EXPECT_EQ(o.ffn_hidden_size, 0);
  EXPECT_EQ(o.bias, 1);
  EXPECT_EQ(o.activation, TE_ACTIVATION_GELU);
  EXPECT_EQ(o.activation_dtype, TE_DTYPE_BF16);
  EXPECT_EQ(o.fuse_wgrad_accumulation, 0);
  EXPECT_EQ(o.normalization, TE_NORM_LAYERNORM);
  EXPECT_EQ(o.eps, 1e-5f);
  EXPECT_EQ(o.zero_centered_gamma, 0);
  te_layernorm_mlp_forward_args a;
  std::memset(&a, 0x5A, sizeof a);
  ASSERT_TE_OK(te_layernorm_mlp_forward_args_init(&a));
  EXPECT_EQ(a.struct_size, sizeof a);
  EXPECT_TRUE(!a.input && !a.ln_weight && !a.ln_bias && !a.fc1_weight && !a.fc1_bias && !a.fc2_weight && !a.fc2_bias &&
              !a.ln_out && a.weight_unchanged == 0);
  te_layernorm_mlp_grads gr;
  std::memset(&gr, 0x5A, sizeof gr);
  ASSERT_TE_OK(te_layernorm_mlp_grads_init(&gr));
  EXPECT_EQ(gr.struct_size, sizeof gr);
  EXPECT_TRUE(!gr.dx && !gr.dln_weight && !gr.dln_bias && !gr.dfc1_weight && !gr.dfc1_bias && !gr.dfc2_weight &&
              !gr.dfc2_bias);
}

TEST_F(LnMlpBadInput, Create) {
  const te_layernorm_mlp_options good = options(kBadH, kBadF, TE_ACTIVATION_GELU, kAct, TE_NORM_LAYERNORM, 0, 1);
  te_layernorm_mlp *const sentinel = reinterpret_cast<te_layernorm_mlp *>(0x9abc);
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kBadH, kBadF, 1, kAct);
  struct Case {
    const char *what, *arg;
    std::function<te_status(te_layernorm_mlp **)> call;
  };
  auto with = [&](std::function<void(te_layernorm_mlp_options &)> edit) {
    return [this, good, edit](te_layernorm_mlp **out) {
      te_layernorm_mlp_options o = good;
      edit(o);
      return te_layernorm_mlp_create(out, ctx.get(), &o);
    };
  };
  const Case cases[] = {
      {"NULL out", "out", [&](te_layernorm_mlp **) { return te_layernorm_mlp_create(nullptr, ctx.get(), &good); }},
      {"NULL ctx", "ctx", [&](te_layernorm_mlp **o) { return te_layernorm_mlp_create(o, nullptr, &good); }},
      {"te_linear as ctx", "ctx",
       [&](te_layernorm_mlp **o) { return te_layernorm_mlp_create(o, reinterpret_cast<te_context *>(lin.get()), &good); }},
      {"NULL opts", "opts", [&](te_layernorm_mlp **o) { return te_layernorm_mlp_create(o, ctx.get(), nullptr); }},
      {"struct_size 0", "opts", with([](te_layernorm_mlp_options &o) { o.struct_size = 0; })},
      {"struct_size too small", "opts", with([](te_layernorm_mlp_options &o) { o.struct_size = sizeof o - 1; })},
      {"hidden 0", "opts->hidden_size", with([](te_layernorm_mlp_options &o) { o.hidden_size = 0; })},
      {"hidden -1", "opts->hidden_size", with([](te_layernorm_mlp_options &o) { o.hidden_size = -1; })},
      {"ffn 0", "opts->ffn_hidden_size", with([](te_layernorm_mlp_options &o) { o.ffn_hidden_size = 0; })},
      {"ffn -16", "opts->ffn_hidden_size", with([](te_layernorm_mlp_options &o) { o.ffn_hidden_size = -16; })},
      {"hidden * ffn beyond 2^60", "opts->hidden_size", with([](te_layernorm_mlp_options &o) {
         o.hidden_size = int64_t(1) << 31;
         o.ffn_hidden_size = int64_t(1) << 30;
       })},
      {"hidden * 2 ffn beyond 2^60 (gated)", "opts->hidden_size", with([](te_layernorm_mlp_options &o) {
         o.activation = TE_ACTIVATION_SWIGLU;
         o.hidden_size = int64_t(1) << 30;
         o.ffn_hidden_size = int64_t(1) << 30;
       })},
      {"ffn INT64_MAX", "opts->", with([](te_layernorm_mlp_options &o) { o.ffn_hidden_size = INT64_MAX; })},
      {"activation -1", "opts->activation", with([](te_layernorm_mlp_options &o) { poke_enum(&o.activation, -1); })},
      {"activation 5", "opts->activation", with([](te_layernorm_mlp_options &o) { poke_enum(&o.activation, 5); })},
      {"activation INT32_MAX", "opts->activation",
       with([](te_layernorm_mlp_options &o) { poke_enum(&o.activation, INT32_MAX); })},
      {"bias 2", "opts->bias", with([](te_layernorm_mlp_options &o) { o.bias = 2; })},
      {"fuse 2", "opts->fuse_wgrad_accumulation", with([](te_layernorm_mlp_options &o) { o.fuse_wgrad_accumulation = 2; })},
      {"activation dtype E5M2", "opts->activation_dtype",
       with([](te_layernorm_mlp_options &o) { o.activation_dtype = TE_DTYPE_E5M2; })},
      {"activation dtype -3", "opts->activation_dtype",
       with([](te_layernorm_mlp_options &o) { poke_enum(&o.activation_dtype, -3); })},
      {"normalization 2", "opts->normalization", with([](te_layernorm_mlp_options &o) { poke_enum(&o.normalization, 2); })},
      {"eps 0", "opts->eps", with([](te_layernorm_mlp_options &o) { o.eps = 0.0f; })},
      {"eps -1", "opts->eps", with([](te_layernorm_mlp_options &o) { o.eps = -1.0f; })},
      {"eps NaN", "opts->eps", with([](te_layernorm_mlp_options &o) { o.eps = NAN; })},
      {"eps inf", "opts->eps", with([](te_layernorm_mlp_options &o) { o.eps = INFINITY; })},
      {"zero_centered_gamma 2", "opts->zero_centered_gamma",
       with([](te_layernorm_mlp_options &o) { o.zero_centered_gamma = 2; })},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    te_layernorm_mlp *out = sentinel;
    te_status st = c.call(&out);
    if (std::string(c.arg) == "opts->")  // either size may be named
      EXPECT_EQ(st, TE_ERROR_INVALID_ARGUMENT) << te_last_error();
    else
      EXPECT_TRUE(lt::IsError(st, TE_ERROR_INVALID_ARGUMENT, "te_layernorm_mlp_create", c.arg));
    EXPECT_EQ(out, sentinel) << "out written on failure";
  }
  for (te_activation act : kAllActivations) {
    SCOPED_TRACE(act_name(act));
    te_layernorm_mlp_options o = good;
    o.activation = act;
    te_layernorm_mlp *out = nullptr;
    EXPECT_TE_OK(te_layernorm_mlp_create(&out, ctx.get(), &o)) << "every te_activation must be supported";
    te_layernorm_mlp_destroy(out);
  }
}

TEST_F(LnMlpBadInput, DestroyIgnoresWhatIsNotALiveModule) {
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kBadH, kBadF, 1, kAct);
  te_layernorm_linear_options lo;
  ASSERT_TE_OK(te_layernorm_linear_options_init(&lo));
  lo.in_features = kBadH;
  lo.out_features = kBadF;
  lt::LnLinearPtr lnl = lt::make_ln_linear(ctx.get(), lo);
  te_layernorm_mlp_destroy(nullptr);
  te_layernorm_mlp_destroy(reinterpret_cast<te_layernorm_mlp *>(lin.get()));
  te_layernorm_mlp_destroy(reinterpret_cast<te_layernorm_mlp *>(lnl.get()));
  te_layernorm_mlp *gone = nullptr;
  const te_layernorm_mlp_options o = options(kBadH, kBadF, TE_ACTIVATION_GELU, kAct, TE_NORM_LAYERNORM, 0, 1);
  ASSERT_TE_OK(te_layernorm_mlp_create(&gone, ctx.get(), &o));
  te_layernorm_mlp_destroy(gone);
  te_layernorm_mlp_destroy(gone);
  EXPECT_FALSE(lt::saved_state(ctx.get(), lin.get()).empty());
  EXPECT_FALSE(lt::module_state(ctx.get(), lnl.get()).empty());
  te_layernorm_mlp_residuals zero = new_residuals();
  te_layernorm_mlp_residuals_release(&zero);
  te_layernorm_mlp_residuals garbage = new_residuals();
  int not_a_handle = 0;
  garbage.internal = &not_a_handle;
  te_layernorm_mlp_residuals_release(&garbage);
  te_layernorm_mlp_backward_ctx_destroy(reinterpret_cast<te_layernorm_mlp_backward_ctx *>(lnl.get()));
  EXPECT_FALSE(lt::module_state(ctx.get(), lnl.get()).empty());
}

TEST_F(LnMlpBadInput, ForwardHandlesAndRequiredPointers) {
  te_layernorm_mlp_forward_args a = d.args(ln_out.get());
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kBadH, kBadF, 1, kAct);
  te_layernorm_linear_options lo;
  ASSERT_TE_OK(te_layernorm_linear_options_init(&lo));
  lo.in_features = kBadH;
  lo.out_features = kBadF;
  lt::LnLinearPtr lnl = lt::make_ln_linear(ctx.get(), lo);
  te_layernorm_mlp *gone = nullptr;
  const te_layernorm_mlp_options o = options(kBadH, kBadF, TE_ACTIVATION_GELU, kAct, TE_NORM_LAYERNORM, 0, 1);
  ASSERT_TE_OK(te_layernorm_mlp_create(&gone, ctx.get(), &o));
  te_layernorm_mlp_destroy(gone);
  lt::ContextPtr ctx2 = lt::make_cpu_context();
  lt::MlpPtr foreign = lt::make_mlp(ctx2.get(), o);
  for (te_context *bad_ctx : {static_cast<te_context *>(nullptr), reinterpret_cast<te_context *>(recipe.get())}) {
    te_layernorm_mlp_residuals res = new_residuals();
    EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_compute(bad_ctx, m.get(), &a, y.get(), &res),
                            TE_ERROR_INVALID_ARGUMENT, "te_layernorm_mlp_forward_compute", "ctx"));
    te_layernorm_mlp_backward_ctx *out = nullptr;
    EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward(bad_ctx, m.get(), &a, y.get(), &out), TE_ERROR_INVALID_ARGUMENT,
                            "te_layernorm_mlp_forward", "ctx"));
    EXPECT_EQ(out, nullptr);
  }
  expect_forward_fails(nullptr, &a, y.get(), TE_ERROR_INVALID_ARGUMENT, "m");
  expect_forward_fails(reinterpret_cast<te_layernorm_mlp *>(lin.get()), &a, y.get(), TE_ERROR_INVALID_ARGUMENT, "m");
  expect_forward_fails(reinterpret_cast<te_layernorm_mlp *>(lnl.get()), &a, y.get(), TE_ERROR_INVALID_ARGUMENT, "m");
  expect_forward_fails(gone, &a, y.get(), TE_ERROR_INVALID_ARGUMENT, "m");
  expect_forward_fails(foreign.get(), &a, y.get(), TE_ERROR_INVALID_ARGUMENT, "m");
  expect_forward_fails(m.get(), nullptr, y.get(), TE_ERROR_INVALID_ARGUMENT, "args");
  expect_forward_fails(m.get(), &a, nullptr, TE_ERROR_INVALID_ARGUMENT, "y");
  expect_forward_fails(m.get(), &a, y.get(), TE_ERROR_INVALID_ARGUMENT, "residuals", true, nullptr, true);
  te_layernorm_mlp_backward_ctx **no_out = nullptr;
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward(ctx.get(), m.get(), &a, y.get(), no_out), TE_ERROR_INVALID_ARGUMENT,
                          "te_layernorm_mlp_forward", "out"));
  te_layernorm_mlp_forward_args bad = a;
  bad.struct_size = 0;
  expect_forward_fails(m.get(), &bad, y.get(), TE_ERROR_INVALID_ARGUMENT, "args");
  bad.struct_size = sizeof bad - 1;
  expect_forward_fails(m.get(), &bad, y.get(), TE_ERROR_INVALID_ARGUMENT, "args");
  bad = a;
  bad.weight_unchanged = 2;
  expect_forward_fails(m.get(), &bad, y.get(), TE_ERROR_INVALID_ARGUMENT, "args->weight_unchanged");
  const char *required[] = {"args->input", "args->ln_weight", "args->fc1_weight", "args->fc2_weight"};
  for (const char *r : required) {
    SCOPED_TRACE(r);
    bad = a;
    const std::string s = r;
    if (s == "args->input") bad.input = nullptr;
    else if (s == "args->ln_weight") bad.ln_weight = nullptr;
    else if (s == "args->fc1_weight") bad.fc1_weight = nullptr;
    else bad.fc2_weight = nullptr;
    expect_forward_fails(m.get(), &bad, y.get(), TE_ERROR_INVALID_ARGUMENT, r);
  }
}

TEST_F(LnMlpBadInput, ForwardTensorsMalformedOrOfTheWrongDtypeOrDevice) {
  const char *slots[] = {"args->input",   "args->ln_weight",  "args->ln_bias", "args->fc1_weight", "args->fc1_bias",
                         "args->fc2_weight", "args->fc2_bias", "args->ln_out",  "y"};
  struct Mutation {
    const char *what;
    std::function<void(te_tensor &)> edit;
  };
  const Mutation mutations[] = {
      {"F32", [](te_tensor &t) { t.dtype = TE_DTYPE_F32; }},
      {"F16", [](te_tensor &t) { t.dtype = TE_DTYPE_F16; }},
      {"CUDA", [](te_tensor &t) { t.device.type = TE_DEVICE_CUDA; }},
      {"NULL data", [](te_tensor &t) { t.data = nullptr; }},
      {"ndim 0", [](te_tensor &t) { t.ndim = 0; }},
      {"ndim 9", [](te_tensor &t) { t.ndim = 9; }},
      {"dtype 99", [](te_tensor &t) { poke_enum(&t.dtype, 99); }},
      {"dim 0", [](te_tensor &t) { t.shape[0] = 0; }},
      {"dim -5", [](te_tensor &t) { t.shape[0] = -5; }},
      {"E4M3 without scale_inv", [](te_tensor &t) {
         t.dtype = TE_DTYPE_E4M3;
         t.scale_inv = nullptr;
       }},
  };
  for (const char *slot : slots) {
    for (const Mutation &mu : mutations) {
      SCOPED_TRACE(std::string(slot) + ": " + mu.what);
      te_layernorm_mlp_forward_args a = d.args(ln_out.get());
      te_tensor *yy = y.get();
      const std::string s = slot;
      const te_tensor *orig = s == "args->input" ? a.input : s == "args->ln_weight" ? a.ln_weight
                              : s == "args->ln_bias" ? a.ln_bias : s == "args->fc1_weight" ? a.fc1_weight
                              : s == "args->fc1_bias" ? a.fc1_bias : s == "args->fc2_weight" ? a.fc2_weight
                              : s == "args->fc2_bias" ? a.fc2_bias : s == "args->ln_out" ? a.ln_out : yy;
      te_tensor copy = *orig;
      mu.edit(copy);
      if (s == "args->input") a.input = &copy;
      else if (s == "args->ln_weight") a.ln_weight = &copy;
      else if (s == "args->ln_bias") a.ln_bias = &copy;
      else if (s == "args->fc1_weight") a.fc1_weight = &copy;
      else if (s == "args->fc1_bias") a.fc1_bias = &copy;
      else if (s == "args->fc2_weight") a.fc2_weight = &copy;
      else if (s == "args->fc2_bias") a.fc2_bias = &copy;
      else if (s == "args->ln_out") a.ln_out = &copy;
      else yy = &copy;
      expect_forward_fails(m.get(), &a, yy, TE_ERROR_INVALID_ARGUMENT, slot);
    }
  }
}

TEST_F(LnMlpBadInput, ForwardShapesAndPresence) {
  Data dg(kAct, TE_ACTIVATION_SWIGLU, TE_NORM_LAYERNORM, false, true, 5300, kBadH, kBadF, {2, kBadT / 2});
  HostTensor x_wide = lt::make_tensor(kAct, {2, kBadT / 2, kBadH + 16}), g_long = lt::make_tensor(kAct, {kBadH + 16});
  HostTensor w1_swapped = lt::make_tensor(kAct, {kBadH, kBadF}), w1_flat = lt::make_tensor(kAct, {kBadF * kBadH});
  HostTensor w1_single = lt::make_tensor(kAct, {kBadF, kBadH}), w1_double = lt::make_tensor(kAct, {2 * kBadF, kBadH});
  HostTensor w2_swapped = lt::make_tensor(kAct, {kBadF, kBadH}), w2_gated = lt::make_tensor(kAct, {kBadH, 2 * kBadF});
  HostTensor b1_long = lt::make_tensor(kAct, {kBadF + 16}), b1_single = lt::make_tensor(kAct, {kBadF});
  HostTensor b2_long = lt::make_tensor(kAct, {kBadH + 16}), ln_2d = lt::make_tensor(kAct, {kBadT, kBadH});
  HostTensor y_wide = lt::make_tensor(kAct, {2, kBadT / 2, kBadF}), y_2d = lt::make_tensor(kAct, {kBadT, kBadH});
  struct Case {
    const char *what, *arg;
    te_layernorm_mlp *mod;
    Data *data;
    std::function<void(te_layernorm_mlp_forward_args &, te_tensor *&)> edit;
  };
  const Case cases[] = {
      {"input last dim", "args->input", m.get(), &d, [&](auto &a, te_tensor *&) { a.input = x_wide.get(); }},
      {"gamma too long", "args->ln_weight", m.get(), &d, [&](auto &a, te_tensor *&) { a.ln_weight = g_long.get(); }},
      {"beta too long", "args->ln_bias", m.get(), &d, [&](auto &a, te_tensor *&) { a.ln_bias = g_long.get(); }},
      {"beta missing", "args->ln_bias", m.get(), &d, [&](auto &a, te_tensor *&) { a.ln_bias = nullptr; }},
      {"beta given to RMSNorm", "args->ln_bias", rms.get(), &d, [&](auto &, te_tensor *&) {}},
      {"fc1 weight [hidden, ffn]", "args->fc1_weight", m.get(), &d, [&](auto &a, te_tensor *&) { a.fc1_weight = w1_swapped.get(); }},
      {"fc1 weight 1-D", "args->fc1_weight", m.get(), &d, [&](auto &a, te_tensor *&) { a.fc1_weight = w1_flat.get(); }},
      {"fc1 weight [2 ffn, hidden] for GELU", "args->fc1_weight", m.get(), &d,
       [&](auto &a, te_tensor *&) { a.fc1_weight = w1_double.get(); }},
      {"fc1 weight [ffn, hidden] for SwiGLU", "args->fc1_weight", gated_m.get(), &dg,
       [&](auto &a, te_tensor *&) { a.fc1_weight = w1_single.get(); }},
      {"fc1 bias [ffn] for SwiGLU", "args->fc1_bias", gated_m.get(), &dg,
       [&](auto &a, te_tensor *&) { a.fc1_bias = b1_single.get(); }},
      {"fc2 weight [ffn, hidden]", "args->fc2_weight", m.get(), &d, [&](auto &a, te_tensor *&) { a.fc2_weight = w2_swapped.get(); }},
      {"fc2 weight [hidden, 2 ffn] for SwiGLU", "args->fc2_weight", gated_m.get(), &dg,
       [&](auto &a, te_tensor *&) { a.fc2_weight = w2_gated.get(); }},
      {"fc1 bias too long", "args->fc1_bias", m.get(), &d, [&](auto &a, te_tensor *&) { a.fc1_bias = b1_long.get(); }},
      {"fc2 bias too long", "args->fc2_bias", m.get(), &d, [&](auto &a, te_tensor *&) { a.fc2_bias = b2_long.get(); }},
      {"fc1 bias missing", "args->fc1_bias", m.get(), &d, [&](auto &a, te_tensor *&) { a.fc1_bias = nullptr; }},
      {"fc2 bias missing", "args->fc2_bias", m.get(), &d, [&](auto &a, te_tensor *&) { a.fc2_bias = nullptr; }},
      {"fc1 bias without bias", "args->fc1_bias", nobias.get(), &d, [&](auto &a, te_tensor *&) { a.fc2_bias = nullptr; }},
      {"fc2 bias without bias", "args->fc2_bias", nobias.get(), &d, [&](auto &a, te_tensor *&) { a.fc1_bias = nullptr; }},
      {"ln_out 2-D for a 3-D input", "args->ln_out", m.get(), &d, [&](auto &a, te_tensor *&) { a.ln_out = ln_2d.get(); }},
      {"y last dim", "y", m.get(), &d, [&](auto &, te_tensor *&yy) { yy = y_wide.get(); }},
      {"y 2-D for a 3-D input", "y", m.get(), &d, [&](auto &, te_tensor *&yy) { yy = y_2d.get(); }},
  };
  watch_ = {&y_wide, &y_2d, &ln_2d};
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    te_layernorm_mlp_forward_args a = c.data->args(ln_out.get());
    te_tensor *yy = y.get();
    c.edit(a, yy);
    expect_forward_fails(c.mod, &a, yy, TE_ERROR_INVALID_ARGUMENT, c.arg);
  }
}

TEST_F(LnMlpBadInput, Fp8DimsNotMultipleOf16AreUnsupported) {
  struct Case {
    const char *what, *arg;
    te_activation act;
    int64_t tokens, hidden, ffn;
  };
  const Case cases[] = {{"tokens 24", "args->input", TE_ACTIVATION_GELU, 24, 32, 16},
                        {"hidden 24", "m", TE_ACTIVATION_GELU, 32, 24, 16},
                        {"ffn 24", "m", TE_ACTIVATION_GELU, 32, 32, 24},
                        {"ffn 8 gated (fc1 16 wide, fc2 K 8)", "m", TE_ACTIVATION_GEGLU, 32, 32, 8},
                        {"ffn 24 gated (fc1 48 wide, fc2 K 24)", "m", TE_ACTIVATION_SWIGLU, 32, 32, 24}};
  for (te_recipe_kind kind : {TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING, TE_RECIPE_BLOCK_SCALING}) {
    lt::RecipePtr r = lt::make_recipe(kind);
    for (const Case &c : cases) {
      SCOPED_TRACE(std::string(c.what) + ", recipe kind " + std::to_string(kind));
      lt::MlpPtr mod = lt::make_mlp(ctx.get(), options(c.hidden, c.ffn, c.act, kAct, TE_NORM_LAYERNORM, 0, 1));
      Data dd(kAct, c.act, TE_NORM_LAYERNORM, false, true, 5400, c.hidden, c.ffn, {c.tokens});
      HostTensor yy = dd.x_like();
      te_layernorm_mlp_forward_args a = dd.args();
      const std::vector<unsigned char> before = lt::module_state(ctx.get(), mod.get());
      {
        lt::AutocastScope scope(ctx.get(), r.get());
        te_layernorm_mlp_residuals res = new_residuals();
        EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_compute(ctx.get(), mod.get(), &a, yy.get(), &res),
                                TE_ERROR_UNSUPPORTED, "te_layernorm_mlp_forward_compute", c.arg));
        te_layernorm_mlp_backward_ctx *out = nullptr;
        EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward(ctx.get(), mod.get(), &a, yy.get(), &out), TE_ERROR_UNSUPPORTED,
                                "te_layernorm_mlp_forward", c.arg));
        EXPECT_EQ(out, nullptr);
        EXPECT_TRUE(std::all_of(yy.bytes.begin(), yy.bytes.end(), [](unsigned char b) { return b == 0xA5; }));
      }
      EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx.get(), mod.get()), before));
      te_layernorm_mlp_backward_ctx *out = nullptr;
      EXPECT_TE_OK(te_layernorm_mlp_forward(ctx.get(), mod.get(), &a, yy.get(), &out));
      te_layernorm_mlp_backward_ctx_destroy(out);
    }
  }
}

TEST_F(LnMlpBadInput, ForwardSave) {
  te_layernorm_mlp_forward_args a = d.args();
  te_layernorm_mlp_residuals res = new_residuals();
  lt::AutocastScope scope(ctx.get(), recipe.get());
  ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), m.get(), &a, y.get(), &res));
  const te_layernorm_mlp_residuals before = res;
  te_layernorm_mlp_backward_ctx *const sentinel = reinterpret_cast<te_layernorm_mlp_backward_ctx *>(0xdef0);
  te_layernorm_mlp_backward_ctx *out = sentinel;
  lt::ContextPtr ctx2 = lt::make_cpu_context();
  const char *fn = "te_layernorm_mlp_forward_save";
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_save(nullptr, m.get(), &res, &out), TE_ERROR_INVALID_ARGUMENT, fn, "ctx"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_save(ctx2.get(), m.get(), &res, &out), TE_ERROR_INVALID_ARGUMENT, fn, "m"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_save(ctx.get(), nullptr, &res, &out), TE_ERROR_INVALID_ARGUMENT, fn, "m"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_save(ctx.get(), rms.get(), &res, &out), TE_ERROR_INVALID_ARGUMENT, fn,
                          "residuals"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_save(ctx.get(), m.get(), nullptr, &out), TE_ERROR_INVALID_ARGUMENT, fn,
                          "residuals"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_save(ctx.get(), m.get(), &res, nullptr), TE_ERROR_INVALID_ARGUMENT, fn, "out"));
  te_layernorm_mlp_residuals small = res;
  small.struct_size = 8;
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_forward_save(ctx.get(), m.get(), &small, &out), TE_ERROR_INVALID_ARGUMENT, fn,
                          "residuals"));
  EXPECT_EQ(out, sentinel);
  EXPECT_EQ(0, std::memcmp(&res, &before, sizeof res));
  ASSERT_TE_OK(te_layernorm_mlp_forward_save(ctx.get(), m.get(), &res, &out));
  te_layernorm_mlp_backward_ctx_destroy(out);
}

TEST_F(LnMlpBadInput, BackwardEveryArgument) {
  Data drms(kAct, TE_ACTIVATION_GELU, TE_NORM_RMSNORM, false, true, 5500, kBadH, kBadF, {2, kBadT / 2});
  Data dnb(kAct, TE_ACTIVATION_GELU, TE_NORM_LAYERNORM, false, false, 5501, kBadH, kBadF, {2, kBadT / 2});
  te_layernorm_mlp_forward_args a = d.args(), arms = drms.args(), anb = dnb.args();
  te_layernorm_mlp_backward_ctx *raw = nullptr, *raw_rms = nullptr, *raw_nb = nullptr, *raw_fused = nullptr, *gone = nullptr;
  te_layernorm_linear_options lo;
  ASSERT_TE_OK(te_layernorm_linear_options_init(&lo));
  lo.in_features = kBadH;
  lo.out_features = kBadH;
  lt::LnLinearPtr lnl = lt::make_ln_linear(ctx.get(), lo);
  te_layernorm_linear_backward_ctx *lnl_bwd = nullptr;
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kBadH, kBadH, 1, kAct);
  te_linear_backward_ctx *lin_bwd = nullptr;
  lt::ContextPtr ctx2 = lt::make_cpu_context();
  HostTensor w_sq = lt::random_tensor(kAct, {kBadH, kBadH}, -0.1f, 0.1f, 5502), b_sq = lt::random_tensor(kAct, {kBadH}, -0.1f, 0.1f, 5503);
  {
    lt::AutocastScope scope(ctx.get(), recipe.get());
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), m.get(), &a, y.get(), &raw));
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), rms.get(), &arms, y.get(), &raw_rms));
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), nobias.get(), &anb, y.get(), &raw_nb));
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), fused.get(), &a, y.get(), &raw_fused));
    ASSERT_TE_OK(te_layernorm_mlp_forward(ctx.get(), m.get(), &a, y.get(), &gone));
    te_layernorm_linear_forward_args la;
    ASSERT_TE_OK(te_layernorm_linear_forward_args_init(&la));
    la.input = d.x.get();
    la.ln_weight = d.gamma.get();
    la.ln_bias = d.beta.get();
    la.weight = w_sq.get();
    la.bias = b_sq.get();
    ASSERT_TE_OK(te_layernorm_linear_forward(ctx.get(), lnl.get(), &la, y.get(), &lnl_bwd));
    te_linear_forward_args lfa;
    ASSERT_TE_OK(te_linear_forward_args_init(&lfa));
    lfa.input = d.x.get();
    lfa.weight = w_sq.get();
    lfa.bias = b_sq.get();
    ASSERT_TE_OK(te_linear_forward(ctx.get(), lin.get(), &lfa, y.get(), &lin_bwd));
  }
  lt::MlpBwdPtr hold(raw), hold_rms(raw_rms), hold_nb(raw_nb), hold_fused(raw_fused);
  lt::LnLinearBwdPtr hold_lnl(lnl_bwd);
  te_layernorm_mlp_backward_ctx_destroy(gone);
  y.fill_byte(0xA5);
  te_layernorm_mlp_grads all = g.all(d);
  te_linear_backward_args once;
  ASSERT_TE_OK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE;
  te_context *c = ctx.get();
  const te_tensor *dy = d.dy.get();
  expect_backward_fails(nullptr, raw, dy, &all, &once, "ctx");
  expect_backward_fails(ctx2.get(), raw, dy, &all, &once, "bwd");
  expect_backward_fails(c, nullptr, dy, &all, &once, "bwd");
  expect_backward_fails(c, gone, dy, &all, &once, "bwd");
  expect_backward_fails(c, reinterpret_cast<te_layernorm_mlp_backward_ctx *>(lnl_bwd), dy, &all, &once, "bwd");
  expect_backward_fails(c, reinterpret_cast<te_layernorm_mlp_backward_ctx *>(lin_bwd), dy, &all, &once, "bwd");
  expect_backward_fails(c, reinterpret_cast<te_layernorm_mlp_backward_ctx *>(m.get()), dy, &all, &once, "bwd");
  expect_backward_fails(c, raw, nullptr, &all, &once, "dy");
  HostTensor dy32 = lt::make_tensor(TE_DTYPE_F32, {2, kBadT / 2, kBadH}), dy_wide = lt::make_tensor(kAct, {2, kBadT / 2, kBadF});
  HostTensor dy_short = lt::make_tensor(kAct, {kBadT - 16, kBadH});
  expect_backward_fails(c, raw, dy32.get(), &all, &once, "dy");
  expect_backward_fails(c, raw, dy_wide.get(), &all, &once, "dy");
  expect_backward_fails(c, raw, dy_short.get(), &all, &once, "dy");
  te_layernorm_mlp_grads bad = all;
  bad.struct_size = 0;
  expect_backward_fails(c, raw, dy, &bad, &once, "grads");
  te_linear_backward_args bad_args = once;
  bad_args.struct_size = 3;
  expect_backward_fails(c, raw, dy, &all, &bad_args, "args");
  bad_args = once;
  bad_args.flags = 4;
  expect_backward_fails(c, raw, dy, &all, &bad_args, "args->flags");
  HostTensor dx32 = lt::make_tensor(TE_DTYPE_F32, {2, kBadT / 2, kBadH}), dx_bad = lt::make_tensor(kAct, {2, kBadT / 2, kBadF});
  HostTensor vec_long = lt::make_tensor(kAct, {kBadH + 16}), dw1_bad = lt::make_tensor(kAct, {kBadH, kBadF});
  HostTensor dw1_double = lt::make_tensor(kAct, {2 * kBadF, kBadH}), dw2_bad = lt::make_tensor(kAct, {kBadF, kBadH});
  HostTensor dw32 = lt::make_tensor(TE_DTYPE_F32, {kBadH, kBadF}), db1_long = lt::make_tensor(kAct, {kBadH});
  HostTensor db2_short = lt::make_tensor(kAct, {kBadF});
  watch_ = {&dx32, &dx_bad, &vec_long, &dw1_bad, &dw1_double, &dw2_bad, &dw32, &db1_long, &db2_short};
  te_tensor dx_cuda = *g.dx.get();
  dx_cuda.device.type = TE_DEVICE_CUDA;
  te_tensor dw2_null = *g.dw2.get();
  dw2_null.data = nullptr;
  struct GCase {
    const char *what, *arg;
    std::function<void(te_layernorm_mlp_grads &)> edit;
  };
  const GCase gcases[] = {
      {"dx F32", "grads->dx", [&](auto &gr) { gr.dx = dx32.get(); }},
      {"dx wrong width", "grads->dx", [&](auto &gr) { gr.dx = dx_bad.get(); }},
      {"dx CUDA", "grads->dx", [&](auto &gr) { gr.dx = &dx_cuda; }},
      {"dgamma too long", "grads->dln_weight", [&](auto &gr) { gr.dln_weight = vec_long.get(); }},
      {"dbeta too long", "grads->dln_bias", [&](auto &gr) { gr.dln_bias = vec_long.get(); }},
      {"dfc1_weight swapped", "grads->dfc1_weight", [&](auto &gr) { gr.dfc1_weight = dw1_bad.get(); }},
      {"dfc1_weight [2 ffn, hidden] for GELU", "grads->dfc1_weight", [&](auto &gr) { gr.dfc1_weight = dw1_double.get(); }},
      {"dfc2_weight swapped", "grads->dfc2_weight", [&](auto &gr) { gr.dfc2_weight = dw2_bad.get(); }},
      {"dfc2_weight F32 without fused accumulation", "grads->dfc2_weight", [&](auto &gr) { gr.dfc2_weight = dw32.get(); }},
      {"dfc2_weight NULL data", "grads->dfc2_weight", [&](auto &gr) { gr.dfc2_weight = &dw2_null; }},
      {"dfc1_bias too long", "grads->dfc1_bias", [&](auto &gr) { gr.dfc1_bias = db1_long.get(); }},
      {"dfc2_bias too short", "grads->dfc2_bias", [&](auto &gr) { gr.dfc2_bias = db2_short.get(); }},
  };
  for (const GCase &gc : gcases) {
    SCOPED_TRACE(gc.what);
    te_layernorm_mlp_grads gr = all;
    gc.edit(gr);
    expect_backward_fails(c, raw, dy, &gr, &once, gc.arg);
  }
  {
    SCOPED_TRACE("dbeta for RMSNorm");
    te_layernorm_mlp_grads gr = all;
    expect_backward_fails(c, raw_rms, drms.dy.get(), &gr, &once, "grads->dln_bias");
  }
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which ? "dfc2_bias without bias" : "dfc1_bias without bias");
    te_layernorm_mlp_grads gr = all;
    gr.dln_bias = g.dbeta.get();
    if (which) gr.dfc1_bias = nullptr;
    else gr.dfc2_bias = nullptr;
    expect_backward_fails(c, raw_nb, dnb.dy.get(), &gr, &once, which ? "grads->dfc2_bias" : "grads->dfc1_bias");
  }
  {
    SCOPED_TRACE("fused: activation-dtype weight gradients");
    te_layernorm_mlp_grads gr = all;
    expect_backward_fails(c, raw_fused, dy, &gr, &once, "grads->dfc1_weight");
  }
  EXPECT_TE_OK(te_layernorm_mlp_backward(c, raw, dy, &all, &once));
  expect_backward_fails(c, raw, dy, &all, &once, nullptr, TE_ERROR_INVALID_STATE);
  te_linear_backward_ctx_destroy(lin_bwd);
}

TEST_F(LnMlpBadInput, GetScalingStateAndStateFunctions) {
  te_scaling_state_info info;
  std::memset(&info, 0x3C, sizeof info);
  info.struct_size = sizeof info;
  const te_scaling_state_info before = info;
  std::vector<float> hist(16, -7.0f);
  te_context *c = ctx.get();
  lt::ContextPtr ctx2 = lt::make_cpu_context();
  lt::LinearPtr lin = lt::make_linear(c, kBadH, kBadF, 1, kAct);
  const char *fn = "te_layernorm_mlp_get_scaling_state";
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_get_scaling_state(nullptr, m.get(), TE_MLP_FC1, TE_ROLE_INPUT, &info, hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, fn, "ctx"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_get_scaling_state(ctx2.get(), m.get(), TE_MLP_FC1, TE_ROLE_INPUT, &info, hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, fn, "m"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_get_scaling_state(c, nullptr, TE_MLP_FC1, TE_ROLE_INPUT, &info, hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, fn, "m"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_get_scaling_state(c, reinterpret_cast<const te_layernorm_mlp *>(lin.get()), TE_MLP_FC1,
                                                             TE_ROLE_INPUT, &info, hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, fn, "m"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_get_scaling_state(c, m.get(), TE_MLP_FC1, TE_ROLE_INPUT, nullptr, hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, fn, "info"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_get_scaling_state(c, m.get(), static_cast<te_mlp_gemm>(2), TE_ROLE_INPUT, &info,
                                                             hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, fn, "gemm"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_get_scaling_state(c, m.get(), TE_MLP_FC2, static_cast<te_tensor_role>(3), &info,
                                                             hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, fn, "role"));
  te_scaling_state_info small = before;
  small.struct_size = 4;
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_get_scaling_state(c, m.get(), TE_MLP_FC2, TE_ROLE_INPUT, &small, hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, fn, "info"));
  EXPECT_EQ(0, std::memcmp(&info, &before, sizeof info));
  EXPECT_EQ(hist, std::vector<float>(16, -7.0f));
  // state_save / state_load.
  size_t size = 777;
  const char *fs = "te_layernorm_mlp_state_save", *fl = "te_layernorm_mlp_state_load";
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_save(nullptr, m.get(), nullptr, 0, &size), TE_ERROR_INVALID_ARGUMENT, fs, "ctx"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_save(ctx2.get(), m.get(), nullptr, 0, &size), TE_ERROR_INVALID_ARGUMENT, fs, "m"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_save(c, nullptr, nullptr, 0, &size), TE_ERROR_INVALID_ARGUMENT, fs, "m"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_save(c, reinterpret_cast<const te_layernorm_mlp *>(lin.get()), nullptr, 0, &size),
                          TE_ERROR_INVALID_ARGUMENT, fs, "m"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_save(c, m.get(), nullptr, 0, nullptr), TE_ERROR_INVALID_ARGUMENT, fs, "size"));
  const std::vector<unsigned char> good = lt::module_state(c, m.get());
  std::vector<unsigned char> buf(good.size(), 0xCD);
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_save(c, m.get(), buf.data(), good.size() - 1, &size), TE_ERROR_INVALID_ARGUMENT,
                          fs, "capacity"));
  EXPECT_EQ(buf, std::vector<unsigned char>(good.size(), 0xCD));
  EXPECT_EQ(size, 777u);
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_load(nullptr, m.get(), good.data(), good.size()), TE_ERROR_INVALID_ARGUMENT, fl, "ctx"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_load(ctx2.get(), m.get(), good.data(), good.size()), TE_ERROR_INVALID_ARGUMENT, fl, "m"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_load(c, nullptr, good.data(), good.size()), TE_ERROR_INVALID_ARGUMENT, fl, "m"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_load(c, reinterpret_cast<te_layernorm_mlp *>(lin.get()), good.data(), good.size()),
                          TE_ERROR_INVALID_ARGUMENT, fl, "m"));
  EXPECT_TRUE(lt::IsError(te_layernorm_mlp_state_load(c, m.get(), nullptr, good.size()), TE_ERROR_INVALID_ARGUMENT, fl, "buf"));
  EXPECT_TRUE(lt::SameBytes(lt::module_state(c, m.get()), good));
}

}  // namespace
