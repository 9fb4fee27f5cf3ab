// Regression tests for the classes of misuse the adversarial review found (issue "Hardening"):
// one test group per class, each written as the misuse a user would commit. Under the asan
// preset a use-after-free or overflow here is a test failure.
#include <cfloat>
#include <climits>
#include <cstdint>
#include <fstream>

#include "api_test_util.h"
#include "dlpack_abi.h"
#include "linear_test_util.h"

namespace lt = te_test;

namespace {

constexpr int64_t kN = 16;  // tokens, in and out features: FP8's multiples of 16

struct Layer {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kN, kN);
  lt::HostTensor x = lt::random_tensor(TE_DTYPE_F32, {kN, kN}, -2.0f, 2.0f, 1);
  lt::HostTensor w = lt::random_tensor(TE_DTYPE_F32, {kN, kN}, -0.5f, 0.5f, 2);
  lt::HostTensor b = lt::random_tensor(TE_DTYPE_F32, {kN}, -1.0f, 1.0f, 3);
  lt::HostTensor y = lt::make_tensor(TE_DTYPE_F32, {kN, kN});
  lt::HostTensor dy = lt::random_tensor(TE_DTYPE_F32, {kN, kN}, -1.0f, 1.0f, 4);
  lt::HostTensor dx = lt::make_tensor(TE_DTYPE_F32, {kN, kN});
  lt::HostTensor dw = lt::make_tensor(TE_DTYPE_F32, {kN, kN});
  lt::HostTensor db = lt::make_tensor(TE_DTYPE_F32, {kN});

  te_linear_forward_args args() {
    te_linear_forward_args a;
    EXPECT_TE_OK(te_linear_forward_args_init(&a));
    a.input = x.get();
    a.weight = w.get();
    a.bias = b.get();
    return a;
  }
  te_linear_backward_ctx *forward() {
    te_linear_forward_args a = args();
    te_linear_backward_ctx *bwd = nullptr;
    EXPECT_TE_OK(te_linear_forward(ctx.get(), lin.get(), &a, y.get(), &bwd));
    return bwd;
  }
  te_status backward(te_linear_backward_ctx *bwd) {
    return te_linear_backward(ctx.get(), bwd, dy.get(), dx.get(), dw.get(), db.get(), nullptr);
  }
};

te_autocast_options scope_options(const te_recipe *r, const te_group *g) {
  te_autocast_options o;
  EXPECT_TE_OK(te_autocast_options_init(&o));
  o.recipe = r;
  o.group = g;
  return o;
}

}  // namespace

// ---- 1. whatever a pending backward or bucket needs is kept alive by it --------------------

TEST(HardeningLifetime, GroupDestroyedAfterScopeEndsBeforeBackward) {
  Layer L;
  te_group *g = nullptr;
  ASSERT_TE_OK(te_group_create_single(&g));
  lt::RecipePtr r = lt::make_recipe();
  te_autocast_options o = scope_options(r.get(), g);
  te_autocast_token tok = 0;
  ASSERT_TE_OK(te_autocast_begin(L.ctx.get(), &o, &tok));
  lt::BackwardPtr bwd(L.forward());
  ASSERT_TE_OK(te_autocast_end(L.ctx.get(), tok));
  te_group_destroy(g);
  // A new group may take the old one's memory; it must not be taken for the old one.
  te_group *g2 = nullptr;
  ASSERT_TE_OK(te_group_create_single(&g2));
  EXPECT_NE(te_group_id(g2), 0u);
  EXPECT_EQ(te_group_id(g), 0u) << "a destroyed group's handle must not resolve";
  EXPECT_TE_OK(L.backward(bwd.get()));
  EXPECT_TE_OK(te_autocast_flush_backward(L.ctx.get()));
  te_group_destroy(g2);
}

TEST(HardeningLifetime, GroupAndRecipeDroppedWhileTheirScopeIsOpen) {
  Layer L;
  te_group *g = nullptr;
  ASSERT_TE_OK(te_group_create_single(&g));
  te_recipe *r = nullptr;
  ASSERT_TE_OK(te_recipe_create(&r, nullptr));
  te_autocast_options o = scope_options(r, g);
  te_autocast_token tok = 0;
  ASSERT_TE_OK(te_autocast_begin(L.ctx.get(), &o, &tok));
  te_group_destroy(g);
  te_recipe_release(r);
  lt::BackwardPtr bwd(L.forward());
  EXPECT_TE_OK(te_autocast_end(L.ctx.get(), tok));
  EXPECT_TE_OK(L.backward(bwd.get()));
}

