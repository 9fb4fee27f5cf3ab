// fuzz_api_sequence's operations on te_grouped_linear (api_program.h): create and destroy, the
// split forward (compute, then save, release, or a stale copy) and the fused one over fuzzed
// m_splits (empty experts, counts off multiples of 16, negative or not summing), per-expert
// weight and bias arrays (NULL arrays or elements, misshapen elements), backward with dW / db
// arrays (main_grad accumulation, TE_BACKWARD_ONCE, stale handles), state save / load (round
// trips, corrupted bytes) and scaling-state reads.
//
// Besides the common checks (a call the header rejects fails; a failed call leaves its outputs,
// the residuals struct and the layer's state untouched), successful calls are checked against
// the header: residuals.fp8 is the scope's mode, a repeated forward in the same scope writes the
// same y, a repeated backward (retain-graph) writes the same gradients, an expert that got no
// tokens gets dW = 0 and db = 0 (nothing added into a main_grad), and a loaded state saves back
// to the same bytes.
#pragma once

#include "api_program.h"

namespace fuzz {

// A grouped layer argument: the slot's handle (live or stale), sometimes NULL or another type.
inline te_grouped_linear *Program::moe_arg(bool &mf, int &slot) {
  const uint8_t v = R.u8();
  slot = -1;
  if (v < 245) {
    slot = v % kMoeSlots;
    if (!moe_[slot].live) mf = true;
    return moe_[slot].h;
  }
  mf = true;
  if (v < 249) return nullptr;
  if (!dead_moe_.empty() && v < 252) return dead_moe_[R.pick(static_cast<uint32_t>(dead_moe_.size()))];
  return static_cast<te_grouped_linear *>(some_live_handle(5));
}

// The layer's saved state, or empty when it cannot be read.
inline std::vector<uint8_t> Program::moe_state(te_context *ctx, te_grouped_linear *g) {
  size_t n = 0;
  if (te_grouped_linear_state_save(ctx, g, nullptr, 0, &n) != TE_SUCCESS || n == 0 || n > (1u << 22)) return {};
  std::vector<uint8_t> buf(n);
  size_t n2 = 0;
  if (te_grouped_linear_state_save(ctx, g, buf.data(), n, &n2) != TE_SUCCESS)
    violation("te_grouped_linear_state_save failed after a size query");
  FUZZ_ASSERT(n2 == n, "te_grouped_linear_state_save: size %zu after a query of %zu", n2, n);
  return buf;
}

inline void Program::moe_create() {
  const int slot = static_cast<int>(R.pick(kMoeSlots));
  MoeSlot &M = moe_[slot];
  if (M.live) {
    te_grouped_linear_destroy(M.h);  // backward contexts keep what they need
    dead_moe_.push_back(M.h);
    M.live = false;
  }
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  te_grouped_linear_options o;
  std::memset(&o, 0x6B, sizeof o);
  FUZZ_ASSERT(TE_CALL(te_grouped_linear_options_init, &o) == TE_SUCCESS, "te_grouped_linear_options_init failed");
  FUZZ_ASSERT(o.struct_size == sizeof o && o.num_gemms == 0 && o.in_features == 0 && o.out_features == 0 &&
                  o.bias == 1 && get_enum(o.activation_dtype) == TE_DTYPE_BF16 && o.fuse_wgrad_accumulation == 0,
              "te_grouped_linear_options_init defaults");
  static const int32_t kN[8] = {2, 3, 1, 4, 2, 0, TE_GROUPED_LINEAR_MAX_GEMMS + 1, -1};
  const uint8_t nv = R.u8();
  o.num_gemms = kN[nv < 240 ? nv % 5 : 5 + nv % 3];
  mf |= o.num_gemms < 1 || o.num_gemms > TE_GROUPED_LINEAR_MAX_GEMMS;
  o.in_features = pick_features(mf);
  o.out_features = pick_features(mf);
  const uint8_t b = R.u8();
  o.bias = b < 170 ? 1 : b < 250 ? 0 : 2;
  mf |= o.bias == 2;
  static const int kDt[5] = {TE_DTYPE_BF16, TE_DTYPE_F32, TE_DTYPE_F16, TE_DTYPE_E5M2, 7};
  const uint8_t d = R.u8();
  const int dt = kDt[d < 150 ? 0 : d < 200 ? 1 : d < 245 ? 2 : 3 + d % 2];
  set_enum(o.activation_dtype, dt);
  mf |= dt > TE_DTYPE_BF16;
  const uint8_t f = R.u8();
  o.fuse_wgrad_accumulation = f < 200 ? 0 : f < 250 ? 1 : 2;
  mf |= o.fuse_wgrad_accumulation == 2;
  const uint8_t x = R.u8();
  if (x >= 252) {
    o.struct_size = sizeof o - 4;
    mf = true;
  }
  const bool null_opts = x >= 248 && x < 250, null_out = x >= 250 && x < 252;
  mf |= null_opts || null_out;
  te_grouped_linear *h = sentinel<te_grouped_linear>();
  te_status s = TE_CALL(te_grouped_linear_create, null_out ? nullptr : &h, ctx, null_opts ? nullptr : &o);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_grouped_linear_create accepted invalid arguments");
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(h == sentinel<te_grouped_linear>(), "te_grouped_linear_create failed but wrote *out");
    return;
  }
  M.h = h;
  M.live = true;
  M.ctx = cs;
  M.cfg.n = o.num_gemms;
  M.cfg.in = o.in_features;
  M.cfg.out = o.out_features;
  M.cfg.bias = o.bias;
  M.cfg.dtype = dt;
  M.cfg.fuse = o.fuse_wgrad_accumulation;
  M.bufs = nullptr;
  if (M.cfg.small()) {
    all_moe_bufs_.push_back(std::make_unique<MoeBufs>());
    MoeBufs &B = *all_moe_bufs_.back();
    const size_t e = dtype_bytes(dt), n = static_cast<size_t>(M.cfg.n);
    const size_t in = static_cast<size_t>(M.cfg.in), out = static_cast<size_t>(M.cfg.out);
    B.x = Blob(kMaxTokens * in * e);
    B.w = Blob(n * out * in * e);
    B.b = Blob(n * out * e);
    B.main_grad = Blob(n * out * in * 4);
    Rng rng(R.u8() + 53u * serial_);
    for (size_t i = 0; i < kMaxTokens * in; ++i) store_hp(B.x.data(), dt, static_cast<int64_t>(i), rng.uniform(-2, 2));
    for (size_t i = 0; i < n * out * in; ++i) store_hp(B.w.data(), dt, static_cast<int64_t>(i), rng.uniform(-0.5f, 0.5f));
    for (size_t i = 0; i < n * out; ++i) store_hp(B.b.data(), dt, static_cast<int64_t>(i), rng.uniform(-0.5f, 0.5f));
    for (size_t i = 0; i < n * out * in; ++i) store_hp(B.main_grad.data(), TE_DTYPE_F32, static_cast<int64_t>(i), rng.uniform(-1, 1));
    M.bufs = &B;
  }
}

