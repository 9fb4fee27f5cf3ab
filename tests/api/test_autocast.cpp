// Autocast scopes: options, state reporting, token discipline, depth limit, recipe lifetime, and
// when/how forward scaling states are updated (observed through te_linear scaling states and the
// context's stats).
#include <set>

#include "api_test_util.h"

using namespace te_test;

namespace {

class Autocast : public CpuContextTest {
 protected:
  te_autocast_options opts(const te_recipe *recipe = nullptr, int enabled = 1,
                           const te_group *group = nullptr) {
    te_autocast_options o;
    std::memset(&o, 0, sizeof o);
    EXPECT_TE_OK(te_autocast_options_init(&o));
    o.recipe = recipe;
    o.enabled = enabled;
    o.group = group;
    return o;
  }
  te_autocast_token begin(const te_autocast_options &o) {
    te_autocast_token t = 0;
    EXPECT_TE_OK(te_autocast_begin(ctx_, &o, &t));
    return t;
  }
  void end(te_autocast_token t) { EXPECT_TE_OK(te_autocast_end(ctx_, t)); }
};

void expect_same_state(const te_autocast_state &a, const te_autocast_state &b) {
  EXPECT_EQ(a.enabled, b.enabled);
  EXPECT_EQ(a.calibrating, b.calibrating);
  EXPECT_EQ(a.recipe, b.recipe);
  EXPECT_EQ(a.depth, b.depth);
}

TEST_F(Autocast, OptionsInitDefaults) {
  te_autocast_options o;
  std::memset(&o, 0x5A, sizeof o);
  ASSERT_TE_OK(te_autocast_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof(te_autocast_options));
  EXPECT_EQ(o.enabled, 1);
  EXPECT_EQ(o.calibrating, 0);
  EXPECT_EQ(o.recipe, nullptr);
  EXPECT_EQ(o.group, nullptr);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_options_init", "opts", te_autocast_options_init(nullptr));
}

TEST_F(Autocast, StateOutsideAnyScope) {
  te_autocast_state s;
  std::memset(&s, 0x5A, sizeof s);
  s.struct_size = sizeof s;
  ASSERT_TE_OK(te_autocast_get_state(ctx_, &s));
  EXPECT_EQ(s.enabled, 0);
  EXPECT_EQ(s.calibrating, 0);
  EXPECT_EQ(s.recipe, nullptr);
  EXPECT_EQ(s.depth, 0);
}

TEST_F(Autocast, StateReportsInnermostScope) {
  RecipePtr cur = make_recipe(TE_RECIPE_CURRENT_SCALING);
  RecipePtr default_delayed = make_recipe(TE_RECIPE_DELAYED_SCALING);

  te_autocast_options o1 = opts(nullptr, 1);
  te_autocast_token t1 = begin(o1);
  te_autocast_state s = autocast_state(ctx_);
  EXPECT_EQ(s.enabled, 1);
  EXPECT_EQ(s.calibrating, 0);
  EXPECT_EQ(s.depth, 1);
  ASSERT_NE(s.recipe, nullptr) << "a NULL recipe means the context's default delayed recipe";
  EXPECT_EQ(te_recipe_key(s.recipe), te_recipe_key(default_delayed.get()));
  const te_recipe *default_ptr = s.recipe;

  te_autocast_options o2 = opts(cur.get(), 0);
  o2.calibrating = 1;
  te_autocast_token t2 = begin(o2);
  s = autocast_state(ctx_);
  EXPECT_EQ(s.enabled, 0);
  EXPECT_EQ(s.calibrating, 1);
  EXPECT_EQ(s.recipe, cur.get());
  EXPECT_EQ(s.depth, 2);
  EXPECT_NE(t1, t2);

  end(t2);
  s = autocast_state(ctx_);
  EXPECT_EQ(s.enabled, 1);
  EXPECT_EQ(s.calibrating, 0);
  EXPECT_EQ(s.recipe, default_ptr);
  EXPECT_EQ(s.depth, 1);
  end(t1);
  s = autocast_state(ctx_);
  EXPECT_EQ(s.depth, 0);
  EXPECT_EQ(s.recipe, nullptr);
  EXPECT_EQ(s.enabled, 0);
}

TEST_F(Autocast, OneOptionsValueReusedForNestedScopes) {
  RecipePtr r = make_recipe();
  const te_autocast_options o = opts(r.get());
  std::vector<te_autocast_token> toks;
  for (int i = 0; i < 5; ++i) toks.push_back(begin(o));
  EXPECT_EQ(std::set<te_autocast_token>(toks.begin(), toks.end()).size(), toks.size())
      << "each open scope needs its own token";
  EXPECT_EQ(autocast_state(ctx_).depth, 5);
  for (int i = 4; i >= 0; --i) {
    end(toks[static_cast<size_t>(i)]);
    EXPECT_EQ(autocast_state(ctx_).depth, i);
  }
  EXPECT_EQ(context_stats(ctx_).scopes_closed, 5u);
}

TEST_F(Autocast, EndNeedsTheInnermostToken) {
  te_autocast_options o = opts();
  te_autocast_token outer = begin(o);
  RecipePtr r = make_recipe(TE_RECIPE_CURRENT_SCALING);
  te_autocast_options oi = opts(r.get());
  te_autocast_token inner = begin(oi);
  te_autocast_state before = autocast_state(ctx_);
  uint64_t closed = context_stats(ctx_).scopes_closed;

  EXPECT_TE_FAIL(TE_ERROR_INVALID_STATE, "te_autocast_end", nullptr, te_autocast_end(ctx_, outer));
  expect_same_state(autocast_state(ctx_), before);
  for (te_autocast_token bogus : {te_autocast_token(0), outer ^ inner ^ 0x5555u, ~inner, inner + 1000}) {
    if (bogus == inner) continue;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_STATE, "te_autocast_end", nullptr, te_autocast_end(ctx_, bogus));
    expect_same_state(autocast_state(ctx_), before);
  }
  EXPECT_EQ(context_stats(ctx_).scopes_closed, closed);

