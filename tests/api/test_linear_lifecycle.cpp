// te_linear lifecycle: forward = compute + save, residual ownership (save once, release),
// retain-graph backward (bitwise repeatable) and TE_BACKWARD_ONCE, skipped outputs, fused wgrad
// accumulation into an F32 main_grad, the FP8 weight cache and its copy-on-write with respect
// to backward contexts, and handles outliving each other.
#include "linear_test_util.h"

namespace lt = te_test;

namespace {

constexpr int64_t kB = 2, kS = 16, kTokens = kB * kS, kIn = 64, kOut = 48;

// One layer's worth of caller data.
struct Data {
  te_dtype act;
  lt::HostTensor x, w, b, dy;
  Data(te_dtype a, uint32_t seed)
      : act(a),
        x(lt::random_tensor(a, {kB, kS, kIn}, -2.0f, 2.0f, seed + 1)),
        w(lt::random_tensor(a, {kOut, kIn}, -0.5f, 0.5f, seed + 2)),
        b(lt::random_tensor(a, {kOut}, -1.0f, 1.0f, seed + 3)),
        dy(lt::random_tensor(a, {kB, kS, kOut}, -0.05f, 0.05f, seed + 4)) {}
  te_linear_forward_args args(int with_bias = 1, int weight_unchanged = 0) {
    te_linear_forward_args fa;
    te_linear_forward_args_init(&fa);
    fa.input = x.get();
    fa.weight = w.get();
    fa.bias = with_bias ? b.get() : nullptr;
    fa.weight_unchanged = weight_unchanged;
    return fa;
  }
};

struct Grads {
  lt::HostTensor dx, dw, db;
  explicit Grads(te_dtype act, te_dtype dw_dtype = TE_DTYPE_F32, bool fused = false)
      : dx(act, {kB, kS, kIn}), dw(fused ? dw_dtype : act, {kOut, kIn}), db(act, {kOut}) {
    dx.fill_byte(0x5A);
    dw.fill_byte(0x5A);
    db.fill_byte(0x5A);
  }
};

te_status run_backward(te_context *ctx, te_linear_backward_ctx *bwd, Data &d, Grads &g,
                       uint32_t flags = 0, bool with_db = true) {
  te_linear_backward_args ba;
  te_linear_backward_args_init(&ba);
  ba.flags = flags;
  return te_linear_backward(ctx, bwd, d.dy.get(), g.dx.get(), g.dw.get(), with_db ? g.db.get() : nullptr,
                            &ba);
}

// The two backward passes' dx, dw and db are bitwise the same.
void expect_same_grads(const Grads &a, const Grads &b, const char *what = "grads") {
  EXPECT_TRUE(lt::bitwise_equal(a.dx, b.dx)) << what << ": dx differs";
  EXPECT_TRUE(lt::bitwise_equal(a.dw, b.dw)) << what << ": dw differs";
  EXPECT_TRUE(lt::bitwise_equal(a.db, b.db)) << what << ": db differs";
}

enum RecipeChoice { kDelayed = 0, kCurrent = 1, kBlock = 2 };
const char *name_of(int r) { return r == kDelayed ? "Delayed" : r == kCurrent ? "Current" : "Block"; }

class LinearLifecycleRecipes : public ::testing::TestWithParam<int> {
 protected:
  lt::RecipePtr recipe() { return lt::make_recipe(static_cast<te_recipe_kind>(GetParam())); }
};

// te_linear_forward gives bitwise the same y and gradients as compute followed by save.
TEST_P(LinearLifecycleRecipes, ForwardEqualsComputePlusSave) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = recipe();
  lt::LinearPtr a = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  lt::LinearPtr b = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(TE_DTYPE_BF16, 100);
  lt::HostTensor ya(TE_DTYPE_BF16, {kB, kS, kOut}), yb(TE_DTYPE_BF16, {kB, kS, kOut});
  te_linear_backward_ctx *ba = nullptr, *bb = nullptr;
  te_linear_forward_args fa = d.args();
  {
    lt::AutocastScope s(ctx.get(), r.get());
    ASSERT_EQ(te_linear_forward(ctx.get(), a.get(), &fa, ya.get(), &ba), TE_SUCCESS) << te_last_error();
    te_linear_residuals res{};
    res.struct_size = sizeof(res);
    ASSERT_EQ(te_linear_forward_compute(ctx.get(), b.get(), &fa, yb.get(), &res), TE_SUCCESS)
        << te_last_error();
    ASSERT_EQ(te_linear_forward_save(ctx.get(), b.get(), &res, &bb), TE_SUCCESS) << te_last_error();
    EXPECT_EQ(res.internal, nullptr);
  }
  lt::BackwardPtr hold_a(ba), hold_b(bb);
  EXPECT_TRUE(lt::bitwise_equal(ya, yb));
  Grads ga(TE_DTYPE_BF16), gb(TE_DTYPE_BF16);
  ASSERT_EQ(run_backward(ctx.get(), ba, d, ga), TE_SUCCESS) << te_last_error();
  ASSERT_EQ(run_backward(ctx.get(), bb, d, gb), TE_SUCCESS) << te_last_error();
  expect_same_grads(ga, gb);
}

