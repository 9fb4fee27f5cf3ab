// fuzz_api_sequence's operations on te_layernorm_linear and te_layernorm_mlp (api_program.h): a
// slot holds either kind. Create and destroy with fuzzed options (features, bias, dtype, fused
// wgrad, norm kind, eps, zero-centred gamma, activation); the split forward (compute, then save,
// release, or a stale copy) and the fused one with fuzzed tokens (2-D and 3-D, off multiples of
// 16), gamma/beta/weights/biases given, missing, misshapen or of another dtype, an optional
// ln_out; backward with any subset of the gradients (main_grad views under fused accumulation,
// TE_BACKWARD_ONCE, stale and wrong-type handles); state save / load (round trips, corrupted
// bytes) and scaling-state reads (the MLP's per GEMM).
//
// Besides the common checks (a call the header rejects fails; a failed call leaves its outputs,
// main_grads, the residuals struct and the module's state untouched), successful calls are
// checked against the header: residuals.fp8 is the scope's mode and the residual views have the
// documented shapes (mu only for LayerNorm), ln_out is exactly te_norm_forward's output for the
// same options, a forward repeated in its scope writes the same y and ln_out, a repeated backward
// (retain-graph) the same gradients, and a loaded state saves back to the same bytes.
#pragma once

#include "api_program.h"

