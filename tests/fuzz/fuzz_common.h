// Shared pieces of the libFuzzer harnesses (tests/fuzz/*.cpp): only the public header.
//
//  - Reader: turns the fuzz input into choices. Operation bytes are read from the front and
//    arguments from the back (as LLVM's FuzzedDataProvider does), so that an input that runs out
//    of argument bytes reads 0, and 0 is always the common, valid choice: a seed may be just a
//    list of operations. A Reader may also record: it then draws arguments from a PRNG and keeps
//    them, so that make_corpus.cpp can write the exact bytes that replay a program.
//  - Invariants checked after every call (check_call): a failure has a known status, and
//    te_last_error() is "<function>: ..." naming the function that failed; a success leaves the
//    last error as it was. A violation prints what broke and aborts, which libFuzzer reports as a
//    crash with the input that caused it.
//  - Blob: exactly-sized heap memory, so that AddressSanitizer sees any access past the end of a
//    caller buffer; snapshots of output buffers, to check that a failed call left them untouched.
#pragma once

#include <te/te.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// The sanitizer options every harness needs, compiled in so that a crash input reproduces with a
// plain `build/fuzz/tests/fuzz/<name> <input>`: a huge te_context_malloc must come back as
// TE_ERROR_OUT_OF_MEMORY rather than an ASan abort. (scripts/test_fuzz.sh exports these symbols
// from the executables, where the shared ASan runtime finds them.) Each harness says
// FUZZ_SANITIZER_DEFAULTS once.
#define FUZZ_SANITIZER_DEFAULTS                                                        \
  extern "C" __attribute__((visibility("default"))) const char *__asan_default_options() { \
    return "allocator_may_return_null=1:detect_leaks=1";                               \
  }                                                                                    \
  extern "C" __attribute__((visibility("default"))) const char *__ubsan_default_options() { \
    return "print_stacktrace=1:halt_on_error=1";                                       \
  }

namespace fuzz {

[[noreturn]] inline void violation(const char *fmt, ...) {
  std::fprintf(stderr, "\n==== INVARIANT VIOLATED: ");
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n     te_last_error: \"%s\"\n", te_last_error());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_ASSERT(cond, ...)                   \
  do {                                           \
    if (!(cond)) ::fuzz::violation(__VA_ARGS__); \
  } while (0)

// ---- the input -----------------------------------------------------------------------------

class Reader {
 public:
  Reader(const uint8_t *data, size_t size) : p_(data), lo_(0), hi_(size) {}
  // Recording: operations from `ops`; the arguments of operation i are op_args[i] (when given)
  // and then draws from a PRNG (seed) that gives 0 with probability about
  // (256 - nonzero_per_256) / 256.
  Reader(std::vector<uint8_t> ops, uint64_t seed, int nonzero_per_256,
         std::vector<std::vector<uint8_t>> op_args = {})
      : p_(nullptr), lo_(0), hi_(0), recording_(true), ops_(std::move(ops)), rng_(seed | 1),
        nonzero_(nonzero_per_256), op_args_(std::move(op_args)) {}

  bool more_ops() const { return recording_ ? next_op_ < ops_.size() : lo_ < hi_; }
  uint8_t op() {
    if (recording_) return next_op_ < ops_.size() ? ops_[next_op_++] : 0;
    return lo_ < hi_ ? p_[lo_++] : 0;
  }
  uint8_t u8() {
    if (recording_) {
      uint8_t v = 0;
      const size_t op = next_op_ - 1;
      if (next_op_ > 0 && op < op_args_.size() && used_ < op_args_[op].size() && op == args_op_) {
        v = op_args_[op][used_++];
      } else if (next_op_ > 0 && op < op_args_.size() && op != args_op_ && !op_args_[op].empty()) {
        args_op_ = op;
        used_ = 1;
        v = op_args_[op][0];
      } else if (static_cast<int>(next_rand() & 0xFF) < nonzero_) {
        v = static_cast<uint8_t>(next_rand() >> 24);
      }
      args_.push_back(v);
      return v;
    }
    return lo_ < hi_ ? p_[--hi_] : 0;
  }
  uint16_t u16() { return static_cast<uint16_t>(u8() | u8() << 8); }
  uint32_t u32() { return static_cast<uint32_t>(u16()) | static_cast<uint32_t>(u16()) << 16; }
  uint64_t u64() { return static_cast<uint64_t>(u32()) | static_cast<uint64_t>(u32()) << 32; }
  // 0..n-1 (n >= 1), from as few bytes as n needs.
  uint32_t pick(uint32_t n) {
    if (n <= 1) return 0;
    if (n <= 256) return u8() % n;
    if (n <= 65536) return u16() % n;
    return u32() % n;
  }
  // True with probability about per256/256; false for a 0 byte.
  bool chance(int per256) { return per256 > 0 && u8() > 255 - per256; }
  float f32() {
    uint32_t b = u32();
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
  }