inline void Program::moe_destroy() {
  const uint8_t v = R.u8();
  if (v >= 250) {
    // Another type's handle, or a NULL: a no-op (a destroyed linear would fail later calls).
    te_grouped_linear_destroy(static_cast<te_grouped_linear *>(v >= 253 ? nullptr : some_live_handle(5)));
    return;
  }
  MoeSlot &M = moe_[v % kMoeSlots];
  if (M.live) {
    te_grouped_linear_destroy(M.h);
    dead_moe_.push_back(M.h);
    M.live = false;
  } else if (M.h) {
    te_grouped_linear_destroy(M.h);  // destroyed before: a no-op
  }
}

// Counts for n experts summing to 1..kMaxTokens rows: empty experts, counts on and off multiples
// of 16; sometimes a negative count or a sum that is not x's rows (then the call must fail).
inline std::vector<int64_t> Program::moe_splits(int n, int64_t &tokens, bool &mf) {
  static const int64_t kM[8] = {0, 16, 5, 1, 17, 32, 7, 3};
  std::vector<int64_t> s(static_cast<size_t>(n));
  tokens = 0;
  for (auto &m : s) {
    m = std::min<int64_t>(kM[R.pick(8)], kMaxTokens - tokens);
    tokens += m;
  }
  if (tokens == 0) {
    s[0] = 1;
    tokens = 1;
  }
  const uint8_t v = R.u8();
  if (v >= 248) {
    s[R.pick(static_cast<uint32_t>(n))] = v >= 252 ? INT64_MIN : -1;
    mf = true;
  } else if (v >= 242) {
    s[R.pick(static_cast<uint32_t>(n))] += v % 2 ? 1 : INT64_MAX / 2;
    mf = true;
  }
  return s;
}

