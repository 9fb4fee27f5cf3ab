// Helpers for the te_linear_* API tests: host tensors, an independent FP8/BF16 oracle written
// from the formats' definitions (not from libte), fp64 reference GEMMs and tolerance checks.
// Only the public header is used.
#pragma once

#include <te/te.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace linear_test {

// ---- scalar formats (independent oracle) ----------------------------------------------------

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bfloat16, round to nearest even (NaN kept quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

inline float fp8_max(te_dtype t) { return t == TE_DTYPE_E4M3 ? 448.0f : 57344.0f; }

// Exact decoding of every FP8 code, from the format definitions.
inline float e4m3_decode(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
  float v;
  if (e == 15 && m == 7) return NAN;
  if (e == 0)
    v = std::ldexp(static_cast<float>(m), -9);  // m/8 * 2^-6
  else
    v = std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -v : v;
}
inline float e5m2_decode(uint8_t c) {
  const int s = c >> 7, e = (c >> 2) & 0x1F, m = c & 3;
  float v;
  if (e == 31) {
    if (m != 0) return NAN;
    v = INFINITY;
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -16);  // m/4 * 2^-14
  } else {
    v = std::ldexp(1.0f + m / 4.0f, e - 15);
  }
  return s ? -v : v;
}
inline float fp8_decode(uint8_t c, te_dtype t) {
  return t == TE_DTYPE_E4M3 ? e4m3_decode(c) : e5m2_decode(c);
}

// float -> FP8 code by nearest search over the (monotone) positive codes: round to nearest,
// ties to the even code, saturate to +-max, NaN -> canonical NaN. Independent of libte's
// bit-twiddling encoder on purpose.
inline uint8_t fp8_encode(float v, te_dtype t) {
  const uint8_t max_code = t == TE_DTYPE_E4M3 ? 0x7E : 0x7B;
  if (std::isnan(v)) return t == TE_DTYPE_E4M3 ? 0x7F : 0x7E;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(v));
  if (a >= fp8_decode(max_code, t)) return sign | max_code;
  int lo = 0, hi = max_code;  // invariant: decode(lo) <= a < decode(hi)
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (fp8_decode(static_cast<uint8_t>(mid), t) <= a)
      lo = mid;
    else
      hi = mid;
  }
  const double vlo = fp8_decode(static_cast<uint8_t>(lo), t);
  const double vhi = fp8_decode(static_cast<uint8_t>(hi), t);
  int c;
  if (a - vlo < vhi - a)
    c = lo;
  else if (a - vlo > vhi - a)
    c = hi;
  else
    c = (lo % 2 == 0) ? lo : hi;
  return sign | static_cast<uint8_t>(c);
}

// TE's compute_scale_from_amax, written from DESIGN.md: amax clamped up to epsilon;
// amax 0 / inf / NaN -> 1; scale = fp8_max / amax (fp32 division); inf -> FLT_MAX;
// power-of-2 mode keeps only sign and exponent.
inline float scale_from_amax(float amax, float max, bool pow2, float eps) {
  float a = std::max(amax, eps);
  if (!(a > 0.0f) || std::isinf(a) || std::isnan(amax)) return 1.0f;
  float s = max / a;
  if (std::isinf(s)) s = FLT_MAX;
  if (pow2) s = bits_f32(f32_bits(s) & 0xFF800000u);
  return s;
}

// Delayed-scaling update of one state, TE's rule (DESIGN.md "Scaling state").
inline void ref_delayed_update(std::vector<float> &hist, float *scale, float max, int margin,
                               bool most_recent) {
  float amax = 0.0f;
  if (most_recent) {
    amax = hist[0];
  } else {
    for (float h : hist) amax = std::max(amax, h);
  }
  if (std::isfinite(amax) && amax > 0.0f) {
    float s = (max / amax) / std::ldexp(1.0f, margin);
    if (std::isinf(s)) s = FLT_MAX;
    *scale = s;
  }
  const float first = hist[0];
  for (size_t i = 0; i + 1 < hist.size(); ++i) hist[i] = hist[i + 1];
  hist.back() = first;
  hist[0] = 0.0f;
}

