// GPU benchmarks through the public C API on a CUDA context, printed as one JSON object:
//   copy            a device-to-device copy of the cast's input bytes: the bandwidth ceiling
//   cast_transpose  BF16 [rows, cols] -> E4M3 + its transpose, delayed scaling (amax fused);
//                   _current: current scaling (amax pass + cast); block_quantize_1x128 / _128x128:
//                   the block recipe's activation / weight quantization (both directions)
//   norm_cast       LayerNorm / RMSNorm of BF16 [rows, hidden] -> E4M3 + its transpose + amax
//                   (+ mu, rsigma) in one pass, against a copy of the input's bytes
//   gemm_fp8        E4M3 x E4M3 -> BF16, per-tensor scales, fast accumulation, TN
//   linear          te_linear forward + backward (dx, dW, db), BF16 activations, bias, W cast
//                   again every step (weight_unchanged = 0), for each recipe: delayed and current
//                   (HYBRID: E4M3 forward, E5M2 gradients), block (E4M3, 1x128 / 128x128 blocks),
//                   and "bf16" (autocast disabled)
//   host_forward    host time per te_linear_forward call inside an unsynchronised training loop
// Options: --quick (fewer shapes), --cast (the casts alone), --norm (the norms alone, with and without out_t),
// --linear (the Linear steps alone).
// bench/python/compare_torch.py runs this program and PyTorch's peers in one run and prints one
// table. Inputs are random (never zeros). Times: wall clock around many iterations between two
// te_context_synchronize calls, after warm-up.
#include <te/te.h>

#include "bench_check.h"
#include "bench_recipe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {


uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even (no NaN here)
  return static_cast<uint16_t>(u >> 16);
}

// A device buffer of random BF16 values with standard deviation `stddev`.
struct DeviceBf16 {
  te_context *ctx;
  void *ptr = nullptr;
  DeviceBf16(te_context *c, size_t n, float stddev, uint32_t seed) : ctx(c) {
    std::vector<uint16_t> host(n);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, stddev);
    for (auto &h : host) h = to_bf16(dist(rng));
    CHECK(te_context_malloc(ctx, n * 2, &ptr));
    CHECK(te_context_copy(ctx, ptr, host.data(), n * 2, TE_COPY_HOST_TO_DEVICE));
  }
  ~DeviceBf16() { te_context_free(ctx, ptr); }
};

void *device_alloc(te_context *ctx, size_t bytes) {
  void *p = nullptr;
  CHECK(te_context_malloc(ctx, bytes, &p));
  return p;
}

te_tensor tensor(void *data, te_dtype dt, int64_t rows, int64_t cols, te_device dev) {
  te_tensor t;
  std::memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dt;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.device = dev;
  return t;
}