// Retain-graph semantics: backward again gives bitwise identical results (even though the
// first backward updated the GRAD_OUTPUT scale under delayed scaling), and skipping outputs
// changes nothing in the others.
TEST_P(LinearLifecycleRecipes, BackwardRepeatsBitwiseAndSkipsNullOutputs) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = recipe();
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(TE_DTYPE_BF16, 200);
  lt::HostTensor y(TE_DTYPE_BF16, {kB, kS, kOut});
  te_linear_backward_ctx *raw = nullptr;
  te_linear_forward_args fa = d.args();
  {
    lt::AutocastScope s(ctx.get(), r.get());
    ASSERT_EQ(te_linear_forward(ctx.get(), lin.get(), &fa, y.get(), &raw), TE_SUCCESS) << te_last_error();
  }
  lt::BackwardPtr bwd(raw);
  Grads g1(TE_DTYPE_BF16), g2(TE_DTYPE_BF16);
  ASSERT_EQ(run_backward(ctx.get(), raw, d, g1), TE_SUCCESS) << te_last_error();
  ASSERT_EQ(run_backward(ctx.get(), raw, d, g2), TE_SUCCESS) << te_last_error();
  expect_same_grads(g1, g2, "second backward");

  // Each output alone.
  Grads only(TE_DTYPE_BF16);
  const lt::HostTensor sentinel_dx = only.dx, sentinel_dw = only.dw, sentinel_db = only.db;
  ASSERT_EQ(te_linear_backward(ctx.get(), raw, d.dy.get(), only.dx.get(), nullptr, nullptr, nullptr),
            TE_SUCCESS)
      << te_last_error();
  EXPECT_TRUE(lt::bitwise_equal(only.dx, g1.dx));
  ASSERT_EQ(te_linear_backward(ctx.get(), raw, d.dy.get(), nullptr, only.dw.get(), nullptr, nullptr),
            TE_SUCCESS)
      << te_last_error();
  EXPECT_TRUE(lt::bitwise_equal(only.dw, g1.dw));
  ASSERT_EQ(te_linear_backward(ctx.get(), raw, d.dy.get(), nullptr, nullptr, only.db.get(), nullptr),
            TE_SUCCESS)
      << te_last_error();
  EXPECT_TRUE(lt::bitwise_equal(only.db, g1.db));
  // All three skipped: a valid no-op.
  EXPECT_EQ(te_linear_backward(ctx.get(), raw, d.dy.get(), nullptr, nullptr, nullptr, nullptr),
            TE_SUCCESS)
      << te_last_error();
  (void)sentinel_dx;
  (void)sentinel_dw;
  (void)sentinel_db;
}

