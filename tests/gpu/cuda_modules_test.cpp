// LayerNormLinear, LayerNormMLP and GroupedLinear on a CUDA context against the same modules on
// the CPU reference, for the three recipes (and both norms, three activations): two training steps each (delayed scaling then
// runs with updated scales), outputs and gradients compared within GEMM tolerance. The norm's
// statistics and its fused FP8 output are bit-identical across backends by construction
// (numerics/norm.h), so LayerNormLinear's input scaling state (fed by the fused norm's amax) and
// weight state must match bit for bit.
#include <cmath>
#include <cstring>
#include <random>

#include "context/context.h"
#include "gpu/gpu_test_support.h"
#include "modules/grouped_linear/grouped_linear.h"
#include "modules/layernorm_linear/layernorm_linear.h"
#include "modules/layernorm_mlp/layernorm_mlp.h"

namespace te::gpu_test {
namespace {

constexpr int64_t kTokens = 64, kHidden = 256, kOut = 144, kFfn = 192;

std::vector<float> randn(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float &x : v) x = dist(rng);
  return v;
}

std::vector<float> read_state(Backend &be, const ScalingState &st) {
  std::vector<float> h(static_cast<size_t>(st.history_len()));
  float s = 0, si = 0;
  st.read(be, &s, &si, h.data(), st.history_len());
  h.push_back(s);
  h.push_back(si);
  return h;
}

TensorView vec_view(const DeviceBuffer &b, Device d, int64_t n) {
  TensorView v = make_view(b.get(), DType::F32, d, n, 1);
  v.ndim = 1;
  return v;
}

struct Result {
  std::vector<std::vector<float>> outputs;  // compared within tolerance
  std::vector<std::vector<float>> states;   // compared bit for bit
  // outputs[i] for i >= requantized_from lie downstream of a tensor the module computes and
  // quantizes itself (LayerNormMLP: fc2's input act(fc1 output), whose current-scaling amax and
  // ReLU signs follow the backends' ulp-level GEMM differences; d(fc1 output), to E5M2): see
  // compare(). Measured on an H100: at most 0.7% normwise.
  size_t requantized_from = SIZE_MAX;
};

RecipeRef make_recipe(RecipeKind kind) {
  RecipeOptions ro = RecipeOptions::defaults(kind);
  ro.amax_history_len = 8;
  return RecipeRef::adopt(Recipe::create(ro));
}

Result run_ln_linear(Device device, RecipeKind kind, NormKind norm) {
  Context ctx(device);
  Backend &be = ctx.backend();
  LayerNormLinearOptions o;
  o.in_features = kHidden;
  o.out_features = kOut;
  o.activation_dtype = DType::F32;
  o.norm.kind = norm;
  LayerNormLinear m(ctx, o);
  RecipeRef recipe = make_recipe(kind);
  DeviceBuffer x(be, randn(kTokens * kHidden, 1.0f, 1)), g(be, randn(kHidden, 0.2f, 2)),
      beta(be, randn(kHidden, 0.1f, 3)), w(be, randn(kOut * kHidden, 0.05f, 4)), b(be, randn(kOut, 0.1f, 5)),
      dy(be, randn(kTokens * kOut, 0.01f, 6));
  DeviceBuffer y(be, kTokens * kOut * 4), ln(be, kTokens * kHidden * 4), dx(be, kTokens * kHidden * 4),
      dg(be, kHidden * 4), db_ln(be, kHidden * 4), dw(be, kOut * kHidden * 4), db(be, kOut * 4);
  for (int step = 0; step < 2; ++step) {
    uint64_t t = ctx.autocast().begin(true, false, recipe.get(), nullptr);
    LayerNormLinearForwardArgs a;
    a.input = make_view(x.get(), DType::F32, device, kTokens, kHidden);
    a.ln_weight = vec_view(g, device, kHidden);
    if (norm == NormKind::LayerNorm) a.ln_bias = vec_view(beta, device, kHidden);
    a.weight = make_view(w.get(), DType::F32, device, kOut, kHidden);
    a.bias = vec_view(b, device, kOut);
    a.ln_out = make_view(ln.get(), DType::F32, device, kTokens, kHidden);
    LayerNormLinearBackwardCtx *bwd = layernorm_linear_pools(ctx).backward.acquire(ctx);
    bwd->saved = layernorm_linear_forward_compute(ctx, m, a, make_view(y.get(), DType::F32, device, kTokens, kOut));
    ctx.autocast().end(t);
    LayerNormLinearGrads gr;
    gr.dx = make_view(dx.get(), DType::F32, device, kTokens, kHidden);
    gr.dgamma = vec_view(dg, device, kHidden);
    if (norm == NormKind::LayerNorm) gr.dbeta = vec_view(db_ln, device, kHidden);
    gr.dw = make_view(dw.get(), DType::F32, device, kOut, kHidden);
    gr.db = vec_view(db, device, kOut);
    layernorm_linear_backward(ctx, *bwd, make_view(dy.get(), DType::F32, device, kTokens, kOut), gr, false);
    layernorm_linear_pools(ctx).backward.release(bwd);
  }
  Result r;
  r.outputs = {y.read<float>(), ln.read<float>(), dx.read<float>(), dg.read<float>(), dw.read<float>(),
               db.read<float>()};
  if (norm == NormKind::LayerNorm) r.outputs.push_back(db_ln.read<float>());
  const ProjectionState &p = m.core()->proj;
  // grad_output: dy is the same on both; its update is the one the norm backward carries.
  r.states = {read_state(be, p.input), read_state(be, p.weight), read_state(be, p.grad_output)};
  return r;
}

Result run_ln_mlp(Device device, RecipeKind kind, Activation act) {
  Context ctx(device);
  Backend &be = ctx.backend();
  LayerNormMlpOptions o;
  o.hidden = kHidden;
  o.ffn = kFfn;
  o.activation = act;
  o.activation_dtype = DType::F32;
  LayerNormMlp m(ctx, o);
  const int64_t f1 = o.fc1_out();
  RecipeRef recipe = make_recipe(kind);
  DeviceBuffer x(be, randn(kTokens * kHidden, 1.0f, 11)), g(be, randn(kHidden, 0.2f, 12)),
      beta(be, randn(kHidden, 0.1f, 13)), w1(be, randn(f1 * kHidden, 0.05f, 14)), b1(be, randn(f1, 0.1f, 15)),
      w2(be, randn(kHidden * kFfn, 0.05f, 16)), b2(be, randn(kHidden, 0.1f, 17)),
      dy(be, randn(kTokens * kHidden, 0.01f, 18));
  DeviceBuffer y(be, kTokens * kHidden * 4), dx(be, kTokens * kHidden * 4), dg(be, kHidden * 4),
      dbeta(be, kHidden * 4), dw1(be, f1 * kHidden * 4), db1(be, f1 * 4), dw2(be, kHidden * kFfn * 4),
      db2(be, kHidden * 4);
  for (int step = 0; step < 2; ++step) {
    uint64_t t = ctx.autocast().begin(true, false, recipe.get(), nullptr);
    LayerNormMlpForwardArgs a;
    a.input = make_view(x.get(), DType::F32, device, kTokens, kHidden);
    a.ln_weight = vec_view(g, device, kHidden);
    a.ln_bias = vec_view(beta, device, kHidden);
    a.fc1_weight = make_view(w1.get(), DType::F32, device, f1, kHidden);
    a.fc1_bias = vec_view(b1, device, f1);
    a.fc2_weight = make_view(w2.get(), DType::F32, device, kHidden, kFfn);
    a.fc2_bias = vec_view(b2, device, kHidden);
    LayerNormMlpBackwardCtx *bwd = layernorm_mlp_pools(ctx).backward.acquire(ctx);
    bwd->saved = layernorm_mlp_forward_compute(ctx, m, a, make_view(y.get(), DType::F32, device, kTokens, kHidden));
    ctx.autocast().end(t);
    LayerNormMlpGrads gr;
    gr.dx = make_view(dx.get(), DType::F32, device, kTokens, kHidden);
    gr.dgamma = vec_view(dg, device, kHidden);
    gr.dbeta = vec_view(dbeta, device, kHidden);
    gr.dfc1_w = make_view(dw1.get(), DType::F32, device, f1, kHidden);
    gr.dfc1_b = vec_view(db1, device, f1);
    gr.dfc2_w = make_view(dw2.get(), DType::F32, device, kHidden, kFfn);
    gr.dfc2_b = vec_view(db2, device, kHidden);
    layernorm_mlp_backward(ctx, *bwd, make_view(dy.get(), DType::F32, device, kTokens, kHidden), gr, false);
    layernorm_mlp_pools(ctx).backward.release(bwd);
  }
  Result r;
  r.outputs = {y.read<float>(),   dw2.read<float>(), db2.read<float>(), dx.read<float>(),
               dg.read<float>(),  dbeta.read<float>(), dw1.read<float>(), db1.read<float>()};
  r.requantized_from = 0;
  // fc1's input state is fed by the fused norm (bit-identical); fc2's input follows the
  // activation, whose transcendental functions may differ by an ulp between libm and CUDA.
  r.states = {read_state(be, m.core()->fc1.input), read_state(be, m.core()->fc1.weight),
              read_state(be, m.core()->fc2.weight), read_state(be, m.core()->fc2.grad_output)};
  return r;
}

// Experts over uneven splits, some empty, most not multiples of 16 (padded inside). Eleven
// experts cross run_all's batches of 8 quantizations per call; forty its batches of 32 small
// GEMMs per launch and zero_many's 32 ranges per launch (the empty experts' dW and db).
Result run_grouped(Device device, RecipeKind kind, const std::vector<int64_t> &splits) {
  const int experts = static_cast<int>(splits.size());
  int64_t tokens = 0;
  for (int64_t s : splits) tokens += s;
  const int64_t in = 128, out = 96;
  Context ctx(device);
  Backend &be = ctx.backend();
  GroupedLinearOptions o;
  o.num_gemms = experts;
  o.in_features = in;
  o.out_features = out;
  o.activation_dtype = DType::F32;
  GroupedLinear m(ctx, o);
  RecipeRef recipe = make_recipe(kind);
  DeviceBuffer x(be, randn(tokens * in, 1.0f, 31)), dy(be, randn(tokens * out, 0.01f, 32));
  DeviceBuffer y(be, tokens * out * 4), dx(be, tokens * in * 4);
  std::vector<DeviceBuffer> w, b, dw, db;
  std::vector<TensorView> wv, bv, dwv, dbv;
  for (int e = 0; e < experts; ++e) {
    w.emplace_back(be, randn(out * in, 0.05f, 40 + e));
    b.emplace_back(be, randn(out, 0.1f, 50 + e));
    dw.emplace_back(be, out * in * 4);
    db.emplace_back(be, out * 4);
  }
  for (int e = 0; e < experts; ++e) {
    wv.push_back(make_view(w[e].get(), DType::F32, device, out, in));
    bv.push_back(vec_view(b[e], device, out));
    dwv.push_back(make_view(dw[e].get(), DType::F32, device, out, in));
    dbv.push_back(vec_view(db[e], device, out));
  }
  for (int step = 0; step < 2; ++step) {
    uint64_t t = ctx.autocast().begin(true, false, recipe.get(), nullptr);
    GroupedLinearForwardArgs a;
    a.input = make_view(x.get(), DType::F32, device, tokens, in);
    a.m_splits = splits.data();
    a.weights = wv.data();
    a.biases = bv.data();
    GroupedLinearBackwardCtx *bwd = grouped_linear_pools(ctx).backward.acquire(ctx);
    bwd->saved = grouped_linear_forward_compute(ctx, m, a, make_view(y.get(), DType::F32, device, tokens, out));
    ctx.autocast().end(t);
    GroupedLinearBackwardArgs ba;
    ba.dy = make_view(dy.get(), DType::F32, device, tokens, out);
    ba.dx = make_view(dx.get(), DType::F32, device, tokens, in);
    ba.dw = dwv.data();
    ba.db = dbv.data();
    grouped_linear_backward(ctx, *bwd, ba);
    grouped_linear_pools(ctx).backward.release(bwd);
  }
  Result r;
  r.outputs = {y.read<float>(), dx.read<float>()};
  for (int e = 0; e < experts; ++e) {
    r.outputs.push_back(dw[e].read<float>());
    r.outputs.push_back(db[e].read<float>());
    r.states.push_back(read_state(be, m.core()->experts[e].input));
    r.states.push_back(read_state(be, m.core()->experts[e].weight));
    r.states.push_back(read_state(be, m.core()->experts[e].grad_output));
  }
  return r;
}

// The backends differ in accumulation order only (and by an ulp in transcendental functions),
// but an ulp upstream of a quantization can move an element by one FP8 step (2^-3 relative for
// E4M3, 2^-2 for E5M2). So: isolated elements within 2% of the tensor's largest magnitude, and
// the normwise relative error below 0.5%, which a wrong operand, sign or scale far exceeds.
void expect_close(const std::vector<float> &got, const std::vector<float> &want, const std::string &what,
                  double element_tol = 2e-2, double norm_tol = 5e-3) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " [" << i << "]";
    ASSERT_NEAR(got[i], want[i], element_tol * scale + 1e-6) << what << " [" << i << "]";
    err2 += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
    ref2 += static_cast<double>(want[i]) * want[i];
  }
  EXPECT_LE(std::sqrt(err2 / (ref2 + 1e-30)), norm_tol) << what << ": normwise relative error";
}

