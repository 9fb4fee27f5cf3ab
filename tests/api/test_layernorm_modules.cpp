// LayerNormLinear and LayerNormMLP numerics against fp64 references: in high precision against
// the plain formulas; in FP8 against the same formulas on the operands the library quantized
// (read back from the residuals), with dy chosen exactly representable in E5M2 so that its
// quantization (scale 1 on a fresh state) is exact too.
#include <gtest/gtest.h>

#include "api_test_util.h"
#include "module_reference.h"

using namespace te_test;

namespace {

constexpr int64_t kTokens = 32, kIn = 64, kOut = 48;

Vec values_of(const HostTensor &h) { return h.values(); }

// The dequantized values of a per-tensor FP8 view the library owns.
Vec dequantized(const te_tensor &t) {
  HostTensor h = copy_tensor(t);
  Vec v = h.values();
  for (double &x : v) x *= t.scale_inv[0];
  return v;
}

// Values exactly representable in E5M2 (and F32): small multiples of powers of two.
HostTensor e5m2_exact_tensor(std::vector<int64_t> shape, uint32_t seed) {
  HostTensor h = make_tensor(TE_DTYPE_F32, std::move(shape));
  static const float vals[] = {-1.5f, -1.0f, -0.5f, -0.25f, 0.0f, 0.125f, 0.375f, 0.75f, 1.25f};
  uint32_t s = seed;
  for (int64_t i = 0; i < h.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    h.set(i, vals[(s >> 16) % 9]);
  }
  return h;
}

struct AutocastScope {
  te_context *ctx;
  te_autocast_token token = 0;
  AutocastScope(te_context *c, const te_recipe *r) : ctx(c) {
    te_autocast_options o;
    te_autocast_options_init(&o);
    o.recipe = r;
    EXPECT_EQ(te_autocast_begin(ctx, &o, &token), TE_SUCCESS);
  }
  ~AutocastScope() { EXPECT_EQ(te_autocast_end(ctx, token), TE_SUCCESS); }
};

class LayerNormLinearTest : public ::testing::TestWithParam<std::tuple<te_norm_kind, bool>> {};

TEST_P(LayerNormLinearTest, HighPrecisionMatchesFp64) {
  const te_norm_kind kind = std::get<0>(GetParam());
  const bool layer = kind == TE_NORM_LAYERNORM, zc = std::get<1>(GetParam());
  ContextPtr ctx = make_cpu_context();
  te_layernorm_linear_options o;
  ASSERT_TE_OK(te_layernorm_linear_options_init(&o));
  o.in_features = kIn;
  o.out_features = kOut;
  o.activation_dtype = TE_DTYPE_F32;
  o.normalization = kind;
  o.zero_centered_gamma = zc;
  te_layernorm_linear *m = nullptr;
  ASSERT_TE_OK(te_layernorm_linear_create(&m, ctx.get(), &o));
  HostTensor x = random_tensor(TE_DTYPE_F32, {2, kTokens / 2, kIn}, -2, 3, 1);
  HostTensor g = random_tensor(TE_DTYPE_F32, {kIn}, 0.5, 1.5, 2);
  HostTensor b = random_tensor(TE_DTYPE_F32, {kIn}, -0.5, 0.5, 3);
  HostTensor w = random_tensor(TE_DTYPE_F32, {kOut, kIn}, -0.2, 0.2, 4);
  HostTensor bias = random_tensor(TE_DTYPE_F32, {kOut}, -1, 1, 5);
  HostTensor y = make_tensor(TE_DTYPE_F32, {2, kTokens / 2, kOut});
  HostTensor ln_out = make_tensor(TE_DTYPE_F32, {2, kTokens / 2, kIn});
  te_layernorm_linear_forward_args a;
  ASSERT_TE_OK(te_layernorm_linear_forward_args_init(&a));
  a.input = x.get();
  a.ln_weight = g.get();
  a.ln_bias = layer ? b.get() : nullptr;
  a.weight = w.get();
  a.bias = bias.get();
  a.ln_out = ln_out.get();
  te_layernorm_linear_backward_ctx *bwd = nullptr;
  ASSERT_TE_OK(te_layernorm_linear_forward(ctx.get(), m, &a, y.get(), &bwd));

  const NormRef nr = ref_norm(values_of(x), values_of(g), layer ? values_of(b) : Vec(), kTokens, kIn, 1e-5, layer, zc);
  Vec y_ref = ref_nt(nr.y, values_of(w), kTokens, kOut, kIn);
  for (int64_t i = 0; i < kTokens; ++i)
    for (int64_t j = 0; j < kOut; ++j) y_ref[static_cast<size_t>(i * kOut + j)] += bias.at(j);
  // fp32 statistics and a 64-term fp32 dot product: a few ulps of fp32 relative to the terms.
  EXPECT_LE(worst_ratio(values_of(ln_out), nr.y, 1e-6, 1e-5), 1.0);
  EXPECT_LE(worst_ratio(values_of(y), y_ref, 1e-5, 1e-5), 1.0);

  HostTensor dy = random_tensor(TE_DTYPE_F32, {kTokens, kOut}, -1, 1, 6);
  HostTensor dx = make_tensor(TE_DTYPE_F32, {2, kTokens / 2, kIn}), dg = make_tensor(TE_DTYPE_F32, {kIn}),
             dbeta = make_tensor(TE_DTYPE_F32, {kIn}), dw = make_tensor(TE_DTYPE_F32, {kOut, kIn}),
             db = make_tensor(TE_DTYPE_F32, {kOut});
  te_layernorm_linear_grads gr;
  ASSERT_TE_OK(te_layernorm_linear_grads_init(&gr));
  gr.dx = dx.get();
  gr.dln_weight = dg.get();
  gr.dln_bias = layer ? dbeta.get() : nullptr;
  gr.dw = dw.get();
  gr.db = db.get();
  ASSERT_TE_OK(te_layernorm_linear_backward(ctx.get(), bwd, dy.get(), &gr, nullptr));
  const Vec dln = ref_nn(values_of(dy), values_of(w), kTokens, kIn, kOut);
  const NormGradRef ng = ref_norm_backward(dln, nr, values_of(g), kTokens, kIn, layer, zc);
  EXPECT_LE(worst_ratio(values_of(dx), ng.dx, 1e-4, 1e-4), 1.0);
  EXPECT_LE(worst_ratio(values_of(dg), ng.dgamma, 1e-4, 1e-4), 1.0);
  if (layer) EXPECT_LE(worst_ratio(values_of(dbeta), ng.dbeta, 1e-4, 1e-4), 1.0);
  EXPECT_LE(worst_ratio(values_of(dw), ref_tn(values_of(dy), nr.y, kOut, kIn, kTokens), 1e-5, 1e-5), 1.0);
  // Retain-graph: a second backward gives the same bits.
  HostTensor dx1 = dx, dw1 = dw, dg1 = dg;
  ASSERT_TE_OK(te_layernorm_linear_backward(ctx.get(), bwd, dy.get(), &gr, nullptr));
  EXPECT_EQ(dx.bytes, dx1.bytes);
  EXPECT_EQ(dw.bytes, dw1.bytes);
  EXPECT_EQ(dg.bytes, dg1.bytes);
  te_layernorm_linear_backward_ctx_destroy(bwd);
  te_layernorm_linear_destroy(m);
}

TEST_P(LayerNormLinearTest, Fp8DelayedMatchesFp64OnQuantizedOperands) {
  const te_norm_kind kind = std::get<0>(GetParam());
  const bool layer = kind == TE_NORM_LAYERNORM, zc = std::get<1>(GetParam());
  ContextPtr ctx = make_cpu_context();
  RecipePtr recipe = make_recipe(TE_RECIPE_DELAYED_SCALING);
  te_layernorm_linear_options o;
  ASSERT_TE_OK(te_layernorm_linear_options_init(&o));
  o.in_features = kIn;
  o.out_features = kOut;
  o.activation_dtype = TE_DTYPE_F32;
  o.normalization = kind;
  o.zero_centered_gamma = zc;
  te_layernorm_linear *m = nullptr;
  ASSERT_TE_OK(te_layernorm_linear_create(&m, ctx.get(), &o));
  HostTensor x = random_tensor(TE_DTYPE_F32, {kTokens, kIn}, -2, 3, 11);
  HostTensor g = random_tensor(TE_DTYPE_F32, {kIn}, 0.5, 1.5, 12);
  HostTensor b = random_tensor(TE_DTYPE_F32, {kIn}, -0.5, 0.5, 13);
  HostTensor w = random_tensor(TE_DTYPE_F32, {kOut, kIn}, -0.2, 0.2, 14);
  HostTensor y = make_tensor(TE_DTYPE_F32, {kTokens, kOut});
  te_layernorm_linear_forward_args a;
  ASSERT_TE_OK(te_layernorm_linear_forward_args_init(&a));
  a.input = x.get();
  a.ln_weight = g.get();
  a.ln_bias = layer ? b.get() : nullptr;
  a.weight = w.get();
  o.bias = 0;
  te_layernorm_linear_destroy(m);
  ASSERT_TE_OK(te_layernorm_linear_create(&m, ctx.get(), &o));
  te_layernorm_linear_residuals res;
  std::memset(&res, 0, sizeof res);
  res.struct_size = sizeof res;
  {
    AutocastScope scope(ctx.get(), recipe.get());
    ASSERT_TE_OK(te_layernorm_linear_forward_compute(ctx.get(), m, &a, y.get(), &res));
  }
  ASSERT_EQ(res.fp8, 1);
  ASSERT_EQ(res.ln_out_t.dtype, TE_DTYPE_E4M3);
  const Vec ln_q = ref_transpose(dequantized(res.ln_out_t), kIn, kTokens);
  const Vec w_q = ref_transpose(dequantized(res.weight_t), kIn, kOut);
  // The norm's FP8 output is the fp64 norm rounded to E4M3 (scale 1 on a fresh state): within
  // half an E4M3 ulp (2^-4 relative) plus half the smallest subnormal (2^-10).
  const NormRef nr = ref_norm(values_of(x), values_of(g), layer ? values_of(b) : Vec(), kTokens, kIn, 1e-5, layer, zc);
  EXPECT_LE(worst_ratio(ln_q, nr.y, std::ldexp(1.0, -10), std::ldexp(1.0, -4)), 1.0);
  // The GEMM on the quantized operands: exact products, fp32 accumulation of 64 terms.
  EXPECT_LE(worst_ratio(values_of(y), ref_nt(ln_q, w_q, kTokens, kOut, kIn), 1e-5, 1e-5), 1.0);

  te_layernorm_linear_backward_ctx *bwd = nullptr;
  ASSERT_TE_OK(te_layernorm_linear_forward_save(ctx.get(), m, &res, &bwd));
  EXPECT_EQ(res.internal, nullptr);
  HostTensor dy = e5m2_exact_tensor({kTokens, kOut}, 7);
  HostTensor dx = make_tensor(TE_DTYPE_F32, {kTokens, kIn}), dg = make_tensor(TE_DTYPE_F32, {kIn}),
             dw = make_tensor(TE_DTYPE_F32, {kOut, kIn});
  te_layernorm_linear_grads gr;
  ASSERT_TE_OK(te_layernorm_linear_grads_init(&gr));
  gr.dx = dx.get();
  gr.dln_weight = dg.get();
  gr.dw = dw.get();
  ASSERT_TE_OK(te_layernorm_linear_backward(ctx.get(), bwd, dy.get(), &gr, nullptr));
  const Vec dln = ref_nn(values_of(dy), w_q, kTokens, kIn, kOut);
  const NormGradRef ng = ref_norm_backward(dln, nr, values_of(g), kTokens, kIn, layer, zc);
  EXPECT_LE(worst_ratio(values_of(dx), ng.dx, 1e-4, 1e-4), 1.0);
  EXPECT_LE(worst_ratio(values_of(dg), ng.dgamma, 1e-4, 1e-4), 1.0);
  EXPECT_LE(worst_ratio(values_of(dw), ref_tn(values_of(dy), ln_q, kOut, kIn, kTokens), 1e-5, 1e-5), 1.0);
  te_layernorm_linear_backward_ctx_destroy(bwd);
  te_layernorm_linear_destroy(m);
}

INSTANTIATE_TEST_SUITE_P(Kinds, LayerNormLinearTest,
                         ::testing::Combine(::testing::Values(TE_NORM_LAYERNORM, TE_NORM_RMSNORM),
                                            ::testing::Bool()));

class LayerNormMlpTest : public ::testing::TestWithParam<std::tuple<te_activation, bool>> {};

Vec ref_act(te_activation act, const Vec &h, int64_t rows, int64_t ffn) {
  Vec out(static_cast<size_t>(rows * ffn));
  const bool gated = act == TE_ACTIVATION_SWIGLU || act == TE_ACTIVATION_GEGLU;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < ffn; ++j) {
      const double a = gated ? h[static_cast<size_t>(i * 2 * ffn + j)] : h[static_cast<size_t>(i * ffn + j)];
      const double lin = gated ? h[static_cast<size_t>(i * 2 * ffn + ffn + j)] : 1.0;
      double v = 0;
      switch (act) {
        case TE_ACTIVATION_RELU: v = a > 0 ? a : 0; break;
        case TE_ACTIVATION_GELU: v = ref_gelu(a); break;
        case TE_ACTIVATION_SWIGLU: v = ref_silu(a) * lin; break;
        case TE_ACTIVATION_GEGLU: v = ref_gelu(a) * lin; break;
        case TE_ACTIVATION_SRELU: v = a > 0 ? a * a : 0; break;
      }
      out[static_cast<size_t>(i * ffn + j)] = v;
    }
  return out;
}

