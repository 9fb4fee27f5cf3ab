// te_layernorm_mlp's residuals in the caller's memory (residuals_size, forward_compute_into,
// backward_from): bitwise the same outputs, gradients and FP8 state as the opaque path over
// several steps in every mode (high precision, calibrating, the three recipes) for LayerNorm and
// RMSNorm, gated (SwiGLU) and plain (GELU) activations, with the inputs moved before the
// backward; exact shape-only sizes; bad memory and bad inputs are errors that change nothing;
// TE_BACKWARD_ONCE drops the record.
#include "caller_residuals_test_util.h"
#include "layernorm_modules_test_util.h"

namespace lt = te_test;
using lt::HostTensor;
using lt::Mode;

namespace {

constexpr int64_t kB = 2, kS = 16, kTokens = kB * kS, kHidden = 64, kFfn = 48;

bool gated(te_activation a) { return a == TE_ACTIVATION_SWIGLU || a == TE_ACTIVATION_GEGLU; }

te_layernorm_mlp_options options(te_norm_kind kind, te_activation act) {
  te_layernorm_mlp_options o;
  EXPECT_TE_OK(te_layernorm_mlp_options_init(&o));
  o.hidden_size = kHidden;
  o.ffn_hidden_size = kFfn;
  o.activation = act;
  o.activation_dtype = TE_DTYPE_BF16;
  o.normalization = kind;
  o.bias = 1;
  return o;
}

struct Data {
  bool layer;
  int64_t fc1;
  HostTensor x, gamma, beta, w1, b1, w2, b2, dy;
  Data(te_norm_kind kind, te_activation act, uint32_t seed)
      : layer(kind == TE_NORM_LAYERNORM),
        fc1(gated(act) ? 2 * kFfn : kFfn),
        x(lt::random_tensor(TE_DTYPE_BF16, {kB, kS, kHidden}, -2.0f, 3.0f, seed + 1)),
        gamma(lt::random_tensor(TE_DTYPE_BF16, {kHidden}, 0.5f, 1.5f, seed + 2)),
        beta(lt::random_tensor(TE_DTYPE_BF16, {kHidden}, -0.5f, 0.5f, seed + 3)),
        w1(lt::random_tensor(TE_DTYPE_BF16, {fc1, kHidden}, -0.2f, 0.2f, seed + 4)),
        b1(lt::random_tensor(TE_DTYPE_BF16, {fc1}, -1.0f, 1.0f, seed + 5)),
        w2(lt::random_tensor(TE_DTYPE_BF16, {kHidden, kFfn}, -0.2f, 0.2f, seed + 6)),
        b2(lt::random_tensor(TE_DTYPE_BF16, {kHidden}, -1.0f, 1.0f, seed + 7)),
        dy(lt::random_tensor(TE_DTYPE_BF16, {kB, kS, kHidden}, -1.0f, 1.0f, seed + 8)) {}
  te_layernorm_mlp_forward_args args(te_tensor *ln_out = nullptr) {
    te_layernorm_mlp_forward_args a;
    EXPECT_TE_OK(te_layernorm_mlp_forward_args_init(&a));
    a.input = x.get();
    a.ln_weight = gamma.get();
    a.ln_bias = layer ? beta.get() : nullptr;
    a.fc1_weight = w1.get();
    a.fc1_bias = b1.get();
    a.fc2_weight = w2.get();
    a.fc2_bias = b2.get();
    a.ln_out = ln_out;
    return a;
  }
  void scribble() {
    for (HostTensor *t : {&x, &gamma, &beta, &w1, &b1, &w2, &b2}) t->fill_byte(0x7F);
  }
};

struct Grads {
  HostTensor dx, dgamma, dbeta, dw1, db1, dw2, db2;
  explicit Grads(int64_t fc1)
      : dx(lt::make_tensor(TE_DTYPE_BF16, {kB, kS, kHidden})),
        dgamma(lt::make_tensor(TE_DTYPE_BF16, {kHidden})),
        dbeta(lt::make_tensor(TE_DTYPE_BF16, {kHidden})),
        dw1(lt::make_tensor(TE_DTYPE_BF16, {fc1, kHidden})),
        db1(lt::make_tensor(TE_DTYPE_BF16, {fc1})),
        dw2(lt::make_tensor(TE_DTYPE_BF16, {kHidden, kFfn})),
        db2(lt::make_tensor(TE_DTYPE_BF16, {kHidden})) {}
  te_layernorm_mlp_grads all(bool layer) {
    te_layernorm_mlp_grads g;
    EXPECT_TE_OK(te_layernorm_mlp_grads_init(&g));
    g.dx = dx.get();
    g.dln_weight = dgamma.get();
    g.dln_bias = layer ? dbeta.get() : nullptr;
    g.dfc1_weight = dw1.get();
    g.dfc1_bias = db1.get();
    g.dfc2_weight = dw2.get();
    g.dfc2_bias = db2.get();
    return g;
  }
  bool operator==(const Grads &o) const {
    return lt::bitwise_equal(dx, o.dx) && lt::bitwise_equal(dgamma, o.dgamma) && lt::bitwise_equal(dbeta, o.dbeta) &&
           lt::bitwise_equal(dw1, o.dw1) && lt::bitwise_equal(db1, o.db1) && lt::bitwise_equal(dw2, o.dw2) &&
           lt::bitwise_equal(db2, o.db2);
  }
};

using Param = std::tuple<Mode, te_norm_kind, te_activation>;
class MlpCallerResiduals : public ::testing::TestWithParam<Param> {};

TEST_P(MlpCallerResiduals, SameAsOpaquePathOverSteps) {
  const Mode mode = std::get<0>(GetParam());
  const te_norm_kind kind = std::get<1>(GetParam());
  const te_activation act = std::get<2>(GetParam());
  lt::ContextPtr ctx_a = lt::make_cpu_context(), ctx_c = lt::make_cpu_context();
  lt::RecipePtr r = lt::recipe_for(mode);
  lt::MlpPtr a = lt::make_mlp(ctx_a.get(), options(kind, act));
  lt::MlpPtr c = lt::make_mlp(ctx_c.get(), options(kind, act));
  std::unique_ptr<lt::Block> pending;
  for (int step = 0; step < 3; ++step) {
    Data d(kind, act, 10 * step + 1), dc = d;
    HostTensor ln_a = lt::make_tensor(TE_DTYPE_BF16, {kB, kS, kHidden}), ln_c = ln_a;
    te_layernorm_mlp_forward_args fa = d.args(ln_a.get()), fc = dc.args(ln_c.get());
    HostTensor ya = lt::make_tensor(TE_DTYPE_BF16, {kB, kS, kHidden}), yc = ya;
    te_layernorm_mlp_backward_ctx *bwd = nullptr;
    std::unique_ptr<lt::Block> block;
    {
      auto sa = lt::scope_for(ctx_a.get(), mode, r.get()), sc = lt::scope_for(ctx_c.get(), mode, r.get());
      size_t need = 0;
      ASSERT_TE_OK(te_layernorm_mlp_residuals_size(ctx_c.get(), c.get(), &fc, &need));
      EXPECT_GT(need, static_cast<size_t>(kTokens * (kHidden + kFfn)));
      block.reset(new lt::Block(need));
      ASSERT_TE_OK(te_layernorm_mlp_forward(ctx_a.get(), a.get(), &fa, ya.get(), &bwd));
      ASSERT_TE_OK(te_layernorm_mlp_forward_compute_into(ctx_c.get(), c.get(), &fc, yc.get(), block->p,
                                                         block->bytes));
    }
    lt::MlpBwdPtr keep(bwd);
    EXPECT_TRUE(lt::bitwise_equal(ya, yc)) << "step " << step << ": y";
    EXPECT_TRUE(lt::bitwise_equal(ln_a, ln_c)) << "step " << step << ": ln_out";
    EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx_a.get(), a.get()), lt::module_state(ctx_c.get(), c.get())))
        << "after forward";
    Data moved = dc;  // the same values at other addresses; the forward's are overwritten
    dc.scribble();
    te_layernorm_mlp_forward_args fm = moved.args();
    Grads ga(d.fc1), ga2(d.fc1), gc(d.fc1), gc2(d.fc1);
    te_layernorm_mlp_grads gga = ga.all(d.layer), gga2 = ga2.all(d.layer), ggc = gc.all(d.layer),
                           ggc2 = gc2.all(d.layer);
    const te_linear_backward_args none = lt::backward_flags(0), once = lt::backward_flags(TE_BACKWARD_ONCE);
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx_a.get(), bwd, moved.dy.get(), &gga, &none));
    ASSERT_TE_OK(te_layernorm_mlp_backward(ctx_a.get(), bwd, moved.dy.get(), &gga2, &once));
    ASSERT_TE_OK(te_layernorm_mlp_backward_from(ctx_c.get(), c.get(), &fm, block->p, block->bytes, moved.dy.get(),
                                                &ggc, &none));
    ASSERT_TE_OK(te_layernorm_mlp_backward_from(ctx_c.get(), c.get(), &fm, block->p, block->bytes, moved.dy.get(),
                                                &ggc2, &once));
    EXPECT_TRUE(ga == gc) << "step " << step;
    EXPECT_TRUE(ga2 == gc2) << "step " << step;
    EXPECT_TRUE(ga == ga2) << "step " << step;
    EXPECT_TRUE(lt::SameBytes(lt::module_state(ctx_a.get(), a.get()), lt::module_state(ctx_c.get(), c.get())))
        << "after backward";
    EXPECT_EQ(te_layernorm_mlp_backward_from(ctx_c.get(), c.get(), &fm, block->p, block->bytes, moved.dy.get(),
                                             &ggc, &none),
              TE_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(lt::error_names("te_layernorm_mlp_backward_from: argument 'residuals'")) << te_last_error();
    if (step == 2) {  // a pending forward: destroying the module frees its record (LSan)
      auto sc = lt::scope_for(ctx_c.get(), mode, r.get());
      pending = std::move(block);
      ASSERT_TE_OK(te_layernorm_mlp_forward_compute_into(ctx_c.get(), c.get(), &fm, yc.get(), pending->p,
                                                         pending->bytes));
    }
  }
  c.reset();
}

