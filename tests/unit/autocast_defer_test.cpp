// A forward pass's scale update is deferred at te_autocast_end and joins the launch of the next
// backward set's update (autocast/autocast.h). These tests hold that to the immediate update it
// replaces: the same bits in every output and scaling state, one launch per training step, and
// nothing left pointing at a module that went away.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "context/context.h"
#include "modules/linear/linear.h"
#include "support/state_snapshot.h"

namespace te {
namespace {

constexpr int64_t kTokens = 32, kIn = 48, kOut = 16;
const Device kCpu{};

// One bias-carrying FP8 Linear on the CPU backend and the buffers of its training step.
struct Model {
  Context ctx{kCpu};
  RecipeRef recipe;
  std::unique_ptr<Linear> lin;
  std::vector<float> x, w, b, y, dy, dx, dw, db;

  explicit Model(RecipeKind kind = RecipeKind::Delayed)
      : x(kTokens * kIn), w(kOut * kIn), b(kOut, 0.1f), y(kTokens * kOut), dy(kTokens * kOut), dx(kTokens * kIn),
        dw(kOut * kIn), db(kOut) {
    RecipeOptions ro = RecipeOptions::defaults(kind);
    ro.amax_history_len = 4;
    recipe = RecipeRef::adopt(Recipe::create(ro));
    LinearOptions o;
    o.in_features = kIn;
    o.out_features = kOut;
    o.activation_dtype = DType::F32;
    lin = std::make_unique<Linear>(ctx, o);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(static_cast<int>(i % 37) - 18);
  }

  // Step `k`'s data: amaxes that change from step to step, so that every update matters.
  void load(int k) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = (0.5f + 0.25f * k) * static_cast<float>(static_cast<int>(i % 11) - 5);
    for (size_t i = 0; i < dy.size(); ++i) dy[i] = (0.01f + 0.003f * k) * static_cast<float>(static_cast<int>(i % 7) - 3);
  }

  LinearForwardArgs forward_args() {
    LinearForwardArgs a;
    a.input = make_view(x.data(), DType::F32, kCpu, kTokens, kIn);
    a.weight = make_view(w.data(), DType::F32, kCpu, kOut, kIn);
    a.bias = make_view(b.data(), DType::F32, kCpu, 1, kOut);
    a.bias.ndim = 1;
    a.bias.shape[0] = kOut;
    return a;
  }

  // begin, forward, end; then (train) the backward and a plain SGD step on w. `settle_at_end`
  // gives the immediate update this library made before deferring.
  void step(int k, bool train, bool settle_at_end) {
    load(k);
    Autocast &ac = ctx.autocast();
    uint64_t t = ac.begin(true, false, recipe.get(), nullptr);
    LinearBackwardCtx *bwd = linear_pool(ctx).acquire_backward_ctx(ctx);
    linear_forward_compute(ctx, *lin, forward_args(), make_view(y.data(), DType::F32, kCpu, kTokens, kOut),
                           bwd->saved, nullptr, nullptr);
    ac.end(t);
    if (settle_at_end) ac.settle();
    if (train) {
      LinearBackwardArgs ba;
      ba.dy = make_view(dy.data(), DType::F32, kCpu, kTokens, kOut);
      ba.dx = make_view(dx.data(), DType::F32, kCpu, kTokens, kIn);
      ba.dw = make_view(dw.data(), DType::F32, kCpu, kOut, kIn);
      ba.db = make_view(db.data(), DType::F32, kCpu, 1, kOut);
      ba.db.ndim = 1;
      ba.db.shape[0] = kOut;
      ba.once = true;
      linear_backward(ctx, *bwd, ba);
      for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5f * dw[i];
    }
    linear_pool(ctx).release(bwd);
  }

