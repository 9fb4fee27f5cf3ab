// Bad input to every te_linear_* function: the status, the message
// ("<te_function>: argument '<arg>': <expected vs got>"), and the strong guarantee — outputs
// untouched (prefilled sentinels compared byte for byte) and the layer's scaling states
// unchanged (serialized state compared before/after, including across the enclosing scope's
// end, so a failed call must not have put the layer into the scope's bucket either).
#include "linear_test_util.h"

#include <functional>

namespace lt = te_test;

namespace {

constexpr int64_t kT = 32, kIn = 32, kOut = 16;
constexpr te_dtype kAct = TE_DTYPE_BF16;

te_linear *as_linear(te_recipe *r) { return reinterpret_cast<te_linear *>(r); }

// Stores an out-of-range value into an enum field the way a C caller could, without forming
// an out-of-range enum value in C++ (which would be undefined behaviour in the test itself).
template <class E>
void poke_enum(E *field, int32_t v) {
  static_assert(sizeof(E) == sizeof(int32_t), "enums are int-sized on the platforms libte targets");
  std::memcpy(field, &v, sizeof v);
}

class LinearBadInput : public ::testing::Test {
 protected:
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::LinearPtr lin = lt::make_linear(ctx.get(), kIn, kOut, 1, kAct);
  lt::LinearPtr nobias = lt::make_linear(ctx.get(), kIn, kOut, 0, kAct);
  lt::RecipePtr recipe = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 16);
  lt::HostTensor x = lt::random_tensor(kAct, {kT, kIn}, -1.0f, 1.0f, 1);
  lt::HostTensor w = lt::random_tensor(kAct, {kOut, kIn}, -1.0f, 1.0f, 2);
  lt::HostTensor b = lt::random_tensor(kAct, {kOut}, -1.0f, 1.0f, 3);
  lt::HostTensor dy = lt::random_tensor(kAct, {kT, kOut}, -0.1f, 0.1f, 4);

  te_linear_forward_args args(bool with_bias = true) {
    te_linear_forward_args fa;
    te_linear_forward_args_init(&fa);
    fa.input = x.get();
    fa.weight = w.get();
    fa.bias = with_bias ? b.get() : nullptr;
    return fa;
  }

  // Runs a forward expected to fail, through forward_compute and through te_linear_forward,
  // inside an FP8 scope (and, when `also_high_precision`, outside any scope), checking the
  // status, the message, untouched outputs and unchanged state.
  void expect_forward_fails(te_linear *l, const te_linear_forward_args *fa, te_tensor *y,
                            te_status want, const char *arg, bool also_high_precision = true,
                            te_context *c = nullptr, bool null_residuals = false) {
    if (!c) c = ctx.get();
    te_linear *state_of = l;
    if (state_of == nullptr || state_of == as_linear(recipe.get())) state_of = lin.get();
    for (int fp8 = also_high_precision ? 0 : 1; fp8 < 2; ++fp8) {
      SCOPED_TRACE(fp8 ? "inside an FP8 scope" : "outside any scope");
      const std::vector<unsigned char> state_before = lt::saved_state(ctx.get(), state_of);
      std::vector<unsigned char> y_before;
      if (y) y_before.assign(static_cast<unsigned char *>(y->data),
                             static_cast<unsigned char *>(y->data) + te_tensor_numel(y) * lt::dtype_size(y->dtype));
      {
        std::unique_ptr<lt::AutocastScope> scope;
        if (fp8) scope.reset(new lt::AutocastScope(ctx.get(), recipe.get()));
        te_linear_residuals res;
        std::memset(&res, 0x3C, sizeof res);
        res.struct_size = sizeof res;
        te_linear_residuals res_before = res;
        EXPECT_TRUE(lt::IsError(te_linear_forward_compute(c, l, fa, y, null_residuals ? nullptr : &res), want,
                                "te_linear_forward_compute", arg));
        EXPECT_EQ(0, std::memcmp(&res, &res_before, sizeof res)) << "residuals written on failure";
        if (!null_residuals) {
          te_linear_backward_ctx *sentinel = reinterpret_cast<te_linear_backward_ctx *>(0x5678);
          te_linear_backward_ctx *out = sentinel;
          EXPECT_TRUE(lt::IsError(te_linear_forward(c, l, fa, y, &out), want, "te_linear_forward", arg));
          EXPECT_EQ(out, sentinel) << "out written on failure";
        }
        if (y) {
          EXPECT_EQ(0, std::memcmp(y->data, y_before.data(), y_before.size())) << "y written on failure";
        }
        EXPECT_EQ(lt::saved_state(ctx.get(), state_of), state_before) << "state changed inside the scope";
      }
      EXPECT_EQ(lt::saved_state(ctx.get(), state_of), state_before) << "state changed at the scope end";
    }
  }
};