INSTANTIATE_TEST_SUITE_P(
    Modes, MlpCallerResiduals,
    ::testing::Combine(::testing::Values(Mode::HighPrecision, Mode::Calibrating, Mode::Delayed, Mode::Current,
                                         Mode::Block),
                       ::testing::Values(TE_NORM_LAYERNORM, TE_NORM_RMSNORM),
                       ::testing::Values(TE_ACTIVATION_SWIGLU, TE_ACTIVATION_GELU)),
    [](const ::testing::TestParamInfo<Param> &i) {
      return std::string(lt::mode_name(std::get<0>(i.param))) +
             (std::get<1>(i.param) == TE_NORM_LAYERNORM ? "LayerNorm" : "RMSNorm") +
             (std::get<2>(i.param) == TE_ACTIVATION_SWIGLU ? "SwiGLU" : "GELU");
    });

// residuals_size reads shapes only and is exact.
TEST(MlpCallerResidualsSize, ReadsShapesOnly) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = lt::make_recipe(TE_RECIPE_CURRENT_SCALING);
  lt::MlpPtr swiglu = lt::make_mlp(ctx.get(), options(TE_NORM_LAYERNORM, TE_ACTIVATION_SWIGLU));
  lt::MlpPtr gelu = lt::make_mlp(ctx.get(), options(TE_NORM_RMSNORM, TE_ACTIVATION_GELU));
  Data d(TE_NORM_LAYERNORM, TE_ACTIVATION_SWIGLU, 3);
  te_tensor x = *d.x.get();
  x.data = nullptr;
  te_layernorm_mlp_forward_args fa;
  ASSERT_TE_OK(te_layernorm_mlp_forward_args_init(&fa));
  fa.input = &x;
  size_t need = 0;
  // High precision: mu, rsigma (256 each), fc1 out [32, 96] BF16, ln [32, 64], act [32, 48].
  ASSERT_TE_OK(te_layernorm_mlp_residuals_size(ctx.get(), swiglu.get(), &fa, &need));
  EXPECT_EQ(need, 2 * 256u + 32 * 96 * 2 + 32 * 64 * 2 + 32 * 48 * 2);
  ASSERT_TE_OK(te_layernorm_mlp_residuals_size(ctx.get(), gelu.get(), &fa, &need));
  EXPECT_EQ(need, 256u + 32 * 48 * 2 + 32 * 64 * 2 + 32 * 48 * 2);
  lt::AutocastScope s(ctx.get(), r.get());
  // FP8: the statistics, fc1 out, x^T codes [64, 32] and [48, 32], one scale_inv each (256).
  ASSERT_TE_OK(te_layernorm_mlp_residuals_size(ctx.get(), swiglu.get(), &fa, &need));
  EXPECT_EQ(need, 2 * 256u + 32 * 96 * 2 + 2048u + 256u + 1536u + 256u);
  x.shape[2] = kHidden + 1;
  EXPECT_EQ(te_layernorm_mlp_residuals_size(ctx.get(), swiglu.get(), &fa, &need), TE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(te_layernorm_mlp_residuals_size(ctx.get(), swiglu.get(), &fa, nullptr), TE_ERROR_INVALID_ARGUMENT);
}

