// te_adamw_step on the CPU: against an fp64 reference of torch.optim.AdamW's formulas (within
// tolerance, over several steps), against a scalar fp32 re-implementation of te.h's formula and
// of training_args.h's grad-norm order (bit for bit), clipping, grad_norm, non-finite gradients,
// per-param weight decay, BF16 gradients and model weights, 300 tensors of odd sizes, and every
// bad input (status, message naming te_adamw_step and the field, nothing changed).
// The FP8 weight-cache refresh is tested in test_adamw_refresh.cpp.
#include <functional>

#include "api_test_util.h"

using namespace te_test;

namespace {

// ---- references ------------------------------------------------------------------------------

// The grad norm in training_args.h's order: chunks of 4096, 256 lanes summing in element order,
// binary trees; chunk partials in lanes by global chunk index, tree; sqrt. fp32 throughout.
float tree(std::vector<float> lane) {
  for (size_t s = lane.size() / 2; s >= 1; s /= 2)
    for (size_t l = 0; l < s; ++l) lane[l] = lane[l] + lane[l + s];
  return lane[0];
}

float scalar_norm(const std::vector<std::vector<float>> &grads) {
  std::vector<float> total(256, 0.0f);
  size_t chunk = 0;
  for (const auto &g : grads) {
    for (size_t start = 0; start < g.size(); start += 4096, ++chunk) {
      std::vector<float> lane(256, 0.0f);
      for (size_t k = 0; k < 4096 && start + k < g.size(); ++k) {
        const float sq = g[start + k] * g[start + k];
        lane[k % 256] = lane[k % 256] + sq;
      }
      total[chunk % 256] = total[chunk % 256] + tree(lane);
    }
  }
  return std::sqrt(tree(total));
}

struct Hyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  int64_t step = 1;
  float max_grad_norm = 0.0f;
};

// te.h's formula, every operation rounded to fp32 in order.
void scalar_update(const Hyper &h, bool decay, float clip, const std::vector<float> &grad, std::vector<float> &p,
                   std::vector<float> &m, std::vector<float> &v) {
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step)));
  const float lr_wd = h.lr * h.wd, omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;
  for (size_t i = 0; i < p.size(); ++i) {
    const float g = grad[i] * clip;
    float pi = p[i];
    if (decay) pi = pi - lr_wd * pi;
    const float mi = h.beta1 * m[i] + omb1 * g;
    const float gg = g * g;
    const float vi = h.beta2 * v[i] + omb2 * gg;
    const float mhat = mi / bc1;
    const float vhat = vi / bc2;
    const float denom = std::sqrt(vhat) + h.eps;
    const float upd = (h.lr * mhat) / denom;
    pi = pi - upd;
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// torch.optim.AdamW (decoupled decay, bias-corrected), in fp64.
void torch_reference(const Hyper &h, bool decay, double clip, const std::vector<float> &grad, std::vector<double> &p,
                     std::vector<double> &m, std::vector<double> &v) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = grad[i] * clip;
    if (decay) p[i] *= 1.0 - static_cast<double>(h.lr) * h.wd;
    m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g;
    v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g * g;
    const double step_size = h.lr / bc1;
    const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + h.eps;
    p[i] -= step_size * m[i] / denom;
  }
}

// ---- a list of parameters in host memory ------------------------------------------------------

struct Param {
  HostTensor p, g, m, v, mw;  // mw.bytes empty: none
  bool decay = true;
};

std::vector<float> values(const HostTensor &h) { return h.values_f32(); }

struct ParamList {
  std::vector<Param> params;
  std::vector<te_adamw_param> entries;

