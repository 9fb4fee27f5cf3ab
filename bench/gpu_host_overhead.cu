// Host overhead of libte's hot path on a CUDA context, beside a bare kernel launch timed in the
// same program (issue 15's yardstick: te_linear_forward <= 3x a bare launch, a whole Linear
// training step <= 25 us).
//
// Every case runs tiny shapes (32 tokens, 64 -> 64 features, BF16 activations, bias; attention:
// 2 sequences of 32 tokens, 4 heads of 64) so that the GPU keeps ahead of the host and each
// timing is the host's own cost: the steady_clock time of the call(s) named, inside an
// unsynchronised training loop (a synchronise after every 50 steps, outside the timed region,
// keeps the launch queue short). Median over 7 x 50 steps after 20
// warm-up steps. One JSON object on stdout; with --profile, a second section counts the CUDA
// runtime and driver API calls of one step of each case (CUPTI callbacks: the counts are exact;
// the times are inflated by the callbacks themselves and only show where the calls cluster).
// Each step is also captured in a CUDA graph and its replay timed (CASE_graph_replay; --no-graph
// leaves that out), and launches with 0.5-30 KiB parameter blocks are timed beside the bare
// launch (launch_params_*).
//
//   te_bench_gpu_host [--profile] [--no-graph] [--steps N] [--reps N] [--warmup N] [--only CASE]
//                     [--shape TOKENS,IN,OUT] [--experts N]
//
// --only takes a comma-separated list of cases, each a name or a prefix ending in '*'
// (`--only 'linear_*,attention_bf16'`). --only and --shape serve a device profiler (ncu) on one
// case at a real shape: e.g.
// `ncu --metrics gpu__time_duration.sum te_bench_gpu_host --only linear_delayed --no-graph
//  --shape 16384,4096,14336 --warmup 1 --steps 1 --reps 1` lists the kernels and times of the
// warm-up step and the timed one.
//
// Without a usable GPU it prints {"skipped": ...} and exits 0.
#include <cuda.h>
#include <cuda_runtime.h>
#include <te/te.h>

#include "bench_check.h"
#include "bench_recipe.h"

#if TE_BENCH_CUPTI
#include <cupti.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

#define CUDA_CHECK(call)                                                                      \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                        \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

__global__ void empty_kernel() {}
__global__ void four_args_kernel(const float *a, float *b, int n, float s) {
  if (n < 0) b[0] = a[0] * s;  // never true: the launch carries arguments, the kernel does nothing
}
// A launch whose parameter block is `Bytes` long (libte's kernels take 0.05-30 KiB): what the
// driver's copy of the parameters adds to a launch.
template <int Bytes>
struct ParamBlock {
  int word[Bytes / 4];
};
template <int Bytes>
__global__ void param_block_kernel(const __grid_constant__ ParamBlock<Bytes> p, int *out) {
  if (p.word[0] < 0) out[0] = p.word[Bytes / 4 - 1];  // never true
}

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

int g_steps = 50, g_reps = 7, g_warmup = 20;
bool g_graph = true;  // --no-graph: no CASE_graph_replay
std::string g_only;  // empty: every case
te_context *g_ctx = nullptr;

// One timed case: `step` runs one iteration and adds the host time of its timed part(s) to the
// vector of segments it is given (one entry per named segment).
struct Segments {
  std::vector<std::string> names;
  std::vector<std::vector<double>> samples;
  explicit Segments(std::vector<std::string> n) : names(std::move(n)), samples(names.size()) {}
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::string json;
void emit(const std::string &name, const Segments &s) {
  std::string f;
  for (size_t i = 0; i < s.names.size(); ++i) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s\"%s_us\": %.3f", i ? ", " : "", s.names[i].c_str(), median(s.samples[i]));
    f += buf;
  }
  json += (json.empty() ? "" : ",\n") + std::string("  \"") + name + "\": {" + f + "}";
}

// Runs `step` warm-up + reps x steps times, synchronising (untimed) between repetitions.
void run(const std::string &name, Segments seg, const std::function<void(std::vector<double> &)> &step) {
  std::vector<double> t(seg.names.size());
  for (int i = 0; i < g_warmup; ++i) step(t);
  CHECK(te_context_synchronize(g_ctx));
  for (int r = 0; r < g_reps; ++r) {
    for (int i = 0; i < g_steps; ++i) {
      std::fill(t.begin(), t.end(), 0.0);
      step(t);
      for (size_t k = 0; k < t.size(); ++k) seg.samples[k].push_back(t[k]);
    }
    CHECK(te_context_synchronize(g_ctx));
  }
  emit(name, seg);
}

