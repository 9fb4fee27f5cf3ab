// NCCL process groups over N ranks (argv[1], default 2), one process and one GPU each, each rank
// feeding different data. Public API only (te/te.h), plus CUDA and NCCL for what a program does
// around libte. Cases, in order, every rank:
//  calls      NCCL's own log (NCCL_DEBUG=INFO, SUBSYS=COLL) counts ncclAllReduce calls: a training
//             step (forward scope + backward) makes exactly one per bucket and pass, i.e. 2 for
//             1, 2, 8 or 48 layers, and 4 with two recipes interleaved layer by layer (their
//             amaxes are then not side by side and are gathered first). Calibrated first: N bare
//             all-reduces must count N.
//  global     after those steps every rank holds the global max amax in its histories, and all
//             scaling states are bit-identical across ranks (dumped; the parent compares).
//  borrowed   a group over the program's own communicator (te_group_create_nccl) reduces the same
//             way; te_group_abort refuses it; destroying the group leaves the communicator usable.
//  current    current scaling reduces each tensor's amax over the group: scale = 448 / global max.
//  graph      a step captured in a CUDA graph (NCCL all-reduce inside) and replayed equals the
//             same steps run eagerly, bit for bit.
//  timeout    te_group_init_nccl_with_options with a rank that never joins fails with
//             TE_ERROR_NCCL after the timeout (rank 0 only); a single-rank NCCL group reduces
//             nothing.
//  abort      rank 0 enqueues a reduction the others never join; a watchdog thread's
//             te_group_abort ends it, te_context_synchronize returns, and the next reduction
//             over the group fails with TE_ERROR_NCCL.
// Exits 77 (SKIP) with fewer GPUs than ranks or without NCCL.
#include <te/te.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "multi_rank.h"

namespace {

using multi_rank::g_failures;
using multi_rank::g_rank;
using multi_rank::share_bytes;
using multi_rank::wait_child;

constexpr int kTokens = 32, kDim = 32;
constexpr int kHist = 8;  // amax_history_len of the delayed recipes here

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- NCCL's log: this rank's stdout, redirected to a file ----------------------------------

std::string g_log_path;

// ncclAllReduce calls NCCL has logged so far (lines "AllReduce: opCount ...").
int logged_allreduces() {
  std::fflush(stdout);
  FILE *f = std::fopen(g_log_path.c_str(), "r");
  if (!f) return -1;
  int n = 0;
  char line[4096];
  while (std::fgets(line, sizeof line, f)) n += std::strstr(line, "AllReduce: opCount") != nullptr;
  std::fclose(f);
  return n;
}

// ---- a model: L bias-free FP8 linears kDim -> kDim on kTokens rows, F32 -------------------

struct Model {
  te_context *ctx = nullptr;
  std::vector<te_linear *> lin;
  std::vector<void *> acts;   // acts[0] = x, acts[l + 1] = layer l's output
  std::vector<void *> grads;  // dy for the last layer, then dgrad buffers
  void *w = nullptr, *dw = nullptr;

  te_tensor matrix(void *p) const {
    te_tensor t;
    std::memset(&t, 0, sizeof t);
    t.data = p;
    t.dtype = TE_DTYPE_F32;
    t.ndim = 2;
    t.shape[0] = kTokens;
    t.shape[1] = kDim;
    t.device.type = TE_DEVICE_CUDA;
    return t;
  }