// TE_BACKWARD_ONCE: the call succeeds with the same results, then the context is spent.
TEST_P(LinearLifecycleRecipes, BackwardOnceFreesResiduals) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = recipe();
  lt::LinearPtr a = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  lt::LinearPtr b = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(TE_DTYPE_BF16, 300);
  lt::HostTensor y(TE_DTYPE_BF16, {kB, kS, kOut});
  te_linear_backward_ctx *ra = nullptr, *rb = nullptr;
  te_linear_forward_args fa = d.args();
  {
    lt::AutocastScope s(ctx.get(), r.get());
    ASSERT_EQ(te_linear_forward(ctx.get(), a.get(), &fa, y.get(), &ra), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(te_linear_forward(ctx.get(), b.get(), &fa, y.get(), &rb), TE_SUCCESS) << te_last_error();
  }
  lt::BackwardPtr hold_a(ra), hold_b(rb);
  // Backward b (forwarded last) before a, as an autograd engine would.
  Grads gonce(TE_DTYPE_BF16), gref(TE_DTYPE_BF16);
  ASSERT_EQ(run_backward(ctx.get(), rb, d, gonce, TE_BACKWARD_ONCE), TE_SUCCESS) << te_last_error();
  ASSERT_EQ(run_backward(ctx.get(), ra, d, gref, 0), TE_SUCCESS) << te_last_error();
  expect_same_grads(gonce, gref);

  const lt::ScalingSnapshot before = lt::live_scaling_state(ctx.get(), b.get(), TE_ROLE_GRAD_OUTPUT);
  Grads again(TE_DTYPE_BF16);
  const Grads untouched = again;
  EXPECT_EQ(run_backward(ctx.get(), rb, d, again, 0), TE_ERROR_INVALID_STATE) << te_last_error();
  EXPECT_TRUE(lt::IsError(run_backward(ctx.get(), rb, d, again, TE_BACKWARD_ONCE),
                          TE_ERROR_INVALID_STATE, "te_linear_backward", nullptr));
  expect_same_grads(again, untouched);
  EXPECT_TRUE(lt::SameState(lt::live_scaling_state(ctx.get(), b.get(), TE_ROLE_GRAD_OUTPUT), before));
}

// weight_unchanged = 1 reuses the FP8 weight of the last FP8 forward; 0 refreshes it.
TEST_P(LinearLifecycleRecipes, WeightCacheReusedOnlyWhenCallerSaysUnchanged) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = recipe();
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  lt::LinearPtr fresh = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(TE_DTYPE_BF16, 400);
  const lt::HostTensor w2 = lt::random_tensor(TE_DTYPE_BF16, {kOut, kIn}, -0.3f, 0.3f, 499);
  lt::HostTensor y1(TE_DTYPE_BF16, {kB, kS, kOut}), y2 = y1, y3 = y1, y_fresh = y1;
  lt::AutocastScope s(ctx.get(), r.get());
  auto fwd = [&](te_linear *l, int unchanged, lt::HostTensor &y) {
    te_linear_residuals res{};
    res.struct_size = sizeof(res);
    te_linear_forward_args fa = d.args(1, unchanged);
    te_status st = te_linear_forward_compute(ctx.get(), l, &fa, y.get(), &res);
    EXPECT_EQ(st, TE_SUCCESS) << te_last_error();
    te_linear_residuals_release(&res);
  };
  fwd(lin.get(), 0, y1);
  std::copy(w2.bytes.begin(), w2.bytes.end(), d.w.bytes.begin());  // the caller changes W in place
  fwd(lin.get(), 1, y2);
  EXPECT_TRUE(lt::bitwise_equal(y1, y2)) << "weight_unchanged=1 must reuse the cached FP8 W";
  fwd(lin.get(), 0, y3);
  EXPECT_FALSE(lt::bitwise_equal(y1, y3)) << "weight_unchanged=0 must requantize W";
  fwd(fresh.get(), 0, y_fresh);
  EXPECT_TRUE(lt::bitwise_equal(y3, y_fresh)) << "refreshed cache must equal a fresh quantization";
}

