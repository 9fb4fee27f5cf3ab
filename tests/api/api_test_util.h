// Shared helpers for the public-API tests (tests/api/*.cpp). Only <te/te.h> and libte.so are
// used, as a user sees them. Everything here is header-only (inline), so several test files may
// include it. The format and scaling references live in reference_numerics.h (included).
//
//  - Status checks:   EXPECT_TE_OK(call), ASSERT_TE_OK(call)       (print te_last_error on failure)
//                     EXPECT_TE_FAIL(status, "te_fn", "arg", call)  (status, and te_last_error names
//                                                                    the function and the argument)
//                     IsError(got, want, "te_fn", "arg")            (the strict "<fn>: argument
//                                                                    '<arg>': ..." message format)
//  - RAII handles:    ContextPtr, RecipePtr, GroupPtr, LinearPtr, BackwardPtr (+ make_* helpers),
//                     AutocastScope
//  - Fixture:         CpuContextTest (ctx_ is an explicit CPU context)
//  - Host tensors:    HostTensor (owns data + scale_inv; .t is the te_tensor view), make_tensor,
//                     random_tensor, copy_tensor (of a library-owned tensor)
//  - References:      quantize_ref / dequantize_ref (per block), ref_gemm (fp64), gemm_tolerance
//  - State snapshots: autocast_state(ctx), context_stats(ctx), scaling_state(ctx, lin, role, hist),
//                     live_scaling_state, SameState
#pragma once

#include <gtest/gtest.h>
#include <te/te.h>

#include "reference_numerics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
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