namespace fuzz {

// A call that must fail, and (under FUZZ_TRACE) which line of this file decided so.
#define LN_MUST_FAIL()                                                                     \
  do {                                                                                     \
    mf = true;                                                                             \
    if (tracing()) std::fprintf(stderr, "  (must fail: api_layernorm.h:%d)\n", __LINE__); \
  } while (0)

inline bool ln_gated(int act) { return act == TE_ACTIVATION_SWIGLU || act == TE_ACTIVATION_GEGLU; }

// A module argument: the slot's handle (live or stale), sometimes NULL or another type.
inline void *Program::ln_arg(bool &mf, int &slot) {
  const uint8_t v = R.u8();
  slot = -1;
  if (v < 245) {
    slot = v % kLnSlots;
    if (!ln_[slot].live) LN_MUST_FAIL();
    return ln_[slot].h;
  }
  LN_MUST_FAIL();
  if (v < 249) return nullptr;
  if (!dead_ln_.empty() && v < 252) return dead_ln_[R.pick(static_cast<uint32_t>(dead_ln_.size()))];
  return some_live_handle(7);
}

// The module's saved state, or empty when it cannot be read (kind: 0 LayerNormLinear, 1 MLP).
inline std::vector<uint8_t> Program::ln_state(te_context *ctx, void *h, int kind) {
  auto save = [&](void *buf, size_t cap, size_t *n) {
    return kind == 0 ? te_layernorm_linear_state_save(ctx, static_cast<te_layernorm_linear *>(h), buf, cap, n)
                     : te_layernorm_mlp_state_save(ctx, static_cast<te_layernorm_mlp *>(h), buf, cap, n);
  };
  size_t n = 0;
  if (save(nullptr, 0, &n) != TE_SUCCESS || n == 0 || n > (1u << 22)) return {};
  std::vector<uint8_t> buf(n);
  size_t n2 = 0;
  if (save(buf.data(), n, &n2) != TE_SUCCESS) violation("layernorm state_save failed after a size query");
  FUZZ_ASSERT(n2 == n, "layernorm state_save: size %zu after a query of %zu", n2, n);
  return buf;
}

inline void Program::ln_destroy_handle(void *h, int kind) {
  if (kind == 0) te_layernorm_linear_destroy(static_cast<te_layernorm_linear *>(h));
  else te_layernorm_mlp_destroy(static_cast<te_layernorm_mlp *>(h));
}
inline void Program::ln_destroy_backward(void *h, int kind) {
  if (kind == 0) te_layernorm_linear_backward_ctx_destroy(static_cast<te_layernorm_linear_backward_ctx *>(h));
  else te_layernorm_mlp_backward_ctx_destroy(static_cast<te_layernorm_mlp_backward_ctx *>(h));
}

inline void Program::ln_create() {
  const int slot = static_cast<int>(R.pick(kLnSlots));
  LnSlot &M = ln_[slot];
  if (M.live) {
    ln_destroy_handle(M.h, M.cfg.kind);  // backward contexts keep what they need
    dead_ln_.push_back(M.h);
    M.live = false;
  }
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  LnCfg c;
  c.kind = R.u8() < 128 ? 0 : 1;
  c.in = pick_features(mf);
  c.out = pick_features(mf);
  const uint8_t b = R.u8();
  c.bias = b < 170 ? 1 : b < 250 ? 0 : 2;
  mf |= c.bias == 2;
  static const int kDt[5] = {TE_DTYPE_BF16, TE_DTYPE_F32, TE_DTYPE_F16, TE_DTYPE_E4M3, -2};
  const uint8_t d = R.u8();
  c.dtype = kDt[d < 150 ? 0 : d < 200 ? 1 : d < 245 ? 2 : 3 + d % 2];
  mf |= c.dtype > TE_DTYPE_BF16 || c.dtype < 0;
  const uint8_t f = R.u8();
  c.fuse = f < 200 ? 0 : f < 250 ? 1 : 2;
  mf |= c.fuse == 2;
  const uint8_t nk = R.u8();
  c.norm = nk < 200 ? TE_NORM_LAYERNORM : nk < 250 ? TE_NORM_RMSNORM : nk % 2 ? 2 : -1;
  mf |= c.norm != TE_NORM_LAYERNORM && c.norm != TE_NORM_RMSNORM;
  static const float kEps[8] = {1e-5f, 1e-3f, 1e-30f, 0.0f, -1e-5f, NAN, INFINITY, -0.0f};
  const uint8_t e = R.u8();
  c.eps = kEps[e < 230 ? 0 : e < 240 ? 1 : e < 245 ? 2 : 3 + e % 5];
  mf |= !(c.eps > 0.0f) || !std::isfinite(c.eps);
  const uint8_t z = R.u8();
  c.zc = z < 180 ? 0 : z < 250 ? 1 : 2;
  mf |= c.zc == 2;
  static const int kAct[5] = {TE_ACTIVATION_GELU, TE_ACTIVATION_RELU, TE_ACTIVATION_SWIGLU, TE_ACTIVATION_GEGLU,
                              TE_ACTIVATION_SRELU};
  const uint8_t a = R.u8();
  c.act = a < 250 ? kAct[a % 5] : a % 2 ? 5 : -1;
  if (c.kind == 1) mf |= c.act < 0 || c.act > TE_ACTIVATION_SRELU;
  const uint8_t x = R.u8();
  const bool small_struct = x >= 252, null_opts = x >= 248 && x < 250, null_out = x >= 250 && x < 252;
  mf |= small_struct || null_opts || null_out;
  void *h = sentinel<void>();
  te_status s;
  if (c.kind == 0) {
    te_layernorm_linear_options o;
    std::memset(&o, 0x6B, sizeof o);
    FUZZ_ASSERT(TE_CALL(te_layernorm_linear_options_init, &o) == TE_SUCCESS, "te_layernorm_linear_options_init failed");
    FUZZ_ASSERT(o.struct_size == sizeof o && o.in_features == 0 && o.out_features == 0 && o.bias == 1 &&
                    get_enum(o.activation_dtype) == TE_DTYPE_BF16 && o.fuse_wgrad_accumulation == 0 &&
                    get_enum(o.normalization) == TE_NORM_LAYERNORM && o.eps == 1e-5f && o.zero_centered_gamma == 0,
                "te_layernorm_linear_options_init defaults");
    o.in_features = c.in;
    o.out_features = c.out;
    o.bias = c.bias;
    set_enum(o.activation_dtype, c.dtype);
    o.fuse_wgrad_accumulation = c.fuse;
    set_enum(o.normalization, c.norm);
    o.eps = c.eps;
    o.zero_centered_gamma = c.zc;
    if (small_struct) o.struct_size = sizeof o - 4;
    te_layernorm_linear *out = sentinel<te_layernorm_linear>();
    s = TE_CALL(te_layernorm_linear_create, null_out ? nullptr : &out, ctx, null_opts ? nullptr : &o);
    h = out;
  } else {
    te_layernorm_mlp_options o;
    std::memset(&o, 0x6B, sizeof o);
    FUZZ_ASSERT(TE_CALL(te_layernorm_mlp_options_init, &o) == TE_SUCCESS, "te_layernorm_mlp_options_init failed");
    FUZZ_ASSERT(o.struct_size == sizeof o && o.hidden_size == 0 && o.ffn_hidden_size == 0 && o.bias == 1 &&
                    get_enum(o.activation) == TE_ACTIVATION_GELU && get_enum(o.activation_dtype) == TE_DTYPE_BF16 &&
                    o.fuse_wgrad_accumulation == 0 && get_enum(o.normalization) == TE_NORM_LAYERNORM &&
                    o.eps == 1e-5f && o.zero_centered_gamma == 0,
                "te_layernorm_mlp_options_init defaults");
    o.hidden_size = c.in;
    o.ffn_hidden_size = c.out;
    o.bias = c.bias;
    set_enum(o.activation, c.act);
    set_enum(o.activation_dtype, c.dtype);
    o.fuse_wgrad_accumulation = c.fuse;
    set_enum(o.normalization, c.norm);
    o.eps = c.eps;
    o.zero_centered_gamma = c.zc;
    if (small_struct) o.struct_size = sizeof o - 4;
    te_layernorm_mlp *out = sentinel<te_layernorm_mlp>();
    s = TE_CALL(te_layernorm_mlp_create, null_out ? nullptr : &out, ctx, null_opts ? nullptr : &o);
    h = out;
  }
  const char *fn = c.kind == 0 ? "te_layernorm_linear_create" : "te_layernorm_mlp_create";
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "%s accepted invalid arguments", fn);
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(h == sentinel<void>(), "%s failed but wrote *out", fn);
    return;
  }
  M.h = h;
  M.live = true;
  M.ctx = cs;
  M.cfg = c;
  M.bufs = nullptr;
  if (c.small()) {
    all_ln_bufs_.push_back(std::make_unique<LnBufs>());
    LnBufs &B = *all_ln_bufs_.back();
    const size_t el = dtype_bytes(c.dtype);
    const size_t in = static_cast<size_t>(c.in), out = static_cast<size_t>(c.out), rows1 = static_cast<size_t>(c.fc1_rows());
    B.x = Blob(kMaxTokens * in * el);
    B.gamma = Blob(in * el);
    B.beta = Blob(in * el);
    // LayerNormLinear: W [out, in], b [out]. MLP: fc1 W [rows1, hidden], b [rows1], fc2 W
    // [hidden, ffn], b [hidden].
    const size_t w1 = c.kind == 0 ? out * in : rows1 * in, b1 = c.kind == 0 ? out : rows1;
    B.w = Blob(w1 * el);
    B.b = Blob(b1 * el);
    B.main_grad = Blob(w1 * 4);
    if (c.kind == 1) {
      B.w2 = Blob(in * out * el);
      B.b2 = Blob(in * el);
      B.main_grad2 = Blob(in * out * 4);
    }
    Rng rng(R.u8() + 61u * serial_);
    auto fill = [&](Blob &blob, int dt, float lo, float hi) {
      const int64_t n = static_cast<int64_t>(blob.size() / dtype_bytes(dt));
      for (int64_t i = 0; i < n; ++i) store_hp(blob.data(), dt, i, rng.uniform(lo, hi));
    };
    fill(B.x, c.dtype, -2, 2);
    fill(B.gamma, c.dtype, c.zc == 1 ? -0.5f : 0.5f, c.zc == 1 ? 0.5f : 1.5f);
    fill(B.beta, c.dtype, -0.5f, 0.5f);
    fill(B.w, c.dtype, -0.5f, 0.5f);
    fill(B.b, c.dtype, -0.5f, 0.5f);
    fill(B.main_grad, TE_DTYPE_F32, -1, 1);
    if (c.kind == 1) {
      fill(B.w2, c.dtype, -0.5f, 0.5f);
      fill(B.b2, c.dtype, -0.5f, 0.5f);
      fill(B.main_grad2, TE_DTYPE_F32, -1, 1);
    }
    M.bufs = &B;
  }
}

