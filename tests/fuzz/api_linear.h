// fuzz_api_sequence's operations on te_linear (api_program.h): create and destroy, the split
// forward (compute, save) and the fused one, residuals released or copied by value, backward
// (TE_BACKWARD_ONCE, stale handles), scaling state reads.
#pragma once

#include "api_program.h"

namespace fuzz {

// ---- linears ----

inline int64_t Program::pick_features(bool &mf) {
  static const int64_t kFeat[8] = {16, 32, 48, 8, 64, 1, 24, 17};
  uint8_t v = R.u8();
  if (v < 240) return kFeat[v % 8];
  if (v < 244) { mf = true; return 0; }
  if (v < 248) { mf = true; return -16; }
  if (v < 252) return INT64_MAX;
  return int64_t{1} << 40;
}

inline void Program::linear_create() {
  const int slot = static_cast<int>(R.pick(kLinearSlots));
  LinSlot &L = lin_[slot];
  if (L.live) {
    te_linear_destroy(L.h);  // backward contexts keep what they need
    dead_lin_.push_back(L.h);
    L.live = false;
  }
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  te_linear_options o;
  std::memset(&o, 0x6B, sizeof o);
  FUZZ_ASSERT(TE_CALL(te_linear_options_init, &o) == TE_SUCCESS, "te_linear_options_init failed");
  FUZZ_ASSERT(o.bias == 1 && get_enum(o.activation_dtype) == TE_DTYPE_BF16 && o.fuse_wgrad_accumulation == 0,
              "te_linear_options_init defaults");
  o.in_features = pick_features(mf);
  o.out_features = pick_features(mf);
  static const int32_t kB[3] = {1, 0, 2};
  uint8_t b = R.u8();
  o.bias = kB[b < 180 ? 0 : b < 250 ? 1 : 2];
  mf |= o.bias == 2;
  static const int kDt[5] = {TE_DTYPE_BF16, TE_DTYPE_F32, TE_DTYPE_F16, TE_DTYPE_E4M3, 9};
  uint8_t d = R.u8();
  const int dt = kDt[d < 150 ? 0 : d < 200 ? 1 : d < 245 ? 2 : 3 + d % 2];
  set_enum(o.activation_dtype, dt);
  mf |= dt > TE_DTYPE_BF16;
  uint8_t f = R.u8();
  o.fuse_wgrad_accumulation = f < 210 ? 0 : f < 250 ? 1 : 2;
  mf |= o.fuse_wgrad_accumulation == 2;
  const uint8_t x = R.u8();
  if (x >= 252) { o.struct_size = 8; mf = true; }
  const bool null_opts = x >= 248 && x < 250, null_out = x >= 250 && x < 252;
  mf |= null_opts || null_out;
  te_linear *h = sentinel<te_linear>();
  te_status s = TE_CALL(te_linear_create, null_out ? nullptr : &h, ctx, null_opts ? nullptr : &o);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_create accepted invalid arguments");
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(h == sentinel<te_linear>(), "te_linear_create failed but wrote *out");
    return;
  }
  L.h = h;
  L.live = true;
  L.ctx = cs;
  L.cfg.in = o.in_features;
  L.cfg.out = o.out_features;
  L.cfg.bias = o.bias;
  L.cfg.dtype = dt;
  L.cfg.fuse = o.fuse_wgrad_accumulation;
  L.bufs = nullptr;
  if (L.cfg.small()) {
    all_bufs_.push_back(std::make_unique<LinBufs>());
    LinBufs &B = *all_bufs_.back();
    const size_t e = dtype_bytes(dt);
    const size_t in = static_cast<size_t>(L.cfg.in), out = static_cast<size_t>(L.cfg.out);
    B.x = Blob(kMaxTokens * in * e);
    B.w = Blob(out * in * e);
    B.b = Blob(out * e);
    B.main_grad = Blob(out * in * 4);
    Rng rng(R.u8() + 31u * serial_);
    for (size_t i = 0; i < kMaxTokens * in; ++i) store_hp(B.x.data(), dt, static_cast<int64_t>(i), rng.uniform(-2, 2));
    for (size_t i = 0; i < out * in; ++i) store_hp(B.w.data(), dt, static_cast<int64_t>(i), rng.uniform(-0.5f, 0.5f));
    for (size_t i = 0; i < out; ++i) store_hp(B.b.data(), dt, static_cast<int64_t>(i), rng.uniform(-0.5f, 0.5f));
    L.bufs = &B;
  }
}