TEST(HardeningLifetime, ContextDestroyedBeforeItsLayerAndBackward) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  te_context *c = ctx.release();
  lt::LinearPtr lin = lt::make_linear(c, kN, kN);
  lt::HostTensor x = lt::random_tensor(TE_DTYPE_F32, {kN, kN}, -1.0f, 1.0f, 5);
  lt::HostTensor w = lt::random_tensor(TE_DTYPE_F32, {kN, kN}, -1.0f, 1.0f, 6);
  lt::HostTensor b = lt::random_tensor(TE_DTYPE_F32, {kN}, -1.0f, 1.0f, 7);
  lt::HostTensor y = lt::make_tensor(TE_DTYPE_F32, {kN, kN});
  te_linear_forward_args a;
  ASSERT_TE_OK(te_linear_forward_args_init(&a));
  a.input = x.get();
  a.weight = w.get();
  a.bias = b.get();
  te_linear_backward_ctx *bwd = nullptr;
  ASSERT_TE_OK(te_linear_forward(c, lin.get(), &a, y.get(), &bwd));
  te_linear_residuals res;
  std::memset(&res, 0, sizeof res);
  res.struct_size = sizeof res;
  ASSERT_TE_OK(te_linear_forward_compute(c, lin.get(), &a, y.get(), &res));
  te_context_destroy(c);
  // The context's handle is dead: nothing can name it ...
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_forward", "ctx",
                 te_linear_forward(c, lin.get(), &a, y.get(), &bwd));
  EXPECT_NE(lt::last_error().find("destroyed"), std::string::npos) << lt::last_error();
  // ... but what was made with it can still be let go of, in any order (ASan checks the rest).
  te_linear_residuals_release(&res);
  te_linear_backward_ctx_destroy(bwd);
  lin.reset();
}

// ---- 2. stale handles stay dead; tokens are unique across contexts -------------------------

TEST(HardeningHandles, DestroyedBackwardContextStaysDeadWhenItsObjectIsReused) {
  Layer L;
  te_linear_backward_ctx *old = L.forward();
  te_linear_backward_ctx_destroy(old);
  lt::BackwardPtr fresh(L.forward());  // the pool hands the same object out again
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_backward", "bwd", L.backward(old));
  EXPECT_NE(lt::last_error().find("destroyed"), std::string::npos) << lt::last_error();
  te_linear_backward_ctx_destroy(old);  // a no-op: it must not free `fresh`
  EXPECT_TE_OK(L.backward(fresh.get()));
}

TEST(HardeningHandles, DestroyedLinearAndRecipeStayDead) {
  Layer L;
  te_linear *old = lt::make_linear(L.ctx.get(), kN, kN).release();
  te_linear_destroy(old);
  lt::LinearPtr again = lt::make_linear(L.ctx.get(), kN, kN);
  te_linear_forward_args a = L.args();
  te_linear_backward_ctx *bwd = nullptr;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_forward", "lin",
                 te_linear_forward(L.ctx.get(), old, &a, L.y.get(), &bwd));
  te_linear_destroy(old);  // twice: a no-op

  te_recipe *r = nullptr;
  ASSERT_TE_OK(te_recipe_create(&r, nullptr));
  te_recipe_release(r);
  lt::RecipePtr r2 = lt::make_recipe();
  EXPECT_EQ(te_recipe_key(r), 0u);
  EXPECT_STREQ(te_recipe_describe(r), "");
  EXPECT_EQ(te_recipe_retain(r), nullptr);
  te_recipe_release(r);  // must not drop r2's reference
  EXPECT_NE(te_recipe_key(r2.get()), 0u);
}

TEST(HardeningHandles, WrongTypeAndForeignValuesAreToldApart) {
  Layer L;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_backward", "bwd",
                 L.backward(reinterpret_cast<te_linear_backward_ctx *>(L.lin.get())));
  EXPECT_NE(lt::last_error().find("got a te_linear"), std::string::npos) << lt::last_error();
  std::vector<uint64_t> zeros(8, 0);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_backward", "bwd",
                 L.backward(reinterpret_cast<te_linear_backward_ctx *>(zeros.data())));
  EXPECT_NE(lt::last_error().find("not a libte handle"), std::string::npos) << lt::last_error();
  // Destroy functions given values of the wrong type do nothing.
  te_context_destroy(reinterpret_cast<te_context *>(L.lin.get()));
  te_linear_destroy(reinterpret_cast<te_linear *>(zeros.data()));
  EXPECT_TE_OK(L.backward(lt::BackwardPtr(L.forward()).get()));
}

