// Training-step benchmarks of the transformer modules through the public C API on a CUDA context,
// printed as one JSON object (bench/python/compare_modules.py adds PyTorch's peers):
//   layernorm_linear  LayerNorm + QKV projection, hidden 4096 -> 3 x 4096, bias
//   layernorm_mlp     LayerNorm + fc1 (4096 -> 2 x 14336) + SwiGLU + fc2 (14336 -> 4096), biases
//   grouped_linear    8 experts, 4096 -> 14336, no bias, an uneven split of the tokens (some
//                     counts not multiples of 16)
// 16384 tokens, BF16 activations, for each recipe (delayed, current, block) and for the modules'
// own high-precision path (autocast disabled: "bf16"). One step is a training step with changing
// weights: autocast begin, forward (weight_unchanged = 0), end, backward (TE_BACKWARD_ONCE),
// destroy the backward context. Time per step: wall clock around `iters` steps between two
// te_context_synchronize calls after 3 warm-up steps, median of 5 repetitions (as te_bench_gpu).
// TFLOP/s counts the GEMMs only: 2*M*N*K per forward GEMM, twice that for its dgrad + wgrad.
//
// GroupedLinear is looked up with dlsym, so this program runs against a libte.so that does not
// export it yet (the benchmark then reports "skipped"). Inputs are random, never zeros. A failing
// benchmark records its error in the JSON and the others still run; the exit status is then 1.
// Without a CUDA device the program says so on stderr and exits 77 (ctest: skipped); any other
// failure to start exits 1.
//
// --quick: 2048 tokens, 3 steps (a smoke run); --cpu-dry-run: tiny shapes on the CPU backend, to
// check this program where there is no GPU (its numbers mean nothing).
//
//   te_bench_modules [--quick | --cpu-dry-run] [--iters N] [--reps N] [--only NAME[,NAME...]]
//                    [--recipes delayed,current,block,bf16]
#include <te/te.h>

#include "bench_recipe.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// te_last_error() is copied at once: the next call into libte may replace it.
void check(te_status s, const char *what) {
  if (s != TE_SUCCESS) throw BenchError(std::string(what) + ": " + te_status_string(s) + ": " + te_last_error());
}
#define CHECK(call) check((call), #call)

// ---- JSON out -----------------------------------------------------------------------------------
std::string jstr(const std::string &s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}
std::string jnum(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}
// An object built field by field, in insertion order.
struct JObj {
  std::string body;
  JObj &raw(const std::string &k, const std::string &v) {
    body += (body.empty() ? "" : ", ") + jstr(k) + ": " + v;
    return *this;
  }
  JObj &num(const std::string &k, double v) { return raw(k, jnum(v)); }
  JObj &str(const std::string &k, const std::string &v) { return raw(k, jstr(v)); }
  std::string dump() const { return "{" + body + "}"; }
};
template <class T>
std::string jarray(const std::vector<T> &v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + jnum(static_cast<double>(v[i]));
  return o + "]";
}

// ---- device memory, random BF16 --------------------------------------------------------------
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even (no NaN here)
  return static_cast<uint16_t>(u >> 16);
}

