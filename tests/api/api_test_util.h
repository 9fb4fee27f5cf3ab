// Shared helpers for the public-API tests (tests/api/*.cpp). Only <te/te.h> and libte.so are
// used, as a user sees them. Everything here is header-only (inline), so several test files may
// include it.
//
//  - Status checks:   EXPECT_TE_OK(call), ASSERT_TE_OK(call)       (print te_last_error on failure)
//                     EXPECT_TE_FAIL(status, "te_fn", "arg", call)  (status, and te_last_error names
//                                                                    the function and the argument)
//  - RAII handles:    ContextPtr, RecipePtr, GroupPtr, LinearPtr, BackwardPtr (+ make_* helpers)
//  - Fixture:         CpuContextTest (ctx_ is an explicit CPU context)
//  - Host tensors:    HostTensor (owns data + scale_inv; .t is the te_tensor view), make_tensor
//  - Independent numerics: FP8 decode/encode (RNE, saturating), BF16/F16 conversions
//  - References:      dequantize_ref (per block), ref_gemm (fp64), gemm_tolerance
//  - State snapshots: autocast_state(ctx), context_stats(ctx), scaling_state(ctx, lin, role, hist)
#pragma once

#include <gtest/gtest.h>
#include <te/te.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace te_test {

// ---- status checks ------------------------------------------------------------------------

inline std::string last_error() {
  const char *m = te_last_error();
  return m ? std::string(m) : std::string("<te_last_error() returned NULL>");
}

// True when `word` occurs in `text` as a whole identifier: the neighbouring characters are not
// identifier characters. So "r" matches "argument 'r'" but not "argument", and "margin" matches
// "'margin'", "opts->margin" and "opts.margin".
inline bool contains_identifier(const std::string &text, const std::string &word) {
  auto is_ident = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  for (size_t pos = text.find(word); pos != std::string::npos; pos = text.find(word, pos + 1)) {
    bool left_ok = pos == 0 || !is_ident(text[pos - 1]);
    bool right_ok = pos + word.size() >= text.size() || !is_ident(text[pos + word.size()]);
    if (left_ok && right_ok) return true;
  }
  return false;
}

// Sets te_last_error() to a known message from a function other than `fn`, so that a check that
// follows cannot pass on a stale message (successful calls do not clear the last error).
inline void prime_last_error(const char *fn) {
  if (fn && std::strcmp(fn, "te_context_get_device") == 0)
    (void)te_recipe_options_init(nullptr, TE_RECIPE_DELAYED_SCALING);
  else
    (void)te_context_get_device(nullptr, nullptr);
}

inline ::testing::AssertionResult check_ok(te_status got, const char *expr) {
  if (got == TE_SUCCESS) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr << " returned " << te_status_string(got) << " ("
                                       << static_cast<int>(got) << "), te_last_error: \""
                                       << last_error() << "\"";
}

// `got` must be `want`, and te_last_error() must contain `fn` and (when non-NULL) the
// identifier `arg`.
inline ::testing::AssertionResult check_failure(te_status got, const char *expr, te_status want,
                                                const char *fn, const char *arg) {
  std::string msg = last_error();
  // TE_TEST_PRINT_ERRORS=1 prints every checked message, to review their wording.
  if (std::getenv("TE_TEST_PRINT_ERRORS"))
    std::printf("[te_last_error] %-28s %-16s %s\n", te_status_string(got), arg ? arg : "-", msg.c_str());
  if (got != want)
    return ::testing::AssertionFailure()
           << expr << ": expected " << te_status_string(want) << ", got " << te_status_string(got)
           << " (" << static_cast<int>(got) << "); te_last_error: \"" << msg << "\"";
  if (fn && msg.find(fn) == std::string::npos)
    return ::testing::AssertionFailure() << expr << ": te_last_error \"" << msg
                                         << "\" does not name the function '" << fn << "'";
  if (arg && !contains_identifier(msg, arg))
    return ::testing::AssertionFailure() << expr << ": te_last_error \"" << msg
                                         << "\" does not name the argument '" << arg << "'";
  return ::testing::AssertionSuccess();
}

}  // namespace te_test

