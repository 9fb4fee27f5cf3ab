// A whole FP8 training step (autocast begin, forward, autocast end with its scale update,
// backward with its gradient-scale update, an SGD step) captured in a CUDA graph and replayed
// gives bit-identical weights and scaling states to the same steps run eagerly: nothing in the
// step synchronises the host, allocates outside stream order, or reads state back. Also when the
// context is switched to the capturing stream inside the capture, with blocks of its previous
// stream cached (PyTorch's torch.cuda.graph does that).
#include "backends/backend.h"  // TE_HAVE_CUDA_BACKEND

#if TE_HAVE_CUDA_BACKEND
#include <cuda_runtime.h>

#include <cstring>
#include <random>

#include "gpu/gpu_test_support.h"
#include "context/context.h"
#include "modules/linear/linear.h"
#include "support/state_snapshot.h"

namespace te::gpu_test {
namespace {

constexpr int64_t kTokens = 64, kIn = 128, kOut = 96;
constexpr float kLearningRate = 0.05f;

// One model (a bias-free FP8 linear layer, F32 activations) and its training step.
struct Trainer {
  Context ctx{Device{DeviceType::CUDA, 0}};
  Linear lin;
  RecipeRef recipe;
  Buffer x, w, y, dy, dw, sgd;

  static LinearOptions options() {
    LinearOptions o;
    o.in_features = kIn;
    o.out_features = kOut;
    o.bias = false;
    o.activation_dtype = DType::F32;
    return o;
  }

  Trainer(cudaStream_t stream, const std::vector<float> &x0, const std::vector<float> &w0,
          const std::vector<float> &dy0)
      : lin(ctx, options()) {
    ctx.backend().set_stream(stream);
    RecipeOptions ro = RecipeOptions::defaults(RecipeKind::Delayed);
    ro.amax_history_len = 4;
    recipe = RecipeRef::adopt(Recipe::create(ro));
    Backend &be = ctx.backend();
    auto upload = [&](Buffer &b, const std::vector<float> &v) {
      b = Buffer(&be, v.size() * sizeof(float));
      be.copy_from_host(b.get(), v.data(), v.size() * sizeof(float));
    };
    upload(x, x0);
    upload(w, w0);
    upload(dy, dy0);
    upload(y, std::vector<float>(kTokens * kOut));
    upload(dw, std::vector<float>(kOut * kIn));
    // SGD as a GEMM: W += dW (-lr I)^T, so that the optimizer step runs on the stream too.
    std::vector<float> eye(kIn * kIn, 0.0f);
    for (int64_t i = 0; i < kIn; ++i) eye[i * kIn + i] = -kLearningRate;
    upload(sgd, eye);
  }

  TensorView view(const Buffer &b, int64_t rows, int64_t cols) {
    return make_view(b.get(), DType::F32, ctx.device(), rows, cols);
  }

  void step() { backward(forward()); }

  // begin, forward, end: the backward context.
  LinearBackwardCtx *forward() {
    Autocast &ac = ctx.autocast();
    uint64_t token = ac.begin(true, false, recipe.get(), nullptr);
    LinearBackwardCtx *bwd = linear_pool(ctx).acquire_backward_ctx(ctx);
    LinearForwardArgs fa;
    fa.input = view(x, kTokens, kIn);
    fa.weight = view(w, kOut, kIn);
    linear_forward_compute(ctx, lin, fa, view(y, kTokens, kOut), bwd->saved, nullptr, nullptr);
    ac.end(token);
    return bwd;
  }

  // The backward and the SGD step; `release`: the backward frees the context and its residuals.
  void backward(LinearBackwardCtx *bwd, bool release = true) {
    LinearBackwardArgs ba;
    ba.dy = view(dy, kTokens, kOut);
    ba.dw = view(dw, kOut, kIn);
    ba.once = release;
    linear_backward(ctx, *bwd, ba);
    if (release) linear_pool(ctx).release(bwd);
    GemmArgs g;
    g.a = view(dw, kOut, kIn);
    g.b = view(sgd, kIn, kIn);
    g.transb = true;
    g.d = view(w, kOut, kIn);
    g.accumulate = true;
    ctx.backend().gemm(g);
  }

