// Bad input for every public function that can fail: NULL handles and pointers, bad
// struct_size, wrong dtype, shape mismatch, FP8 dims not multiples of 16, wrong-type handles.
// Each case checks the status, that te_last_error() names the function and the argument, and
// that nothing changed (outputs prefilled with sentinels and compared; autocast, stats and the
// linear's scaling states snapshotted and compared).
//
// Covered in other files as well: te_tensor_scale_inv_count, te_tensor_from_dlpack
// (test_primitives.cpp); te_context_*, te_group_*, te_nccl_* (test_errors_and_context.cpp);
// te_recipe_* (test_recipe.cpp); te_autocast_* (test_autocast.cpp).
#include <functional>

#include "api_test_util.h"

using namespace te_test;

namespace {

// ---- status strings and versions -----------------------------------------------------------

TEST(StatusString, EveryCodeAndUnknown) {
  EXPECT_STREQ(te_status_string(TE_SUCCESS), "TE_SUCCESS");
  EXPECT_STREQ(te_status_string(TE_ERROR_INVALID_ARGUMENT), "TE_ERROR_INVALID_ARGUMENT");
  EXPECT_STREQ(te_status_string(TE_ERROR_INVALID_STATE), "TE_ERROR_INVALID_STATE");
  EXPECT_STREQ(te_status_string(TE_ERROR_UNSUPPORTED), "TE_ERROR_UNSUPPORTED");
  EXPECT_STREQ(te_status_string(TE_ERROR_OUT_OF_MEMORY), "TE_ERROR_OUT_OF_MEMORY");
  EXPECT_STREQ(te_status_string(TE_ERROR_CUDA), "TE_ERROR_CUDA");
  EXPECT_STREQ(te_status_string(TE_ERROR_CUBLAS), "TE_ERROR_CUBLAS");
  EXPECT_STREQ(te_status_string(TE_ERROR_NCCL), "TE_ERROR_NCCL");
  EXPECT_STREQ(te_status_string(TE_ERROR_INTERNAL), "TE_ERROR_INTERNAL");
  for (int v : {9, 100, -1, 0x7FFFFFFF})
    EXPECT_STREQ(te_status_string(static_cast<te_status>(v)), "TE_ERROR_UNKNOWN") << v;
  // The values are ABI.
  EXPECT_EQ(TE_ERROR_INVALID_ARGUMENT, 1);
  EXPECT_EQ(TE_ERROR_INTERNAL, 8);
}

TEST(Version, NumberAndString) {
  EXPECT_EQ(te_version(), static_cast<unsigned>(TE_VERSION_NUMBER));
  const char *s = te_version_string();
  ASSERT_NE(s, nullptr);
  std::string want = std::to_string(TE_VERSION_MAJOR) + "." + std::to_string(TE_VERSION_MINOR) + "." +
                     std::to_string(TE_VERSION_PATCH);
  EXPECT_EQ(std::string(s), want);
  EXPECT_EQ(te_version_string(), s) << "static storage";
}

TEST(OptionsInit, NullIsAnError) {
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_context_options_init", "opts", te_context_options_init(nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_recipe_options_init", "opts",
                 te_recipe_options_init(nullptr, TE_RECIPE_DELAYED_SCALING));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_options_init", "opts", te_autocast_options_init(nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_options_init", "opts", te_linear_options_init(nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_forward_args_init", "args", te_linear_forward_args_init(nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_backward_args_init", "args", te_linear_backward_args_init(nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_quantize_options_init", "opts", te_quantize_options_init(nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_gemm_options_init", "opts", te_gemm_options_init(nullptr));
}

TEST(OptionsInit, StructSizesAreSet) {
  te_linear_options lo;
  ASSERT_TE_OK(te_linear_options_init(&lo));
  EXPECT_EQ(lo.struct_size, sizeof lo);
  EXPECT_EQ(lo.bias, 1);
  EXPECT_EQ(lo.activation_dtype, TE_DTYPE_BF16);
  EXPECT_EQ(lo.fuse_wgrad_accumulation, 0);
  te_linear_forward_args fa;
  ASSERT_TE_OK(te_linear_forward_args_init(&fa));
  EXPECT_EQ(fa.struct_size, sizeof fa);
  EXPECT_EQ(fa.weight_unchanged, 0);
  EXPECT_EQ(fa.input, nullptr);
  te_linear_backward_args ba;
  ASSERT_TE_OK(te_linear_backward_args_init(&ba));
  EXPECT_EQ(ba.struct_size, sizeof ba);
  EXPECT_EQ(ba.flags, 0u);
}

// ---- fixture: a context, a 16x16 F32 linear with bias, and valid arguments ------------------

class BadInput : public CpuContextTest {
 protected:
  static constexpr int64_t N = 16;
  void SetUp() override {
    CpuContextTest::SetUp();
    lin_ = make_linear(ctx_, N, N, 1, TE_DTYPE_F32);
    ASSERT_NE(lin_, nullptr);
    recipe_ = make_recipe();
    te_group *g = nullptr;
    ASSERT_TE_OK(te_group_create_single(&g));
    group_.reset(g);
    x_ = random_tensor(TE_DTYPE_F32, {N, N}, -2, 2, 1);
    w_ = random_tensor(TE_DTYPE_F32, {N, N}, -1, 1, 2);
    b_ = random_tensor(TE_DTYPE_F32, {N}, -1, 1, 3);
    y_ = make_tensor(TE_DTYPE_F32, {N, N});
    // One FP8 step, so the scaling states hold non-trivial values to compare against.
    te_autocast_options o;
    ASSERT_TE_OK(te_autocast_options_init(&o));
    te_autocast_token t;
    ASSERT_TE_OK(te_autocast_begin(ctx_, &o, &t));
    te_linear_forward_args a = fwd_args();
    te_linear_backward_ctx *bwd = nullptr;
    ASSERT_TE_OK(te_linear_forward(ctx_, lin_.get(), &a, y_.get(), &bwd));
    HostTensor dy = random_tensor(TE_DTYPE_F32, {N, N}, -1, 1, 4);
    ASSERT_TE_OK(te_linear_backward(ctx_, bwd, dy.get(), nullptr, nullptr, nullptr, nullptr));
    te_linear_backward_ctx_destroy(bwd);
    ASSERT_TE_OK(te_autocast_end(ctx_, t));
    y_ = make_tensor(TE_DTYPE_F32, {N, N});
  }

  te_linear_forward_args fwd_args() {
    te_linear_forward_args a;
    std::memset(&a, 0, sizeof a);
    EXPECT_TE_OK(te_linear_forward_args_init(&a));
    a.input = x_.get();
    a.weight = w_.get();
    a.bias = b_.get();
    return a;
  }