// ---- host tensors ---------------------------------------------------------------------------

inline size_t dtype_bytes(te_dtype t) {
  switch (t) {
    case TE_DTYPE_F32: return 4;
    case TE_DTYPE_F16:
    case TE_DTYPE_BF16: return 2;
    default: return 1;
  }
}
inline const char *dtype_str(te_dtype t) {
  switch (t) {
    case TE_DTYPE_F32: return "F32";
    case TE_DTYPE_F16: return "F16";
    case TE_DTYPE_BF16: return "BF16";
    case TE_DTYPE_E4M3: return "E4M3";
    case TE_DTYPE_E5M2: return "E5M2";
  }
  return "?";
}

// Caller-owned CPU memory with a te_tensor view. t() re-points the view, so copies are safe.
struct HostTensor {
  te_dtype dtype = TE_DTYPE_F32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
  te_tensor view{};

  HostTensor() = default;
  HostTensor(te_dtype dt, std::vector<int64_t> shp) : dtype(dt), shape(std::move(shp)) {
    bytes.assign(static_cast<size_t>(numel()) * dtype_bytes(dt), 0);
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  te_tensor *t() {
    view = te_tensor{};
    view.data = bytes.data();
    view.dtype = dtype;
    view.ndim = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) view.shape[i] = shape[i];
    view.device.type = TE_DEVICE_CPU;
    view.device.index = 0;
    return &view;
  }
  float get(int64_t i) const {
    if (dtype == TE_DTYPE_F32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    if (dtype == TE_DTYPE_BF16) {
      uint16_t b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      return bf16_to_f32(b);
    }
    if (dtype == TE_DTYPE_E4M3 || dtype == TE_DTYPE_E5M2) return fp8_decode(bytes[i], dtype);
    ADD_FAILURE() << "HostTensor::get: unsupported dtype";
    return 0.0f;
  }
  // Stores v rounded to the tensor's dtype; returns the stored value.
  float set(int64_t i, float v) {
    if (dtype == TE_DTYPE_F32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
      return v;
    }
    if (dtype == TE_DTYPE_BF16) {
      uint16_t b = f32_to_bf16(v);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
      return bf16_to_f32(b);
    }
    ADD_FAILURE() << "HostTensor::set: unsupported dtype";
    return 0.0f;
  }
  std::vector<float> values() const {
    std::vector<float> v(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) v[i] = get(i);
    return v;
  }
  void fill_byte(unsigned char b) { std::fill(bytes.begin(), bytes.end(), b); }
};

// Uniform values in [-range, range], rounded to the dtype; optional per-row magnitude pattern
// (row r scaled by 2^((r % 5) - 2)) so block scales differ from block to block.
inline HostTensor random_tensor(te_dtype dt, std::vector<int64_t> shape, float range,
                                uint32_t seed, bool row_pattern = false) {
  HostTensor h(dt, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-range, range);
  const int64_t cols = h.shape.back();
  for (int64_t i = 0; i < h.numel(); ++i) {
    float v = u(rng);
    if (row_pattern) v = std::ldexp(v, static_cast<int>((i / cols) % 5) - 2);
    h.set(i, v);
  }
  return h;
}

// ---- FP8 residual / operand helpers ---------------------------------------------------------

// Number of scale_inv floats for an FP8 [rows, cols] matrix under `mode`.
inline int64_t scale_inv_count(te_scaling_mode mode, int64_t rows, int64_t cols) {
  switch (mode) {
    case TE_SCALING_PER_TENSOR: return 1;
    case TE_SCALING_BLOCK_1X128: return rows * ((cols + 127) / 128);
    case TE_SCALING_BLOCK_128X128: return ((rows + 127) / 128) * ((cols + 127) / 128);
  }
  return 1;
}
inline int64_t scale_inv_index(te_scaling_mode mode, int64_t r, int64_t c, int64_t cols) {
  switch (mode) {
    case TE_SCALING_PER_TENSOR: return 0;
    case TE_SCALING_BLOCK_1X128: return r * ((cols + 127) / 128) + c / 128;
    case TE_SCALING_BLOCK_128X128: return (r / 128) * ((cols + 127) / 128) + c / 128;
  }
  return 0;
}

// A quantized 2-D matrix copied to the test's own memory: codes plus scale_invs.
struct QMatrix {
  int64_t rows = 0, cols = 0;
  te_dtype dtype = TE_DTYPE_E4M3;
  te_scaling_mode mode = TE_SCALING_PER_TENSOR;
  std::vector<uint8_t> codes;
  std::vector<float> scale_inv;
  double deq(int64_t r, int64_t c) const {
    return static_cast<double>(fp8_decode(codes[r * cols + c], dtype)) *
           static_cast<double>(scale_inv[scale_inv_index(mode, r, c, cols)]);
  }
  // Dequantized values, row-major.
  std::vector<double> dequantized() const {
    std::vector<double> v(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = deq(r, c);
    return v;
  }
};

// Copies an FP8 te_tensor (2-D, or N-D seen as a matrix) the library owns.
inline QMatrix copy_qmatrix(const te_tensor &t) {
  QMatrix q;
  q.cols = t.ndim > 0 ? t.shape[t.ndim - 1] : 0;
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  q.rows = q.cols ? n / q.cols : 0;
  q.dtype = t.dtype;
  q.mode = t.scaling;
  q.codes.assign(static_cast<const uint8_t *>(t.data), static_cast<const uint8_t *>(t.data) + n);
  const int64_t ns = scale_inv_count(t.scaling, q.rows, q.cols);
  q.scale_inv.assign(t.scale_inv, t.scale_inv + ns);
  return q;
}

// The oracle's quantization of a row-major [rows, cols] matrix `x` (values already in the
// activation dtype). Per-tensor: `per_tensor_scale` is used; blocks: one scale per block
// computed from the block's amax.
inline QMatrix oracle_quantize(const std::vector<float> &x, int64_t rows, int64_t cols,
                               te_dtype dt, te_scaling_mode mode, float per_tensor_scale,
                               bool pow2, float eps) {
  QMatrix q;
  q.rows = rows;
  q.cols = cols;
  q.dtype = dt;
  q.mode = mode;
  q.codes.resize(static_cast<size_t>(rows * cols));
  const int64_t ns = scale_inv_count(mode, rows, cols);
  std::vector<float> amax(static_cast<size_t>(ns), 0.0f), scale(static_cast<size_t>(ns));
  q.scale_inv.resize(static_cast<size_t>(ns));
  if (mode == TE_SCALING_PER_TENSOR) {
    scale[0] = per_tensor_scale;
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        float &a = amax[scale_inv_index(mode, r, c, cols)];
        a = std::max(a, std::fabs(x[r * cols + c]));
      }
    for (int64_t i = 0; i < ns; ++i) scale[i] = scale_from_amax(amax[i], fp8_max(dt), pow2, eps);
  }
  for (int64_t i = 0; i < ns; ++i) q.scale_inv[i] = 1.0f / scale[i];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float s = scale[scale_inv_index(mode, r, c, cols)];
      q.codes[r * cols + c] = fp8_encode(x[r * cols + c] * s, dt);
    }
  return q;
}