inline void Program::linear_destroy() {
  LinSlot &L = lin_[R.pick(kLinearSlots)];
  if (L.live) {
    te_linear_destroy(L.h);
    dead_lin_.push_back(L.h);
    L.live = false;
  } else if (L.h) {
    te_linear_destroy(L.h);  // destroyed before: a no-op
  }
}

// A linear argument: the slot's handle (live or stale), sometimes NULL or another type.
inline te_linear *Program::lin_arg(bool &mf, int &slot) {
  uint8_t v = R.u8();
  slot = -1;
  if (v < 245) {
    slot = v % kLinearSlots;
    if (!lin_[slot].live) mf = true;
    return lin_[slot].h;
  }
  mf = true;
  if (v < 250) return nullptr;
  if (!dead_lin_.empty() && v < 253) return dead_lin_[R.pick(static_cast<uint32_t>(dead_lin_.size()))];
  return static_cast<te_linear *>(some_live_handle(3));
}

// The layer's saved state, or empty when it cannot be read (dead layer or context).
inline std::vector<uint8_t> Program::layer_state(te_context *ctx, te_linear *lin) {
  size_t n = 0;
  if (te_linear_state_save(ctx, lin, nullptr, 0, &n) != TE_SUCCESS || n == 0 || n > (1u << 22)) return {};
  std::vector<uint8_t> buf(n);
  size_t n2 = 0;
  if (te_linear_state_save(ctx, lin, buf.data(), n, &n2) != TE_SUCCESS) violation("te_linear_state_save failed after a size query");
  FUZZ_ASSERT(n2 == n, "te_linear_state_save: size %zu after a query of %zu", n2, n);
  return buf;
}

// Whether a forward on context `cs` computes in FP8: 1 yes, 0 no (outside an enabled scope),
// -1 either (enabled and calibrating: the header does not say which wins; TE computes in FP8).
inline int Program::fp8_scope(int cs) const {
  if (!ctx_live(cs) || ctx_[cs].scopes.empty()) return 0;
  const Scope &s = ctx_[cs].scopes.back();
  if (s.enabled != 1) return 0;
  return s.calibrating == 0 ? 1 : -1;
}

// Forward arguments for linear slot `ls` (or a 16x16 default when it names none): x, W, b, y
// into the given tensors; mf when the call must fail.
inline void Program::forward_tensors(int ls, const LinCfg &cfg, LinBufs *bufs, int64_t &tokens, Tensor &x, Tensor &w, Tensor &b, Tensor &y, bool &mf) {
  static const int64_t kTok[8] = {16, 32, 48, 1, 5, 64, 8, 17};
  tokens = kTok[R.pick(8)];
  const bool small = cfg.small() && bufs;
  const int64_t in = small ? cfg.in : 16, out = small ? cfg.out : 16;
  if (!small) mf = true;  // x and W cannot match the layer
  const int dt = cfg.dtype >= TE_DTYPE_F32 && cfg.dtype <= TE_DTYPE_BF16 ? cfg.dtype : TE_DTYPE_BF16;
  const bool three_d = tokens % 2 == 0 && R.u8() >= 230;
  Shape xs = three_d ? Shape{} : shape2(tokens, in), ys = three_d ? Shape{} : shape2(tokens, out);
  if (three_d) {
    xs.ndim = ys.ndim = 3;
    xs.d[0] = ys.d[0] = 2;
    xs.d[1] = ys.d[1] = tokens / 2;
    xs.d[2] = in;
    ys.d[2] = out;
  }
  bool odd = false;
  make(x, dt, xs);
  make(w, dt, shape2(out, in));
  make(b, dt, shape1(out));
  make(y, pick_dtype(dt, odd), ys);
  if (get_enum(y.t.dtype) != dt) mf = true;
  if (small) {  // x and W are the layer's parameters, which must outlive the residuals
    x.t.data = bufs->x.data();
    w.t.data = bufs->w.data();
    b.t.data = bufs->b.data();
  }
  const uint8_t p = R.u8();
  if (p >= 245 && in != out) {  // W transposed
    w.t.shape[0] = in;
    w.t.shape[1] = out;
    mf = true;
  } else if (p >= 240 && p < 245) {  // x's last dimension is not in_features
    x.t.shape[x.t.ndim - 1] = in + 1;
    mf = true;
  }
  maybe_malform(x);
  maybe_malform(w);
  maybe_malform(b);
  maybe_malform(y);
  (void)ls;
}