TEST(MlpCallerResidualsErrors, BadMemoryChangesNothing) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = lt::make_recipe(TE_RECIPE_DELAYED_SCALING);
  lt::MlpPtr c = lt::make_mlp(ctx.get(), options(TE_NORM_LAYERNORM, TE_ACTIVATION_SWIGLU));
  Data d(TE_NORM_LAYERNORM, TE_ACTIVATION_SWIGLU, 5);
  HostTensor ln = lt::make_tensor(TE_DTYPE_BF16, {kB, kS, kHidden});
  te_layernorm_mlp_forward_args fa = d.args(ln.get());
  HostTensor y = lt::make_tensor(TE_DTYPE_BF16, {kB, kS, kHidden});
  const HostTensor y0 = y, ln0 = ln;
  const std::vector<unsigned char> state0 = lt::module_state(ctx.get(), c.get());
  size_t need = 0;
  std::unique_ptr<lt::Block> block;
  {
    lt::AutocastScope s(ctx.get(), r.get());
    ASSERT_TE_OK(te_layernorm_mlp_residuals_size(ctx.get(), c.get(), &fa, &need));
    block.reset(new lt::Block(need + 256));
    struct Case {
      void *p;
      size_t bytes;
      const char *what;
    } cases[] = {{nullptr, need, "NULL"},
                 {block->p, need - 1, "residuals_bytes"},
                 {static_cast<char *>(block->p) + 1, need, "aligned"}};
    for (const Case &k : cases) {
      EXPECT_EQ(te_layernorm_mlp_forward_compute_into(ctx.get(), c.get(), &fa, y.get(), k.p, k.bytes),
                TE_ERROR_INVALID_ARGUMENT)
          << k.what;
      EXPECT_TRUE(lt::error_names(k.what)) << te_last_error();
      EXPECT_TRUE(lt::bitwise_equal(y, y0)) << k.what;
      EXPECT_TRUE(lt::bitwise_equal(ln, ln0)) << k.what;
    }
  }
  EXPECT_EQ(lt::module_state(ctx.get(), c.get()), state0);
  Grads g(d.fc1), g0(d.fc1);
  te_layernorm_mlp_grads gg = g.all(true);
  const te_linear_backward_args none = lt::backward_flags(0);
  EXPECT_EQ(te_layernorm_mlp_backward_from(ctx.get(), c.get(), &fa, block->p, block->bytes, d.dy.get(), &gg, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("argument 'residuals'")) << te_last_error();
  EXPECT_EQ(te_layernorm_mlp_backward_from(ctx.get(), c.get(), &fa, nullptr, 0, d.dy.get(), &gg, &none),
            TE_ERROR_INVALID_ARGUMENT);
  {
    lt::AutocastScope s(ctx.get(), r.get());
    ASSERT_TE_OK(te_layernorm_mlp_forward_compute_into(ctx.get(), c.get(), &fa, y.get(), block->p, need));
  }
  EXPECT_EQ(te_layernorm_mlp_backward_from(ctx.get(), c.get(), nullptr, block->p, need, d.dy.get(), &gg, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("argument 'inputs'")) << te_last_error();
  EXPECT_EQ(te_layernorm_mlp_backward_from(ctx.get(), c.get(), &fa, block->p, need - 1, d.dy.get(), &gg, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("residuals_bytes")) << te_last_error();
  HostTensor x2 = lt::random_tensor(TE_DTYPE_BF16, {kTokens / 2, kHidden}, -1.0f, 1.0f, 77);
  te_layernorm_mlp_forward_args bad = fa;
  bad.input = x2.get();
  bad.ln_out = nullptr;
  EXPECT_EQ(te_layernorm_mlp_backward_from(ctx.get(), c.get(), &bad, block->p, need, d.dy.get(), &gg, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("inputs->input")) << te_last_error();
  bad = fa;
  bad.fc2_weight = d.w1.get();
  EXPECT_EQ(te_layernorm_mlp_backward_from(ctx.get(), c.get(), &bad, block->p, need, d.dy.get(), &gg, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("inputs->fc2_weight")) << te_last_error();
  EXPECT_TRUE(g == g0);
  EXPECT_TE_OK(te_layernorm_mlp_backward_from(ctx.get(), c.get(), &fa, block->p, need, d.dy.get(), &gg, &none));
}

}  // namespace