  // x: this rank's data with max |x| = x_max; W shared by all layers with max |W| = w_max.
  Model(te_context *c, int layers, float x_max, float w_max, unsigned seed) : ctx(c) {
    te_linear_options o;
    CHECK_TE(te_linear_options_init(&o));
    o.in_features = o.out_features = kDim;
    o.bias = 0;
    o.activation_dtype = TE_DTYPE_F32;
    for (int l = 0; l < layers; ++l) {
      te_linear *p = nullptr;
      CHECK_TE(te_linear_create(&p, ctx, &o));
      lin.push_back(p);
    }
    const size_t bytes = sizeof(float) * kTokens * kDim;
    for (int l = 0; l <= layers; ++l) acts.push_back(alloc(bytes));
    for (int l = 0; l <= layers; ++l) grads.push_back(alloc(bytes));
    w = alloc(bytes);
    dw = alloc(bytes);
    upload(acts[0], x_max, seed);
    upload(w, w_max, seed + 1);
    upload(grads[layers], 0.01f, seed + 2);
  }
  ~Model() {
    for (te_linear *p : lin) te_linear_destroy(p);
    for (void *p : acts) te_context_free(ctx, p);
    for (void *p : grads) te_context_free(ctx, p);
    te_context_free(ctx, w);
    te_context_free(ctx, dw);
  }
  void *alloc(size_t bytes) {
    void *p = nullptr;
    CHECK_TE(te_context_malloc(ctx, bytes, &p));
    return p;
  }
  // Values in (-max/2, max/2) with one planted -max: max |v| is exactly `max`.
  void upload(void *dst, float max, unsigned seed) {
    std::vector<float> v(size_t(kTokens) * kDim);
    unsigned s = seed * 2654435761u + 7u;
    for (float &x : v) {
      s = s * 1664525u + 1013904223u;
      x = max * (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 0.99f;
    }
    v[seed % v.size()] = -max;
    CHECK_TE(te_context_copy(ctx, dst, v.data(), v.size() * sizeof(float), TE_COPY_HOST_TO_DEVICE));
  }

  // One training step: forward of every layer in one scope (layer l under recipes[l % 2] when
  // `interleave`, in a nested scope), then backward in reverse (dgrad, wgrad).
  void step(te_recipe *a, te_recipe *b, const te_group *group, bool interleave) {
    te_autocast_options outer;
    CHECK_TE(te_autocast_options_init(&outer));
    outer.enabled = 1;
    outer.recipe = a;
    outer.group = group;
    te_autocast_options inner = outer;
    inner.recipe = b;
    te_autocast_token token, inner_token;
    std::vector<te_linear_backward_ctx *> bwd(lin.size());
    CHECK_TE(te_autocast_begin(ctx, &outer, &token));
    for (size_t l = 0; l < lin.size(); ++l) {
      const bool nested = interleave && l % 2 == 1;
      if (nested) CHECK_TE(te_autocast_begin(ctx, &inner, &inner_token));
      te_tensor x = matrix(acts[l]), wt = matrix(w), y = matrix(acts[l + 1]);
      wt.shape[0] = kDim;
      te_linear_forward_args fa;
      CHECK_TE(te_linear_forward_args_init(&fa));
      fa.input = &x;
      fa.weight = &wt;
      CHECK_TE(te_linear_forward(ctx, lin[l], &fa, &y, &bwd[l]));
      if (nested) CHECK_TE(te_autocast_end(ctx, inner_token));
    }
    CHECK_TE(te_autocast_end(ctx, token));
    te_linear_backward_args once;
    CHECK_TE(te_linear_backward_args_init(&once));
    once.flags = TE_BACKWARD_ONCE;
    for (size_t l = lin.size(); l-- > 0;) {
      te_tensor dy = matrix(grads[l + 1]), dx = matrix(grads[l]), dwt = matrix(dw);
      CHECK_TE(te_linear_backward(ctx, bwd[l], &dy, &dx, &dwt, nullptr, &once));
      te_linear_backward_ctx_destroy(bwd[l]);
    }
  }

  // Every layer's three scaling states: scale, scale_inv, history[kHist].
  void dump(std::vector<float> &out) const {
    for (te_linear *p : lin)
      for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT}) {
        te_scaling_state_info info;
        std::memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        float h[kHist] = {};
        CHECK_TE(te_linear_get_scaling_state(ctx, p, role, &info, h, kHist));
        out.push_back(info.scale);
        out.push_back(info.scale_inv);
        out.insert(out.end(), h, h + kHist);
      }
  }
  float first_history(te_tensor_role role, int layer, int i) const {
    te_scaling_state_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    float h[kHist] = {};
    CHECK_TE(te_linear_get_scaling_state(ctx, lin[layer], role, &info, h, kHist));
    return h[i];
  }
};

te_recipe *make_recipe(te_recipe_kind kind, int margin) {
  te_recipe_options o;
  CHECK_TE(te_recipe_options_init(&o, kind));
  o.amax_history_len = kHist;
  o.margin = margin;
  te_recipe *r = nullptr;
  CHECK_TE(te_recipe_create(&r, &o));
  return r;
}

uint64_t reductions(te_context *ctx) {
  te_context_stats st;
  std::memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK_TE(te_context_get_stats(ctx, &st));
  return st.amax_reductions;
}

// ---- the cases ---------------------------------------------------------------------------

