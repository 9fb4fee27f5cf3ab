// te_layernorm_linear's residuals in the caller's memory (residuals_size, forward_compute_into,
// backward_from): bitwise the same outputs, gradients and FP8 state as the opaque path over
// several steps in every mode (high precision, calibrating, the three recipes) for LayerNorm and
// RMSNorm, with the inputs moved before the backward; exact shape-only sizes; bad memory and bad
// inputs are errors that change nothing; TE_BACKWARD_ONCE drops the record.
#include "caller_residuals_test_util.h"
#include "layernorm_modules_test_util.h"

namespace lt = te_test;
using lt::HostTensor;
using lt::Mode;

namespace {

constexpr int64_t kB = 2, kS = 16, kTokens = kB * kS, kIn = 64, kOut = 48;

te_layernorm_linear_options options(te_norm_kind kind) {
  te_layernorm_linear_options o;
  EXPECT_TE_OK(te_layernorm_linear_options_init(&o));
  o.in_features = kIn;
  o.out_features = kOut;
  o.activation_dtype = TE_DTYPE_BF16;
  o.normalization = kind;
  o.bias = 1;
  return o;
}

struct Data {
  bool layer;
  HostTensor x, gamma, beta, w, b, dy;
  Data(te_norm_kind kind, uint32_t seed)
      : layer(kind == TE_NORM_LAYERNORM),
        x(lt::random_tensor(TE_DTYPE_BF16, {kB, kS, kIn}, -2.0f, 3.0f, seed + 1)),
        gamma(lt::random_tensor(TE_DTYPE_BF16, {kIn}, 0.5f, 1.5f, seed + 2)),
        beta(lt::random_tensor(TE_DTYPE_BF16, {kIn}, -0.5f, 0.5f, seed + 3)),
        w(lt::random_tensor(TE_DTYPE_BF16, {kOut, kIn}, -0.2f, 0.2f, seed + 4)),
        b(lt::random_tensor(TE_DTYPE_BF16, {kOut}, -1.0f, 1.0f, seed + 5)),
        dy(lt::random_tensor(TE_DTYPE_BF16, {kB, kS, kOut}, -1.0f, 1.0f, seed + 6)) {}
  te_layernorm_linear_forward_args args(te_tensor *ln_out = nullptr) {
    te_layernorm_linear_forward_args a;
    EXPECT_TE_OK(te_layernorm_linear_forward_args_init(&a));
    a.input = x.get();
    a.ln_weight = gamma.get();
    a.ln_bias = layer ? beta.get() : nullptr;
    a.weight = w.get();
    a.bias = b.get();
    a.ln_out = ln_out;
    return a;
  }
};

struct Grads {
  HostTensor dx{lt::make_tensor(TE_DTYPE_BF16, {kB, kS, kIn})}, dgamma{lt::make_tensor(TE_DTYPE_BF16, {kIn})},
      dbeta{lt::make_tensor(TE_DTYPE_BF16, {kIn})}, dw{lt::make_tensor(TE_DTYPE_BF16, {kOut, kIn})},
      db{lt::make_tensor(TE_DTYPE_BF16, {kOut})};
  te_layernorm_linear_grads all(bool layer) {
    te_layernorm_linear_grads g;
    EXPECT_TE_OK(te_layernorm_linear_grads_init(&g));
    g.dx = dx.get();
    g.dln_weight = dgamma.get();
    g.dln_bias = layer ? dbeta.get() : nullptr;
    g.dw = dw.get();
    g.db = db.get();
    return g;
  }
  bool operator==(const Grads &o) const {
    return lt::bitwise_equal(dx, o.dx) && lt::bitwise_equal(dgamma, o.dgamma) && lt::bitwise_equal(dbeta, o.dbeta) &&
           lt::bitwise_equal(dw, o.dw) && lt::bitwise_equal(db, o.db);
  }
};

using Param = std::tuple<Mode, te_norm_kind>;
class LnLinearCallerResiduals : public ::testing::TestWithParam<Param> {};

// One layer through the opaque path and one through the caller's memory, each in its own context
// with the same calls, three steps: y, ln_out, every gradient and the serialized FP8 state agree
// bit for bit. The caller path's backward gets copies of the inputs (moved tensors).
TEST_P(LnLinearCallerResiduals, SameAsOpaquePathOverSteps) {
  const Mode mode = std::get<0>(GetParam());
  const te_norm_kind kind = std::get<1>(GetParam());
  lt::ContextPtr ctx_a = lt::make_cpu_context(), ctx_c = lt::make_cpu_context();
  lt::RecipePtr r = lt::recipe_for(mode);
  lt::LnLinearPtr a = lt::make_ln_linear(ctx_a.get(), options(kind));
  lt::LnLinearPtr c = lt::make_ln_linear(ctx_c.get(), options(kind));
  std::unique_ptr<lt::Block> pending;
  for (int step = 0; step < 3; ++step) {
    Data d(kind, 10 * step + 1), dc = d;
    HostTensor ln_a = lt::make_tensor(TE_DTYPE_BF16, {kB, kS, kIn}), ln_c = ln_a;
    te_layernorm_linear_forward_args fa = d.args(ln_a.get()), fc = dc.args(ln_c.get());
    HostTensor ya = lt::make_tensor(TE_DTYPE_BF16, {kB, kS, kOut}), yc = ya;
    te_layernorm_linear_backward_ctx *bwd = nullptr;
    std::unique_ptr<lt::Block> block;
    {
      auto sa = lt::scope_for(ctx_a.get(), mode, r.get()), sc = lt::scope_for(ctx_c.get(), mode, r.get());
      size_t need = 0;
      ASSERT_TE_OK(te_layernorm_linear_residuals_size(ctx_c.get(), c.get(), &fc, &need));
      EXPECT_GT(need, static_cast<size_t>(kTokens * kIn));
      block.reset(new lt::Block(need));
      ASSERT_TE_OK(te_layernorm_linear_forward(ctx_a.get(), a.get(), &fa, ya.get(), &bwd));
      ASSERT_TE_OK(te_layernorm_linear_forward_compute_into(ctx_c.get(), c.get(), &fc, yc.get(), block->p,
                                                            block->bytes));
    }
    lt::LnLinearBwdPtr keep(bwd);
    EXPECT_TRUE(lt::bitwise_equal(ya, yc)) << "step " << step << ": y";
    EXPECT_TRUE(lt::bitwise_equal(ln_a, ln_c)) << "step " << step << ": ln_out";
    EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx_a.get(), a.get()), lt::module_state(ctx_c.get(), c.get())))
        << "after forward";
    Data moved = dc;  // the same values at other addresses; the forward's are overwritten
    dc.x.fill_byte(0x7F);
    dc.gamma.fill_byte(0x7F);
    dc.w.fill_byte(0x7F);
    te_layernorm_linear_forward_args fm = moved.args();
    Grads ga, ga2, gc, gc2;
    te_layernorm_linear_grads gga = ga.all(d.layer), gga2 = ga2.all(d.layer), ggc = gc.all(d.layer),
                              ggc2 = gc2.all(d.layer);
    const te_linear_backward_args none = lt::backward_flags(0), once = lt::backward_flags(TE_BACKWARD_ONCE);
    ASSERT_TE_OK(te_layernorm_linear_backward(ctx_a.get(), bwd, moved.dy.get(), &gga, &none));
    ASSERT_TE_OK(te_layernorm_linear_backward(ctx_a.get(), bwd, moved.dy.get(), &gga2, &once));
    ASSERT_TE_OK(te_layernorm_linear_backward_from(ctx_c.get(), c.get(), &fm, block->p, block->bytes,
                                                   moved.dy.get(), &ggc, &none));
    ASSERT_TE_OK(te_layernorm_linear_backward_from(ctx_c.get(), c.get(), &fm, block->p, block->bytes,
                                                   moved.dy.get(), &ggc2, &once));
    EXPECT_TRUE(ga == gc) << "step " << step;
    EXPECT_TRUE(ga2 == gc2) << "step " << step;
    EXPECT_TRUE(ga == ga2) << "step " << step;
    EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx_a.get(), a.get()), lt::module_state(ctx_c.get(), c.get())))
        << "after backward";
    // TE_BACKWARD_ONCE dropped the record.
    EXPECT_EQ(te_layernorm_linear_backward_from(ctx_c.get(), c.get(), &fm, block->p, block->bytes, moved.dy.get(),
                                                &ggc, &none),
              TE_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(lt::error_names("te_layernorm_linear_backward_from: argument 'residuals'")) << te_last_error();
    if (step == 2) {  // a pending forward: destroying the layer frees its record (LSan)
      auto sc = lt::scope_for(ctx_c.get(), mode, r.get());
      pending = std::move(block);
      ASSERT_TE_OK(te_layernorm_linear_forward_compute_into(ctx_c.get(), c.get(), &fm, yc.get(), pending->p,
                                                            pending->bytes));
    }
  }
  c.reset();
}