  void add(int64_t n, te_dtype grad_dtype, te_dtype model_dtype, bool with_model, bool decay, uint32_t seed) {
    Param q;
    q.p = random_tensor(TE_DTYPE_F32, {n}, -1.0f, 1.0f, seed);
    q.g = random_tensor(grad_dtype, {n}, -0.5f, 0.5f, seed + 1);
    q.m = random_tensor(TE_DTYPE_F32, {n}, -0.01f, 0.01f, seed + 2);
    q.v = random_tensor(TE_DTYPE_F32, {n}, 0.0f, 1e-4f, seed + 3);
    if (with_model) q.mw = make_tensor(model_dtype, {n});
    q.decay = decay;
    params.push_back(std::move(q));
  }
  // Rebuilt after every change to `params` (the tensors' addresses).
  te_adamw_param *bind() {
    entries.assign(params.size(), te_adamw_param{});
    for (size_t i = 0; i < params.size(); ++i) {
      te_adamw_param &e = entries[i];
      EXPECT_TE_OK(te_adamw_param_init(&e));
      Param &q = params[i];
      e.param = q.p.get();
      e.grad = q.g.get();
      e.exp_avg = q.m.get();
      e.exp_avg_sq = q.v.get();
      e.model_weight = q.mw.bytes.empty() ? nullptr : q.mw.get();
      e.weight_decay = q.decay ? 1 : 0;
    }
    return entries.data();
  }
  // All bytes of every tensor, for "nothing changed".
  std::vector<unsigned char> snapshot() const {
    std::vector<unsigned char> s;
    for (const Param &q : params)
      for (const HostTensor *t : {&q.p, &q.g, &q.m, &q.v, &q.mw}) s.insert(s.end(), t->bytes.begin(), t->bytes.end());
    return s;
  }
};

te_adamw_options options(const Hyper &h) {
  te_adamw_options o;
  std::memset(&o, 0, sizeof o);
  EXPECT_TE_OK(te_adamw_options_init(&o));
  o.lr = h.lr;
  o.beta1 = h.beta1;
  o.beta2 = h.beta2;
  o.eps = h.eps;
  o.weight_decay = h.wd;
  o.step = h.step;
  o.max_grad_norm = h.max_grad_norm;
  return o;
}

class AdamwTest : public CpuContextTest {};

TEST_F(AdamwTest, DefaultsAreTorchs) {
  te_adamw_options o;
  std::memset(&o, 0xCD, sizeof o);
  ASSERT_TE_OK(te_adamw_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.lr, 1e-3f);
  EXPECT_EQ(o.beta1, 0.9f);
  EXPECT_EQ(o.beta2, 0.999f);
  EXPECT_EQ(o.eps, 1e-8f);
  EXPECT_EQ(o.weight_decay, 0.01f);
  EXPECT_EQ(o.step, 1);
  EXPECT_EQ(o.max_grad_norm, 0.0f);
  EXPECT_EQ(o.grad_norm, nullptr);
  te_adamw_param p;
  std::memset(&p, 0xCD, sizeof p);
  ASSERT_TE_OK(te_adamw_param_init(&p));
  EXPECT_EQ(p.struct_size, sizeof p);
  EXPECT_EQ(p.param, nullptr);
  EXPECT_EQ(p.model_weight, nullptr);
  EXPECT_EQ(p.weight_decay, 1);
  EXPECT_EQ(p.owner_kind, TE_MODULE_NONE);
  EXPECT_EQ(p.owner, nullptr);
  EXPECT_EQ(p.owner_gemm, 0);
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_adamw_options_init", "opts", te_adamw_options_init(nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_adamw_param_init", "param", te_adamw_param_init(nullptr));
}