  end(inner);
  end(outer);
  // Nothing open: any end is a state error.
  EXPECT_TE_FAIL(TE_ERROR_INVALID_STATE, "te_autocast_end", nullptr, te_autocast_end(ctx_, outer));
  EXPECT_EQ(autocast_state(ctx_).depth, 0);
}

TEST_F(Autocast, StaleTokenDoesNotCloseALaterScope) {
  // The token identifies the scope: the token of a closed scope must not close the scope that
  // replaced it at the same depth.
  te_autocast_options o = opts();
  te_autocast_token a = begin(o);
  end(a);
  te_autocast_token b = begin(o);
  if (a == b) {
    ADD_FAILURE() << "a new scope at the same depth got the closed scope's token " << a;
  } else {
    EXPECT_TE_FAIL(TE_ERROR_INVALID_STATE, "te_autocast_end", nullptr, te_autocast_end(ctx_, a));
    EXPECT_EQ(autocast_state(ctx_).depth, 1);
  }
  end(b);
}

TEST_F(Autocast, DepthLimit) {
  te_autocast_options o = opts();
  std::vector<te_autocast_token> toks;
  for (int i = 0; i < TE_AUTOCAST_MAX_DEPTH; ++i) {
    te_autocast_token t = 0;
    ASSERT_TE_OK(te_autocast_begin(ctx_, &o, &t)) << "depth " << i;
    toks.push_back(t);
  }
  te_autocast_state before = autocast_state(ctx_);
  EXPECT_EQ(before.depth, TE_AUTOCAST_MAX_DEPTH);
  te_autocast_token t = 0xDEADBEEFu;
  RecipePtr r = make_recipe(TE_RECIPE_BLOCK_SCALING);
  te_autocast_options o2 = opts(r.get(), 0);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_STATE, "te_autocast_begin", nullptr, te_autocast_begin(ctx_, &o2, &t));
  EXPECT_EQ(t, 0xDEADBEEFu);
  expect_same_state(autocast_state(ctx_), before);
  // The stack is intact: all 64 close in order.
  for (size_t i = toks.size(); i-- > 0;) ASSERT_TE_OK(te_autocast_end(ctx_, toks[i])) << i;
  EXPECT_EQ(autocast_state(ctx_).depth, 0);
  EXPECT_EQ(context_stats(ctx_).scopes_closed, static_cast<uint64_t>(TE_AUTOCAST_MAX_DEPTH));
}