TEST_F(LinearBadInput, InitFunctionsRejectNull) {
  EXPECT_TRUE(lt::IsError(te_linear_options_init(nullptr), TE_ERROR_INVALID_ARGUMENT, "te_linear_options_init", "opts"));
  EXPECT_TRUE(lt::IsError(te_linear_forward_args_init(nullptr), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_forward_args_init", "args"));
  EXPECT_TRUE(lt::IsError(te_linear_backward_args_init(nullptr), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_backward_args_init", "args"));
  te_linear_options o;
  ASSERT_EQ(te_linear_options_init(&o), TE_SUCCESS);
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.bias, 1);
  EXPECT_EQ(o.activation_dtype, TE_DTYPE_BF16);
  EXPECT_EQ(o.fuse_wgrad_accumulation, 0);
  te_linear_forward_args fa;
  ASSERT_EQ(te_linear_forward_args_init(&fa), TE_SUCCESS);
  EXPECT_EQ(fa.struct_size, sizeof fa);
  EXPECT_EQ(fa.weight_unchanged, 0);
  te_linear_backward_args ba;
  ASSERT_EQ(te_linear_backward_args_init(&ba), TE_SUCCESS);
  EXPECT_EQ(ba.struct_size, sizeof ba);
  EXPECT_EQ(ba.flags, 0u);
}

TEST_F(LinearBadInput, Create) {
  te_linear_options o;
  te_linear_options_init(&o);
  o.in_features = kIn;
  o.out_features = kOut;
  te_linear *const sentinel = reinterpret_cast<te_linear *>(0x9abc);
  struct Case {
    const char *what, *arg;
    std::function<te_status(te_linear **)> call;
  };
  const te_linear_options good = o;
  auto with = [&](std::function<void(te_linear_options &)> edit) {
    return [this, good, edit](te_linear **out) {
      te_linear_options m = good;
      edit(m);
      return te_linear_create(out, ctx.get(), &m);
    };
  };
  const Case cases[] = {
      {"NULL out", "out", [&](te_linear **) { return te_linear_create(nullptr, ctx.get(), &good); }},
      {"NULL ctx", "ctx", [&](te_linear **out) { return te_linear_create(out, nullptr, &good); }},
      {"NULL opts", "opts", [&](te_linear **out) { return te_linear_create(out, ctx.get(), nullptr); }},
      {"recipe as ctx", "ctx",
       [&](te_linear **out) { return te_linear_create(out, reinterpret_cast<te_context *>(recipe.get()), &good); }},
      {"struct_size 0", "opts", with([](te_linear_options &m) { m.struct_size = 0; })},
      {"struct_size too small", "opts", with([](te_linear_options &m) { m.struct_size = sizeof m - 1; })},
      {"in_features 0", "in_features", with([](te_linear_options &m) { m.in_features = 0; })},
      {"in_features < 0", "in_features", with([](te_linear_options &m) { m.in_features = -16; })},
      {"out_features 0", "out_features", with([](te_linear_options &m) { m.out_features = 0; })},
      {"FP8 activation dtype", "activation_dtype",
       with([](te_linear_options &m) { m.activation_dtype = TE_DTYPE_E4M3; })},
      {"unknown activation dtype", "activation_dtype",
       with([](te_linear_options &m) { poke_enum(&m.activation_dtype, 42); })},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    te_linear *out = sentinel;
    EXPECT_TRUE(lt::IsError(c.call(&out), TE_ERROR_INVALID_ARGUMENT, "te_linear_create", c.arg));
    EXPECT_EQ(out, sentinel) << "out written on failure";
  }
}

TEST_F(LinearBadInput, ForwardNullHandlesAndArgs) {
  lt::HostTensor y(kAct, {kT, kOut});
  y.fill_byte(0x77);
  te_linear_forward_args fa = args();
  // A NULL context (expect_forward_fails' own `c` defaults to the fixture's context).
  {
    te_linear_residuals res{};
    res.struct_size = sizeof res;
    EXPECT_TRUE(lt::IsError(te_linear_forward_compute(nullptr, lin.get(), &fa, y.get(), &res),
                            TE_ERROR_INVALID_ARGUMENT, "te_linear_forward_compute", "ctx"));
    te_linear_backward_ctx *out = nullptr;
    EXPECT_TRUE(lt::IsError(te_linear_forward(nullptr, lin.get(), &fa, y.get(), &out), TE_ERROR_INVALID_ARGUMENT,
                            "te_linear_forward", "ctx"));
    EXPECT_EQ(out, nullptr);
  }
  expect_forward_fails(nullptr, &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "lin");
  expect_forward_fails(as_linear(recipe.get()), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "lin");
  expect_forward_fails(lin.get(), nullptr, y.get(), TE_ERROR_INVALID_ARGUMENT, "args");
  expect_forward_fails(lin.get(), &fa, nullptr, TE_ERROR_INVALID_ARGUMENT, "y");
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "residuals", true, nullptr,
                       /*null_residuals=*/true);
  {
    te_linear_backward_ctx **no_out = nullptr;
    EXPECT_TRUE(lt::IsError(te_linear_forward(ctx.get(), lin.get(), &fa, y.get(), no_out), TE_ERROR_INVALID_ARGUMENT,
                            "te_linear_forward", "out"));
  }
  te_linear_forward_args bad = fa;
  bad.struct_size = 0;
  expect_forward_fails(lin.get(), &bad, y.get(), TE_ERROR_INVALID_ARGUMENT, "args");
  bad.struct_size = sizeof bad - 1;
  expect_forward_fails(lin.get(), &bad, y.get(), TE_ERROR_INVALID_ARGUMENT, "args");
  bad = fa;
  bad.input = nullptr;
  expect_forward_fails(lin.get(), &bad, y.get(), TE_ERROR_INVALID_ARGUMENT, "input");
  bad = fa;
  bad.weight = nullptr;
  expect_forward_fails(lin.get(), &bad, y.get(), TE_ERROR_INVALID_ARGUMENT, "weight");
}

TEST_F(LinearBadInput, ForwardWrongDtypes) {
  lt::HostTensor y(kAct, {kT, kOut});
  y.fill_byte(0x77);
  lt::HostTensor x32(TE_DTYPE_F32, {kT, kIn}), w32(TE_DTYPE_F32, {kOut, kIn}), b32(TE_DTYPE_F32, {kOut}),
      y32(TE_DTYPE_F32, {kT, kOut});
  y32.fill_byte(0x77);
  te_linear_forward_args fa = args();
  fa.input = x32.get();
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "input");
  fa = args();
  fa.weight = w32.get();
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "weight");
  fa = args();
  fa.bias = b32.get();
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "bias");
  fa = args();
  expect_forward_fails(lin.get(), &fa, y32.get(), TE_ERROR_INVALID_ARGUMENT, "y");
  // A device the context is not on.
  fa = args();
  te_tensor xc = *x.get();
  xc.device.type = TE_DEVICE_CUDA;
  fa.input = &xc;
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "input");
  // Malformed tensors.
  te_tensor xn = *x.get();
  xn.data = nullptr;
  fa.input = &xn;
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "input");
  te_tensor x0 = *x.get();
  x0.ndim = 0;
  fa.input = &x0;
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "input");
  te_tensor x9 = *x.get();
  x9.ndim = TE_MAX_DIMS + 1;
  fa.input = &x9;
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "input");
  te_tensor xd = *x.get();
  poke_enum(&xd.dtype, 77);
  fa.input = &xd;
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "input");
}