// Several steps over a mixed list: bit-exact against the scalar fp32 formula, within tolerance
// of torch's fp64 AdamW; model weights are the params rounded; clipping on in the later steps.
void run_steps(te_context *ctx, ParamList &L, Hyper h, int steps, bool clip_later) {
  const size_t n = L.params.size();
  std::vector<std::vector<float>> p(n), m(n), v(n);
  std::vector<std::vector<double>> pd(n), md(n), vd(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = values(L.params[i].p);
    m[i] = values(L.params[i].m);
    v[i] = values(L.params[i].v);
    pd[i].assign(p[i].begin(), p[i].end());
    md[i].assign(m[i].begin(), m[i].end());
    vd[i].assign(v[i].begin(), v[i].end());
  }
  for (int s = 1; s <= steps; ++s) {
    h.step = s;
    h.max_grad_norm = clip_later && s > 1 ? 0.5f : 0.0f;
    // New gradients every step.
    for (size_t i = 0; i < n; ++i) fill_uniform(L.params[i].g, -0.5f, 0.5f, static_cast<uint32_t>(1000 * s + i));
    std::vector<std::vector<float>> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = values(L.params[i].g);
    const float norm = scalar_norm(g);
    double norm64 = 0;
    for (auto &gi : g)
      for (float x : gi) norm64 += static_cast<double>(x) * x;
    norm64 = std::sqrt(norm64);
    EXPECT_NEAR(norm, norm64, 1e-5 * norm64);
    float clip = 1.0f;
    double clip64 = 1.0;
    if (h.max_grad_norm > 0) {
      const float c = h.max_grad_norm / (norm + 1e-6f);
      clip = c < 1.0f ? c : 1.0f;
      clip64 = std::min(1.0, h.max_grad_norm / (norm64 + 1e-6));
      EXPECT_LT(clip, 1.0f) << "the test means to clip";
    }
    for (size_t i = 0; i < n; ++i) {
      scalar_update(h, L.params[i].decay, clip, g[i], p[i], m[i], v[i]);
      torch_reference(h, L.params[i].decay, clip64, g[i], pd[i], md[i], vd[i]);
    }
    float got_norm = -1.0f;
    te_adamw_options o = options(h);
    o.grad_norm = &got_norm;
    ASSERT_TE_OK(te_adamw_step(ctx, &o, L.bind(), n));
    EXPECT_EQ(float_to_bits(got_norm), float_to_bits(norm)) << "step " << s;
    for (size_t i = 0; i < n; ++i) {
      const Param &q = L.params[i];
      const std::vector<float> gp = values(q.p), gm = values(q.m), gv = values(q.v);
      for (size_t k = 0; k < p[i].size(); ++k) {
        ASSERT_EQ(float_to_bits(gp[k]), float_to_bits(p[i][k])) << "step " << s << " param " << i << " [" << k << "]";
        ASSERT_EQ(float_to_bits(gm[k]), float_to_bits(m[i][k])) << "exp_avg " << i << " [" << k << "]";
        ASSERT_EQ(float_to_bits(gv[k]), float_to_bits(v[i][k])) << "exp_avg_sq " << i << " [" << k << "]";
        ASSERT_NEAR(gp[k], pd[i][k], 2e-6 * std::fabs(pd[i][k]) + 1e-7) << "vs torch: param " << i << " [" << k << "]";
        ASSERT_NEAR(gm[k], md[i][k], 1e-6 * std::fabs(md[i][k]) + 1e-9);
        ASSERT_NEAR(gv[k], vd[i][k], 1e-5 * std::fabs(vd[i][k]) + 1e-12);
        if (!q.mw.bytes.empty()) {
          const float want = q.mw.t.dtype == TE_DTYPE_BF16 ? round_bf16(p[i][k])
                             : q.mw.t.dtype == TE_DTYPE_F16 ? round_f16(p[i][k]) : p[i][k];
          ASSERT_EQ(float_to_bits(static_cast<float>(q.mw.at(static_cast<int64_t>(k)))), float_to_bits(want))
              << "model_weight " << i << " [" << k << "]";
        }
      }
    }
  }
}