TEST_F(Autocast, BeginRetainsTheRecipe) {
  te_recipe_options ro = recipe_defaults(TE_RECIPE_CURRENT_SCALING);
  ro.margin = 9;
  te_recipe *r = nullptr;
  ASSERT_TE_OK(te_recipe_create(&r, &ro));
  uint64_t key = te_recipe_key(r);
  te_autocast_options o = opts(r);
  te_autocast_token t = begin(o);
  te_recipe_release(r);  // the scope still holds it: no use-after-free below (ASan checks)
  te_autocast_state s = autocast_state(ctx_);
  EXPECT_EQ(s.recipe, r);
  EXPECT_EQ(te_recipe_key(s.recipe), key);
  EXPECT_FALSE(std::string(te_recipe_describe(s.recipe)).empty());
  end(t);  // releases the scope's reference (LeakSanitizer checks)
}

TEST_F(Autocast, BadArgumentsChangeNothing) {
  te_autocast_options o = opts();
  te_autocast_token t = 77;
  te_autocast_token outer = begin(o);
  te_autocast_state before = autocast_state(ctx_);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_begin", "ctx", te_autocast_begin(nullptr, &o, &t));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_begin", "opts", te_autocast_begin(ctx_, nullptr, &t));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_begin", "token", te_autocast_begin(ctx_, &o, nullptr));
  for (size_t bad : {size_t(0), sizeof(size_t), sizeof(te_autocast_options) - 1}) {
    te_autocast_options b = o;
    b.struct_size = bad;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_begin", "struct_size", te_autocast_begin(ctx_, &b, &t));
  }
  {
    te_autocast_options b = o;
    b.enabled = 2;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_begin", "enabled", te_autocast_begin(ctx_, &b, &t));
    b = o;
    b.calibrating = -1;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_begin", "calibrating", te_autocast_begin(ctx_, &b, &t));
  }
  EXPECT_EQ(t, 77u);
  expect_same_state(autocast_state(ctx_), before);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_end", "ctx", te_autocast_end(nullptr, outer));
  expect_same_state(autocast_state(ctx_), before);
  te_autocast_state s;
  std::memset(&s, 0x11, sizeof s);
  s.struct_size = 0;
  te_autocast_state sb = s;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_get_state", "struct_size", te_autocast_get_state(ctx_, &s));
  EXPECT_EQ(std::memcmp(&s, &sb, sizeof s), 0);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_get_state", "out", te_autocast_get_state(ctx_, nullptr));
  s.struct_size = sizeof s;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_get_state", "ctx", te_autocast_get_state(nullptr, &s));
  end(outer);
  EXPECT_EQ(context_stats(ctx_).scopes_closed, 1u);
}

TEST_F(Autocast, FlushBackwardWithNothingPending) {
  te_context_stats before = context_stats(ctx_);
  EXPECT_TE_OK(te_autocast_flush_backward(ctx_));
  te_autocast_token t = begin(opts());
  EXPECT_TE_OK(te_autocast_flush_backward(ctx_));
  end(t);
  EXPECT_TE_OK(te_autocast_flush_backward(ctx_));
  te_context_stats after = context_stats(ctx_);
  EXPECT_EQ(after.bucket_updates, before.bucket_updates);
  EXPECT_EQ(after.states_updated, before.states_updated);
  EXPECT_EQ(after.amax_reductions, 0u);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_flush_backward", "ctx", te_autocast_flush_backward(nullptr));
}

