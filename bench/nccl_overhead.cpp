// Per-step cost of libte's amax reduction over an NCCL group, beside a bare ncclAllReduce.
//
// Model: 48 te_linears (16x16x16, BF16, no bias), delayed scaling, one autocast scope per step
// (forward only) with an NCCL group borrowed from this program's communicator. The overhead is
//   step(recipe reduce_amax = 1) - step(recipe reduce_amax = 0)
// (same group, same layer shapes; the scale update runs in both), compared with a bare
// ncclAllReduce(MAX) of as many floats as libte reduces per step (and of 144), on the same
// communicator and stream, in the same run. Three timings each:
//   pipelined  K steps enqueued back to back, one synchronize at the end, / K
//   synced     each step followed by a stream synchronize (the step's latency)
//   graph      the step (and the bare all-reduce) captured once in a CUDA graph, the graph
//              launched K times back to back, / K: the GPU-side cost without the host's
//              (48 tiny layers make an eager step host-bound, and the ranks' host jitter then
//              shows up as waiting inside the all-reduce)
// Ranks are forked, one per GPU (CUDA_VISIBLE_DEVICES). Rank 0 prints one JSON object.
// Usage: te_bench_nccl [ranks (default 2)] [reps (default 15)] [steps per rep (default 200)]
// Exits 0 with {"skipped": ...} with fewer GPUs than ranks.
#include <te/te.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "multi_rank.h"  // tests/dist: checks, child wait, out-of-band files

