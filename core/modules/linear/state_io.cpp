// The layer's FP8 state as bytes: "TELS", format version, the layer's shape, then per state
// (input, weight, grad_output): history length, FP8 dtype, scale, scale_inv, history. Host byte
// order (little-endian on every platform libte targets). Floats are copied bit for bit, so a
// save/load round trip resumes training identically.
//
// Loading trusts nothing: it accepts exactly what saving can produce, and refuses the rest
// before anything changes. A used state has scale in [kMinScale, FLT_MAX] (every scale formula
// keeps it there), scale_inv == 1 / scale as the update computes it, and history entries that are
// amaxes: +0, positive finite or +inf. A NaN amax (a tensor that held NaN) is saved as +0, which
// every scale update treats alike (the window's MAX ignores NaN, and MOST_RECENT keeps the scale
// for both). A never-used state is length 0, E4M3, scale = scale_inv = 1.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "modules/linear/linear.h"

namespace te {

namespace {

constexpr char kMagic[4] = {'T', 'E', 'L', 'S'};
constexpr uint32_t kVersion = 1;
constexpr TensorRole kRoles[3] = {TensorRole::Input, TensorRole::Weight, TensorRole::GradOutput};

struct Writer {
  unsigned char *p;
  template <class T> void put(const T &v) { std::memcpy(p, &v, sizeof v); p += sizeof v; }
  void put_floats(const float *f, size_t n) {
    if (n) std::memcpy(p, f, n * sizeof(float));
    p += n * sizeof(float);
  }
};

struct Reader {
  const unsigned char *p, *end;
  template <class T> T get() {
    if (static_cast<size_t>(end - p) < sizeof(T))
      fail(Status::InvalidArgument, "argument 'buf': truncated state (needs more than the %zu bytes given)",
           static_cast<size_t>(end - p));
    T v;
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
  }
};

constexpr size_t kHeaderBytes = 4 + sizeof(uint32_t) + 2 * sizeof(int64_t);
constexpr size_t kStateHeaderBytes = 2 * sizeof(int32_t) + 2 * sizeof(float);

}  // namespace

size_t linear_state_size(Context &ctx, const Linear &lin) {
  size_t n = kHeaderBytes;
  for (TensorRole r : kRoles)
    n += kStateHeaderBytes + sizeof(float) * static_cast<size_t>(lin.core()->state(r).history_len());
  return n;
}

void linear_state_save(Context &ctx, const Linear &lin, void *buf, size_t capacity) {
  size_t need = linear_state_size(ctx, lin);
  if (capacity < need)
    fail(Status::InvalidArgument, "argument 'capacity': expected at least %zu bytes, got %zu", need, capacity);
  LinearCore &L = *lin.core();
  Writer w{static_cast<unsigned char *>(buf)};
  std::memcpy(w.p, kMagic, 4);
  w.p += 4;
  w.put(kVersion);
  w.put(L.opts.in_features);
  w.put(L.opts.out_features);
  std::vector<float> history;
  for (TensorRole r : kRoles) {
    const ScalingState &st = L.state(r);
    float scale = 1.0f, scale_inv = 1.0f;
    history.resize(static_cast<size_t>(st.history_len()));
    st.read(ctx.backend(), &scale, &scale_inv, history.data(), st.history_len());
    for (float &h : history)
      if (std::isnan(h)) h = 0.0f;
    w.put(static_cast<int32_t>(st.history_len()));
    w.put(static_cast<int32_t>(st.fp8_dtype()));
    w.put(scale);
    w.put(scale_inv);
    w.put_floats(history.data(), history.size());
  }
}

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// One state as parsed; throws InvalidArgument naming what is wrong.
void check_state(int role, int32_t len, DType dtype, float scale, float scale_inv, const std::vector<float> &history) {
  static const char *const names[3] = {"input", "weight", "grad_output"};
  const char *who = names[role];
  if (len == 0) {
    if (dtype != DType::E4M3 || bits_of(scale) != bits_of(1.0f) || bits_of(scale_inv) != bits_of(1.0f))
      fail(Status::InvalidArgument, "argument 'buf': corrupt %s state (never used, so expected E4M3 with scale "
           "and scale_inv 1, got %s, %g, %g)", who, dtype_name(dtype), (double)scale, (double)scale_inv);
    return;
  }
  if (!(scale >= kMinScale && scale <= FLT_MAX))
    fail(Status::InvalidArgument, "argument 'buf': corrupt %s state (scale %g: expected 2^-63 <= scale <= FLT_MAX)",
         who, (double)scale);
  if (bits_of(scale_inv) != bits_of(1.0f / scale))
    fail(Status::InvalidArgument, "argument 'buf': corrupt %s state (scale_inv %.9g is not 1 / scale = %.9g)", who,
         (double)scale_inv, (double)(1.0f / scale));
  for (size_t i = 0; i < history.size(); ++i) {
    const float h = history[i];
    if (std::isnan(h) || std::signbit(h))
      fail(Status::InvalidArgument, "argument 'buf': corrupt %s state (history[%zu] = %g: an amax is +0, positive "
           "or +inf)", who, i, (double)h);
  }
}

}  // namespace