// ---- scale updates, observed through linears ---------------------------------------------

// A 16x16 linear with bias, F32 activations, fed 16 tokens.
struct Layer {
  LinearPtr lin;
  HostTensor w, b;
  float w_amax;
};

class AutocastUpdates : public Autocast {
 protected:
  static constexpr int64_t N = 16;

  Layer make_layer(float w_amax, uint32_t seed) {
    Layer l;
    l.lin = make_linear(ctx_, N, N, 1, TE_DTYPE_F32);
    l.w = random_tensor(TE_DTYPE_F32, {N, N}, -w_amax * 0.9f, w_amax * 0.9f, seed);
    l.w.set(7, -w_amax);  // max |W| is exactly w_amax (negative: amax is of |W|)
    l.b = random_tensor(TE_DTYPE_F32, {N}, -1, 1, seed + 1);
    l.w_amax = w_amax;
    return l;
  }
  // Input whose max |x| is exactly `amax`.
  HostTensor input(float amax, uint32_t seed) {
    HostTensor x = random_tensor(TE_DTYPE_F32, {N, N}, -amax * 0.9f, amax * 0.9f, seed);
    x.set(37, seed % 2 ? amax : -amax);
    return x;
  }
  HostTensor forward(Layer &l, const HostTensor &x) {
    HostTensor y = make_tensor(TE_DTYPE_F32, {N, N});
    te_linear_forward_args a;
    std::memset(&a, 0, sizeof a);
    EXPECT_TE_OK(te_linear_forward_args_init(&a));
    a.input = x.get();
    a.weight = l.w.get();
    a.bias = l.b.get();
    te_linear_residuals res;
    std::memset(&res, 0, sizeof res);
    res.struct_size = sizeof res;
    EXPECT_TE_OK(te_linear_forward_compute(ctx_, l.lin.get(), &a, y.get(), &res));
    te_linear_residuals_release(&res);
    return y;
  }
  ScalingSnapshot state(const Layer &l, te_tensor_role role) { return scaling_state(ctx_, l.lin.get(), role); }

  // After exactly one update from a fresh state with recorded amax `amax` (history len 1024,
  // E4M3, margin 0, MAX): history [0, ..., 0, amax], scale 448/amax.
  void expect_rolled_once(const ScalingSnapshot &s, float amax) {
    EXPECT_EQ(s.info.amax_history_len, 1024);
    EXPECT_EQ(s.info.fp8_dtype, TE_DTYPE_E4M3);
    EXPECT_EQ(s.history[0], 0.0f);
    EXPECT_EQ(s.history[1023], amax);
    size_t nonzero = 0;
    for (size_t i = 0; i < 1023; ++i) nonzero += s.history[i] != 0.0f;
    EXPECT_EQ(nonzero, 0u);
    EXPECT_EQ(s.info.scale, 448.0f / amax);
    EXPECT_EQ(s.info.scale_inv, 1.0f / (448.0f / amax));
  }
  void expect_untouched(const ScalingSnapshot &s) {
    EXPECT_EQ(s.info.amax_history_len, 0);
    EXPECT_EQ(s.info.scale, 1.0f);
    EXPECT_EQ(s.info.scale_inv, 1.0f);
  }
};

TEST_F(AutocastUpdates, FreshStateScaleOneNoHistory) {
  Layer l = make_layer(0.5f, 1);
  for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT}) {
    ScalingSnapshot s = state(l, role);
    expect_untouched(s);
    EXPECT_EQ(s.history[0], -7.0f) << "min(cap, 0) = 0 floats must be written";
  }
}