TEST_F(LinearBadInput, ForwardWrongShapes) {
  lt::HostTensor y(kAct, {kT, kOut});
  y.fill_byte(0x77);
  te_linear_forward_args fa = args();
  lt::HostTensor x_wide(kAct, {kT, kIn + 16});        // last dim != in
  lt::HostTensor w_swapped(kAct, {kIn, kOut});         // [in, out]
  lt::HostTensor w_flat(kAct, {kOut * kIn});           // 1-D
  lt::HostTensor w_wide(kAct, {kOut, kIn + 16});       // in mismatch
  lt::HostTensor b_long(kAct, {kOut + 16});
  lt::HostTensor b_2d(kAct, {1, kOut});
  lt::HostTensor y_wide(kAct, {kT, kOut + 16});
  lt::HostTensor y_short(kAct, {kT - 16, kOut});
  for (lt::HostTensor *t : {&y_wide, &y_short}) t->fill_byte(0x77);
  fa.input = x_wide.get();
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "input");
  fa = args();
  fa.weight = w_swapped.get();
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "weight");
  fa.weight = w_flat.get();
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "weight");
  fa.weight = w_wide.get();
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "weight");
  fa = args();
  fa.bias = b_long.get();
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "bias");
  fa.bias = b_2d.get();
  expect_forward_fails(lin.get(), &fa, y.get(), TE_ERROR_INVALID_ARGUMENT, "bias");
  fa = args();
  expect_forward_fails(lin.get(), &fa, y_wide.get(), TE_ERROR_INVALID_ARGUMENT, "y");
  expect_forward_fails(lin.get(), &fa, y_short.get(), TE_ERROR_INVALID_ARGUMENT, "y");
}