inline std::vector<float> transpose(const std::vector<float> &x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  return t;
}

// Compares two quantized matrices by their dequantized values (so +0/-0 codes compare equal)
// and their scale_invs bit for bit.
inline ::testing::AssertionResult SameQuantization(const QMatrix &got, const QMatrix &want) {
  if (got.rows != want.rows || got.cols != want.cols)
    return ::testing::AssertionFailure() << "shape [" << got.rows << "," << got.cols
                                         << "] vs expected [" << want.rows << "," << want.cols
                                         << "]";
  if (got.dtype != want.dtype)
    return ::testing::AssertionFailure()
           << "dtype " << dtype_str(got.dtype) << " vs expected " << dtype_str(want.dtype);
  if (got.mode != want.mode)
    return ::testing::AssertionFailure() << "scaling mode " << got.mode << " vs expected "
                                         << want.mode;
  for (size_t i = 0; i < want.scale_inv.size(); ++i)
    if (f32_bits(got.scale_inv[i]) != f32_bits(want.scale_inv[i]))
      return ::testing::AssertionFailure()
             << "scale_inv[" << i << "] = " << got.scale_inv[i] << " (0x" << std::hex
             << f32_bits(got.scale_inv[i]) << std::dec << "), expected " << want.scale_inv[i]
             << " (0x" << std::hex << f32_bits(want.scale_inv[i]) << std::dec << ")";
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < want.codes.size(); ++i) {
    const float g = fp8_decode(got.codes[i], got.dtype), w = fp8_decode(want.codes[i], want.dtype);
    if (!(g == w || (std::isnan(g) && std::isnan(w)))) {
      if (bad++ < 4)
        first << " [" << i / want.cols << "," << i % want.cols << "]: code 0x" << std::hex
              << int(got.codes[i]) << " (" << g << ") vs expected 0x" << int(want.codes[i])
              << std::dec << " (" << w << ");";
    }
  }
  if (bad)
    return ::testing::AssertionFailure() << bad << " of " << want.codes.size()
                                         << " codes differ:" << first.str();
  return ::testing::AssertionSuccess();
}