  // Weights, then each scaling state's scale, scale_inv and history, as raw bytes.
  std::vector<float> snapshot() {
    std::vector<float> out(kOut * kIn);
    ctx.backend().copy_to_host(out.data(), w.get(), out.size() * sizeof(float));
    test_support::append_scaling_states(ctx.backend(), lin.core()->proj, out);
    return out;
  }
};

// The model's initial weights and the step's input and gradient.
struct StepData {
  std::vector<float> x0, w0, dy0;
  StepData() : x0(kTokens * kIn), w0(kOut * kIn), dy0(kTokens * kOut) {
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float &v : x0) v = dist(rng);
    for (float &v : w0) v = 0.1f * dist(rng);
    for (float &v : dy0) v = 0.01f * dist(rng);
  }
};

// 10 eager steps on `stream`: the weights and scaling states after them.
std::vector<float> eager_state(cudaStream_t stream, const StepData &d) {
  Trainer eager(stream, d.x0, d.w0, d.dy0);
  for (int i = 0; i < 10; ++i) eager.step();
  return eager.snapshot();
}

// One eager step on `warm` (first use: scaling states, plans and caches are made outside the
// graph), then a step captured on `capture` with the context switched to it inside the capture
// when the two differ (what torch.cuda.graph does), replayed 9 times; the state after them.
std::vector<float> graphed_state(cudaStream_t warm, cudaStream_t capture, const StepData &d) {
  Trainer graphed(warm, d.x0, d.w0, d.dy0);
  graphed.step();
  EXPECT_EQ(cudaStreamSynchronize(warm), cudaSuccess);
  cudaGraph_t graph;
  EXPECT_EQ(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal), cudaSuccess);
  // Blocks freed on `warm` are cached for it: freeing them now, on any stream, would
  // invalidate the capture (the context defers that to its next stream that is not capturing).
  graphed.ctx.backend().set_stream(capture);
  graphed.step();
  const cudaError_t ended = cudaStreamEndCapture(capture, &graph);
  EXPECT_EQ(ended, cudaSuccess) << "the capture was invalidated: " << cudaGetErrorString(ended);
  if (ended != cudaSuccess) return {};
  cudaGraphExec_t exec;
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(cudaGraphLaunch(exec, capture), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(capture), cudaSuccess);
  graphed.ctx.backend().set_stream(warm);  // back: the deferred blocks go to the pool now
  std::vector<float> state = graphed.snapshot();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return state;
}

void expect_same_training(const std::vector<float> &graph_state, const std::vector<float> &eager_state,
                          const StepData &d) {
  ASSERT_EQ(graph_state.size(), eager_state.size());
  EXPECT_EQ(std::memcmp(graph_state.data(), eager_state.data(), graph_state.size() * sizeof(float)), 0)
      << "a captured step replayed 9 times differs from 10 eager steps";
  // The steps really trained: the weights moved.
  EXPECT_NE(std::memcmp(eager_state.data(), d.w0.data(), d.w0.size() * sizeof(float)), 0);
}

// Two non-blocking streams for one test.
struct TwoStreams {
  cudaStream_t s1 = nullptr, s2 = nullptr;
  TwoStreams() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  }
  ~TwoStreams() {
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
  }
};

// A warm-up step, then a step whose forward's scale update is enqueued before its backward (the
// order the library had before deferring it): the reference for the two tests below.
std::vector<float> reference_state(cudaStream_t stream, const StepData &d) {
  Trainer ref(stream, d.x0, d.w0, d.dy0);
  ref.step();
  LinearBackwardCtx *bwd = ref.forward();
  ref.ctx.autocast().settle();
  ref.backward(bwd);
  return ref.snapshot();
}

// Ends a capture that a failed test left open, so that the thread's next tests are not run under
// it (global capture mode forbids their allocations).
struct CaptureGuard {
  cudaStream_t stream;
  bool open = true;
  explicit CaptureGuard(cudaStream_t s) : stream(s) {
    EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  }
  cudaGraph_t end() {
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
    open = false;
    return g;
  }
  ~CaptureGuard() {
    if (!open) return;
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
  }
};