// Seconds per call of fn, median of `reps` timings of `iters` calls each.
template <class F>
double time_per_call(te_context *ctx, F &&fn, int iters, int reps = 5) {
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

std::string json_out;
void emit(const std::string &name, const std::string &fields) {
  json_out += (json_out.empty() ? "" : ",\n") + std::string("  \"") + name + "\": {" + fields + "}";
}
std::string num(const char *k, double v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "\"%s\": %.6g", k, v);
  return buf;
}
// "k": "v" with v escaped for JSON (quotes, backslashes, control characters).
std::string str(const char *k, const std::string &v) {
  std::string o = std::string("\"") + k + "\": \"";
  for (char c : v) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      o += buf;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

void bench_cast(te_context *ctx, te_device dev, int64_t rows, int64_t cols) {
  const size_t n = static_cast<size_t>(rows * cols);
  DeviceBf16 x(ctx, n, 1.0f, 1);
  void *copy_dst = device_alloc(ctx, n * 2);
  void *out = device_alloc(ctx, n), *out_t = device_alloc(ctx, n);
  float *f = static_cast<float *>(device_alloc(ctx, 4 * sizeof(float)));  // scale, amax, sinv x2
  const float host_init[4] = {100.0f, 0.0f, 0.0f, 0.0f};
  CHECK(te_context_copy(ctx, f, host_init, sizeof host_init, TE_COPY_HOST_TO_DEVICE));
  te_tensor tx = tensor(x.ptr, TE_DTYPE_BF16, rows, cols, dev);
  te_tensor to = tensor(out, TE_DTYPE_E4M3, rows, cols, dev), tt = tensor(out_t, TE_DTYPE_E4M3, cols, rows, dev);
  to.scale_inv = f + 2;
  tt.scale_inv = f + 3;
  te_quantize_options q;
  CHECK(te_quantize_options_init(&q));
  q.scale = f;
  q.amax = f + 1;
  double t_copy = time_per_call(ctx, [&] {
    CHECK(te_context_copy(ctx, copy_dst, x.ptr, n * 2, TE_COPY_DEVICE_TO_DEVICE));
  }, 20);
  const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
  // Bytes moved: the copy reads and writes 2n; the cast reads 2n and writes n + n (+ the scales).
  const double copy_bw = 4.0 * n / t_copy;
  auto emit_cast = [&](const std::string &key, double t) {
    const double cast_bw = 4.0 * n / t;
    emit(key + "_" + shape, num("ms", t * 1e3) + ", " + num("TBps", cast_bw / 1e12) + ", " +
                                num("copy_ms", t_copy * 1e3) + ", " + num("copy_TBps", copy_bw / 1e12) + ", " +
                                num("fraction_of_copy", cast_bw / copy_bw));
  };
  emit_cast("cast_transpose", time_per_call(ctx, [&] { CHECK(te_cast_transpose(ctx, &tx, &to, &tt, &q)); }, 20));
  // Current scaling: the amax pass, then the cast with the scale from it.
  te_quantize_options qc;
  CHECK(te_quantize_options_init(&qc));
  emit_cast("cast_transpose_current",
            time_per_call(ctx, [&] { CHECK(te_cast_transpose(ctx, &tx, &to, &tt, &qc)); }, 20));
  // Block scaling, as the block recipe quantizes activations (1x128 both ways) and weights (128x128).
  for (te_scaling_mode mode : {TE_SCALING_BLOCK_1X128, TE_SCALING_BLOCK_128X128}) {
    te_tensor bo = to, bt = tt;
    bo.scaling = bt.scaling = mode;
    int64_t count_o = 0, count_t = 0;
    CHECK(te_tensor_scale_inv_count(&count_o, &bo));
    CHECK(te_tensor_scale_inv_count(&count_t, &bt));
    float *sinv = static_cast<float *>(device_alloc(ctx, static_cast<size_t>(count_o + count_t) * sizeof(float)));
    bo.scale_inv = sinv;
    bt.scale_inv = sinv + count_o;
    emit_cast(mode == TE_SCALING_BLOCK_1X128 ? "block_quantize_1x128" : "block_quantize_128x128",
              time_per_call(ctx, [&] { CHECK(te_cast_transpose(ctx, &tx, &bo, &bt, &qc)); }, 20));
    te_context_free(ctx, sinv);
  }
  te_context_free(ctx, copy_dst);
  te_context_free(ctx, out);
  te_context_free(ctx, out_t);
  te_context_free(ctx, f);
}

// The fused norm + FP8 cast: reads BF16 x (2 bytes per element), writes out and out_t (1 + 1), the
// same bytes as a copy of x; mu / rsigma / amax are a few bytes per row. Without out_t
// (`with_t` false: 3 bytes per element) the fraction is of a copy of the same bytes.
void bench_norm_cast(te_context *ctx, te_device dev, int64_t rows, int64_t hidden, te_norm_kind kind,
                     bool with_t = true) {
  const std::string name = std::string(kind == TE_NORM_LAYERNORM ? "norm_cast_layernorm_" : "norm_cast_rmsnorm_") +
                           (with_t ? "" : "no_t_") + std::to_string(rows) + "x" + std::to_string(hidden);
  const size_t n = static_cast<size_t>(rows * hidden);
  DeviceBf16 x(ctx, n, 1.0f, 8), gamma(ctx, static_cast<size_t>(hidden), 0.1f, 9), beta(ctx, static_cast<size_t>(hidden), 0.1f, 10);
  void *copy_dst = device_alloc(ctx, n * 2);
  void *out = device_alloc(ctx, n), *out_t = device_alloc(ctx, n);
  void *stats = device_alloc(ctx, static_cast<size_t>(rows) * 2 * sizeof(float));
  float *f = static_cast<float *>(device_alloc(ctx, 4 * sizeof(float)));  // scale, amax, sinv x2
  const float host_init[4] = {100.0f, 0.0f, 0.0f, 0.0f};
  CHECK(te_context_copy(ctx, f, host_init, sizeof host_init, TE_COPY_HOST_TO_DEVICE));
  te_tensor tx = tensor(x.ptr, TE_DTYPE_BF16, rows, hidden, dev);
  te_tensor tg = tensor(gamma.ptr, TE_DTYPE_BF16, hidden, 1, dev), tb = tensor(beta.ptr, TE_DTYPE_BF16, hidden, 1, dev);
  tg.ndim = tb.ndim = 1;
  te_tensor tmu = tensor(stats, TE_DTYPE_F32, rows, 1, dev);
  te_tensor trs = tensor(static_cast<float *>(stats) + rows, TE_DTYPE_F32, rows, 1, dev);
  tmu.ndim = trs.ndim = 1;
  te_tensor to = tensor(out, TE_DTYPE_E4M3, rows, hidden, dev), tt = tensor(out_t, TE_DTYPE_E4M3, hidden, rows, dev);
  to.scale_inv = f + 2;
  tt.scale_inv = f + 3;
  te_quantize_options q;
  CHECK(te_quantize_options_init(&q));
  q.scale = f;
  q.amax = f + 1;
  te_norm_options o;
  CHECK(te_norm_options_init(&o));
  o.kind = kind;
  te_norm_forward_args a;
  CHECK(te_norm_forward_args_init(&a));
  a.input = &tx;
  a.weight = &tg;
  a.bias = kind == TE_NORM_LAYERNORM ? &tb : nullptr;
  a.output = &to;
  a.output_t = with_t ? &tt : nullptr;
  a.mu = kind == TE_NORM_LAYERNORM ? &tmu : nullptr;
  a.rsigma = &trs;
  a.quantize = &q;
  double t_copy = time_per_call(ctx, [&] {
    CHECK(te_context_copy(ctx, copy_dst, x.ptr, n * 2, TE_COPY_DEVICE_TO_DEVICE));
  }, 20);
  double t_norm = time_per_call(ctx, [&] { CHECK(te_norm_forward(ctx, &o, &a)); }, 20);
  const double bytes = (with_t ? 4.0 : 3.0) * n;
  double copy_bw = 4.0 * n / t_copy, norm_bw = bytes / t_norm;
  emit(name, num("ms", t_norm * 1e3) + ", " + num("TBps", norm_bw / 1e12) + ", " + num("copy_ms", t_copy * 1e3) + ", " +
                 num("copy_TBps", copy_bw / 1e12) + ", " + num("fraction_of_copy", norm_bw / copy_bw));
  for (void *p : {copy_dst, out, out_t, stats}) te_context_free(ctx, p);
  te_context_free(ctx, f);
}

// sa / sb: the operands' scaling (per tensor, or block-scaled as the block recipe's GEMMs:
// activations 1x128, weights 128x128).
void bench_gemm(te_context *ctx, te_device dev, int64_t m, int64_t n, int64_t k,
                te_scaling_mode sa = TE_SCALING_PER_TENSOR, te_scaling_mode sb = TE_SCALING_PER_TENSOR) {
  // Random FP8 operands: quantize random BF16 (current scaling) once.
  DeviceBf16 a16(ctx, static_cast<size_t>(m * k), 1.0f, 2), b16(ctx, static_cast<size_t>(n * k), 1.0f, 3);
  void *a = device_alloc(ctx, static_cast<size_t>(m * k)), *b = device_alloc(ctx, static_cast<size_t>(n * k));
  void *d = device_alloc(ctx, static_cast<size_t>(m * n) * 2);
  te_tensor ta16 = tensor(a16.ptr, TE_DTYPE_BF16, m, k, dev), tb16 = tensor(b16.ptr, TE_DTYPE_BF16, n, k, dev);
  te_tensor ta = tensor(a, TE_DTYPE_E4M3, m, k, dev), tb = tensor(b, TE_DTYPE_E4M3, n, k, dev);
  ta.scaling = sa;
  tb.scaling = sb;
  int64_t na = 0, nb = 0;
  CHECK(te_tensor_scale_inv_count(&na, &ta));
  CHECK(te_tensor_scale_inv_count(&nb, &tb));
  float *sinv = static_cast<float *>(device_alloc(ctx, static_cast<size_t>(na) * sizeof(float)));
  float *sinv_b = static_cast<float *>(device_alloc(ctx, static_cast<size_t>(nb) * sizeof(float)));
  ta.scale_inv = sinv;
  tb.scale_inv = sinv_b;
  CHECK(te_quantize(ctx, &ta16, &ta, nullptr));
  CHECK(te_quantize(ctx, &tb16, &tb, nullptr));
  te_tensor td = tensor(d, TE_DTYPE_BF16, m, n, dev);
  te_gemm_options g;
  CHECK(te_gemm_options_init(&g));
  g.transb = 1;
  double t = time_per_call(ctx, [&] { CHECK(te_gemm(ctx, &ta, &tb, &td, &g)); }, 10);
  const char *mode = sa == TE_SCALING_PER_TENSOR ? "" : sb == TE_SCALING_BLOCK_128X128 ? "_block_1x128_128x128" : "_block_1x128";
  emit("gemm_fp8" + std::string(mode) + "_" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k),
       num("ms", t * 1e3) + ", " + num("TFLOPs", 2.0 * m * n * k / t / 1e12));
  te_context_free(ctx, a);
  te_context_free(ctx, b);
  te_context_free(ctx, d);
  te_context_free(ctx, sinv);
  te_context_free(ctx, sinv_b);
}