void case_calls(te_context *ctx, const te_group *group, ncclComm_t comm, cudaStream_t stream, int rank, int n,
                std::vector<float> &dump) {
  // Calibration: the log must count what NCCL was asked to do.
  float *buf = nullptr;
  CHECK_CUDA(cudaMalloc(&buf, sizeof(float) * 4));
  CHECK_CUDA(cudaMemset(buf, 0, sizeof(float) * 4));
  const int before = logged_allreduces();
  for (int i = 0; i < 3; ++i) CHECK_NCCL(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclMax, comm, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaFree(buf));
  const int calibrated = logged_allreduces() - before;
  EXPECT(before >= 0 && calibrated == 3, "NCCL's log (%s) counted %d of 3 bare all-reduces: cannot count calls",
         g_log_path.c_str(), calibrated);

  te_recipe *a = make_recipe(TE_RECIPE_DELAYED_SCALING, 0), *b = make_recipe(TE_RECIPE_DELAYED_SCALING, 1);
  struct Shape { int layers; bool interleave; int want; } shapes[] = {{1, false, 2}, {2, false, 2}, {8, false, 2},
                                                                      {48, false, 2}, {8, true, 4}};
  for (const Shape &s : shapes) {
    // Rank r's input max is 1 + r, its weight max 0.5 + 0.25 r: the global ones are rank n-1's.
    Model m(ctx, s.layers, 1.0f + rank, 0.5f + 0.25f * rank, 10u * s.layers + rank);
    m.step(a, b, group, s.interleave);  // first use: states made, then one more step counted
    CHECK_TE(te_context_synchronize(ctx));
    const int log0 = logged_allreduces();
    const uint64_t red0 = reductions(ctx);
    m.step(a, b, group, s.interleave);
    CHECK_TE(te_context_synchronize(ctx));
    const int calls = logged_allreduces() - log0;
    const int counted = int(reductions(ctx) - red0);
    std::fprintf(stderr, "[rank %d] calls: %2d layers%s: %d ncclAllReduce per step (NCCL's log), %d by libte's stats\n",
                 rank, s.layers, s.interleave ? " (2 recipes interleaved)" : "", calls, counted);
    EXPECT(calls == s.want, "%d layers%s: %d ncclAllReduce calls in one step, want %d", s.layers,
           s.interleave ? " interleaved" : "", calls, s.want);
    EXPECT(counted == s.want, "%d layers: stats count %d reductions, want %d", s.layers, counted, s.want);
    // global: every layer's input history holds the global max of its input (layer 0: rank n-1's
    // x; the weight's everywhere), recorded by the last step in the history's newest slot.
    const float want_x = float(n), want_w = 0.5f + 0.25f * (n - 1);
    EXPECT(m.first_history(TE_ROLE_INPUT, 0, kHist - 1) == want_x, "%d layers: layer 0 input amax %g, want %g",
           s.layers, m.first_history(TE_ROLE_INPUT, 0, kHist - 1), want_x);
    for (int l = 0; l < s.layers; ++l)
      EXPECT(m.first_history(TE_ROLE_WEIGHT, l, kHist - 1) == want_w, "%d layers: layer %d weight amax %g, want %g",
             s.layers, l, m.first_history(TE_ROLE_WEIGHT, l, kHist - 1), want_w);
    m.dump(dump);
  }
  te_recipe_release(a);
  te_recipe_release(b);
}

void case_borrowed(te_context *ctx, ncclComm_t comm, cudaStream_t stream, int rank, int n, std::vector<float> &dump) {
  te_group *g = nullptr;
  CHECK_TE(te_group_create_nccl(&g, comm));
  EXPECT(te_group_rank(g) == rank && te_group_size(g) == n, "borrowed: rank %d size %d", te_group_rank(g),
         te_group_size(g));
  te_recipe *r = make_recipe(TE_RECIPE_DELAYED_SCALING, 0);
  {
    Model m(ctx, 3, 2.0f + rank, 0.25f + rank, 300u + rank);
    m.step(r, r, g, false);
    m.step(r, r, g, false);
    CHECK_TE(te_context_synchronize(ctx));
    EXPECT(m.first_history(TE_ROLE_INPUT, 0, kHist - 1) == float(n + 1), "borrowed: input amax %g, want %d",
           m.first_history(TE_ROLE_INPUT, 0, kHist - 1), n + 1);
    m.dump(dump);
  }
  EXPECT(te_group_abort(g) == TE_ERROR_INVALID_STATE, "borrowed: te_group_abort must refuse a borrowed communicator");
  EXPECT(std::strstr(te_last_error(), "borrows") != nullptr, "borrowed: message %s", te_last_error());
  te_group_destroy(g);
  // The communicator is still the program's, and works.
  float *buf = nullptr;
  CHECK_CUDA(cudaMalloc(&buf, sizeof(float)));
  const float one = 1.0f + rank;
  CHECK_CUDA(cudaMemcpy(buf, &one, sizeof one, cudaMemcpyHostToDevice));
  CHECK_NCCL(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, stream));
  float sum = 0.0f;
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaMemcpy(&sum, buf, sizeof sum, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(buf));
  EXPECT(sum == float(n * (n + 1) / 2), "borrowed: the communicator after the group: sum %g", sum);
  te_recipe_release(r);
}