// The strict message format of the te_linear_* errors: `got` must be `want`, and
// te_last_error() must start "<fn>:"; when `arg` is non-NULL it must start
// "<fn>: argument '<name>'" with `arg` a substring of <name>, followed by the expected-vs-got
// text. Unlike EXPECT_TE_FAIL it does not prime te_last_error first.
inline ::testing::AssertionResult IsError(te_status got, te_status want, const char *fn,
                                          const char *arg) {
  const std::string msg = last_error();
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
// Defaults of `kind` with amax_history_len = history_len (when > 0) and amax_algo = algo.
inline RecipePtr make_recipe(te_recipe_kind kind, int history_len, te_amax_algo algo = TE_AMAX_MAX) {
  te_recipe_options o = recipe_defaults(kind);
  if (history_len > 0) o.amax_history_len = history_len;
  o.amax_algo = algo;
  return make_recipe(o);
}

inline LinearPtr make_linear(te_context *ctx, int64_t in_features, int64_t out_features,
                             int bias = 1, te_dtype activation_dtype = TE_DTYPE_F32,
                             int fuse_wgrad_accumulation = 0) {
  te_linear_options o;
  std::memset(&o, 0, sizeof o);
  EXPECT_TE_OK(te_linear_options_init(&o));
  o.in_features = in_features;
  o.out_features = out_features;
  o.bias = bias;
  o.activation_dtype = activation_dtype;
  o.fuse_wgrad_accumulation = fuse_wgrad_accumulation;
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

// An open autocast scope, closed (and checked) by end() or the destructor.
class AutocastScope {
 public:
  AutocastScope(te_context *ctx, const te_recipe *recipe, int enabled = 1, int calibrating = 0)
      : ctx_(ctx) {
    te_autocast_options o;
    std::memset(&o, 0, sizeof o);
    EXPECT_TE_OK(te_autocast_options_init(&o));
    o.enabled = enabled;
    o.calibrating = calibrating;
    o.recipe = recipe;
    te_status s = te_autocast_begin(ctx, &o, &token_);
    EXPECT_TRUE(check_ok(s, "te_autocast_begin(ctx, &o, &token_)"));
    open_ = s == TE_SUCCESS;
  }
  ~AutocastScope() { end(); }
  void end() {
    if (!open_) return;
    open_ = false;
    EXPECT_TE_OK(te_autocast_end(ctx_, token_));
  }
  AutocastScope(const AutocastScope &) = delete;
  AutocastScope &operator=(const AutocastScope &) = delete;

 private:
  te_context *ctx_;
  te_autocast_token token_ = 0;
  bool open_ = false;
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
// The same with the history cut to the amax_history_len the state reports (its live slots).
inline ScalingSnapshot live_scaling_state(te_context *ctx, const te_linear *lin,
                                          te_tensor_role role, size_t history_cap = 4096) {
  ScalingSnapshot s = scaling_state(ctx, lin, role, history_cap);
  s.history.resize(std::min(history_cap, static_cast<size_t>(std::max(0, s.info.amax_history_len))));
  return s;
}
// Bitwise comparison of scale, scale_inv, amax_history_len and a's history slots, saying what
// differs.
inline ::testing::AssertionResult SameState(const ScalingSnapshot &a, const ScalingSnapshot &b) {
  if (float_to_bits(a.info.scale) != float_to_bits(b.info.scale))
    return ::testing::AssertionFailure() << "scale " << a.info.scale << " vs " << b.info.scale;
  if (float_to_bits(a.info.scale_inv) != float_to_bits(b.info.scale_inv))
    return ::testing::AssertionFailure() << "scale_inv " << a.info.scale_inv << " vs "
                                         << b.info.scale_inv;
  if (a.info.amax_history_len != b.info.amax_history_len)
    return ::testing::AssertionFailure() << "amax_history_len " << a.info.amax_history_len
                                         << " vs " << b.info.amax_history_len;
  for (size_t i = 0; i < a.history.size(); ++i)
    if (float_to_bits(a.history[i]) != float_to_bits(b.history[i]))
      return ::testing::AssertionFailure() << "history[" << i << "] " << a.history[i] << " vs "
                                           << b.history[i];
  return ::testing::AssertionSuccess();
}

// ---- host tensors -------------------------------------------------------------------------

// Owns a CPU tensor's bytes and (for FP8) its scale_inv floats; `t` views them. Copies are deep
// (the copy's view points at its own storage). get() hands out the view as it is, so that a test
// may break its fields on purpose; call rebind() after resizing `bytes` or `scale_inv`.
struct HostTensor {
  te_tensor t;
  std::vector<unsigned char> bytes;
  std::vector<float> scale_inv;

  HostTensor() { std::memset(&t, 0, sizeof t); }
  // A CPU tensor of `shape`, data bytes all `fill`; FP8 tensors get scale_inv storage for
  // `scaling`, filled with -3 (high-precision ones ignore `scaling`).
  HostTensor(te_dtype dtype, const std::vector<int64_t> &shape,
             te_scaling_mode scaling = TE_SCALING_PER_TENSOR, unsigned char fill = 0) {
    std::memset(&t, 0, sizeof t);
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size() && i < TE_MAX_DIMS; ++i) t.shape[i] = shape[i];
    t.device.type = TE_DEVICE_CPU;
    t.device.index = 0;
    t.scaling = is_fp8(dtype) ? scaling : TE_SCALING_PER_TENSOR;
    bytes.assign(static_cast<size_t>(numel()) * dtype_size(dtype), fill);
    if (is_fp8(dtype))
      scale_inv.assign(static_cast<size_t>(scale_inv_count_ref(rows(), cols(), scaling)), -3.0f);
    rebind();
  }
  HostTensor(const HostTensor &o) : t(o.t), bytes(o.bytes), scale_inv(o.scale_inv) { rebind(); }
  HostTensor &operator=(const HostTensor &o) {
    if (this != &o) {
      t = o.t;
      bytes = o.bytes;
      scale_inv = o.scale_inv;
      rebind();
    }
    return *this;
  }
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
  HostTensor clone() const { return *this; }

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
  // The same as floats (exact: every element of every dtype is a float value).
  std::vector<float> values_f32() const {
    std::vector<float> v(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) v[static_cast<size_t>(i)] = static_cast<float>(at(i));
    return v;
  }
  void fill_byte(unsigned char b) { std::fill(bytes.begin(), bytes.end(), b); }
  // Views the same elements with another shape of the same numel.
  void reshape(const std::vector<int64_t> &shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    EXPECT_EQ(n, numel()) << "HostTensor::reshape changes the element count";
    t.ndim = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < TE_MAX_DIMS; ++i) t.shape[i] = i < shape.size() ? shape[i] : 0;
  }
};

// A CPU tensor of `shape` whose data bytes are `fill_byte` (by default a sentinel, so that
// untouched outputs are detectable); FP8 tensors get scale_inv storage for `scaling` (all -3).
inline HostTensor make_tensor(te_dtype dtype, std::vector<int64_t> shape,
                              te_scaling_mode scaling = TE_SCALING_PER_TENSOR,
                              unsigned char fill_byte = 0xA5) {
  return HostTensor(dtype, shape, scaling, fill_byte);
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

// Uniform values in [lo, hi), deterministic per seed, rounded to the tensor's dtype. With
// row_pattern, row r is scaled by 2^((r % 5) - 2) (before rounding), so that block scales differ
// from block to block.
inline void fill_uniform(HostTensor &h, float lo, float hi, uint32_t seed, bool row_pattern = false) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  const int64_t cols = h.cols();
  for (int64_t i = 0; i < h.numel(); ++i) {
    float v = dist(gen);
    if (row_pattern) v = std::ldexp(v, static_cast<int>((i / cols) % 5) - 2);
    h.set(i, v);
  }
}
inline HostTensor random_tensor(te_dtype dtype, std::vector<int64_t> shape, float lo, float hi,
                                uint32_t seed, bool row_pattern = false) {
  HostTensor h = make_tensor(dtype, std::move(shape));
  fill_uniform(h, lo, hi, seed, row_pattern);
  return h;
}

// A deep copy of a CPU tensor the library owns (its bytes, and scale_inv when FP8).
inline HostTensor copy_tensor(const te_tensor &v) {
  HostTensor h;
  h.t = v;
  const auto *p = static_cast<const unsigned char *>(v.data);
  h.bytes.assign(p, p + h.numel() * static_cast<int64_t>(dtype_size(v.dtype)));
  if (is_fp8(v.dtype))
    h.scale_inv.assign(v.scale_inv, v.scale_inv + scale_inv_count_ref(h.rows(), h.cols(), v.scaling));
  h.rebind();
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
// Only the data bytes (e.g. two outputs that must be bitwise the same).
inline bool bitwise_equal(const HostTensor &a, const HostTensor &b) { return a.bytes == b.bytes; }

// ---- references -----------------------------------------------------------------------------

// The value an FP8 tensor stands for: code value * scale_inv of its block, in fp64.
inline std::vector<double> dequantize_ref(const HostTensor &h) {
  std::vector<double> v(static_cast<size_t>(h.numel()));
  int64_t rows = h.rows(), cols = h.cols();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      int64_t i = r * cols + c;
      if (!is_fp8(h.t.dtype)) { v[static_cast<size_t>(i)] = h.at(i); continue; }
      int64_t b = scale_inv_index(r, c, cols, h.t.scaling);
      v[static_cast<size_t>(i)] = h.at(i) * static_cast<double>(h.scale_inv[static_cast<size_t>(b)]);
    }
  return v;
}

// The reference quantization of a row-major [rows, cols] matrix `x` (values already in the
// activation dtype) into an FP8 tensor of that shape. Per-tensor: `per_tensor_scale` is used;
// blocks: one scale per block, from the block's amax (scale_from_amax). scale_inv = 1 / scale.
inline HostTensor quantize_ref(const std::vector<float> &x, int64_t rows, int64_t cols,
                               te_dtype dt, te_scaling_mode mode, float per_tensor_scale,
                               bool pow2, float eps) {
  HostTensor q = make_tensor(dt, {rows, cols}, mode);
  const int64_t ns = scale_inv_count_ref(rows, cols, mode);
  std::vector<float> amax(static_cast<size_t>(ns), 0.0f), scale(static_cast<size_t>(ns));
  if (mode == TE_SCALING_PER_TENSOR) {
    scale[0] = per_tensor_scale;
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        float &a = amax[static_cast<size_t>(scale_inv_index(r, c, cols, mode))];
        a = std::max(a, std::fabs(x[static_cast<size_t>(r * cols + c)]));
      }
    for (int64_t i = 0; i < ns; ++i)
      scale[static_cast<size_t>(i)] =
          scale_from_amax(amax[static_cast<size_t>(i)], static_cast<float>(fp8_max(dt)), pow2, eps);
  }
  for (int64_t i = 0; i < ns; ++i) q.scale_inv[static_cast<size_t>(i)] = 1.0f / scale[static_cast<size_t>(i)];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float s = scale[static_cast<size_t>(scale_inv_index(r, c, cols, mode))];
      q.bytes[static_cast<size_t>(r * cols + c)] = fp8_encode(x[static_cast<size_t>(r * cols + c)] * s, dt);
    }
  return q;
}