// A backward context keeps the FP8 weight it was made with, even after a forward refreshed
// the layer's cache (copy-on-write).
TEST_P(LinearLifecycleRecipes, BackwardContextKeepsItsWeightAfterCacheRefresh) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = recipe();
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  lt::LinearPtr twin1 = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  lt::LinearPtr twin2 = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(TE_DTYPE_BF16, 500);
  Data d2 = d;
  d2.w = lt::random_tensor(TE_DTYPE_BF16, {kOut, kIn}, -0.3f, 0.3f, 599);
  lt::HostTensor y(TE_DTYPE_BF16, {kB, kS, kOut});
  te_linear_backward_ctx *b1 = nullptr, *b2 = nullptr, *t1 = nullptr, *t2 = nullptr;
  {
    lt::AutocastScope s(ctx.get(), r.get());
    te_linear_forward_args fa = d.args();
    ASSERT_EQ(te_linear_forward(ctx.get(), lin.get(), &fa, y.get(), &b1), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(te_linear_forward(ctx.get(), twin1.get(), &fa, y.get(), &t1), TE_SUCCESS) << te_last_error();
    te_linear_forward_args fa2 = d2.args();  // new W, weight_unchanged = 0: cache refreshed
    ASSERT_EQ(te_linear_forward(ctx.get(), lin.get(), &fa2, y.get(), &b2), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(te_linear_forward(ctx.get(), twin2.get(), &fa2, y.get(), &t2), TE_SUCCESS) << te_last_error();
  }
  lt::BackwardPtr h1(b1), h2(b2), ht1(t1), ht2(t2);
  Grads g1(TE_DTYPE_BF16), gt1(TE_DTYPE_BF16);
  ASSERT_EQ(run_backward(ctx.get(), b1, d, g1), TE_SUCCESS) << te_last_error();
  ASSERT_EQ(run_backward(ctx.get(), t1, d, gt1), TE_SUCCESS) << te_last_error();
  EXPECT_TRUE(lt::bitwise_equal(g1.dx, gt1.dx)) << "dgrad of the first context must use the old W";
  if (GetParam() != kDelayed) {
    // (Under delayed scaling the first backward above updated the GRAD_OUTPUT scale of `lin`
    // but not of twin2, so their dy scales differ; the other recipes have no dy state.)
    Grads g2(TE_DTYPE_BF16), gt2(TE_DTYPE_BF16);
    ASSERT_EQ(run_backward(ctx.get(), b2, d, g2), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(run_backward(ctx.get(), t2, d, gt2), TE_SUCCESS) << te_last_error();
    EXPECT_TRUE(lt::bitwise_equal(g2.dx, gt2.dx)) << "dgrad of the second context must use the new W";
  }
}

// The layer may be destroyed before its backward contexts: they keep what they need alive.
TEST_P(LinearLifecycleRecipes, BackwardContextOutlivesLayer) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = recipe();
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  lt::LinearPtr twin = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(TE_DTYPE_BF16, 600);
  lt::HostTensor y(TE_DTYPE_BF16, {kB, kS, kOut});
  te_linear_backward_ctx *b1 = nullptr, *b2 = nullptr;
  {
    lt::AutocastScope s(ctx.get(), r.get());
    te_linear_forward_args fa = d.args();
    ASSERT_EQ(te_linear_forward(ctx.get(), twin.get(), &fa, y.get(), &b2), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(te_linear_forward(ctx.get(), lin.get(), &fa, y.get(), &b1), TE_SUCCESS) << te_last_error();
  }
  lt::BackwardPtr h1(b1), h2(b2);
  lin.reset();  // te_linear_destroy while b1 is alive
  Grads g1(TE_DTYPE_BF16), g2(TE_DTYPE_BF16);
  ASSERT_EQ(run_backward(ctx.get(), b1, d, g1), TE_SUCCESS) << te_last_error();
  ASSERT_EQ(run_backward(ctx.get(), b2, d, g2), TE_SUCCESS) << te_last_error();
  expect_same_grads(g1, g2);
}

// fuse_wgrad_accumulation: dw is the caller's F32 main_grad and backward ADDS dW into it.
TEST_P(LinearLifecycleRecipes, FusedWgradAccumulatesIntoMainGrad) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = recipe();
  lt::LinearPtr fused = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16, 1);
  lt::LinearPtr plain = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_F32, 0);
  Data d(TE_DTYPE_BF16, 700);
  // The same values in F32 for the unfused twin: the same FP8 operands, dW straight to F32.
  Data df(TE_DTYPE_F32, 700);
  auto widen = [](const lt::HostTensor &src, lt::HostTensor &dst) {
    for (int64_t i = 0; i < src.numel(); ++i) dst.set(i, src.at(i));
  };
  widen(d.x, df.x);
  widen(d.w, df.w);
  widen(d.b, df.b);
  widen(d.dy, df.dy);
  lt::HostTensor yb(TE_DTYPE_BF16, {kB, kS, kOut}), yf(TE_DTYPE_F32, {kB, kS, kOut});
  te_linear_backward_ctx *bf = nullptr, *bp = nullptr;
  {
    lt::AutocastScope s(ctx.get(), r.get());
    te_linear_forward_args fa = d.args(), fb = df.args();
    ASSERT_EQ(te_linear_forward(ctx.get(), fused.get(), &fa, yb.get(), &bf), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(te_linear_forward(ctx.get(), plain.get(), &fb, yf.get(), &bp), TE_SUCCESS) << te_last_error();
  }
  lt::BackwardPtr hf(bf), hp(bp);
  // main_grad starts at arbitrary values M.
  lt::HostTensor main_grad = lt::random_tensor(TE_DTYPE_F32, {kOut, kIn}, -1.0f, 1.0f, 777);
  const std::vector<float> m0 = main_grad.values_f32();
  lt::HostTensor dw_plain(TE_DTYPE_F32, {kOut, kIn});
  ASSERT_EQ(te_linear_backward(ctx.get(), bp, df.dy.get(), nullptr, dw_plain.get(), nullptr, nullptr),
            TE_SUCCESS)
      << te_last_error();
  ASSERT_EQ(te_linear_backward(ctx.get(), bf, d.dy.get(), nullptr, main_grad.get(), nullptr, nullptr),
            TE_SUCCESS)
      << te_last_error();
  const std::vector<float> m1 = main_grad.values_f32();
  ASSERT_EQ(te_linear_backward(ctx.get(), bf, d.dy.get(), nullptr, main_grad.get(), nullptr, nullptr),
            TE_SUCCESS)
      << te_last_error();
  const std::vector<float> m2 = main_grad.values_f32();
  // dW is computed in fp32 either way; the only extra error of fusing is the fp32 add (or a
  // GEMM beta=1 accumulation): allow a few fp32 ulps of |M| + |dW| per addition.
  int bad = 0;
  for (int64_t i = 0; i < main_grad.numel() && bad < 5; ++i) {
    const double g = dw_plain.at(i);
    const double tol1 = 4 * std::ldexp(1.0, -24) * (std::fabs(m0[i]) + std::fabs(g)) + 1e-12;
    const double tol2 = 2 * tol1 + 4 * std::ldexp(1.0, -24) * std::fabs(m1[i]);
    if (!(std::fabs(m1[i] - (m0[i] + g)) <= tol1)) {
      ++bad;
      ADD_FAILURE() << "after 1 backward main_grad[" << i << "] = " << m1[i] << ", expected M + dW = "
                    << m0[i] << " + " << g;
    }
    if (!(std::fabs(m2[i] - (m0[i] + 2 * g)) <= tol2)) {
      ++bad;
      ADD_FAILURE() << "after 2 backwards main_grad[" << i << "] = " << m2[i]
                    << ", expected M + 2 dW = " << m0[i] << " + 2*" << g;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, LinearLifecycleRecipes,
                         ::testing::Values(kDelayed, kCurrent, kBlock),
                         [](const ::testing::TestParamInfo<int> &i) { return std::string(name_of(i.param)); });

// Saving the same residuals twice, saving released residuals, releasing twice.
TEST(LinearLifecycle, ResidualsAreSavedOnceOrReleased) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(TE_DTYPE_BF16, 800);
  lt::HostTensor y(TE_DTYPE_BF16, {kB, kS, kOut});
  te_linear_forward_args fa = d.args();
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    SCOPED_TRACE(fp8 ? "FP8" : "high precision");
    std::unique_ptr<lt::AutocastScope> scope;
    if (fp8) scope.reset(new lt::AutocastScope(ctx.get(), nullptr));
    te_linear_residuals res{};
    res.struct_size = sizeof(res);
    ASSERT_EQ(te_linear_forward_compute(ctx.get(), lin.get(), &fa, y.get(), &res), TE_SUCCESS)
        << te_last_error();
    EXPECT_EQ(res.fp8, fp8);
    EXPECT_NE(res.internal, nullptr);
    te_linear_backward_ctx *raw = nullptr;
    ASSERT_EQ(te_linear_forward_save(ctx.get(), lin.get(), &res, &raw), TE_SUCCESS) << te_last_error();
    lt::BackwardPtr bwd(raw);
    EXPECT_EQ(res.internal, nullptr);
    te_linear_backward_ctx *sentinel = reinterpret_cast<te_linear_backward_ctx *>(0x1234);
    te_linear_backward_ctx *again = sentinel;
    EXPECT_TRUE(lt::IsError(te_linear_forward_save(ctx.get(), lin.get(), &res, &again),
                            TE_ERROR_INVALID_ARGUMENT, "te_linear_forward_save", "residuals"));
    EXPECT_EQ(again, sentinel);
    te_linear_residuals res2{};
    res2.struct_size = sizeof(res2);
    ASSERT_EQ(te_linear_forward_compute(ctx.get(), lin.get(), &fa, y.get(), &res2), TE_SUCCESS)
        << te_last_error();
    te_linear_residuals_release(&res2);
    EXPECT_EQ(res2.internal, nullptr);
    te_linear_residuals_release(&res2);  // idempotent
    EXPECT_TRUE(lt::IsError(te_linear_forward_save(ctx.get(), lin.get(), &res2, &again),
                            TE_ERROR_INVALID_ARGUMENT, "te_linear_forward_save", "residuals"));
    EXPECT_EQ(again, sentinel);
    te_linear_residuals_release(&res);  // already saved: nothing to free
  }
  te_linear_residuals_release(nullptr);
  te_linear_backward_ctx_destroy(nullptr);
  te_linear_destroy(nullptr);
}