  // Outputs, gradients, weights, then each state's scale, scale_inv and history.
  std::vector<float> snapshot() {
    std::vector<float> out;
    for (const std::vector<float> *v : {&y, &dx, &dw, &db, &w}) out.insert(out.end(), v->begin(), v->end());
    test_support::append_scaling_states(ctx.backend(), lin->core()->proj, out);
    return out;
  }
};

void expect_bitwise_equal(const std::vector<float> &a, const std::vector<float> &b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(AutocastDeferral, TrainingMatchesTheImmediateUpdateBitwise) {
  // Training steps with forward-only passes among them (their update is enqueued by the next
  // begin instead of a backward).
  Model deferred, immediate;
  const bool train[] = {true, true, false, true, false, false, true, true};
  for (int k = 0; k < 8; ++k) {
    deferred.step(k, train[k], false);
    immediate.step(k, train[k], true);
  }
  deferred.ctx.autocast().settle();
  expect_bitwise_equal(deferred.snapshot(), immediate.snapshot());
  // The scales moved: the comparison saw real updates.
  const ScalingState &in = deferred.lin->core()->state(TensorRole::Input);
  float s = 0, si = 0;
  in.read(deferred.ctx.backend(), &s, &si, nullptr, 0);
  EXPECT_NE(s, 1.0f);
  EXPECT_EQ(deferred.ctx.stats().bucket_updates, immediate.ctx.stats().bucket_updates);
  EXPECT_EQ(deferred.ctx.stats().states_updated, immediate.ctx.stats().states_updated);
  EXPECT_EQ(deferred.ctx.stats().update_launches, 8u) << "5 training steps, 3 forward-only passes";
  EXPECT_EQ(immediate.ctx.stats().update_launches, 13u);
}

TEST(AutocastDeferral, OneScaleUpdateLaunchPerTrainingStep) {
  Model m;
  m.step(0, true, false);
  const AutocastStats before = m.ctx.stats();
  for (int k = 1; k <= 5; ++k) m.step(k, true, false);
  EXPECT_FALSE(m.ctx.autocast().deferred()) << "the backward took the forward's update";
  EXPECT_EQ(m.ctx.stats().update_launches - before.update_launches, 5u);
  EXPECT_EQ(m.ctx.stats().bucket_updates - before.bucket_updates, 10u);
}

TEST(AutocastDeferral, BucketsOfTwoRecipesShareTheLaunch) {
  Model a;
  RecipeOptions ro = RecipeOptions::defaults(RecipeKind::Delayed);
  ro.amax_history_len = 8;  // another key: another bucket
  RecipeRef other = RecipeRef::adopt(Recipe::create(ro));
  LinearOptions o;
  o.in_features = kIn;
  o.out_features = kOut;
  o.activation_dtype = DType::F32;
  Linear second(a.ctx, o);
  Autocast &ac = a.ctx.autocast();
  a.load(1);
  uint64_t outer = ac.begin(true, false, a.recipe.get(), nullptr);
  LinearBackwardCtx *b1 = linear_pool(a.ctx).acquire_backward_ctx(a.ctx);
  LinearBackwardCtx *b2 = linear_pool(a.ctx).acquire_backward_ctx(a.ctx);
  const TensorView y = make_view(a.y.data(), DType::F32, kCpu, kTokens, kOut);
  linear_forward_compute(a.ctx, *a.lin, a.forward_args(), y, b1->saved, nullptr, nullptr);
  uint64_t inner = ac.begin(true, false, other.get(), nullptr);
  linear_forward_compute(a.ctx, second, a.forward_args(), y, b2->saved, nullptr, nullptr);
  ac.end(inner);
  ac.end(outer);
  const AutocastStats before = a.ctx.stats();
  LinearBackwardArgs ba;
  ba.dy = make_view(a.dy.data(), DType::F32, kCpu, kTokens, kOut);
  ba.dw = make_view(a.dw.data(), DType::F32, kCpu, kOut, kIn);
  ba.once = true;
  linear_backward(a.ctx, *b2, ba);  // not the pass's first module: nothing updated yet
  EXPECT_EQ(a.ctx.stats().update_launches, before.update_launches);
  linear_backward(a.ctx, *b1, ba);
  EXPECT_EQ(a.ctx.stats().update_launches - before.update_launches, 1u);
  EXPECT_EQ(a.ctx.stats().bucket_updates - before.bucket_updates, 4u) << "two forward and two backward buckets";
  linear_pool(a.ctx).release(b1);
  linear_pool(a.ctx).release(b2);
}

TEST(AutocastDeferral, AModuleDestroyedWhileItsUpdateIsDeferredLeavesNoTrace) {
  // The states of a destroyed module leave the deferred set (ASan sees a use after free if not).
  Model m;
  m.step(0, false, false);
  ASSERT_TRUE(m.ctx.autocast().deferred());
  m.lin.reset();
  const AutocastStats before = m.ctx.stats();
  m.ctx.autocast().settle();
  EXPECT_FALSE(m.ctx.autocast().deferred());
  EXPECT_EQ(m.ctx.stats().states_updated, before.states_updated);
}

TEST(AutocastDeferral, FlushBackwardTakesTheDeferredUpdateToo) {
  Model m;
  m.step(0, false, false);
  ASSERT_TRUE(m.ctx.autocast().deferred());
  m.ctx.autocast().flush_backward();
  EXPECT_FALSE(m.ctx.autocast().deferred());
  EXPECT_FALSE(m.ctx.autocast().holds(&m.lin->core()->state(TensorRole::Input)));
}

TEST(AutocastDeferral, CurrentScalingDefersNothing) {
  Model m(RecipeKind::Current);
  m.step(0, false, false);
  EXPECT_FALSE(m.ctx.autocast().deferred());
  EXPECT_EQ(m.ctx.stats().update_launches, 0u);
}

}  // namespace
}  // namespace te