  // The bytes that replay what was recorded: operations, then the arguments reversed.
  std::vector<uint8_t> encoding() const {
    std::vector<uint8_t> out(ops_.begin(), ops_.begin() + static_cast<long>(next_op_));
    out.insert(out.end(), args_.rbegin(), args_.rend());
    return out;
  }

 private:
  uint32_t next_rand() {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return static_cast<uint32_t>(rng_ >> 11);
  }
  const uint8_t *p_;
  size_t lo_, hi_;
  bool recording_ = false;
  std::vector<uint8_t> ops_;
  size_t next_op_ = 0;
  std::vector<uint8_t> args_;
  uint64_t rng_ = 1;
  int nonzero_ = 0;
  std::vector<std::vector<uint8_t>> op_args_;
  size_t args_op_ = SIZE_MAX, used_ = 0;
};

// A small deterministic PRNG for tensor contents (seeded from the input).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint32_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<uint32_t>(s >> 16);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() & 0xFFFFFF) / 16777216.0f; }
};

// A recognisable non-NULL pointer value, never dereferenced.
inline void *sentinel_ptr() { return reinterpret_cast<void *>(static_cast<uintptr_t>(0xFEEDFACECAFEBEE0ull)); }

// ---- call checks ---------------------------------------------------------------------------

inline bool known_status(te_status s) { return s >= TE_SUCCESS && s <= TE_ERROR_INTERNAL; }

// After `fn` returned `s`: a failure names `fn` in te_last_error(); a success leaves the last
// error as `before` (successful calls do not clear or replace it). TE_ERROR_INTERNAL is a bug
// ("please report"), and so is a status outside the enumeration.
inline te_status check_call(const char *fn, te_status s, const std::string &before) {
  FUZZ_ASSERT(known_status(s), "%s returned %d, not a te_status value", fn, static_cast<int>(s));
  const char *msg = te_last_error();
  FUZZ_ASSERT(msg != nullptr, "%s: te_last_error() returned NULL", fn);
  if (s == TE_SUCCESS) {
    FUZZ_ASSERT(before == msg, "%s succeeded but changed te_last_error() from \"%s\" to \"%s\"", fn, before.c_str(),
                msg);
    return s;
  }
  const size_t n = std::strlen(fn);
  FUZZ_ASSERT(std::strncmp(msg, fn, n) == 0 && msg[n] == ':',
              "%s failed with %s but te_last_error() does not start with \"%s:\"", fn, te_status_string(s), fn);
  FUZZ_ASSERT(std::strlen(msg) > n + 2, "%s failed with %s but te_last_error() has no message", fn,
              te_status_string(s));
  FUZZ_ASSERT(s != TE_ERROR_INTERNAL, "%s returned TE_ERROR_INTERNAL (a libte bug by its own definition)", fn);
  return s;
}

// TE_CALL(te_quantize, ctx, &x, &out, NULL): the call, checked as above; evaluates to its status.
// FUZZ_TRACE=1 in the environment prints every checked call (to read a reproducer).
inline bool tracing() {
  static const bool on = std::getenv("FUZZ_TRACE") != nullptr;
  return on;
}

template <class F>
inline te_status call_checked(const char *fn, F &&call) {
  const std::string before = te_last_error();
  const te_status s = call();
  if (tracing()) std::fprintf(stderr, "  %s -> %s%s%s\n", fn, te_status_string(s), s ? ": " : "", s ? te_last_error() : "");
  return check_call(fn, s, before);
}
#define TE_CALL(fn, ...) ::fuzz::call_checked(#fn, [&] { return fn(__VA_ARGS__); })