TEST_F(LinearBadInput, ForwardBiasPresenceMustMatchLayer) {
  lt::HostTensor y(kAct, {kT, kOut});
  y.fill_byte(0x77);
  te_linear_forward_args with_bias = args(true), without_bias = args(false);
  expect_forward_fails(nobias.get(), &with_bias, y.get(), TE_ERROR_INVALID_ARGUMENT, "bias");
  expect_forward_fails(lin.get(), &without_bias, y.get(), TE_ERROR_INVALID_ARGUMENT, "bias");
}

// FP8 needs tokens, in and out to be multiples of 16: UNSUPPORTED inside an FP8 scope (with no
// state change), while high precision takes any shape.
TEST_F(LinearBadInput, Fp8DimsNotMultipleOf16AreUnsupported) {
  struct Case {
    const char *what;
    int64_t tokens, in, out;
  };
  const Case cases[] = {{"tokens 24", 24, 32, 16}, {"in 24", 32, 24, 16}, {"out 24", 32, 32, 24}, {"tokens 8", 8, 32, 16}};
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    lt::LinearPtr l = lt::make_linear(ctx.get(), c.in, c.out, 1, kAct);
    lt::HostTensor xx = lt::random_tensor(kAct, {c.tokens, c.in}, -1.0f, 1.0f, 5);
    lt::HostTensor ww = lt::random_tensor(kAct, {c.out, c.in}, -1.0f, 1.0f, 6);
    lt::HostTensor bb = lt::random_tensor(kAct, {c.out}, -1.0f, 1.0f, 7);
    lt::HostTensor y(kAct, {c.tokens, c.out});
    y.fill_byte(0x77);
    te_linear_forward_args fa;
    te_linear_forward_args_init(&fa);
    fa.input = xx.get();
    fa.weight = ww.get();
    fa.bias = bb.get();
    expect_forward_fails(l.get(), &fa, y.get(), TE_ERROR_UNSUPPORTED, nullptr, /*also_high_precision=*/false);
    // The same call in high precision works.
    te_linear_residuals res{};
    res.struct_size = sizeof res;
    EXPECT_EQ(te_linear_forward_compute(ctx.get(), l.get(), &fa, y.get(), &res), TE_SUCCESS) << te_last_error();
    te_linear_residuals_release(&res);
  }
}

