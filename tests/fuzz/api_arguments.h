// How fuzz_api_sequence's Program (api_program.h) reads its arguments: handles of each type
// (live, stale, NULL or of another type), dtypes, scaling modes, shapes, and tensors filled from
// the input, sometimes malformed.
#pragma once

#include "api_program.h"

namespace fuzz {

// ---- helpers ----

// Any live handle, cast to another type by the caller: a wrong-type handle. avoid_kind: 0 context,
// 1 recipe, 2 group, 3 linear, 4 linear backward context, 5 grouped linear, 6 its backward context,
// 7 LayerNormLinear / LayerNormMLP, 8 their backward contexts, 9 attention, 10 its backward contexts,
// 11 checkpoints.
inline void *Program::some_live_handle(int avoid_kind) {
  std::vector<void *> c;
  if (avoid_kind != 0)
    for (auto &s : ctx_)
      if (s.live) c.push_back(s.h);
  if (avoid_kind != 1)
    for (auto &s : rec_)
      if (s.refs) c.push_back(s.h);
  if (avoid_kind != 2)
    for (auto &s : grp_)
      if (s.live) c.push_back(s.h);
  if (avoid_kind != 3)
    for (auto &s : lin_)
      if (s.live) c.push_back(s.h);
  if (avoid_kind != 4)
    for (auto &s : bwd_)
      if (s.live) c.push_back(s.h);
  if (avoid_kind != 5)
    for (auto &s : moe_)
      if (s.live) c.push_back(s.h);
  if (avoid_kind != 6)
    for (auto &s : moe_bwd_)
      if (s.live) c.push_back(s.h);
  if (avoid_kind != 7)
    for (auto &s : ln_)
      if (s.live) c.push_back(s.h);
  if (avoid_kind != 8)
    for (auto &s : ln_bwd_)
      if (s.live) c.push_back(s.h);
  if (avoid_kind != 9)
    for (auto &s : attn_)
      if (s.live) c.push_back(s.h);
  if (avoid_kind != 10)
    for (auto &s : attn_bwd_)
      if (s.live) c.push_back(s.h);
  if (avoid_kind != 11)
    for (auto &s : ck_)
      if (s.live) c.push_back(s.h);
  if (c.empty()) return nullptr;
  return c[R.pick(static_cast<uint32_t>(c.size()))];
}

// A context argument: usually a live slot; sometimes NULL, stale or of another type (then
// the call must fail). `slot` is the slot used (-1 for none).
inline te_context *Program::ctx_arg(bool &mf, int &slot, int preferred) {
  uint8_t v = R.u8();
  slot = -1;
  if (v < 240) {
    slot = preferred >= 0 && v < 200 ? preferred : v % kCtxSlots;
    if (ctx_[slot].live) return ctx_[slot].h;
    mf = true;
    return ctx_[slot].h;  // stale or NULL
  }
  mf = true;
  if (v < 246) return nullptr;
  if (v < 251 && !dead_ctx_.empty()) return dead_ctx_[R.pick(static_cast<uint32_t>(dead_ctx_.size()))];
  return static_cast<te_context *>(some_live_handle(0));
}
inline int Program::live_ctx_slot() const {
  for (int i = 0; i < kCtxSlots; ++i)
    if (ctx_[i].live) return i;
  return -1;
}

// ---- tensors ----

inline Shape Program::gen_shape(int64_t cap) {
  static const int64_t kDims[16] = {16, 32, 1, 3, 128, 17, 64, 130, 2, 48, 256, 5, 8, 96, 127, 129};
  static const int kNd[4] = {2, 1, 3, 4};
  Shape s;
  s.ndim = kNd[R.pick(4)];
  for (int i = 0; i < s.ndim; ++i) s.d[i] = kDims[R.pick(16)];
  for (int i = 0; i < s.ndim && s.numel() > cap; ++i) s.d[i] = 1;
  while (s.numel() > cap) s.d[s.ndim - 1] = 16;
  return s;
}

inline void Program::fill_values(Tensor &x, int mode, uint32_t seed) {
  Rng rng(seed + 977u * serial_);
  const int dtype = get_enum(x.t.dtype);
  const size_t n = x.data.size();
  if (is_fp8(dtype) || mode == 7) {
    for (size_t i = 0; i < n; ++i) x.data.data()[i] = static_cast<uint8_t>(rng.next());
  } else {
    const int64_t count = static_cast<int64_t>(n / dtype_bytes(dtype));
    for (int64_t i = 0; i < count; ++i) {
      float v;
      switch (mode) {
        case 1: v = rng.uniform(-448.0f, 448.0f); break;
        case 2: v = rng.uniform(-1e-30f, 1e-30f); break;
        case 3: v = 0.0f; break;
        case 4: v = (rng.next() % 17 == 0) ? NAN : rng.uniform(-2, 2); break;
        case 5: v = (rng.next() % 13 == 0) ? -INFINITY : rng.uniform(-2, 2); break;
        case 6: v = rng.uniform(-3e4f, 3e4f); break;
        default: v = rng.uniform(-2.0f, 2.0f); break;
      }
      store_hp(x.data.data(), dtype, i, v);
    }
  }
  const size_t ns = x.scale.size() / sizeof(float);
  for (size_t i = 0; i < ns; ++i) {
    float v = rng.uniform(1e-3f, 4.0f);
    if (mode == 4 && i == 0) v = NAN;
    if (mode == 5 && i == 0) v = INFINITY;
    if (mode == 3) v = 0.0f;
    std::memcpy(x.scale.data() + 4 * i, &v, 4);
  }
}

// A well-formed tensor of `shape` and `dtype` on the CPU, filled from the input.
inline void Program::make(Tensor &x, int dtype, const Shape &shape, int scaling) {
  x.shape = shape;
  x.malformed = false;
  std::memset(&x.t, 0, sizeof x.t);
  set_enum(x.t.dtype, dtype);
  x.t.ndim = shape.ndim;
  for (int i = 0; i < shape.ndim; ++i) x.t.shape[i] = shape.d[i];
  x.t.device.type = TE_DEVICE_CPU;
  x.t.device.index = 0;
  const int64_t n = shape.good() ? shape.numel() : 1;
  x.data = Blob(static_cast<size_t>(n) * dtype_bytes(dtype));
  x.t.data = x.data.data();
  if (is_fp8(dtype)) {
    set_enum(x.t.scaling, scaling);
    const bool known = scaling >= 0 && scaling <= 2;
    x.scale = Blob(sizeof(float) * static_cast<size_t>(known && shape.good() ? scale_count(scaling, shape) : 1));
    x.t.scale_inv = x.scale.floats();
  } else {
    x.scale = Blob();
  }
  fill_values(x, static_cast<int>(R.pick(8)), R.u8());
}

// Sometimes breaks the tensor in a way the header says every call must reject.
inline void Program::maybe_malform(Tensor &x) {
  uint8_t m = R.u8();
  if (m < 230) return;
  te_tensor &t = x.t;
  const int dtype = get_enum(t.dtype);
  const int i = t.ndim >= 1 && t.ndim <= TE_MAX_DIMS ? static_cast<int>(R.pick(static_cast<uint32_t>(t.ndim))) : 0;
  switch (m - 230) {
    case 0: t.data = nullptr; x.malformed = true; break;
    case 1: t.ndim = 0; x.malformed = true; break;
    case 2: t.ndim = TE_MAX_DIMS + 1; x.malformed = true; break;
    case 3: t.ndim = -1; x.malformed = true; break;
    case 4: t.shape[i] = 0; x.malformed = true; break;
    case 5: t.shape[i] = -1 - R.u8(); x.malformed = true; break;
    case 6: t.shape[i] = INT64_MIN; x.malformed = true; break;
    case 7: case 8: case 9: case 10: case 11: {
      const OverflowShape &o = kOverflowShapes[R.pick(kNumOverflowShapes)];
      t.ndim = o.ndim;
      for (int k = 0; k < o.ndim; ++k) t.shape[k] = o.d[k];
      x.malformed = true;
      break;
    }
    case 12: set_enum(t.dtype, 5); x.malformed = true; break;
    case 13: set_enum(t.dtype, -1); x.malformed = true; break;
    case 14: set_enum(t.dtype, INT_MAX); x.malformed = true; break;
    case 15: if (is_fp8(dtype)) { t.scale_inv = nullptr; x.malformed = true; } break;
    case 16: if (is_fp8(dtype)) { set_enum(t.scaling, 3); x.malformed = true; } break;
    case 17: if (is_fp8(dtype)) { set_enum(t.scaling, -1); x.malformed = true; } break;
    case 18: t.device.type = TE_DEVICE_CUDA; t.device.index = 0; x.malformed = true; break;
    case 19: set_enum(t.device.type, 2); x.malformed = true; break;
    case 20: t.device.index = -1; x.malformed = true; break;
    case 21: t.device.index = 1; x.malformed = true; break;  // CPU:1 is not the context's device
    case 22:  // the same elements with leading 1s: still well-formed
      if (t.ndim >= 1 && t.ndim < TE_MAX_DIMS && !x.malformed) {
        std::memmove(&t.shape[1], &t.shape[0], sizeof(int64_t) * static_cast<size_t>(t.ndim));
        t.shape[0] = 1;
        ++t.ndim;
      }
      break;
    default: break;
  }
}

inline Tensor *Program::maybe_null(Tensor &x, bool &mf, bool optional) {
  if (R.u8() >= 250) {
    if (!optional) mf = true;
    return nullptr;
  }
  if (x.malformed) mf = true;
  return &x;
}


inline int Program::pick_dtype(int def, bool &odd) {
  uint8_t v = R.u8();
  if (v < 200) return def;
  odd = true;
  if (v < 250) return static_cast<int>(v % 5);
  return v < 253 ? 5 : -1;
}
inline int Program::pick_scaling() {
  uint8_t v = R.u8();
  if (v < 160) return TE_SCALING_PER_TENSOR;
  if (v < 205) return TE_SCALING_BLOCK_1X128;
  if (v < 250) return TE_SCALING_BLOCK_128X128;
  return v < 253 ? 3 : -1;
}

}  // namespace fuzz