void compare(const Result &gpu, const Result &cpu) {
  ASSERT_EQ(gpu.outputs.size(), cpu.outputs.size());
  for (size_t i = 0; i < gpu.outputs.size(); ++i) {
    double ref = 0;
    for (float v : cpu.outputs[i]) ref = std::max(ref, static_cast<double>(std::fabs(v)));
    if (ref == 0) {  // an expert without tokens: exact zeros on both
      EXPECT_EQ(gpu.outputs[i], cpu.outputs[i]) << "output " << i;
      continue;
    }
    // Downstream of a tensor the module requantizes, the backends' ulp-level differences
    // choose other FP8 codes (a 12.5% E4M3 or 25% E5M2 step) for some elements: under current scaling the amax,
    // hence the scale of every element, may differ; under ReLU an fc1 output near 0 may take
    // the other side. So one E5M2 step of the tensor's scale per element, and 3% normwise —
    // still far below what a wrong operand, transpose or scale gives (O(100%)).
    if (i >= cpu.requantized_from)
      expect_close(gpu.outputs[i], cpu.outputs[i], "output " + std::to_string(i), 0.25, 3e-2);
    else
      expect_close(gpu.outputs[i], cpu.outputs[i], "output " + std::to_string(i));
  }
  ASSERT_EQ(gpu.states.size(), cpu.states.size());
  for (size_t i = 0; i < gpu.states.size(); ++i) {
    ASSERT_EQ(gpu.states[i].size(), cpu.states[i].size());
    EXPECT_EQ(std::memcmp(gpu.states[i].data(), cpu.states[i].data(), gpu.states[i].size() * sizeof(float)), 0)
        << "scaling state " << i << " differs between the CUDA and CPU backends";
  }
}