void case_current(te_context *ctx, const te_group *group, int rank, int n, std::vector<float> &dump) {
  te_recipe *r = make_recipe(TE_RECIPE_CURRENT_SCALING, 0);
  Model m(ctx, 1, 2.0f + rank, 0.5f + 0.5f * rank, 500u + rank);
  m.step(r, r, group, false);
  CHECK_TE(te_context_synchronize(ctx));
  for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT}) {
    te_scaling_state_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK_TE(te_linear_get_scaling_state(ctx, m.lin[0], role, &info, nullptr, 0));
    const float global = role == TE_ROLE_INPUT ? 2.0f + (n - 1) : 0.5f + 0.5f * (n - 1);
    const float want = 448.0f / global;
    EXPECT(info.scale == want, "current: %s scale %.9g, want 448 / %g = %.9g", role == TE_ROLE_INPUT ? "input" : "weight",
           info.scale, global, want);
    dump.push_back(info.scale);
  }
  te_recipe_release(r);
}

void case_graph(te_context *ctx, const te_group *group, cudaStream_t stream, int rank, std::vector<float> &dump) {
  te_recipe *r = make_recipe(TE_RECIPE_DELAYED_SCALING, 0);
  std::vector<float> eager_state, graph_state;
  {
    Model eager(ctx, 2, 1.5f + rank, 0.75f + rank, 700u + rank);
    for (int i = 0; i < 5; ++i) eager.step(r, r, group, false);
    CHECK_TE(te_context_synchronize(ctx));
    eager.dump(eager_state);
  }
  {
    Model graphed(ctx, 2, 1.5f + rank, 0.75f + rank, 700u + rank);
    graphed.step(r, r, group, false);  // first use outside the graph
    CHECK_TE(te_context_synchronize(ctx));
    cudaGraph_t graph;
    // Thread-local capture: NCCL's own threads keep making CUDA calls meanwhile.
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    graphed.step(r, r, group, false);
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 4; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    graphed.dump(graph_state);
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }
  EXPECT(eager_state.size() == graph_state.size() &&
             std::memcmp(eager_state.data(), graph_state.data(), eager_state.size() * sizeof(float)) == 0,
         "graph: 1 eager step + 4 replays of a captured one differ from 5 eager steps");
  dump.insert(dump.end(), graph_state.begin(), graph_state.end());
  te_recipe_release(r);
}

void case_timeout(te_context *ctx, int rank) {
  te_group_nccl_options o;
  CHECK_TE(te_group_nccl_options_init(&o));
  EXPECT(o.timeout_ms == 600000, "timeout: default %d ms", o.timeout_ms);
  te_nccl_id id;
  CHECK_TE(te_nccl_get_unique_id(&id));
  te_group *g = nullptr;
  o.timeout_ms = -1;
  EXPECT(te_group_init_nccl_with_options(&g, 0, 2, &id, &o) == TE_ERROR_INVALID_ARGUMENT && g == nullptr,
         "timeout: a negative timeout must be refused");
  if (rank == 0) {
    o.timeout_ms = 2000;
    const auto t0 = std::chrono::steady_clock::now();
    te_status s = te_group_init_nccl_with_options(&g, 0, 2, &id, &o);  // rank 1 of 2 never comes
    const double waited = seconds_since(t0);
    std::fprintf(stderr, "[rank 0] timeout: %s after %.2f s: %s\n", te_status_string(s), waited, te_last_error());
    EXPECT(s == TE_ERROR_NCCL && g == nullptr, "timeout: status %s", te_status_string(s));
    EXPECT(std::strstr(te_last_error(), "did not complete within 2000 ms") != nullptr, "timeout: message %s",
           te_last_error());
    EXPECT(waited >= 1.9 && waited < 30.0, "timeout: returned after %.2f s", waited);
  }
  // A single-rank NCCL group: no reduction at all.
  CHECK_TE(te_nccl_get_unique_id(&id));
  CHECK_TE(te_group_init_nccl(&g, 0, 1, &id));
  te_recipe *r = make_recipe(TE_RECIPE_DELAYED_SCALING, 0);
  {
    Model m(ctx, 2, 1.0f, 1.0f, 900u);
    const uint64_t red0 = reductions(ctx);
    m.step(r, r, g, false);
    CHECK_TE(te_context_synchronize(ctx));
    EXPECT(reductions(ctx) == red0, "single-rank NCCL group: %llu reductions", (unsigned long long)(reductions(ctx) - red0));
  }
  te_recipe_release(r);
  te_group_destroy(g);
}