// The per-expert parameter arrays of slot bufs: weights [out, in] and biases [out] views, with
// sometimes a NULL or misshapen element (mf).
inline void Program::moe_params(const MoeCfg &cfg, MoeBufs *bufs, std::vector<te_tensor> &w, std::vector<te_tensor> &b,
                                std::vector<const te_tensor *> &wp, std::vector<const te_tensor *> &bp, bool &mf) {
  const int n = cfg.n;
  const size_t e = dtype_bytes(cfg.dtype);
  w.assign(static_cast<size_t>(n), te_tensor{});
  b.assign(static_cast<size_t>(n), te_tensor{});
  for (int i = 0; i < n; ++i) {
    te_tensor &t = w[static_cast<size_t>(i)], &u = b[static_cast<size_t>(i)];
    set_enum(t.dtype, cfg.dtype);
    t.ndim = 2;
    t.shape[0] = cfg.out;
    t.shape[1] = cfg.in;
    t.data = bufs->w.data() + static_cast<size_t>(i * cfg.out * cfg.in) * e;
    set_enum(u.dtype, cfg.dtype);
    u.ndim = 1;
    u.shape[0] = cfg.out;
    u.data = bufs->b.data() + static_cast<size_t>(i * cfg.out) * e;
    wp.push_back(&t);
    bp.push_back(&u);
  }
  const uint8_t v = R.u8();
  const size_t k = R.pick(static_cast<uint32_t>(n));
  if (v >= 250) {
    wp[k] = nullptr;
    mf = true;
  } else if (v >= 245 && cfg.in != cfg.out) {
    std::swap(w[k].shape[0], w[k].shape[1]);
    mf = true;
  } else if (v >= 241) {
    w[k].ndim = 1;
    w[k].shape[0] = cfg.out * cfg.in;
    mf = true;
  } else if (v >= 237 && cfg.bias == 1) {
    bp[k] = nullptr;
    mf = true;
  } else if (v >= 233 && cfg.bias == 1) {
    b[k].ndim = 2;
    b[k].shape[0] = 1;
    b[k].shape[1] = cfg.out;
    mf = true;
  }
}

inline Program::MoeBwdSlot &Program::fresh_moe_bwd_slot(int &bs) {
  bs = static_cast<int>(R.pick(kMoeBwdSlots));
  MoeBwdSlot &B = moe_bwd_[bs];
  if (B.live) {
    te_grouped_linear_backward_ctx_destroy(B.h);
    B.live = false;
  }
  return B;
}