  // Everything a failed call must leave alone.
  struct World {
    ScalingSnapshot in, w, g;
    te_autocast_state ac;
    te_context_stats stats;
  };
  World world() {
    World s{scaling_state(ctx_, lin_.get(), TE_ROLE_INPUT), scaling_state(ctx_, lin_.get(), TE_ROLE_WEIGHT),
            scaling_state(ctx_, lin_.get(), TE_ROLE_GRAD_OUTPUT), autocast_state(ctx_), context_stats(ctx_)};
    return s;
  }
  void expect_same_world(const World &a) {
    World b = world();
    EXPECT_TRUE(a.in == b.in) << "input scaling state changed";
    EXPECT_TRUE(a.w == b.w) << "weight scaling state changed";
    EXPECT_TRUE(a.g == b.g) << "grad_output scaling state changed";
    EXPECT_EQ(a.ac.depth, b.ac.depth);
    EXPECT_EQ(a.ac.enabled, b.ac.enabled);
    EXPECT_EQ(a.ac.recipe, b.ac.recipe);
    EXPECT_EQ(a.stats.scopes_closed, b.stats.scopes_closed);
    EXPECT_EQ(a.stats.bucket_updates, b.stats.bucket_updates);
    EXPECT_EQ(a.stats.states_updated, b.stats.states_updated);
  }

  te_autocast_token begin_enabled() {
    te_autocast_options o;
    EXPECT_TE_OK(te_autocast_options_init(&o));
    te_autocast_token t = 0;
    EXPECT_TE_OK(te_autocast_begin(ctx_, &o, &t));
    return t;
  }

  LinearPtr lin_;
  RecipePtr recipe_;
  GroupPtr group_;
  HostTensor x_, w_, b_, y_;
};

// Handles of the wrong type, made from live objects of another type.
#define AS_CONTEXT(p) reinterpret_cast<te_context *>(p)
#define AS_LINEAR(p) reinterpret_cast<te_linear *>(p)
#define AS_RECIPE(p) reinterpret_cast<te_recipe *>(p)
#define AS_GROUP(p) reinterpret_cast<te_group *>(p)
#define AS_BWD(p) reinterpret_cast<te_linear_backward_ctx *>(p)

TEST_F(BadInput, SetupProducedFp8State) {
  // Guards the fixture: the world snapshots compare real state.
  EXPECT_EQ(scaling_state(ctx_, lin_.get(), TE_ROLE_INPUT).info.amax_history_len, 1024);
  EXPECT_NE(scaling_state(ctx_, lin_.get(), TE_ROLE_INPUT).info.scale, 1.0f);
}

// ---- context functions with wrong-type handles ----------------------------------------------

TEST_F(BadInput, ContextFunctionsRejectOtherHandles) {
  World before = world();
  te_device d;
  d.type = TE_DEVICE_CUDA;
  d.index = 5;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_context_get_device", "ctx",
                 te_context_get_device(AS_CONTEXT(recipe_.get()), &d));
  EXPECT_EQ(d.index, 5);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_context_set_stream", "ctx",
                 te_context_set_stream(AS_CONTEXT(lin_.get()), nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_context_synchronize", "ctx",
                 te_context_synchronize(AS_CONTEXT(group_.get())));
  te_context_stats s;
  std::memset(&s, 0x42, sizeof s);
  s.struct_size = sizeof s;
  te_context_stats sb = s;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_context_get_stats", "ctx",
                 te_context_get_stats(AS_CONTEXT(recipe_.get()), &s));
  EXPECT_EQ(std::memcmp(&s, &sb, sizeof s), 0);
  te_autocast_options o;
  ASSERT_TE_OK(te_autocast_options_init(&o));
  te_autocast_token t = 99;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_begin", "ctx",
                 te_autocast_begin(AS_CONTEXT(lin_.get()), &o, &t));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_end", "ctx", te_autocast_end(AS_CONTEXT(lin_.get()), 1));
  te_autocast_state st;
  st.struct_size = sizeof st;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_get_state", "ctx",
                 te_autocast_get_state(AS_CONTEXT(recipe_.get()), &st));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_flush_backward", "ctx",
                 te_autocast_flush_backward(AS_CONTEXT(recipe_.get())));
  EXPECT_EQ(t, 99u);
  expect_same_world(before);
}

TEST_F(BadInput, AutocastRejectsOtherHandlesAsRecipeOrGroup) {
  World before = world();
  te_autocast_options o;
  ASSERT_TE_OK(te_autocast_options_init(&o));
  te_autocast_token t = 99;
  o.recipe = AS_RECIPE(lin_.get());
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_begin", "recipe", te_autocast_begin(ctx_, &o, &t));
  o.recipe = nullptr;
  o.group = AS_GROUP(recipe_.get());
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_autocast_begin", "group", te_autocast_begin(ctx_, &o, &t));
  EXPECT_EQ(t, 99u);
  te_recipe_options ro;
  ro.struct_size = sizeof ro;
  te_recipe_options rb = ro;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_recipe_get_options", "r",
                 te_recipe_get_options(AS_RECIPE(group_.get()), &ro));
  EXPECT_EQ(std::memcmp(&ro, &rb, sizeof ro), 0);
  expect_same_world(before);
}

// ---- te_linear_create ---------------------------------------------------------------------------

TEST_F(BadInput, LinearCreate) {
  te_linear_options good;
  ASSERT_TE_OK(te_linear_options_init(&good));
  good.in_features = 32;
  good.out_features = 16;
  struct Case { const char *arg; std::function<void(te_linear_options &)> f; };
  std::vector<Case> cases = {
      {"struct_size", [](te_linear_options &o) { o.struct_size = 0; }},
      {"struct_size", [](te_linear_options &o) { o.struct_size = sizeof o - 1; }},
      {"in_features", [](te_linear_options &o) { o.in_features = 0; }},
      {"in_features", [](te_linear_options &o) { o.in_features = -16; }},
      {"out_features", [](te_linear_options &o) { o.out_features = 0; }},
      {"bias", [](te_linear_options &o) { o.bias = 2; }},
      {"activation_dtype", [](te_linear_options &o) { o.activation_dtype = TE_DTYPE_E4M3; }},
      {"activation_dtype", [](te_linear_options &o) { o.activation_dtype = static_cast<te_dtype>(17); }},
      {"fuse_wgrad_accumulation", [](te_linear_options &o) { o.fuse_wgrad_accumulation = 3; }},
  };
  te_linear *sentinel = reinterpret_cast<te_linear *>(0x5150);
  for (Case &c : cases) {
    te_linear_options o = good;
    c.f(o);
    te_linear *l = sentinel;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_create", c.arg, te_linear_create(&l, ctx_, &o));
    EXPECT_EQ(l, sentinel);
  }
  te_linear *l = sentinel;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_create", "out", te_linear_create(nullptr, ctx_, &good));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_create", "ctx", te_linear_create(&l, nullptr, &good));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_create", "ctx",
                 te_linear_create(&l, AS_CONTEXT(recipe_.get()), &good));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_create", "opts", te_linear_create(&l, ctx_, nullptr));
  EXPECT_EQ(l, sentinel);
  // Shapes that FP8 cannot run are still valid layers (they compute in high precision
  // outside autocast): creation succeeds.
  good.in_features = 24;
  EXPECT_TE_OK(te_linear_create(&l, ctx_, &good));
  te_linear_destroy(l);
  te_linear_destroy(nullptr);
}

// ---- te_linear_forward_compute / te_linear_forward ----------------------------------------