INSTANTIATE_TEST_SUITE_P(
    Modes, LnLinearCallerResiduals,
    ::testing::Combine(::testing::Values(Mode::HighPrecision, Mode::Calibrating, Mode::Delayed, Mode::Current,
                                         Mode::Block),
                       ::testing::Values(TE_NORM_LAYERNORM, TE_NORM_RMSNORM)),
    [](const ::testing::TestParamInfo<Param> &i) {
      return std::string(lt::mode_name(std::get<0>(i.param))) +
             (std::get<1>(i.param) == TE_NORM_LAYERNORM ? "LayerNorm" : "RMSNorm");
    });

// residuals_size reads shapes only and is exact: statistics, then the activation residual.
TEST(LnLinearCallerResidualsSize, ReadsShapesOnly) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = lt::make_recipe(TE_RECIPE_CURRENT_SCALING);
  lt::LnLinearPtr ln = lt::make_ln_linear(ctx.get(), options(TE_NORM_LAYERNORM));
  lt::LnLinearPtr rms = lt::make_ln_linear(ctx.get(), options(TE_NORM_RMSNORM));
  Data d(TE_NORM_LAYERNORM, 3);
  te_tensor x = *d.x.get();
  x.data = nullptr;
  te_layernorm_linear_forward_args fa;
  ASSERT_TE_OK(te_layernorm_linear_forward_args_init(&fa));
  fa.input = &x;
  size_t need = 0;
  // High precision: mu, rsigma (32 floats, padded to 256 each) and the normalised x in BF16.
  ASSERT_TE_OK(te_layernorm_linear_residuals_size(ctx.get(), ln.get(), &fa, &need));
  EXPECT_EQ(need, 2 * 256u + kTokens * kIn * 2);
  ASSERT_TE_OK(te_layernorm_linear_residuals_size(ctx.get(), rms.get(), &fa, &need));
  EXPECT_EQ(need, 256u + kTokens * kIn * 2);
  {
    lt::AutocastScope s(ctx.get(), r.get());
    // FP8: the statistics, x^T codes [64, 32] and one scale_inv float padded to 256.
    ASSERT_TE_OK(te_layernorm_linear_residuals_size(ctx.get(), ln.get(), &fa, &need));
    EXPECT_EQ(need, 2 * 256u + 2048u + 256u);
    x.shape[2] = kIn + 1;
    EXPECT_EQ(te_layernorm_linear_residuals_size(ctx.get(), ln.get(), &fa, &need), TE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(te_layernorm_linear_residuals_size(ctx.get(), ln.get(), &fa, nullptr), TE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(te_layernorm_linear_residuals_size(ctx.get(), ln.get(), nullptr, &need), TE_ERROR_INVALID_ARGUMENT);
  }
}

// Memory that cannot take the residuals is an error that changes neither y, ln_out nor the FP8
// state; a backward from memory no forward filled, or with bad inputs, changes no gradient.
TEST(LnLinearCallerResidualsErrors, BadMemoryChangesNothing) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = lt::make_recipe(TE_RECIPE_DELAYED_SCALING);
  lt::LnLinearPtr c = lt::make_ln_linear(ctx.get(), options(TE_NORM_LAYERNORM));
  Data d(TE_NORM_LAYERNORM, 5);
  HostTensor ln = lt::make_tensor(TE_DTYPE_BF16, {kB, kS, kIn});
  te_layernorm_linear_forward_args fa = d.args(ln.get());
  HostTensor y = lt::make_tensor(TE_DTYPE_BF16, {kB, kS, kOut});
  const HostTensor y0 = y, ln0 = ln;
  const std::vector<unsigned char> state0 = lt::module_state(ctx.get(), c.get());
  size_t need = 0;
  std::unique_ptr<lt::Block> block;
  {
    lt::AutocastScope s(ctx.get(), r.get());
    ASSERT_TE_OK(te_layernorm_linear_residuals_size(ctx.get(), c.get(), &fa, &need));
    block.reset(new lt::Block(need + 256));
    struct Case {
      void *p;
      size_t bytes;
      const char *what;
    } cases[] = {{nullptr, need, "NULL"},
                 {block->p, need - 1, "residuals_bytes"},
                 {static_cast<char *>(block->p) + 1, need, "aligned"}};
    for (const Case &k : cases) {
      EXPECT_EQ(te_layernorm_linear_forward_compute_into(ctx.get(), c.get(), &fa, y.get(), k.p, k.bytes),
                TE_ERROR_INVALID_ARGUMENT)
          << k.what;
      EXPECT_TRUE(lt::error_names(k.what)) << te_last_error();
      EXPECT_TRUE(lt::bitwise_equal(y, y0)) << k.what;
      EXPECT_TRUE(lt::bitwise_equal(ln, ln0)) << k.what;
    }
  }
  EXPECT_EQ(lt::module_state(ctx.get(), c.get()), state0);
  Grads g, g0;
  te_layernorm_linear_grads gg = g.all(true);
  const te_linear_backward_args none = lt::backward_flags(0);
  EXPECT_EQ(te_layernorm_linear_backward_from(ctx.get(), c.get(), &fa, block->p, block->bytes, d.dy.get(), &gg,
                                              &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("argument 'residuals'")) << te_last_error();
  EXPECT_EQ(te_layernorm_linear_backward_from(ctx.get(), c.get(), &fa, nullptr, 0, d.dy.get(), &gg, &none),
            TE_ERROR_INVALID_ARGUMENT);
  // A real forward, then a backward without inputs, with too few bytes, with inputs of another
  // shape: errors that write nothing.
  {
    lt::AutocastScope s(ctx.get(), r.get());
    ASSERT_TE_OK(te_layernorm_linear_forward_compute_into(ctx.get(), c.get(), &fa, y.get(), block->p, need));
  }
  EXPECT_EQ(te_layernorm_linear_backward_from(ctx.get(), c.get(), nullptr, block->p, need, d.dy.get(), &gg, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("argument 'inputs'")) << te_last_error();
  EXPECT_EQ(te_layernorm_linear_backward_from(ctx.get(), c.get(), &fa, block->p, need - 1, d.dy.get(), &gg, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("residuals_bytes")) << te_last_error();
  HostTensor x2 = lt::random_tensor(TE_DTYPE_BF16, {kTokens / 2, kIn}, -1.0f, 1.0f, 77);
  te_layernorm_linear_forward_args bad = fa;
  bad.input = x2.get();
  bad.ln_out = nullptr;
  EXPECT_EQ(te_layernorm_linear_backward_from(ctx.get(), c.get(), &bad, block->p, need, d.dy.get(), &gg, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("inputs->input")) << te_last_error();
  bad = fa;
  bad.ln_bias = nullptr;
  EXPECT_EQ(te_layernorm_linear_backward_from(ctx.get(), c.get(), &bad, block->p, need, d.dy.get(), &gg, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("inputs->ln_bias")) << te_last_error();
  EXPECT_TRUE(g == g0);
  // The record is still there.
  EXPECT_TE_OK(te_layernorm_linear_backward_from(ctx.get(), c.get(), &fa, block->p, need, d.dy.get(), &gg, &none));
}

}  // namespace