// Outside a scope, in a disabled scope and in a calibrating scope the forward is high
// precision and bitwise the same; calibrating also records amax(x) and amax(W).
TEST(LinearLifecycle, HighPrecisionOutsideEnabledScopes) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  lt::RecipePtr r = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 16);
  Data d(TE_DTYPE_BF16, 900);
  te_linear_forward_args fa = d.args();
  lt::HostTensor y0(TE_DTYPE_BF16, {kB, kS, kOut}), y1 = y0, y2 = y0, y8 = y0;
  auto fwd = [&](lt::HostTensor &y, int expect_fp8) {
    te_linear_residuals res{};
    res.struct_size = sizeof(res);
    ASSERT_EQ(te_linear_forward_compute(ctx.get(), lin.get(), &fa, y.get(), &res), TE_SUCCESS)
        << te_last_error();
    EXPECT_EQ(res.fp8, expect_fp8);
    if (!expect_fp8) {
      EXPECT_EQ(res.input_t.data, static_cast<void *>(d.x.bytes.data()));
      EXPECT_EQ(res.weight_t.data, static_cast<void *>(d.w.bytes.data()));
    }
    te_linear_residuals_release(&res);
  };
  fwd(y0, 0);
  {
    lt::AutocastScope s(ctx.get(), r.get(), /*enabled=*/0);
    fwd(y1, 0);
  }
  {
    lt::AutocastScope s(ctx.get(), r.get(), /*enabled=*/0, /*calibrating=*/1);
    fwd(y2, 0);
    const lt::ScalingSnapshot in = lt::live_scaling_state(ctx.get(), lin.get(), TE_ROLE_INPUT);
    const lt::ScalingSnapshot w = lt::live_scaling_state(ctx.get(), lin.get(), TE_ROLE_WEIGHT);
    float ax = 0, aw = 0;
    for (float v : d.x.values_f32()) ax = std::max(ax, std::fabs(v));
    for (float v : d.w.values_f32()) aw = std::max(aw, std::fabs(v));
    ASSERT_FALSE(in.history.empty()) << "calibrating must record amaxes into the history";
    ASSERT_FALSE(w.history.empty()) << "calibrating must record amaxes into the history";
    EXPECT_EQ(in.history[0], ax);
    EXPECT_EQ(w.history[0], aw);
  }
  EXPECT_TRUE(lt::bitwise_equal(y0, y1));
  EXPECT_TRUE(lt::bitwise_equal(y0, y2));
  {
    lt::AutocastScope s(ctx.get(), r.get());
    fwd(y8, 1);
  }
  EXPECT_FALSE(lt::bitwise_equal(y0, y8)) << "FP8 forward should differ from high precision";
}