// One te_linear training step per call: forward inside the recipe's autocast scope, then
// backward (dx, dW, db), BF16 activations, bias on, weight_unchanged = 0 (the FP8 weight is cast
// again every step, as in a training loop whose optimizer changes W; torchao casts it every step
// too). Key "linear_fwd_bwd_<recipe>_<tokens>x<in>x<out>"; the delayed recipe is also written
// under the older key "linear_fwd_bwd_<tokens>x<in>x<out>", and with `host` set its loop also
// gives "host_linear_forward_...". A recipe whose first step fails is reported under its key as
// {"error": ...} and the program goes on with the next one.
void bench_linear(te_context *ctx, te_device dev, int64_t tokens, int64_t in, int64_t out, const std::string &recipe,
                  bool host) {
  const std::string shape = std::to_string(tokens) + "x" + std::to_string(in) + "x" + std::to_string(out);
  const std::string key = "linear_fwd_bwd_" + recipe + "_" + shape;
  const auto rc = bench::recipe_case_or_exit(recipe, "te_bench_gpu");
  te_linear_options lo;
  CHECK(te_linear_options_init(&lo));
  lo.in_features = in;
  lo.out_features = out;
  lo.activation_dtype = TE_DTYPE_BF16;
  lo.bias = 1;
  te_linear *lin = nullptr;
  CHECK(te_linear_create(&lin, ctx, &lo));
  DeviceBf16 x(ctx, static_cast<size_t>(tokens * in), 1.0f, 4), w(ctx, static_cast<size_t>(out * in), 0.02f, 5);
  DeviceBf16 b(ctx, static_cast<size_t>(out), 0.1f, 6), dy(ctx, static_cast<size_t>(tokens * out), 1e-3f, 7);
  void *y = device_alloc(ctx, static_cast<size_t>(tokens * out) * 2);
  void *dx = device_alloc(ctx, static_cast<size_t>(tokens * in) * 2), *dw = device_alloc(ctx, static_cast<size_t>(out * in) * 2);
  void *db = device_alloc(ctx, static_cast<size_t>(out) * 2);
  te_tensor tx = tensor(x.ptr, TE_DTYPE_BF16, tokens, in, dev), tw = tensor(w.ptr, TE_DTYPE_BF16, out, in, dev);
  te_tensor tb = tensor(b.ptr, TE_DTYPE_BF16, out, 1, dev), ty = tensor(y, TE_DTYPE_BF16, tokens, out, dev);
  tb.ndim = 1;
  te_tensor tdy = tensor(dy.ptr, TE_DTYPE_BF16, tokens, out, dev), tdx = tensor(dx, TE_DTYPE_BF16, tokens, in, dev);
  te_tensor tdw = tensor(dw, TE_DTYPE_BF16, out, in, dev), tdb = tensor(db, TE_DTYPE_BF16, out, 1, dev);
  tdb.ndim = 1;
  te_linear_forward_args fa;
  CHECK(te_linear_forward_args_init(&fa));
  fa.input = &tx;
  fa.weight = &tw;
  fa.bias = &tb;
  fa.weight_unchanged = 0;
  const te_autocast_options *ao = rc->autocast();
  te_linear_backward_args once;
  CHECK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE;

  // The first step with its errors kept (a recipe this build cannot run is reported, not fatal;
  // te_last_error() names the function); the scope is closed after a failed forward too.
  std::string error;
  {
    te_autocast_token tok;
    te_linear_backward_ctx *bwd = nullptr;
    te_status s = te_autocast_begin(ctx, ao, &tok);
    if (s != TE_SUCCESS) {
      error = te_last_error();
    } else {
      s = te_linear_forward(ctx, lin, &fa, &ty, &bwd);
      if (s != TE_SUCCESS) error = te_last_error();
      if (te_autocast_end(ctx, tok) != TE_SUCCESS && error.empty()) error = te_last_error();
    }
    if (error.empty() && te_linear_backward(ctx, bwd, &tdy, &tdx, &tdw, &tdb, &once) != TE_SUCCESS)
      error = te_last_error();
    te_linear_backward_ctx_destroy(bwd);
    if (error.empty() && te_context_synchronize(ctx) != TE_SUCCESS)
      error = te_last_error();
  }
  if (!error.empty()) {
    std::fprintf(stderr, "te_bench_gpu: %s failed: %s\n", key.c_str(), error.c_str());
    emit(key, str("recipe", rc->describe()) + ", " + str("error", error));
  } else {
    auto step = [&] {
      te_autocast_token tok;
      te_linear_backward_ctx *bwd = nullptr;
      CHECK(te_autocast_begin(ctx, ao, &tok));
      CHECK(te_linear_forward(ctx, lin, &fa, &ty, &bwd));
      CHECK(te_autocast_end(ctx, tok));
      CHECK(te_linear_backward(ctx, bwd, &tdy, &tdx, &tdw, &tdb, &once));
      te_linear_backward_ctx_destroy(bwd);
    };
    double t = time_per_call(ctx, step, 10);
    const double flops = 3 * 2.0 * tokens * in * out;
    const std::string fields = num("ms", t * 1e3) + ", " + num("TFLOPs", flops / t / 1e12);
    emit(key, fields + ", " + str("recipe", rc->describe()));
    if (recipe == "delayed") emit("linear_fwd_bwd_" + shape, fields);
  }

  // Host time per forward call in a training loop that does not synchronise: each step's
  // forward is timed on the host while the device runs behind. Few steps, so that the launch
  // queue never fills (a full queue would make the host wait for the device).
  if (host && error.empty()) {
    CHECK(te_context_synchronize(ctx));
    const int steps = 8;
    double host_s = 0.0;
    for (int i = 0; i < steps; ++i) {
      te_autocast_token tok;
      te_linear_backward_ctx *bwd = nullptr;
      CHECK(te_autocast_begin(ctx, ao, &tok));
      auto t0 = std::chrono::steady_clock::now();
      CHECK(te_linear_forward(ctx, lin, &fa, &ty, &bwd));
      host_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      CHECK(te_autocast_end(ctx, tok));
      CHECK(te_linear_backward(ctx, bwd, &tdy, &tdx, &tdw, &tdb, &once));
      te_linear_backward_ctx_destroy(bwd);
    }
    CHECK(te_context_synchronize(ctx));
    emit("host_linear_forward_" + shape, num("us_per_call", host_s / steps * 1e6));
  }

  for (void *p : {y, dx, dw, db}) te_context_free(ctx, p);
  te_linear_destroy(lin);
}