// Checks a successful forward_compute's residuals, reading every byte of the library's
// storage they point to (ASan checks the sizes).
inline void Program::check_residuals(const te_linear_residuals &r, const LinCfg &cfg, int64_t tokens, int expect_fp8) {
  FUZZ_ASSERT(r.fp8 == 0 || r.fp8 == 1, "forward_compute: residuals.fp8 = %d", r.fp8);
  if (expect_fp8 >= 0)
    FUZZ_ASSERT(r.fp8 == expect_fp8, "forward_compute: residuals.fp8 = %d, expected %d", r.fp8, expect_fp8);
  FUZZ_ASSERT(r.internal != nullptr, "forward_compute succeeded without filling residuals->internal");
  if (!r.fp8) return;
  const te_tensor *ts[2] = {&r.input_t, &r.weight_t};
  const int64_t want[2][2] = {{cfg.in, tokens}, {cfg.in, cfg.out}};
  volatile uint8_t sink = 0;
  for (int k = 0; k < 2; ++k) {
    const te_tensor &t = *ts[k];
    FUZZ_ASSERT(t.ndim == 2 && t.shape[0] == want[k][0] && t.shape[1] == want[k][1],
                "FP8 residual %d: shape [%lld, %lld], expected [%lld, %lld]", k, (long long)t.shape[0],
                (long long)t.shape[1], (long long)want[k][0], (long long)want[k][1]);
    FUZZ_ASSERT(is_fp8(get_enum(t.dtype)) && t.data && t.scale_inv, "FP8 residual %d: not an FP8 tensor", k);
    const int sc = get_enum(t.scaling);
    FUZZ_ASSERT(sc >= 0 && sc <= 2, "FP8 residual %d: scaling %d", k, sc);
    const uint8_t *d = static_cast<const uint8_t *>(t.data);
    for (int64_t i = 0; i < t.shape[0] * t.shape[1]; ++i) sink = static_cast<uint8_t>(sink ^ d[i]);
    const int64_t ns = scale_count(sc, shape2(t.shape[0], t.shape[1]));
    for (int64_t i = 0; i < ns; ++i) {
      float f;
      std::memcpy(&f, t.scale_inv + i, sizeof f);
      sink = static_cast<uint8_t>(sink ^ static_cast<uint8_t>(f != f));
    }
  }
  (void)sink;
}

inline void Program::clear_res_slot(int rs) {
  ResSlot &S = res_[rs];
  if (S.filled) {
    te_linear_residuals_release(&S.r);
    live_res_.erase(S.id);
    S.filled = false;
  }
}