// Fused wgrad accumulation in high precision (no autocast): main_grad += dy^T x, exactly the
// fp32 sum (tolerance as in the numerics tests plus the fp32 add).
TEST(LinearLifecycle, FusedWgradAccumulatesInHighPrecision) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::LinearPtr fused = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16, 1);
  Data d(TE_DTYPE_BF16, 1100);
  lt::HostTensor y(TE_DTYPE_BF16, {kB, kS, kOut});
  te_linear_forward_args fa = d.args();
  te_linear_backward_ctx *raw = nullptr;
  ASSERT_EQ(te_linear_forward(ctx.get(), fused.get(), &fa, y.get(), &raw), TE_SUCCESS) << te_last_error();
  lt::BackwardPtr bwd(raw);
  lt::HostTensor main_grad = lt::random_tensor(TE_DTYPE_F32, {kOut, kIn}, -1.0f, 1.0f, 1101);
  const std::vector<float> m0 = main_grad.values_f32();
  for (int rep = 1; rep <= 2; ++rep) {
    ASSERT_EQ(te_linear_backward(ctx.get(), raw, d.dy.get(), nullptr, main_grad.get(), nullptr, nullptr), TE_SUCCESS)
        << te_last_error();
    const std::vector<float> dyT = lt::transpose(d.dy.values_f32(), kTokens, kOut);
    const std::vector<float> xT = lt::transpose(d.x.values_f32(), kTokens, kIn);
    lt::RefResult r = lt::ref_gemm_nt(lt::to_double(dyT), lt::to_double(xT), kOut, kIn, kTokens);
    for (size_t i = 0; i < r.value.size(); ++i) {
      r.value[i] = m0[i] + rep * r.value[i];
      r.abs_sum[i] = std::fabs(m0[i]) + rep * r.abs_sum[i];
    }
    EXPECT_TRUE(lt::CloseToRef(main_grad, r, "main_grad")) << "after " << rep << " backward(s)";
  }
}