struct FwdCase {
  const char *name;
  te_status status;
  const char *arg;
  std::function<void(te_linear_forward_args &, te_tensor &y)> f;
};

TEST_F(BadInput, LinearForward) {
  HostTensor x_bf16 = random_tensor(TE_DTYPE_BF16, {N, N}, -1, 1, 5);
  HostTensor x_wide = random_tensor(TE_DTYPE_F32, {N, 2 * N}, -1, 1, 6);
  HostTensor w_bad = random_tensor(TE_DTYPE_F32, {N, 2 * N}, -1, 1, 7);
  HostTensor b_bad = random_tensor(TE_DTYPE_F32, {N / 2}, -1, 1, 8);
  HostTensor w_fp8 = make_tensor(TE_DTYPE_E4M3, {N, N});
  HostTensor x_cuda = x_.clone();
  x_cuda.t.device.type = TE_DEVICE_CUDA;
  std::vector<FwdCase> cases = {
      {"args struct_size 0", TE_ERROR_INVALID_ARGUMENT, "struct_size", [](te_linear_forward_args &a, te_tensor &) { a.struct_size = 0; }},
      {"args struct_size small", TE_ERROR_INVALID_ARGUMENT, "struct_size", [](te_linear_forward_args &a, te_tensor &) { a.struct_size = sizeof(size_t); }},
      {"input NULL", TE_ERROR_INVALID_ARGUMENT, "input", [](te_linear_forward_args &a, te_tensor &) { a.input = nullptr; }},
      {"weight NULL", TE_ERROR_INVALID_ARGUMENT, "weight", [](te_linear_forward_args &a, te_tensor &) { a.weight = nullptr; }},
      {"bias NULL with bias", TE_ERROR_INVALID_ARGUMENT, "bias", [](te_linear_forward_args &a, te_tensor &) { a.bias = nullptr; }},
      {"input dtype", TE_ERROR_INVALID_ARGUMENT, "input", [&](te_linear_forward_args &a, te_tensor &) { a.input = x_bf16.get(); }},
      {"input last dim", TE_ERROR_INVALID_ARGUMENT, "input", [&](te_linear_forward_args &a, te_tensor &) { a.input = x_wide.get(); }},
      {"input device", TE_ERROR_INVALID_ARGUMENT, "input", [&](te_linear_forward_args &a, te_tensor &) { a.input = x_cuda.get(); }},
      {"weight shape", TE_ERROR_INVALID_ARGUMENT, "weight", [&](te_linear_forward_args &a, te_tensor &) { a.weight = w_bad.get(); }},
      {"weight dtype", TE_ERROR_INVALID_ARGUMENT, "weight", [&](te_linear_forward_args &a, te_tensor &) { a.weight = w_fp8.get(); }},
      {"bias shape", TE_ERROR_INVALID_ARGUMENT, "bias", [&](te_linear_forward_args &a, te_tensor &) { a.bias = b_bad.get(); }},
      {"weight_unchanged 2", TE_ERROR_INVALID_ARGUMENT, "weight_unchanged", [](te_linear_forward_args &a, te_tensor &) { a.weight_unchanged = 2; }},
      {"y shape", TE_ERROR_INVALID_ARGUMENT, "y", [](te_linear_forward_args &, te_tensor &y) { y.shape[1] = N / 2; }},
      {"y tokens", TE_ERROR_INVALID_ARGUMENT, "y", [](te_linear_forward_args &, te_tensor &y) { y.shape[0] = N / 2; }},
      {"y dtype", TE_ERROR_INVALID_ARGUMENT, "y", [](te_linear_forward_args &, te_tensor &y) { y.dtype = TE_DTYPE_BF16; }},
      {"y ndim", TE_ERROR_INVALID_ARGUMENT, "y", [](te_linear_forward_args &, te_tensor &y) { y.ndim = 0; }},
  };
  for (bool in_scope : {false, true}) {
    te_autocast_token t = in_scope ? begin_enabled() : 0;
    World before = world();
    for (FwdCase &c : cases) {
      SCOPED_TRACE(std::string(c.name) + (in_scope ? " (FP8 scope)" : " (no scope)"));
      te_linear_forward_args a = fwd_args();
      HostTensor y = y_.clone();
      c.f(a, y.t);
      HostTensor y0 = y.clone();
      te_linear_residuals res;
      std::memset(&res, 0x3D, sizeof res);
      res.struct_size = sizeof res;
      te_linear_residuals res0 = res;
      EXPECT_TE_FAIL(c.status, "te_linear_forward_compute", c.arg, te_linear_forward_compute(ctx_, lin_.get(), &a, y.get(), &res));
      EXPECT_TRUE(same_contents(y, y0));
      EXPECT_EQ(std::memcmp(&res, &res0, sizeof res), 0) << "residuals written on failure";
      te_linear_backward_ctx *sentinel = AS_BWD(0x77), *bwd = sentinel;
      EXPECT_TE_FAIL(c.status, "te_linear_forward", c.arg, te_linear_forward(ctx_, lin_.get(), &a, y.get(), &bwd));
      EXPECT_EQ(bwd, sentinel);
      EXPECT_TRUE(same_contents(y, y0));
    }
    expect_same_world(before);
    if (in_scope) {
      EXPECT_TE_OK(te_autocast_end(ctx_, t));
    }
  }
}

TEST_F(BadInput, LinearForwardNullsAndWrongHandles) {
  World before = world();
  te_linear_forward_args a = fwd_args();
  te_linear_residuals res;
  std::memset(&res, 0, sizeof res);
  res.struct_size = sizeof res;
  te_linear_backward_ctx *bwd = nullptr;
  const char *fc = "te_linear_forward_compute", *f = "te_linear_forward";
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fc, "ctx", te_linear_forward_compute(nullptr, lin_.get(), &a, y_.get(), &res));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fc, "lin", te_linear_forward_compute(ctx_, nullptr, &a, y_.get(), &res));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fc, "args", te_linear_forward_compute(ctx_, lin_.get(), nullptr, y_.get(), &res));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fc, "y", te_linear_forward_compute(ctx_, lin_.get(), &a, nullptr, &res));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fc, "residuals", te_linear_forward_compute(ctx_, lin_.get(), &a, y_.get(), nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fc, "lin",
                 te_linear_forward_compute(ctx_, AS_LINEAR(recipe_.get()), &a, y_.get(), &res));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fc, "ctx",
                 te_linear_forward_compute(AS_CONTEXT(lin_.get()), lin_.get(), &a, y_.get(), &res));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "ctx", te_linear_forward(nullptr, lin_.get(), &a, y_.get(), &bwd));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "lin", te_linear_forward(ctx_, nullptr, &a, y_.get(), &bwd));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "lin", te_linear_forward(ctx_, AS_LINEAR(group_.get()), &a, y_.get(), &bwd));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "args", te_linear_forward(ctx_, lin_.get(), nullptr, y_.get(), &bwd));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "y", te_linear_forward(ctx_, lin_.get(), &a, nullptr, &bwd));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "out", te_linear_forward(ctx_, lin_.get(), &a, y_.get(), nullptr));
  EXPECT_EQ(bwd, nullptr);
  // A layer without bias given a bias.
  LinearPtr nobias = make_linear(ctx_, N, N, 0, TE_DTYPE_F32);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fc, "bias", te_linear_forward_compute(ctx_, nobias.get(), &a, y_.get(), &res));
  // A linear used with another context than the one it was created with.
  ContextPtr other = make_cpu_context();
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fc, "lin", te_linear_forward_compute(other.get(), lin_.get(), &a, y_.get(), &res));
  EXPECT_EQ(res.internal, nullptr);
  expect_same_world(before);
}