TEST_F(AdamwTest, MatchesScalarBitwiseAndTorchWithinTolerance) {
  ParamList L;
  L.add(1, TE_DTYPE_F32, TE_DTYPE_F32, false, true, 1);
  L.add(4097, TE_DTYPE_F32, TE_DTYPE_BF16, true, true, 10);
  L.add(777, TE_DTYPE_BF16, TE_DTYPE_BF16, true, false, 20);  // BF16 grad, no decay
  L.add(8192 + 300, TE_DTYPE_F16, TE_DTYPE_F16, true, true, 30);
  L.add(64, TE_DTYPE_F32, TE_DTYPE_F32, true, false, 40);
  run_steps(ctx_, L, Hyper{}, 4, true);
}

TEST_F(AdamwTest, ThreeHundredTensorsOfOddSizes) {
  ParamList L;
  for (int i = 0; i < 300; ++i) {
    const int64_t n = i % 50 == 7 ? 4096 * 2 + 5 : 1 + (i * 37) % 301;
    L.add(n, i % 3 == 0 ? TE_DTYPE_BF16 : TE_DTYPE_F32, TE_DTYPE_BF16, i % 4 == 0, i % 5 != 0,
          static_cast<uint32_t>(100 + 7 * i));
  }
  Hyper h;
  h.lr = 3e-3f;
  h.wd = 0.1f;
  run_steps(ctx_, L, h, 3, true);
}

TEST_F(AdamwTest, GradNormWithoutClippingAndLargeBetas) {
  ParamList L;
  L.add(5000, TE_DTYPE_F32, TE_DTYPE_F32, false, true, 5);
  Hyper h;
  h.beta1 = 0.0f;
  h.beta2 = 0.99999f;
  h.wd = 0.0f;
  run_steps(ctx_, L, h, 2, false);
}

TEST_F(AdamwTest, NonFiniteGradientUnderClippingChangesNothing) {
  for (float bad : {NAN, INFINITY}) {
    ParamList L;
    L.add(100, TE_DTYPE_F32, TE_DTYPE_BF16, true, true, 1);
    L.add(5000, TE_DTYPE_BF16, TE_DTYPE_BF16, true, true, 2);
    L.params[1].g.set(4321, bad);
    const auto before = L.snapshot();
    Hyper h;
    h.max_grad_norm = 1.0f;
    te_adamw_options o = options(h);
    float norm = 0.0f;
    o.grad_norm = &norm;
    ASSERT_TE_OK(te_adamw_step(ctx_, &o, L.bind(), 2));
    EXPECT_TRUE(std::isnan(norm) || std::isinf(norm)) << norm;
    EXPECT_EQ(L.snapshot(), before) << "a non-finite norm must skip the whole step";
  }
}

TEST_F(AdamwTest, CountZeroDoesNothing) {
  te_adamw_options o = options(Hyper{});
  EXPECT_TE_OK(te_adamw_step(ctx_, &o, nullptr, 0));
}

TEST_F(AdamwTest, LongerStructStride) {
  // Entries of a newer, larger te_adamw_param: the stride is params[0].struct_size.
  struct Bigger {
    te_adamw_param p;
    double future_field;
  };
  ParamList L;
  L.add(33, TE_DTYPE_F32, TE_DTYPE_F32, false, true, 1);
  L.add(65, TE_DTYPE_F32, TE_DTYPE_F32, false, true, 2);
  ParamList R = L;
  te_adamw_param *e = L.bind();
  std::vector<Bigger> big(2);
  for (int i = 0; i < 2; ++i) {
    big[i].p = e[i];
    big[i].p.struct_size = sizeof(Bigger);
    big[i].future_field = 1.0;
  }
  te_adamw_options o = options(Hyper{});
  ASSERT_TE_OK(te_adamw_step(ctx_, &o, &big[0].p, 2));
  ASSERT_TE_OK(te_adamw_step(ctx_, &o, R.bind(), 2));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(L.params[i].p.bytes, R.params[i].p.bytes);
}