namespace {

using multi_rank::g_rank;
using multi_rank::share_bytes;
using multi_rank::wait_child;

constexpr int kLayers = 48;
constexpr int kDim = 16;  // tokens = in = out
constexpr int kBareCount = 144;

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

te_tensor bf16_matrix(void *data, int64_t rows, int64_t cols) {
  te_tensor t;
  std::memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = TE_DTYPE_BF16;
  t.device.type = TE_DEVICE_CUDA;
  t.device.index = 0;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Model {
  te_context *ctx;
  std::vector<te_linear *> lin;
  std::vector<te_tensor> w, act;  // act[0] = x, act[l+1] = layer l's output
  te_autocast_options opts;

  // One training-style forward step: one autocast scope, 48 linears.
  void step() {
    te_autocast_token token;
    te_linear_backward_ctx *bwd[kLayers];
    CHECK_TE(te_autocast_begin(ctx, &opts, &token));
    for (int l = 0; l < kLayers; ++l) {
      te_linear_forward_args fa;
      CHECK_TE(te_linear_forward_args_init(&fa));
      fa.input = &act[l];
      fa.weight = &w[l];
      CHECK_TE(te_linear_forward(ctx, lin[l], &fa, &act[l + 1], &bwd[l]));
    }
    CHECK_TE(te_autocast_end(ctx, token));
    for (int l = 0; l < kLayers; ++l) te_linear_backward_ctx_destroy(bwd[l]);
  }
};

int run_rank(int rank, int nranks, const std::string &dir, int reps, int steps) {
  g_rank = rank;
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  ncclUniqueId id;
  if (rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
  share_bytes(dir, "nccl_id", &id, sizeof id);
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, nranks, id, rank));

  te_context_options copts;
  CHECK_TE(te_context_options_init(&copts));
  copts.use_default_device = 0;
  copts.device.type = TE_DEVICE_CUDA;
  copts.device.index = 0;
  te_context *ctx = nullptr;
  CHECK_TE(te_context_create(&ctx, &copts));
  CHECK_TE(te_context_set_stream(ctx, stream));
  te_group *group = nullptr;
  CHECK_TE(te_group_create_nccl(&group, comm));

  te_recipe *recipes[2] = {nullptr, nullptr};  // [0] reduce_amax = 0, [1] reduce_amax = 1
  for (int r = 0; r < 2; ++r) {
    te_recipe_options ro;
    CHECK_TE(te_recipe_options_init(&ro, TE_RECIPE_DELAYED_SCALING));
    ro.reduce_amax = r;
    CHECK_TE(te_recipe_create(&recipes[r], &ro));
  }

  // Shared parameters and activations; one set of layers (scaling states) per recipe.
  const size_t elems = size_t(kDim) * kDim;
  std::vector<void *> blocks;
  auto device_bf16 = [&](float stddev, uint32_t seed) {
    std::vector<uint16_t> host(elems);
    uint32_t s = seed * 2654435761u + 1u;
    for (auto &h : host) {
      s = s * 1664525u + 1013904223u;
      h = to_bf16(stddev * (static_cast<float>(s >> 8) / 8388608.0f - 1.0f) * 1.7f);
    }
    void *p = nullptr;
    CHECK_TE(te_context_malloc(ctx, elems * 2, &p));
    CHECK_TE(te_context_copy(ctx, p, host.data(), elems * 2, TE_COPY_HOST_TO_DEVICE));
    blocks.push_back(p);
    return p;
  };
  std::vector<te_tensor> w, act;
  act.push_back(bf16_matrix(device_bf16(1.0f, 1000 + rank), kDim, kDim));  // per-rank data
  for (int l = 0; l < kLayers; ++l) {
    w.push_back(bf16_matrix(device_bf16(0.25f, l), kDim, kDim));
    act.push_back(bf16_matrix(device_bf16(0.0f, 0), kDim, kDim));
  }
  Model models[2];
  for (int r = 0; r < 2; ++r) {
    Model &m = models[r];
    m.ctx = ctx;
    m.w = w;
    m.act = act;
    CHECK_TE(te_autocast_options_init(&m.opts));
    m.opts.recipe = recipes[r];
    m.opts.group = group;
    te_linear_options lo;
    CHECK_TE(te_linear_options_init(&lo));
    lo.in_features = kDim;
    lo.out_features = kDim;
    lo.bias = 0;
    lo.activation_dtype = TE_DTYPE_BF16;
    for (int l = 0; l < kLayers; ++l) {
      te_linear *p = nullptr;
      CHECK_TE(te_linear_create(&p, ctx, &lo));
      m.lin.push_back(p);
    }
  }

  // How many scaling states one step updates (and libte reduces), and how many all-reduces.
  te_context_stats st0, st1;
  st0.struct_size = st1.struct_size = sizeof st0;
  CHECK_TE(te_context_get_stats(ctx, &st0));
  models[1].step();
  CHECK_TE(te_context_synchronize(ctx));
  CHECK_TE(te_context_get_stats(ctx, &st1));
  const int states_per_step = int(st1.states_updated - st0.states_updated);
  const int reductions_per_step = int(st1.amax_reductions - st0.amax_reductions);

  float *bare = nullptr, *sync_buf = nullptr;
  CHECK_CUDA(cudaMalloc(&bare, sizeof(float) * std::max(kBareCount, states_per_step)));
  CHECK_CUDA(cudaMemset(bare, 0, sizeof(float) * std::max(kBareCount, states_per_step)));
  CHECK_CUDA(cudaMalloc(&sync_buf, sizeof(float)));
  auto barrier = [&] {
    CHECK_TE(te_context_synchronize(ctx));
    CHECK_NCCL(ncclAllReduce(sync_buf, sync_buf, 1, ncclFloat32, ncclMax, comm, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
  };
  auto bare_step = [&](int count) {
    CHECK_NCCL(ncclAllReduce(bare, bare, size_t(count), ncclFloat32, ncclMax, comm, stream));
  };

  // Each case: returns per-step microseconds, pipelined or synced.
  // kNoReducePlusBare: the reduce_amax = 0 step followed by the bare all-reduce, i.e. what the
  // step would cost if the program reduced the amaxes itself (the ranks then run in lockstep too).
  enum Case { kNoReduce, kReduce, kBareStates, kBare144, kNoReducePlusBare, kCases };
  auto enqueue = [&](int c) {
    switch (c) {
      case kNoReduce: models[0].step(); break;
      case kReduce: models[1].step(); break;
      case kBareStates: bare_step(states_per_step); break;
      case kBare144: bare_step(kBareCount); break;
      default: models[0].step(); bare_step(states_per_step); break;  // kNoReducePlusBare
    }
  };
  for (int c = 0; c < kCases; ++c) enqueue(c);  // warm-up: first uses happen outside any graph
  CHECK_CUDA(cudaStreamSynchronize(stream));
  // Each case captured once; thread-local capture, since NCCL's threads make CUDA calls too.
  cudaGraphExec_t graphs[kCases];
  for (int c = 0; c < kCases; ++c) {
    cudaGraph_t g;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    enqueue(c);
    CHECK_CUDA(cudaStreamEndCapture(stream, &g));
    CHECK_CUDA(cudaGraphInstantiate(&graphs[c], g, 0));
    CHECK_CUDA(cudaGraphDestroy(g));
  }
  enum Mode { kPipelined, kSynced, kGraph, kModes };
  auto run_case = [&](int c, int mode) {
    barrier();
    double t0 = now_us();
    for (int i = 0; i < steps; ++i) {
      if (mode == kGraph) CHECK_CUDA(cudaGraphLaunch(graphs[c], stream));
      else enqueue(c);
      if (mode == kSynced) CHECK_CUDA(cudaStreamSynchronize(stream));
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    return (now_us() - t0) / steps;
  };

  for (int m = 0; m < kModes; ++m)
    for (int c = 0; c < kCases; ++c) run_case(c, m);  // warm-up
  std::vector<double> t[kModes][kCases];
  for (int rep = 0; rep < reps; ++rep)
    for (int m = 0; m < kModes; ++m)
      for (int c = 0; c < kCases; ++c) t[m][c].push_back(run_case(c, m));
  for (cudaGraphExec_t g : graphs) CHECK_CUDA(cudaGraphExecDestroy(g));

  te_context_stats st2;
  st2.struct_size = sizeof st2;
  CHECK_TE(te_context_get_stats(ctx, &st2));

  if (rank == 0) {
    std::printf("{\n  \"bench\": \"nccl_amax_overhead\",\n  \"ranks\": %d,\n  \"layers\": %d,\n", nranks, kLayers);
    std::printf("  \"layer_shape\": \"%dx%dx%d bf16\",\n  \"recipe\": \"delayed_scaling\",\n", kDim, kDim, kDim);
    std::printf("  \"forward_states_per_step\": %d,\n  \"amax_allreduces_per_step\": %d,\n", states_per_step,
                reductions_per_step);
    std::printf("  \"reps\": %d,\n  \"steps_per_rep\": %d,\n  \"total_amax_allreduces\": %llu,\n", reps, steps,
                (unsigned long long)st2.amax_reductions);
    const char *names[kModes] = {"pipelined", "synced", "graph"};
    for (int s = 0; s < kModes; ++s) {
      double no = median(t[s][kNoReduce]), yes = median(t[s][kReduce]);
      double b = median(t[s][kBareStates]), b144 = median(t[s][kBare144]);
      double plus = median(t[s][kNoReducePlusBare]);
      std::printf("  \"%s_us\": {\"step_reduce_amax_0\": %.2f, \"step_reduce_amax_1\": %.2f, "
                  "\"overhead\": %.2f, \"bare_allreduce_%d\": %.2f, \"bare_allreduce_144\": %.2f, "
                  "\"overhead_over_bare\": %.2f, "
                  "\"step_reduce_amax_0_plus_bare\": %.2f, \"bare_in_step_overhead\": %.2f}%s\n",
                  names[s], no, yes, yes - no, states_per_step, b, b144, (yes - no) / b, plus, plus - no, s + 1 < kModes ? "," : "");
    }
    std::printf("}\n");
    std::fflush(stdout);
  }

  CHECK_CUDA(cudaFree(bare));
  CHECK_CUDA(cudaFree(sync_buf));
  for (Model &m : models)
    for (te_linear *p : m.lin) te_linear_destroy(p);
  for (void *p : blocks) CHECK_TE(te_context_free(ctx, p));
  CHECK_TE(te_context_synchronize(ctx));
  for (te_recipe *r : recipes) te_recipe_release(r);
  te_context_destroy(ctx);
  te_group_destroy(group);
  CHECK_NCCL(ncclCommDestroy(comm));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast off
  const int nranks = argc > 1 ? std::atoi(argv[1]) : 2;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 15;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 200;
  if (nranks < 2 || reps < 1 || steps < 1) {
    std::fprintf(stderr, "usage: %s [ranks >= 2] [reps] [steps]\n", argv[0]);
    return 2;
  }
  std::fflush(stdout);
  pid_t probe = fork();  // no CUDA in the parent, which forks
  if (probe == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    std::_Exit(std::min(n, 100));
  }
  const int gpus = wait_child(probe);
  if (gpus < nranks) {
    std::printf("{\"bench\": \"nccl_amax_overhead\", \"skipped\": \"%d GPUs, %d ranks asked\"}\n", gpus, nranks);
    return 0;
  }
  char tmpl[] = "/tmp/te_bench_nccl_XXXXXX";
  if (!mkdtemp(tmpl)) return 2;
  const std::string dir = tmpl;
  std::vector<pid_t> pids(nranks);
  for (int r = 0; r < nranks; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      setenv("CUDA_VISIBLE_DEVICES", std::to_string(r).c_str(), 1);
      alarm(300);
      std::_Exit(run_rank(r, nranks, dir, reps, steps));
    }
  }
  int worst = 0;
  for (int r = 0; r < nranks; ++r) {
    int rc = wait_child(pids[r]);
    if (rc) std::fprintf(stderr, "rank %d exited with %d\n", r, rc);
    worst = std::max(worst, rc);
  }
  std::remove((dir + "/nccl_id").c_str());
  rmdir(dir.c_str());
  return worst ? 2 : 0;
}