inline void Program::forward_compute() {
  const int rs = static_cast<int>(R.pick(kResSlots));  // first: seeds name it
  bool mf = false;
  int ls;
  te_linear *lh = lin_arg(mf, ls);
  LinCfg cfg;
  LinBufs *bufs = nullptr;
  int lctx = 0;
  if (ls >= 0 && lin_[ls].h) {
    cfg = lin_[ls].cfg;
    bufs = lin_[ls].bufs;
    lctx = lin_[ls].ctx;
  }
  int cs;
  te_context *ctx = ctx_arg(mf, cs, lctx);
  if (cs != lctx) mf = true;
  Tensor x, w, b, y;
  int64_t tokens;
  forward_tensors(ls, cfg, bufs, tokens, x, w, b, y, mf);
  te_linear_forward_args a;
  std::memset(&a, 0x44, sizeof a);
  FUZZ_ASSERT(TE_CALL(te_linear_forward_args_init, &a) == TE_SUCCESS, "te_linear_forward_args_init failed");
  FUZZ_ASSERT(!a.input && !a.weight && !a.bias && a.weight_unchanged == 0, "te_linear_forward_args_init defaults");
  a.input = tp(maybe_null(x, mf));
  a.weight = tp(maybe_null(w, mf));
  const uint8_t bb = R.u8();
  const bool flip_bias = bb >= 245;
  const bool give_bias = (cfg.bias == 1) != flip_bias;
  if (flip_bias) mf = true;
  a.bias = give_bias ? &b.t : nullptr;
  if (give_bias && b.malformed) mf = true;
  const uint8_t wu = R.u8();
  a.weight_unchanged = wu < 200 ? 0 : wu < 250 ? 1 : 2;
  mf |= a.weight_unchanged == 2;
  const uint8_t z = R.u8();
  if (z >= 252) { a.struct_size = sizeof a - 1; mf = true; }
  Tensor *py = maybe_null(y, mf);
  clear_res_slot(rs);
  ResSlot &S = res_[rs];
  std::memset(&S.r, 0x99, sizeof S.r);
  S.r.struct_size = sizeof S.r;
  const uint8_t q = R.u8();
  if (q >= 250) { S.r.struct_size = sizeof S.r - 8; mf = true; }
  const bool null_res = q >= 246 && q < 250;
  const bool null_args = q >= 244 && q < 246;
  mf |= null_res || null_args;
  const std::vector<uint8_t> rbefore = bytes_of(&S.r, sizeof S.r);
  y.snapshot();
  const bool check_state = ls >= 0 && lin_[ls].live && ctx_live(lctx);
  const std::vector<uint8_t> st_before = check_state ? layer_state(ctx_of(lctx), lh) : std::vector<uint8_t>();
  const int expect_fp8 = fp8_scope(cs);
  te_status s = TE_CALL(te_linear_forward_compute, ctx, lh, null_args ? nullptr : &a, py ? &py->t : nullptr,
                        null_res ? nullptr : &S.r);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_forward_compute accepted what it must reject");
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(same_bytes(&S.r, rbefore), "te_linear_forward_compute failed but wrote *residuals");
    y.check_untouched("te_linear_forward_compute", "y");
    if (check_state)
      FUZZ_ASSERT(layer_state(ctx_of(lctx), lh) == st_before, "te_linear_forward_compute failed but changed the layer's state");
    return;
  }
  check_residuals(S.r, cfg, tokens, expect_fp8);
  S.filled = true;
  S.id = next_res_id_++;
  live_res_.insert(S.id);
  S.ctx = cs;
  S.lin = lh;
  S.cfg = cfg;
  S.tokens = tokens;
}

inline Program::BwdSlot &Program::fresh_bwd_slot(int &bs) {
  bs = static_cast<int>(R.pick(kBwdSlots));
  BwdSlot &B = bwd_[bs];
  if (B.live) {
    te_linear_backward_ctx_destroy(B.h);
    B.live = false;
  }
  return B;
}

inline void Program::forward_save() {
  bool mf = false;
  const int rs = static_cast<int>(R.pick(kResSlots));
  ResSlot &S = res_[rs];
  te_linear_residuals empty;
  std::memset(&empty, 0, sizeof empty);
  empty.struct_size = sizeof empty;
  te_linear_residuals *pr = S.filled ? &S.r : &empty;
  if (!S.filled || !live_res_.count(S.id)) mf = true;  // empty, saved or released
  // The layer: the one that made the residuals, or another.
  te_linear *lh = S.lin;
  const uint8_t v = R.u8();
  if (v >= 230) {
    int ls;
    lh = lin_arg(mf, ls);
    if (lh != S.lin) mf = true;
  }
  if (!S.filled) mf = true;
  bool found_live = false;
  for (auto &L : lin_)
    if (L.live && L.h == lh) found_live = true;
  if (!found_live) mf = true;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, S.filled ? S.ctx : 0);
  if (!S.filled || cs != S.ctx) mf = true;
  int bs;
  BwdSlot &B = fresh_bwd_slot(bs);
  const bool null_out = R.u8() >= 250;
  mf |= null_out;
  te_linear_backward_ctx *h = sentinel<te_linear_backward_ctx>();
  const std::vector<uint8_t> rbefore = bytes_of(pr, sizeof *pr);
  te_status s = TE_CALL(te_linear_forward_save, ctx, lh, pr, null_out ? nullptr : &h);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_forward_save accepted what it must reject (stale or foreign residuals?)");
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(h == sentinel<te_linear_backward_ctx>(), "te_linear_forward_save failed but wrote *out");
    FUZZ_ASSERT(same_bytes(pr, rbefore), "te_linear_forward_save failed but changed *residuals");
    return;
  }
  FUZZ_ASSERT(S.r.internal == nullptr, "te_linear_forward_save left residuals->internal set");
  live_res_.erase(S.id);
  B.h = h;
  B.live = true;
  B.ctx = cs;
  B.lin = S.lin;
  B.cfg = S.cfg;
  B.bufs = nullptr;
  for (auto &L : lin_)
    if (L.h == S.lin) B.bufs = L.bufs;
  B.tokens = S.tokens;
  B.once_done = false;
}