TEST_F(AdamwTest, AGradientReadByTwoParamsIsAllowed) {
  // Only what the step writes must be distinct: two params may share one gradient tensor.
  ParamList L, R;
  for (ParamList *l : {&L, &R}) {
    l->add(300, TE_DTYPE_F32, TE_DTYPE_F32, false, true, 1);
    l->add(300, TE_DTYPE_F32, TE_DTYPE_F32, false, true, 2);
  }
  R.params[1].g = R.params[0].g;
  te_adamw_param *e = L.bind();
  e[1].grad = e[0].grad;
  te_adamw_options o = options(Hyper{});
  ASSERT_TE_OK(te_adamw_step(ctx_, &o, e, 2));
  ASSERT_TE_OK(te_adamw_step(ctx_, &o, R.bind(), 2));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(L.params[i].p.bytes, R.params[i].p.bytes) << i;
}

// ---- bad input ------------------------------------------------------------------------------

class AdamwBadInput : public AdamwTest {
 protected:
  void SetUp() override {
    AdamwTest::SetUp();
    L.add(48, TE_DTYPE_F32, TE_DTYPE_BF16, true, true, 1);
    L.add(16 * 32, TE_DTYPE_BF16, TE_DTYPE_BF16, true, true, 2);
    L.add(7, TE_DTYPE_F32, TE_DTYPE_F32, false, false, 3);
    L.params[1].p.reshape({16, 32});
    before = L.snapshot();
    opts = options(Hyper{});
  }
  // One call with a broken list or options: `arg` named, nothing changed.
  void expect_refused(const char *arg, te_adamw_param *e, const te_adamw_options *o = nullptr, size_t count = 3,
                      te_status want = TE_ERROR_INVALID_ARGUMENT) {
    EXPECT_TE_FAIL(want, "te_adamw_step", arg, te_adamw_step(ctx_, o ? o : &opts, e, count));
    EXPECT_EQ(L.snapshot(), before) << arg;
  }
  ParamList L;
  std::vector<unsigned char> before;
  te_adamw_options opts;
};

TEST_F(AdamwBadInput, Options) {
  struct Case {
    const char *arg;
    void (*set)(te_adamw_options &);
  };
  const Case cases[] = {
      {"opts->lr", [](te_adamw_options &o) { o.lr = -1e-3f; }},
      {"opts->lr", [](te_adamw_options &o) { o.lr = NAN; }},
      {"opts->lr", [](te_adamw_options &o) { o.lr = INFINITY; }},
      {"opts->beta1", [](te_adamw_options &o) { o.beta1 = 1.0f; }},
      {"opts->beta1", [](te_adamw_options &o) { o.beta1 = -0.1f; }},
      {"opts->beta2", [](te_adamw_options &o) { o.beta2 = 1.5f; }},
      {"opts->beta2", [](te_adamw_options &o) { o.beta2 = NAN; }},
      {"opts->eps", [](te_adamw_options &o) { o.eps = 0.0f; }},
      {"opts->eps", [](te_adamw_options &o) { o.eps = -1e-8f; }},
      {"opts->weight_decay", [](te_adamw_options &o) { o.weight_decay = -0.01f; }},
      {"opts->step", [](te_adamw_options &o) { o.step = 0; }},
      {"opts->step", [](te_adamw_options &o) { o.step = -3; }},
      {"opts->max_grad_norm", [](te_adamw_options &o) { o.max_grad_norm = -1.0f; }},
      {"opts->max_grad_norm", [](te_adamw_options &o) { o.max_grad_norm = NAN; }},
      {"opts", [](te_adamw_options &o) { o.struct_size = 8; }},
  };
  for (const Case &c : cases) {
    te_adamw_options o = opts;
    c.set(o);
    expect_refused(c.arg, L.bind(), &o);
  }
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_adamw_step", "opts", te_adamw_step(ctx_, nullptr, L.bind(), 3));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_adamw_step", "ctx", te_adamw_step(nullptr, &opts, L.bind(), 3));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_adamw_step", "params", te_adamw_step(ctx_, &opts, nullptr, 3));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_adamw_step", "count",
                 te_adamw_step(ctx_, &opts, L.bind(), size_t(1) << 40));
  // grad_norm aliasing a tensor the step writes.
  te_adamw_options o = opts;
  o.grad_norm = reinterpret_cast<float *>(L.params[2].m.bytes.data()) + 3;
  expect_refused("opts->grad_norm", L.bind(), &o);
  EXPECT_EQ(L.snapshot(), before);
}