TEST_F(AutocastUpdates, ForwardOutsideAScopeChangesNoState) {
  Layer l = make_layer(0.5f, 1);
  HostTensor x = input(3.0f, 2);
  forward(l, x);
  expect_untouched(state(l, TE_ROLE_INPUT));
  expect_untouched(state(l, TE_ROLE_WEIGHT));
  te_autocast_token t = begin(opts(nullptr, 0));  // disabled scope: high precision too
  forward(l, x);
  end(t);
  expect_untouched(state(l, TE_ROLE_INPUT));
  EXPECT_EQ(context_stats(ctx_).bucket_updates, 0u);
}

TEST_F(AutocastUpdates, OutermostEndUpdatesInputAndWeight) {
  Layer l = make_layer(0.5f, 1);
  HostTensor x = input(3.0f, 2);
  te_autocast_token t = begin(opts());
  forward(l, x);
  // Recorded, not yet applied: slot 0 holds the current amax, the scale is still 1.
  ScalingSnapshot inside = state(l, TE_ROLE_INPUT);
  EXPECT_EQ(inside.info.amax_history_len, 1024);
  EXPECT_EQ(inside.history[0], 3.0f);
  EXPECT_EQ(inside.info.scale, 1.0f);
  EXPECT_EQ(state(l, TE_ROLE_WEIGHT).history[0], 0.5f);
  EXPECT_EQ(context_stats(ctx_).bucket_updates, 0u);
  end(t);
  expect_rolled_once(state(l, TE_ROLE_INPUT), 3.0f);
  expect_rolled_once(state(l, TE_ROLE_WEIGHT), 0.5f);
  expect_untouched(state(l, TE_ROLE_GRAD_OUTPUT));
  te_context_stats s = context_stats(ctx_);
  EXPECT_EQ(s.scopes_closed, 1u);
  EXPECT_EQ(s.bucket_updates, 1u);
  EXPECT_EQ(s.states_updated, 2u);
  EXPECT_EQ(s.amax_reductions, 0u);
}

TEST_F(AutocastUpdates, HistoryWindowMaxAndMostRecent) {
  for (te_amax_algo algo : {TE_AMAX_MAX, TE_AMAX_MOST_RECENT}) {
    SCOPED_TRACE(algo == TE_AMAX_MAX ? "MAX" : "MOST_RECENT");
    te_recipe_options ro = recipe_defaults();
    ro.amax_algo = algo;
    RecipePtr r = make_recipe(ro);
    Layer l = make_layer(0.5f, 1);
    te_autocast_options o = opts(r.get());
    te_autocast_token t = begin(o);
    forward(l, input(5.0f, 3));
    end(t);
    t = begin(o);
    forward(l, input(2.0f, 4));
    end(t);
    ScalingSnapshot s = state(l, TE_ROLE_INPUT);
    EXPECT_EQ(s.history[0], 0.0f);
    EXPECT_EQ(s.history[1022], 5.0f);
    EXPECT_EQ(s.history[1023], 2.0f);
    float expected = algo == TE_AMAX_MAX ? 448.0f / 5.0f : 448.0f / 2.0f;
    EXPECT_EQ(s.info.scale, expected);
    EXPECT_EQ(s.info.scale_inv, 1.0f / expected);
  }
}