TEST(HardeningHandles, TokenOfOneContextDoesNotCloseAnothersScope) {
  lt::ContextPtr a = lt::make_cpu_context(), b = lt::make_cpu_context();
  te_autocast_options o = scope_options(nullptr, nullptr);
  te_autocast_token ta = 0, tb = 0;
  ASSERT_TE_OK(te_autocast_begin(a.get(), &o, &ta));
  ASSERT_TE_OK(te_autocast_begin(b.get(), &o, &tb));
  EXPECT_NE(ta, tb);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_STATE, "te_autocast_end", "token", te_autocast_end(a.get(), tb));
  EXPECT_EQ(lt::autocast_state(a.get()).depth, 1);
  EXPECT_TE_OK(te_autocast_end(a.get(), ta));
  EXPECT_TE_OK(te_autocast_end(b.get(), tb));
}

// ---- 3. residuals are owned through a handle, not by whoever holds a copy -----------------

TEST(HardeningResiduals, CopiesCannotSaveOrFreeTwice) {
  Layer L;
  te_linear_forward_args a = L.args();
  te_linear_residuals res;
  std::memset(&res, 0, sizeof res);
  res.struct_size = sizeof res;
  ASSERT_TE_OK(te_linear_forward_compute(L.ctx.get(), L.lin.get(), &a, L.y.get(), &res));
  te_linear_residuals copy = res;
  te_linear_backward_ctx *bwd = nullptr;
  ASSERT_TE_OK(te_linear_forward_save(L.ctx.get(), L.lin.get(), &res, &bwd));
  lt::BackwardPtr owner(bwd);
  te_linear_backward_ctx *second = nullptr;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_forward_save", "residuals",
                 te_linear_forward_save(L.ctx.get(), L.lin.get(), &copy, &second));
  EXPECT_EQ(second, nullptr);
  te_linear_residuals_release(&copy);  // must not free what the backward context owns
  EXPECT_TE_OK(L.backward(owner.get()));
  EXPECT_TE_OK(L.backward(owner.get()));
}

TEST(HardeningResiduals, ReleasedResidualsCannotBeSavedThroughACopy) {
  Layer L;
  te_linear_forward_args a = L.args();
  te_linear_residuals res;
  std::memset(&res, 0, sizeof res);
  res.struct_size = sizeof res;
  ASSERT_TE_OK(te_linear_forward_compute(L.ctx.get(), L.lin.get(), &a, L.y.get(), &res));
  te_linear_residuals copy = res;
  te_linear_residuals_release(&res);
  te_linear_residuals_release(&res);  // idempotent
  // A new forward may reuse the pooled residuals object: the copy must still name nothing.
  te_linear_residuals res2;
  std::memset(&res2, 0, sizeof res2);
  res2.struct_size = sizeof res2;
  ASSERT_TE_OK(te_linear_forward_compute(L.ctx.get(), L.lin.get(), &a, L.y.get(), &res2));
  te_linear_backward_ctx *bwd = nullptr;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_forward_save", "residuals",
                 te_linear_forward_save(L.ctx.get(), L.lin.get(), &copy, &bwd));
  te_linear_residuals_release(&copy);
  ASSERT_TE_OK(te_linear_forward_save(L.ctx.get(), L.lin.get(), &res2, &bwd));
  lt::BackwardPtr owner(bwd);
  EXPECT_TE_OK(L.backward(owner.get()));
}

// ---- 4. sizes: every shape checked once, no arithmetic that can wrap ----------------------

