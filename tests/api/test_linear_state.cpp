// te_linear scaling state: delayed-scaling amax recording and the scale update at the outermost
// enabled scope end (TE's rule, checked against ref_delayed_update written from DESIGN.md),
// GRAD_OUTPUT updates after the first module's backward or te_autocast_flush_backward,
// state save/load (bit-exact, rejecting bad buffers without change), and a resumed training
// run reproducing the uninterrupted one bit for bit.
#include "linear_test_util.h"

namespace lt = te_test;

namespace {

constexpr int64_t kTokens = 32, kIn = 64, kOut = 32;
constexpr int kHist = 16;

float amax_of(const lt::HostTensor &t) {
  float a = 0.0f;
  for (float v : t.values_f32()) a = std::max(a, std::fabs(v));
  return a;
}

struct Fixture {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe;
  lt::LinearPtr lin;
  lt::HostTensor w, b;
  explicit Fixture(te_amax_algo algo = TE_AMAX_MAX, te_dtype act = TE_DTYPE_BF16)
      : recipe(lt::make_recipe(TE_RECIPE_DELAYED_SCALING, kHist, algo)),
        lin(lt::make_linear(ctx.get(), kIn, kOut, 1, act)),
        w(lt::random_tensor(act, {kOut, kIn}, -0.5f, 0.5f, 31)),
        b(lt::random_tensor(act, {kOut}, -1.0f, 1.0f, 32)) {}

  // forward_compute + save; returns the backward context.
  lt::BackwardPtr forward(te_linear *l, lt::HostTensor &x) {
    lt::HostTensor y(x.t.dtype, {kTokens, kOut});
    te_linear_forward_args fa;
    te_linear_forward_args_init(&fa);
    fa.input = x.get();
    fa.weight = w.get();
    fa.bias = b.get();
    te_linear_backward_ctx *raw = nullptr;
    te_status s = te_linear_forward(ctx.get(), l, &fa, y.get(), &raw);
    EXPECT_EQ(s, TE_SUCCESS) << te_last_error();
    return lt::BackwardPtr(raw);
  }
  void backward(te_linear_backward_ctx *bwd, lt::HostTensor &dy) {
    lt::HostTensor dx(dy.t.dtype, {kTokens, kIn}), dw(dy.t.dtype, {kOut, kIn});
    te_status s = te_linear_backward(ctx.get(), bwd, dy.get(), dx.get(), dw.get(), nullptr, nullptr);
    EXPECT_EQ(s, TE_SUCCESS) << te_last_error();
  }
  te_context_stats stats() {
    te_context_stats st{};
    st.struct_size = sizeof(st);
    EXPECT_EQ(te_context_get_stats(ctx.get(), &st), TE_SUCCESS) << te_last_error();
    return st;
  }
};

// The expected state, advanced with the reference update.
struct RefState {
  std::vector<float> hist = std::vector<float>(kHist, 0.0f);
  float scale = 1.0f;
  void record(float amax) { hist[0] = std::max(hist[0], amax); }
  void update(float max, bool most_recent = false) {
    lt::ref_delayed_update(hist, &scale, max, 0, most_recent);
  }
};

::testing::AssertionResult Matches(const lt::ScalingSnapshot &s, const RefState &r) {
  if (s.info.amax_history_len != kHist)
    return ::testing::AssertionFailure() << "amax_history_len " << s.info.amax_history_len
                                         << ", expected " << kHist;
  if (lt::float_to_bits(s.info.scale) != lt::float_to_bits(r.scale))
    return ::testing::AssertionFailure() << "scale " << s.info.scale << ", expected " << r.scale;
  if (lt::float_to_bits(s.info.scale_inv) != lt::float_to_bits(1.0f / r.scale))
    return ::testing::AssertionFailure() << "scale_inv " << s.info.scale_inv << ", expected "
                                         << 1.0f / r.scale;
  for (int i = 0; i < kHist; ++i)
    if (lt::float_to_bits(s.history[i]) != lt::float_to_bits(r.hist[i]))
      return ::testing::AssertionFailure() << "history[" << i << "] = " << s.history[i]
                                           << ", expected " << r.hist[i];
  return ::testing::AssertionSuccess();
}

TEST(LinearState, FreshLayerHasUnitScalesAndNoHistory) {
  Fixture f;
  for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT}) {
    const lt::ScalingSnapshot s = lt::live_scaling_state(f.ctx.get(), f.lin.get(), role);
    EXPECT_EQ(s.info.scale, 1.0f) << "role " << role;
    EXPECT_EQ(s.info.scale_inv, 1.0f) << "role " << role;
    EXPECT_EQ(s.info.amax_history_len, 0) << "role " << role;
  }
}