// ---- CUPTI call counts ---------------------------------------------------------------------------
#if TE_BENCH_CUPTI
struct ApiStat {
  long count = 0;
  double us = 0;
};
std::map<std::string, ApiStat> g_api;
std::vector<Clock::time_point> g_enter;  // a stack: runtime calls nest driver calls

void CUPTIAPI on_api(void *, CUpti_CallbackDomain domain, CUpti_CallbackId, const void *data) {
  const auto *cb = static_cast<const CUpti_CallbackData *>(data);
  if (cb->callbackSite == CUPTI_API_ENTER) {
    g_enter.push_back(Clock::now());
    return;
  }
  if (g_enter.empty()) return;
  const double us = us_since(g_enter.back());
  g_enter.pop_back();
  std::string key = std::string(domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "rt " : "drv ") + cb->functionName;
  // Which kernel each runtime launch started (mangled names, cut short).
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API && cb->symbolName) key += std::string(" ") + std::string(cb->symbolName).substr(0, 90);
  ApiStat &s = g_api[key];
  s.count += 1;
  s.us += us;
}

CUpti_SubscriberHandle g_sub = nullptr;
std::string profile_json;

void profile(const std::string &name, const std::function<void(std::vector<double> &)> &step, int nseg) {
  std::vector<double> t(nseg);
  for (int i = 0; i < 5; ++i) step(t);
  CHECK(te_context_synchronize(g_ctx));
  g_api.clear();
  if (cuptiEnableDomain(1, g_sub, CUPTI_CB_DOMAIN_RUNTIME_API) != CUPTI_SUCCESS ||
      cuptiEnableDomain(1, g_sub, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "CUPTI: cannot enable callbacks\n");
    return;
  }
  const int n = 10;
  for (int i = 0; i < n; ++i) step(t);
  cuptiEnableDomain(0, g_sub, CUPTI_CB_DOMAIN_RUNTIME_API);
  cuptiEnableDomain(0, g_sub, CUPTI_CB_DOMAIN_DRIVER_API);
  CHECK(te_context_synchronize(g_ctx));
  std::vector<std::pair<std::string, ApiStat>> v(g_api.begin(), g_api.end());
  std::sort(v.begin(), v.end(), [](auto &a, auto &b) { return a.second.us > b.second.us; });
  std::string f;
  long rt = 0, drv = 0;
  for (auto &kv : v) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s\n    \"%s\": {\"calls_per_step\": %.1f, \"us_per_step\": %.2f}", f.empty() ? "" : ",",
                  kv.first.c_str(), double(kv.second.count) / n, kv.second.us / n);
    f += buf;
    (kv.first[0] == 'r' ? rt : drv) += kv.second.count;
  }
  char head[160];
  std::snprintf(head, sizeof head, "\"runtime_calls_per_step\": %.1f, \"driver_calls_per_step\": %.1f,", double(rt) / n,
                double(drv) / n);
  profile_json += (profile_json.empty() ? "" : ",\n") + std::string("  \"") + name + "\": {" + head + f + "}";
}
#endif

// ---- inputs --------------------------------------------------------------------------------------
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

std::vector<void *> g_buffers;
te_device g_dev;