inline void Program::ln_destroy() {
  const uint8_t v = R.u8();
  if (v >= 250) {
    // Another type's handle, or a NULL: a no-op for both destroy functions.
    void *h = v >= 253 ? nullptr : some_live_handle(7);
    te_layernorm_linear_destroy(static_cast<te_layernorm_linear *>(h));
    te_layernorm_mlp_destroy(static_cast<te_layernorm_mlp *>(h));
    return;
  }
  LnSlot &M = ln_[v % kLnSlots];
  if (M.live) {
    // Sometimes through the other kind's destroy first, which must ignore it.
    if (R.u8() >= 200) ln_destroy_handle(M.h, 1 - M.cfg.kind);
    ln_destroy_handle(M.h, M.cfg.kind);
    dead_ln_.push_back(M.h);
    M.live = false;
  } else if (M.h) {
    ln_destroy_handle(M.h, M.cfg.kind);  // destroyed before: a no-op
  }
}

inline Program::LnBwdSlot &Program::fresh_ln_bwd_slot(int &bs) {
  bs = static_cast<int>(R.pick(kLnBwdSlots));
  LnBwdSlot &B = ln_bwd_[bs];
  if (B.live) {
    ln_destroy_backward(B.h, B.cfg.kind);
    B.live = false;
  }
  return B;
}

// A view of `rows` x `cols` (or a vector when rows == 0) of dtype dt into `blob`.
inline te_tensor ln_view(const Blob &blob, int dt, int64_t rows, int64_t cols) {
  te_tensor t{};
  set_enum(t.dtype, dt);
  if (rows == 0) {
    t.ndim = 1;
    t.shape[0] = cols;
  } else {
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
  }
  t.data = blob.data();
  return t;
}