uint64_t splitmix64(uint64_t &s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A device allocation freed when it goes out of scope.
class DeviceBuf {
 public:
  DeviceBuf(te_context *ctx, size_t bytes) : ctx_(ctx), bytes_(bytes) { CHECK(te_context_malloc(ctx, bytes, &ptr_)); }
  ~DeviceBuf() { te_context_free(ctx_, ptr_); }
  DeviceBuf(const DeviceBuf &) = delete;
  DeviceBuf &operator=(const DeviceBuf &) = delete;
  void *get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  te_context *ctx_;
  void *ptr_ = nullptr;
  size_t bytes_;
};

// n random BF16 values, uniform with standard deviation `stddev` (a generator fast enough for
// the 470M weight elements of the grouped benchmark), copied to the device.
std::unique_ptr<DeviceBuf> random_bf16(te_context *ctx, size_t n, float stddev, uint64_t seed) {
  auto buf = std::make_unique<DeviceBuf>(ctx, n * 2);
  std::vector<uint16_t> host(n);
  const float half_width = stddev * std::sqrt(3.0f);
  uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
  for (auto &h : host) {
    const float u = static_cast<float>(splitmix64(s) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    h = to_bf16((2.0f * u - 1.0f) * half_width);
  }
  CHECK(te_context_copy(ctx, buf->get(), host.data(), n * 2, TE_COPY_HOST_TO_DEVICE));
  return buf;
}

std::unique_ptr<DeviceBuf> bf16_out(te_context *ctx, size_t n) { return std::make_unique<DeviceBuf>(ctx, n * 2); }

te_tensor tensor2(const DeviceBuf &b, int64_t rows, int64_t cols, te_device dev) {
  te_tensor t;
  std::memset(&t, 0, sizeof t);
  t.data = b.get();
  t.dtype = TE_DTYPE_BF16;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.device = dev;
  return t;
}
te_tensor tensor1(const DeviceBuf &b, int64_t n, te_device dev) {
  te_tensor t = tensor2(b, n, 1, dev);
  t.ndim = 1;
  t.shape[1] = 0;
  return t;
}

// The leading elements of a BF16 output (up to 1M) are poisoned with NaN before a case and read
// back after it: a NaN/Inf left, or all zeros, means the timed path did not compute the layer.
size_t checked_elements(const DeviceBuf &b) { return std::min<size_t>(b.bytes() / 2, size_t(1) << 20); }

void poison(te_context *ctx, const DeviceBuf &b) {
  const std::vector<uint16_t> nan(checked_elements(b), 0x7FC0);
  CHECK(te_context_copy(ctx, b.get(), nan.data(), nan.size() * 2, TE_COPY_HOST_TO_DEVICE));
}

std::string output_problem(te_context *ctx, const DeviceBuf &b, const char *name) {
  const size_t n = checked_elements(b);
  std::vector<uint16_t> h(n);
  CHECK(te_context_copy(ctx, h.data(), b.get(), n * 2, TE_COPY_DEVICE_TO_HOST));
  size_t nonfinite = 0, zeros = 0;
  for (uint16_t v : h) {
    if ((v & 0x7F80) == 0x7F80) ++nonfinite;
    if ((v & 0x7FFF) == 0) ++zeros;
  }
  if (nonfinite) return std::string(name) + ": " + std::to_string(nonfinite) + " non-finite values";
  if (zeros == n) return std::string(name) + ": all zeros";
  return "";
}

// ---- timing -------------------------------------------------------------------------------------
struct Options {
  bool quick = false;
  bool cpu_dry_run = false;  // tiny shapes on the CPU backend: checks this program, times nothing useful
  int iters = 0;  // 0: each benchmark's default
  int reps = 5;
  std::vector<std::string> only;
  std::vector<std::string> recipes = {"delayed", "current", "block", "bf16"};
};

// Seconds per call of fn: median of `reps` timings of `iters` calls each, after 3 warm-up calls.
template <class F>
double time_per_call(te_context *ctx, F &&fn, int iters, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  CHECK(te_context_synchronize(ctx));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    CHECK(te_context_synchronize(ctx));
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// ---- recipes and autocast (one recipe case: bench::RecipeCase, bench_recipe.h) ----------------
// An open autocast scope, ended on the way out of an error too, so that a failed benchmark leaves
// the context's autocast stack empty for the next one.
class Scope {
 public:
  Scope(te_context *ctx, const te_autocast_options *o) : ctx_(ctx) {
    CHECK(te_autocast_begin(ctx, o, &tok_));
    open_ = true;
  }
  void end() {
    open_ = false;
    CHECK(te_autocast_end(ctx_, tok_));
  }
  ~Scope() {
    if (open_) te_autocast_end(ctx_, tok_);
  }

 private:
  te_context *ctx_;
  te_autocast_token tok_ = 0;
  bool open_ = false;
};

// A library handle (a module, a backward context) destroyed on the way out.
template <class T>
struct Owned {
  T *p = nullptr;
  void (*destroy)(T *);
  explicit Owned(void (*d)(T *)) : destroy(d) {}
  ~Owned() { destroy(p); }
  Owned(const Owned &) = delete;
  Owned &operator=(const Owned &) = delete;
};

std::vector<std::string> errors;  // every failure, also printed to stderr

// Runs one (module, recipe) case: `make` builds the module for the recipe and returns the
// training step plus the outputs to check; the result (or the error) goes into `results`.
struct Case {
  std::function<void()> step;
  std::vector<std::pair<const DeviceBuf *, const char *>> outputs;
  std::shared_ptr<void> keep;  // the module and whatever the step needs alive
};

void run_case(te_context *ctx, const std::string &bench, const std::string &recipe, double flops, int iters,
              int reps, const std::function<Case(const bench::RecipeCase &)> &make, JObj &results) {
  JObj r;
  try {
    bench::RecipeCase rc(recipe);
    r.str("recipe", rc.describe());
    Case c = make(rc);
    for (auto &o : c.outputs) poison(ctx, *o.first);
    const double t = time_per_call(ctx, c.step, iters, reps);
    r.num("ms", t * 1e3).num("TFLOPs", flops / t / 1e12);
    std::string problems;
    for (auto &o : c.outputs) {
      std::string p = output_problem(ctx, *o.first, o.second);
      if (!p.empty()) problems += (problems.empty() ? "" : "; ") + p;
    }
    r.str("output_check", problems.empty() ? "ok" : problems);
    if (!problems.empty()) {
      errors.push_back(bench + "/" + recipe + ": output check: " + problems);
      std::fprintf(stderr, "te_bench_modules: %s/%s: output check failed: %s\n", bench.c_str(), recipe.c_str(),
                   problems.c_str());
    }
  } catch (const std::exception &e) {
    r.str("error", e.what());
    errors.push_back(bench + "/" + recipe + ": " + e.what());
    std::fprintf(stderr, "te_bench_modules: %s/%s failed: %s\n", bench.c_str(), recipe.c_str(), e.what());
    te_context_synchronize(ctx);  // let the failed step's work finish before its buffers go
  }
  results.raw(recipe, r.dump());
}

bool wanted(const Options &o, const std::string &name) {
  return o.only.empty() || std::find(o.only.begin(), o.only.end(), name) != o.only.end();
}

// ---- LayerNormLinear ---------------------------------------------------------------------------
std::string bench_layernorm_linear(te_context *ctx, te_device dev, const Options &opt) {
  const int64_t T = opt.cpu_dry_run ? 64 : opt.quick ? 2048 : 16384, H = opt.cpu_dry_run ? 256 : 4096, N = 3 * H;
  const int iters = opt.iters ? opt.iters : (opt.quick || opt.cpu_dry_run ? 3 : 20);
  const double flops = 3 * 2.0 * T * N * H;
  auto x = random_bf16(ctx, T * H, 1.0f, 101), gamma = random_bf16(ctx, H, 0.2f, 102),
       beta = random_bf16(ctx, H, 0.1f, 103), w = random_bf16(ctx, N * H, 0.02f, 104),
       b = random_bf16(ctx, N, 0.1f, 105), dy = random_bf16(ctx, T * N, 1e-3f, 106);
  auto y = bf16_out(ctx, T * N), dx = bf16_out(ctx, T * H), dgamma = bf16_out(ctx, H), dbeta = bf16_out(ctx, H),
       dw = bf16_out(ctx, N * H), db = bf16_out(ctx, N);
  struct Views {
    te_tensor x, gamma, beta, w, b, y, dy, dx, dgamma, dbeta, dw, db;
  };
  auto v = std::make_shared<Views>(Views{tensor2(*x, T, H, dev), tensor1(*gamma, H, dev), tensor1(*beta, H, dev),
                                         tensor2(*w, N, H, dev), tensor1(*b, N, dev), tensor2(*y, T, N, dev),
                                         tensor2(*dy, T, N, dev), tensor2(*dx, T, H, dev), tensor1(*dgamma, H, dev),
                                         tensor1(*dbeta, H, dev), tensor2(*dw, N, H, dev), tensor1(*db, N, dev)});
  JObj results;
  for (const std::string &recipe : opt.recipes) {
    run_case(ctx, "layernorm_linear", recipe, flops, iters, opt.reps, [&](const bench::RecipeCase &rc) {
      te_layernorm_linear_options lo;
      CHECK(te_layernorm_linear_options_init(&lo));
      lo.in_features = H;
      lo.out_features = N;
      lo.bias = 1;
      lo.activation_dtype = TE_DTYPE_BF16;
      lo.normalization = TE_NORM_LAYERNORM;
      auto mod = std::make_shared<Owned<te_layernorm_linear>>(te_layernorm_linear_destroy);
      CHECK(te_layernorm_linear_create(&mod->p, ctx, &lo));
      te_layernorm_linear_forward_args fa;
      CHECK(te_layernorm_linear_forward_args_init(&fa));
      fa.input = &v->x;
      fa.ln_weight = &v->gamma;
      fa.ln_bias = &v->beta;
      fa.weight = &v->w;
      fa.bias = &v->b;
      fa.weight_unchanged = 0;
      te_layernorm_linear_grads g;
      CHECK(te_layernorm_linear_grads_init(&g));
      g.dx = &v->dx;
      g.dln_weight = &v->dgamma;
      g.dln_bias = &v->dbeta;
      g.dw = &v->dw;
      g.db = &v->db;
      te_linear_backward_args once;
      CHECK(te_linear_backward_args_init(&once));
      once.flags = TE_BACKWARD_ONCE;
      const te_autocast_options *ao = rc.autocast();
      te_layernorm_linear *m = mod->p;
      Case c;
      c.keep = mod;
      c.step = [ctx, ao, m, fa, g, once, v] {
        Owned<te_layernorm_linear_backward_ctx> bwd(te_layernorm_linear_backward_ctx_destroy);
        Scope scope(ctx, ao);
        CHECK(te_layernorm_linear_forward(ctx, m, &fa, &v->y, &bwd.p));
        scope.end();
        CHECK(te_layernorm_linear_backward(ctx, bwd.p, &v->dy, &g, &once));
      };
      c.outputs = {{y.get(), "y"}, {dx.get(), "dx"}, {dw.get(), "dw"}};
      return c;
    }, results);
  }
  return JObj()
      .num("tokens", T).num("in_features", H).num("out_features", N).num("bias", 1)
      .str("normalization", "layernorm").num("flops_per_step", flops).num("iters", iters).num("reps", opt.reps)
      .raw("recipes", results.dump())
      .dump();
}

// ---- LayerNormMLP ------------------------------------------------------------------------------
std::string bench_layernorm_mlp(te_context *ctx, te_device dev, const Options &opt) {
  const int64_t T = opt.cpu_dry_run ? 64 : opt.quick ? 2048 : 16384, H = opt.cpu_dry_run ? 256 : 4096,
                F = opt.cpu_dry_run ? 512 : 14336, F1 = 2 * F;  // SwiGLU: fc1 is 2F wide
  const int iters = opt.iters ? opt.iters : (opt.quick || opt.cpu_dry_run ? 3 : 10);
  const double flops = 3 * (2.0 * T * F1 * H + 2.0 * T * H * F);
  auto x = random_bf16(ctx, T * H, 1.0f, 201), gamma = random_bf16(ctx, H, 0.2f, 202),
       beta = random_bf16(ctx, H, 0.1f, 203), w1 = random_bf16(ctx, F1 * H, 0.02f, 204),
       b1 = random_bf16(ctx, F1, 0.1f, 205), w2 = random_bf16(ctx, H * F, 0.02f, 206),
       b2 = random_bf16(ctx, H, 0.1f, 207), dy = random_bf16(ctx, T * H, 1e-3f, 208);
  auto y = bf16_out(ctx, T * H), dx = bf16_out(ctx, T * H), dgamma = bf16_out(ctx, H), dbeta = bf16_out(ctx, H),
       dw1 = bf16_out(ctx, F1 * H), db1 = bf16_out(ctx, F1), dw2 = bf16_out(ctx, H * F), db2 = bf16_out(ctx, H);
  struct Views {
    te_tensor x, gamma, beta, w1, b1, w2, b2, y, dy, dx, dgamma, dbeta, dw1, db1, dw2, db2;
  };
  auto v = std::make_shared<Views>(Views{
      tensor2(*x, T, H, dev), tensor1(*gamma, H, dev), tensor1(*beta, H, dev), tensor2(*w1, F1, H, dev),
      tensor1(*b1, F1, dev), tensor2(*w2, H, F, dev), tensor1(*b2, H, dev), tensor2(*y, T, H, dev),
      tensor2(*dy, T, H, dev), tensor2(*dx, T, H, dev), tensor1(*dgamma, H, dev), tensor1(*dbeta, H, dev),
      tensor2(*dw1, F1, H, dev), tensor1(*db1, F1, dev), tensor2(*dw2, H, F, dev), tensor1(*db2, H, dev)});
  JObj results;
  for (const std::string &recipe : opt.recipes) {
    run_case(ctx, "layernorm_mlp", recipe, flops, iters, opt.reps, [&](const bench::RecipeCase &rc) {
      te_layernorm_mlp_options mo;
      CHECK(te_layernorm_mlp_options_init(&mo));
      mo.hidden_size = H;
      mo.ffn_hidden_size = F;
      mo.bias = 1;
      mo.activation = TE_ACTIVATION_SWIGLU;
      mo.activation_dtype = TE_DTYPE_BF16;
      mo.normalization = TE_NORM_LAYERNORM;
      auto mod = std::make_shared<Owned<te_layernorm_mlp>>(te_layernorm_mlp_destroy);
      CHECK(te_layernorm_mlp_create(&mod->p, ctx, &mo));
      te_layernorm_mlp_forward_args fa;
      CHECK(te_layernorm_mlp_forward_args_init(&fa));
      fa.input = &v->x;
      fa.ln_weight = &v->gamma;
      fa.ln_bias = &v->beta;
      fa.fc1_weight = &v->w1;
      fa.fc1_bias = &v->b1;
      fa.fc2_weight = &v->w2;
      fa.fc2_bias = &v->b2;
      fa.weight_unchanged = 0;
      te_layernorm_mlp_grads g;
      CHECK(te_layernorm_mlp_grads_init(&g));
      g.dx = &v->dx;
      g.dln_weight = &v->dgamma;
      g.dln_bias = &v->dbeta;
      g.dfc1_weight = &v->dw1;
      g.dfc1_bias = &v->db1;
      g.dfc2_weight = &v->dw2;
      g.dfc2_bias = &v->db2;
      te_linear_backward_args once;
      CHECK(te_linear_backward_args_init(&once));
      once.flags = TE_BACKWARD_ONCE;
      const te_autocast_options *ao = rc.autocast();
      te_layernorm_mlp *m = mod->p;
      Case c;
      c.keep = mod;
      c.step = [ctx, ao, m, fa, g, once, v] {
        Owned<te_layernorm_mlp_backward_ctx> bwd(te_layernorm_mlp_backward_ctx_destroy);
        Scope scope(ctx, ao);
        CHECK(te_layernorm_mlp_forward(ctx, m, &fa, &v->y, &bwd.p));
        scope.end();
        CHECK(te_layernorm_mlp_backward(ctx, bwd.p, &v->dy, &g, &once));
      };
      c.outputs = {{y.get(), "y"}, {dx.get(), "dx"}, {dw1.get(), "dfc1_weight"}, {dw2.get(), "dfc2_weight"}};
      return c;
    }, results);
  }
  return JObj()
      .num("tokens", T).num("hidden_size", H).num("ffn_hidden_size", F).num("bias", 1)
      .str("activation", "swiglu").str("normalization", "layernorm").num("flops_per_step", flops)
      .num("iters", iters).num("reps", opt.reps)
      .raw("recipes", results.dump())
      .dump();
}

// ---- GroupedLinear (looked up at run time) -----------------------------------------------------
template <class F>
F lookup(const char *name, std::string &missing) {
  void *p = dlsym(RTLD_DEFAULT, name);
  if (!p) missing += (missing.empty() ? "" : ", ") + std::string(name);
  return reinterpret_cast<F>(p);
}
#define TE_LOOKUP(name) auto p_##name = lookup<decltype(&name)>(#name, missing)

std::string bench_grouped_linear(te_context *ctx, te_device dev, const Options &opt) {
  std::string missing;
  TE_LOOKUP(te_grouped_linear_options_init);
  TE_LOOKUP(te_grouped_linear_create);
  TE_LOOKUP(te_grouped_linear_destroy);
  TE_LOOKUP(te_grouped_linear_forward_args_init);
  TE_LOOKUP(te_grouped_linear_forward);
  TE_LOOKUP(te_grouped_linear_backward);
  TE_LOOKUP(te_grouped_linear_backward_ctx_destroy);
  if (!missing.empty()) {
    std::fprintf(stderr, "te_bench_modules: grouped_linear skipped: libte.so does not export %s\n", missing.c_str());
    return JObj().str("skipped", "this libte.so does not export " + missing).dump();
  }
  const int E = 8;
  const int64_t H = opt.cpu_dry_run ? 256 : 4096, N = opt.cpu_dry_run ? 512 : 14336;
  // Uneven, fixed; 2411, 1563, 3007, 1129, 1817 and 1809 are not multiples of 16.
  const std::vector<int64_t> splits = opt.cpu_dry_run ? std::vector<int64_t>{9, 0, 16, 7, 3, 13, 12, 4}
                                      : opt.quick     ? std::vector<int64_t>{301, 195, 256, 376, 141, 325, 227, 227}
                                                      : std::vector<int64_t>{2411, 1563, 2048, 3007, 1129, 2600, 1817, 1809};
  int64_t T = 0;
  for (int64_t s : splits) T += s;
  const int iters = opt.iters ? opt.iters : (opt.quick || opt.cpu_dry_run ? 3 : 10);
  const double flops = 3 * 2.0 * T * N * H;
  auto x = random_bf16(ctx, T * H, 1.0f, 301), dy = random_bf16(ctx, T * N, 1e-3f, 302);
  auto y = bf16_out(ctx, T * N), dx = bf16_out(ctx, T * H);
  std::vector<std::unique_ptr<DeviceBuf>> w, dw;
  for (int e = 0; e < E; ++e) {
    w.push_back(random_bf16(ctx, N * H, 0.02f, 310 + e));
    dw.push_back(bf16_out(ctx, N * H));
  }
  struct Views {
    te_tensor x, y, dy, dx;
    std::vector<te_tensor> w, dw;
    std::vector<const te_tensor *> wp;
    std::vector<te_tensor *> dwp;
  };
  auto v = std::make_shared<Views>();
  v->x = tensor2(*x, T, H, dev);
  v->y = tensor2(*y, T, N, dev);
  v->dy = tensor2(*dy, T, N, dev);
  v->dx = tensor2(*dx, T, H, dev);
  for (int e = 0; e < E; ++e) {
    v->w.push_back(tensor2(*w[e], N, H, dev));
    v->dw.push_back(tensor2(*dw[e], N, H, dev));
  }
  for (int e = 0; e < E; ++e) {
    v->wp.push_back(&v->w[e]);
    v->dwp.push_back(&v->dw[e]);
  }
  JObj results;
  for (const std::string &recipe : opt.recipes) {
    run_case(ctx, "grouped_linear", recipe, flops, iters, opt.reps, [&](const bench::RecipeCase &rc) {
      te_grouped_linear_options go;
      CHECK(p_te_grouped_linear_options_init(&go));
      go.num_gemms = E;
      go.in_features = H;
      go.out_features = N;
      go.bias = 0;
      go.activation_dtype = TE_DTYPE_BF16;
      auto mod = std::make_shared<Owned<te_grouped_linear>>(p_te_grouped_linear_destroy);
      CHECK(p_te_grouped_linear_create(&mod->p, ctx, &go));
      te_grouped_linear_forward_args fa;
      CHECK(p_te_grouped_linear_forward_args_init(&fa));
      fa.input = &v->x;
      fa.m_splits = splits.data();
      fa.weights = v->wp.data();
      fa.biases = nullptr;
      fa.weight_unchanged = 0;
      te_linear_backward_args once;
      CHECK(te_linear_backward_args_init(&once));
      once.flags = TE_BACKWARD_ONCE;
      const te_autocast_options *ao = rc.autocast();
      te_grouped_linear *m = mod->p;
      auto fwd = p_te_grouped_linear_forward;
      auto bwd_fn = p_te_grouped_linear_backward;
      auto destroy = p_te_grouped_linear_backward_ctx_destroy;
      Case c;
      c.keep = mod;
      c.step = [ctx, ao, m, fa, once, v, fwd, bwd_fn, destroy] {
        Owned<te_grouped_linear_backward_ctx> bwd(destroy);
        Scope scope(ctx, ao);
        check(fwd(ctx, m, &fa, &v->y, &bwd.p), "te_grouped_linear_forward");
        scope.end();
        check(bwd_fn(ctx, bwd.p, &v->dy, &v->dx, v->dwp.data(), nullptr, &once), "te_grouped_linear_backward");
      };
      c.outputs = {{y.get(), "y"}, {dx.get(), "dx"}, {dw[0].get(), "dw[0]"}, {dw[E - 1].get(), "dw[7]"}};
      return c;
    }, results);
  }
  return JObj()
      .num("tokens", T).num("num_gemms", E).num("in_features", H).num("out_features", N).num("bias", 0)
      .raw("m_splits", jarray(splits)).num("flops_per_step", flops).num("iters", iters).num("reps", opt.reps)
      .raw("recipes", results.dump())
      .dump();
}

[[noreturn]] void usage(const char *msg) {
  std::fprintf(stderr,
               "te_bench_modules: %s\nusage: te_bench_modules [--quick | --cpu-dry-run] [--iters N] [--reps N] "
               "[--only layernorm_linear,layernorm_mlp,grouped_linear] [--recipes delayed,current,block,bf16]\n",
               msg);
  std::exit(2);
}

std::vector<std::string> split_list(const std::string &s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    auto positive = [&](const std::string &s) {
      char *end = nullptr;
      long n = std::strtol(s.c_str(), &end, 10);
      if (!end || *end || n <= 0 || n > 100000) usage((a + " needs a positive integer").c_str());
      return static_cast<int>(n);
    };
    if (a == "--quick") o.quick = true;
    else if (a == "--cpu-dry-run") o.cpu_dry_run = true;
    else if (a == "--iters") o.iters = positive(value());
    else if (a == "--reps") o.reps = positive(value());
    else if (a == "--only") o.only = split_list(value());
    else if (a == "--recipes") o.recipes = split_list(value());
    else usage(("unknown argument " + a).c_str());
  }
  for (const auto &n : o.only)
    if (n != "layernorm_linear" && n != "layernorm_mlp" && n != "grouped_linear") usage(("unknown benchmark " + n).c_str());
  for (const auto &r : o.recipes)
    if (r != "delayed" && r != "current" && r != "block" && r != "bf16") usage(("unknown recipe " + r).c_str());
  return o;
}

}  // namespace

int main(int argc, char **argv) {
  const Options opt = parse(argc, argv);
  te_context_options co;
  te_status s = te_context_options_init(&co);
  if (s != TE_SUCCESS) {
    std::fprintf(stderr, "te_bench_modules: te_context_options_init: %s\n", te_last_error());
    return 1;
  }
  co.use_default_device = 0;
  co.device.type = opt.cpu_dry_run ? TE_DEVICE_CPU : TE_DEVICE_CUDA;
  co.device.index = 0;
  te_context *ctx = nullptr;
  s = te_context_create(&ctx, &co);
  if (s == TE_ERROR_UNSUPPORTED) {  // no usable GPU, or a build without the CUDA backend
    std::fprintf(stderr, "te_bench_modules: no CUDA device: te_context_create(CUDA 0): %s: %s\n",
                 te_status_string(s), te_last_error());
    return 77;
  }
  if (s != TE_SUCCESS) {
    std::fprintf(stderr, "te_bench_modules: te_context_create(CUDA 0) failed: %s: %s\n", te_status_string(s),
                 te_last_error());
    return 1;
  }
  te_device dev;
  s = te_context_get_device(ctx, &dev);
  if (s != TE_SUCCESS) {
    std::fprintf(stderr, "te_bench_modules: te_context_get_device: %s\n", te_last_error());
    te_context_destroy(ctx);
    return 1;
  }

  JObj benches;
  using Bench = std::string (*)(te_context *, te_device, const Options &);
  const std::pair<const char *, Bench> all[] = {{"layernorm_linear", bench_layernorm_linear},
                                                {"layernorm_mlp", bench_layernorm_mlp},
                                                {"grouped_linear", bench_grouped_linear}};
  for (const auto &b : all) {
    if (!wanted(opt, b.first)) continue;
    std::fprintf(stderr, "te_bench_modules: %s ...\n", b.first);
    try {
      benches.raw(b.first, b.second(ctx, dev, opt));
    } catch (const std::exception &e) {  // setup (allocation, input copy) failed
      benches.raw(b.first, JObj().str("error", e.what()).dump());
      errors.push_back(std::string(b.first) + ": " + e.what());
      std::fprintf(stderr, "te_bench_modules: %s failed: %s\n", b.first, e.what());
    }
  }
  std::string errs = "[";
  for (size_t i = 0; i < errors.size(); ++i) errs += (i ? ", " : "") + jstr(errors[i]);
  errs += "]";
  JObj top;
  top.str("program", "te_bench_modules")
      .num("libte_version", te_version())
      .num("device_index", dev.index)
      .num("quick", opt.quick)
      .num("cpu_dry_run", opt.cpu_dry_run)
      .str("timing", "wall clock around iters training steps between te_context_synchronize calls, 3 warm-up "
                     "steps, median of reps repetitions")
      .str("flops", "GEMMs only: 2*M*N*K per forward GEMM, x3 for forward + dgrad + wgrad")
      .raw("benchmarks", benches.dump())
      .raw("errors", errs);
  std::printf("%s\n", top.dump().c_str());
  te_context_destroy(ctx);
  return errors.empty() ? 0 : 1;
}