// Forward records amax(x), amax(W) into slot 0; the scope end updates: scale = 448 / max over
// history, roll (slot 0 -> last slot), slot 0 zeroed. One bucket -> one fused update.
TEST(LinearState, DelayedScalingRecordsAmaxAndUpdatesAtScopeEnd) {
  Fixture f;
  lt::HostTensor x1 = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -2.0f, 2.0f, 41);
  lt::HostTensor x2 = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -0.25f, 0.25f, 42);
  RefState rin, rw;
  const te_context_stats st0 = f.stats();
  {
    lt::AutocastScope s(f.ctx.get(), f.recipe.get());
    lt::BackwardPtr bwd = f.forward(f.lin.get(), x1);
    rin.record(amax_of(x1));
    rw.record(amax_of(f.w));
    const lt::ScalingSnapshot in = lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT);
    EXPECT_TRUE(Matches(in, rin)) << "INPUT inside the scope, before its end";
    EXPECT_EQ(in.info.fp8_dtype, TE_DTYPE_E4M3);
    EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_WEIGHT), rw));
  }
  rin.update(448.0f);
  rw.update(448.0f);
  EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT), rin)) << "INPUT after end";
  EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_WEIGHT), rw)) << "WEIGHT after end";
  EXPECT_EQ(rin.scale, 448.0f / amax_of(x1));
  const te_context_stats st1 = f.stats();
  EXPECT_EQ(st1.scopes_closed - st0.scopes_closed, 1u);
  EXPECT_EQ(st1.bucket_updates - st0.bucket_updates, 1u) << "one bucket, one fused update";
  EXPECT_EQ(st1.states_updated - st0.states_updated, 2u) << "INPUT and WEIGHT";

  // Second pass, smaller amax: MAX over the history keeps the first pass's amax.
  {
    lt::AutocastScope s(f.ctx.get(), f.recipe.get());
    lt::BackwardPtr bwd = f.forward(f.lin.get(), x2);
  }
  rin.record(amax_of(x2));
  rw.record(amax_of(f.w));
  rin.update(448.0f);
  rw.update(448.0f);
  EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT), rin)) << "INPUT, pass 2";
  EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_WEIGHT), rw)) << "WEIGHT, pass 2";
  EXPECT_EQ(rin.scale, 448.0f / amax_of(x1));

  // A scope in which the layer is not used: no update, no roll.
  { lt::AutocastScope s(f.ctx.get(), f.recipe.get()); }
  EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT), rin)) << "unused scope";
}

TEST(LinearState, MostRecentAlgoUsesSlotZeroOnly) {
  Fixture f(TE_AMAX_MOST_RECENT);
  lt::HostTensor x1 = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -2.0f, 2.0f, 43);
  lt::HostTensor x2 = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -0.25f, 0.25f, 44);
  RefState rin;
  for (lt::HostTensor *x : {&x1, &x2}) {
    {
      lt::AutocastScope s(f.ctx.get(), f.recipe.get());
      lt::BackwardPtr bwd = f.forward(f.lin.get(), *x);
    }
    rin.record(amax_of(*x));
    rin.update(448.0f, /*most_recent=*/true);
  }
  EXPECT_EQ(rin.scale, 448.0f / amax_of(x2));
  EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT), rin));
}

// A layer used twice in one scope: the amaxes accumulate by max.
TEST(LinearState, LayerUsedTwiceInOneScopeAccumulatesAmaxByMax) {
  Fixture f;
  lt::HostTensor x1 = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -0.5f, 0.5f, 45);
  lt::HostTensor x2 = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -3.0f, 3.0f, 46);
  lt::HostTensor x3 = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -1.0f, 1.0f, 47);
  RefState rin;
  {
    lt::AutocastScope s(f.ctx.get(), f.recipe.get());
    lt::BackwardPtr b1 = f.forward(f.lin.get(), x1);
    lt::BackwardPtr b2 = f.forward(f.lin.get(), x2);
    lt::BackwardPtr b3 = f.forward(f.lin.get(), x3);
  }
  rin.record(amax_of(x1));
  rin.record(amax_of(x2));
  rin.record(amax_of(x3));
  rin.update(448.0f);
  EXPECT_EQ(rin.scale, 448.0f / amax_of(x2));
  EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT), rin));
}