inline void Program::ln_forward() {
  int bs;
  LnBwdSlot &B = fresh_ln_bwd_slot(bs);  // first: seeds name it
  bool mf = false;
  int ms;
  void *mh = ln_arg(mf, ms);
  LnCfg cfg;
  LnBufs *bufs = nullptr;
  int mctx = 0;
  if (ms >= 0 && ln_[ms].h) {
    cfg = ln_[ms].cfg;
    bufs = ln_[ms].bufs;
    mctx = ln_[ms].ctx;
  }
  int cs;
  te_context *ctx = ctx_arg(mf, cs, mctx);
  if (cs != mctx) LN_MUST_FAIL();
  // Which function: the slot's kind, or (rarely) the other kind's, which must refuse the handle.
  int kind = cfg.kind;
  if (R.u8() >= 250) {
    kind = 1 - kind;
    if (mh) LN_MUST_FAIL();
  }
  if (!bufs) {  // no parameters that could match the module: a small stand-in, and the call must fail
    LN_MUST_FAIL();
    cfg = LnCfg();
    cfg.kind = kind;
    if (!ln_stand_in_)
      ln_stand_in_.reset(new LnBufs{Blob(kMaxTokens * 16 * 2), Blob(32), Blob(32), Blob(512), Blob(32), Blob(512),
                                    Blob(32), Blob(1024), Blob(1024)});
    bufs = ln_stand_in_.get();
  }
  const int dt = cfg.dtype;
  const int64_t in = cfg.in, out = cfg.kind == 0 ? cfg.out : cfg.in;  // y's width
  static const int64_t kTok[8] = {16, 32, 48, 1, 5, 64, 8, 17};
  const int64_t tokens = kTok[R.pick(8)];
  Tensor x, y, ln_out;
  bool odd = false;
  const bool three_d = tokens % 2 == 0 && R.u8() >= 200;
  Shape xs = shape2(tokens, in), ys = shape2(tokens, out);
  if (three_d) {
    xs.ndim = ys.ndim = 3;
    xs.d[0] = ys.d[0] = 2;
    xs.d[1] = ys.d[1] = tokens / 2;
    xs.d[2] = in;
    ys.d[2] = out;
  }
  make(x, dt, xs);
  x.t.data = bufs->x.data();  // the module's x: a forward references it until its backward context goes
  make(y, pick_dtype(dt, odd), ys);
  if (get_enum(y.t.dtype) != dt) LN_MUST_FAIL();
  maybe_malform(x);
  maybe_malform(y);
  // The parameters: views of the slot's buffers, sometimes missing, misshapen or of another dtype.
  te_tensor gamma = ln_view(bufs->gamma, dt, 0, in), beta = ln_view(bufs->beta, dt, 0, in);
  te_tensor w1 = cfg.kind == 0 ? ln_view(bufs->w, dt, cfg.out, in) : ln_view(bufs->w, dt, cfg.fc1_rows(), in);
  te_tensor b1 = ln_view(bufs->b, dt, 0, cfg.kind == 0 ? cfg.out : cfg.fc1_rows());
  te_tensor w2 = ln_view(bufs->w2, dt, in, cfg.out), b2 = ln_view(bufs->b2, dt, 0, in);
  const te_tensor *pgamma = &gamma, *pbeta = cfg.norm == TE_NORM_LAYERNORM ? &beta : nullptr;
  const te_tensor *pw1 = &w1, *pb1 = cfg.bias == 1 ? &b1 : nullptr, *pw2 = &w2, *pb2 = cfg.bias == 1 ? &b2 : nullptr;
  const uint8_t p = R.u8();
  switch (p < 220 ? 0 : p - 219) {
    case 0: break;
    case 1: pgamma = nullptr; LN_MUST_FAIL(); break;
    case 2: gamma.shape[0] = in + 1; LN_MUST_FAIL(); break;
    case 3: pbeta = pbeta ? nullptr : &beta; LN_MUST_FAIL(); break;  // missing for LayerNorm, given to RMSNorm
    case 4: beta.ndim = 2; beta.shape[0] = 1; beta.shape[1] = in; if (pbeta) LN_MUST_FAIL(); break;
    case 5: pw1 = nullptr; LN_MUST_FAIL(); break;
    case 6: std::swap(w1.shape[0], w1.shape[1]); if (w1.shape[0] != w1.shape[1]) LN_MUST_FAIL(); break;
    case 7: w1.ndim = 1; w1.shape[0] *= w1.shape[1]; LN_MUST_FAIL(); break;
    case 8: pb1 = pb1 ? nullptr : &b1; LN_MUST_FAIL(); break;  // the presence the module was not created with
    case 9: set_enum(gamma.dtype, dt == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32); LN_MUST_FAIL(); break;
    case 10: set_enum(w1.dtype, dt == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32); LN_MUST_FAIL(); break;
    case 11: if (cfg.kind == 1) { pw2 = nullptr; LN_MUST_FAIL(); } break;
    case 12: if (cfg.kind == 1) { std::swap(w2.shape[0], w2.shape[1]); if (w2.shape[0] != w2.shape[1]) LN_MUST_FAIL(); } break;
    case 13: if (cfg.kind == 1) { pb2 = pb2 ? nullptr : &b2; LN_MUST_FAIL(); } break;
    case 14: if (cfg.kind == 1 && ln_gated(cfg.act)) { w1.shape[0] = cfg.out; LN_MUST_FAIL(); } break;  // not 2 ffn
    case 15: gamma.device.type = TE_DEVICE_CUDA; LN_MUST_FAIL(); break;
    case 16: w1.data = nullptr; LN_MUST_FAIL(); break;
    default: break;
  }
  // ln_out: none, like x, or of another shape or dtype.
  te_tensor *pln = nullptr;
  const uint8_t l = R.u8();
  if (l >= 100) {
    make(ln_out, dt, xs);
    if (l >= 245) {
      ln_out.t.shape[ln_out.t.ndim - 1] += 1;
      LN_MUST_FAIL();
    } else if (l >= 240) {
      set_enum(ln_out.t.dtype, dt == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32);
      LN_MUST_FAIL();
    }
    pln = &ln_out.t;
  }
  const uint8_t wu = R.u8();
  const int weight_unchanged = wu < 200 ? 0 : wu < 250 ? 1 : 2;
  mf |= weight_unchanged == 2;
  const bool small_args = R.u8() >= 252;
  mf |= small_args;
  const int expect_fp8 = fp8_scope(cs);
  const bool fp8_dims_bad = tokens % 16 || cfg.in % 16 || cfg.out % 16;
  if (expect_fp8 == 1 && fp8_dims_bad) LN_MUST_FAIL();  // UNSUPPORTED
  Tensor *px = maybe_null(x, mf), *py = maybe_null(y, mf);
  const bool fused = R.u8() >= 128;
  const uint8_t q = R.u8();
  const bool null_res = !fused && q >= 246 && q < 250, null_out = fused && q >= 250, small_res = !fused && q >= 250;
  mf |= null_res || null_out || small_res;
  te_layernorm_linear_forward_args la;
  te_layernorm_mlp_forward_args ma;
  std::memset(&la, 0x44, sizeof la);
  std::memset(&ma, 0x44, sizeof ma);
  FUZZ_ASSERT(TE_CALL(te_layernorm_linear_forward_args_init, &la) == TE_SUCCESS, "te_layernorm_linear_forward_args_init");
  FUZZ_ASSERT(TE_CALL(te_layernorm_mlp_forward_args_init, &ma) == TE_SUCCESS, "te_layernorm_mlp_forward_args_init");
  FUZZ_ASSERT(!la.input && !la.ln_weight && !la.ln_bias && !la.weight && !la.bias && !la.ln_out && la.weight_unchanged == 0,
              "te_layernorm_linear_forward_args_init defaults");
  FUZZ_ASSERT(!ma.input && !ma.ln_weight && !ma.ln_bias && !ma.fc1_weight && !ma.fc1_bias && !ma.fc2_weight &&
                  !ma.fc2_bias && !ma.ln_out && ma.weight_unchanged == 0,
              "te_layernorm_mlp_forward_args_init defaults");
  la.input = ma.input = tp(px);
  la.ln_weight = ma.ln_weight = pgamma;
  la.ln_bias = ma.ln_bias = pbeta;
  la.weight = ma.fc1_weight = pw1;
  la.bias = ma.fc1_bias = pb1;
  ma.fc2_weight = pw2;
  ma.fc2_bias = pb2;
  la.ln_out = ma.ln_out = pln;
  la.weight_unchanged = ma.weight_unchanged = weight_unchanged;
  if (small_args) {
    la.struct_size = sizeof la - 1;
    ma.struct_size = sizeof ma - 1;
  }
  te_layernorm_linear_residuals lr;
  te_layernorm_mlp_residuals mr;
  std::memset(&lr, 0x99, sizeof lr);
  std::memset(&mr, 0x99, sizeof mr);
  lr.struct_size = small_res ? sizeof lr - 8 : sizeof lr;
  mr.struct_size = small_res ? sizeof mr - 8 : sizeof mr;
  const std::vector<uint8_t> lr0 = bytes_of(&lr, sizeof lr), mr0 = bytes_of(&mr, sizeof mr);
  y.snapshot();
  if (pln) ln_out.snapshot();
  const bool check_state = ms >= 0 && ln_[ms].live && ctx_live(mctx);
  const int state_kind = check_state ? ln_[ms].cfg.kind : 0;  // the slot's (cfg may be a stand-in's)
  const std::vector<uint8_t> st_before = check_state ? ln_state(ctx_of(mctx), mh, state_kind) : std::vector<uint8_t>();
  void *h = sentinel<void>();
  auto run = [&](te_tensor *yt, bool nres, bool nout, void **outp) {
    if (kind == 0)
      return fused ? TE_CALL(te_layernorm_linear_forward, ctx, static_cast<te_layernorm_linear *>(mh), &la, yt,
                             nout ? nullptr : reinterpret_cast<te_layernorm_linear_backward_ctx **>(outp))
                   : TE_CALL(te_layernorm_linear_forward_compute, ctx, static_cast<te_layernorm_linear *>(mh), &la, yt,
                             nres ? nullptr : &lr);
    return fused ? TE_CALL(te_layernorm_mlp_forward, ctx, static_cast<te_layernorm_mlp *>(mh), &ma, yt,
                           nout ? nullptr : reinterpret_cast<te_layernorm_mlp_backward_ctx **>(outp))
                 : TE_CALL(te_layernorm_mlp_forward_compute, ctx, static_cast<te_layernorm_mlp *>(mh), &ma, yt,
                           nres ? nullptr : &mr);
  };
  const te_status s = run(tp(py), null_res, null_out, &h);
  const char *fn = kind == 0 ? (fused ? "te_layernorm_linear_forward" : "te_layernorm_linear_forward_compute")
                             : (fused ? "te_layernorm_mlp_forward" : "te_layernorm_mlp_forward_compute");
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "%s accepted what it must reject", fn);
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(same_bytes(&lr, lr0) && same_bytes(&mr, mr0), "%s failed but wrote *residuals", fn);
    FUZZ_ASSERT(h == sentinel<void>(), "%s failed but wrote *out", fn);
    y.check_untouched(fn, "y");
    if (pln) ln_out.check_untouched(fn, "args->ln_out");
    if (check_state)
      FUZZ_ASSERT(ln_state(ctx_of(mctx), mh, state_kind) == st_before, "%s failed but changed the module's state", fn);
    return;
  }
  if (!fused) {
    // The residual views: fp8 is the scope's mode, shapes as te.h documents them.
    const int rfp8 = kind == 0 ? lr.fp8 : mr.fp8;
    FUZZ_ASSERT(rfp8 == 0 || rfp8 == 1, "%s: residuals.fp8 = %d", fn, rfp8);
    if (expect_fp8 >= 0) FUZZ_ASSERT(rfp8 == expect_fp8, "%s: residuals.fp8 = %d, expected %d", fn, rfp8, expect_fp8);
    const te_tensor &lt = kind == 0 ? lr.ln_out_t : mr.ln_out_t, &mu = kind == 0 ? lr.mu : mr.mu,
                    &rs = kind == 0 ? lr.rsigma : mr.rsigma;
    FUZZ_ASSERT(lt.ndim == 2 && lt.data, "%s: ln_out_t is not a matrix", fn);
    if (rfp8) FUZZ_ASSERT(lt.shape[0] == in && lt.shape[1] == tokens && is_fp8(get_enum(lt.dtype)) && lt.scale_inv,
                          "%s: FP8 ln_out_t is not [in, tokens] with scale_inv", fn);
    else FUZZ_ASSERT(lt.shape[0] == tokens && lt.shape[1] == in && get_enum(lt.dtype) == dt,
                     "%s: high-precision ln_out_t is not norm(x) [tokens, in]", fn);
    FUZZ_ASSERT(rs.data && rs.ndim == 1 && rs.shape[0] == tokens && get_enum(rs.dtype) == TE_DTYPE_F32,
                "%s: rsigma is not F32 [tokens]", fn);
    FUZZ_ASSERT((mu.data != nullptr) == (cfg.norm == TE_NORM_LAYERNORM), "%s: mu %s for %s", fn,
                mu.data ? "given" : "missing", cfg.norm == TE_NORM_LAYERNORM ? "LayerNorm" : "RMSNorm");
    if (kind == 1)
      FUZZ_ASSERT(mr.fc1_out.data && mr.fc1_out.shape[0] == tokens && mr.fc1_out.shape[1] == cfg.fc1_rows() &&
                      get_enum(mr.fc1_out.dtype) == dt,
                  "%s: fc1_out is not [tokens, fc1 rows] of the activation dtype", fn);
    FUZZ_ASSERT((kind == 0 ? lr.internal : mr.internal) != nullptr, "%s succeeded without filling residuals->internal", fn);
  }
  // ln_out is the norm's output: te_norm_forward with the module's options writes the same bytes.
  if (pln) {
    Tensor want;
    make(want, dt, xs);
    te_norm_options no;
    FUZZ_ASSERT(TE_CALL(te_norm_options_init, &no) == TE_SUCCESS, "te_norm_options_init");
    set_enum(no.kind, cfg.norm);
    no.eps = cfg.eps;
    no.zero_centered_gamma = cfg.zc;
    te_norm_forward_args na;
    FUZZ_ASSERT(TE_CALL(te_norm_forward_args_init, &na) == TE_SUCCESS, "te_norm_forward_args_init");
    na.input = &x.t;
    na.weight = &gamma;
    na.bias = pbeta;
    na.output = &want.t;
    FUZZ_ASSERT(TE_CALL(te_norm_forward, ctx, &no, &na) == TE_SUCCESS, "te_norm_forward failed on a module's valid input");
    FUZZ_ASSERT(ln_out.data.equals(want.data.snapshot()), "%s: ln_out differs from te_norm_forward's output", fn);
  }
  // The same call again in the same scope writes the same y and ln_out.
  if (R.u8() >= 200) {
    const std::vector<uint8_t> y1 = y.data.snapshot(), l1 = pln ? ln_out.data.snapshot() : std::vector<uint8_t>();
    te_layernorm_linear_residuals lr2;
    te_layernorm_mlp_residuals mr2;
    std::memset(&lr2, 0, sizeof lr2);
    std::memset(&mr2, 0, sizeof mr2);
    lr2.struct_size = sizeof lr2;
    mr2.struct_size = sizeof mr2;
    std::swap(lr, lr2);
    std::swap(mr, mr2);
    void *h2 = nullptr;
    FUZZ_ASSERT(run(&y.t, false, false, &h2) == TE_SUCCESS, "%s failed when repeated", fn);
    FUZZ_ASSERT(y.data.equals(y1), "%s repeated in the same scope wrote another y", fn);
    if (pln) FUZZ_ASSERT(ln_out.data.equals(l1), "%s repeated in the same scope wrote another ln_out", fn);
    if (fused) ln_destroy_backward(h2, kind);
    else if (kind == 0) te_layernorm_linear_residuals_release(&lr);
    else te_layernorm_mlp_residuals_release(&mr);
    std::swap(lr, lr2);
    std::swap(mr, mr2);
  }
  if (!fused) {
    // Save (maybe through a copy, whose twin is then stale), or release.
    const uint32_t what = R.pick(4);
    auto save = [&](void *res, void **outp) {
      return kind == 0 ? TE_CALL(te_layernorm_linear_forward_save, ctx, static_cast<te_layernorm_linear *>(mh),
                                 static_cast<te_layernorm_linear_residuals *>(res),
                                 reinterpret_cast<te_layernorm_linear_backward_ctx **>(outp))
                       : TE_CALL(te_layernorm_mlp_forward_save, ctx, static_cast<te_layernorm_mlp *>(mh),
                                 static_cast<te_layernorm_mlp_residuals *>(res),
                                 reinterpret_cast<te_layernorm_mlp_backward_ctx **>(outp));
    };
    auto release = [&](void *res) {
      if (kind == 0) te_layernorm_linear_residuals_release(static_cast<te_layernorm_linear_residuals *>(res));
      else te_layernorm_mlp_residuals_release(static_cast<te_layernorm_mlp_residuals *>(res));
    };
    auto internal = [&](void *res) {
      return kind == 0 ? static_cast<te_layernorm_linear_residuals *>(res)->internal
                       : static_cast<te_layernorm_mlp_residuals *>(res)->internal;
    };
    te_layernorm_linear_residuals lcopy = lr;
    te_layernorm_mlp_residuals mcopy = mr;
    void *orig = kind == 0 ? static_cast<void *>(&lr) : static_cast<void *>(&mr);
    void *copy = kind == 0 ? static_cast<void *>(&lcopy) : static_cast<void *>(&mcopy);
    if (what == 3) {
      release(copy);
      FUZZ_ASSERT(internal(copy) == nullptr, "residuals_release left internal set");
      release(copy);  // idempotent
      release(orig);  // a stale copy: a no-op
      void *z = sentinel<void>();
      FUZZ_ASSERT(save(orig, &z) != TE_SUCCESS && z == sentinel<void>(), "forward_save accepted released residuals");
      return;
    }
    void *use = what == 2 ? copy : orig, *other = what == 2 ? orig : copy;
    FUZZ_ASSERT(save(use, &h) == TE_SUCCESS, "forward_save failed on fresh residuals");
    FUZZ_ASSERT(internal(use) == nullptr, "forward_save left residuals->internal set");
    void *z = sentinel<void>();
    FUZZ_ASSERT(save(other, &z) != TE_SUCCESS && z == sentinel<void>(), "forward_save saved a copy of saved residuals");
    release(other);  // a no-op
  }
  B.h = h;
  B.live = true;
  B.ctx = cs;
  B.cfg = cfg;
  B.cfg.kind = kind;
  B.bufs = bufs;
  B.tokens = tokens;
  B.once_done = false;
}