void linear_state_load(Context &ctx, Linear &lin, const void *buf, size_t size) {
  LinearCore &L = *lin.core();
  // A state in an open pass's or a pending backward pass's bucket is about to be updated with
  // the amaxes of that pass; replacing it underneath would mix two histories (and a never-used
  // state has no storage for the update to write).
  for (TensorRole role : kRoles)
    if (ctx.autocast().holds(&L.state(role)))
      fail(Status::InvalidState, "argument 'lin': its scaling states are in use by an open autocast scope or a "
           "pending backward pass; load after te_autocast_end and the backward (or te_autocast_flush_backward)");
  Reader r{static_cast<const unsigned char *>(buf), static_cast<const unsigned char *>(buf) + size};
  if (size < 4 || std::memcmp(buf, kMagic, 4) != 0)
    fail(Status::InvalidArgument, "argument 'buf': not a libte linear state (bad magic)");
  r.p += 4;
  uint32_t version = r.get<uint32_t>();
  if (version != kVersion)
    fail(Status::InvalidArgument, "argument 'buf': expected state format version %u, got %u", kVersion, version);
  int64_t in = r.get<int64_t>(), out = r.get<int64_t>();
  if (in != L.opts.in_features || out != L.opts.out_features)
    fail(Status::InvalidArgument, "argument 'buf': saved from a layer [%lld -> %lld], this layer is [%lld -> %lld]",
         (long long)in, (long long)out, (long long)L.opts.in_features, (long long)L.opts.out_features);
  // Parse everything first: a bad buffer leaves the layer untouched.
  struct Parsed { int32_t len; DType dtype; float scale, scale_inv; std::vector<float> history; } parsed[3];
  for (Parsed &p : parsed) {
    p.len = r.get<int32_t>();
    int32_t dt = r.get<int32_t>();
    if (p.len < 0 || p.len > 65536)
      fail(Status::InvalidArgument, "argument 'buf': corrupt state (history length %d)", p.len);
    if (dt != static_cast<int32_t>(DType::E4M3) && dt != static_cast<int32_t>(DType::E5M2))
      fail(Status::InvalidArgument, "argument 'buf': corrupt state (FP8 dtype %d)", dt);
    p.dtype = static_cast<DType>(dt);
    p.scale = r.get<float>();
    p.scale_inv = r.get<float>();
    p.history.resize(static_cast<size_t>(p.len));
    for (float &h : p.history) h = r.get<float>();
    check_state(static_cast<int>(&p - parsed), p.len, p.dtype, p.scale, p.scale_inv, p.history);
  }
  if (r.p != r.end)
    fail(Status::InvalidArgument, "argument 'size': %zu bytes follow the state", static_cast<size_t>(r.end - r.p));
  for (int i = 0; i < 3; ++i)
    L.state(kRoles[i]).assign(ctx.backend(), ctx.amax_slots(), parsed[i].len, parsed[i].dtype, parsed[i].scale,
                              parsed[i].scale_inv, parsed[i].history.data());
  // The cached FP8 weight was quantized with the old scale.
  L.weight_cache.reset();
}

}  // namespace te