TEST_F(BadInput, LinearFp8DimsNotMultipleOf16) {
  // Inside an enabled scope: tokens, in or out not a multiple of 16 is UNSUPPORTED (outside a
  // scope the same shapes compute in high precision).
  LinearPtr l24 = make_linear(ctx_, 24, N, 1, TE_DTYPE_F32);   // in 24
  LinearPtr o24 = make_linear(ctx_, N, 24, 1, TE_DTYPE_F32);   // out 24
  HostTensor x8 = random_tensor(TE_DTYPE_F32, {8, N}, -1, 1, 9);  // 8 tokens
  HostTensor x24 = random_tensor(TE_DTYPE_F32, {N, 24}, -1, 1, 10);
  HostTensor w24_in = random_tensor(TE_DTYPE_F32, {N, 24}, -1, 1, 11);
  HostTensor w24_out = random_tensor(TE_DTYPE_F32, {24, N}, -1, 1, 12);
  HostTensor b24 = random_tensor(TE_DTYPE_F32, {24}, -1, 1, 13);
  HostTensor y8 = make_tensor(TE_DTYPE_F32, {8, N}), y_o24 = make_tensor(TE_DTYPE_F32, {N, 24});
  struct Case { te_linear *lin; const te_tensor *x, *w, *b; te_tensor *y; HostTensor *yh; const char *what; };
  std::vector<Case> cases = {
      {lin_.get(), x8.get(), w_.get(), b_.get(), y8.get(), &y8, "tokens 8"},
      {l24.get(), x24.get(), w24_in.get(), b_.get(), y_.get(), &y_, "in 24"},
      {o24.get(), x_.get(), w24_out.get(), b24.get(), y_o24.get(), &y_o24, "out 24"},
  };
  for (Case &c : cases) {
    SCOPED_TRACE(c.what);
    te_linear_forward_args a = fwd_args();
    a.input = c.x;
    a.weight = c.w;
    a.bias = c.b;
    // High precision outside a scope works.
    te_linear_residuals res;
    std::memset(&res, 0, sizeof res);
    res.struct_size = sizeof res;
    EXPECT_TE_OK(te_linear_forward_compute(ctx_, c.lin, &a, c.y, &res));
    te_linear_residuals_release(&res);
    te_autocast_token t = begin_enabled();
    World before = world();
    ScalingSnapshot lin_in = scaling_state(ctx_, c.lin, TE_ROLE_INPUT);
    HostTensor y0 = c.yh->clone();
    std::memset(&res, 0x3D, sizeof res);
    res.struct_size = sizeof res;
    te_linear_residuals res0 = res;
    EXPECT_TE_FAIL(TE_ERROR_UNSUPPORTED, "te_linear_forward_compute", nullptr,
                   te_linear_forward_compute(ctx_, c.lin, &a, c.y, &res));
    EXPECT_TRUE(same_contents(*c.yh, y0));
    EXPECT_EQ(std::memcmp(&res, &res0, sizeof res), 0);
    EXPECT_TRUE(scaling_state(ctx_, c.lin, TE_ROLE_INPUT) == lin_in) << "amax recorded by a failed forward";
    expect_same_world(before);
    EXPECT_TE_OK(te_autocast_end(ctx_, t));
    EXPECT_EQ(scaling_state(ctx_, c.lin, TE_ROLE_INPUT).info.amax_history_len, lin_in.info.amax_history_len);
  }
}

// ---- te_linear_forward_save -----------------------------------------------------------------

TEST_F(BadInput, LinearForwardSave) {
  World before = world();
  te_linear_backward_ctx *sentinel = AS_BWD(0x99), *bwd = sentinel;
  te_linear_residuals never;
  std::memset(&never, 0, sizeof never);
  never.struct_size = sizeof never;
  const char *f = "te_linear_forward_save";
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "residuals", te_linear_forward_save(ctx_, lin_.get(), &never, &bwd));
  EXPECT_EQ(bwd, sentinel);

  te_linear_forward_args a = fwd_args();
  te_linear_residuals res;
  std::memset(&res, 0, sizeof res);
  res.struct_size = sizeof res;
  ASSERT_TE_OK(te_linear_forward_compute(ctx_, lin_.get(), &a, y_.get(), &res));
  te_linear_residuals kept = res;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "ctx", te_linear_forward_save(nullptr, lin_.get(), &res, &bwd));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "lin", te_linear_forward_save(ctx_, nullptr, &res, &bwd));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "lin", te_linear_forward_save(ctx_, AS_LINEAR(recipe_.get()), &res, &bwd));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "residuals", te_linear_forward_save(ctx_, lin_.get(), nullptr, &bwd));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "out", te_linear_forward_save(ctx_, lin_.get(), &res, nullptr));
  EXPECT_EQ(bwd, sentinel);
  EXPECT_EQ(std::memcmp(&res, &kept, sizeof res), 0) << "failed saves must not take the residuals";
  ASSERT_TE_OK(te_linear_forward_save(ctx_, lin_.get(), &res, &bwd));
  BackwardPtr owned(bwd);
  EXPECT_EQ(res.internal, nullptr);
  te_linear_backward_ctx *bwd2 = sentinel;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "residuals", te_linear_forward_save(ctx_, lin_.get(), &res, &bwd2));
  EXPECT_EQ(bwd2, sentinel);
  te_linear_residuals_release(&res);  // idempotent on saved residuals
  te_linear_residuals_release(nullptr);
  expect_same_world(before);
}

// ---- te_linear_backward -----------------------------------------------------------------------