#define EXPECT_TE_OK(call) EXPECT_TRUE(::te_test::check_ok((call), #call))
#define ASSERT_TE_OK(call) ASSERT_TRUE(::te_test::check_ok((call), #call))
// EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_quantize", "out", te_quantize(ctx, &x, &o, NULL));
// `arg` may be nullptr for state errors (only the function name is checked then).
#define EXPECT_TE_FAIL(status, fn, arg, call)                                         \
  do {                                                                                \
    ::te_test::prime_last_error(fn);                                                  \
    te_status te_test_got_ = (call);                                                  \
    EXPECT_TRUE(::te_test::check_failure(te_test_got_, #call, (status), (fn), (arg))); \
  } while (0)

namespace te_test {

// ---- RAII handles -------------------------------------------------------------------------

struct ContextDeleter { void operator()(te_context *c) const { te_context_destroy(c); } };
struct RecipeDeleter { void operator()(te_recipe *r) const { te_recipe_release(r); } };
struct GroupDeleter { void operator()(te_group *g) const { te_group_destroy(g); } };
struct LinearDeleter { void operator()(te_linear *l) const { te_linear_destroy(l); } };
struct BackwardDeleter {
  void operator()(te_linear_backward_ctx *b) const { te_linear_backward_ctx_destroy(b); }
};
using ContextPtr = std::unique_ptr<te_context, ContextDeleter>;
using RecipePtr = std::unique_ptr<te_recipe, RecipeDeleter>;
using GroupPtr = std::unique_ptr<te_group, GroupDeleter>;
using LinearPtr = std::unique_ptr<te_linear, LinearDeleter>;
using BackwardPtr = std::unique_ptr<te_linear_backward_ctx, BackwardDeleter>;

// An explicit CPU context (not the default device, so the tests mean the same on a GPU machine).
inline ContextPtr make_cpu_context() {
  te_context_options o;
  std::memset(&o, 0, sizeof o);
  EXPECT_TE_OK(te_context_options_init(&o));
  o.use_default_device = 0;
  o.device.type = TE_DEVICE_CPU;
  o.device.index = 0;
  te_context *c = nullptr;
  EXPECT_TE_OK(te_context_create(&c, &o));
  return ContextPtr(c);
}

inline te_recipe_options recipe_defaults(te_recipe_kind kind = TE_RECIPE_DELAYED_SCALING) {
  te_recipe_options o;
  std::memset(&o, 0, sizeof o);
  EXPECT_TE_OK(te_recipe_options_init(&o, kind));
  return o;
}

inline RecipePtr make_recipe(const te_recipe_options &o) {
  te_recipe *r = nullptr;
  EXPECT_TE_OK(te_recipe_create(&r, &o));
  return RecipePtr(r);
}
inline RecipePtr make_recipe(te_recipe_kind kind = TE_RECIPE_DELAYED_SCALING) {
  return make_recipe(recipe_defaults(kind));
}

inline LinearPtr make_linear(te_context *ctx, int64_t in_features, int64_t out_features,
                             int bias = 1, te_dtype activation_dtype = TE_DTYPE_F32) {
  te_linear_options o;
  std::memset(&o, 0, sizeof o);
  EXPECT_TE_OK(te_linear_options_init(&o));
  o.in_features = in_features;
  o.out_features = out_features;
  o.bias = bias;
  o.activation_dtype = activation_dtype;
  te_linear *l = nullptr;
  EXPECT_TE_OK(te_linear_create(&l, ctx, &o));
  return LinearPtr(l);
}

// Fixture: ctx_ is a fresh CPU context per test.
class CpuContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    owned_ctx_ = make_cpu_context();
    ctx_ = owned_ctx_.get();
    ASSERT_NE(ctx_, nullptr);
  }
  ContextPtr owned_ctx_;
  te_context *ctx_ = nullptr;
};

// ---- state snapshots ----------------------------------------------------------------------

inline te_autocast_state autocast_state(const te_context *ctx) {
  te_autocast_state s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  EXPECT_TE_OK(te_autocast_get_state(ctx, &s));
  return s;
}

inline te_context_stats context_stats(const te_context *ctx) {
  te_context_stats s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  EXPECT_TE_OK(te_context_get_stats(ctx, &s));
  return s;
}

// A linear's scaling state with (up to) `history_cap` history floats. The history buffer is
// prefilled with -7 so that unwritten slots are visible.
struct ScalingSnapshot {
  te_scaling_state_info info;
  std::vector<float> history;
  bool operator==(const ScalingSnapshot &o) const {
    return info.scale == o.info.scale && info.scale_inv == o.info.scale_inv &&
           info.amax_history_len == o.info.amax_history_len &&
           info.fp8_dtype == o.info.fp8_dtype &&
           history.size() == o.history.size() &&
           (history.empty() ||
            std::memcmp(history.data(), o.history.data(), history.size() * sizeof(float)) == 0);
  }
};
inline ScalingSnapshot scaling_state(te_context *ctx, const te_linear *lin, te_tensor_role role,
                                     size_t history_cap = 1024) {
  ScalingSnapshot s;
  std::memset(&s.info, 0, sizeof s.info);
  s.info.struct_size = sizeof s.info;
  s.history.assign(history_cap, -7.0f);
  EXPECT_TE_OK(te_linear_get_scaling_state(ctx, lin, role, &s.info,
                                           history_cap ? s.history.data() : nullptr, history_cap));
  return s;
}

// ---- independent scalar numerics ----------------------------------------------------------

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline double e4m3_to_double(uint8_t c) {
  int s = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
  if (e == 0xF && m == 7) return std::nan("");
  double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}
inline double e5m2_to_double(uint8_t c) {
  int s = c >> 7, e = (c >> 2) & 0x1F, m = c & 3;
  double v;
  if (e == 0x1F) v = m == 0 ? INFINITY : std::nan("");
  else v = e == 0 ? std::ldexp(m / 4.0, -14) : std::ldexp(1.0 + m / 4.0, e - 15);
  return s ? -v : v;
}
inline double fp8_to_double(uint8_t c, te_dtype t) {
  return t == TE_DTYPE_E4M3 ? e4m3_to_double(c) : e5m2_to_double(c);
}
inline double fp8_max(te_dtype t) { return t == TE_DTYPE_E4M3 ? 448.0 : 57344.0; }

// Round to nearest even and saturate to +-fp8_max (infinities too); NaN -> NaN. Returns the
// VALUE (not the code), found by search over the finite non-negative codes, so it shares no
// bit tricks with the library.
inline double fp8_round(double x, te_dtype t) {
  if (std::isnan(x)) return std::nan("");
  static const std::vector<double> e4 = [] {
    std::vector<double> v;
    for (int c = 0; c < 0x7F; ++c) v.push_back(e4m3_to_double(static_cast<uint8_t>(c)));
    return v;
  }();
  static const std::vector<double> e5 = [] {
    std::vector<double> v;
    for (int c = 0; c < 0x7C; ++c) v.push_back(e5m2_to_double(static_cast<uint8_t>(c)));
    return v;
  }();
  const std::vector<double> &vals = t == TE_DTYPE_E4M3 ? e4 : e5;  // ascending, code == index
  double a = std::fabs(x);
  double r;
  if (a >= vals.back()) {
    r = vals.back();
  } else {
    size_t hi = static_cast<size_t>(std::upper_bound(vals.begin(), vals.end(), a) - vals.begin());
    size_t lo = hi - 1;  // vals[lo] <= a < vals[hi]
    double dlo = a - vals[lo], dhi = vals[hi] - a;
    if (dlo < dhi) r = vals[lo];
    else if (dhi < dlo) r = vals[hi];
    else r = (lo % 2 == 0) ? vals[lo] : vals[hi];  // tie: even mantissa (code LSB 0)
  }
  return std::signbit(x) ? -r : r;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t lsb = (u >> 16) & 1;
  u += 0x7FFF + lsb;
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

inline uint16_t f32_to_f16(float f) {
  uint32_t x = float_to_bits(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return sign | 0x7E00;
  if (x >= 0x477FF000u) return sign | 0x7C00;  // >= 65520 rounds to infinity
  if (x < 0x38800000u) {                        // below 2^-14: half subnormal, unit 2^-24
    double q = std::nearbyint(static_cast<double>(bits_to_float(x)) * 16777216.0);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  uint32_t mant = x & 0x7FFFFF;
  uint32_t h = ((((x >> 23) - 127 + 15) << 10) | (mant >> 13));
  uint32_t rem = mant & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}
inline float f16_to_f32(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v;
  if (e == 0x1F) v = m ? NAN : INFINITY;
  else v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024.0 + m, e - 25);
  return static_cast<float>(s ? -v : v);
}
inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

inline size_t dtype_size(te_dtype t) {
  switch (t) {
    case TE_DTYPE_F32: return 4;
    case TE_DTYPE_F16: case TE_DTYPE_BF16: return 2;
    default: return 1;
  }
}
inline bool is_fp8(te_dtype t) { return t == TE_DTYPE_E4M3 || t == TE_DTYPE_E5M2; }
inline const char *dtype_name(te_dtype t) {
  switch (t) {
    case TE_DTYPE_F32: return "F32";
    case TE_DTYPE_F16: return "F16";
    case TE_DTYPE_BF16: return "BF16";
    case TE_DTYPE_E4M3: return "E4M3";
    case TE_DTYPE_E5M2: return "E5M2";
  }
  return "?";
}

// ---- host tensors -------------------------------------------------------------------------

// Owns a CPU tensor's bytes and (for FP8) its scale_inv floats; `t` views them. Movable, not
// copyable (a copy would alias); use clone() for a deep copy.
struct HostTensor {
  te_tensor t;
  std::vector<unsigned char> bytes;
  std::vector<float> scale_inv;

  HostTensor() { std::memset(&t, 0, sizeof t); }
  HostTensor(const HostTensor &) = delete;
  HostTensor &operator=(const HostTensor &) = delete;
  HostTensor(HostTensor &&o) noexcept { *this = std::move(o); }
  HostTensor &operator=(HostTensor &&o) noexcept {
    t = o.t;
    bytes = std::move(o.bytes);
    scale_inv = std::move(o.scale_inv);
    rebind();
    std::memset(&o.t, 0, sizeof o.t);
    return *this;
  }
  void rebind() {
    t.data = bytes.empty() ? nullptr : bytes.data();
    t.scale_inv = scale_inv.empty() ? nullptr : scale_inv.data();
  }
  HostTensor clone() const {
    HostTensor c;
    c.t = t;
    c.bytes = bytes;
    c.scale_inv = scale_inv;
    c.rebind();
    return c;
  }

  te_tensor *get() { return &t; }
  const te_tensor *get() const { return &t; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
    return n;
  }
  int64_t cols() const { return t.ndim ? t.shape[t.ndim - 1] : 1; }
  int64_t rows() const { return cols() ? numel() / cols() : 0; }

  // Element i as a double (high precision: its value; FP8: the CODE's value, not dequantized).
  double at(int64_t i) const {
    const unsigned char *p = bytes.data();
    switch (t.dtype) {
      case TE_DTYPE_F32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
      case TE_DTYPE_F16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return f16_to_f32(h); }
      case TE_DTYPE_BF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return bf16_to_f32(h); }
      default: return fp8_to_double(p[i], t.dtype);
    }
  }
  // Stores v rounded to the (high-precision) dtype; returns the value stored.
  float set(int64_t i, float v) {
    unsigned char *p = bytes.data();
    switch (t.dtype) {
      case TE_DTYPE_F32: std::memcpy(p + 4 * i, &v, 4); return v;
      case TE_DTYPE_F16: { uint16_t h = f32_to_f16(v); std::memcpy(p + 2 * i, &h, 2); return f16_to_f32(h); }
      case TE_DTYPE_BF16: { uint16_t h = f32_to_bf16(v); std::memcpy(p + 2 * i, &h, 2); return bf16_to_f32(h); }
      default: ADD_FAILURE() << "HostTensor::set on an FP8 tensor"; return 0;
    }
  }
  uint8_t code(int64_t i) const { return bytes[static_cast<size_t>(i)]; }
  std::vector<double> values() const {
    std::vector<double> v(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) v[static_cast<size_t>(i)] = at(i);
    return v;
  }
};

// Floats scale_inv needs for a shape and scaling mode (computed here, independently).
inline int64_t scale_inv_count_ref(int64_t rows, int64_t cols, te_scaling_mode mode) {
  switch (mode) {
    case TE_SCALING_BLOCK_1X128: return rows * ((cols + 127) / 128);
    case TE_SCALING_BLOCK_128X128: return ((rows + 127) / 128) * ((cols + 127) / 128);
    default: return 1;
  }
}

// A CPU tensor of `shape`; data bytes filled with `fill_byte` (a sentinel, so that untouched
// outputs are detectable); FP8 tensors get scale_inv storage for `scaling`, filled with -3.
inline HostTensor make_tensor(te_dtype dtype, std::vector<int64_t> shape,
                              te_scaling_mode scaling = TE_SCALING_PER_TENSOR,
                              unsigned char fill_byte = 0xA5) {
  HostTensor h;
  h.t.dtype = dtype;
  h.t.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size() && i < TE_MAX_DIMS; ++i) h.t.shape[i] = shape[i];
  h.t.device.type = TE_DEVICE_CPU;
  h.t.device.index = 0;
  h.t.scaling = is_fp8(dtype) ? scaling : TE_SCALING_PER_TENSOR;
  h.bytes.assign(static_cast<size_t>(h.numel()) * dtype_size(dtype), fill_byte);
  if (is_fp8(dtype))
    h.scale_inv.assign(static_cast<size_t>(scale_inv_count_ref(h.rows(), h.cols(), scaling)), -3.0f);
  h.rebind();
  return h;
}

