#include "modules/common/state_io.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"

namespace te {

namespace {

constexpr uint32_t kVersion = 1;
constexpr size_t kStateHeaderBytes = 2 * sizeof(int32_t) + 2 * sizeof(float);

size_t header_bytes(const StateFormat &f) { return 4 + sizeof(uint32_t) + sizeof(int64_t) * static_cast<size_t>(f.shape_len); }

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

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

struct Parsed {
  int32_t len = 0;
  DType dtype = DType::E4M3;
  float scale = 1.0f, scale_inv = 1.0f;
  std::vector<float> history;
};

// One state as parsed; throws InvalidArgument naming what is wrong.
void check_state(const char *who, const Parsed &p) {
  if (p.len == 0) {
    if (p.dtype != DType::E4M3 || bits_of(p.scale) != bits_of(1.0f) || bits_of(p.scale_inv) != bits_of(1.0f))
      fail(Status::InvalidArgument, "argument 'buf': corrupt %s state (never used, so expected E4M3 with scale "
           "and scale_inv 1, got %s, %g, %g)", who, dtype_name(p.dtype), (double)p.scale, (double)p.scale_inv);
    return;
  }
  if (!(p.scale >= kMinScale && p.scale <= FLT_MAX))
    fail(Status::InvalidArgument, "argument 'buf': corrupt %s state (scale %g: expected 2^-63 <= scale <= FLT_MAX)",
         who, (double)p.scale);
  if (bits_of(p.scale_inv) != bits_of(1.0f / p.scale))
    fail(Status::InvalidArgument, "argument 'buf': corrupt %s state (scale_inv %.9g is not 1 / scale = %.9g)", who,
         (double)p.scale_inv, (double)(1.0f / p.scale));
  for (size_t i = 0; i < p.history.size(); ++i) {
    const float h = p.history[i];
    if (std::isnan(h) || std::signbit(h))
      fail(Status::InvalidArgument, "argument 'buf': corrupt %s state (history[%zu] = %g: an amax is +0, positive "
           "or +inf)", who, i, (double)h);
  }
}

}  // namespace

size_t states_size(const StateFormat &f, const ScalingState *const *states, int n) {
  size_t bytes = header_bytes(f);
  for (int i = 0; i < n; ++i) bytes += kStateHeaderBytes + sizeof(float) * static_cast<size_t>(states[i]->history_len());
  return bytes;
}

void states_save(Context &ctx, const StateFormat &f, const ScalingState *const *states, int n, void *buf,
                 size_t capacity) {
  const size_t need = states_size(f, states, n);
  if (capacity < need)
    fail(Status::InvalidArgument, "argument 'capacity': expected at least %zu bytes, got %zu", need, capacity);
  ctx.autocast().settle();  // a deferred scale update is part of the pass that ended
  // Serialised into a staging copy first: reading the states allocates, and running out of
  // memory must leave the caller's buffer as it was.
  std::vector<unsigned char> staging(need);
  Writer w{staging.data()};
  std::memcpy(w.p, f.magic, 4);
  w.p += 4;
  w.put(kVersion);
  for (int i = 0; i < f.shape_len; ++i) w.put(f.shape[i]);
  std::vector<float> history;
  for (int i = 0; i < n; ++i) {
    const ScalingState &st = *states[i];
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
  std::memcpy(buf, staging.data(), need);
}

void states_load(Context &ctx, const StateFormat &f, ScalingState *const *states, int n, StateName name,
                 const void *buf, size_t size) {
  // A state in an open pass's or a pending backward pass's bucket is about to be updated with
  // the amaxes of that pass; replacing it underneath would mix two histories (and a never-used
  // state has no storage for the update to write). An ended pass's deferred update is enqueued
  // first, as if it had run at te_autocast_end.
  ctx.autocast().settle();
  for (int i = 0; i < n; ++i)
    if (ctx.autocast().holds(states[i]))
      fail(Status::InvalidState, "argument '%s': its scaling states are in use by an open autocast scope or a "
           "pending backward pass; load after te_autocast_end and the backward (or te_autocast_flush_backward)",
           f.handle_name);
  Reader r{static_cast<const unsigned char *>(buf), static_cast<const unsigned char *>(buf) + size};
  if (size < 4 || std::memcmp(buf, f.magic, 4) != 0)
    fail(Status::InvalidArgument, "argument 'buf': not a libte %s state (bad magic)", f.module);
  r.p += 4;
  const uint32_t version = r.get<uint32_t>();
  if (version != kVersion)
    fail(Status::InvalidArgument, "argument 'buf': expected state format version %u, got %u", kVersion, version);
  for (int i = 0; i < f.shape_len; ++i) {
    const int64_t v = r.get<int64_t>();
    if (v != f.shape[i])
      fail(Status::InvalidArgument, "argument 'buf': saved from a %s of another shape (%s[%d] = %lld, this one has "
           "%lld)", f.module, f.shape_names, i, (long long)v, (long long)f.shape[i]);
  }
  // Parse everything first: a bad buffer leaves the module untouched.
  std::vector<Parsed> parsed(static_cast<size_t>(n));
  char who[64];
  for (int i = 0; i < n; ++i) {
    Parsed &p = parsed[static_cast<size_t>(i)];
    p.len = r.get<int32_t>();
    const int32_t dt = r.get<int32_t>();
    if (p.len < 0 || p.len > 65536)
      fail(Status::InvalidArgument, "argument 'buf': corrupt state (history length %d)", p.len);
    if (dt != static_cast<int32_t>(DType::E4M3) && dt != static_cast<int32_t>(DType::E5M2))
      fail(Status::InvalidArgument, "argument 'buf': corrupt state (FP8 dtype %d)", dt);
    p.dtype = static_cast<DType>(dt);
    p.scale = r.get<float>();
    p.scale_inv = r.get<float>();
    p.history.resize(static_cast<size_t>(p.len));
    for (float &h : p.history) h = r.get<float>();
    name(i, who, sizeof who);
    check_state(who, p);
  }
  if (r.p != r.end)
    fail(Status::InvalidArgument, "argument 'size': %zu bytes follow the state", static_cast<size_t>(r.end - r.p));
  // Every state's memory is allocated before any is replaced.
  std::vector<ScalingState::Staged> staged;
  staged.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const Parsed &p = parsed[static_cast<size_t>(i)];
    staged.push_back(states[i]->stage_assign(ctx.backend(), ctx.amax_slots(), p.len, p.dtype, p.scale, p.scale_inv,
                                             p.history.data()));
  }
  for (int i = 0; i < n; ++i) states[i]->commit(ctx.backend(), std::move(staged[static_cast<size_t>(i)]));
}

}  // namespace te