inline void Program::forward() {
  int bs;
  BwdSlot &B = fresh_bwd_slot(bs);  // first: seeds name it
  bool mf = false;
  int ls;
  te_linear *lh = lin_arg(mf, ls);
  LinCfg cfg;
  LinBufs *bufs = nullptr;
  int lctx = 0;
  if (ls >= 0 && lin_[ls].h) {
    cfg = lin_[ls].cfg;
    bufs = lin_[ls].bufs;
    lctx = lin_[ls].ctx;
  }
  int cs;
  te_context *ctx = ctx_arg(mf, cs, lctx);
  if (cs != lctx) mf = true;
  Tensor x, w, b, y;
  int64_t tokens;
  forward_tensors(ls, cfg, bufs, tokens, x, w, b, y, mf);
  te_linear_forward_args a;
  te_linear_forward_args_init(&a);
  a.input = tp(maybe_null(x, mf));
  a.weight = tp(maybe_null(w, mf));
  a.bias = cfg.bias == 1 ? &b.t : nullptr;
  if (cfg.bias == 1 && b.malformed) mf = true;
  a.weight_unchanged = R.u8() >= 200 ? 1 : 0;
  Tensor *py = maybe_null(y, mf);
  const bool null_out = R.u8() >= 250;
  mf |= null_out;
  y.snapshot();
  const bool check_state = ls >= 0 && lin_[ls].live && ctx_live(lctx);
  const std::vector<uint8_t> st_before = check_state ? layer_state(ctx_of(lctx), lh) : std::vector<uint8_t>();
  te_linear_backward_ctx *h = sentinel<te_linear_backward_ctx>();
  te_status s = TE_CALL(te_linear_forward, ctx, lh, &a, py ? &py->t : nullptr, null_out ? nullptr : &h);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_linear_forward accepted what it must reject");
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(h == sentinel<te_linear_backward_ctx>(), "te_linear_forward failed but wrote *out");
    y.check_untouched("te_linear_forward", "y");
    if (check_state)
      FUZZ_ASSERT(layer_state(ctx_of(lctx), lh) == st_before, "te_linear_forward failed but changed the layer's state");
    return;
  }
  B.h = h;
  B.live = true;
  B.ctx = cs;
  B.lin = lh;
  B.cfg = cfg;
  B.bufs = bufs;
  B.tokens = tokens;
  B.once_done = false;
}