TEST(HardeningSizes, ShapesWhoseElementCountOverflowsAreRefused) {
  Layer L;
  lt::HostTensor big = lt::make_tensor(TE_DTYPE_F32, {4, 4});
  big.t.ndim = 2;
  big.t.shape[0] = int64_t{1} << 40;
  big.t.shape[1] = int64_t{1} << 40;
  EXPECT_EQ(te_tensor_numel(big.get()), 0);
  big.t.shape[1] = int64_t{1} << 20;  // 2^60: the largest count allowed
  EXPECT_EQ(te_tensor_numel(big.get()), int64_t{1} << 60);
  big.t.shape[1] = (int64_t{1} << 20) + 1;
  EXPECT_EQ(te_tensor_numel(big.get()), 0);

  lt::HostTensor q = lt::make_tensor(TE_DTYPE_E4M3, {4, 4});
  q.t.shape[0] = INT64_MAX;
  q.t.shape[1] = 3;
  int64_t count = -7;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_tensor_scale_inv_count", "t", te_tensor_scale_inv_count(&count, q.get()));
  EXPECT_EQ(count, -7);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_quantize", "x", te_quantize(L.ctx.get(), big.get(), q.get(), nullptr));
  float amax = -1.0f;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_amax", "x", te_amax(L.ctx.get(), big.get(), &amax));
  EXPECT_EQ(amax, -1.0f);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_activation_forward", "x",
                 te_activation_forward(L.ctx.get(), TE_ACTIVATION_GELU, big.get(), big.get()));
  te_linear_forward_args a = L.args();
  a.input = big.get();
  te_linear_backward_ctx *bwd = nullptr;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_forward", "args->input",
                 te_linear_forward(L.ctx.get(), L.lin.get(), &a, L.y.get(), &bwd));
  EXPECT_EQ(bwd, nullptr);
}

TEST(HardeningSizes, MallocOfImpossibleSizesFailsCleanly) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  void *p = reinterpret_cast<void *>(0x1);
  for (size_t bytes : {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 63, static_cast<size_t>(PTRDIFF_MAX) + 1}) {
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_context_malloc", "bytes", te_context_malloc(ctx.get(), bytes, &p));
    EXPECT_EQ(p, reinterpret_cast<void *>(0x1));
  }
  EXPECT_EQ(te_context_malloc(ctx.get(), static_cast<size_t>(PTRDIFF_MAX), &p), TE_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(p, reinterpret_cast<void *>(0x1));
  ASSERT_TE_OK(te_context_malloc(ctx.get(), 100, &p));
  char host[100] = {1};
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_context_copy", "bytes",
                 te_context_copy(ctx.get(), p, host, SIZE_MAX, TE_COPY_HOST_TO_DEVICE));
  EXPECT_TE_OK(te_context_free(ctx.get(), p));
}

// ---- 5. the state deserializer accepts what state_save can produce, nothing else -----------

namespace {

// Byte offsets in a saved state (core/modules/linear/state_io.cpp): header, then per state len, dtype, scale,
// scale_inv, history.
constexpr size_t kHeader = 4 + 4 + 8 + 8;

struct UsedLayer : Layer {
  lt::RecipePtr recipe = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 4);
  UsedLayer() {
    for (int step = 0; step < 3; ++step) {
      lt::AutocastScope s(ctx.get(), recipe.get());
      lt::BackwardPtr bwd(forward());
      s.end();
      EXPECT_TE_OK(backward(bwd.get()));
    }
  }
  std::vector<unsigned char> save() { return lt::saved_state(ctx.get(), lin.get()); }
  te_status load(const std::vector<unsigned char> &buf) {
    return te_linear_state_load(ctx.get(), lin.get(), buf.data(), buf.size());
  }
};

void put_float(std::vector<unsigned char> &buf, size_t at, float v) { std::memcpy(&buf[at], &v, sizeof v); }

}  // namespace

TEST(HardeningStateLoad, RefusesScalesNoUpdateCanProduce) {
  UsedLayer L;
  const std::vector<unsigned char> good = L.save();
  const size_t scale_at = kHeader + 8, inv_at = scale_at + 4;
  struct Case { const char *what; float scale, scale_inv; };
  const Case cases[] = {{"NaN scale", NAN, NAN},        {"inf scale", INFINITY, 0.0f},
                        {"zero scale", 0.0f, INFINITY}, {"negative scale", -2.0f, -0.5f},
                        {"subnormal scale", 1e-40f, 1.0f / 1e-40f},
                        {"scale below 2^-63", 0x1p-64f, 0x1p64f},
                        {"scale_inv not 1/scale", 2.0f, 0.4f}};
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<unsigned char> bad = good;
    put_float(bad, scale_at, c.scale);
    put_float(bad, inv_at, c.scale_inv);
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_state_load", "buf", L.load(bad));
    EXPECT_EQ(L.save(), good) << "a refused load must change nothing";
  }
  for (float h : {NAN, -1.0f, -0.0f, -INFINITY}) {
    SCOPED_TRACE(h);
    std::vector<unsigned char> bad = good;
    put_float(bad, inv_at + 4 + 4, h);  // history[1] of the input state
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_state_load", "buf", L.load(bad));
  }
  std::vector<unsigned char> inf_amax = good;
  put_float(inf_amax, inv_at + 4 + 4, INFINITY);  // an amax of +inf is what a tensor with inf gives
  EXPECT_TE_OK(L.load(inf_amax));
  EXPECT_EQ(L.save(), inf_amax);
}