TEST_P(LayerNormMlpTest, ForwardMatchesFp64AndBackwardRepeats) {
  const te_activation act = std::get<0>(GetParam());
  const bool fp8 = std::get<1>(GetParam());
  const bool gated = act == TE_ACTIVATION_SWIGLU || act == TE_ACTIVATION_GEGLU;
  const int64_t hidden = 64, ffn = 96, fc1_out = gated ? 2 * ffn : ffn;
  ContextPtr ctx = make_cpu_context();
  te_layernorm_mlp_options o;
  ASSERT_TE_OK(te_layernorm_mlp_options_init(&o));
  o.hidden_size = hidden;
  o.ffn_hidden_size = ffn;
  o.activation = act;
  o.activation_dtype = TE_DTYPE_F32;
  te_layernorm_mlp *m = nullptr;
  ASSERT_TE_OK(te_layernorm_mlp_create(&m, ctx.get(), &o));
  HostTensor x = random_tensor(TE_DTYPE_F32, {kTokens, hidden}, -2, 3, 21);
  HostTensor g = random_tensor(TE_DTYPE_F32, {hidden}, 0.5, 1.5, 22);
  HostTensor b = random_tensor(TE_DTYPE_F32, {hidden}, -0.5, 0.5, 23);
  HostTensor w1 = random_tensor(TE_DTYPE_F32, {fc1_out, hidden}, -0.2, 0.2, 24);
  HostTensor b1 = random_tensor(TE_DTYPE_F32, {fc1_out}, -0.2, 0.2, 25);
  HostTensor w2 = random_tensor(TE_DTYPE_F32, {hidden, ffn}, -0.2, 0.2, 26);
  HostTensor b2 = random_tensor(TE_DTYPE_F32, {hidden}, -0.2, 0.2, 27);
  HostTensor y = make_tensor(TE_DTYPE_F32, {kTokens, hidden});
  te_layernorm_mlp_forward_args a;
  ASSERT_TE_OK(te_layernorm_mlp_forward_args_init(&a));
  a.input = x.get();
  a.ln_weight = g.get();
  a.ln_bias = b.get();
  a.fc1_weight = w1.get();
  a.fc1_bias = b1.get();
  a.fc2_weight = w2.get();
  a.fc2_bias = b2.get();
  te_layernorm_mlp_residuals res;
  std::memset(&res, 0, sizeof res);
  res.struct_size = sizeof res;
  RecipePtr recipe = make_recipe(TE_RECIPE_DELAYED_SCALING);
  if (fp8) {
    AutocastScope scope(ctx.get(), recipe.get());
    ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), m, &a, y.get(), &res));
  } else {
    ASSERT_TE_OK(te_layernorm_mlp_forward_compute(ctx.get(), m, &a, y.get(), &res));
  }
  ASSERT_EQ(res.fp8, fp8 ? 1 : 0);
  // Reference: each GEMM on the operands the library used (dequantized under FP8), the
  // activation in fp64 on the library's fc1 output.
  const Vec ln = fp8 ? ref_transpose(dequantized(res.ln_out_t), hidden, kTokens)
                     : ref_norm(values_of(x), values_of(g), values_of(b), kTokens, hidden, 1e-5, true, false).y;
  const Vec w1v = fp8 ? ref_transpose(dequantized(res.fc1_weight_t), hidden, fc1_out) : values_of(w1);
  Vec h = ref_nt(ln, w1v, kTokens, fc1_out, hidden);
  for (int64_t i = 0; i < kTokens; ++i)
    for (int64_t j = 0; j < fc1_out; ++j) h[static_cast<size_t>(i * fc1_out + j)] += b1.at(j);
  const Vec fc1_got = copy_tensor(res.fc1_out).values();
  EXPECT_LE(worst_ratio(fc1_got, h, 1e-5, 1e-5), 1.0);
  const Vec act_ref = ref_act(act, fc1_got, kTokens, ffn);
  const Vec act_used = fp8 ? ref_transpose(dequantized(res.act_out_t), ffn, kTokens) : copy_tensor(res.act_out_t).values();
  // The activation in fp32 (tanh/exp within a few ulps), then FP8 rounding under FP8.
  EXPECT_LE(worst_ratio(act_used, act_ref, fp8 ? std::ldexp(1.0, -10) : 1e-6, fp8 ? std::ldexp(1.0, -4) : 1e-5), 1.0);
  const Vec w2v = fp8 ? ref_transpose(dequantized(res.fc2_weight_t), ffn, hidden) : values_of(w2);
  Vec y_ref = ref_nt(act_used, w2v, kTokens, hidden, ffn);
  for (int64_t i = 0; i < kTokens; ++i)
    for (int64_t j = 0; j < hidden; ++j) y_ref[static_cast<size_t>(i * hidden + j)] += b2.at(j);
  EXPECT_LE(worst_ratio(values_of(y), y_ref, 1e-5, 1e-5), 1.0);

  te_layernorm_mlp_backward_ctx *bwd = nullptr;
  ASSERT_TE_OK(te_layernorm_mlp_forward_save(ctx.get(), m, &res, &bwd));
  HostTensor dy = e5m2_exact_tensor({kTokens, hidden}, 9);
  HostTensor dx = make_tensor(TE_DTYPE_F32, {kTokens, hidden}), dw1 = make_tensor(TE_DTYPE_F32, {fc1_out, hidden}),
             dw2 = make_tensor(TE_DTYPE_F32, {hidden, ffn}), db1 = make_tensor(TE_DTYPE_F32, {fc1_out});
  te_layernorm_mlp_grads gr;
  ASSERT_TE_OK(te_layernorm_mlp_grads_init(&gr));
  gr.dx = dx.get();
  gr.dfc1_weight = dw1.get();
  gr.dfc1_bias = db1.get();
  gr.dfc2_weight = dw2.get();
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), bwd, dy.get(), &gr, nullptr));
  // fc2's wgrad on the quantized operands is exact up to fp32 accumulation.
  EXPECT_LE(worst_ratio(values_of(dw2), ref_tn(values_of(dy), act_used, hidden, ffn, kTokens), 1e-5, 1e-5), 1.0);
  HostTensor dx1 = dx, dw11 = dw1, dw21 = dw2;
  ASSERT_TE_OK(te_layernorm_mlp_backward(ctx.get(), bwd, dy.get(), &gr, nullptr));
  EXPECT_EQ(dx.bytes, dx1.bytes);
  EXPECT_EQ(dw1.bytes, dw11.bytes);
  EXPECT_EQ(dw2.bytes, dw21.bytes);
  // Finite gradients everywhere.
  for (double v : values_of(dx)) ASSERT_TRUE(std::isfinite(v));
  te_layernorm_mlp_backward_ctx_destroy(bwd);
  te_layernorm_mlp_destroy(m);
}

INSTANTIATE_TEST_SUITE_P(Activations, LayerNormMlpTest,
                         ::testing::Combine(::testing::Values(TE_ACTIVATION_GELU, TE_ACTIVATION_RELU,
                                                              TE_ACTIVATION_SWIGLU),
                                            ::testing::Bool()));

}  // namespace