class CudaLayerNormLinear : public GpuTest,
                            public ::testing::WithParamInterface<std::tuple<RecipeKind, NormKind>> {};

TEST_P(CudaLayerNormLinear, MatchesCpuReference) {
  const auto [kind, norm] = GetParam();
  compare(run_ln_linear(Device{DeviceType::CUDA, 0}, kind, norm), run_ln_linear(Device{DeviceType::CPU, 0}, kind, norm));
}

INSTANTIATE_TEST_SUITE_P(Recipes, CudaLayerNormLinear,
                         ::testing::Combine(::testing::Values(RecipeKind::Delayed, RecipeKind::Current, RecipeKind::Block),
                                            ::testing::Values(NormKind::LayerNorm, NormKind::RMSNorm)));

class CudaLayerNormMlp : public GpuTest,
                         public ::testing::WithParamInterface<std::tuple<RecipeKind, Activation>> {};

TEST_P(CudaLayerNormMlp, MatchesCpuReference) {
  const auto [kind, act] = GetParam();
  compare(run_ln_mlp(Device{DeviceType::CUDA, 0}, kind, act), run_ln_mlp(Device{DeviceType::CPU, 0}, kind, act));
}

INSTANTIATE_TEST_SUITE_P(Recipes, CudaLayerNormMlp,
                         ::testing::Combine(::testing::Values(RecipeKind::Delayed, RecipeKind::Current, RecipeKind::Block),
                                            ::testing::Values(Activation::GELU, Activation::SwiGLU, Activation::ReLU)));