// TE's update on a short history, simulated step by step: slot 0 receives the step's amax,
// scale from the window max, then roll left by one and zero slot 0.
TEST_F(AutocastUpdates, ShortHistoryMatchesTeRoll) {
  te_recipe_options ro = recipe_defaults();
  ro.amax_history_len = 4;
  ro.margin = 1;
  RecipePtr r = make_recipe(ro);
  Layer l = make_layer(0.5f, 1);
  te_autocast_options o = opts(r.get());
  std::vector<float> hist(4, 0.0f);
  float scale = 1.0f;
  const float amaxes[] = {8.0f, 1.0f, 2.0f, 1.0f, 3.0f, 1.5f, 1.0f};
  uint32_t seed = 10;
  for (float a : amaxes) {
    SCOPED_TRACE("amax " + std::to_string(a));
    te_autocast_token t = begin(o);
    forward(l, input(a, seed++));
    end(t);
    hist[0] = a;
    float window = *std::max_element(hist.begin(), hist.end());
    scale = (448.0f / window) / 2.0f;
    std::rotate(hist.begin(), hist.begin() + 1, hist.end());
    hist[0] = 0.0f;
    ScalingSnapshot s = scaling_state(ctx_, l.lin.get(), TE_ROLE_INPUT, 4);
    EXPECT_EQ(s.info.amax_history_len, 4);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(s.history[i], hist[i]) << "slot " << i;
    EXPECT_EQ(s.info.scale, scale);
    EXPECT_EQ(s.info.scale_inv, 1.0f / scale);
  }
}

TEST_F(AutocastUpdates, HistoryCapLimitsTheCopy) {
  Layer l = make_layer(0.5f, 1);
  te_autocast_token t = begin(opts());
  forward(l, input(3.0f, 2));
  end(t);
  ScalingSnapshot s = scaling_state(ctx_, l.lin.get(), TE_ROLE_INPUT, 2000);
  EXPECT_EQ(s.history[1023], 3.0f);
  EXPECT_EQ(s.history[1024], -7.0f) << "only amax_history_len floats may be written";
  te_scaling_state_info info;
  info.struct_size = sizeof info;
  ASSERT_TE_OK(te_linear_get_scaling_state(ctx_, l.lin.get(), TE_ROLE_INPUT, &info, nullptr, 0));
  EXPECT_EQ(info.amax_history_len, 1024);
}

TEST_F(AutocastUpdates, NestedEnabledOnlyOutermostEndUpdates) {
  Layer l = make_layer(0.5f, 1);
  te_autocast_options o = opts();
  te_autocast_token outer = begin(o);
  te_autocast_token inner = begin(o);
  forward(l, input(3.0f, 2));
  end(inner);
  ScalingSnapshot s = state(l, TE_ROLE_INPUT);
  EXPECT_EQ(s.history[0], 3.0f) << "inner end of a nested enabled scope must not update";
  EXPECT_EQ(s.info.scale, 1.0f);
  EXPECT_EQ(context_stats(ctx_).bucket_updates, 0u);
  end(outer);
  expect_rolled_once(state(l, TE_ROLE_INPUT), 3.0f);
  EXPECT_EQ(context_stats(ctx_).bucket_updates, 1u);
}

TEST_F(AutocastUpdates, InnerEndUpdatesUnderADisabledOuterScope) {
  Layer l = make_layer(0.5f, 1);
  te_autocast_token outer = begin(opts(nullptr, 0));
  te_autocast_token inner = begin(opts());
  forward(l, input(3.0f, 2));
  end(inner);
  expect_rolled_once(state(l, TE_ROLE_INPUT), 3.0f);
  EXPECT_EQ(context_stats(ctx_).bucket_updates, 1u);
  end(outer);
  EXPECT_EQ(context_stats(ctx_).bucket_updates, 1u);
  expect_rolled_once(state(l, TE_ROLE_INPUT), 3.0f);
}

TEST_F(AutocastUpdates, OneBucketUpdatePerRecipeWhateverTheNumberOfLinears) {
  Layer a = make_layer(0.5f, 1), b = make_layer(0.25f, 3), c = make_layer(2.0f, 5);
  te_autocast_token t = begin(opts());
  forward(a, input(3.0f, 10));
  forward(b, input(1.5f, 11));
  forward(c, input(6.0f, 12));
  end(t);
  te_context_stats s = context_stats(ctx_);
  EXPECT_EQ(s.bucket_updates, 1u);
  EXPECT_EQ(s.states_updated, 6u);  // input + weight of 3 linears
  EXPECT_EQ(s.amax_reductions, 0u);
  expect_rolled_once(state(a, TE_ROLE_INPUT), 3.0f);
  expect_rolled_once(state(b, TE_ROLE_INPUT), 1.5f);
  expect_rolled_once(state(c, TE_ROLE_INPUT), 6.0f);
  expect_rolled_once(state(c, TE_ROLE_WEIGHT), 2.0f);
}