te_tensor bf16(int64_t rows, int64_t cols, float stddev, uint32_t seed) {
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<uint16_t> h(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  for (auto &v : h) v = to_bf16(d(rng));
  void *p = nullptr;
  CHECK(te_context_malloc(g_ctx, n * 2, &p));
  CHECK(te_context_copy(g_ctx, p, h.data(), n * 2, TE_COPY_HOST_TO_DEVICE));
  g_buffers.push_back(p);
  te_tensor t;
  std::memset(&t, 0, sizeof t);
  t.data = p;
  t.dtype = TE_DTYPE_BF16;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.device = g_dev;
  return t;
}
te_tensor vec(int64_t n, float stddev, uint32_t seed) {
  te_tensor t = bf16(n, 1, stddev, seed);
  t.ndim = 1;
  t.shape[1] = 0;
  return t;
}

int64_t kTokens = 32, kIn = 64, kOut = 64, kFfn = 128;  // --shape sets tokens, in (= hidden), out (= ffn)

// --only: a comma-separated list of cases, each a name or a prefix ending in '*'.
bool wanted(const std::string &name) {
  if (g_only.empty()) return true;
  for (size_t at = 0; at <= g_only.size();) {
    const size_t end = std::min(g_only.find(',', at), g_only.size());
    const std::string pat = g_only.substr(at, end - at);
    if (!pat.empty() && pat.back() == '*' ? name.compare(0, pat.size() - 1, pat, 0, pat.size() - 1) == 0
                                           : pat == name)
      return true;
    at = end + 1;
  }
  return false;
}

// Counts the API calls of `step` when asked and CUPTI is built in.
void maybe_profile(const std::string &name, const std::function<void(std::vector<double> &)> &step, int nseg,
                   bool profile_it) {
#if TE_BENCH_CUPTI
  if (profile_it) profile(name, step, nseg);
#else
  (void)name, (void)step, (void)nseg, (void)profile_it;
#endif
}

cudaStream_t g_stream = nullptr;

// The same step captured once in a CUDA graph and replayed: the host time of one
// cudaGraphLaunch per step, the route for a host-bound program (libte's steps capture: no sync,
// allocations in stream order; tests/gpu/cuda_modules_graph_test.cpp checks the replay's bytes).
void run_graph_replay(const std::string &name, const std::function<void(std::vector<double> &)> &step, int nseg) {
  if (!g_graph) return;
  std::vector<double> t(static_cast<size_t>(nseg));
  CHECK(te_context_synchronize(g_ctx));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
  step(t);
  CUDA_CHECK(cudaStreamEndCapture(g_stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  run(name + "_graph_replay", Segments({"step"}), [&](std::vector<double> &r) {
    auto t0 = Clock::now();
    CUDA_CHECK(cudaGraphLaunch(exec, g_stream));
    r[0] += us_since(t0);
  });
  CHECK(te_context_synchronize(g_ctx));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
}

// A module's training step, timed as forward alone and the whole step (autocast
// begin, forward, end, backward, destroy). forward(&bwd) and backward(bwd) make the calls.
template <class Bwd, class Forward, class Backward>
void run_module_step(const std::string &name, const te_autocast_options *ao, Forward forward, Backward backward,
                     void (*destroy)(Bwd *), bool profile_it) {
  auto step = [&](std::vector<double> &t) {
    te_autocast_token tok;
    Bwd *bwd = nullptr;
    auto t0 = Clock::now();
    CHECK(te_autocast_begin(g_ctx, ao, &tok));
    auto t1 = Clock::now();
    forward(&bwd);
    auto t2 = Clock::now();
    CHECK(te_autocast_end(g_ctx, tok));
    backward(bwd);
    destroy(bwd);
    auto t3 = Clock::now();
    using D = std::chrono::duration<double, std::micro>;
    t[0] += D(t2 - t1).count(), t[1] += D(t3 - t0).count();
  };
  run(name, Segments({"forward", "step"}), step);
  run_graph_replay(name, step, 2);
  maybe_profile(name, step, 2, profile_it);
}

// A whole Linear training step, each part timed: autocast begin, forward, end, backward, destroy.
void bench_linear(const char *recipe, int weight_unchanged, bool profile_it) {
  if (!wanted(std::string("linear_") + recipe + (weight_unchanged ? "_weight_unchanged" : ""))) return;
  const auto rc = bench::recipe_case_or_exit(recipe, "te_bench_gpu_host");
  const te_autocast_options *ao = rc->autocast();
  te_linear_options lo;
  CHECK(te_linear_options_init(&lo));
  lo.in_features = kIn;
  lo.out_features = kOut;
  lo.activation_dtype = TE_DTYPE_BF16;
  te_linear *lin = nullptr;
  CHECK(te_linear_create(&lin, g_ctx, &lo));
  te_tensor x = bf16(kTokens, kIn, 1.0f, 1), w = bf16(kOut, kIn, 0.05f, 2), b = vec(kOut, 0.1f, 3);
  te_tensor y = bf16(kTokens, kOut, 1e-3f, 4), dy = bf16(kTokens, kOut, 1e-2f, 5), dx = bf16(kTokens, kIn, 1e-3f, 6);
  te_tensor dw = bf16(kOut, kIn, 1e-3f, 7), db = vec(kOut, 1e-3f, 8);
  te_linear_forward_args fa;
  CHECK(te_linear_forward_args_init(&fa));
  fa.input = &x;
  fa.weight = &w;
  fa.bias = &b;
  fa.weight_unchanged = weight_unchanged;
  te_linear_backward_args once;
  CHECK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE;
  auto step = [&](std::vector<double> &t) {
    te_autocast_token tok;
    te_linear_backward_ctx *bwd = nullptr;
    auto t0 = Clock::now();
    CHECK(te_autocast_begin(g_ctx, ao, &tok));
    auto t1 = Clock::now();
    CHECK(te_linear_forward(g_ctx, lin, &fa, &y, &bwd));
    auto t2 = Clock::now();
    CHECK(te_autocast_end(g_ctx, tok));
    auto t3 = Clock::now();
    CHECK(te_linear_backward(g_ctx, bwd, &dy, &dx, &dw, &db, &once));
    auto t4 = Clock::now();
    te_linear_backward_ctx_destroy(bwd);
    auto t5 = Clock::now();
    using D = std::chrono::duration<double, std::micro>;
    t[0] += D(t1 - t0).count(), t[1] += D(t2 - t1).count(), t[2] += D(t3 - t2).count();
    t[3] += D(t4 - t3).count(), t[4] += D(t5 - t4).count(), t[5] += D(t5 - t0).count();
  };
  const std::string name = std::string("linear_") + recipe + (weight_unchanged ? "_weight_unchanged" : "");
  run(name, Segments({"begin", "forward", "end", "backward", "destroy", "step"}), step);
  run_graph_replay(name, step, 6);
  maybe_profile(name, step, 6, profile_it);
  te_linear_destroy(lin);
}

void bench_layernorm_linear(const char *recipe, bool profile_it) {
  if (!wanted(std::string("layernorm_linear_") + recipe)) return;
  const auto rc = bench::recipe_case_or_exit(recipe, "te_bench_gpu_host");
  te_layernorm_linear_options lo;
  CHECK(te_layernorm_linear_options_init(&lo));
  lo.in_features = kIn;
  lo.out_features = kOut;
  lo.bias = 1;
  lo.activation_dtype = TE_DTYPE_BF16;
  lo.normalization = TE_NORM_LAYERNORM;
  te_layernorm_linear *m = nullptr;
  CHECK(te_layernorm_linear_create(&m, g_ctx, &lo));
  te_tensor x = bf16(kTokens, kIn, 1.0f, 11), g = vec(kIn, 0.2f, 12), be = vec(kIn, 0.1f, 13);
  te_tensor w = bf16(kOut, kIn, 0.05f, 14), b = vec(kOut, 0.1f, 15), y = bf16(kTokens, kOut, 1e-3f, 16);
  te_tensor dy = bf16(kTokens, kOut, 1e-2f, 17), dx = bf16(kTokens, kIn, 1e-3f, 18), dg = vec(kIn, 1e-3f, 19);
  te_tensor dbe = vec(kIn, 1e-3f, 20), dw = bf16(kOut, kIn, 1e-3f, 21), db = vec(kOut, 1e-3f, 22);
  te_layernorm_linear_forward_args fa;
  CHECK(te_layernorm_linear_forward_args_init(&fa));
  fa.input = &x, fa.ln_weight = &g, fa.ln_bias = &be, fa.weight = &w, fa.bias = &b;
  te_layernorm_linear_grads gr;
  CHECK(te_layernorm_linear_grads_init(&gr));
  gr.dx = &dx, gr.dln_weight = &dg, gr.dln_bias = &dbe, gr.dw = &dw, gr.db = &db;
  te_linear_backward_args once;
  CHECK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE;
  run_module_step<te_layernorm_linear_backward_ctx>(
      std::string("layernorm_linear_") + recipe, rc->autocast(),
      [&](te_layernorm_linear_backward_ctx **bwd) { CHECK(te_layernorm_linear_forward(g_ctx, m, &fa, &y, bwd)); },
      [&](te_layernorm_linear_backward_ctx *bwd) { CHECK(te_layernorm_linear_backward(g_ctx, bwd, &dy, &gr, &once)); },
      te_layernorm_linear_backward_ctx_destroy, profile_it);
  te_layernorm_linear_destroy(m);
}

void bench_layernorm_mlp(const char *recipe, bool profile_it) {
  if (!wanted(std::string("layernorm_mlp_") + recipe)) return;
  const auto rc = bench::recipe_case_or_exit(recipe, "te_bench_gpu_host");
  te_layernorm_mlp_options mo;
  CHECK(te_layernorm_mlp_options_init(&mo));
  mo.hidden_size = kIn;
  mo.ffn_hidden_size = kFfn;
  mo.bias = 1;
  mo.activation = TE_ACTIVATION_GELU;
  mo.activation_dtype = TE_DTYPE_BF16;
  mo.normalization = TE_NORM_LAYERNORM;
  te_layernorm_mlp *m = nullptr;
  CHECK(te_layernorm_mlp_create(&m, g_ctx, &mo));
  te_tensor x = bf16(kTokens, kIn, 1.0f, 31), g = vec(kIn, 0.2f, 32), be = vec(kIn, 0.1f, 33);
  te_tensor w1 = bf16(kFfn, kIn, 0.05f, 34), b1 = vec(kFfn, 0.1f, 35), w2 = bf16(kIn, kFfn, 0.05f, 36);
  te_tensor b2 = vec(kIn, 0.1f, 37), y = bf16(kTokens, kIn, 1e-3f, 38), dy = bf16(kTokens, kIn, 1e-2f, 39);
  te_tensor dx = bf16(kTokens, kIn, 1e-3f, 40), dg = vec(kIn, 1e-3f, 41), dbe = vec(kIn, 1e-3f, 42);
  te_tensor dw1 = bf16(kFfn, kIn, 1e-3f, 43), db1 = vec(kFfn, 1e-3f, 44), dw2 = bf16(kIn, kFfn, 1e-3f, 45);
  te_tensor db2 = vec(kIn, 1e-3f, 46);
  te_layernorm_mlp_forward_args fa;
  CHECK(te_layernorm_mlp_forward_args_init(&fa));
  fa.input = &x, fa.ln_weight = &g, fa.ln_bias = &be, fa.fc1_weight = &w1, fa.fc1_bias = &b1;
  fa.fc2_weight = &w2, fa.fc2_bias = &b2;
  te_layernorm_mlp_grads gr;
  CHECK(te_layernorm_mlp_grads_init(&gr));
  gr.dx = &dx, gr.dln_weight = &dg, gr.dln_bias = &dbe, gr.dfc1_weight = &dw1, gr.dfc1_bias = &db1;
  gr.dfc2_weight = &dw2, gr.dfc2_bias = &db2;
  te_linear_backward_args once;
  CHECK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE;
  run_module_step<te_layernorm_mlp_backward_ctx>(
      std::string("layernorm_mlp_") + recipe, rc->autocast(),
      [&](te_layernorm_mlp_backward_ctx **bwd) { CHECK(te_layernorm_mlp_forward(g_ctx, m, &fa, &y, bwd)); },
      [&](te_layernorm_mlp_backward_ctx *bwd) { CHECK(te_layernorm_mlp_backward(g_ctx, bwd, &dy, &gr, &once)); },
      te_layernorm_mlp_backward_ctx_destroy, profile_it);
  te_layernorm_mlp_destroy(m);
}

// GroupedLinear (mixture of experts): g_experts experts (--experts), the tokens split unevenly
// in the shares 3, 5, 0, 6, 2, 7, 4, 5 repeated (every eighth expert gets none; the others counts
// that are mostly not multiples of 16, so they are padded under FP8).
int g_experts = 8;
void bench_grouped_linear(const char *recipe, bool profile_it) {
  if (!wanted(std::string("grouped_linear_") + recipe)) return;
  const auto rc = bench::recipe_case_or_exit(recipe, "te_bench_gpu_host");
  const int n = g_experts;
  te_grouped_linear_options go;
  CHECK(te_grouped_linear_options_init(&go));
  go.num_gemms = n;
  go.in_features = kIn;
  go.out_features = kOut;
  go.bias = 1;
  go.activation_dtype = TE_DTYPE_BF16;
  te_grouped_linear *g = nullptr;
  CHECK(te_grouped_linear_create(&g, g_ctx, &go));
  const int64_t share[8] = {3, 5, 0, 6, 2, 7, 4, 5};
  int64_t total_share = 0;
  for (int i = 0; i < n; ++i) total_share += share[i % 8];
  std::vector<int64_t> splits(static_cast<size_t>(n));
  int64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    splits[i] = i + 1 < n ? share[i % 8] * kTokens / total_share : kTokens - sum;
    sum += splits[i];
  }
  te_tensor x = bf16(kTokens, kIn, 1.0f, 51), y = bf16(kTokens, kOut, 1e-3f, 52), dy = bf16(kTokens, kOut, 1e-2f, 53);
  te_tensor dx = bf16(kTokens, kIn, 1e-3f, 54);
  std::vector<te_tensor> w(static_cast<size_t>(n)), b(w.size()), dw(w.size()), db(w.size());
  std::vector<const te_tensor *> wp(w.size()), bp(w.size());
  std::vector<te_tensor *> dwp(w.size()), dbp(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const uint32_t seed = 60 + 4 * static_cast<uint32_t>(i);
    w[i] = bf16(kOut, kIn, 0.05f, seed), b[i] = vec(kOut, 0.1f, seed + 1);
    dw[i] = bf16(kOut, kIn, 1e-3f, seed + 2), db[i] = vec(kOut, 1e-3f, seed + 3);
    wp[i] = &w[i], bp[i] = &b[i], dwp[i] = &dw[i], dbp[i] = &db[i];
  }
  te_grouped_linear_forward_args fa;
  CHECK(te_grouped_linear_forward_args_init(&fa));
  fa.input = &x, fa.m_splits = splits.data(), fa.weights = wp.data(), fa.biases = bp.data();
  te_linear_backward_args once;
  CHECK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE;
  run_module_step<te_grouped_linear_backward_ctx>(
      std::string("grouped_linear_") + recipe, rc->autocast(),
      [&](te_grouped_linear_backward_ctx **bwd) { CHECK(te_grouped_linear_forward(g_ctx, g, &fa, &y, bwd)); },
      [&](te_grouped_linear_backward_ctx *bwd) {
        CHECK(te_grouped_linear_backward(g_ctx, bwd, &dy, &dx, dwp.data(), dbp.data(), &once));
      },
      te_grouped_linear_backward_ctx_destroy, profile_it);
  te_grouped_linear_destroy(g);
}

// Attention (TE's DotProductAttention): batch 2, 32 tokens a sequence, 4 heads of 64, causal,
// BSHD. "bf16": autocast disabled (cuDNN's fused attention where cuDNN loads); an FP8 recipe:
// options.fp8 = 1, Q, K, V and P in E4M3 (libte's kernels on Hopper).
void bench_attention(const char *recipe, bool profile_it) {
  if (!wanted(std::string("attention_") + recipe)) return;
  const auto rc = bench::recipe_case_or_exit(recipe, "te_bench_gpu_host");
  const int64_t batch = 2, seq = kTokens, heads = 4, dim = 64;
  te_attention_options ao;
  CHECK(te_attention_options_init(&ao));
  ao.num_heads = heads;
  ao.head_dim = dim;
  ao.mask = TE_ATTN_MASK_CAUSAL;
  ao.activation_dtype = TE_DTYPE_BF16;
  ao.fp8 = std::strcmp(recipe, "bf16") != 0;
  te_attention *m = nullptr;
  CHECK(te_attention_create(&m, g_ctx, &ao));
  auto bshd = [&](float stddev, uint32_t seed) {
    te_tensor t = bf16(batch * seq, heads * dim, stddev, seed);
    t.ndim = 4;
    t.shape[0] = batch, t.shape[1] = seq, t.shape[2] = heads, t.shape[3] = dim;
    return t;
  };
  te_tensor q = bshd(1.0f, 81), k = bshd(1.0f, 82), v = bshd(1.0f, 83), o = bshd(1e-3f, 84);
  te_tensor d_o = bshd(1e-2f, 85), dq = bshd(1e-3f, 86), dk = bshd(1e-3f, 87), dv = bshd(1e-3f, 88);
  te_attention_forward_args fa;
  CHECK(te_attention_forward_args_init(&fa));
  fa.q = &q, fa.k = &k, fa.v = &v;
  te_attention_grads gr;
  CHECK(te_attention_grads_init(&gr));
  gr.dq = &dq, gr.dk = &dk, gr.dv = &dv;
  te_linear_backward_args once;
  CHECK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE;
  run_module_step<te_attention_backward_ctx>(
      std::string("attention_") + recipe, rc->autocast(),
      [&](te_attention_backward_ctx **bwd) { CHECK(te_attention_forward(g_ctx, m, &fa, &o, bwd)); },
      [&](te_attention_backward_ctx *bwd) { CHECK(te_attention_backward(g_ctx, bwd, &d_o, &gr, &once)); },
      te_attention_backward_ctx_destroy, profile_it);
  te_attention_destroy(m);
}

}  // namespace

int main(int argc, char **argv) {
  bool profile_calls = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--profile")) profile_calls = true;
    else if (!std::strcmp(argv[i], "--no-graph")) g_graph = false;
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) g_steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--warmup") && i + 1 < argc) g_warmup = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) g_only = argv[++i];
    else if (!std::strcmp(argv[i], "--experts") && i + 1 < argc) {
      g_experts = std::atoi(argv[++i]);
      if (g_experts < 1 || g_experts > TE_GROUPED_LINEAR_MAX_GEMMS) {
        std::fprintf(stderr, "te_bench_gpu_host: --experts wants 1..%d\n", TE_GROUPED_LINEAR_MAX_GEMMS);
        return 2;
      }
    }
    else if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) {
      long long t = 0, in = 0, out = 0;
      if (std::sscanf(argv[++i], "%lld,%lld,%lld", &t, &in, &out) != 3 || t < 1 || in < 1 || out < 1) {
        std::fprintf(stderr, "te_bench_gpu_host: --shape wants TOKENS,IN,OUT (positive)\n");
        return 2;
      }
      kTokens = t, kIn = in, kOut = out, kFfn = out;
    } else {
      std::fprintf(stderr,
                   "usage: te_bench_gpu_host [--profile] [--no-graph] [--steps N] [--reps N] [--warmup N] "
                   "[--only CASE] [--shape TOKENS,IN,OUT] [--experts N]\n");
      return 2;
    }
  }
  if (g_steps < 1 || g_reps < 1 || g_warmup < 0) {
    std::fprintf(stderr, "te_bench_gpu_host: --steps and --reps must be >= 1, --warmup >= 0\n");
    return 2;
  }
  te_context_options o;
  CHECK(te_context_options_init(&o));
  o.use_default_device = 0;
  o.device.type = TE_DEVICE_CUDA;
  if (te_context_create(&g_ctx, &o) != TE_SUCCESS) {
    std::printf("{\"skipped\": \"%s\"}\n", te_last_error());
    return 0;
  }
  CHECK(te_context_get_device(g_ctx, &g_dev));
  CUDA_CHECK(cudaSetDevice(g_dev.index));
  CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  cudaStream_t stream = g_stream;
  CHECK(te_context_set_stream(g_ctx, stream));

  // The yardsticks: a bare launch of an empty kernel, and of one with four arguments, on the
  // stream libte uses, timed the same way as libte's calls.
  float *dummy = nullptr;
  CUDA_CHECK(cudaMalloc(&dummy, 16));
  if (wanted("bare_launch")) run("bare_launch", Segments({"launch"}), [&](std::vector<double> &t) {
    auto t0 = Clock::now();
    empty_kernel<<<1, 32, 0, stream>>>();
    t[0] += us_since(t0);
  });
  if (wanted("bare_launch")) run("bare_launch_4_args", Segments({"launch"}), [&](std::vector<double> &t) {
    auto t0 = Clock::now();
    four_args_kernel<<<1, 32, 0, stream>>>(dummy, dummy, 16, 1.0f);
    t[0] += us_since(t0);
  });
  // The same empty kernel through the driver (cuLaunchKernel on the CUfunction the runtime
  // resolved once) and through cudaLaunchKernelExC: what the runtime's own layer adds per launch.
  if (wanted("bare_launch")) {
    using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void **, void **);
    void *entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    cudaFunction_t fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuLaunchKernel", &entry, 12000, cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess && cudaGetFuncBySymbol(&fn, reinterpret_cast<const void *>(empty_kernel)) == cudaSuccess) {
      auto launch = reinterpret_cast<LaunchFn>(entry);
      CUfunction f = reinterpret_cast<CUfunction>(fn);
      run("bare_launch_driver", Segments({"launch"}), [&](std::vector<double> &t) {
        auto t0 = Clock::now();
        CUresult r = launch(f, 1, 1, 1, 32, 1, 1, 0, reinterpret_cast<CUstream>(stream), nullptr, nullptr);
        t[0] += us_since(t0);
        if (r != CUDA_SUCCESS) {
          std::fprintf(stderr, "cuLaunchKernel: error %d\n", static_cast<int>(r));
          std::exit(2);
        }
      });
    } else {
      std::fprintf(stderr, "cuLaunchKernel not found: no bare_launch_driver\n");
      cudaGetLastError();
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    cfg.stream = stream;
    run("bare_launch_ex", Segments({"launch"}), [&](std::vector<double> &t) {
      auto t0 = Clock::now();
      cudaError_t e = cudaLaunchKernelExC(&cfg, reinterpret_cast<const void *>(empty_kernel), nullptr);
      t[0] += us_since(t0);
      CUDA_CHECK(e);
    });
  }
  if (wanted("bare_launch")) {
    auto params = [&](auto block, const char *name) {
      using Block = decltype(block);
      Block p;
      std::memset(&p, 0, sizeof p);
      run(name, Segments({"launch"}), [&](std::vector<double> &t) {
        auto t0 = Clock::now();
        param_block_kernel<<<1, 32, 0, stream>>>(p, reinterpret_cast<int *>(dummy));
        t[0] += us_since(t0);
      });
    };
    params(ParamBlock<512>(), "launch_params_512_bytes");
    params(ParamBlock<1024>(), "launch_params_1024_bytes");
    params(ParamBlock<6144>(), "launch_params_6144_bytes");
    params(ParamBlock<30720>(), "launch_params_30720_bytes");
  }
  CUDA_CHECK(cudaGetLastError());
  // The runtime calls libte's hot path made (or makes) per backend call, each alone.
  if (wanted("runtime_calls")) run("cuda_get_device", Segments({"call"}), [&](std::vector<double> &t) {
    int d = 0;
    auto t0 = Clock::now();
    cudaGetDevice(&d);
    t[0] += us_since(t0);
  });
  if (wanted("runtime_calls")) run("cuda_stream_is_capturing", Segments({"call"}), [&](std::vector<double> &t) {
    cudaStreamCaptureStatus st;
    auto t0 = Clock::now();
    cudaStreamIsCapturing(stream, &st);
    t[0] += us_since(t0);
  });
  if (wanted("runtime_calls")) run("cuda_malloc_free_async", Segments({"pair"}), [&](std::vector<double> &t) {
    void *p = nullptr;
    auto t0 = Clock::now();
    cudaMallocAsync(&p, 4096, stream);
    cudaFreeAsync(p, stream);
    t[0] += us_since(t0);
  });