inline void Program::moe_forward() {
  int bs;
  MoeBwdSlot &B = fresh_moe_bwd_slot(bs);  // first: seeds name it
  bool mf = false;
  int ms;
  te_grouped_linear *gh = moe_arg(mf, ms);
  MoeCfg cfg;
  MoeBufs *bufs = nullptr;
  int gctx = 0;
  if (ms >= 0 && moe_[ms].h) {
    cfg = moe_[ms].cfg;
    bufs = moe_[ms].bufs;
    gctx = moe_[ms].ctx;
  }
  int cs;
  te_context *ctx = ctx_arg(mf, cs, gctx);
  if (cs != gctx) mf = true;
  if (!bufs) {  // no parameters that could match the layer: a small stand-in, and the call must fail
    mf = true;
    const int n = cfg.n;  // the arrays still hold num_gemms pointers (te.h's rule for the caller)
    cfg = MoeCfg();
    if (n >= 1 && n <= 4) cfg.n = n;
    if (!stand_in_) stand_in_.reset(new MoeBufs{Blob(kMaxTokens * 16 * 2), Blob(4 * 256 * 2), Blob(4 * 16 * 2), Blob(4 * 256 * 4)});
    bufs = stand_in_.get();
  }
  const int dt = cfg.dtype;
  int64_t tokens;
  const std::vector<int64_t> splits = moe_splits(cfg.n, tokens, mf);
  Tensor x, y;
  bool odd = false;
  const bool three_d = tokens % 2 == 0 && R.u8() >= 230;
  Shape xs = shape2(tokens, cfg.in), ys = shape2(tokens, cfg.out);
  if (three_d) {
    xs.ndim = ys.ndim = 3;
    xs.d[0] = ys.d[0] = 2;
    xs.d[1] = ys.d[1] = tokens / 2;
    xs.d[2] = cfg.in;
    ys.d[2] = cfg.out;
  }
  make(x, dt, xs);
  x.t.data = bufs->x.data();  // the layer's x: a high-precision forward references it
  make(y, pick_dtype(dt, odd), ys);
  if (get_enum(y.t.dtype) != dt) mf = true;
  maybe_malform(x);
  maybe_malform(y);
  std::vector<te_tensor> w, b;
  std::vector<const te_tensor *> wp, bp;
  moe_params(cfg, bufs, w, b, wp, bp, mf);
  te_grouped_linear_forward_args a;
  std::memset(&a, 0x44, sizeof a);
  FUZZ_ASSERT(TE_CALL(te_grouped_linear_forward_args_init, &a) == TE_SUCCESS, "te_grouped_linear_forward_args_init");
  FUZZ_ASSERT(!a.input && !a.m_splits && !a.weights && !a.biases && a.weight_unchanged == 0,
              "te_grouped_linear_forward_args_init defaults");
  a.input = tp(maybe_null(x, mf));
  a.m_splits = splits.data();
  a.weights = wp.data();
  a.biases = cfg.bias == 1 ? bp.data() : nullptr;
  const uint8_t p = R.u8();
  if (p >= 252) {
    a.m_splits = nullptr;
    mf = true;
  } else if (p >= 249) {
    a.weights = nullptr;
    mf = true;
  } else if (p >= 246) {
    a.biases = a.biases ? nullptr : bp.data();  // the presence the layer was not created with
    mf = true;
  }
  const uint8_t wu = R.u8();
  a.weight_unchanged = wu < 200 ? 0 : wu < 250 ? 1 : 2;
  mf |= a.weight_unchanged == 2;
  if (R.u8() >= 252) {
    a.struct_size = sizeof a - 1;
    mf = true;
  }
  const int expect_fp8 = fp8_scope(cs);
  if (expect_fp8 == 1 && (cfg.in % 16 || cfg.out % 16)) mf = true;  // UNSUPPORTED
  Tensor *py = maybe_null(y, mf);
  const bool fused = R.u8() >= 128;
  te_grouped_linear_residuals r;
  std::memset(&r, 0x99, sizeof r);
  r.struct_size = sizeof r;
  const uint8_t q = R.u8();
  if (!fused && q >= 250) {
    r.struct_size = sizeof r - 8;
    mf = true;
  }
  const bool null_res = !fused && q >= 246 && q < 250, null_out = fused && q >= 250;
  mf |= null_res || null_out;
  const std::vector<uint8_t> rbefore = bytes_of(&r, sizeof r);
  y.snapshot();
  const bool check_state = ms >= 0 && moe_[ms].live && ctx_live(gctx);
  const std::vector<uint8_t> st_before = check_state ? moe_state(ctx_of(gctx), gh) : std::vector<uint8_t>();
  te_grouped_linear_backward_ctx *h = sentinel<te_grouped_linear_backward_ctx>();
  auto run = [&](te_tensor *yt, te_grouped_linear_residuals *res, te_grouped_linear_backward_ctx **out) {
    return fused ? TE_CALL(te_grouped_linear_forward, ctx, gh, &a, yt, out)
                 : TE_CALL(te_grouped_linear_forward_compute, ctx, gh, &a, yt, res);
  };
  const te_status s = run(py ? &py->t : nullptr, null_res ? nullptr : &r, null_out ? nullptr : &h);
  const char *fn = fused ? "te_grouped_linear_forward" : "te_grouped_linear_forward_compute";
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "%s accepted what it must reject", fn);
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(same_bytes(&r, rbefore), "%s failed but wrote *residuals", fn);
    FUZZ_ASSERT(h == sentinel<te_grouped_linear_backward_ctx>(), "%s failed but wrote *out", fn);
    y.check_untouched(fn, "y");
    if (check_state) FUZZ_ASSERT(moe_state(ctx_of(gctx), gh) == st_before, "%s failed but changed the layer's state", fn);
    return;
  }
  if (!fused) {
    FUZZ_ASSERT(r.fp8 == 0 || r.fp8 == 1, "forward_compute: residuals.fp8 = %d", r.fp8);
    if (expect_fp8 >= 0) FUZZ_ASSERT(r.fp8 == expect_fp8, "forward_compute: residuals.fp8 = %d, expected %d", r.fp8, expect_fp8);
    FUZZ_ASSERT(r.internal != nullptr, "forward_compute succeeded without filling residuals->internal");
  }
  // The same call again in the same scope computes the same y (the scales move only when the
  // pass ends; padding is zeros, never leftovers).
  if (R.u8() >= 200) {
    const std::vector<uint8_t> y1 = y.data.snapshot();
    te_grouped_linear_residuals r2;
    std::memset(&r2, 0, sizeof r2);
    r2.struct_size = sizeof r2;
    te_grouped_linear_backward_ctx *h2 = nullptr;
    FUZZ_ASSERT(run(&y.t, &r2, &h2) == TE_SUCCESS, "%s failed when repeated", fn);
    FUZZ_ASSERT(y.data.equals(y1), "%s repeated in the same scope wrote another y", fn);
    if (fused) te_grouped_linear_backward_ctx_destroy(h2);
    else te_grouped_linear_residuals_release(&r2);
  }
  if (!fused) {
    // Save (maybe through a copy, whose twin is then stale), or release.
    te_grouped_linear_residuals copy = r;
    const uint32_t what = R.pick(4);
    if (what == 3) {
      te_grouped_linear_residuals_release(&copy);
      FUZZ_ASSERT(copy.internal == nullptr, "te_grouped_linear_residuals_release left internal set");
      te_grouped_linear_residuals_release(&copy);  // idempotent
      te_grouped_linear_residuals_release(&r);     // a stale copy: a no-op
      te_grouped_linear_backward_ctx *z = sentinel<te_grouped_linear_backward_ctx>();
      FUZZ_ASSERT(TE_CALL(te_grouped_linear_forward_save, ctx, gh, &r, &z) != TE_SUCCESS && z == sentinel<te_grouped_linear_backward_ctx>(),
                  "te_grouped_linear_forward_save accepted released residuals");
      return;
    }
    te_grouped_linear_residuals &use = what == 2 ? copy : r;
    FUZZ_ASSERT(TE_CALL(te_grouped_linear_forward_save, ctx, gh, &use, &h) == TE_SUCCESS,
                "te_grouped_linear_forward_save failed on fresh residuals");
    FUZZ_ASSERT(use.internal == nullptr, "te_grouped_linear_forward_save left residuals->internal set");
    te_grouped_linear_residuals &other = what == 2 ? r : copy;
    te_grouped_linear_backward_ctx *z = sentinel<te_grouped_linear_backward_ctx>();
    FUZZ_ASSERT(TE_CALL(te_grouped_linear_forward_save, ctx, gh, &other, &z) != TE_SUCCESS &&
                    z == sentinel<te_grouped_linear_backward_ctx>(),
                "te_grouped_linear_forward_save saved a copy of saved residuals");
    te_grouped_linear_residuals_release(&other);  // a no-op
  }
  B.h = h;
  B.live = true;
  B.ctx = cs;
  B.cfg = cfg;
  B.bufs = bufs;
  B.splits = splits;
  B.once_done = false;
}