TEST_F(AutocastUpdates, SiblingScopesWithTwoRecipesInsideDisabledOuter) {
  te_recipe_options ro = recipe_defaults();
  ro.margin = 1;
  RecipePtr r1 = make_recipe(), r2 = make_recipe(ro);
  Layer a = make_layer(0.5f, 1), b = make_layer(0.5f, 3);
  te_autocast_token outer = begin(opts(nullptr, 0));
  te_autocast_token t = begin(opts(r1.get()));
  forward(a, input(3.0f, 10));
  end(t);
  EXPECT_EQ(context_stats(ctx_).bucket_updates, 1u);
  t = begin(opts(r2.get()));
  forward(b, input(3.0f, 11));
  end(t);
  EXPECT_EQ(context_stats(ctx_).bucket_updates, 2u);
  end(outer);
  EXPECT_EQ(context_stats(ctx_).bucket_updates, 2u);
  EXPECT_EQ(state(a, TE_ROLE_INPUT).info.scale, 448.0f / 3.0f);
  EXPECT_EQ(state(b, TE_ROLE_INPUT).info.scale, (448.0f / 3.0f) / 2.0f);  // margin 1
}

TEST_F(AutocastUpdates, SiblingScopesWithTwoRecipesInsideEnabledOuter) {
  te_recipe_options ro = recipe_defaults();
  ro.margin = 1;
  RecipePtr r1 = make_recipe(), r2 = make_recipe(ro);
  Layer a = make_layer(0.5f, 1), b = make_layer(0.5f, 3);
  te_autocast_token outer = begin(opts(r1.get()));
  te_autocast_token t = begin(opts(r1.get()));
  forward(a, input(3.0f, 10));
  end(t);
  t = begin(opts(r2.get()));
  forward(b, input(3.0f, 11));
  end(t);
  EXPECT_EQ(context_stats(ctx_).bucket_updates, 0u);
  end(outer);
  te_context_stats s = context_stats(ctx_);
  EXPECT_EQ(s.bucket_updates, 2u);
  EXPECT_EQ(s.states_updated, 4u);
  EXPECT_EQ(state(a, TE_ROLE_INPUT).info.scale, 448.0f / 3.0f);
  EXPECT_EQ(state(b, TE_ROLE_INPUT).info.scale, (448.0f / 3.0f) / 2.0f);
}

TEST_F(AutocastUpdates, BucketsAreKeyedByRecipeKeyNotHandle) {
  RecipePtr r1 = make_recipe(), r2 = make_recipe();  // equal options, two handles
  ASSERT_NE(r1.get(), r2.get());
  Layer a = make_layer(0.5f, 1), b = make_layer(0.5f, 3);
  te_autocast_token outer = begin(opts(r1.get()));
  te_autocast_token t = begin(opts(r2.get()));
  forward(b, input(2.0f, 11));
  end(t);
  forward(a, input(3.0f, 10));
  end(outer);
  te_context_stats s = context_stats(ctx_);
  EXPECT_EQ(s.bucket_updates, 1u);
  EXPECT_EQ(s.states_updated, 4u);
  expect_rolled_once(state(a, TE_ROLE_INPUT), 3.0f);
  expect_rolled_once(state(b, TE_ROLE_INPUT), 2.0f);
}