TEST_F(AdamwBadInput, EveryField) {
  HostTensor f16_7 = make_tensor(TE_DTYPE_F16, {7});
  HostTensor f32_8 = make_tensor(TE_DTYPE_F32, {8});
  HostTensor e4m3_7 = make_tensor(TE_DTYPE_E4M3, {7});
  HostTensor i32_7 = make_tensor(TE_DTYPE_I32, {7});
  HostTensor cuda_7 = make_tensor(TE_DTYPE_F32, {7});
  cuda_7.t.device.type = TE_DEVICE_CUDA;
  HostTensor null_data = make_tensor(TE_DTYPE_F32, {7});
  null_data.t.data = nullptr;
  struct Case {
    const char *arg;
    std::function<void(te_adamw_param &)> set;
  };
  const std::vector<Case> cases = {
      {"params[2].struct_size", [](te_adamw_param &e) { e.struct_size += 8; }},
      {"params[2].param", [](te_adamw_param &e) { e.param = nullptr; }},
      {"params[2].param", [&](te_adamw_param &e) { e.param = f16_7.get(); }},
      {"params[2].param", [&](te_adamw_param &e) { e.param = cuda_7.get(); }},
      {"params[2].param", [&](te_adamw_param &e) { e.param = null_data.get(); }},
      {"params[2].grad", [](te_adamw_param &e) { e.grad = nullptr; }},
      {"params[2].grad", [&](te_adamw_param &e) { e.grad = e4m3_7.get(); }},
      {"params[2].grad", [&](te_adamw_param &e) { e.grad = i32_7.get(); }},
      {"params[2].grad", [&](te_adamw_param &e) { e.grad = f32_8.get(); }},
      {"params[2].exp_avg", [](te_adamw_param &e) { e.exp_avg = nullptr; }},
      {"params[2].exp_avg", [&](te_adamw_param &e) { e.exp_avg = f16_7.get(); }},
      {"params[2].exp_avg", [&](te_adamw_param &e) { e.exp_avg = f32_8.get(); }},
      {"params[2].exp_avg_sq", [](te_adamw_param &e) { e.exp_avg_sq = nullptr; }},
      {"params[2].exp_avg_sq", [&](te_adamw_param &e) { e.exp_avg_sq = cuda_7.get(); }},
      {"params[2].exp_avg_sq", [&](te_adamw_param &e) { e.exp_avg_sq = f32_8.get(); }},
      {"params[2].model_weight", [&](te_adamw_param &e) { e.model_weight = f32_8.get(); }},
      {"params[2].model_weight", [&](te_adamw_param &e) { e.model_weight = e4m3_7.get(); }},
      {"params[2].weight_decay", [](te_adamw_param &e) { e.weight_decay = 2; }},
      {"params[2].owner_kind", [](te_adamw_param &e) { e.owner_kind = static_cast<te_module_kind>(9); }},
      {"params[2].owner", [&](te_adamw_param &e) { e.owner = &f32_8; }},  // NONE with an owner
      {"params[2].owner", [&](te_adamw_param &e) {
         e.owner_kind = TE_MODULE_LINEAR;
         e.owner = &f32_8;  // not a handle
       }},
      // A tensor given twice with one of the roles written.
      {"params[2].exp_avg", [&](te_adamw_param &e) { e.exp_avg = e.param; }},
      {"params[2].exp_avg_sq", [&](te_adamw_param &e) { e.exp_avg_sq = e.exp_avg; }},
      {"params[2].grad", [&](te_adamw_param &e) { e.grad = e.exp_avg_sq; }},
      {"params[2].model_weight", [&](te_adamw_param &e) { e.model_weight = e.param; }},
  };
  for (const Case &c : cases) {
    te_adamw_param *e = L.bind();
    c.set(e[2]);
    SCOPED_TRACE(c.arg);
    expect_refused(c.arg, e);
  }
  // Entry 0 with a struct_size below this version's.
  te_adamw_param *e = L.bind();
  e[0].struct_size = sizeof(te_adamw_param) - 8;
  expect_refused("params[0].struct_size", e);
  e = L.bind();
  e[0].struct_size = sizeof(te_adamw_param) + 4;  // not a multiple of the alignment
  expect_refused("params[0].struct_size", e);
}

