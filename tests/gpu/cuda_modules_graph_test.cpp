// A transformer block's FP8 training step (autocast begin, LayerNormLinear and LayerNormMLP
// forwards, autocast end with its scale update, both backwards with their gradient-scale update)
// captured in a CUDA graph and replayed gives bit-identical outputs, gradients and scaling states
// to the same steps run eagerly: the modules' steps synchronise nothing, allocate only in stream
// order from the cache, and read no state back.
#include "backends/backend.h"  // TE_HAVE_CUDA_BACKEND

#if TE_HAVE_CUDA_BACKEND
#include <cuda_runtime.h>

#include <cstring>
#include <random>

#include "context/context.h"
#include "gpu/gpu_test_support.h"
#include "modules/layernorm_linear/layernorm_linear.h"
#include "modules/layernorm_mlp/layernorm_mlp.h"
#include "support/state_snapshot.h"

namespace te::gpu_test {
namespace {

constexpr int64_t kTokens = 64, kHidden = 128, kQkv = 96, kFfn = 160;

std::vector<float> randn(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float &x : v) x = dist(rng);
  return v;
}

struct Block {
  Context ctx{Device{DeviceType::CUDA, 0}};
  LayerNormLinear qkv;
  LayerNormMlp mlp;
  RecipeRef recipe;
  std::vector<Buffer> bufs;
  enum { X, G, B, WQ, Y1, DY1, DX1, DWQ, W1, W2, Y2, DY2, DX2, DW1, DW2, N };

  static LayerNormLinearOptions qkv_options() {
    LayerNormLinearOptions o;
    o.in_features = kHidden;
    o.out_features = kQkv;
    o.bias = false;
    o.activation_dtype = DType::F32;
    return o;
  }
  static LayerNormMlpOptions mlp_options() {
    LayerNormMlpOptions o;
    o.hidden = kHidden;
    o.ffn = kFfn;
    o.bias = false;
    o.activation = Activation::SwiGLU;
    o.activation_dtype = DType::F32;
    o.norm.kind = NormKind::RMSNorm;
    return o;
  }

  explicit Block(cudaStream_t stream) : qkv(ctx, qkv_options()), mlp(ctx, mlp_options()) {
    ctx.backend().set_stream(stream);
    RecipeOptions ro = RecipeOptions::defaults(RecipeKind::Delayed);
    ro.amax_history_len = 4;
    recipe = RecipeRef::adopt(Recipe::create(ro));
    const size_t sizes[N] = {kTokens * kHidden, kHidden, kHidden, kQkv * kHidden, kTokens * kQkv, kTokens * kQkv,
                             kTokens * kHidden, kQkv * kHidden, 2 * kFfn * kHidden, kHidden * kFfn, kTokens * kHidden,
                             kTokens * kHidden, kTokens * kHidden, 2 * kFfn * kHidden, kHidden * kFfn};
    const float sigmas[N] = {1, 0.2f, 0.1f, 0.05f, 0, 0.01f, 0, 0, 0.05f, 0.05f, 0, 0.01f, 0, 0, 0};
    Backend &be = ctx.backend();
    for (int i = 0; i < N; ++i) {
      std::vector<float> v = sigmas[i] > 0 ? randn(sizes[i], sigmas[i], 100 + i) : std::vector<float>(sizes[i]);
      if (i == G) for (float &g : v) g += 1.0f;
      bufs.emplace_back(&be, v.size() * sizeof(float));
      be.copy_from_host(bufs.back().get(), v.data(), v.size() * sizeof(float));
    }
  }
  TensorView m(int i, int64_t r, int64_t c) { return make_view(bufs[i].get(), DType::F32, ctx.device(), r, c); }
  TensorView v(int i, int64_t n) {
    TensorView t = m(i, n, 1);
    t.ndim = 1;
    return t;
  }

  void step() {
    Autocast &ac = ctx.autocast();
    const uint64_t token = ac.begin(true, false, recipe.get(), nullptr);
    LayerNormLinearBackwardCtx *b1 = layernorm_linear_pools(ctx).backward.acquire(ctx);
    LayerNormLinearForwardArgs a1;
    a1.input = m(X, kTokens, kHidden);
    a1.ln_weight = v(G, kHidden);
    a1.ln_bias = v(B, kHidden);
    a1.weight = m(WQ, kQkv, kHidden);
    b1->saved = layernorm_linear_forward_compute(ctx, qkv, a1, m(Y1, kTokens, kQkv));
    LayerNormMlpBackwardCtx *b2 = layernorm_mlp_pools(ctx).backward.acquire(ctx);
    LayerNormMlpForwardArgs a2;
    a2.input = m(X, kTokens, kHidden);
    a2.ln_weight = v(G, kHidden);
    a2.fc1_weight = m(W1, 2 * kFfn, kHidden);
    a2.fc2_weight = m(W2, kHidden, kFfn);
    b2->saved = layernorm_mlp_forward_compute(ctx, mlp, a2, m(Y2, kTokens, kHidden));
    ac.end(token);
    LayerNormMlpGrads g2;
    g2.dx = m(DX2, kTokens, kHidden);
    g2.dfc1_w = m(DW1, 2 * kFfn, kHidden);
    g2.dfc2_w = m(DW2, kHidden, kFfn);
    layernorm_mlp_backward(ctx, *b2, m(DY2, kTokens, kHidden), g2, true);
    layernorm_mlp_pools(ctx).backward.release(b2);
    LayerNormLinearGrads g1;
    g1.dx = m(DX1, kTokens, kHidden);
    g1.dw = m(DWQ, kQkv, kHidden);
    layernorm_linear_backward(ctx, *b1, m(DY1, kTokens, kQkv), g1, true);
    layernorm_linear_pools(ctx).backward.release(b1);
  }

  // Outputs, gradients and every scaling state, as raw floats.
  std::vector<float> snapshot() {
    std::vector<float> out;
    Backend &be = ctx.backend();
    for (int i : {Y1, DX1, DWQ, Y2, DX2, DW1, DW2}) {
      std::vector<float> h(bufs[i].bytes() / sizeof(float));
      be.copy_to_host(h.data(), bufs[i].get(), bufs[i].bytes());
      out.insert(out.end(), h.begin(), h.end());
    }
    for (const ProjectionState *p : {&qkv.core()->proj, &mlp.core()->fc1, &mlp.core()->fc2})
      test_support::append_scaling_states(be, *p, out);
    return out;
  }
};

TEST_F(GpuTest, CudaGraphModulesStepReplaysBitIdentically) {
  cudaStream_t s1, s2;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  std::vector<float> eager_state, graph_state;
  {
    Block eager(s1);
    for (int i = 0; i < 6; ++i) eager.step();
    eager_state = eager.snapshot();
  }
  {
    Block graphed(s2);
    graphed.step();  // first use: scaling states, plans and caches are made outside the graph
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal), cudaSuccess);
    graphed.step();
    ASSERT_EQ(cudaStreamEndCapture(s2, &graph), cudaSuccess);
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int i = 0; i < 5; ++i) ASSERT_EQ(cudaGraphLaunch(exec, s2), cudaSuccess);
    graph_state = graphed.snapshot();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  ASSERT_EQ(graph_state.size(), eager_state.size());
  EXPECT_EQ(std::memcmp(graph_state.data(), eager_state.data(), graph_state.size() * sizeof(float)), 0)
      << "a captured step replayed 5 times differs from 6 eager steps";
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

}  // namespace
}  // namespace te::gpu_test
#endif  // TE_HAVE_CUDA_BACKEND
