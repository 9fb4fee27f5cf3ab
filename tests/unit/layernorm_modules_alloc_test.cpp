// A warm LayerNormLinear / LayerNormMLP training step makes no heap allocation, at the core level:
// forward (norm, projections, activation), residuals and backward context from the module pools,
// the scope end's bucket update, backward with every gradient, the backward bucket's update.
//
// autocast_alloc_test.cpp, in the same executable, already replaces the global operator new (one
// replacement per program), and its counter is its own; so allocations are counted here through
// the sanitizer runtime's malloc hooks, which see every malloc (that operator new's included).
// The asan and dev builds (and scripts/test.sh's ASan pass) run this; elsewhere the test skips,
// and the public-API twin, tests/faults/layernorm_modules_alloc_test.cpp (WarmStepsDoNotAllocate),
// checks the same in every build.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "context/context.h"
#include "modules/layernorm_linear/layernorm_linear.h"
#include "modules/layernorm_mlp/layernorm_mlp.h"
#include "support/host_views.h"

extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                                         void (*free_hook)(const volatile void *))
    __attribute__((weak));

namespace te {
namespace {

std::atomic<long> g_mallocs{0};

void on_malloc(const volatile void *, size_t) { g_mallocs.fetch_add(1, std::memory_order_relaxed); }
void on_free(const volatile void *) {}

// Installs the hooks once (the runtime takes a handful per process); false without a sanitizer.
bool hooks_installed() {
  static const bool installed =
      __sanitizer_install_malloc_and_free_hooks && __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) != 0;
  return installed;
}

const Device kCpu{};

using test_support::host_mat;
using test_support::host_vec;

// Runs `step` twice to warm up, then `steps` more, and returns the mallocs of those.
// `cold`: the first step is the context's first (it must allocate, or the hooks count nothing).
template <class F>
long mallocs_of_warm_steps(F step, bool cold, int steps = 4) {
  const long before_first = g_mallocs.load();
  step();
  if (cold) EXPECT_GT(g_mallocs.load() - before_first, 0) << "the first step allocated nothing: are the hooks counting?";
  step();
  const long before = g_mallocs.load();
  for (int i = 0; i < steps; ++i) step();
  return g_mallocs.load() - before;
}

class LayerNormModulesAllocation : public ::testing::TestWithParam<RecipeKind> {
 protected:
  void SetUp() override {
    if (!hooks_installed())
      GTEST_SKIP() << "no sanitizer malloc hooks in this build: tests/faults/layernorm_modules_alloc_test.cpp "
                      "(WarmStepsDoNotAllocate) checks the same through the public API";
  }
};

TEST_P(LayerNormModulesAllocation, LayerNormLinearTrainingStep) {
  constexpr int64_t T = 32, in = 48, out = 32;
  Context ctx(kCpu);
  Recipe *recipe = Recipe::create(RecipeOptions::defaults(GetParam()));
  LayerNormLinearOptions o;
  o.in_features = in;
  o.out_features = out;
  o.activation_dtype = DType::F32;
  o.fuse_wgrad_accumulation = true;
  LayerNormLinear m(ctx, o);
  std::vector<float> x(T * in, 0.5f), gamma(in, 1.0f), beta(in, 0.1f), w(out * in, 0.01f), b(out, 0.2f), y(T * out),
      ln(T * in), dy(T * out, 0.01f), dx(T * in), dgamma(in), dbeta(in), main_grad(out * in), db(out);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  LayerNormLinearForwardArgs args;
  args.input = host_mat(x, T, in);
  args.ln_weight = host_vec(gamma);
  args.ln_bias = host_vec(beta);
  args.weight = host_mat(w, out, in);
  args.bias = host_vec(b);
  args.ln_out = host_mat(ln, T, in);
  LayerNormLinearGrads g;
  g.dx = host_mat(dx, T, in);
  g.dgamma = host_vec(dgamma);
  g.dbeta = host_vec(dbeta);
  g.dw = host_mat(main_grad, out, in);
  g.db = host_vec(db);
  for (bool once : {false, true}) {
    SCOPED_TRACE(once ? "TE_BACKWARD_ONCE" : "retain");
    auto step = [&] {
      Autocast &ac = ctx.autocast();
      const uint64_t t = ac.begin(true, false, recipe, nullptr);
      LayerNormLinearPools &pools = layernorm_linear_pools(ctx);
      LayerNormLinearBackwardCtx *bwd = pools.backward.acquire(ctx);
      bwd->saved = layernorm_linear_forward_compute(ctx, m, args, host_mat(y, T, out));
      bwd->saved->retire();
      ac.end(t);
      layernorm_linear_backward(ctx, *bwd, host_mat(dy, T, out), g, once);
      ac.flush_backward();
      pools.backward.release(bwd);
    };
    EXPECT_EQ(mallocs_of_warm_steps(step, !once), 0);
  }
  recipe->release();
}

TEST_P(LayerNormModulesAllocation, LayerNormMlpTrainingStep) {
  constexpr int64_t T = 32, hidden = 32, ffn = 16;
  for (Activation act : {Activation::ReLU, Activation::GELU, Activation::SwiGLU, Activation::GeGLU, Activation::SReLU}) {
    SCOPED_TRACE(static_cast<int>(act));
    Context ctx(kCpu);
    Recipe *recipe = Recipe::create(RecipeOptions::defaults(GetParam()));
    LayerNormMlpOptions o;
    o.hidden = hidden;
    o.ffn = ffn;
    o.activation = act;
    o.activation_dtype = DType::F32;
    o.norm.kind = NormKind::RMSNorm;
    LayerNormMlp m(ctx, o);
    const int64_t f1 = o.fc1_out();
    std::vector<float> x(T * hidden), gamma(hidden, 1.0f), w1(f1 * hidden, 0.02f), b1(f1, 0.1f), w2(hidden * ffn, 0.02f),
        b2(hidden, 0.1f), y(T * hidden), dy(T * hidden, 0.01f), dx(T * hidden), dgamma(hidden), dw1(f1 * hidden),
        db1(f1), dw2(hidden * ffn), db2(hidden);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 5) - 2.0f;
    LayerNormMlpForwardArgs args;
    args.input = host_mat(x, T, hidden);
    args.ln_weight = host_vec(gamma);
    args.fc1_weight = host_mat(w1, f1, hidden);
    args.fc1_bias = host_vec(b1);
    args.fc2_weight = host_mat(w2, hidden, ffn);
    args.fc2_bias = host_vec(b2);
    LayerNormMlpGrads g;
    g.dx = host_mat(dx, T, hidden);
    g.dgamma = host_vec(dgamma);
    g.dfc1_w = host_mat(dw1, f1, hidden);
    g.dfc1_b = host_vec(db1);
    g.dfc2_w = host_mat(dw2, hidden, ffn);
    g.dfc2_b = host_vec(db2);
    auto step = [&] {
      Autocast &ac = ctx.autocast();
      const uint64_t t = ac.begin(true, false, recipe, nullptr);
      LayerNormMlpPools &pools = layernorm_mlp_pools(ctx);
      LayerNormMlpBackwardCtx *bwd = pools.backward.acquire(ctx);
      bwd->saved = layernorm_mlp_forward_compute(ctx, m, args, host_mat(y, T, hidden));
      bwd->saved->retire();
      ac.end(t);
      layernorm_mlp_backward(ctx, *bwd, host_mat(dy, T, hidden), g, false);
      ac.flush_backward();
      pools.backward.release(bwd);
    };
    EXPECT_EQ(mallocs_of_warm_steps(step, true), 0);
    recipe->release();
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, LayerNormModulesAllocation,
                         ::testing::Values(RecipeKind::Delayed, RecipeKind::Current, RecipeKind::Block));

}  // namespace
}  // namespace te