// A warm-up step on s1, then an eager forward whose scale update is deferred.
struct AfterEagerForward {
  StepData d;
  TwoStreams s;
  Trainer t{s.s1, d.x0, d.w0, d.dy0};
  LinearBackwardCtx *bwd = nullptr;
  AfterEagerForward() {
    t.step();
    bwd = t.forward();
  }
  // The state now must be reference_state's, bit for bit.
  void expect_reference_state() {
    const std::vector<float> got = t.snapshot(), want = reference_state(s.s2, d);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
};

TEST_F(GpuTest, CudaGraphOfABackwardLeavesOutTheEagerForwardsDeferredUpdate) {
  // Eager forward (its update deferred), backward captured: the graph must not contain the
  // forward's update (every replay would repeat it); it stays pending until the next eager call.
  // The backward keeps its context: residuals allocated outside a graph must outlive it.
  AfterEagerForward a;
  Trainer &t = a.t;
  const TwoStreams &s = a.s;
  LinearBackwardCtx *bwd = a.bwd;
  ASSERT_TRUE(t.ctx.autocast().deferred());
  cudaGraph_t graph;
  {
    CaptureGuard capture(s.s1);
    t.backward(bwd, false);
    graph = capture.end();
  }
  ASSERT_NE(graph, nullptr);
  EXPECT_TRUE(t.ctx.autocast().deferred());
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s.s1), cudaSuccess);
  t.ctx.autocast().settle();
  EXPECT_FALSE(t.ctx.autocast().deferred());
  a.expect_reference_state();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  linear_pool(t.ctx).release(bwd);
}

TEST_F(GpuTest, CudaGraphOfABackwardThatFreesEagerResidualsKeepsTheCaptureValid) {
  // The captured backward releases its context: the residuals the eager forward allocated are
  // freed during the capture. A captured free must be of a graph allocation, so the backend holds
  // them until its next call that is not capturing: the capture stays valid, no CUDA error is
  // left for the next launch, and the replay computes what the eager order does.
  AfterEagerForward a;
  Trainer &t = a.t;
  cudaGraph_t graph;
  {
    CaptureGuard capture(a.s.s1);
    t.backward(a.bwd, true);
    graph = capture.end();
  }
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, a.s.s1), cudaSuccess);
  t.ctx.autocast().settle();
  a.expect_reference_state();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  // The held blocks went back to the cache at the first eager call: further eager steps run.
  for (int i = 0; i < 2; ++i) t.step();
  EXPECT_EQ(cudaStreamSynchronize(a.s.s1), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(GpuTest, CudaGraphCaptureRefusesABeginWhileAnEagerUpdateIsDeferred) {
  // The next pass's begin would have to enqueue the deferred update into the capture: it fails
  // with InvalidState instead and changes nothing; the update still runs, eagerly, later.
  AfterEagerForward a;
  Trainer &t = a.t;
  ASSERT_TRUE(t.ctx.autocast().deferred());
  Status status = Status::Success;
  {
    CaptureGuard capture(a.s.s1);
    try {
      t.ctx.autocast().begin(true, false, t.recipe.get(), nullptr);
    } catch (const Error &e) {
      status = e.status();
    }
    if (cudaGraph_t graph = capture.end()) cudaGraphDestroy(graph);
  }
  EXPECT_EQ(status, Status::InvalidState);
  EXPECT_EQ(t.ctx.autocast().depth(), 0);
  EXPECT_TRUE(t.ctx.autocast().deferred());
  t.backward(a.bwd);  // eager: takes the deferred update into its own launch
  EXPECT_FALSE(t.ctx.autocast().deferred());
  a.expect_reference_state();
}

TEST_F(GpuTest, CudaGraphTrainingStepReplaysBitIdentically) {
  const StepData d;
  const TwoStreams s;
  expect_same_training(graphed_state(s.s2, s.s2, d), eager_state(s.s1, d), d);
}

TEST_F(GpuTest, CudaGraphCapturesAfterAStreamSwitchInsideTheCapture) {
  const StepData d;
  const TwoStreams s;
  expect_same_training(graphed_state(s.s1, s.s2, d), eager_state(s.s1, d), d);
}

}  // namespace
}  // namespace te::gpu_test
#endif  // TE_HAVE_CUDA_BACKEND