// ---- fp64 reference GEMM and tolerance checks ----------------------------------------------

// C[m, n] = sum_k A[m, k] * B[n, k] (both K-major, as x W^T), with |A||B| sums for the bound.
struct RefResult {
  std::vector<double> value, abs_sum;
  int64_t k = 0;
};
inline RefResult ref_gemm_nt(const std::vector<double> &a, const std::vector<double> &b,
                             int64_t m, int64_t n, int64_t k) {
  RefResult r;
  r.k = k;
  r.value.assign(static_cast<size_t>(m * n), 0.0);
  r.abs_sum.assign(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0, sa = 0.0;
      const double *ai = &a[i * k];
      const double *bj = &b[j * k];
      for (int64_t p = 0; p < k; ++p) {
        s += ai[p] * bj[p];
        sa += std::fabs(ai[p] * bj[p]);
      }
      r.value[i * n + j] = s;
      r.abs_sum[i * n + j] = sa;
    }
  return r;
}

inline std::vector<double> to_double(const std::vector<float> &v) {
  return std::vector<double>(v.begin(), v.end());
}

// Tolerance of one output element computed as fp32 accumulation of k products then rounded to
// `out_dtype`: the recursive-summation bound |err| <= k * 2^-24 * sum|a||b| (a few extra ulps
// for the two scale_inv multiplications and the bias add), then the output rounding:
// 2^-8 relative for BF16 (8-bit significand, round to nearest), 2^-24 for F32.
inline double fp32_gemm_tol(double abs_sum, double ref, int64_t k, te_dtype out_dtype) {
  const double acc = static_cast<double>(k + 4) * std::ldexp(1.0, -24) * abs_sum;
  const double out_rel = out_dtype == TE_DTYPE_BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -23);
  return acc * (1.0 + out_rel) + out_rel * std::fabs(ref) + 1e-30;
}

inline ::testing::AssertionResult CloseToRef(const HostTensor &got, const RefResult &ref,
                                             const char *what) {
  if (got.numel() != static_cast<int64_t>(ref.value.size()))
    return ::testing::AssertionFailure() << what << ": size " << got.numel() << " vs "
                                         << ref.value.size();
  int64_t bad = 0;
  double worst = 0.0;
  std::ostringstream first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = ref.value[i];
    const double tol = fp32_gemm_tol(ref.abs_sum[i], w, ref.k, got.dtype);
    const double err = std::fabs(g - w);
    if (!(err <= tol)) {
      if (bad++ < 4)
        first << " [" << i << "]: got " << g << " expected " << w << " (err " << err << " > tol "
              << tol << ");";
    }
    worst = std::max(worst, tol > 0 ? err / tol : err);
  }
  if (bad)
    return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.numel()
                                         << " elements outside fp32-accumulation tolerance"
                                         << first.str();
  return ::testing::AssertionSuccess() << what << ": worst err/tol " << worst;
}