TEST_F(AdamwBadInput, Owners) {
  LinearPtr lin = make_linear(ctx_, 32, 16, 1, TE_DTYPE_F32);  // weight [16, 32] = params[1]'s shape
  RecipePtr recipe = make_recipe();
  // A te_linear given as another kind, and a recipe handle given as a te_linear.
  te_adamw_param *e = L.bind();
  e[1].owner_kind = TE_MODULE_LAYERNORM_LINEAR;
  e[1].owner = lin.get();
  expect_refused("params[1].owner", e);
  e = L.bind();
  e[1].owner_kind = TE_MODULE_LAYERNORM_MLP;
  e[1].owner = lin.get();
  expect_refused("params[1].owner", e);
  e = L.bind();
  e[1].owner_kind = TE_MODULE_LINEAR;
  e[1].owner = recipe.get();
  expect_refused("params[1].owner", e);
  // The owner's weight shape differs from the param's ([48]).
  e = L.bind();
  e[0].owner_kind = TE_MODULE_LINEAR;
  e[0].owner = lin.get();
  expect_refused("params[0].param", e);
  // A module of another context.
  ContextPtr other = make_cpu_context();
  LinearPtr foreign = make_linear(other.get(), 32, 16, 1, TE_DTYPE_F32);
  e = L.bind();
  e[1].owner_kind = TE_MODULE_LINEAR;
  e[1].owner = foreign.get();
  expect_refused("params[1].owner", e);
  // A destroyed module.
  te_linear *dead = make_linear(ctx_, 32, 16, 1, TE_DTYPE_F32).release();
  te_linear_destroy(dead);
  e = L.bind();
  e[1].owner_kind = TE_MODULE_LINEAR;
  e[1].owner = dead;
  expect_refused("params[1].owner", e);
  // A valid owner is accepted (it has no FP8 cache yet: nothing to refresh).
  e = L.bind();
  e[1].owner_kind = TE_MODULE_LINEAR;
  e[1].owner = lin.get();
  EXPECT_TE_OK(te_adamw_step(ctx_, &opts, e, 3));
}

TEST_F(AdamwBadInput, SameOwnerTwice) {
  LinearPtr lin = make_linear(ctx_, 7, 1, 1, TE_DTYPE_F32);
  ParamList M;
  M.add(7, TE_DTYPE_F32, TE_DTYPE_F32, false, true, 1);
  M.add(7, TE_DTYPE_F32, TE_DTYPE_F32, false, true, 2);
  M.params[0].p.reshape({1, 7});
  M.params[1].p.reshape({1, 7});
  const auto snap = M.snapshot();
  te_adamw_param *e = M.bind();
  for (int i = 0; i < 2; ++i) {
    e[i].owner_kind = TE_MODULE_LINEAR;
    e[i].owner = lin.get();
  }
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_adamw_step", "params[1].owner", te_adamw_step(ctx_, &opts, e, 2));
  EXPECT_EQ(M.snapshot(), snap);
}

}  // namespace