void case_abort(te_context *ctx, te_group *group, int rank, const std::string &dir) {
  te_recipe *r = make_recipe(TE_RECIPE_DELAYED_SCALING, 0);
  Model m(ctx, 1, 1.0f, 1.0f, 1100u);
  m.step(r, r, group, false);  // every rank: a step that completes
  CHECK_TE(te_context_synchronize(ctx));
  if (rank == 0) {
    // Rank 0 alone reduces: its all-reduce waits on the GPU for peers that never come.
    te_autocast_options o;
    CHECK_TE(te_autocast_options_init(&o));
    o.enabled = 1;
    o.recipe = r;
    o.group = group;
    te_autocast_token token;
    te_linear_backward_ctx *bwd = nullptr;
    te_tensor x = m.matrix(m.acts[0]), w = m.matrix(m.w), y = m.matrix(m.acts[1]);
    te_linear_forward_args fa;
    CHECK_TE(te_linear_forward_args_init(&fa));
    fa.input = &x;
    fa.weight = &w;
    CHECK_TE(te_autocast_begin(ctx, &o, &token));
    CHECK_TE(te_linear_forward(ctx, m.lin[0], &fa, &y, &bwd));
    CHECK_TE(te_autocast_end(ctx, token));
    te_status abort_status = TE_ERROR_INTERNAL;
    std::thread watchdog([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      abort_status = te_group_abort(group);
    });
    const auto t0 = std::chrono::steady_clock::now();
    te_status sync = te_context_synchronize(ctx);
    const double waited = seconds_since(t0);
    watchdog.join();
    std::fprintf(stderr, "[rank 0] abort: te_context_synchronize returned %s after %.2f s\n", te_status_string(sync),
                 waited);
    EXPECT(abort_status == TE_SUCCESS, "abort: te_group_abort: %s", te_status_string(abort_status));
    EXPECT(waited >= 1.0 && waited < 60.0, "abort: the wait ended after %.2f s", waited);
    te_linear_backward_ctx_destroy(bwd);
    // The group is unusable now, and says so.
    CHECK_TE(te_autocast_begin(ctx, &o, &token));
    CHECK_TE(te_linear_forward(ctx, m.lin[0], &fa, &y, &bwd));
    te_status s = te_autocast_end(ctx, token);
    EXPECT(s == TE_ERROR_NCCL && std::strstr(te_last_error(), "aborted"), "abort: next reduction: %s: %s",
           te_status_string(s), te_last_error());
    // A failed end changes nothing: the scope is still open (te_context_destroy closes it).
    te_autocast_state st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK_TE(te_autocast_get_state(ctx, &st));
    EXPECT(st.depth == 1, "abort: depth %d after the failed end", st.depth);
    te_linear_backward_ctx_destroy(bwd);
    int done = 1;
    share_bytes(dir, "rank0_aborted", &done, sizeof done);
  } else {
    // Alive but absent from rank 0's reduction until rank 0 is done; then the abort path here too.
    int done = 0;
    share_bytes(dir, "rank0_aborted", &done, sizeof done);
    EXPECT(te_group_abort(group) == TE_SUCCESS, "abort: %s", te_last_error());
  }
  EXPECT(te_group_abort(group) == TE_SUCCESS, "abort twice: %s", te_last_error());
  te_recipe_release(r);
}