#if TE_BENCH_CUPTI
  if (profile_calls && cuptiSubscribe(&g_sub, reinterpret_cast<CUpti_CallbackFunc>(on_api), nullptr) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "CUPTI: cuptiSubscribe failed; no call counts\n");
    profile_calls = false;
  }
#else
  if (profile_calls) std::fprintf(stderr, "built without CUPTI: no call counts\n");
  profile_calls = false;
#endif
  for (const char *r : {"delayed", "current", "block", "bf16"}) bench_linear(r, 0, profile_calls);
  bench_linear("delayed", 1, profile_calls);
  for (const char *r : {"delayed", "current", "block"}) bench_layernorm_linear(r, profile_calls);
  for (const char *r : {"delayed", "current", "block"}) bench_layernorm_mlp(r, profile_calls);
  for (const char *r : {"delayed", "current", "block", "bf16"}) bench_grouped_linear(r, profile_calls);
  for (const char *r : {"bf16", "delayed", "current"}) bench_attention(r, profile_calls);

  CHECK(te_context_synchronize(g_ctx));
  for (void *p : g_buffers) te_context_free(g_ctx, p);
  CHECK(te_context_set_stream(g_ctx, nullptr));
  te_context_destroy(g_ctx);
  cudaFree(dummy);
  cudaStreamDestroy(stream);
#if TE_BENCH_CUPTI
  if (g_sub) cuptiUnsubscribe(g_sub);
  std::printf("{\n%s\n}\n{\"api_calls\": {\n%s\n}}\n", json.c_str(), profile_json.c_str());
#else
  std::printf("{\n%s\n}\n", json.c_str());
#endif
  return 0;
}