TEST(HardeningStateLoad, NeverUsedStateRoundTripsAndCannotReplaceAStateInUse) {
  Layer fresh;
  const std::vector<unsigned char> never_used = lt::saved_state(fresh.ctx.get(), fresh.lin.get());
  EXPECT_EQ(never_used.size(), kHeader + 3 * 16);
  ASSERT_TE_OK(te_linear_state_load(fresh.ctx.get(), fresh.lin.get(), never_used.data(), never_used.size()));
  EXPECT_EQ(lt::saved_state(fresh.ctx.get(), fresh.lin.get()), never_used);
  std::vector<unsigned char> odd = never_used;
  put_float(odd, kHeader + 8, 3.0f);  // a never-used state has scale 1
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_linear_state_load", "buf",
                 te_linear_state_load(fresh.ctx.get(), fresh.lin.get(), odd.data(), odd.size()));

  // In use by an open scope: refused, and the scope's end then works.
  UsedLayer L;
  const std::vector<unsigned char> before = L.save();
  {
    lt::AutocastScope s(L.ctx.get(), L.recipe.get());
    lt::BackwardPtr bwd(L.forward());
    EXPECT_TE_FAIL(TE_ERROR_INVALID_STATE, "te_linear_state_load", "lin", L.load(never_used));
    s.end();
    // In use by the pending backward pass: refused too, until the backward updates it.
    EXPECT_TE_OK(L.backward(bwd.get()));
  }
  EXPECT_TE_OK(te_autocast_flush_backward(L.ctx.get()));
  EXPECT_TE_OK(L.load(never_used));
  EXPECT_TE_OK(L.load(before));
  EXPECT_EQ(L.save(), before);
}

TEST(HardeningStateLoad, NaNAmaxIsSavedAsZeroAndResumesIdentically) {
  UsedLayer L;
  L.x.set(3, NAN);
  {
    lt::AutocastScope s(L.ctx.get(), L.recipe.get());
    lt::BackwardPtr bwd(L.forward());
  }
  const std::vector<unsigned char> saved = L.save();
  UsedLayer M;
  ASSERT_TE_OK(M.load(saved));
  EXPECT_EQ(M.save(), saved);
  // Both continue with the same finite input and end in the same state.
  L.x = lt::random_tensor(TE_DTYPE_F32, {kN, kN}, -2.0f, 2.0f, 9);
  M.x = L.x;
  for (UsedLayer *u : {&L, &M}) {
    lt::AutocastScope s(u->ctx.get(), u->recipe.get());
    lt::BackwardPtr bwd(u->forward());
  }
  EXPECT_EQ(L.save(), M.save());
  EXPECT_TRUE(lt::bitwise_equal(L.y, M.y));
}

TEST(HardeningStateLoad, HugeMarginKeepsScalesFinite) {
  Layer L;
  te_recipe_options o = lt::recipe_defaults();
  o.margin = 127;
  o.amax_history_len = 1;
  lt::RecipePtr r = lt::make_recipe(o);
  L.x = lt::random_tensor(TE_DTYPE_F32, {kN, kN}, -1e38f, 1e38f, 11);
  for (int step = 0; step < 2; ++step) {
    lt::AutocastScope s(L.ctx.get(), r.get());
    lt::BackwardPtr bwd(L.forward());
  }
  const lt::ScalingSnapshot st = lt::live_scaling_state(L.ctx.get(), L.lin.get(), TE_ROLE_INPUT);
  EXPECT_EQ(st.info.scale, 0x1p-63f);  // kMinScale: two scale_inv multiply to a finite 2^126
  EXPECT_TRUE(std::isfinite(st.info.scale_inv));
  // And the state saves and loads (the loader's range is the update's).
  const std::vector<unsigned char> buf = lt::saved_state(L.ctx.get(), L.lin.get());
  EXPECT_TE_OK(te_linear_state_load(L.ctx.get(), L.lin.get(), buf.data(), buf.size()));
  // With scales at the floor, ordinary inputs quantize to zero codes: outputs are finite (the two
  // scale_inv multiply to 2^126, not inf, so no 0 * inf).
  L.x = lt::random_tensor(TE_DTYPE_F32, {kN, kN}, -2.0f, 2.0f, 12);
  {
    lt::AutocastScope s(L.ctx.get(), r.get());
    lt::BackwardPtr bwd(L.forward());
    s.end();
    EXPECT_TE_OK(L.backward(bwd.get()));
  }
  for (const lt::HostTensor *t : {&L.y, &L.dx, &L.dw})
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_TRUE(std::isfinite(t->at(i))) << i;
}