TEST_F(LinearBadInput, ForwardSave) {
  lt::HostTensor y(kAct, {kT, kOut});
  te_linear_forward_args fa = args();
  te_linear_residuals res{};
  res.struct_size = sizeof res;
  lt::AutocastScope scope(ctx.get(), recipe.get());
  ASSERT_EQ(te_linear_forward_compute(ctx.get(), lin.get(), &fa, y.get(), &res), TE_SUCCESS) << te_last_error();
  const te_linear_residuals before = res;
  te_linear_backward_ctx *const sentinel = reinterpret_cast<te_linear_backward_ctx *>(0xdef0);
  te_linear_backward_ctx *out = sentinel;
  EXPECT_TRUE(lt::IsError(te_linear_forward_save(nullptr, lin.get(), &res, &out), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_forward_save", "ctx"));
  EXPECT_TRUE(lt::IsError(te_linear_forward_save(ctx.get(), nullptr, &res, &out), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_forward_save", "lin"));
  EXPECT_TRUE(lt::IsError(te_linear_forward_save(ctx.get(), as_linear(recipe.get()), &res, &out),
                          TE_ERROR_INVALID_ARGUMENT, "te_linear_forward_save", "lin"));
  EXPECT_TRUE(lt::IsError(te_linear_forward_save(ctx.get(), lin.get(), nullptr, &out), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_forward_save", "residuals"));
  EXPECT_TRUE(lt::IsError(te_linear_forward_save(ctx.get(), lin.get(), &res, nullptr), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_forward_save", "out"));
  te_linear_residuals zero{};
  zero.struct_size = sizeof zero;
  EXPECT_TRUE(lt::IsError(te_linear_forward_save(ctx.get(), lin.get(), &zero, &out), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_forward_save", "residuals"));
  EXPECT_EQ(out, sentinel);
  EXPECT_EQ(0, std::memcmp(&res, &before, sizeof res)) << "residuals changed by a failed save";
  // The failed saves consumed nothing: the residuals still save.
  ASSERT_EQ(te_linear_forward_save(ctx.get(), lin.get(), &res, &out), TE_SUCCESS) << te_last_error();
  te_linear_backward_ctx_destroy(out);
}

class LinearBadBackward : public LinearBadInput {
 protected:
  // Checks a failing backward: status, message, sentinel outputs untouched, GRAD_OUTPUT state
  // unchanged, and the context still usable (a failure must not consume TE_BACKWARD_ONCE).
  void expect_backward_fails(te_context *c, te_linear_backward_ctx *bwd, const te_linear *state_of, const te_tensor *d,
                             te_tensor *dx, te_tensor *dw, te_tensor *db, const te_linear_backward_args *a,
                             const char *arg) {
    const std::vector<unsigned char> state_before = lt::saved_state(ctx.get(), state_of);
    auto snap = [](te_tensor *t) {
      if (!t || !t->data) return std::vector<unsigned char>();
      const unsigned char *p = static_cast<unsigned char *>(t->data);
      return std::vector<unsigned char>(p, p + te_tensor_numel(t) * lt::dtype_size(t->dtype));
    };
    const auto dx0 = snap(dx), dw0 = snap(dw), db0 = snap(db);
    EXPECT_TRUE(lt::IsError(te_linear_backward(c, bwd, d, dx, dw, db, a), TE_ERROR_INVALID_ARGUMENT,
                            "te_linear_backward", arg));
    EXPECT_EQ(snap(dx), dx0) << "dx written on failure";
    EXPECT_EQ(snap(dw), dw0) << "dw written on failure";
    EXPECT_EQ(snap(db), db0) << "db written on failure";
    EXPECT_EQ(lt::saved_state(ctx.get(), state_of), state_before) << "state changed by a failed backward";
  }
};

TEST_F(LinearBadBackward, EveryArgument) {
  lt::HostTensor y(kAct, {kT, kOut});
  te_linear_forward_args fa = args(), fa_nb = args(false);
  te_linear_backward_ctx *raw = nullptr, *raw_nb = nullptr;
  {
    lt::AutocastScope scope(ctx.get(), recipe.get());
    ASSERT_EQ(te_linear_forward(ctx.get(), lin.get(), &fa, y.get(), &raw), TE_SUCCESS) << te_last_error();
    ASSERT_EQ(te_linear_forward(ctx.get(), nobias.get(), &fa_nb, y.get(), &raw_nb), TE_SUCCESS) << te_last_error();
  }
  lt::BackwardPtr bwd(raw), bwd_nb(raw_nb);
  lt::HostTensor dx(kAct, {kT, kIn}), dw(kAct, {kOut, kIn}), db(kAct, {kOut});
  for (lt::HostTensor *t : {&dx, &dw, &db}) t->fill_byte(0x77);
  lt::HostTensor dy32(TE_DTYPE_F32, {kT, kOut}), dx32(TE_DTYPE_F32, {kT, kIn}), dw32(TE_DTYPE_F32, {kOut, kIn}),
      db32(TE_DTYPE_F32, {kOut});
  lt::HostTensor dy_wide(kAct, {kT, kOut + 16}), dy_short(kAct, {kT - 16, kOut});
  lt::HostTensor dx_bad(kAct, {kT, kOut}), dw_swapped(kAct, {kIn, kOut}), db_long(kAct, {kIn});
  te_linear_backward_args once;
  te_linear_backward_args_init(&once);
  once.flags = TE_BACKWARD_ONCE;  // a failure must not consume the context
  te_linear_backward_args bad_args = once;
  bad_args.struct_size = 0;
  te_context *c = ctx.get();
  te_linear *l = lin.get();
  auto B = bwd.get();

  expect_backward_fails(nullptr, B, l, dy.get(), dx.get(), dw.get(), db.get(), &once, "ctx");
  expect_backward_fails(c, nullptr, l, dy.get(), dx.get(), dw.get(), db.get(), &once, "bwd");
  expect_backward_fails(c, reinterpret_cast<te_linear_backward_ctx *>(recipe.get()), l, dy.get(), dx.get(), dw.get(),
                        db.get(), &once, "bwd");
  expect_backward_fails(c, B, l, nullptr, dx.get(), dw.get(), db.get(), &once, "dy");
  expect_backward_fails(c, B, l, dy.get(), dx.get(), dw.get(), db.get(), &bad_args, "args");
  expect_backward_fails(c, B, l, dy32.get(), dx.get(), dw.get(), db.get(), &once, "dy");
  expect_backward_fails(c, B, l, dy_wide.get(), dx.get(), dw.get(), db.get(), &once, "dy");
  expect_backward_fails(c, B, l, dy_short.get(), dx.get(), dw.get(), db.get(), &once, "dy");
  expect_backward_fails(c, B, l, dy.get(), dx32.get(), dw.get(), db.get(), &once, "dx");
  expect_backward_fails(c, B, l, dy.get(), dx_bad.get(), dw.get(), db.get(), &once, "dx");
  expect_backward_fails(c, B, l, dy.get(), dx.get(), dw32.get(), db.get(), &once, "dw");
  expect_backward_fails(c, B, l, dy.get(), dx.get(), dw_swapped.get(), db.get(), &once, "dw");
  expect_backward_fails(c, B, l, dy.get(), dx.get(), dw.get(), db32.get(), &once, "db");
  expect_backward_fails(c, B, l, dy.get(), dx.get(), dw.get(), db_long.get(), &once, "db");
  te_tensor dx_cuda = *dx.get();
  dx_cuda.device.type = TE_DEVICE_CUDA;
  expect_backward_fails(c, B, l, dy.get(), &dx_cuda, dw.get(), db.get(), &once, "dx");
  // db for a layer without bias.
  expect_backward_fails(c, bwd_nb.get(), nobias.get(), dy.get(), dx.get(), dw.get(), db.get(), &once, "db");

  // After all that, the (ONCE) backward still runs, and then the context is spent.
  EXPECT_EQ(te_linear_backward(c, B, dy.get(), dx.get(), dw.get(), db.get(), &once), TE_SUCCESS) << te_last_error();
  EXPECT_EQ(te_linear_backward(c, bwd_nb.get(), dy.get(), dx.get(), dw.get(), nullptr, &once), TE_SUCCESS)
      << te_last_error();
}

TEST_F(LinearBadBackward, FusedWgradNeedsF32MainGrad) {
  lt::LinearPtr fused = lt::make_linear(ctx.get(), kIn, kOut, 1, kAct, /*fuse_wgrad=*/1);
  lt::HostTensor y(kAct, {kT, kOut});
  te_linear_forward_args fa = args();
  te_linear_backward_ctx *raw = nullptr;
  {
    lt::AutocastScope scope(ctx.get(), recipe.get());
    ASSERT_EQ(te_linear_forward(ctx.get(), fused.get(), &fa, y.get(), &raw), TE_SUCCESS) << te_last_error();
  }
  lt::BackwardPtr bwd(raw);
  lt::HostTensor dw_bf16(kAct, {kOut, kIn}), dw_bad(TE_DTYPE_F32, {kIn, kOut}), main_grad(TE_DTYPE_F32, {kOut, kIn});
  dw_bf16.fill_byte(0x77);
  dw_bad.fill_byte(0x77);
  expect_backward_fails(ctx.get(), bwd.get(), fused.get(), dy.get(), nullptr, dw_bf16.get(), nullptr, nullptr, "dw");
  expect_backward_fails(ctx.get(), bwd.get(), fused.get(), dy.get(), nullptr, dw_bad.get(), nullptr, nullptr, "dw");
  EXPECT_EQ(te_linear_backward(ctx.get(), bwd.get(), dy.get(), nullptr, main_grad.get(), nullptr, nullptr), TE_SUCCESS)
      << te_last_error();
}

TEST_F(LinearBadInput, GetScalingState) {
  te_scaling_state_info info;
  std::memset(&info, 0x3C, sizeof info);
  info.struct_size = sizeof info;
  const te_scaling_state_info before = info;
  std::vector<float> hist(16, -7.0f);
  const std::vector<float> hist0 = hist;
  te_context *c = ctx.get();
  EXPECT_TRUE(lt::IsError(te_linear_get_scaling_state(nullptr, lin.get(), TE_ROLE_INPUT, &info, hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, "te_linear_get_scaling_state", "ctx"));
  EXPECT_TRUE(lt::IsError(te_linear_get_scaling_state(c, nullptr, TE_ROLE_INPUT, &info, hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, "te_linear_get_scaling_state", "lin"));
  EXPECT_TRUE(lt::IsError(
      te_linear_get_scaling_state(c, as_linear(recipe.get()), TE_ROLE_INPUT, &info, hist.data(), 16),
      TE_ERROR_INVALID_ARGUMENT, "te_linear_get_scaling_state", "lin"));
  EXPECT_TRUE(lt::IsError(te_linear_get_scaling_state(c, lin.get(), TE_ROLE_INPUT, nullptr, hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, "te_linear_get_scaling_state", "info"));
  EXPECT_TRUE(lt::IsError(te_linear_get_scaling_state(c, lin.get(), static_cast<te_tensor_role>(3), &info,
                                                      hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, "te_linear_get_scaling_state", "role"));
  EXPECT_EQ(0, std::memcmp(&info, &before, sizeof info));
  te_scaling_state_info small = before;
  small.struct_size = 0;
  EXPECT_TRUE(lt::IsError(te_linear_get_scaling_state(c, lin.get(), TE_ROLE_INPUT, &small, hist.data(), 16),
                          TE_ERROR_INVALID_ARGUMENT, "te_linear_get_scaling_state", "info"));
  EXPECT_EQ(hist, hist0) << "history written on failure";
}

TEST_F(LinearBadInput, StateSaveAndLoadHandles) {
  size_t size = 12345;
  te_context *c = ctx.get();
  EXPECT_TRUE(lt::IsError(te_linear_state_save(nullptr, lin.get(), nullptr, 0, &size), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_state_save", "ctx"));
  EXPECT_TRUE(lt::IsError(te_linear_state_save(c, nullptr, nullptr, 0, &size), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_state_save", "lin"));
  EXPECT_TRUE(lt::IsError(te_linear_state_save(c, as_linear(recipe.get()), nullptr, 0, &size),
                          TE_ERROR_INVALID_ARGUMENT, "te_linear_state_save", "lin"));
  EXPECT_TRUE(lt::IsError(te_linear_state_save(c, lin.get(), nullptr, 0, nullptr), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_state_save", "size"));
  EXPECT_EQ(size, 12345u) << "size written on failure";
  const std::vector<unsigned char> good = lt::saved_state(c, lin.get());
  EXPECT_TRUE(lt::IsError(te_linear_state_load(nullptr, lin.get(), good.data(), good.size()),
                          TE_ERROR_INVALID_ARGUMENT, "te_linear_state_load", "ctx"));
  EXPECT_TRUE(lt::IsError(te_linear_state_load(c, nullptr, good.data(), good.size()), TE_ERROR_INVALID_ARGUMENT,
                          "te_linear_state_load", "lin"));
  EXPECT_TRUE(lt::IsError(te_linear_state_load(c, as_linear(recipe.get()), good.data(), good.size()),
                          TE_ERROR_INVALID_ARGUMENT, "te_linear_state_load", "lin"));
}

}  // namespace