inline void Program::moe_backward() {
  bool mf = false;
  MoeBwdSlot &B = moe_bwd_[R.pick(kMoeBwdSlots)];
  te_grouped_linear_backward_ctx *h = B.h;
  if (R.u8() >= 245) h = static_cast<te_grouped_linear_backward_ctx *>(some_live_handle(6));
  if (!h || !B.live || h != B.h) mf = true;  // NULL, destroyed (stale) or another type
  if (B.once_done) mf = true;                // TE_BACKWARD_ONCE ran: INVALID_STATE
  int cs;
  te_context *ctx = ctx_arg(mf, cs, B.ctx);
  if (cs != B.ctx) mf = true;
  const MoeCfg cfg = B.h && B.bufs ? B.cfg : MoeCfg();
  const int n = cfg.n, dt = cfg.dtype;
  const bool fuse = cfg.fuse == 1 && B.bufs;
  int64_t tokens = 0;
  for (int64_t m : B.splits) tokens += m;
  if (tokens <= 0 || tokens > kMaxTokens) tokens = 16;
  const int64_t fwd_tokens = tokens;
  if (R.u8() >= 248) {
    tokens += 1;
    mf = true;
  }
  Tensor dy, dx;
  bool odd = false;
  make(dy, dt, shape2(tokens, cfg.out));
  make(dx, pick_dtype(dt, odd), shape2(tokens, cfg.in));
  maybe_malform(dy);
  maybe_malform(dx);
  const te_tensor *pdy = &dy.t;
  if (dy.malformed) mf = true;
  if (R.u8() >= 252) {
    pdy = nullptr;
    mf = true;
  }
  te_tensor *pdx = R.u8() >= 200 ? nullptr : &dx.t;
  if (pdx && (dx.malformed || get_enum(dx.t.dtype) != dt)) mf = true;
  // dW: fresh tensors, or views of the layer's main_grads when it accumulates; db: fresh.
  std::vector<Tensor> dw(static_cast<size_t>(n)), db(static_cast<size_t>(n));
  std::vector<te_tensor *> dwp, dbp;
  for (int i = 0; i < n; ++i) {
    make(dw[i], fuse ? TE_DTYPE_F32 : dt, shape2(cfg.out, cfg.in));
    if (fuse) dw[i].t.data = B.bufs->main_grad.data() + static_cast<size_t>(i * cfg.out * cfg.in) * 4;
    make(db[i], dt, shape1(cfg.out));
    dwp.push_back(&dw[i].t);
    dbp.push_back(&db[i].t);
  }
  te_tensor *const *pdw = R.u8() >= 200 ? nullptr : dwp.data();
  te_tensor *const *pdb = cfg.bias == 1 && R.u8() < 200 ? dbp.data() : nullptr;
  if (cfg.bias != 1 && R.u8() >= 245) {
    pdb = dbp.data();
    mf = true;
  }
  // A bad element of an array that is given (one that is not given is not read).
  const uint8_t e = R.u8();
  const size_t k = R.pick(static_cast<uint32_t>(n));
  if (e >= 250) {
    dwp[k] = nullptr;
    if (pdw) mf = true;
  } else if (e >= 245) {
    set_enum(dw[k].t.dtype, fuse || dt == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32);
    if (pdw) mf = true;
  } else if (e >= 240) {
    db[k].t.shape[0] = cfg.out + 1;
    if (pdb) mf = true;
  }
  te_linear_backward_args a;
  std::memset(&a, 0x55, sizeof a);
  FUZZ_ASSERT(TE_CALL(te_linear_backward_args_init, &a) == TE_SUCCESS && a.flags == 0, "te_linear_backward_args_init");
  const te_linear_backward_args *pa = &a;
  bool once = false;
  switch (R.pick(8)) {
    case 1: case 2: a.flags = TE_BACKWARD_ONCE; once = true; break;
    case 3: pa = nullptr; break;
    case 4: a.flags = 4; mf = true; break;
    case 5: a.struct_size = 0; mf = true; break;
    default: break;
  }
  // Every output's bytes before the call (dW through its pointer: a main_grad view included).
  auto dw_bytes = [&](int i) {
    const uint8_t *p = static_cast<const uint8_t *>(dw[i].t.data);
    return std::vector<uint8_t>(p, p + static_cast<size_t>(cfg.out * cfg.in) * (fuse ? 4 : dtype_bytes(dt)));
  };
  dx.snapshot();
  std::vector<std::vector<uint8_t>> dw0;
  for (int i = 0; i < n; ++i) dw0.push_back(dw_bytes(i));
  for (auto &t : db) t.snapshot();
  te_grouped_linear *layer = nullptr;
  for (auto &M : moe_)
    if (M.live && M.ctx == B.ctx && B.bufs && M.bufs == B.bufs) layer = M.h;
  const bool check_state = layer && ctx_live(B.ctx);
  const std::vector<uint8_t> st_before = check_state ? moe_state(ctx_of(B.ctx), layer) : std::vector<uint8_t>();
  const te_status s = TE_CALL(te_grouped_linear_backward, ctx, h, pdy, pdx, pdw, pdb, pa);
  if (mf)
    FUZZ_ASSERT(s != TE_SUCCESS,
                "te_grouped_linear_backward accepted what it must reject: stale %d, once_done %d, handle %s, ctx slot %d "
                "(made on %d), dy rows %lld (forward had %lld), flags 0x%x",
                !B.live, B.once_done, h == B.h ? "the slot's" : "another", cs, B.ctx, (long long)dy.t.shape[0],
                (long long)fwd_tokens, a.flags);
  if (s != TE_SUCCESS) {
    dx.check_untouched("te_grouped_linear_backward", "dx");
    for (int i = 0; i < n; ++i) FUZZ_ASSERT(dw_bytes(i) == dw0[i], "te_grouped_linear_backward failed but wrote dw[%d]", i);
    for (auto &t : db) t.check_untouched("te_grouped_linear_backward", "db[i]");
    if (check_state)
      FUZZ_ASSERT(moe_state(ctx_of(B.ctx), layer) == st_before, "te_grouped_linear_backward failed but changed the layer's state");
    return;
  }
  // An expert without tokens: dW = 0 (nothing added into a main_grad) and db = 0.
  for (int i = 0; i < n && static_cast<size_t>(i) < B.splits.size(); ++i) {
    if (B.splits[static_cast<size_t>(i)] != 0) continue;
    if (pdw && fuse) FUZZ_ASSERT(dw_bytes(i) == dw0[i], "an empty expert's main_grad changed");
    if (pdw && !fuse)
      for (uint8_t c : dw_bytes(i)) FUZZ_ASSERT(c == 0, "an empty expert's dW[%d] is not 0", i);
    if (pdb)
      for (size_t j = 0; j < db[i].data.size(); ++j) FUZZ_ASSERT(db[i].data.data()[j] == 0, "an empty expert's db[%d] is not 0", i);
  }
  if (once) {
    B.once_done = true;
    return;
  }
  // Retain-graph: the same backward again writes the same dx, dW (unless accumulating) and db.
  if (R.u8() >= 160) {
    const std::vector<uint8_t> dx1 = dx.data.snapshot();
    std::vector<std::vector<uint8_t>> dw1, db1;
    for (int i = 0; i < n; ++i) dw1.push_back(dw_bytes(i));
    for (auto &t : db) db1.push_back(t.data.snapshot());
    FUZZ_ASSERT(TE_CALL(te_grouped_linear_backward, ctx, h, pdy, pdx, fuse ? nullptr : pdw, pdb, pa) == TE_SUCCESS,
                "te_grouped_linear_backward failed when repeated");
    FUZZ_ASSERT(dx.data.equals(dx1), "a repeated te_grouped_linear_backward wrote another dx");
    for (int i = 0; i < n; ++i) {
      FUZZ_ASSERT(dw_bytes(i) == dw1[i], "a repeated te_grouped_linear_backward wrote another dW[%d]", i);
      FUZZ_ASSERT(db[i].data.equals(db1[i]), "a repeated te_grouped_linear_backward wrote another db[%d]", i);
    }
  }
}

