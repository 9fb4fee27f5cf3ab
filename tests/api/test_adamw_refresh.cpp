// te_adamw_step's FP8 weight-cache refresh: a training loop (forward, backward, AdamW with the
// weights' owners given, next forward with weight_unchanged = 1) against the same loop without
// owners and weight_unchanged = 0, for te_linear, te_layernorm_linear and te_layernorm_mlp
// (fc1 and fc2) under delayed, current and block scaling: outputs, gradients, parameters and
// every scaling state (scale, scale_inv, the whole amax history, so the refresh's amax record
// reached the weight state's slot as the forward's cast would have put it) bit-identical.
// The refreshed loop's forwards after the first are given a decoy weight (zeros): they must
// not cast it, so identical outputs prove the refreshed cache is what they used. Backward
// contexts are destroyed before the update on some steps and after it on others, so both the
// in-place refresh and the copy-on-write one (a cache still held by residuals) run.
#include "api_test_util.h"

using namespace te_test;

namespace {

constexpr int64_t kTokens = 32, kIn = 64, kOut = 48, kFfn = 32;

enum class Kind { Linear, LnLinear, Mlp };

// One module instance with its parameters (fp32 master, optional BF16 model copy), moments and
// gradients, driven through one training step at a time.
struct Model {
  Kind kind;
  te_dtype act;  // activation dtype; model weights are in it when it is not F32
  te_context *ctx = nullptr;
  te_linear *lin = nullptr;
  te_layernorm_linear *lnl = nullptr;
  te_layernorm_mlp *mlp = nullptr;
  struct Weight {
    HostTensor p, m, v, model, grad, decoy;
    int gemm = 0;
  };
  std::vector<Weight> w;
  HostTensor gamma, beta;
  void *bwd = nullptr;

