// te_adamw_step's core (training/adamw.h) on a CUDA context against the CPU reference: params,
// moments, model weights and the grad norm bit-identical (the norm's reduction order and the
// update's separately rounded operations are defined in training_args.h), for lists that span
// several launches (more than 48 tensors), several chunks per tensor, odd sizes, BF16/F16
// gradients and model weights, clipping on and off, per-param decay and a non-finite gradient.
// Then the FP8 weight-cache refresh on CUDA: a te_linear training loop whose updates refresh the
// cache (and whose later forwards get a decoy weight, weight_unchanged) bit-identical to the
// loop that recasts every step, for the three recipes.
#include <cmath>
#include <cstring>
#include <random>

#include "context/context.h"
#include "gpu/gpu_test_support.h"
#include "modules/linear/linear.h"
#include "numerics/numerics.h"
#include "training/adamw.h"

namespace te::gpu_test {
namespace {

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float &x : v) x = d(rng);
  return v;
}

size_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

// Host bytes of n values in dtype t (F32/F16/BF16), rounded to nearest even by the CPU backend's
// own conversion (so the GPU gets exactly what the CPU gets).
std::vector<unsigned char> encode(const std::vector<float> &v, DType t) {
  std::vector<unsigned char> out(v.size() * dtype_bytes(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::F32) {
      std::memcpy(&out[4 * i], &v[i], 4);
    } else {
      const uint16_t h = t == DType::BF16 ? float_to_bf16(v[i]) : float_to_f16(v[i]);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

struct Spec {
  int64_t n;
  DType grad, model;  // model F32 with has_model false: none
  bool has_model, decay;
};

struct ListResult {
  std::vector<std::vector<unsigned char>> tensors;  // p, m, v, model per param
  uint32_t norm_bits = 0;
};

// Three steps of one list on `be`'s device; a NaN in the gradient at step 2 when `poison`.
ListResult run_list(Device dev, const std::vector<Spec> &specs, float max_grad_norm, bool want_norm, bool poison) {
  Context ctx(dev);
  Backend &be = ctx.backend();
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  std::vector<AdamwParam> params;
  std::vector<DeviceBuffer *> grads;
  std::vector<Spec> sp = specs;
  for (size_t i = 0; i < sp.size(); ++i) {
    const Spec &s = sp[i];
    const size_t n = static_cast<size_t>(s.n);
    auto mk = [&](const std::vector<unsigned char> &bytes) {
      bufs.push_back(std::make_unique<DeviceBuffer>(be, bytes));
      return bufs.back().get();
    };
    DeviceBuffer *p = mk(encode(uniform(n, -1, 1, 7 * i + 1), DType::F32));
    DeviceBuffer *g = mk(encode(std::vector<float>(n, 0.0f), s.grad));
    DeviceBuffer *m = mk(encode(uniform(n, -0.01f, 0.01f, 7 * i + 2), DType::F32));
    DeviceBuffer *v = mk(encode(uniform(n, 0, 1e-4f, 7 * i + 3), DType::F32));
    DeviceBuffer *mw = s.has_model ? mk(encode(std::vector<float>(n, 0.0f), s.model)) : nullptr;
    AdamwParam a;
    auto view = [&](DeviceBuffer *b, DType t) {
      TensorView tv = make_view(b->get(), t, dev, 1, s.n);
      tv.ndim = 1;
      tv.shape[0] = s.n;
      return tv;
    };
    a.param = view(p, DType::F32);
    a.grad = view(g, s.grad);
    a.exp_avg = view(m, DType::F32);
    a.exp_avg_sq = view(v, DType::F32);
    if (mw) a.model_weight = view(mw, s.model);
    a.decay = s.decay;
    params.push_back(a);
    grads.push_back(g);
  }
  DeviceBuffer norm(be, sizeof(float));
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < sp.size(); ++i) {
      std::vector<float> g = uniform(static_cast<size_t>(sp[i].n), -0.5f, 0.5f, 1000 * step + i);
      if (poison && step == 2 && i == sp.size() / 2) g[g.size() / 2] = NAN;
      const auto bytes = encode(g, sp[i].grad);
      be.copy_from_host(grads[i]->get(), bytes.data(), bytes.size());
    }
    AdamwHyper h;
    h.lr = 3e-3f;
    h.weight_decay = 0.05f;
    h.step = step;
    h.max_grad_norm = max_grad_norm;
    h.grad_norm = want_norm ? norm.floats() : nullptr;
    adamw_step(ctx, h, params.data(), params.size());
  }
  ListResult r;
  for (auto &b : bufs) r.tensors.push_back(b->read<unsigned char>());
  const std::vector<float> nv = norm.read<float>();
  std::memcpy(&r.norm_bits, nv.data(), 4);
  return r;
}

class CudaAdamw : public GpuTest {};

void expect_same(const ListResult &gpu, const ListResult &cpu) {
  ASSERT_EQ(gpu.tensors.size(), cpu.tensors.size());
  for (size_t i = 0; i < gpu.tensors.size(); ++i)
    ASSERT_TRUE(gpu.tensors[i] == cpu.tensors[i]) << "tensor " << i << " differs between CUDA and CPU";
  EXPECT_EQ(gpu.norm_bits, cpu.norm_bits) << "grad norm";
}

std::vector<Spec> many_tensors() {
  std::vector<Spec> s;
  for (int i = 0; i < 130; ++i) {  // three launches of at most 48 tensors
    const int64_t n = i % 40 == 3 ? 4096 * 3 + 17 : i % 40 == 9 ? 250000 : 1 + (i * 37) % 301;
    const DType g = i % 3 == 0 ? DType::BF16 : i % 3 == 1 ? DType::F16 : DType::F32;
    const DType m = i % 2 ? DType::BF16 : DType::F16;
    s.push_back(Spec{n, g, m, i % 4 != 1, i % 5 != 0});
  }
  return s;
}

TEST_F(CudaAdamw, BitIdenticalToCpuWithClipping) {
  const auto s = many_tensors();
  expect_same(run_list(Device{DeviceType::CUDA, 0}, s, 0.5f, true, false),
              run_list(Device{DeviceType::CPU, 0}, s, 0.5f, true, false));
}

TEST_F(CudaAdamw, BitIdenticalToCpuWithoutClipping) {
  const auto s = many_tensors();
  expect_same(run_list(Device{DeviceType::CUDA, 0}, s, 0.0f, true, false),
              run_list(Device{DeviceType::CPU, 0}, s, 0.0f, true, false));
  expect_same(run_list(Device{DeviceType::CUDA, 0}, s, 0.0f, false, false),
              run_list(Device{DeviceType::CPU, 0}, s, 0.0f, false, false));
}

TEST_F(CudaAdamw, NonFiniteGradientSkipsTheStepOnBoth) {
  std::vector<Spec> s = {{5000, DType::BF16, DType::BF16, true, true},
                         {33, DType::F32, DType::F32, false, true},
                         {9000, DType::F32, DType::BF16, true, false}};
  const ListResult g = run_list(Device{DeviceType::CUDA, 0}, s, 1.0f, true, true);
  const ListResult c = run_list(Device{DeviceType::CPU, 0}, s, 1.0f, true, true);
  ASSERT_EQ(g.tensors.size(), c.tensors.size());
  for (size_t i = 0; i < g.tensors.size(); ++i) ASSERT_TRUE(g.tensors[i] == c.tensors[i]) << "tensor " << i;
}

// ---- the FP8 weight-cache refresh on CUDA ---------------------------------------------------

constexpr int64_t kTokens = 64, kIn = 256, kOut = 144;

struct LoopResult {
  std::vector<std::vector<float>> seen;  // y, dx, dw, states per step, in order
};

LoopResult run_loop(RecipeKind kind, bool refresh) {
  const Device dev{DeviceType::CUDA, 0};
  Context ctx(dev);
  Backend &be = ctx.backend();
  LinearOptions o;
  o.in_features = kIn;
  o.out_features = kOut;
  o.bias = false;
  o.activation_dtype = DType::BF16;
  Linear lin(ctx, o);
  RecipeOptions ro = RecipeOptions::defaults(kind);
  ro.amax_history_len = 4;
  RecipeRef recipe = RecipeRef::adopt(Recipe::create(ro));
  const size_t nw = static_cast<size_t>(kOut * kIn);
  const std::vector<float> w0 = uniform(nw, -0.1f, 0.1f, 3);
  DeviceBuffer p(be, encode(w0, DType::F32)), m(be, nw * 4), v(be, nw * 4);
  DeviceBuffer model(be, encode(w0, DType::BF16)), decoy(be, nw * 2), dw(be, nw * 2);
  DeviceBuffer x(be, static_cast<size_t>(kTokens * kIn) * 2), dy(be, static_cast<size_t>(kTokens * kOut) * 2);
  DeviceBuffer y(be, static_cast<size_t>(kTokens * kOut) * 2), dx(be, static_cast<size_t>(kTokens * kIn) * 2);
  auto view = [&](const DeviceBuffer &b, DType t, int64_t r, int64_t c) { return make_view(b.get(), t, dev, r, c); };
  LoopResult res;
  for (int step = 1; step <= 4; ++step) {
    const auto xb = encode(uniform(static_cast<size_t>(kTokens * kIn), -2, 2, 10 + step), DType::BF16);
    const auto dyb = encode(uniform(static_cast<size_t>(kTokens * kOut), -0.5f, 0.5f, 20 + step), DType::BF16);
    be.copy_from_host(x.get(), xb.data(), xb.size());
    be.copy_from_host(dy.get(), dyb.data(), dyb.size());
    const uint64_t t = ctx.autocast().begin(true, false, recipe.get(), nullptr);
    LinearBackwardCtx *bwd = linear_pool(ctx).acquire_backward_ctx(ctx);
    LinearForwardArgs fa;
    fa.input = view(x, DType::BF16, kTokens, kIn);
    const bool reuse = refresh && step > 1;
    fa.weight = view(reuse ? decoy : model, DType::BF16, kOut, kIn);
    fa.weight_unchanged = reuse;
    linear_forward_compute(ctx, lin, fa, view(y, DType::BF16, kTokens, kOut), bwd->saved, nullptr, nullptr);
    ctx.autocast().end(t);
    LinearBackwardArgs ba;
    ba.dy = view(dy, DType::BF16, kTokens, kOut);
    ba.dx = view(dx, DType::BF16, kTokens, kIn);
    ba.dw = view(dw, DType::BF16, kOut, kIn);
    linear_backward(ctx, *bwd, ba);
    // The states as the step left them, before the update (whose refresh already records the
    // next forward's weight amax / current scale, which the recasting loop does in that forward).
    std::vector<float> states;
    for (TensorRole role : {TensorRole::Input, TensorRole::Weight, TensorRole::GradOutput}) {
      const ScalingState &st = lin.core()->state(role);
      std::vector<float> hist(static_cast<size_t>(st.history_len()));
      float s = 0, si = 0;
      st.read(be, &s, &si, hist.data(), st.history_len());
      states.push_back(s);
      states.push_back(si);
      states.insert(states.end(), hist.begin(), hist.end());
    }
    if (step % 2 == 0) linear_pool(ctx).release(bwd);  // odd steps: the cache is shared at the update
    AdamwParam ap;
    ap.param = view(p, DType::F32, kOut, kIn);
    ap.grad = view(dw, DType::BF16, kOut, kIn);
    ap.exp_avg = view(m, DType::F32, kOut, kIn);
    ap.exp_avg_sq = view(v, DType::F32, kOut, kIn);
    ap.model_weight = view(model, DType::BF16, kOut, kIn);
    if (refresh) {
      ap.owner = &lin.core()->proj;
      ap.rows = kOut;
      ap.cols = kIn;
    }
    AdamwHyper h;
    h.lr = 1e-2f;
    h.step = step;
    h.max_grad_norm = 1.0f;
    adamw_step(ctx, h, &ap, 1);
    if (step % 2 == 1) linear_pool(ctx).release(bwd);
    auto as_floats = [](const std::vector<unsigned char> &b) {
      std::vector<float> f((b.size() + 3) / 4);
      std::memcpy(f.data(), b.data(), b.size());
      return f;
    };
    res.seen.push_back(states);
    res.seen.push_back(as_floats(y.read<unsigned char>()));
    res.seen.push_back(as_floats(dx.read<unsigned char>()));
    res.seen.push_back(as_floats(dw.read<unsigned char>()));
    res.seen.push_back(p.read<float>());
  }
  return res;
}

class CudaAdamwRefresh : public GpuTest, public ::testing::WithParamInterface<RecipeKind> {};

TEST_P(CudaAdamwRefresh, BitIdenticalToRecastingEveryStep) {
  const LoopResult a = run_loop(GetParam(), true), b = run_loop(GetParam(), false);
  ASSERT_EQ(a.seen.size(), b.seen.size());
  const char *what[] = {"scaling states", "y", "dx", "dw", "param"};
  for (size_t i = 0; i < a.seen.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a.seen[i].data(), b.seen[i].data(), a.seen[i].size() * sizeof(float)))
        << what[i % 5] << " at step " << i / 5 + 1;
}

INSTANTIATE_TEST_SUITE_P(Recipes, CudaAdamwRefresh,
                         ::testing::Values(RecipeKind::Delayed, RecipeKind::Current, RecipeKind::Block));

}  // namespace
}  // namespace te::gpu_test