inline void Program::moe_backward_destroy() {
  MoeBwdSlot &B = moe_bwd_[R.pick(kMoeBwdSlots)];
  if (B.live) {
    te_grouped_linear_backward_ctx_destroy(B.h);
    B.live = false;  // the handle stays in the slot: later uses are stale
  } else {
    te_grouped_linear_backward_ctx_destroy(B.h);  // destroyed before, or NULL: a no-op
  }
}

// State: save and load back (a round trip), corrupted buffers, scaling-state reads.
inline void Program::moe_state_op() {
  bool mf = false;
  int ms;
  te_grouped_linear *gh = moe_arg(mf, ms);
  const int gctx = ms >= 0 && moe_[ms].h ? moe_[ms].ctx : 0;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, gctx);
  if (cs != gctx) mf = true;
  const bool live = !mf;
  const std::vector<uint8_t> before = live ? moe_state(ctx, gh) : std::vector<uint8_t>();
  switch (R.pick(3)) {
    case 0: {  // save (maybe short), load it back, save again
      size_t n = 7;
      const bool null_size = R.u8() >= 250;
      te_status s = TE_CALL(te_grouped_linear_state_save, ctx, gh, nullptr, 0, null_size ? nullptr : &n);
      if (mf || null_size) {
        FUZZ_ASSERT(s != TE_SUCCESS && n == 7, "te_grouped_linear_state_save accepted bad arguments or wrote *size");
        return;
      }
      FUZZ_ASSERT(s == TE_SUCCESS && n == before.size(), "te_grouped_linear_state_save size query");
      std::vector<uint8_t> buf(n, 0xA5);
      const size_t cap = R.u8() >= 230 ? n - 1 : n;
      size_t got = 0;
      s = TE_CALL(te_grouped_linear_state_save, ctx, gh, buf.data(), cap, &got);
      if (cap < n) {
        FUZZ_ASSERT(s != TE_SUCCESS, "te_grouped_linear_state_save wrote into a short buffer");
        FUZZ_ASSERT(std::all_of(buf.begin(), buf.end(), [](uint8_t c) { return c == 0xA5; }),
                    "te_grouped_linear_state_save failed but wrote into buf");
        return;
      }
      FUZZ_ASSERT(s == TE_SUCCESS && got == n && buf == before, "te_grouped_linear_state_save: another state than the query's");
      load_moe_and_check(ctx, gh, buf, before);
      break;
    }
    case 1: {  // a corrupted buffer (or one of another module)
      if (!live) return;
      std::vector<uint8_t> buf = before;
      const uint32_t how = R.pick(4);
      if (how == 0 && !buf.empty()) buf.pop_back();
      else if (how == 1) buf.push_back(R.u8());
      else if (how == 2 && !buf.empty()) buf[R.pick(static_cast<uint32_t>(buf.size()))] ^= static_cast<uint8_t>(1u << R.pick(8));
      else buf = std::vector<uint8_t>(buf.size(), R.u8());
      load_moe_and_check(ctx, gh, buf, before);
      break;
    }
    default: {  // one scaling state
      const int n = ms >= 0 && moe_[ms].h ? moe_[ms].cfg.n : 1;
      int32_t expert = static_cast<int32_t>(R.pick(static_cast<uint32_t>(n)));
      const uint8_t v = R.u8();
      if (v >= 250) {
        expert = v % 2 ? -1 : n;
        mf = true;
      }
      int role = static_cast<int>(R.pick(3));
      if (R.u8() >= 250) {
        role = R.u8() % 2 ? 3 : -1;
        mf = true;
      }
      te_tensor_role r;
      set_enum(r, role);
      te_scaling_state_info info;
      std::memset(&info, 0x77, sizeof info);
      info.struct_size = sizeof info;
      if (R.u8() >= 252) {
        info.struct_size = 4;
        mf = true;
      }
      const std::vector<uint8_t> ibefore = bytes_of(&info, sizeof info);
      float hist[8];
      for (float &f : hist) f = -7.0f;
      const bool with_history = R.u8() >= 100;
      const te_status s = TE_CALL(te_grouped_linear_get_scaling_state, ctx, gh, expert, r, &info,
                                  with_history ? hist : nullptr, with_history ? 8 : 0);
      if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_grouped_linear_get_scaling_state accepted bad arguments");
      if (s != TE_SUCCESS) {
        FUZZ_ASSERT(same_bytes(&info, ibefore), "te_grouped_linear_get_scaling_state failed but wrote *info");
        for (float f : hist) FUZZ_ASSERT(f == -7.0f, "te_grouped_linear_get_scaling_state failed but wrote history");
        return;
      }
      FUZZ_ASSERT(info.amax_history_len >= 0 && info.amax_history_len <= 65536, "amax_history_len %d", info.amax_history_len);
      FUZZ_ASSERT(info.amax_history_len > 0 || (info.scale == 1.0f && info.scale_inv == 1.0f),
                  "a never-used state has scale %g", (double)info.scale);
      for (int i = std::min(8, info.amax_history_len); with_history && i < 8; ++i)
        FUZZ_ASSERT(hist[i] == -7.0f, "history[%d] written beyond amax_history_len %d", i, info.amax_history_len);
      break;
    }
  }
}

// Loads `buf` into the layer: a success must save back to exactly `buf`; a failure changes nothing.
inline void Program::load_moe_and_check(te_context *ctx, te_grouped_linear *g, const std::vector<uint8_t> &buf,
                                        const std::vector<uint8_t> &original) {
  const te_status s = TE_CALL(te_grouped_linear_state_load, ctx, g, buf.data(), buf.size());
  if (s == TE_SUCCESS) {
    FUZZ_ASSERT(moe_state(ctx, g) == buf, "te_grouped_linear_state_load succeeded but saves back other bytes");
  } else {
    FUZZ_ASSERT(moe_state(ctx, g) == original, "te_grouped_linear_state_load failed but changed the state");
  }
}

// The caller's rules when a context goes: its grouped layers and backward contexts go first.
inline void Program::moe_drop_context(int slot) {
  for (auto &b : moe_bwd_)
    if (b.live && b.ctx == slot) {
      te_grouped_linear_backward_ctx_destroy(b.h);
      b.live = false;
    }
  for (auto &m : moe_)
    if (m.live && m.ctx == slot) {
      te_grouped_linear_destroy(m.h);
      m.live = false;
      dead_moe_.push_back(m.h);
    }
}

}  // namespace fuzz