// ---- 6. DLPack import checks every field it reads ------------------------------------------

using namespace dlpack;

TEST(HardeningDlpack, RefusesWhatItCannotRepresent) {
  float data[8] = {};
  int64_t shape[1] = {8};
  DLManagedTensorVersioned v{};
  v.version.major = 1;
  v.dl_tensor = DLTensor{data, {1, 0}, 1, {2, 32, 1}, shape, nullptr, 0};
  te_tensor out;
  std::memset(&out, 0x5A, sizeof out);
  const te_tensor sentinel = out;
  ASSERT_TE_OK(te_tensor_from_dlpack(&out, &v, 1, TE_DTYPE_E4M3));
  out = sentinel;
  auto refused = [&](te_status want, const char *arg, DLManagedTensorVersioned m, int versioned = 1) {
    EXPECT_TE_FAIL(want, "te_tensor_from_dlpack", arg, te_tensor_from_dlpack(&out, &m, versioned, TE_DTYPE_E4M3));
    EXPECT_EQ(std::memcmp(&out, &sentinel, sizeof out), 0);
  };
  DLManagedTensorVersioned m = v;
  m.dl_tensor.shape = nullptr;
  refused(TE_ERROR_INVALID_ARGUMENT, "dl_managed_tensor", m);
  m = v;
  m.version.major = 99;
  refused(TE_ERROR_UNSUPPORTED, "dl_managed_tensor", m);
  m = v;
  m.flags = kFlagReadOnly;
  refused(TE_ERROR_INVALID_ARGUMENT, "dl_managed_tensor", m);
  m = v;
  m.dl_tensor.byte_offset = UINT64_MAX - 3;
  refused(TE_ERROR_INVALID_ARGUMENT, "dl_managed_tensor", m);
  m = v;
  m.dl_tensor.device = {2, -1};
  refused(TE_ERROR_INVALID_ARGUMENT, "dl_managed_tensor", m);
  int64_t huge[2] = {int64_t{1} << 40, int64_t{1} << 40};
  m = v;
  m.dl_tensor.ndim = 2;
  m.dl_tensor.shape = huge;
  refused(TE_ERROR_INVALID_ARGUMENT, "dl_managed_tensor", m);
  refused(TE_ERROR_INVALID_ARGUMENT, "versioned", v, 2);
  refused(TE_ERROR_INVALID_ARGUMENT, "versioned", v, -1);
}

// ---- 7. nothing grows with the number of distinct recipes ever created ---------------------

namespace {
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kUnderAsan = true;
#else
constexpr bool kUnderAsan = false;
#endif
#else
constexpr bool kUnderAsan = false;
#endif

long resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}
}  // namespace

TEST(HardeningRecipes, DistinctRecipesLeaveNothingBehind) {
  te_recipe_options o = lt::recipe_defaults();
  // Warm up allocator caches, then create and release 300,000 distinct recipes.
  auto churn = [&](int n, int offset) {
    for (int i = 0; i < n; ++i) {
      o.amax_history_len = 1 + (i + offset) % 65536;
      o.margin = ((i + offset) / 65536) % 128;
      te_recipe *r = nullptr;
      ASSERT_TE_OK(te_recipe_create(&r, &o));
      te_recipe_release(r);
    }
  };
  churn(1000, 0);
  const long before = resident_kib();
  churn(300000, 1000);
  const long after = resident_kib();
  // (ASan's quarantine holds freed memory for a while, so resident size says nothing there.)
  if (before > 0 && after > 0 && !kUnderAsan) EXPECT_LT(after - before, 4096) << "resident memory grew by " << (after - before) << " KiB";
  // Keys stay collision-free and reproducible across creations.
  o.amax_history_len = 77;
  o.margin = 5;
  lt::RecipePtr a = lt::make_recipe(o), b = lt::make_recipe(o);
  o.margin = 6;
  lt::RecipePtr c = lt::make_recipe(o);
  EXPECT_EQ(te_recipe_key(a.get()), te_recipe_key(b.get()));
  EXPECT_NE(te_recipe_key(a.get()), te_recipe_key(c.get()));
}