// Normwise relative error ||got - ref|| / ||ref||, for "FP8 is close to high precision".
inline double rel_norm_error(const HostTensor &got, const std::vector<double> &ref) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double d = got.get(i) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline bool bitwise_equal(const HostTensor &a, const HostTensor &b) {
  return a.bytes == b.bytes;
}

// ---- RAII handles ---------------------------------------------------------------------------

struct CtxDeleter {
  void operator()(te_context *c) const { te_context_destroy(c); }
};
struct LinDeleter {
  void operator()(te_linear *l) const { te_linear_destroy(l); }
};
struct BwdDeleter {
  void operator()(te_linear_backward_ctx *b) const { te_linear_backward_ctx_destroy(b); }
};
struct RecipeDeleter {
  void operator()(te_recipe *r) const { te_recipe_release(r); }
};
using CtxPtr = std::unique_ptr<te_context, CtxDeleter>;
using LinPtr = std::unique_ptr<te_linear, LinDeleter>;
using BwdPtr = std::unique_ptr<te_linear_backward_ctx, BwdDeleter>;
using RecipePtr = std::unique_ptr<te_recipe, RecipeDeleter>;

// A CPU context (explicitly the CPU: the tests use host memory even on a GPU machine).
inline CtxPtr make_cpu_ctx() {
  te_context_options o;
  te_context_options_init(&o);
  o.use_default_device = 0;
  o.device.type = TE_DEVICE_CPU;
  o.device.index = 0;
  te_context *c = nullptr;
  te_status s = te_context_create(&c, &o);
  EXPECT_EQ(s, TE_SUCCESS) << te_last_error();
  return CtxPtr(c);
}

inline LinPtr make_linear(te_context *ctx, int64_t in, int64_t out, int bias, te_dtype act,
                          int fuse_wgrad = 0) {
  te_linear_options o;
  te_linear_options_init(&o);
  o.in_features = in;
  o.out_features = out;
  o.bias = bias;
  o.activation_dtype = act;
  o.fuse_wgrad_accumulation = fuse_wgrad;
  te_linear *l = nullptr;
  te_status s = te_linear_create(&l, ctx, &o);
  EXPECT_EQ(s, TE_SUCCESS) << te_last_error();
  return LinPtr(l);
}

// recipe kind -1 = no recipe handle (NULL: the default delayed scaling).
inline RecipePtr make_recipe(te_recipe_kind kind, int history_len = 0,
                             te_amax_algo algo = TE_AMAX_MAX) {
  te_recipe_options o;
  te_recipe_options_init(&o, kind);
  if (history_len > 0) o.amax_history_len = history_len;
  o.amax_algo = algo;
  te_recipe *r = nullptr;
  te_status s = te_recipe_create(&r, &o);
  EXPECT_EQ(s, TE_SUCCESS) << te_last_error();
  return RecipePtr(r);
}

// An open autocast scope, closed (and checked) by end() or the destructor.
class Scope {
 public:
  Scope(te_context *ctx, const te_recipe *recipe, int enabled = 1, int calibrating = 0)
      : ctx_(ctx) {
    te_autocast_options o;
    te_autocast_options_init(&o);
    o.enabled = enabled;
    o.calibrating = calibrating;
    o.recipe = recipe;
    te_status s = te_autocast_begin(ctx, &o, &token_);
    EXPECT_EQ(s, TE_SUCCESS) << te_last_error();
    open_ = s == TE_SUCCESS;
  }
  ~Scope() { end(); }
  void end() {
    if (!open_) return;
    open_ = false;
    te_status s = te_autocast_end(ctx_, token_);
    EXPECT_EQ(s, TE_SUCCESS) << te_last_error();
  }
  Scope(const Scope &) = delete;
  Scope &operator=(const Scope &) = delete;