TEST_F(BadInput, LinearBackward) {
  te_linear_forward_args a = fwd_args();
  te_linear_backward_ctx *bwd = nullptr;
  ASSERT_TE_OK(te_linear_forward(ctx_, lin_.get(), &a, y_.get(), &bwd));
  BackwardPtr owned(bwd);
  HostTensor dy = random_tensor(TE_DTYPE_F32, {N, N}, -1, 1, 20);
  HostTensor dx = make_tensor(TE_DTYPE_F32, {N, N}), dw = make_tensor(TE_DTYPE_F32, {N, N}), db = make_tensor(TE_DTYPE_F32, {N});
  HostTensor dy_bad = random_tensor(TE_DTYPE_F32, {N, N / 2}, -1, 1, 21);
  HostTensor dy_bf16 = random_tensor(TE_DTYPE_BF16, {N, N}, -1, 1, 22);
  HostTensor dx_bad = make_tensor(TE_DTYPE_F32, {N, N / 2}), dw_bad = make_tensor(TE_DTYPE_F32, {N / 2, N}),
             db_bad = make_tensor(TE_DTYPE_F32, {N / 2}), dx_bf16 = make_tensor(TE_DTYPE_BF16, {N, N});
  te_linear_backward_args ba;
  ASSERT_TE_OK(te_linear_backward_args_init(&ba));
  te_linear_backward_args ba_bad = ba;
  ba_bad.struct_size = 0;

  World before = world();
  HostTensor dx0 = dx.clone(), dw0 = dw.clone(), db0 = db.clone();
  const char *f = "te_linear_backward";
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "ctx", te_linear_backward(nullptr, bwd, dy.get(), dx.get(), dw.get(), db.get(), &ba));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "bwd", te_linear_backward(ctx_, nullptr, dy.get(), dx.get(), dw.get(), db.get(), &ba));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "bwd",
                 te_linear_backward(ctx_, AS_BWD(lin_.get()), dy.get(), dx.get(), dw.get(), db.get(), &ba));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "dy", te_linear_backward(ctx_, bwd, nullptr, dx.get(), dw.get(), db.get(), &ba));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "dy", te_linear_backward(ctx_, bwd, dy_bad.get(), dx.get(), dw.get(), db.get(), &ba));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "dy", te_linear_backward(ctx_, bwd, dy_bf16.get(), dx.get(), dw.get(), db.get(), &ba));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "dx", te_linear_backward(ctx_, bwd, dy.get(), dx_bad.get(), dw.get(), db.get(), &ba));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "dx", te_linear_backward(ctx_, bwd, dy.get(), dx_bf16.get(), dw.get(), db.get(), &ba));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "dw", te_linear_backward(ctx_, bwd, dy.get(), dx.get(), dw_bad.get(), db.get(), &ba));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "db", te_linear_backward(ctx_, bwd, dy.get(), dx.get(), dw.get(), db_bad.get(), &ba));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "struct_size", te_linear_backward(ctx_, bwd, dy.get(), dx.get(), dw.get(), db.get(), &ba_bad));
  EXPECT_TRUE(same_contents(dx, dx0));
  EXPECT_TRUE(same_contents(dw, dw0));
  EXPECT_TRUE(same_contents(db, db0));
  expect_same_world(before);
  // The context is still usable after all those failures, and TE_BACKWARD_ONCE works once.
  EXPECT_TE_OK(te_linear_backward(ctx_, bwd, dy.get(), dx.get(), dw.get(), db.get(), nullptr));
  ba.flags = TE_BACKWARD_ONCE;
  EXPECT_TE_OK(te_linear_backward(ctx_, bwd, dy.get(), dx.get(), dw.get(), db.get(), &ba));
  HostTensor dx1 = dx.clone();
  EXPECT_TE_FAIL(TE_ERROR_INVALID_STATE, f, nullptr, te_linear_backward(ctx_, bwd, dy.get(), dx.get(), nullptr, nullptr, nullptr));
  EXPECT_TRUE(same_contents(dx, dx1));

  // db given for a layer without bias.
  LinearPtr nobias = make_linear(ctx_, N, N, 0, TE_DTYPE_F32);
  a.bias = nullptr;
  te_linear_backward_ctx *bwd2 = nullptr;
  ASSERT_TE_OK(te_linear_forward(ctx_, nobias.get(), &a, y_.get(), &bwd2));
  BackwardPtr owned2(bwd2);
  HostTensor db2 = db.clone();
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "db", te_linear_backward(ctx_, bwd2, dy.get(), nullptr, nullptr, db.get(), nullptr));
  EXPECT_TRUE(same_contents(db, db2));
}

// ---- scaling state and serialisation --------------------------------------------------------

TEST_F(BadInput, LinearGetScalingState) {
  te_scaling_state_info info;
  std::memset(&info, 0x2B, sizeof info);
  info.struct_size = sizeof info;
  te_scaling_state_info info0 = info;
  std::vector<float> hist(8, -9.0f);
  const char *f = "te_linear_get_scaling_state";
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "ctx", te_linear_get_scaling_state(nullptr, lin_.get(), TE_ROLE_INPUT, &info, hist.data(), 8));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "lin", te_linear_get_scaling_state(ctx_, nullptr, TE_ROLE_INPUT, &info, hist.data(), 8));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "lin",
                 te_linear_get_scaling_state(ctx_, AS_LINEAR(recipe_.get()), TE_ROLE_INPUT, &info, hist.data(), 8));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "role",
                 te_linear_get_scaling_state(ctx_, lin_.get(), static_cast<te_tensor_role>(3), &info, hist.data(), 8));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "info", te_linear_get_scaling_state(ctx_, lin_.get(), TE_ROLE_INPUT, nullptr, hist.data(), 8));
  EXPECT_EQ(std::memcmp(&info, &info0, sizeof info), 0);
  for (float h : hist) EXPECT_EQ(h, -9.0f);
  info.struct_size = 0;
  info0 = info;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "struct_size", te_linear_get_scaling_state(ctx_, lin_.get(), TE_ROLE_INPUT, &info, hist.data(), 8));
  EXPECT_EQ(std::memcmp(&info, &info0, sizeof info), 0);
  for (float h : hist) EXPECT_EQ(h, -9.0f);
}

TEST_F(BadInput, LinearStateSaveLoad) {
  size_t need = 0;
  ASSERT_TE_OK(te_linear_state_save(ctx_, lin_.get(), nullptr, 0, &need));
  ASSERT_GT(need, 0u);
  std::vector<unsigned char> buf(need + 16, 0xEE);
  const char *fs = "te_linear_state_save", *fl = "te_linear_state_load";
  size_t size = 12345;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fs, "ctx", te_linear_state_save(nullptr, lin_.get(), buf.data(), buf.size(), &size));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fs, "lin", te_linear_state_save(ctx_, nullptr, buf.data(), buf.size(), &size));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fs, "lin",
                 te_linear_state_save(ctx_, AS_LINEAR(group_.get()), buf.data(), buf.size(), &size));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fs, "size", te_linear_state_save(ctx_, lin_.get(), buf.data(), buf.size(), nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fs, "capacity", te_linear_state_save(ctx_, lin_.get(), buf.data(), need - 1, &size));
  EXPECT_EQ(size, 12345u);
  for (unsigned char c : buf) ASSERT_EQ(c, 0xEE) << "buffer written by a failed save";

  ASSERT_TE_OK(te_linear_state_save(ctx_, lin_.get(), buf.data(), buf.size(), &size));
  EXPECT_EQ(size, need);

  // A fresh layer to load into: every failure must leave it fresh.
  LinearPtr fresh = make_linear(ctx_, N, N, 1, TE_DTYPE_F32);
  auto fresh_states = [&] {
    return std::vector<ScalingSnapshot>{scaling_state(ctx_, fresh.get(), TE_ROLE_INPUT),
                                        scaling_state(ctx_, fresh.get(), TE_ROLE_WEIGHT),
                                        scaling_state(ctx_, fresh.get(), TE_ROLE_GRAD_OUTPUT)};
  };
  std::vector<ScalingSnapshot> s0 = fresh_states();
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fl, "ctx", te_linear_state_load(nullptr, fresh.get(), buf.data(), size));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fl, "lin", te_linear_state_load(ctx_, nullptr, buf.data(), size));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fl, "lin", te_linear_state_load(ctx_, AS_LINEAR(recipe_.get()), buf.data(), size));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fl, "buf", te_linear_state_load(ctx_, fresh.get(), nullptr, size));
  for (size_t cut : {size_t(0), size_t(1), size / 2, size - 1}) {
    SCOPED_TRACE("truncated to " + std::to_string(cut));
    prime_last_error(fl);
    te_status st = te_linear_state_load(ctx_, fresh.get(), buf.data(), cut);
    EXPECT_EQ(st, TE_ERROR_INVALID_ARGUMENT);
    std::string msg = last_error();
    EXPECT_NE(msg.find(fl), std::string::npos) << msg;
    EXPECT_TRUE(contains_identifier(msg, "buf") || contains_identifier(msg, "size")) << msg;
  }
  // Garbage of the right length (version/magic wrong).
  std::vector<unsigned char> junk(size, 0xFF);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fl, nullptr, te_linear_state_load(ctx_, fresh.get(), junk.data(), size));
  std::vector<ScalingSnapshot> s1 = fresh_states();
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(s0[i] == s1[i]) << "role " << i << " changed by a failed load";

  // A layer of another shape.
  LinearPtr other = make_linear(ctx_, 2 * N, N, 1, TE_DTYPE_F32);
  ScalingSnapshot o0 = scaling_state(ctx_, other.get(), TE_ROLE_INPUT);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fl, nullptr, te_linear_state_load(ctx_, other.get(), buf.data(), size));
  EXPECT_TRUE(scaling_state(ctx_, other.get(), TE_ROLE_INPUT) == o0);

  // And the good load still works after all that.
  ASSERT_TE_OK(te_linear_state_load(ctx_, fresh.get(), buf.data(), size));
  EXPECT_TRUE(scaling_state(ctx_, fresh.get(), TE_ROLE_INPUT) == scaling_state(ctx_, lin_.get(), TE_ROLE_INPUT));
}