// Compares two FP8 tensors seen as [rows, cols] matrices: dtype and scaling mode, scale_invs bit
// for bit, codes by their values (so +0/-0 compare equal, NaN equals NaN).
inline ::testing::AssertionResult SameQuantization(const HostTensor &got, const HostTensor &want) {
  if (got.rows() != want.rows() || got.cols() != want.cols())
    return ::testing::AssertionFailure() << "shape [" << got.rows() << "," << got.cols()
                                         << "] vs expected [" << want.rows() << "," << want.cols()
                                         << "]";
  if (got.t.dtype != want.t.dtype)
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(got.t.dtype) << " vs expected " << dtype_name(want.t.dtype);
  if (got.t.scaling != want.t.scaling)
    return ::testing::AssertionFailure() << "scaling mode " << got.t.scaling << " vs expected "
                                         << want.t.scaling;
  for (size_t i = 0; i < want.scale_inv.size(); ++i)
    if (float_to_bits(got.scale_inv[i]) != float_to_bits(want.scale_inv[i]))
      return ::testing::AssertionFailure()
             << "scale_inv[" << i << "] = " << got.scale_inv[i] << " (0x" << std::hex
             << float_to_bits(got.scale_inv[i]) << std::dec << "), expected " << want.scale_inv[i]
             << " (0x" << std::hex << float_to_bits(want.scale_inv[i]) << std::dec << ")";
  int64_t bad = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.at(i), w = want.at(i);
    if (!(g == w || (std::isnan(g) && std::isnan(w)))) {
      if (bad++ < 4)
        first << " [" << i / want.cols() << "," << i % want.cols() << "]: code 0x" << std::hex
              << int(got.code(i)) << " (" << g << ") vs expected 0x" << int(want.code(i))
              << std::dec << " (" << w << ");";
    }
  }
  if (bad)
    return ::testing::AssertionFailure() << bad << " of " << want.numel()
                                         << " codes differ:" << first.str();
  return ::testing::AssertionSuccess();
}

inline std::vector<float> transpose(const std::vector<float> &x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t[static_cast<size_t>(c * rows + r)] = x[static_cast<size_t>(r * cols + c)];
  return t;
}
inline std::vector<double> to_double(const std::vector<float> &v) {
  return std::vector<double>(v.begin(), v.end());
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
