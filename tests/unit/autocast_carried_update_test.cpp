// The scale update that a LayerNormLinear / LayerNormMLP backward's norm carries
// (Autocast::carry_backward_update, NormBackwardArgs::then_update) against the plain update it
// replaces: a backward that wants no gradient through the norm (dw and db only) launches its
// update on its own. Both give the same bits in every scaling state and in the gradients both
// compute, and the same count of updates; only the carrying one counts them as carried.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "context/context.h"
#include "modules/layernorm_linear/layernorm_linear.h"
#include "modules/layernorm_mlp/layernorm_mlp.h"
#include "support/host_views.h"
#include "support/state_snapshot.h"

namespace te {
namespace {

const Device kCpu{};
constexpr int kSteps = 4;

using test_support::host_mat;
using test_support::host_vec;

// Step k's data: amaxes that change every step, so that every update matters.
void load(std::vector<float> &x, std::vector<float> &dy, int k) {
  for (size_t i = 0; i < x.size(); ++i) x[i] = (0.5f + 0.25f * k) * static_cast<float>(static_cast<int>(i % 11) - 5);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = (0.01f + 0.004f * k) * static_cast<float>(static_cast<int>(i % 7) - 3);
}

struct Run {
  std::vector<float> bits;  // y, dw, db, then the scaling states
  AutocastStats stats;
};

Run layernorm_linear_steps(RecipeKind kind, bool through_norm) {
  constexpr int64_t T = 32, in = 48, out = 16;
  Context ctx(kCpu);
  RecipeOptions ro = RecipeOptions::defaults(kind);
  ro.amax_history_len = 4;
  RecipeRef recipe = RecipeRef::adopt(Recipe::create(ro));
  LayerNormLinearOptions o;
  o.in_features = in;
  o.out_features = out;
  o.activation_dtype = DType::F32;
  LayerNormLinear m(ctx, o);
  std::vector<float> x(T * in), gamma(in, 1.25f), beta(in, 0.1f), w(out * in), b(out, 0.2f), y(T * out), dy(T * out),
      dx(T * in), dgamma(in), dbeta(in), dw(out * in), db(out);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(static_cast<int>(i % 37) - 18);
  Run r;
  for (int k = 0; k < kSteps; ++k) {
    load(x, dy, k);
    Autocast &ac = ctx.autocast();
    const uint64_t t = ac.begin(true, false, recipe.get(), nullptr);
    LayerNormLinearForwardArgs a;
    a.input = host_mat(x, T, in);
    a.ln_weight = host_vec(gamma);
    a.ln_bias = host_vec(beta);
    a.weight = host_mat(w, out, in);
    a.bias = host_vec(b);
    LayerNormLinearBackwardCtx *bwd = layernorm_linear_pools(ctx).backward.acquire(ctx);
    bwd->saved = layernorm_linear_forward_compute(ctx, m, a, host_mat(y, T, out));
    ac.end(t);
    LayerNormLinearGrads g;
    if (through_norm) {
      g.dx = host_mat(dx, T, in);
      g.dgamma = host_vec(dgamma);
      g.dbeta = host_vec(dbeta);
    }
    g.dw = host_mat(dw, out, in);
    g.db = host_vec(db);
    layernorm_linear_backward(ctx, *bwd, host_mat(dy, T, out), g, true);
    layernorm_linear_pools(ctx).backward.release(bwd);
    for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5f * dw[i];
  }
  for (const std::vector<float> *v : {&y, &dw, &db}) r.bits.insert(r.bits.end(), v->begin(), v->end());
  test_support::append_scaling_states(ctx.backend(), m.core()->proj, r.bits);
  r.stats = ctx.stats();
  return r;
}

Run layernorm_mlp_steps(RecipeKind kind, bool through_norm) {
  constexpr int64_t T = 32, hidden = 32, ffn = 16;
  Context ctx(kCpu);
  RecipeOptions ro = RecipeOptions::defaults(kind);
  ro.amax_history_len = 4;
  RecipeRef recipe = RecipeRef::adopt(Recipe::create(ro));
  LayerNormMlpOptions o;
  o.hidden = hidden;
  o.ffn = ffn;
  o.activation = Activation::GELU;
  o.activation_dtype = DType::F32;
  LayerNormMlp m(ctx, o);
  const int64_t f1 = o.fc1_out();
  std::vector<float> x(T * hidden), gamma(hidden, 1.0f), beta(hidden, 0.05f), w1(f1 * hidden), b1(f1, 0.1f),
      w2(hidden * ffn), b2(hidden, 0.1f), y(T * hidden), dy(T * hidden), dx(T * hidden), dgamma(hidden),
      dbeta(hidden), dw1(f1 * hidden), db1(f1), dw2(hidden * ffn), db2(hidden);
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = 0.02f * static_cast<float>(static_cast<int>(i % 13) - 6);
  for (size_t i = 0; i < w2.size(); ++i) w2[i] = 0.03f * static_cast<float>(static_cast<int>(i % 17) - 8);
  Run r;
  for (int k = 0; k < kSteps; ++k) {
    load(x, dy, k);
    Autocast &ac = ctx.autocast();
    const uint64_t t = ac.begin(true, false, recipe.get(), nullptr);
    LayerNormMlpForwardArgs a;
    a.input = host_mat(x, T, hidden);
    a.ln_weight = host_vec(gamma);
    a.ln_bias = host_vec(beta);
    a.fc1_weight = host_mat(w1, f1, hidden);
    a.fc1_bias = host_vec(b1);
    a.fc2_weight = host_mat(w2, hidden, ffn);
    a.fc2_bias = host_vec(b2);
    LayerNormMlpBackwardCtx *bwd = layernorm_mlp_pools(ctx).backward.acquire(ctx);
    bwd->saved = layernorm_mlp_forward_compute(ctx, m, a, host_mat(y, T, hidden));
    ac.end(t);
    LayerNormMlpGrads g;
    if (through_norm) {
      g.dx = host_mat(dx, T, hidden);
      g.dgamma = host_vec(dgamma);
      g.dbeta = host_vec(dbeta);
    }
    g.dfc1_w = host_mat(dw1, f1, hidden);
    g.dfc1_b = host_vec(db1);
    g.dfc2_w = host_mat(dw2, hidden, ffn);
    g.dfc2_b = host_vec(db2);
    layernorm_mlp_backward(ctx, *bwd, host_mat(dy, T, hidden), g, true);
    layernorm_mlp_pools(ctx).backward.release(bwd);
    for (size_t i = 0; i < w1.size(); ++i) w1[i] -= 0.5f * dw1[i];
    for (size_t i = 0; i < w2.size(); ++i) w2[i] -= 0.5f * dw2[i];
  }
  for (const std::vector<float> *v : {&y, &dw1, &db1, &dw2, &db2}) r.bits.insert(r.bits.end(), v->begin(), v->end());
  test_support::append_scaling_states(ctx.backend(), m.core()->fc1, r.bits);
  test_support::append_scaling_states(ctx.backend(), m.core()->fc2, r.bits);
  r.stats = ctx.stats();
  return r;
}

void expect_same(const Run &carried, const Run &plain, bool delayed) {
  ASSERT_EQ(carried.bits.size(), plain.bits.size());
  EXPECT_EQ(std::memcmp(carried.bits.data(), plain.bits.data(), carried.bits.size() * sizeof(float)), 0);
  EXPECT_EQ(carried.stats.update_launches, plain.stats.update_launches);
  EXPECT_EQ(carried.stats.bucket_updates, plain.stats.bucket_updates);
  EXPECT_EQ(carried.stats.states_updated, plain.stats.states_updated);
  EXPECT_EQ(plain.stats.updates_carried, 0u) << "no norm backward ran to carry it";
  // Delayed scaling: every step's one update (backward set and deferred forward set) carried.
  EXPECT_EQ(carried.stats.updates_carried, delayed ? static_cast<uint64_t>(kSteps) : 0u);
  if (delayed) EXPECT_EQ(carried.stats.update_launches, static_cast<uint64_t>(kSteps));
}

class CarriedScaleUpdate : public ::testing::TestWithParam<RecipeKind> {};

TEST_P(CarriedScaleUpdate, LayerNormLinearMatchesThePlainUpdate) {
  expect_same(layernorm_linear_steps(GetParam(), true), layernorm_linear_steps(GetParam(), false),
              GetParam() == RecipeKind::Delayed);
}

TEST_P(CarriedScaleUpdate, LayerNormMlpMatchesThePlainUpdate) {
  expect_same(layernorm_mlp_steps(GetParam(), true), layernorm_mlp_steps(GetParam(), false),
              GetParam() == RecipeKind::Delayed);
}

INSTANTIATE_TEST_SUITE_P(Recipes, CarriedScaleUpdate,
                         ::testing::Values(RecipeKind::Delayed, RecipeKind::Current, RecipeKind::Block));

}  // namespace
}  // namespace te