// Only the outermost enabled scope's end updates; an enabled scope nested in a disabled one is
// "outermost enabled" and updates at its own end.
TEST(LinearState, OnlyOutermostEnabledScopeEndUpdates) {
  Fixture f;
  lt::HostTensor x = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -2.0f, 2.0f, 48);
  RefState rin;
  {
    lt::AutocastScope outer(f.ctx.get(), f.recipe.get());
    {
      lt::AutocastScope inner(f.ctx.get(), f.recipe.get());
      lt::BackwardPtr bwd = f.forward(f.lin.get(), x);
    }
    rin.record(amax_of(x));
    EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT), rin))
        << "after the inner end: not updated yet";
  }
  rin.update(448.0f);
  EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT), rin))
      << "after the outer end";

  {
    lt::AutocastScope outer(f.ctx.get(), f.recipe.get(), /*enabled=*/0);
    {
      lt::AutocastScope inner(f.ctx.get(), f.recipe.get());
      lt::BackwardPtr bwd = f.forward(f.lin.get(), x);
    }
    rin.record(amax_of(x));
    rin.update(448.0f);
    EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT), rin))
        << "enabled scope inside a disabled one updates at its own end";
  }
  EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT), rin))
      << "the disabled outer scope's end changes nothing";
}

// GRAD_OUTPUT: dy's amax is recorded by backward; a single-layer pass updates right after its
// backward (E5M2 under HYBRID: scale = 57344 / amax).
TEST(LinearState, GradOutputUpdatedAfterSingleLayerBackward) {
  Fixture f;
  lt::HostTensor x = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -2.0f, 2.0f, 49);
  lt::HostTensor dy = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kOut}, -0.01f, 0.01f, 50);
  lt::BackwardPtr bwd;
  {
    lt::AutocastScope s(f.ctx.get(), f.recipe.get());
    bwd = f.forward(f.lin.get(), x);
  }
  const lt::ScalingSnapshot before = lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_GRAD_OUTPUT);
  EXPECT_EQ(before.info.scale, 1.0f);
  f.backward(bwd.get(), dy);
  RefState rgo;
  rgo.record(amax_of(dy));
  rgo.update(57344.0f);
  const lt::ScalingSnapshot after = lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_GRAD_OUTPUT);
  EXPECT_TRUE(Matches(after, rgo));
  EXPECT_EQ(after.info.fp8_dtype, TE_DTYPE_E5M2);
}

// Two layers in one pass: the update happens when the backward of the FIRST module (in forward
// order, so the last backward) completes — or earlier through te_autocast_flush_backward.
TEST(LinearState, GradOutputUpdatedAfterFirstModuleBackwardOrFlush) {
  for (int flush = 0; flush < 2; ++flush) {
    SCOPED_TRACE(flush ? "with flush" : "without flush");
    Fixture f;
    lt::LinearPtr second = lt::make_linear(f.ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
    lt::HostTensor x = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -2.0f, 2.0f, 51);
    lt::HostTensor dy1 = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kOut}, -0.01f, 0.01f, 52);
    lt::HostTensor dy2 = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kOut}, -0.04f, 0.04f, 53);
    lt::BackwardPtr b1, b2;
    {
      lt::AutocastScope s(f.ctx.get(), f.recipe.get());
      b1 = f.forward(f.lin.get(), x);
      b2 = f.forward(second.get(), x);
    }
    RefState r1, r2;
    f.backward(b2.get(), dy2);  // the second module's backward runs first
    r2.record(amax_of(dy2));
    if (flush) {
      ASSERT_EQ(te_autocast_flush_backward(f.ctx.get()), TE_SUCCESS) << te_last_error();
      r2.update(57344.0f);
      EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), second.get(), TE_ROLE_GRAD_OUTPUT), r2))
          << "flush_backward must update the pending bucket";
    } else {
      EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), second.get(), TE_ROLE_GRAD_OUTPUT), r2))
          << "not updated before the first module's backward";
      f.backward(b1.get(), dy1);
      r1.record(amax_of(dy1));
      r1.update(57344.0f);
      r2.update(57344.0f);
      EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_GRAD_OUTPUT), r1));
      EXPECT_TRUE(Matches(lt::live_scaling_state(f.ctx.get(), second.get(), TE_ROLE_GRAD_OUTPUT), r2));
    }
  }
}