// ---- activations ------------------------------------------------------------------------------

TEST_F(BadInput, Activations) {
  HostTensor x = random_tensor(TE_DTYPE_F32, {4, 32}, -1, 1, 30);
  HostTensor y = make_tensor(TE_DTYPE_F32, {4, 32}), y_bf16 = make_tensor(TE_DTYPE_BF16, {4, 32}),
             y_short = make_tensor(TE_DTYPE_F32, {4, 16}), y_3d = make_tensor(TE_DTYPE_F32, {4, 2, 16});
  HostTensor x_odd = random_tensor(TE_DTYPE_F32, {4, 31}, -1, 1, 31), y_odd = make_tensor(TE_DTYPE_F32, {4, 15});
  HostTensor x_fp8 = make_tensor(TE_DTYPE_E4M3, {4, 32});
  x_fp8.scale_inv[0] = 1.0f;
  HostTensor y_fp8 = make_tensor(TE_DTYPE_E4M3, {4, 32});
  HostTensor dy = random_tensor(TE_DTYPE_F32, {4, 32}, -1, 1, 32), dy_half = random_tensor(TE_DTYPE_F32, {4, 16}, -1, 1, 33);
  HostTensor dx = make_tensor(TE_DTYPE_F32, {4, 32}), dx_short = make_tensor(TE_DTYPE_F32, {4, 16});
  std::vector<HostTensor *> outs = {&y, &y_bf16, &y_short, &y_3d, &y_odd, &y_fp8, &dx, &dx_short};
  std::vector<HostTensor> saved;
  for (HostTensor *o : outs) saved.push_back(o->clone());

  const char *ff = "te_activation_forward", *fb = "te_activation_backward";
  const te_activation R = TE_ACTIVATION_RELU, S = TE_ACTIVATION_SWIGLU;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "ctx", te_activation_forward(nullptr, R, x.get(), y.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "ctx", te_activation_forward(AS_CONTEXT(recipe_.get()), R, x.get(), y.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "act", te_activation_forward(ctx_, static_cast<te_activation>(9), x.get(), y.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "x", te_activation_forward(ctx_, R, nullptr, y.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "y", te_activation_forward(ctx_, R, x.get(), nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "y", te_activation_forward(ctx_, R, x.get(), y_bf16.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "y", te_activation_forward(ctx_, R, x.get(), y_short.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "x", te_activation_forward(ctx_, R, x_fp8.get(), y_fp8.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "y", te_activation_forward(ctx_, S, x.get(), y.get()));      // not halved
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "y", te_activation_forward(ctx_, S, x.get(), y_3d.get()));   // rank differs
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "x", te_activation_forward(ctx_, S, x_odd.get(), y_odd.get()));  // odd last dim

  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fb, "ctx", te_activation_backward(nullptr, R, x.get(), dy.get(), dx.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fb, "act", te_activation_backward(ctx_, static_cast<te_activation>(-1), x.get(), dy.get(), dx.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fb, "x", te_activation_backward(ctx_, R, nullptr, dy.get(), dx.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fb, "dy", te_activation_backward(ctx_, R, x.get(), nullptr, dx.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fb, "dx", te_activation_backward(ctx_, R, x.get(), dy.get(), nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fb, "dy", te_activation_backward(ctx_, R, x.get(), dy_half.get(), dx.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fb, "dx", te_activation_backward(ctx_, R, x.get(), dy.get(), dx_short.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fb, "dy", te_activation_backward(ctx_, S, x.get(), dy.get(), dx.get()));  // SwiGLU dy is [4,16]
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fb, "dx", te_activation_backward(ctx_, S, x.get(), dy_half.get(), dx_short.get()));
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(same_contents(*outs[i], saved[i])) << "output " << i << " written";
}

// ---- quantize / cast_transpose / dequantize / amax ------------------------------------------

TEST_F(BadInput, Quantize) {
  HostTensor x = random_tensor(TE_DTYPE_F32, {8, 32}, -1, 1, 40);
  HostTensor out = make_tensor(TE_DTYPE_E4M3, {8, 32});
  HostTensor out_f32 = make_tensor(TE_DTYPE_F32, {8, 32});
  HostTensor out_shape = make_tensor(TE_DTYPE_E4M3, {8, 16});
  HostTensor out_noscale = make_tensor(TE_DTYPE_E4M3, {8, 32});
  out_noscale.t.scale_inv = nullptr;
  HostTensor out_badmode = make_tensor(TE_DTYPE_E4M3, {8, 32});
  out_badmode.t.scaling = static_cast<te_scaling_mode>(5);
  HostTensor x_fp8 = make_tensor(TE_DTYPE_E5M2, {8, 32});
  HostTensor x_cuda = x.clone();
  x_cuda.t.device.type = TE_DEVICE_CUDA;
  float scale = 2.0f, amax = -1.0f;
  te_quantize_options o;
  ASSERT_TE_OK(te_quantize_options_init(&o));
  o.amax = &amax;
  te_quantize_options o_bad = o;
  o_bad.struct_size = 0;
  te_quantize_options o_eps = o;
  o_eps.amax_epsilon = -1.0f;
  te_quantize_options o_scale_block = o;
  o_scale_block.scale = &scale;
  HostTensor out_block = make_tensor(TE_DTYPE_E4M3, {8, 32}, TE_SCALING_BLOCK_1X128);
  std::vector<HostTensor *> outs = {&out, &out_f32, &out_shape, &out_noscale, &out_badmode, &out_block};
  std::vector<HostTensor> saved;
  for (HostTensor *p : outs) saved.push_back(p->clone());

  const char *f = "te_quantize";
  const auto IA = TE_ERROR_INVALID_ARGUMENT;
  EXPECT_TE_FAIL(IA, f, "ctx", te_quantize(nullptr, x.get(), out.get(), &o));
  EXPECT_TE_FAIL(IA, f, "ctx", te_quantize(AS_CONTEXT(lin_.get()), x.get(), out.get(), &o));
  EXPECT_TE_FAIL(IA, f, "x", te_quantize(ctx_, nullptr, out.get(), &o));
  EXPECT_TE_FAIL(IA, f, "out", te_quantize(ctx_, x.get(), nullptr, &o));
  EXPECT_TE_FAIL(IA, f, "out", te_quantize(ctx_, x.get(), out_f32.get(), &o));
  EXPECT_NE(last_error().find("F32"), std::string::npos) << "should say what it got: " << last_error();
  EXPECT_TE_FAIL(IA, f, "out", te_quantize(ctx_, x.get(), out_shape.get(), &o));
  EXPECT_TE_FAIL(IA, f, "out", te_quantize(ctx_, x.get(), out_noscale.get(), &o));
  EXPECT_TE_FAIL(IA, f, "out", te_quantize(ctx_, x.get(), out_badmode.get(), &o));
  EXPECT_TE_FAIL(IA, f, "x", te_quantize(ctx_, x_fp8.get(), out.get(), &o));
  EXPECT_TE_FAIL(IA, f, "x", te_quantize(ctx_, x_cuda.get(), out.get(), &o));
  EXPECT_TE_FAIL(IA, f, "struct_size", te_quantize(ctx_, x.get(), out.get(), &o_bad));
  EXPECT_TE_FAIL(IA, f, "amax_epsilon", te_quantize(ctx_, x.get(), out.get(), &o_eps));
  // A given (per-tensor) scale makes no sense for block scaling.
  EXPECT_TE_FAIL(IA, f, "scale", te_quantize(ctx_, x.get(), out_block.get(), &o_scale_block));
  EXPECT_EQ(amax, -1.0f) << "opts->amax written by a failed call";
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(same_contents(*outs[i], saved[i])) << "output " << i;
}

TEST_F(BadInput, CastTranspose) {
  HostTensor x = random_tensor(TE_DTYPE_F32, {8, 32}, -1, 1, 41);
  HostTensor out = make_tensor(TE_DTYPE_E4M3, {8, 32}), out_t = make_tensor(TE_DTYPE_E4M3, {32, 8});
  HostTensor out_t_bad = make_tensor(TE_DTYPE_E4M3, {8, 32}), out_f32 = make_tensor(TE_DTYPE_F32, {8, 32});
  HostTensor x3 = random_tensor(TE_DTYPE_F32, {2, 4, 32}, -1, 1, 42);
  std::vector<HostTensor *> outs = {&out, &out_t, &out_t_bad, &out_f32};
  std::vector<HostTensor> saved;
  for (HostTensor *p : outs) saved.push_back(p->clone());
  const char *f = "te_cast_transpose";
  const auto IA = TE_ERROR_INVALID_ARGUMENT;
  EXPECT_TE_FAIL(IA, f, "ctx", te_cast_transpose(nullptr, x.get(), out.get(), out_t.get(), nullptr));
  EXPECT_TE_FAIL(IA, f, "x", te_cast_transpose(ctx_, nullptr, out.get(), out_t.get(), nullptr));
  EXPECT_TE_FAIL(IA, f, "out_t", te_cast_transpose(ctx_, x.get(), out.get(), out_t_bad.get(), nullptr));
  EXPECT_TE_FAIL(IA, f, "out", te_cast_transpose(ctx_, x.get(), out_f32.get(), out_t.get(), nullptr));
  EXPECT_TE_FAIL(IA, f, "out", te_cast_transpose(ctx_, x.get(), out_t.get(), out.get(), nullptr));  // swapped shapes
  EXPECT_TE_FAIL(IA, f, "out", te_cast_transpose(ctx_, x.get(), nullptr, nullptr, nullptr));
  HostTensor out_t_e5 = make_tensor(TE_DTYPE_E5M2, {32, 8});
  saved.push_back(out_t_e5.clone());
  outs.push_back(&out_t_e5);
  EXPECT_TE_FAIL(IA, f, "out_t", te_cast_transpose(ctx_, x.get(), out.get(), out_t_e5.get(), nullptr));
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(same_contents(*outs[i], saved[i])) << "output " << i;
}

TEST_F(BadInput, Dequantize) {
  HostTensor q = make_tensor(TE_DTYPE_E4M3, {8, 32}, TE_SCALING_PER_TENSOR, 0x38);  // code 1.0
  q.scale_inv[0] = 0.5f;
  HostTensor q_noscale = q.clone();
  q_noscale.t.scale_inv = nullptr;
  HostTensor hp = random_tensor(TE_DTYPE_F32, {8, 32}, -1, 1, 43);
  HostTensor out = make_tensor(TE_DTYPE_F32, {8, 32}), out_shape = make_tensor(TE_DTYPE_F32, {8, 16}),
             out_fp8 = make_tensor(TE_DTYPE_E5M2, {8, 32});
  std::vector<HostTensor *> outs = {&out, &out_shape, &out_fp8};
  std::vector<HostTensor> saved;
  for (HostTensor *p : outs) saved.push_back(p->clone());
  const char *f = "te_dequantize";
  const auto IA = TE_ERROR_INVALID_ARGUMENT;
  EXPECT_TE_FAIL(IA, f, "ctx", te_dequantize(nullptr, q.get(), out.get()));
  EXPECT_TE_FAIL(IA, f, "x", te_dequantize(ctx_, nullptr, out.get()));
  EXPECT_TE_FAIL(IA, f, "out", te_dequantize(ctx_, q.get(), nullptr));
  EXPECT_TE_FAIL(IA, f, "x", te_dequantize(ctx_, hp.get(), out.get()));
  EXPECT_TE_FAIL(IA, f, "x", te_dequantize(ctx_, q_noscale.get(), out.get()));
  EXPECT_TE_FAIL(IA, f, "out", te_dequantize(ctx_, q.get(), out_shape.get()));
  EXPECT_TE_FAIL(IA, f, "out", te_dequantize(ctx_, q.get(), out_fp8.get()));
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(same_contents(*outs[i], saved[i])) << "output " << i;
  // Sanity: the valid call works and gives 1.0 * 0.5.
  ASSERT_TE_OK(te_dequantize(ctx_, q.get(), out.get()));
  EXPECT_EQ(out.at(0), 0.5);
}

TEST_F(BadInput, Amax) {
  HostTensor x = random_tensor(TE_DTYPE_F32, {8, 32}, -1, 1, 44);
  float a = -5.0f;
  const char *f = "te_amax";
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "ctx", te_amax(nullptr, x.get(), &a));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "ctx", te_amax(AS_CONTEXT(group_.get()), x.get(), &a));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "x", te_amax(ctx_, nullptr, &a));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "amax", te_amax(ctx_, x.get(), nullptr));
  HostTensor bad = x.clone();
  bad.t.ndim = 0;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "x", te_amax(ctx_, bad.get(), &a));
  bad.t.ndim = TE_MAX_DIMS + 1;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "x", te_amax(ctx_, bad.get(), &a));
  bad = x.clone();
  bad.t.data = nullptr;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "x", te_amax(ctx_, bad.get(), &a));
  bad = x.clone();
  bad.t.dtype = static_cast<te_dtype>(12);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, f, "x", te_amax(ctx_, bad.get(), &a));
  EXPECT_EQ(a, -5.0f);
}

// ---- gemm -----------------------------------------------------------------------------------------

TEST_F(BadInput, Gemm) {
  HostTensor a = random_tensor(TE_DTYPE_F32, {16, 32}, -1, 1, 45), b = random_tensor(TE_DTYPE_F32, {32, 48}, -1, 1, 46);
  HostTensor d = make_tensor(TE_DTYPE_F32, {16, 48});
  HostTensor b_k = random_tensor(TE_DTYPE_F32, {24, 48}, -1, 1, 47);     // inner dim mismatch
  HostTensor b_bf16 = random_tensor(TE_DTYPE_BF16, {32, 48}, -1, 1, 48); // mixed high precision
  HostTensor a_1d = random_tensor(TE_DTYPE_F32, {32}, -1, 1, 49);
  HostTensor d_shape = make_tensor(TE_DTYPE_F32, {16, 32}), d_fp8 = make_tensor(TE_DTYPE_E4M3, {16, 48});
  HostTensor bias = random_tensor(TE_DTYPE_F32, {48}, -1, 1, 50), bias_bad = random_tensor(TE_DTYPE_F32, {16}, -1, 1, 51);
  HostTensor gi_bad = make_tensor(TE_DTYPE_F32, {16, 16});
  te_gemm_options o;
  ASSERT_TE_OK(te_gemm_options_init(&o));
  std::vector<HostTensor *> outs = {&d, &d_shape, &d_fp8, &gi_bad};
  std::vector<HostTensor> saved;
  for (HostTensor *p : outs) saved.push_back(p->clone());
  auto with = [&](std::function<void(te_gemm_options &)> f) { te_gemm_options x = o; f(x); return x; };
  te_gemm_options o_size = with([](te_gemm_options &x) { x.struct_size = 0; });
  te_gemm_options o_bias_null = with([](te_gemm_options &x) { x.epilogue = TE_EPILOGUE_BIAS; x.bias = nullptr; });
  te_gemm_options o_bias_bad = with([&](te_gemm_options &x) { x.epilogue = TE_EPILOGUE_BIAS_GELU; x.bias = bias_bad.get(); });
  te_gemm_options o_epi = with([](te_gemm_options &x) { x.epilogue = static_cast<te_epilogue>(9); });
  te_gemm_options o_gi = with([&](te_gemm_options &x) { x.epilogue = TE_EPILOGUE_GELU; x.gelu_input = gi_bad.get(); });
  te_gemm_options o_trans = with([](te_gemm_options &x) { x.transa = 2; });

  const char *f = "te_gemm";
  const auto IA = TE_ERROR_INVALID_ARGUMENT;
  EXPECT_TE_FAIL(IA, f, "ctx", te_gemm(nullptr, a.get(), b.get(), d.get(), &o));
  EXPECT_TE_FAIL(IA, f, "ctx", te_gemm(AS_CONTEXT(recipe_.get()), a.get(), b.get(), d.get(), &o));
  EXPECT_TE_FAIL(IA, f, "a", te_gemm(ctx_, nullptr, b.get(), d.get(), &o));
  EXPECT_TE_FAIL(IA, f, "b", te_gemm(ctx_, a.get(), nullptr, d.get(), &o));
  EXPECT_TE_FAIL(IA, f, "d", te_gemm(ctx_, a.get(), b.get(), nullptr, &o));
  EXPECT_TE_FAIL(IA, f, "b", te_gemm(ctx_, a.get(), b_k.get(), d.get(), &o));
  EXPECT_TE_FAIL(IA, f, "b", te_gemm(ctx_, a.get(), b_bf16.get(), d.get(), &o));
  EXPECT_TE_FAIL(IA, f, "a", te_gemm(ctx_, a_1d.get(), b.get(), d.get(), &o));
  EXPECT_TE_FAIL(IA, f, "d", te_gemm(ctx_, a.get(), b.get(), d_shape.get(), &o));
  EXPECT_TE_FAIL(IA, f, "d", te_gemm(ctx_, a.get(), b.get(), d_fp8.get(), &o));
  EXPECT_TE_FAIL(IA, f, "struct_size", te_gemm(ctx_, a.get(), b.get(), d.get(), &o_size));
  EXPECT_TE_FAIL(IA, f, "bias", te_gemm(ctx_, a.get(), b.get(), d.get(), &o_bias_null));
  EXPECT_TE_FAIL(IA, f, "bias", te_gemm(ctx_, a.get(), b.get(), d.get(), &o_bias_bad));
  EXPECT_TE_FAIL(IA, f, "epilogue", te_gemm(ctx_, a.get(), b.get(), d.get(), &o_epi));
  EXPECT_TE_FAIL(IA, f, "gelu_input", te_gemm(ctx_, a.get(), b.get(), d.get(), &o_gi));
  EXPECT_TE_FAIL(IA, f, "transa", te_gemm(ctx_, a.get(), b.get(), d.get(), &o_trans));
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(same_contents(*outs[i], saved[i])) << "output " << i;
  // The valid call succeeds (so the failures above were about the argument named).
  EXPECT_TE_OK(te_gemm(ctx_, a.get(), b.get(), d.get(), &o));
}

TEST_F(BadInput, GemmFp8NotMultipleOf16IsUnsupported) {
  HostTensor xa = random_tensor(TE_DTYPE_F32, {16, 40}, -1, 1, 52), xb = random_tensor(TE_DTYPE_F32, {16, 40}, -1, 1, 53);
  HostTensor a = make_tensor(TE_DTYPE_E4M3, {16, 40}), b = make_tensor(TE_DTYPE_E4M3, {16, 40});
  ASSERT_TE_OK(te_quantize(ctx_, xa.get(), a.get(), nullptr));
  ASSERT_TE_OK(te_quantize(ctx_, xb.get(), b.get(), nullptr));
  HostTensor d = make_tensor(TE_DTYPE_F32, {16, 16}), d0 = d.clone();
  te_gemm_options o;
  ASSERT_TE_OK(te_gemm_options_init(&o));
  o.transb = 1;
  EXPECT_TE_FAIL(TE_ERROR_UNSUPPORTED, "te_gemm", nullptr, te_gemm(ctx_, a.get(), b.get(), d.get(), &o));
  EXPECT_TRUE(same_contents(d, d0));
}

}  // namespace