inline void Program::backward() {
  bool mf = false;
  const int bs = static_cast<int>(R.pick(kBwdSlots));
  BwdSlot &B = bwd_[bs];
  te_linear_backward_ctx *h = B.h;
  const uint8_t v = R.u8();
  if (v >= 245) h = static_cast<te_linear_backward_ctx *>(some_live_handle(4));
  if (!h || !B.live || h != B.h) mf = true;  // NULL, destroyed (stale) or another type
  if (B.once_done) mf = true;                // TE_BACKWARD_ONCE ran: INVALID_STATE
  int cs;
  te_context *ctx = ctx_arg(mf, cs, B.ctx < 0 ? 0 : B.ctx);
  if (cs != B.ctx) mf = true;
  const LinCfg &cfg = B.cfg;
  const bool small = cfg.small();
  const int64_t in = small ? cfg.in : 16, out = small ? cfg.out : 16;
  int64_t tokens = B.tokens;
  if (R.u8() >= 245) {
    tokens = tokens == 16 ? 32 : 16;
    mf = true;
  }
  const int dt = cfg.dtype >= TE_DTYPE_F32 && cfg.dtype <= TE_DTYPE_BF16 ? cfg.dtype : TE_DTYPE_BF16;
  Tensor dy, dx, dw, db;
  bool odd = false;
  make(dy, dt, shape2(tokens, out));
  make(dx, pick_dtype(dt, odd), shape2(tokens, in));
  make(dw, cfg.fuse == 1 ? TE_DTYPE_F32 : dt, shape2(out, in));
  make(db, dt, shape1(out));
  maybe_malform(dy);
  maybe_malform(dx);
  maybe_malform(dw);
  maybe_malform(db);
  const te_tensor *pdy = &dy.t;
  if (dy.malformed) mf = true;
  if (R.u8() >= 252) { pdy = nullptr; mf = true; }
  te_tensor *pdx = R.u8() >= 220 ? nullptr : &dx.t;
  te_tensor *pdw = R.u8() >= 220 ? nullptr : &dw.t;
  te_tensor *pdb = (cfg.bias == 1 && R.u8() < 220) ? &db.t : nullptr;
  if (cfg.bias != 1 && R.u8() >= 245) { pdb = &db.t; mf = true; }
  if ((pdx && dx.malformed) || (pdw && dw.malformed) || (pdb && db.malformed)) mf = true;
  if (pdx && get_enum(dx.t.dtype) != dt) mf = true;  // dx in another dtype than the layer's
  te_linear_backward_args a;
  std::memset(&a, 0x55, sizeof a);
  FUZZ_ASSERT(TE_CALL(te_linear_backward_args_init, &a) == TE_SUCCESS && a.flags == 0, "te_linear_backward_args_init");
  const uint32_t fl = R.pick(8);
  const te_linear_backward_args *pa = &a;
  bool once = false;
  switch (fl) {
    case 1: case 2: a.flags = TE_BACKWARD_ONCE; once = true; break;
    case 3: pa = nullptr; break;
    case 4: a.flags = 2; mf = true; break;
    case 5: a.flags = 0x80000001u; mf = true; break;
    case 6: a.struct_size = 0; mf = true; break;
    default: break;
  }
  dx.snapshot();
  dw.snapshot();
  db.snapshot();
  te_linear *lin = nullptr;
  for (auto &L : lin_)
    if (L.live && L.h == B.lin && L.ctx == B.ctx) lin = L.h;
  const bool check_state = lin && ctx_live(B.ctx);
  const std::vector<uint8_t> st_before = check_state ? layer_state(ctx_of(B.ctx), lin) : std::vector<uint8_t>();
  te_status s = TE_CALL(te_linear_backward, ctx, h, pdy, pdx, pdw, pdb, pa);
  if (mf)
    FUZZ_ASSERT(s != TE_SUCCESS,
                "te_linear_backward accepted what it must reject: stale %d, once_done %d, handle %s, ctx slot %d "
                "(made on %d), dy [%lld, %lld] (forward had %lld tokens), dx dtype %d (layer %d), dy/dx/dw/db "
                "malformed %d%d%d%d given %d%d%d%d, layer bias %d, flags 0x%x, args %s",
                !B.live, B.once_done, h == B.h ? "the slot's" : "another", cs, B.ctx, (long long)dy.t.shape[0],
                (long long)dy.t.shape[1], (long long)B.tokens, get_enum(dx.t.dtype), dt, dy.malformed,
                dx.malformed, dw.malformed, db.malformed, pdy != nullptr, pdx != nullptr, pdw != nullptr,
                pdb != nullptr, cfg.bias, a.flags, pa ? (a.struct_size == sizeof a ? "given" : "small") : "NULL");
  if (s != TE_SUCCESS) {
    dx.check_untouched("te_linear_backward", "dx");
    dw.check_untouched("te_linear_backward", "dw");
    db.check_untouched("te_linear_backward", "db");
    if (check_state)
      FUZZ_ASSERT(layer_state(ctx_of(B.ctx), lin) == st_before, "te_linear_backward failed but changed the layer's state");
    return;
  }
  if (once) B.once_done = true;
}

inline void Program::backward_destroy() {
  BwdSlot &B = bwd_[R.pick(kBwdSlots)];
  if (B.live) {
    te_linear_backward_ctx_destroy(B.h);
    B.live = false;  // the handle stays in the slot: later uses are stale
  } else if (B.h) {
    te_linear_backward_ctx_destroy(B.h);  // destroyed before: a no-op
  }
}

inline void Program::residuals_release() {
  const uint8_t v = R.u8();
  if (v >= 250) {
    te_linear_residuals_release(nullptr);
    return;
  }
  ResSlot &S = res_[v % kResSlots];
  if (!S.filled) return;
  te_linear_residuals_release(&S.r);  // the owner, or a by-value copy of it
  live_res_.erase(S.id);
}

inline void Program::residuals_copy() {
  const int src = static_cast<int>(R.pick(kResSlots)), dst = static_cast<int>(R.pick(kResSlots));
  if (src == dst || !res_[src].filled) return;
  clear_res_slot(dst);
  res_[dst] = res_[src];  // a by-value copy of the struct: both name the same residuals
}

}  // namespace fuzz