inline void Program::ln_backward() {
  bool mf = false;
  LnBwdSlot &B = ln_bwd_[R.pick(kLnBwdSlots)];
  void *h = B.h;
  int kind = B.cfg.kind;
  const uint8_t hv = R.u8();
  if (hv >= 250) h = some_live_handle(8);
  else if (hv >= 246) kind = 1 - kind;  // the other kind's backward: must refuse the handle
  if (!h || !B.live || h != B.h || kind != B.cfg.kind) LN_MUST_FAIL();
  if (B.once_done) LN_MUST_FAIL();  // TE_BACKWARD_ONCE ran: INVALID_STATE
  int cs;
  te_context *ctx = ctx_arg(mf, cs, B.ctx);
  if (cs != B.ctx) LN_MUST_FAIL();
  const LnCfg cfg = B.h && B.bufs ? B.cfg : LnCfg();
  LnBufs *bufs = B.h && B.bufs ? B.bufs : nullptr;
  const int dt = cfg.dtype;
  const bool fuse = cfg.fuse == 1 && bufs;
  int64_t tokens = B.tokens > 0 && B.tokens <= kMaxTokens ? B.tokens : 16;
  if (R.u8() >= 248) {
    tokens += 1;
    LN_MUST_FAIL();
  }
  const int64_t in = cfg.in, out = cfg.kind == 0 ? cfg.out : cfg.in;
  Tensor dy, dx, dgamma, dbeta, dw1, db1, dw2, db2;
  bool odd = false;
  make(dy, dt, shape2(tokens, out));
  maybe_malform(dy);
  const te_tensor *pdy = &dy.t;
  if (dy.malformed) LN_MUST_FAIL();
  if (R.u8() >= 252) {
    pdy = nullptr;
    LN_MUST_FAIL();
  }
  make(dx, pick_dtype(dt, odd), shape2(tokens, in));
  maybe_malform(dx);
  make(dgamma, dt, shape1(in));
  make(dbeta, dt, shape1(in));
  const int64_t r1 = cfg.kind == 0 ? cfg.out : cfg.fc1_rows();
  make(dw1, fuse ? TE_DTYPE_F32 : dt, shape2(r1, in));
  if (fuse) dw1.t.data = bufs->main_grad.data();
  make(db1, dt, shape1(r1));
  make(dw2, fuse ? TE_DTYPE_F32 : dt, shape2(in, cfg.out));
  if (fuse && cfg.kind == 1) dw2.t.data = bufs->main_grad2.data();
  make(db2, dt, shape1(in));
  // Which gradients: each with probability ~3/4 (all of them for a 0 byte).
  const uint8_t mask = static_cast<uint8_t>(~R.u8());
  auto want = [&](int bit) { return (mask >> bit) & 1 ? true : false; };
  te_tensor *pdx = want(0) ? &dx.t : nullptr, *pdg = want(1) ? &dgamma.t : nullptr;
  te_tensor *pdb = want(2) && cfg.norm == TE_NORM_LAYERNORM ? &dbeta.t : nullptr;
  te_tensor *pdw1 = want(3) ? &dw1.t : nullptr, *pdb1 = want(4) && cfg.bias == 1 ? &db1.t : nullptr;
  te_tensor *pdw2 = want(5) && cfg.kind == 1 ? &dw2.t : nullptr, *pdb2 = want(6) && cfg.kind == 1 && cfg.bias == 1 ? &db2.t : nullptr;
  // What is wrong inside the grads struct only counts when the struct is given.
  bool gmf = false;
  if (pdx && (dx.malformed || get_enum(dx.t.dtype) != dt)) gmf = true;
  // A gradient the module does not have, or a wrong one.
  const uint8_t e = R.u8();
  if (e >= 250 && cfg.norm != TE_NORM_LAYERNORM) {
    pdb = &dbeta.t;
    gmf = true;
  } else if (e >= 246 && cfg.bias != 1) {
    pdb1 = &db1.t;
    gmf = true;
  } else if (e >= 242 && pdw1) {
    set_enum(dw1.t.dtype, fuse || dt == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32);
    gmf = true;
  } else if (e >= 238 && pdg) {
    dgamma.t.shape[0] = in + 1;
    gmf = true;
  } else if (e >= 234 && pdw1) {
    std::swap(dw1.t.shape[0], dw1.t.shape[1]);
    if (dw1.t.shape[0] != dw1.t.shape[1]) gmf = true;
  }
  te_layernorm_linear_grads lg;
  te_layernorm_mlp_grads mg;
  std::memset(&lg, 0x33, sizeof lg);
  std::memset(&mg, 0x33, sizeof mg);
  FUZZ_ASSERT(TE_CALL(te_layernorm_linear_grads_init, &lg) == TE_SUCCESS && !lg.dx && !lg.dln_weight && !lg.dln_bias &&
                  !lg.dw && !lg.db,
              "te_layernorm_linear_grads_init");
  FUZZ_ASSERT(TE_CALL(te_layernorm_mlp_grads_init, &mg) == TE_SUCCESS && !mg.dx && !mg.dln_weight && !mg.dln_bias &&
                  !mg.dfc1_weight && !mg.dfc1_bias && !mg.dfc2_weight && !mg.dfc2_bias,
              "te_layernorm_mlp_grads_init");
  lg.dx = mg.dx = pdx;
  lg.dln_weight = mg.dln_weight = pdg;
  lg.dln_bias = mg.dln_bias = pdb;
  lg.dw = mg.dfc1_weight = pdw1;
  lg.db = mg.dfc1_bias = pdb1;
  mg.dfc2_weight = pdw2;
  mg.dfc2_bias = pdb2;
  const void *grads = kind == 0 ? static_cast<const void *>(&lg) : static_cast<const void *>(&mg);
  const uint8_t gv = R.u8();
  if (gv >= 252) {
    lg.struct_size = 0;
    mg.struct_size = sizeof mg - 8;
    LN_MUST_FAIL();
  } else if (gv >= 240) {
    grads = nullptr;  // nothing requested: valid
  }
  if (grads && gmf) LN_MUST_FAIL();
  te_linear_backward_args a;
  std::memset(&a, 0x55, sizeof a);
  FUZZ_ASSERT(TE_CALL(te_linear_backward_args_init, &a) == TE_SUCCESS && a.flags == 0, "te_linear_backward_args_init");
  const te_linear_backward_args *pa = &a;
  bool once = false;
  switch (R.pick(8)) {
    case 1: case 2: a.flags = TE_BACKWARD_ONCE; once = true; break;
    case 3: pa = nullptr; break;
    case 4: a.flags = 0x10; LN_MUST_FAIL(); break;
    case 5: a.struct_size = 1; LN_MUST_FAIL(); break;
    default: break;
  }
  // Every output's bytes before the call (the main_grads through their views).
  std::vector<Tensor *> outs = {&dx, &dgamma, &dbeta, &db1, &db2};
  for (Tensor *t : outs) t->snapshot();
  auto mg_bytes = [&](const Tensor &t, const Blob *mgb) {
    if (mgb && fuse) return mgb->snapshot();
    return t.data.snapshot();
  };
  const std::vector<uint8_t> w10 = mg_bytes(dw1, bufs ? &bufs->main_grad : nullptr),
                             w20 = mg_bytes(dw2, bufs && cfg.kind == 1 ? &bufs->main_grad2 : nullptr);
  void *module = nullptr;
  for (auto &M : ln_)
    if (M.live && M.ctx == B.ctx && bufs && M.bufs == bufs) module = M.h;
  const bool check_state = module && ctx_live(B.ctx);
  const std::vector<uint8_t> st_before = check_state ? ln_state(ctx_of(B.ctx), module, cfg.kind) : std::vector<uint8_t>();
  auto run = [&](const void *g) {
    return kind == 0 ? TE_CALL(te_layernorm_linear_backward, ctx, static_cast<te_layernorm_linear_backward_ctx *>(h), pdy,
                               static_cast<const te_layernorm_linear_grads *>(g), pa)
                     : TE_CALL(te_layernorm_mlp_backward, ctx, static_cast<te_layernorm_mlp_backward_ctx *>(h), pdy,
                               static_cast<const te_layernorm_mlp_grads *>(g), pa);
  };
  const te_status s = run(grads);
  const char *fn = kind == 0 ? "te_layernorm_linear_backward" : "te_layernorm_mlp_backward";
  if (mf)
    FUZZ_ASSERT(s != TE_SUCCESS, "%s accepted what it must reject: stale %d, once_done %d, handle %s, ctx slot %d (made on %d)",
                fn, !B.live, B.once_done, h == B.h ? "the slot's" : "another", cs, B.ctx);
  if (s != TE_SUCCESS) {
    for (Tensor *t : outs) t->check_untouched(fn, "a gradient");
    FUZZ_ASSERT(mg_bytes(dw1, bufs ? &bufs->main_grad : nullptr) == w10, "%s failed but wrote dw / dfc1_weight", fn);
    FUZZ_ASSERT(mg_bytes(dw2, bufs && cfg.kind == 1 ? &bufs->main_grad2 : nullptr) == w20, "%s failed but wrote dfc2_weight", fn);
    if (check_state)
      FUZZ_ASSERT(ln_state(ctx_of(B.ctx), module, cfg.kind) == st_before, "%s failed but changed the module's state", fn);
    return;
  }
  if (once) {
    B.once_done = true;
    return;
  }
  // Retain-graph: the same backward again writes the same gradients (the weight gradients only
  // when not accumulating into main_grads).
  if (R.u8() >= 160 && grads) {
    std::vector<std::vector<uint8_t>> first;
    for (Tensor *t : outs) first.push_back(t->data.snapshot());
    const std::vector<uint8_t> w11 = dw1.data.snapshot(), w21 = dw2.data.snapshot();
    if (fuse) {
      lg.dw = mg.dfc1_weight = nullptr;
      mg.dfc2_weight = nullptr;
    }
    FUZZ_ASSERT(run(grads) == TE_SUCCESS, "%s failed when repeated", fn);
    for (size_t i = 0; i < outs.size(); ++i)
      FUZZ_ASSERT(outs[i]->data.equals(first[i]), "a repeated %s wrote another gradient (#%zu)", fn, i);
    if (!fuse) FUZZ_ASSERT(dw1.data.equals(w11) && dw2.data.equals(w21), "a repeated %s wrote another weight gradient", fn);
  }
}