// A high-precision tensor with values from `values` (rounded to dtype).
inline HostTensor make_tensor(te_dtype dtype, std::vector<int64_t> shape,
                              const std::vector<float> &values) {
  HostTensor h = make_tensor(dtype, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(values.size()), h.numel());
  for (int64_t i = 0; i < h.numel() && i < static_cast<int64_t>(values.size()); ++i)
    h.set(i, values[static_cast<size_t>(i)]);
  return h;
}

// Uniform values in [lo, hi), deterministic per seed, rounded to the tensor's dtype.
inline void fill_uniform(HostTensor &h, float lo, float hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < h.numel(); ++i) h.set(i, dist(gen));
}
inline HostTensor random_tensor(te_dtype dtype, std::vector<int64_t> shape, float lo, float hi,
                                uint32_t seed) {
  HostTensor h = make_tensor(dtype, std::move(shape));
  fill_uniform(h, lo, hi, seed);
  return h;
}

// A snapshot of a tensor's bytes and scale_inv, to check that a failed call left it untouched.
inline bool same_contents(const HostTensor &a, const HostTensor &b) {
  return a.bytes == b.bytes &&
         a.scale_inv.size() == b.scale_inv.size() &&
         (a.scale_inv.empty() ||
          std::memcmp(a.scale_inv.data(), b.scale_inv.data(), a.scale_inv.size() * sizeof(float)) == 0) &&
         std::memcmp(&a.t.shape, &b.t.shape, sizeof a.t.shape) == 0 && a.t.dtype == b.t.dtype &&
         a.t.ndim == b.t.ndim;
}

