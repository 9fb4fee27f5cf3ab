// Host overhead of libte's hot-path calls, measured through the public C API on a CPU context:
// what a training framework pays per call before any math happens.
//   BM_AutocastPair          te_autocast_begin + te_autocast_end, options built once (target <= 50 ns)
//   BM_RecipeKey             te_recipe_key on an existing recipe (target <= 2 ns)
//   BM_CallFloor             te_version(): the cost of any call into libte.so, for reference
//   BM_LinearForwardBackward one FP8 Linear step at a tiny shape (16x16x16, F32 activations),
//                            scope included: host time dominates the math at this size
// Run with bench/run_host.sh (JSON into bench/host_overhead.json).
#include <benchmark/benchmark.h>
#include <te/te.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

// Set when any benchmark hit an error, so that the program (and the ctest smoke run) fails.
bool g_failed = false;

// Failures stop the benchmark with libte's message; a benchmark never measures errors.
void check(te_status status, const char *what, benchmark::State &state) {
  if (status != TE_SUCCESS) {
    g_failed = true;
    std::fprintf(stderr, "%s: %s: %s\n", what, te_status_string(status), te_last_error());
    state.SkipWithError(what);
  }
}

te_context *make_cpu_context(benchmark::State &state) {
  te_context_options opts;
  te_context_options_init(&opts);
  opts.use_default_device = 0;
  opts.device.type = TE_DEVICE_CPU;
  opts.device.index = 0;
  te_context *ctx = nullptr;
  check(te_context_create(&ctx, &opts), "te_context_create", state);
  return ctx;
}

te_tensor matrix(float *data, int64_t rows, int64_t cols) {
  te_tensor t{};
  t.data = data;
  t.dtype = TE_DTYPE_F32;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.device.type = TE_DEVICE_CPU;
  return t;
}

te_tensor vector(float *data, int64_t n) {
  te_tensor t = matrix(data, n, 1);
  t.ndim = 1;
  t.shape[1] = 0;
  return t;
}

void BM_AutocastPair(benchmark::State &state) {
  te_context *ctx = make_cpu_context(state);
  te_recipe *recipe = nullptr;
  check(te_recipe_create(&recipe, nullptr), "te_recipe_create", state);
  te_autocast_options opts;
  te_autocast_options_init(&opts);
  opts.recipe = recipe;
  for (auto _ : state) {
    te_autocast_token token = 0;
    te_status begin = te_autocast_begin(ctx, &opts, &token);
    te_status end = te_autocast_end(ctx, token);
    if (begin != TE_SUCCESS || end != TE_SUCCESS) {
      check(begin != TE_SUCCESS ? begin : end, "te_autocast_begin/end", state);
      break;
    }
    benchmark::DoNotOptimize(token);
  }
  te_recipe_release(recipe);
  te_context_destroy(ctx);
}
BENCHMARK(BM_AutocastPair);

void BM_RecipeKey(benchmark::State &state) {
  te_recipe *recipe = nullptr;
  check(te_recipe_create(&recipe, nullptr), "te_recipe_create", state);
  for (auto _ : state) {
    // te_recipe_key is an opaque call into libte.so, so it cannot be hoisted out of the loop;
    // DoNotOptimize keeps its result alive without adding a store/reload chain to the timing.
    uint64_t key = te_recipe_key(recipe);
    benchmark::DoNotOptimize(key);
  }
  te_recipe_release(recipe);
}
BENCHMARK(BM_RecipeKey);

// The floor under BM_RecipeKey: the cheapest call into libte.so (through the PLT), which
// returns a constant. A getter cannot cost less than this from outside the library.
void BM_CallFloor(benchmark::State &state) {
  for (auto _ : state) {
    unsigned v = te_version();
    benchmark::DoNotOptimize(v);
  }
}
BENCHMARK(BM_CallFloor);

void BM_LinearForwardBackward(benchmark::State &state) {
  constexpr int64_t kTokens = 16, kIn = 16, kOut = 16;
  te_context *ctx = make_cpu_context(state);
  te_linear_options lopts;
  te_linear_options_init(&lopts);
  lopts.in_features = kIn;
  lopts.out_features = kOut;
  lopts.activation_dtype = TE_DTYPE_F32;
  te_linear *lin = nullptr;
  check(te_linear_create(&lin, ctx, &lopts), "te_linear_create", state);

  std::vector<float> x(kTokens * kIn), w(kOut * kIn), b(kOut), y(kTokens * kOut);
  std::vector<float> dy(kTokens * kOut), dx(kTokens * kIn), dw(kOut * kIn), db(kOut);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 11) * 0.1f - 0.5f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 7) * 0.02f - 0.06f;
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(i % 5) * 0.01f;
  te_tensor tx = matrix(x.data(), kTokens, kIn), tw = matrix(w.data(), kOut, kIn);
  te_tensor ty = matrix(y.data(), kTokens, kOut), tdy = matrix(dy.data(), kTokens, kOut);
  te_tensor tdx = matrix(dx.data(), kTokens, kIn), tdw = matrix(dw.data(), kOut, kIn);
  te_tensor tb = vector(b.data(), kOut), tdb = vector(db.data(), kOut);

  te_autocast_options aopts;  // enabled, default (delayed scaling) recipe, single rank
  te_autocast_options_init(&aopts);
  te_linear_forward_args fwd;
  te_linear_forward_args_init(&fwd);
  fwd.input = &tx;
  fwd.weight = &tw;
  fwd.bias = &tb;

  for (auto _ : state) {
    te_autocast_token token = 0;
    te_linear_backward_ctx *saved = nullptr;
    te_status begin = te_autocast_begin(ctx, &aopts, &token);
    if (begin != TE_SUCCESS) {
      check(begin, "te_autocast_begin", state);
      break;
    }
    te_status s = te_linear_forward(ctx, lin, &fwd, &ty, &saved);
    if (s == TE_SUCCESS) s = te_linear_backward(ctx, saved, &tdy, &tdx, &tdw, &tdb, nullptr);
    te_linear_backward_ctx_destroy(saved);
    te_status end = te_autocast_end(ctx, token);
    if (s != TE_SUCCESS || end != TE_SUCCESS) {
      check(s != TE_SUCCESS ? s : end, "linear forward/backward step", state);
      break;
    }
    benchmark::ClobberMemory();
  }
  state.counters["tokens"] = kTokens;
  state.counters["in"] = kIn;
  state.counters["out"] = kOut;
  te_linear_destroy(lin);
  te_context_destroy(ctx);
}
BENCHMARK(BM_LinearForwardBackward);

}  // namespace

int main(int argc, char **argv) {
  benchmark::AddCustomContext("libte_version", te_version_string());
  benchmark::AddCustomContext("device", "cpu");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return g_failed ? 1 : 0;
}