 private:
  te_context *ctx_;
  te_autocast_token token_ = 0;
  bool open_ = false;
};

struct StateSnapshot {
  te_scaling_state_info info{};
  std::vector<float> history;
};

inline StateSnapshot get_state(te_context *ctx, const te_linear *lin, te_tensor_role role,
                               size_t cap = 4096) {
  StateSnapshot s;
  s.info.struct_size = sizeof(s.info);
  s.history.assign(cap, -12345.0f);
  te_status st = te_linear_get_scaling_state(ctx, lin, role, &s.info, s.history.data(), cap);
  EXPECT_EQ(st, TE_SUCCESS) << te_last_error();
  s.history.resize(std::min(cap, static_cast<size_t>(std::max(0, s.info.amax_history_len))));
  return s;
}

inline ::testing::AssertionResult SameState(const StateSnapshot &a, const StateSnapshot &b) {
  if (f32_bits(a.info.scale) != f32_bits(b.info.scale))
    return ::testing::AssertionFailure() << "scale " << a.info.scale << " vs " << b.info.scale;
  if (f32_bits(a.info.scale_inv) != f32_bits(b.info.scale_inv))
    return ::testing::AssertionFailure() << "scale_inv " << a.info.scale_inv << " vs "
                                         << b.info.scale_inv;
  if (a.info.amax_history_len != b.info.amax_history_len)
    return ::testing::AssertionFailure() << "amax_history_len " << a.info.amax_history_len
                                         << " vs " << b.info.amax_history_len;
  for (size_t i = 0; i < a.history.size(); ++i)
    if (f32_bits(a.history[i]) != f32_bits(b.history[i]))
      return ::testing::AssertionFailure() << "history[" << i << "] " << a.history[i] << " vs "
                                           << b.history[i];
  return ::testing::AssertionSuccess();
}

// The layer's serialized FP8 state: a cheap "nothing changed" witness.
inline std::vector<unsigned char> saved_state(te_context *ctx, const te_linear *lin) {
  size_t size = 0;
  te_status s = te_linear_state_save(ctx, lin, nullptr, 0, &size);
  EXPECT_EQ(s, TE_SUCCESS) << te_last_error();
  std::vector<unsigned char> buf(size);
  size_t written = 0;
  s = te_linear_state_save(ctx, lin, buf.data(), buf.size(), &written);
  EXPECT_EQ(s, TE_SUCCESS) << te_last_error();
  EXPECT_EQ(written, size);
  return buf;
}

// Checks a failure: the status, and that te_last_error() reads
// "<fn>: argument '<...arg...>': ..." (arg == nullptr: only the "<fn>:" prefix is checked,
// e.g. for UNSUPPORTED shapes whose message gives a reason rather than an argument).
inline ::testing::AssertionResult IsError(te_status got, te_status want, const char *fn,
                                          const char *arg) {
  const std::string msg = te_last_error();
  if (got != want)
    return ::testing::AssertionFailure() << "status " << te_status_string(got) << ", expected "
                                         << te_status_string(want) << " (last error: \"" << msg
                                         << "\")";
  const std::string prefix = std::string(fn) + ":";
  if (msg.compare(0, prefix.size(), prefix) != 0)
    return ::testing::AssertionFailure() << "message \"" << msg << "\" does not start with \""
                                         << prefix << "\"";
  if (arg) {
    const std::string ap = std::string(fn) + ": argument '";
    if (msg.compare(0, ap.size(), ap) != 0)
      return ::testing::AssertionFailure() << "message \"" << msg << "\" does not start with \""
                                           << ap << "\"";
    const size_t close = msg.find('\'', ap.size());
    const std::string name = msg.substr(ap.size(), close == std::string::npos ? std::string::npos
                                                                             : close - ap.size());
    if (name.find(arg) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << msg << "\" names argument '" << name
                                           << "', expected one naming '" << arg << "'";
    if (close == std::string::npos || msg.size() < close + 4)
      return ::testing::AssertionFailure() << "message \"" << msg
                                           << "\" has no expected-vs-got text";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace linear_test