class CudaGroupedLinear : public GpuTest, public ::testing::WithParamInterface<RecipeKind> {};

TEST_P(CudaGroupedLinear, MatchesCpuReference) {
  const std::vector<int64_t> splits = {37, 0, 64, 27};
  compare(run_grouped(Device{DeviceType::CUDA, 0}, GetParam(), splits),
          run_grouped(Device{DeviceType::CPU, 0}, GetParam(), splits));
}

TEST_P(CudaGroupedLinear, ElevenExpertsMatchCpuReference) {
  const std::vector<int64_t> splits = {37, 0, 64, 27, 5, 16, 0, 33, 1, 18, 55};
  compare(run_grouped(Device{DeviceType::CUDA, 0}, GetParam(), splits),
          run_grouped(Device{DeviceType::CPU, 0}, GetParam(), splits));
}

TEST_P(CudaGroupedLinear, FortyExpertsMatchCpuReference) {
  std::vector<int64_t> splits;
  for (int e = 0; e < 40; ++e) splits.push_back(e % 9 < 4 ? 0 : (e * 7) % 23 + 1);  // 17 without tokens
  compare(run_grouped(Device{DeviceType::CUDA, 0}, GetParam(), splits),
          run_grouped(Device{DeviceType::CPU, 0}, GetParam(), splits));
}

INSTANTIATE_TEST_SUITE_P(Recipes, CudaGroupedLinear,
                         ::testing::Values(RecipeKind::Delayed, RecipeKind::Current, RecipeKind::Block));

}  // namespace
}  // namespace te::gpu_test