TEST_F(AutocastUpdates, BucketsAreKeyedByGroup) {
  te_group *g = nullptr;
  ASSERT_TE_OK(te_group_create_single(&g));
  GroupPtr owned(g);
  RecipePtr r = make_recipe();
  Layer a = make_layer(0.5f, 1), b = make_layer(0.5f, 3);
  te_autocast_token outer = begin(opts(r.get()));
  te_autocast_token t = begin(opts(r.get(), 1, g));
  forward(b, input(2.0f, 11));
  end(t);
  forward(a, input(3.0f, 10));
  end(outer);
  te_context_stats s = context_stats(ctx_);
  EXPECT_EQ(s.bucket_updates, 2u);
  EXPECT_EQ(s.amax_reductions, 0u) << "single-rank groups have nothing to reduce";
  expect_rolled_once(state(a, TE_ROLE_INPUT), 3.0f);
  expect_rolled_once(state(b, TE_ROLE_INPUT), 2.0f);
}

TEST_F(AutocastUpdates, ModuleUsedTwiceInOneScopeKeepsTheMax) {
  for (bool big_first : {true, false}) {
    SCOPED_TRACE(big_first ? "5 then 2" : "2 then 5");
    Layer l = make_layer(0.5f, 1);
    te_autocast_token t = begin(opts());
    forward(l, input(big_first ? 5.0f : 2.0f, 20));
    forward(l, input(big_first ? 2.0f : 5.0f, 21));
    EXPECT_EQ(state(l, TE_ROLE_INPUT).history[0], 5.0f);
    end(t);
    expect_rolled_once(state(l, TE_ROLE_INPUT), 5.0f);
    expect_rolled_once(state(l, TE_ROLE_WEIGHT), 0.5f);
  }
  EXPECT_EQ(context_stats(ctx_).bucket_updates, 2u);
}

TEST_F(AutocastUpdates, UnusedStatesDoNotRoll) {
  Layer a = make_layer(0.5f, 1), b = make_layer(0.5f, 3);
  te_autocast_token t = begin(opts());
  forward(a, input(3.0f, 10));
  end(t);
  t = begin(opts());
  forward(b, input(2.0f, 11));  // a unused in this step
  end(t);
  expect_rolled_once(state(a, TE_ROLE_INPUT), 3.0f);
  expect_rolled_once(state(b, TE_ROLE_INPUT), 2.0f);
  t = begin(opts());  // a scope with no FP8 use: no bucket, no update
  end(t);
  te_context_stats s = context_stats(ctx_);
  EXPECT_EQ(s.bucket_updates, 2u);
  EXPECT_EQ(s.scopes_closed, 3u);
  expect_rolled_once(state(a, TE_ROLE_INPUT), 3.0f);
}

TEST_F(AutocastUpdates, CalibratingComputesInHighPrecisionAndRecordsAmax) {
  Layer l = make_layer(0.5f, 1);
  HostTensor x = input(3.0f, 2);
  HostTensor y_hp = forward(l, x);  // no scope: high precision
  te_autocast_options o = opts(nullptr, 0);
  o.calibrating = 1;
  te_autocast_token t = begin(o);
  HostTensor y_cal = forward(l, x);
  end(t);
  EXPECT_TRUE(same_contents(y_cal, y_hp)) << "calibration must compute exactly as high precision";
  ScalingSnapshot s = state(l, TE_ROLE_INPUT);
  ASSERT_GT(s.info.amax_history_len, 0) << "calibration records amaxes into the history";
  bool recorded = s.history[0] == 3.0f || s.history[static_cast<size_t>(s.info.amax_history_len) - 1] == 3.0f;
  EXPECT_TRUE(recorded) << "history[0] = " << s.history[0];
  // An FP8 forward differs from high precision (so the comparison above means something).
  Layer l2 = make_layer(0.5f, 1);
  t = begin(opts());
  HostTensor y_fp8 = forward(l2, x);
  end(t);
  EXPECT_FALSE(same_contents(y_fp8, y_hp));
}

}  // namespace