// A layer and its backward context destroyed inside the scope that used it: the scope end must
// not touch the freed scaling states (ASan checks), and still succeeds.
TEST(LinearLifecycle, LayerDestroyedInsideOpenScope) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::LinearPtr keep = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  lt::LinearPtr gone = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(TE_DTYPE_BF16, 1200);
  lt::HostTensor y(TE_DTYPE_BF16, {kB, kS, kOut});
  te_linear_forward_args fa = d.args();
  te_linear_backward_ctx *bk = nullptr, *bg = nullptr;
  {
    lt::AutocastScope s(ctx.get(), nullptr);
    ASSERT_EQ(te_linear_forward(ctx.get(), gone.get(), &fa, y.get(), &bg), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(te_linear_forward(ctx.get(), keep.get(), &fa, y.get(), &bk), TE_SUCCESS) << te_last_error();
    te_linear_backward_ctx_destroy(bg);
    gone.reset();
  }
  lt::BackwardPtr hold(bk);
  EXPECT_NE(lt::live_scaling_state(ctx.get(), keep.get(), TE_ROLE_INPUT).info.scale, 1.0f) << "survivor updated";
  // The pass's first module is gone before its backward: the survivor's pending GRAD_OUTPUT
  // update is still reachable through te_autocast_flush_backward.
  Grads g(TE_DTYPE_BF16);
  ASSERT_EQ(run_backward(ctx.get(), bk, d, g), TE_SUCCESS) << te_last_error();
  EXPECT_EQ(te_autocast_flush_backward(ctx.get()), TE_SUCCESS) << te_last_error();
  EXPECT_NE(lt::live_scaling_state(ctx.get(), keep.get(), TE_ROLE_GRAD_OUTPUT).info.scale, 1.0f);
}