// Non-finite amax: inf or NaN in x must not change the scale (DESIGN: the scale is kept when
// the window's amax is not finite and > 0); the next finite pass proceeds normally.
TEST(LinearState, NonFiniteAmaxKeepsPreviousScale) {
  for (int nan = 0; nan < 2; ++nan) {
    SCOPED_TRACE(nan ? "NaN" : "inf");
    Fixture f(TE_AMAX_MAX, TE_DTYPE_F32);
    lt::HostTensor x = lt::random_tensor(TE_DTYPE_F32, {kTokens, kIn}, -2.0f, 2.0f, 54);
    f.w = lt::random_tensor(TE_DTYPE_F32, {kOut, kIn}, -0.5f, 0.5f, 55);
    f.b = lt::random_tensor(TE_DTYPE_F32, {kOut}, -1.0f, 1.0f, 56);
    {
      lt::AutocastScope s(f.ctx.get(), f.recipe.get());
      lt::BackwardPtr bwd = f.forward(f.lin.get(), x);
    }
    const float good_scale = 448.0f / amax_of(x);
    EXPECT_EQ(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT).info.scale, good_scale);
    lt::HostTensor bad = x;
    bad.set(5, nan ? NAN : INFINITY);
    {
      lt::AutocastScope s(f.ctx.get(), f.recipe.get());
      lt::BackwardPtr bwd = f.forward(f.lin.get(), bad);
    }
    const lt::ScalingSnapshot st = lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT);
    EXPECT_EQ(st.info.scale, good_scale) << "a non-finite amax must keep the previous scale";
    EXPECT_EQ(st.info.scale_inv, 1.0f / good_scale);
    EXPECT_TRUE(std::isfinite(st.info.scale));
  }
}

// margin: scale = (fp8_max / amax) / 2^margin.
TEST(LinearState, MarginDividesTheScale) {
  Fixture f;
  te_recipe_options o;
  te_recipe_options_init(&o, TE_RECIPE_DELAYED_SCALING);
  o.amax_history_len = kHist;
  o.margin = 3;
  te_recipe *r = nullptr;
  ASSERT_EQ(te_recipe_create(&r, &o), TE_SUCCESS) << te_last_error();
  f.recipe.reset(r);
  lt::HostTensor x = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -3.0f, 3.0f, 57);
  {
    lt::AutocastScope s(f.ctx.get(), f.recipe.get());
    lt::BackwardPtr bwd = f.forward(f.lin.get(), x);
  }
  EXPECT_EQ(lt::live_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT).info.scale, (448.0f / amax_of(x)) / 8.0f);
}

// get_scaling_state writes min(history_cap, amax_history_len) floats and no more; NULL history
// is allowed.
TEST(LinearState, GetScalingStateRespectsHistoryCap) {
  Fixture f;
  lt::HostTensor x = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -2.0f, 2.0f, 58);
  lt::AutocastScope s(f.ctx.get(), f.recipe.get());
  lt::BackwardPtr bwd = f.forward(f.lin.get(), x);
  std::vector<float> hist(kHist + 8, -3.0f);
  te_scaling_state_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(te_linear_get_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT, &info, hist.data(), 4), TE_SUCCESS)
      << te_last_error();
  EXPECT_EQ(info.amax_history_len, kHist);
  EXPECT_EQ(hist[0], amax_of(x));
  for (size_t i = 4; i < hist.size(); ++i) EXPECT_EQ(hist[i], -3.0f) << "wrote history[" << i << "] past the cap";
  std::fill(hist.begin(), hist.end(), -3.0f);
  ASSERT_EQ(te_linear_get_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT, &info, hist.data(), hist.size()),
            TE_SUCCESS)
      << te_last_error();
  for (size_t i = kHist; i < hist.size(); ++i) EXPECT_EQ(hist[i], -3.0f) << "wrote history[" << i << "] past the length";
  ASSERT_EQ(te_linear_get_scaling_state(f.ctx.get(), f.lin.get(), TE_ROLE_INPUT, &info, nullptr, 100), TE_SUCCESS)
      << te_last_error();
  EXPECT_EQ(info.scale, 1.0f);
}