  Model(Kind k, te_dtype a, te_context *c) : kind(k), act(a), ctx(c) {
    std::vector<std::pair<int64_t, int64_t>> shapes;
    switch (kind) {
      case Kind::Linear: {
        te_linear_options o;
        EXPECT_TE_OK(te_linear_options_init(&o));
        o.in_features = kIn;
        o.out_features = kOut;
        o.bias = 0;
        o.activation_dtype = act;
        EXPECT_TE_OK(te_linear_create(&lin, ctx, &o));
        shapes = {{kOut, kIn}};
        break;
      }
      case Kind::LnLinear: {
        te_layernorm_linear_options o;
        EXPECT_TE_OK(te_layernorm_linear_options_init(&o));
        o.in_features = kIn;
        o.out_features = kOut;
        o.bias = 0;
        o.activation_dtype = act;
        EXPECT_TE_OK(te_layernorm_linear_create(&lnl, ctx, &o));
        shapes = {{kOut, kIn}};
        break;
      }
      case Kind::Mlp: {
        te_layernorm_mlp_options o;
        EXPECT_TE_OK(te_layernorm_mlp_options_init(&o));
        o.hidden_size = kIn;
        o.ffn_hidden_size = kFfn;
        o.bias = 0;
        o.activation = TE_ACTIVATION_GELU;
        o.activation_dtype = act;
        EXPECT_TE_OK(te_layernorm_mlp_create(&mlp, ctx, &o));
        shapes = {{kFfn, kIn}, {kIn, kFfn}};
        break;
      }
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      Weight x;
      const int64_t r = shapes[i].first, c = shapes[i].second;
      x.p = random_tensor(TE_DTYPE_F32, {r, c}, -0.2f, 0.2f, static_cast<uint32_t>(11 + i), true);
      x.m = make_tensor(TE_DTYPE_F32, {r, c}, std::vector<float>(static_cast<size_t>(r * c), 0.0f));
      x.v = x.m;
      if (act != TE_DTYPE_F32) x.model = make_tensor(act, {r, c}, x.p.values_f32());
      x.grad = make_tensor(act, {r, c});
      x.decoy = make_tensor(act, {r, c}, std::vector<float>(static_cast<size_t>(r * c), 0.0f));
      x.gemm = static_cast<int>(i);
      w.push_back(std::move(x));
    }
    gamma = random_tensor(act, {kIn}, 0.8f, 1.2f, 5);
    beta = random_tensor(act, {kIn}, -0.1f, 0.1f, 6);
  }
  ~Model() {
    release_backward();
    te_linear_destroy(lin);
    te_layernorm_linear_destroy(lnl);
    te_layernorm_mlp_destroy(mlp);
  }
  void release_backward() {
    if (!bwd) return;
    if (kind == Kind::Linear) te_linear_backward_ctx_destroy(static_cast<te_linear_backward_ctx *>(bwd));
    if (kind == Kind::LnLinear) te_layernorm_linear_backward_ctx_destroy(static_cast<te_layernorm_linear_backward_ctx *>(bwd));
    if (kind == Kind::Mlp) te_layernorm_mlp_backward_ctx_destroy(static_cast<te_layernorm_mlp_backward_ctx *>(bwd));
    bwd = nullptr;
  }
  // The weight the module is given: the model copy (or the fp32 param), or the decoy.
  te_tensor *weight(size_t i, bool decoy) {
    if (decoy) return w[i].decoy.get();
    return act == TE_DTYPE_F32 ? w[i].p.get() : w[i].model.get();
  }
  void forward(HostTensor &x, HostTensor &y, bool unchanged, bool decoy) {
    switch (kind) {
      case Kind::Linear: {
        te_linear_forward_args a;
        EXPECT_TE_OK(te_linear_forward_args_init(&a));
        a.input = x.get();
        a.weight = weight(0, decoy);
        a.weight_unchanged = unchanged;
        te_linear_backward_ctx *b = nullptr;
        ASSERT_TE_OK(te_linear_forward(ctx, lin, &a, y.get(), &b));
        bwd = b;
        break;
      }
      case Kind::LnLinear: {
        te_layernorm_linear_forward_args a;
        EXPECT_TE_OK(te_layernorm_linear_forward_args_init(&a));
        a.input = x.get();
        a.ln_weight = gamma.get();
        a.ln_bias = beta.get();
        a.weight = weight(0, decoy);
        a.weight_unchanged = unchanged;
        te_layernorm_linear_backward_ctx *b = nullptr;
        ASSERT_TE_OK(te_layernorm_linear_forward(ctx, lnl, &a, y.get(), &b));
        bwd = b;
        break;
      }
      case Kind::Mlp: {
        te_layernorm_mlp_forward_args a;
        EXPECT_TE_OK(te_layernorm_mlp_forward_args_init(&a));
        a.input = x.get();
        a.ln_weight = gamma.get();
        a.ln_bias = beta.get();
        a.fc1_weight = weight(0, decoy);
        a.fc2_weight = weight(1, decoy);
        a.weight_unchanged = unchanged;
        te_layernorm_mlp_backward_ctx *b = nullptr;
        ASSERT_TE_OK(te_layernorm_mlp_forward(ctx, mlp, &a, y.get(), &b));
        bwd = b;
        break;
      }
    }
  }
  void backward(HostTensor &dy, HostTensor &dx) {
    switch (kind) {
      case Kind::Linear:
        ASSERT_TE_OK(te_linear_backward(ctx, static_cast<te_linear_backward_ctx *>(bwd), dy.get(), dx.get(),
                                        w[0].grad.get(), nullptr, nullptr));
        break;
      case Kind::LnLinear: {
        te_layernorm_linear_grads g;
        EXPECT_TE_OK(te_layernorm_linear_grads_init(&g));
        g.dx = dx.get();
        g.dw = w[0].grad.get();
        ASSERT_TE_OK(te_layernorm_linear_backward(ctx, static_cast<te_layernorm_linear_backward_ctx *>(bwd), dy.get(),
                                                  &g, nullptr));
        break;
      }
      case Kind::Mlp: {
        te_layernorm_mlp_grads g;
        EXPECT_TE_OK(te_layernorm_mlp_grads_init(&g));
        g.dx = dx.get();
        g.dfc1_weight = w[0].grad.get();
        g.dfc2_weight = w[1].grad.get();
        ASSERT_TE_OK(te_layernorm_mlp_backward(ctx, static_cast<te_layernorm_mlp_backward_ctx *>(bwd), dy.get(), &g,
                                               nullptr));
        break;
      }
    }
  }
  void adamw(int64_t step, bool owners) {
    std::vector<te_adamw_param> ps(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      te_adamw_param &e = ps[i];
      EXPECT_TE_OK(te_adamw_param_init(&e));
      e.param = w[i].p.get();
      e.grad = w[i].grad.get();
      e.exp_avg = w[i].m.get();
      e.exp_avg_sq = w[i].v.get();
      e.model_weight = act == TE_DTYPE_F32 ? nullptr : w[i].model.get();
      if (owners) {
        e.owner_kind = kind == Kind::Linear ? TE_MODULE_LINEAR : kind == Kind::LnLinear ? TE_MODULE_LAYERNORM_LINEAR
                                                                                       : TE_MODULE_LAYERNORM_MLP;
        e.owner = kind == Kind::Linear ? static_cast<const void *>(lin)
                  : kind == Kind::LnLinear ? static_cast<const void *>(lnl) : static_cast<const void *>(mlp);
        e.owner_gemm = w[i].gemm;
      }
    }
    te_adamw_options o;
    EXPECT_TE_OK(te_adamw_options_init(&o));
    o.lr = 1e-2f;  // large enough that the FP8 weights change from step to step
    o.step = step;
    o.max_grad_norm = 1.0f;
    ASSERT_TE_OK(te_adamw_step(ctx, &o, ps.data(), ps.size()));
  }
  // Every scaling state, scale, scale_inv and history, as raw floats.
  std::vector<float> states() {
    std::vector<float> out;
    const int gemms = kind == Kind::Mlp ? 2 : 1;
    for (int g = 0; g < gemms; ++g)
      for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT}) {
        te_scaling_state_info info;
        std::memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        std::vector<float> h(16, -7.0f);
        te_status s = TE_SUCCESS;
        if (kind == Kind::Linear) s = te_linear_get_scaling_state(ctx, lin, role, &info, h.data(), h.size());
        if (kind == Kind::LnLinear) s = te_layernorm_linear_get_scaling_state(ctx, lnl, role, &info, h.data(), h.size());
        if (kind == Kind::Mlp)
          s = te_layernorm_mlp_get_scaling_state(ctx, mlp, static_cast<te_mlp_gemm>(g), role, &info, h.data(), h.size());
        EXPECT_TE_OK(s);
        out.push_back(info.scale);
        out.push_back(info.scale_inv);
        out.insert(out.end(), h.begin(), h.end());
      }
    return out;
  }
};