// ---- memory ---------------------------------------------------------------------------------

// Exactly `n` bytes of heap (at least 1 allocated): an access past the end is an ASan report.
class Blob {
 public:
  Blob() = default;
  explicit Blob(size_t n) : n_(n), p_(static_cast<uint8_t *>(std::malloc(n ? n : 1))) {
    if (!p_) std::abort();
    std::memset(p_, 0, n ? n : 1);
  }
  ~Blob() { std::free(p_); }
  Blob(Blob &&o) noexcept : n_(o.n_), p_(o.p_) { o.p_ = nullptr; o.n_ = 0; }
  Blob &operator=(Blob &&o) noexcept {
    if (this != &o) {
      std::free(p_);
      n_ = o.n_;
      p_ = o.p_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  Blob(const Blob &) = delete;
  Blob &operator=(const Blob &) = delete;
  uint8_t *data() const { return p_; }
  size_t size() const { return n_; }
  float *floats() const { return reinterpret_cast<float *>(p_); }
  std::vector<uint8_t> snapshot() const { return p_ ? std::vector<uint8_t>(p_, p_ + n_) : std::vector<uint8_t>(); }
  bool equals(const std::vector<uint8_t> &s) const {
    return s.size() == n_ && (n_ == 0 || std::memcmp(p_, s.data(), n_) == 0);
  }

 private:
  size_t n_ = 0;
  uint8_t *p_ = nullptr;
};

inline size_t dtype_bytes(int dtype) {
  switch (dtype) {
    case TE_DTYPE_F32: return 4;
    case TE_DTYPE_F16:
    case TE_DTYPE_BF16: return 2;
    case TE_DTYPE_E4M3:
    case TE_DTYPE_E5M2: return 1;
    default: return 4;
  }
}
inline bool is_fp8(int dtype) { return dtype == TE_DTYPE_E4M3 || dtype == TE_DTYPE_E5M2; }

// Enum fields may hold any int: write the bits, not an out-of-range enum value.
template <class E>
inline void set_enum(E &field, int v) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized");
  std::memcpy(&field, &v, sizeof v);
}
template <class E>
inline int get_enum(const E &field) {
  int v;
  std::memcpy(&v, &field, sizeof v);
  return v;
}

// ---- numbers ------------------------------------------------------------------------------

inline float bf16_to_float(uint16_t h) {
  uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
inline uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  if (std::isnan(f)) return static_cast<uint16_t>((b >> 16) | 0x40);
  b += 0x7FFF + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}
inline uint16_t float_to_f16(float f) {  // truncating; non-finite and out-of-range values too
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return 0x7E00;
  f = std::fabs(f);
  if (!(f < 65520.0f)) return static_cast<uint16_t>(sign | 0x7C00);
  if (f < 6.103515625e-05f) return static_cast<uint16_t>(sign | static_cast<uint16_t>(f * 16777216.0f));
  int e;
  const float m = std::frexp(f, &e);  // f = m * 2^e, m in [0.5, 1)
  const int exp = e + 14;
  const uint16_t man = static_cast<uint16_t>((m * 2.0f - 1.0f) * 1024.0f);
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7BFF);
  return static_cast<uint16_t>(sign | exp << 10 | man);
}

// Element i of a high-precision buffer as a float.
inline float load_hp(const void *data, int dtype, int64_t i) {
  const uint8_t *p = static_cast<const uint8_t *>(data);
  if (dtype == TE_DTYPE_F32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dtype == TE_DTYPE_BF16 ? bf16_to_float(h) : f16_to_float(h);
}
inline void store_hp(void *data, int dtype, int64_t i, float v) {
  uint8_t *p = static_cast<uint8_t *>(data);
  if (dtype == TE_DTYPE_F32) {
    std::memcpy(p + 4 * i, &v, 4);
    return;
  }
  uint16_t h = dtype == TE_DTYPE_BF16 ? float_to_bf16(v) : float_to_f16(v);
  std::memcpy(p + 2 * i, &h, 2);
}

}  // namespace fuzz