// Linear fwd+bwd for every recipe at issue 15's two shapes (--quick: the first shape only); the
// host forward timing with the delayed recipe, as before.
void bench_linears(te_context *ctx, const te_device &dev, bool quick) {
  for (const char *recipe : {"delayed", "current", "block", "bf16"}) {
    bench_linear(ctx, dev, 16384, 4096, 14336, recipe, std::strcmp(recipe, "delayed") == 0);
    if (!quick) bench_linear(ctx, dev, 16384, 4096, 4096, recipe, std::strcmp(recipe, "delayed") == 0);
  }
}

// Everything after the casts (`--cast` skips it).
void bench_norms_gemms_linears(te_context *ctx, const te_device &dev, bool quick) {
  bench_norm_cast(ctx, dev, 16384, 4096, TE_NORM_LAYERNORM);
  bench_norm_cast(ctx, dev, 16384, 4096, TE_NORM_RMSNORM);
  if (!quick) {
    bench_norm_cast(ctx, dev, 16384, 8192, TE_NORM_LAYERNORM);
    bench_norm_cast(ctx, dev, 16384, 8192, TE_NORM_RMSNORM);
  }
  bench_gemm(ctx, dev, 8192, 8192, 8192);
  if (!quick) {
    bench_gemm(ctx, dev, 16384, 4096, 4096);
    bench_gemm(ctx, dev, 16384, 14336, 4096);
    bench_gemm(ctx, dev, 16384, 4096, 14336);
  }
  // The block recipe's GEMMs: fprop (1x128 x 128x128) at issue 15's shape, and the wgrad kind
  // (1x128 x 1x128).
  bench_gemm(ctx, dev, 16384, 4096, 14336, TE_SCALING_BLOCK_1X128, TE_SCALING_BLOCK_128X128);
  if (!quick) {
    bench_gemm(ctx, dev, 8192, 8192, 8192, TE_SCALING_BLOCK_1X128, TE_SCALING_BLOCK_128X128);
    bench_gemm(ctx, dev, 16384, 14336, 4096, TE_SCALING_BLOCK_1X128, TE_SCALING_BLOCK_128X128);
    bench_gemm(ctx, dev, 4096, 14336, 16384, TE_SCALING_BLOCK_1X128, TE_SCALING_BLOCK_1X128);
  }
  bench_linears(ctx, dev, quick);
}

}  // namespace