std::vector<uint32_t> bits(const std::vector<float> &v) {
  std::vector<uint32_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bits(v[i]);
  return b;
}

struct Case {
  Kind kind;
  te_dtype act;
  te_recipe_kind recipe;
};

std::string case_name(const ::testing::TestParamInfo<Case> &i) {
  const char *k = i.param.kind == Kind::Linear ? "Linear" : i.param.kind == Kind::LnLinear ? "LayerNormLinear" : "LayerNormMlp";
  const char *r = i.param.recipe == TE_RECIPE_DELAYED_SCALING ? "Delayed"
                  : i.param.recipe == TE_RECIPE_CURRENT_SCALING ? "Current" : "Block";
  const char *a = i.param.act == TE_DTYPE_F32 ? "F32" : "BF16";
  return std::string(k) + r + a;
}

class AdamwRefresh : public ::testing::TestWithParam<Case> {};

TEST_P(AdamwRefresh, BitIdenticalToRecastingEveryStep) {
  const Case c = GetParam();
  ContextPtr ca = make_cpu_context(), cb = make_cpu_context();
  RecipePtr recipe = make_recipe(c.recipe, 4);  // a short history: it rolls during the test
  Model A(c.kind, c.act, ca.get()), B(c.kind, c.act, cb.get());
  const int64_t out_cols = c.kind == Kind::Mlp ? kIn : kOut;
  for (int step = 1; step <= 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    HostTensor x = random_tensor(c.act, {kTokens, kIn}, -2.0f, 2.0f, static_cast<uint32_t>(100 + step), true);
    HostTensor dy = random_tensor(c.act, {kTokens, out_cols}, -0.5f, 0.5f, static_cast<uint32_t>(200 + step));
    HostTensor ya = make_tensor(c.act, {kTokens, out_cols}), yb = ya;
    HostTensor dxa = make_tensor(c.act, {kTokens, kIn}), dxb = dxa;
    {
      AutocastScope sa(ca.get(), recipe.get());
      A.forward(x, ya, step > 1, step > 1);
    }
    {
      AutocastScope sb(cb.get(), recipe.get());
      B.forward(x, yb, false, false);
    }
    ASSERT_EQ(ya.bytes, yb.bytes) << "forward output";
    A.backward(dy, dxa);
    B.backward(dy, dxb);
    ASSERT_EQ(dxa.bytes, dxb.bytes) << "dx";
    for (size_t i = 0; i < A.w.size(); ++i) ASSERT_EQ(A.w[i].grad.bytes, B.w[i].grad.bytes) << "dW " << i;
    ASSERT_EQ(bits(A.states()), bits(B.states())) << "scaling states";
    const bool keep_residuals = step % 2 == 1;  // odd steps: the cache is shared at the update
    if (!keep_residuals) {
      A.release_backward();
      B.release_backward();
    }
    A.adamw(step, true);
    B.adamw(step, false);
    A.release_backward();
    B.release_backward();
    for (size_t i = 0; i < A.w.size(); ++i) {
      ASSERT_EQ(A.w[i].p.bytes, B.w[i].p.bytes) << "param " << i;
      if (c.act != TE_DTYPE_F32) {
        ASSERT_EQ(A.w[i].model.bytes, B.w[i].model.bytes) << "model weight " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modules, AdamwRefresh,
    ::testing::Values(Case{Kind::Linear, TE_DTYPE_BF16, TE_RECIPE_DELAYED_SCALING},
                      Case{Kind::Linear, TE_DTYPE_F32, TE_RECIPE_CURRENT_SCALING},
                      Case{Kind::Linear, TE_DTYPE_BF16, TE_RECIPE_BLOCK_SCALING},
                      Case{Kind::LnLinear, TE_DTYPE_F32, TE_RECIPE_DELAYED_SCALING},
                      Case{Kind::LnLinear, TE_DTYPE_BF16, TE_RECIPE_CURRENT_SCALING},
                      Case{Kind::LnLinear, TE_DTYPE_F32, TE_RECIPE_BLOCK_SCALING},
                      Case{Kind::Mlp, TE_DTYPE_BF16, TE_RECIPE_DELAYED_SCALING},
                      Case{Kind::Mlp, TE_DTYPE_F32, TE_RECIPE_CURRENT_SCALING},
                      Case{Kind::Mlp, TE_DTYPE_BF16, TE_RECIPE_BLOCK_SCALING}),
    case_name);

// Inside an open autocast scope the refresh would put the amax into that scope's pass: the
// cache is dropped instead, and a forward with weight_unchanged = 1 recasts the weight it is
// given (so a decoy weight now shows in the output).
TEST(AdamwRefreshScope, InsideAScopeTheCacheIsDropped) {
  ContextPtr ctx = make_cpu_context();
  RecipePtr recipe = make_recipe(TE_RECIPE_DELAYED_SCALING, 4);
  Model A(Kind::Linear, TE_DTYPE_F32, ctx.get());
  HostTensor x = random_tensor(TE_DTYPE_F32, {kTokens, kIn}, -2.0f, 2.0f, 1, true);
  HostTensor y = make_tensor(TE_DTYPE_F32, {kTokens, kOut}), dx = make_tensor(TE_DTYPE_F32, {kTokens, kIn});
  HostTensor dy = random_tensor(TE_DTYPE_F32, {kTokens, kOut}, -0.5f, 0.5f, 2);
  {
    AutocastScope s(ctx.get(), recipe.get());
    A.forward(x, y, false, false);
    A.backward(dy, dx);
    A.release_backward();
    A.adamw(1, true);  // inside the scope
  }
  {
    AutocastScope s(ctx.get(), recipe.get());
    A.forward(x, y, true, true);  // decoy zeros, recast: y == 0
    A.release_backward();
  }
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.at(i), 0.0) << i;
}

}  // namespace