inline void Program::ln_backward_destroy() {
  LnBwdSlot &B = ln_bwd_[R.pick(kLnBwdSlots)];
  if (B.live) {
    if (R.u8() >= 200) ln_destroy_backward(B.h, 1 - B.cfg.kind);  // the other kind's destroy: ignored
    ln_destroy_backward(B.h, B.cfg.kind);
    B.live = false;  // the handle stays in the slot: later uses are stale
  } else {
    ln_destroy_backward(B.h, B.cfg.kind);  // destroyed before, or NULL: a no-op
  }
}

// State: save and load back (a round trip), corrupted buffers, scaling-state reads.
inline void Program::ln_state_op() {
  bool mf = false;
  int ms;
  void *mh = ln_arg(mf, ms);
  const int mctx = ms >= 0 && ln_[ms].h ? ln_[ms].ctx : 0;
  const int kind = ms >= 0 && ln_[ms].h ? ln_[ms].cfg.kind : R.u8() % 2;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, mctx);
  if (cs != mctx) LN_MUST_FAIL();
  const bool live = !mf;
  const std::vector<uint8_t> before = live ? ln_state(ctx, mh, kind) : std::vector<uint8_t>();
  auto save = [&](void *buf, size_t cap, size_t *n) {
    return kind == 0 ? TE_CALL(te_layernorm_linear_state_save, ctx, static_cast<te_layernorm_linear *>(mh), buf, cap, n)
                     : TE_CALL(te_layernorm_mlp_state_save, ctx, static_cast<te_layernorm_mlp *>(mh), buf, cap, n);
  };
  switch (R.pick(3)) {
    case 0: {  // save (maybe short), load it back
      size_t n = 7;
      const bool null_size = R.u8() >= 250;
      te_status s = save(nullptr, 0, null_size ? nullptr : &n);
      if (mf || null_size) {
        FUZZ_ASSERT(s != TE_SUCCESS && n == 7, "layernorm state_save accepted bad arguments or wrote *size");
        return;
      }
      FUZZ_ASSERT(s == TE_SUCCESS && n == before.size(), "layernorm state_save size query");
      std::vector<uint8_t> buf(n, 0xA5);
      const size_t cap = R.u8() >= 230 ? n - 1 : n;
      size_t got = 0;
      s = save(buf.data(), cap, &got);
      if (cap < n) {
        FUZZ_ASSERT(s != TE_SUCCESS, "layernorm state_save wrote into a short buffer");
        FUZZ_ASSERT(std::all_of(buf.begin(), buf.end(), [](uint8_t c) { return c == 0xA5; }),
                    "layernorm state_save failed but wrote into buf");
        return;
      }
      FUZZ_ASSERT(s == TE_SUCCESS && got == n && buf == before, "layernorm state_save: another state than the query's");
      ln_load_and_check(ctx, mh, kind, buf, before);
      break;
    }
    case 1: {  // a corrupted buffer, or another module's (of the other kind, a te_linear's)
      if (!live) return;
      std::vector<uint8_t> buf = before;
      const uint32_t how = R.pick(5);
      if (how == 0 && !buf.empty()) buf.pop_back();
      else if (how == 1) buf.push_back(R.u8());
      else if (how == 2 && !buf.empty()) buf[R.pick(static_cast<uint32_t>(buf.size()))] ^= static_cast<uint8_t>(1u << R.pick(8));
      else if (how == 3) {
        for (auto &o : ln_)  // another live module's state (of either kind)
          if (o.live && o.h != mh && ctx_live(o.ctx)) {
            const std::vector<uint8_t> other = ln_state(ctx_of(o.ctx), o.h, o.cfg.kind);
            if (!other.empty()) buf = other;
            break;
          }
      } else {
        buf = std::vector<uint8_t>(buf.size(), R.u8());
      }
      ln_load_and_check(ctx, mh, kind, buf, before);
      break;
    }
    default: {  // one scaling state
      int gemm = static_cast<int>(R.pick(2));
      int role = static_cast<int>(R.pick(3));
      const uint8_t v = R.u8();
      if (v >= 250) {
        role = v % 2 ? 3 : -1;
        LN_MUST_FAIL();
      } else if (v >= 246 && kind == 1) {
        gemm = v % 2 ? 2 : -1;
        LN_MUST_FAIL();
      }
      te_tensor_role r;
      set_enum(r, role);
      te_mlp_gemm g;
      set_enum(g, gemm);
      te_scaling_state_info info;
      std::memset(&info, 0x77, sizeof info);
      info.struct_size = sizeof info;
      if (R.u8() >= 252) {
        info.struct_size = 4;
        LN_MUST_FAIL();
      }
      const std::vector<uint8_t> ibefore = bytes_of(&info, sizeof info);
      float hist[8];
      for (float &f : hist) f = -7.0f;
      const bool with_history = R.u8() >= 100;
      const te_status s =
          kind == 0 ? TE_CALL(te_layernorm_linear_get_scaling_state, ctx, static_cast<te_layernorm_linear *>(mh), r, &info,
                              with_history ? hist : nullptr, with_history ? 8 : 0)
                    : TE_CALL(te_layernorm_mlp_get_scaling_state, ctx, static_cast<te_layernorm_mlp *>(mh), g, r, &info,
                              with_history ? hist : nullptr, with_history ? 8 : 0);
      if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "layernorm get_scaling_state accepted bad arguments");
      if (s != TE_SUCCESS) {
        FUZZ_ASSERT(same_bytes(&info, ibefore), "layernorm get_scaling_state failed but wrote *info");
        for (float f : hist) FUZZ_ASSERT(f == -7.0f, "layernorm get_scaling_state failed but wrote history");
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

// Loads `buf` into the module: a success must save back to exactly `buf`; a failure changes
// nothing.
inline void Program::ln_load_and_check(te_context *ctx, void *h, int kind, const std::vector<uint8_t> &buf,
                                       const std::vector<uint8_t> &original) {
  const te_status s = kind == 0 ? TE_CALL(te_layernorm_linear_state_load, ctx, static_cast<te_layernorm_linear *>(h),
                                          buf.data(), buf.size())
                                : TE_CALL(te_layernorm_mlp_state_load, ctx, static_cast<te_layernorm_mlp *>(h), buf.data(),
                                          buf.size());
  if (s == TE_SUCCESS) FUZZ_ASSERT(ln_state(ctx, h, kind) == buf, "layernorm state_load succeeded but saves back other bytes");
  else FUZZ_ASSERT(ln_state(ctx, h, kind) == original, "layernorm state_load failed but changed the state");
}

// The caller's rules when a context goes: its modules and backward contexts go first.
inline void Program::ln_drop_context(int slot) {
  for (auto &b : ln_bwd_)
    if (b.live && b.ctx == slot) {
      ln_destroy_backward(b.h, b.cfg.kind);
      b.live = false;
    }
  for (auto &m : ln_)
    if (m.live && m.ctx == slot) {
      ln_destroy_handle(m.h, m.cfg.kind);
      m.live = false;
      dead_ln_.push_back(m.h);
    }
}

}  // namespace fuzz