int run_rank(int rank, int n, const std::string &dir) {
  g_rank = rank;
  g_log_path = dir + "/nccl_rank" + std::to_string(rank) + ".log";
  if (!std::freopen(g_log_path.c_str(), "w", stdout)) return 1;  // NCCL logs to stdout

  CHECK_CUDA(cudaSetDevice(0));  // CUDA_VISIBLE_DEVICES leaves this rank's GPU as device 0
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  te_context_options co;
  CHECK_TE(te_context_options_init(&co));
  co.use_default_device = 0;
  co.device.type = TE_DEVICE_CUDA;
  te_context *ctx = nullptr;
  CHECK_TE(te_context_create(&ctx, &co));
  CHECK_TE(te_context_set_stream(ctx, stream));

  // libte's own communicator, and the program's (for the borrowed case and the calibration).
  te_nccl_id tid;
  if (rank == 0) CHECK_TE(te_nccl_get_unique_id(&tid));
  share_bytes(dir, "te_id", &tid, sizeof tid);
  te_group *group = nullptr;
  CHECK_TE(te_group_init_nccl(&group, rank, n, &tid));
  ncclUniqueId pid;
  if (rank == 0) CHECK_NCCL(ncclGetUniqueId(&pid));
  share_bytes(dir, "program_id", &pid, sizeof pid);
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, n, pid, rank));

  std::vector<float> dump;
  case_calls(ctx, group, comm, stream, rank, n, dump);
  case_borrowed(ctx, comm, stream, rank, n, dump);
  case_current(ctx, group, rank, n, dump);
  case_graph(ctx, group, stream, rank, dump);
  case_timeout(ctx, rank);
  case_abort(ctx, group, rank, dir);

  const std::string out = dir + "/rank" + std::to_string(rank) + ".bin";
  FILE *f = std::fopen(out.c_str(), "wb");
  if (!f || std::fwrite(dump.data(), sizeof(float), dump.size(), f) != dump.size() || std::fclose(f) != 0) return 1;
  te_context_destroy(ctx);
  te_group_destroy(group);
  CHECK_NCCL(ncclCommDestroy(comm));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return g_failures ? 1 : 0;
}

std::vector<char> read_file(const std::string &path) {
  std::vector<char> v;
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) return v;
  char buf[65536];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + got);
  std::fclose(f);
  return v;
}

}  // namespace

int main(int argc, char **argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2;
  if (n < 2 || n > 64) {
    std::fprintf(stderr, "usage: %s [ranks, 2..64]\n", argv[0]);
    return 2;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink multicast off (it can take a shared host's GPUs out of service)
  setenv("NCCL_DEBUG", "INFO", 1);      // every collective logged: how the calls are counted
  setenv("NCCL_DEBUG_SUBSYS", "COLL", 1);
  std::fflush(stdout);
  pid_t probe = fork();  // no CUDA in the parent, which forks
  if (probe == 0) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    std::_Exit(count > 100 ? 100 : count);
  }
  const int gpus = wait_child(probe);
  if (gpus < n) {
    std::printf("SKIP: %d GPU(s), %d ranks asked\n", gpus, n);
    return 77;
  }
  char tmpl[] = "/tmp/te_nccl_cases_XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  const std::string dir = tmpl;
  std::vector<pid_t> pids(n);
  for (int r = 0; r < n; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      setenv("CUDA_VISIBLE_DEVICES", std::to_string(r).c_str(), 1);
      alarm(240);  // a hung collective fails the test instead of the CI job
      std::_Exit(run_rank(r, n, dir));
    }
  }
  int worst = 0;
  for (int r = 0; r < n; ++r) {
    const int rc = wait_child(pids[r]);
    std::printf("rank %d exited with %d\n", r, rc);
    if (rc != 0 && worst != 1) worst = rc == 77 ? 77 : 1;
  }
  int failures = 0;
  std::vector<char> first = read_file(dir + "/rank0.bin");
  for (int r = 1; r < n && worst == 0; ++r)
    if (first.empty() || read_file(dir + "/rank" + std::to_string(r) + ".bin") != first) {
      std::printf("FAIL: the scaling states of rank %d differ from rank 0's\n", r);
      ++failures;
    }
  const char *names[] = {"te_id", "program_id", "rank0_aborted"};
  for (const char *name : names) std::remove((dir + "/" + name).c_str());
  for (int r = 0; r < n; ++r) {
    std::remove((dir + "/rank" + std::to_string(r) + ".bin").c_str());
    if (worst == 0) std::remove((dir + "/nccl_rank" + std::to_string(r) + ".log").c_str());
  }
  if (worst == 0) rmdir(dir.c_str());
  if (worst == 77) {
    std::printf("SKIP: NCCL groups unsupported here\n");
    return 77;
  }
  if (worst || failures) {
    std::printf("FAIL (NCCL logs kept in %s)\n", dir.c_str());
    return 1;
  }
  std::printf("PASS: %d ranks: 1 all-reduce per bucket and pass for 1-48 layers, global amaxes, bit-identical "
              "states, borrowed comm, current scaling, CUDA graph, init timeout, abort\n", n);
  return 0;
}