// ---- save / load ----------------------------------------------------------------------------

// Trains a fixture a little so every state has a non-trivial history.
void exercise(Fixture &f, int passes, uint32_t seed) {
  for (int p = 0; p < passes; ++p) {
    lt::HostTensor x = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -(1.0f + p), 1.0f + p, seed + 2 * p);
    lt::HostTensor dy = lt::random_tensor(TE_DTYPE_BF16, {kTokens, kOut}, -(0.01f * (p + 1)), 0.01f * (p + 1), seed + 2 * p + 1);
    lt::BackwardPtr bwd;
    {
      lt::AutocastScope s(f.ctx.get(), f.recipe.get());
      bwd = f.forward(f.lin.get(), x);
    }
    f.backward(bwd.get(), dy);
  }
}

TEST(LinearState, SaveLoadRoundTripIsBitExact) {
  Fixture a;
  exercise(a, 3, 60);
  size_t size = 0;
  ASSERT_EQ(te_linear_state_save(a.ctx.get(), a.lin.get(), nullptr, 0, &size), TE_SUCCESS) << te_last_error();
  ASSERT_GT(size, 3 * kHist * sizeof(float));
  std::vector<unsigned char> buf(size + 16, 0xEE);
  size_t written = 0;
  ASSERT_EQ(te_linear_state_save(a.ctx.get(), a.lin.get(), buf.data(), buf.size(), &written), TE_SUCCESS)
      << te_last_error();
  EXPECT_EQ(written, size);
  for (size_t i = size; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xEE) << "wrote past the reported size";

  Fixture b;  // a fresh context and layer
  ASSERT_EQ(te_linear_state_load(b.ctx.get(), b.lin.get(), buf.data(), size), TE_SUCCESS) << te_last_error();
  for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT}) {
    const lt::ScalingSnapshot sa = lt::live_scaling_state(a.ctx.get(), a.lin.get(), role);
    const lt::ScalingSnapshot sb = lt::live_scaling_state(b.ctx.get(), b.lin.get(), role);
    EXPECT_EQ(sa.info.amax_history_len, kHist);
    EXPECT_TRUE(lt::SameState(sa, sb)) << "role " << role;
    EXPECT_EQ(sa.info.fp8_dtype, sb.info.fp8_dtype) << "role " << role;
  }
  const std::vector<unsigned char> resaved = lt::saved_state(b.ctx.get(), b.lin.get());
  EXPECT_EQ(resaved, std::vector<unsigned char>(buf.begin(), buf.begin() + size));

  // A never-used layer round-trips too.
  Fixture c, d;
  const std::vector<unsigned char> empty = lt::saved_state(c.ctx.get(), c.lin.get());
  ASSERT_EQ(te_linear_state_load(d.ctx.get(), d.lin.get(), empty.data(), empty.size()), TE_SUCCESS)
      << te_last_error();
  EXPECT_EQ(lt::saved_state(d.ctx.get(), d.lin.get()), empty);
}

TEST(LinearState, SaveRejectsSmallCapacityWithoutWriting) {
  Fixture a;
  exercise(a, 1, 70);
  const std::vector<unsigned char> good = lt::saved_state(a.ctx.get(), a.lin.get());
  std::vector<unsigned char> buf(good.size(), 0xCD);
  size_t size = 7;
  EXPECT_TRUE(lt::IsError(te_linear_state_save(a.ctx.get(), a.lin.get(), buf.data(), good.size() - 1, &size),
                          TE_ERROR_INVALID_ARGUMENT, "te_linear_state_save", "capacity"));
  EXPECT_EQ(buf, std::vector<unsigned char>(good.size(), 0xCD)) << "buffer written on failure";
}