int main(int argc, char **argv) {
  te_context_options o;
  CHECK(te_context_options_init(&o));
  o.use_default_device = 0;
  o.device.type = TE_DEVICE_CUDA;
  te_context *ctx = nullptr;
  te_status s = te_context_create(&ctx, &o);
  if (s != TE_SUCCESS) {
    std::printf("{\"skipped\": \"%s\"}\n", te_last_error());
    return 0;
  }
  te_device dev;
  CHECK(te_context_get_device(ctx, &dev));
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool cast_only = argc > 1 && std::strcmp(argv[1], "--cast") == 0;
  if (argc > 1 && std::strcmp(argv[1], "--norm") == 0) {
    // The norms alone, with and without out_t, at transformer widths.
    for (int64_t hidden : {4096, 8192, 14336})
      for (te_norm_kind kind : {TE_NORM_LAYERNORM, TE_NORM_RMSNORM})
        for (bool with_t : {true, false}) bench_norm_cast(ctx, dev, 16384, hidden, kind, with_t);
    te_context_destroy(ctx);
    std::printf("{\n%s\n}\n", json_out.c_str());
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--linear") == 0) {
    bench_linears(ctx, dev, false);
    te_context_destroy(ctx);
    std::printf("{\n%s\n}\n", json_out.c_str());
    return 0;
  }
  bench_cast(ctx, dev, 16384, 4096);
  if (!quick) bench_cast(ctx, dev, 16384, 14336);
  if (!cast_only) bench_norms_gemms_linears(ctx, dev, quick);
  te_context_destroy(ctx);
  std::printf("{\n%s\n}\n", json_out.c_str());
  return 0;
}