// ---- references -----------------------------------------------------------------------------

// The value an FP8 tensor stands for: code value * scale_inv of its block, in fp64.
inline std::vector<double> dequantize_ref(const HostTensor &h) {
  std::vector<double> v(static_cast<size_t>(h.numel()));
  int64_t rows = h.rows(), cols = h.cols();
  int64_t col_blocks = (cols + 127) / 128;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      int64_t i = r * cols + c;
      if (!is_fp8(h.t.dtype)) { v[static_cast<size_t>(i)] = h.at(i); continue; }
      int64_t b = 0;
      if (h.t.scaling == TE_SCALING_BLOCK_1X128) b = r * col_blocks + c / 128;
      else if (h.t.scaling == TE_SCALING_BLOCK_128X128) b = (r / 128) * col_blocks + c / 128;
      v[static_cast<size_t>(i)] = h.at(i) * static_cast<double>(h.scale_inv[static_cast<size_t>(b)]);
    }
  return v;
}

// D[m, n] = op(A)[m, k] op(B)[k, n] in fp64 over row-major storage: A is [m, k] ([k, m] when
// transa), B is [k, n] ([n, k] when transb). absdot, when given, receives sum_p |a_ip b_pj|.
inline std::vector<double> ref_gemm(const std::vector<double> &a, const std::vector<double> &b,
                                    int64_t m, int64_t n, int64_t k, bool transa, bool transb,
                                    std::vector<double> *absdot = nullptr) {
  std::vector<double> d(static_cast<size_t>(m * n), 0.0);
  if (absdot) absdot->assign(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, sa = 0;
      for (int64_t p = 0; p < k; ++p) {
        double x = transa ? a[static_cast<size_t>(p * m + i)] : a[static_cast<size_t>(i * k + p)];
        double y = transb ? b[static_cast<size_t>(j * k + p)] : b[static_cast<size_t>(p * n + j)];
        s += x * y;
        sa += std::fabs(x * y);
      }
      d[static_cast<size_t>(i * n + j)] = s;
      if (absdot) (*absdot)[static_cast<size_t>(i * n + j)] = sa;
    }
  return d;
}

// Error bound of one GEMM output computed with fp32 accumulation and stored in `out`:
//  - accumulating k products in fp32 in any order (blocked, pairwise, FMA or not) errs by at
//    most (k + 1) * u32 * sum|a_ip b_pj| (the classic gamma_k bound, u32 = 2^-24, +1 for the
//    rounding of each product); we allow 2x that for the scale_inv multiplications that may be
//    applied before or after the sum;
//  - storing into F32/F16/BF16 adds half an ulp of the result: u_out * |d| with
//    u_out = 2^-24 / 2^-11 / 2^-8, plus the subnormal spacing of the output type.
inline double gemm_tolerance(double absdot, double ref, int64_t k, te_dtype out) {
  const double u32 = std::ldexp(1.0, -24);
  double u_out = out == TE_DTYPE_F32 ? u32 : out == TE_DTYPE_F16 ? std::ldexp(1.0, -11)
                                                                   : std::ldexp(1.0, -8);
  double tiny = out == TE_DTYPE_F16 ? std::ldexp(1.0, -24) : 1e-37;
  return 2.0 * (static_cast<double>(k) + 1.0) * u32 * absdot + u_out * std::fabs(ref) + tiny;
}

}  // namespace te_test