TEST(LinearState, LoadRejectsBadBuffersAndLeavesStateUnchanged) {
  Fixture a;
  exercise(a, 2, 80);
  const std::vector<unsigned char> good = lt::saved_state(a.ctx.get(), a.lin.get());

  Fixture target;
  exercise(target, 1, 90);
  const std::vector<unsigned char> before = lt::saved_state(target.ctx.get(), target.lin.get());
  te_context *ctx = target.ctx.get();
  te_linear *lin = target.lin.get();
  auto expect_rejected = [&](const void *buf, size_t size, const char *what) {
    SCOPED_TRACE(what);
    EXPECT_TRUE(lt::IsError(te_linear_state_load(ctx, lin, buf, size), TE_ERROR_INVALID_ARGUMENT,
                            "te_linear_state_load", nullptr));
    EXPECT_EQ(lt::saved_state(ctx, lin), before) << "state changed by a rejected load";
  };

  expect_rejected(good.data(), good.size() - 1, "truncated by one byte");
  expect_rejected(good.data(), good.size() / 2, "truncated to half");
  expect_rejected(good.data(), 3, "truncated inside the magic");
  expect_rejected(good.data(), 0, "empty");
  std::vector<unsigned char> longer = good;
  longer.push_back(0);
  expect_rejected(longer.data(), longer.size(), "trailing garbage");
  std::vector<unsigned char> bad_magic = good;
  bad_magic[0] ^= 0xFF;
  expect_rejected(bad_magic.data(), bad_magic.size(), "corrupted magic");
  // Format (see core/modules/linear/state_io.cpp): 4-byte magic, then a uint32 version.
  std::vector<unsigned char> bad_version = good;
  bad_version[4] = static_cast<unsigned char>(bad_version[4] + 1);
  expect_rejected(bad_version.data(), bad_version.size(), "other version");

  // A layer of another shape.
  for (int which = 0; which < 2; ++which) {
    lt::LinearPtr other = lt::make_linear(ctx, which ? kIn : kIn + 16, which ? kOut + 16 : kOut, 1, TE_DTYPE_BF16);
    const std::vector<unsigned char> other_before = lt::saved_state(ctx, other.get());
    EXPECT_TRUE(lt::IsError(te_linear_state_load(ctx, other.get(), good.data(), good.size()),
                            TE_ERROR_INVALID_ARGUMENT, "te_linear_state_load", nullptr))
        << (which ? "out_features differs" : "in_features differs");
    EXPECT_EQ(lt::saved_state(ctx, other.get()), other_before);
  }
  // NULL buffer.
  EXPECT_TRUE(lt::IsError(te_linear_state_load(ctx, lin, nullptr, good.size()), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_state_load", "buf"));
  EXPECT_EQ(lt::saved_state(ctx, lin), before);
}

// ---- resumed training == uninterrupted training, bit for bit --------------------------------

// A one-layer regression trained with SGD on fp32 master weights, delayed scaling (history 16),
// each step in its own autocast scope, backward after the scope.
struct Trainer {
  te_dtype act;
  lt::ContextPtr ctx;
  lt::RecipePtr recipe;
  lt::LinearPtr lin;
  std::vector<float> w_master, b_master;  // fp32 masters
  lt::HostTensor last_y;

  explicit Trainer(te_dtype a) : act(a) { fresh(); }
  void fresh() {
    lin.reset();
    recipe.reset();
    ctx = lt::make_cpu_context();
    recipe = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, kHist);
    lin = lt::make_linear(ctx.get(), kIn, kOut, 1, act);
  }
  void init_params() {
    w_master = lt::random_tensor(TE_DTYPE_F32, {kOut, kIn}, -0.3f, 0.3f, 1001).values_f32();
    b_master = lt::random_tensor(TE_DTYPE_F32, {kOut}, -0.1f, 0.1f, 1002).values_f32();
  }
  void step(int k) {
    lt::HostTensor x = lt::random_tensor(act, {kTokens, kIn}, -1.0f, 1.0f, 2000 + k);
    lt::HostTensor target = lt::random_tensor(TE_DTYPE_F32, {kTokens, kOut}, -1.0f, 1.0f, 3000 + k);
    lt::HostTensor w(act, {kOut, kIn}), b(act, {kOut}), y(act, {kTokens, kOut});
    for (int64_t i = 0; i < w.numel(); ++i) w.set(i, w_master[i]);
    for (int64_t i = 0; i < b.numel(); ++i) b.set(i, b_master[i]);
    te_linear_forward_args fa;
    te_linear_forward_args_init(&fa);
    fa.input = x.get();
    fa.weight = w.get();
    fa.bias = b.get();
    te_linear_backward_ctx *raw = nullptr;
    {
      lt::AutocastScope s(ctx.get(), recipe.get());
      ASSERT_EQ(te_linear_forward(ctx.get(), lin.get(), &fa, y.get(), &raw), TE_SUCCESS) << te_last_error();
    }
    lt::BackwardPtr bwd(raw);
    // MSE loss: dy = 2 (y - target) / numel.
    lt::HostTensor dy(act, {kTokens, kOut});
    const float n = static_cast<float>(dy.numel());
    for (int64_t i = 0; i < dy.numel(); ++i) dy.set(i, 2.0f * (y.at(i) - target.at(i)) / n);
    lt::HostTensor dw(act, {kOut, kIn}), db(act, {kOut});
    te_linear_backward_args ba;
    te_linear_backward_args_init(&ba);
    ba.flags = TE_BACKWARD_ONCE;
    ASSERT_EQ(te_linear_backward(ctx.get(), bwd.get(), dy.get(), nullptr, dw.get(), db.get(), &ba), TE_SUCCESS)
        << te_last_error();
    const float lr = 0.5f;
    for (int64_t i = 0; i < dw.numel(); ++i) w_master[i] -= lr * dw.at(i);
    for (int64_t i = 0; i < db.numel(); ++i) b_master[i] -= lr * db.at(i);
    last_y = y;
  }
};

class LinearResume : public ::testing::TestWithParam<te_dtype> {};

TEST_P(LinearResume, ResumedRunReproducesUninterruptedRunBitwise) {
  const int N = 8, K = 3;
  Trainer full(GetParam());
  full.init_params();
  for (int s = 0; s < N; ++s) full.step(s);
  ASSERT_FALSE(HasFatalFailure());

  Trainer part(GetParam());
  part.init_params();
  for (int s = 0; s < K; ++s) part.step(s);
  ASSERT_FALSE(HasFatalFailure());
  // Checkpoint: layer state + master parameters.
  const std::vector<unsigned char> ckpt = lt::saved_state(part.ctx.get(), part.lin.get());
  const std::vector<float> w_ckpt = part.w_master, b_ckpt = part.b_master;
  part.fresh();  // a new process, in effect: fresh context and layer
  part.w_master = w_ckpt;
  part.b_master = b_ckpt;
  ASSERT_EQ(te_linear_state_load(part.ctx.get(), part.lin.get(), ckpt.data(), ckpt.size()), TE_SUCCESS)
      << te_last_error();
  for (int s = K; s < N; ++s) part.step(s);
  ASSERT_FALSE(HasFatalFailure());

  // Sanity: the scales moved away from 1 (delayed scaling was really exercised).
  EXPECT_NE(lt::live_scaling_state(full.ctx.get(), full.lin.get(), TE_ROLE_INPUT).info.scale, 1.0f);
  EXPECT_NE(lt::live_scaling_state(full.ctx.get(), full.lin.get(), TE_ROLE_GRAD_OUTPUT).info.scale, 1.0f);

  EXPECT_TRUE(0 == std::memcmp(full.w_master.data(), part.w_master.data(), full.w_master.size() * 4))
      << "final weights differ";
  EXPECT_TRUE(0 == std::memcmp(full.b_master.data(), part.b_master.data(), full.b_master.size() * 4))
      << "final biases differ";
  EXPECT_TRUE(lt::bitwise_equal(full.last_y, part.last_y)) << "final outputs differ";
  for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT})
    EXPECT_TRUE(lt::SameState(lt::live_scaling_state(full.ctx.get(), full.lin.get(), role),
                              lt::live_scaling_state(part.ctx.get(), part.lin.get(), role)))
        << "role " << role;
  EXPECT_EQ(lt::saved_state(full.ctx.get(), full.lin.get()), lt::saved_state(part.ctx.get(), part.lin.get()));
}

INSTANTIATE_TEST_SUITE_P(Activations, LinearResume, ::testing::Values(TE_DTYPE_F32, TE_DTYPE_BF16),
                         [](const ::testing::TestParamInfo<te_dtype> &i) {
                           return std::string(lt::dtype_name(i.param));
                         });

}  // namespace