// FP8 forward is deterministic: the same inputs in the same state give bitwise the same y.
TEST(LinearLifecycle, ForwardIsDeterministic) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_F32);
  Data d(TE_DTYPE_F32, 1000);
  te_linear_forward_args fa = d.args();
  lt::HostTensor y1(TE_DTYPE_F32, {kB, kS, kOut}), y2 = y1;
  lt::AutocastScope s(ctx.get(), nullptr);
  for (lt::HostTensor *y : {&y1, &y2}) {
    te_linear_residuals res{};
    res.struct_size = sizeof(res);
    ASSERT_EQ(te_linear_forward_compute(ctx.get(), lin.get(), &fa, y->get(), &res), TE_SUCCESS)
        << te_last_error();
    te_linear_residuals_release(&res);
  }
  EXPECT_TRUE(lt::bitwise_equal(y1, y2));
}

// The backward of a pass's first module ends the pass even when it computes only db (no dy is
// quantized): the other modules' grad_output states get their update then, not at a flush.
TEST(LinearPassEnd, FirstModuleWithoutQuantizedDyEndsThePass) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = lt::make_recipe(TE_RECIPE_DELAYED_SCALING);
  lt::LinearPtr first = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  lt::LinearPtr second = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(TE_DTYPE_BF16, 300);
  lt::HostTensor y(TE_DTYPE_BF16, {kB, kS, kOut});
  te_linear_backward_ctx *b1 = nullptr, *b2 = nullptr;
  te_linear_forward_args fa = d.args();
  {
    lt::AutocastScope s(ctx.get(), r.get());
    ASSERT_TE_OK(te_linear_forward(ctx.get(), first.get(), &fa, y.get(), &b1));
    ASSERT_TE_OK(te_linear_forward(ctx.get(), second.get(), &fa, y.get(), &b2));
  }
  lt::BackwardPtr k1(b1), k2(b2);
  Grads g(TE_DTYPE_BF16);
  ASSERT_TE_OK(run_backward(ctx.get(), b2, d, g));
  const float before = lt::scaling_state(ctx.get(), second.get(), TE_ROLE_GRAD_OUTPUT, false).info.scale;
  te_linear_backward_args ba;
  te_linear_backward_args_init(&ba);
  ASSERT_TE_OK(te_linear_backward(ctx.get(), b1, d.dy.get(), nullptr, nullptr, g.db.get(), &ba));
  const float after = lt::scaling_state(ctx.get(), second.get(), TE_ROLE_GRAD_OUTPUT, false).info.scale;
  EXPECT_NE(before, after) << "the pass's backward update did not run";
}

}  // namespace
