// fuzz_api_sequence's operations on the residuals-in-the-caller's-memory calls (api_program.h):
// te_{linear,layernorm_linear,layernorm_mlp,grouped_linear}_residuals_size, _forward_compute_into
// and _backward_from, over slots of caller blocks (cr_): each holds the block one
// forward_compute_into filled, its layer and what the forward got.
//
//  - size: with the forward's tensors and with shape-only ones (data NULL): the same answer; 0
//    exactly when a linear or grouped linear forward would run in high precision, never 0 for
//    the norm modules; a failure leaves *bytes alone; NULLs and unknown struct sizes fail.
//  - forward_compute_into under the context's current autocast state, into a block of exactly
//    the size, larger, one byte too small, misaligned, NULL, or the block of an earlier forward
//    of the same layer (its record is replaced: that slot is handed over); a block too small,
//    misaligned or NULL where the size is not 0 must fail; a failure leaves the block, y and the
//    layer's state untouched.
//  - backward_from with the slot's block, with a block no forward filled (must fail), after a
//    TE_BACKWARD_ONCE one (must fail where a record existed), with the inputs given again, moved
//    to fresh memory (same values), NULL, or of another token count; unknown flags, dy of the
//    wrong rows, a stale layer or another context must fail; a failure leaves the gradients and
//    the layer's state untouched; a high-precision backward repeated with moved inputs gives the
//    same dx.
//  - destroying a layer whose records are pending (then every backward_from on it must fail);
//    teardown frees the blocks, LeakSanitizer checks the library's records went with the layers.
#pragma once

#include <cstdlib>

#include "api_program.h"

namespace fuzz {

#define CR_MUST_FAIL()                                                                      \
  do {                                                                                      \
    mf = true;                                                                              \
    if (tracing()) std::fprintf(stderr, "  (must fail: api_caller.h:%d)\n", __LINE__);     \
  } while (0)

inline te_tensor cr_view(void *data, int dt, int64_t rows, int64_t cols) {
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
  t.data = data;
  return t;
}

inline uint8_t *cr_alloc(size_t n) {  // 16-byte aligned, exactly n bytes for ASan (n > 0)
  void *p = nullptr;
  if (posix_memalign(&p, 16, n ? n : 1) != 0 || !p) std::abort();
  std::memset(p, 0xA5, n ? n : 1);
  return static_cast<uint8_t *>(p);
}

// The layer a caller-memory op works on: family 0 linear, 1 LayerNormLinear / MLP, 2 grouped.
inline bool Program::cr_layer(int family, int slot, CrLayer &L) {
  L = CrLayer();
  if (family == 0) {
    const LinSlot &S = lin_[slot % kLinearSlots];
    if (!S.h || !S.bufs || !S.cfg.small()) return false;
    L.kind = 0;
    L.h = S.h;
    L.live = S.live;
    L.ctx = S.ctx;
    L.in = S.cfg.in;
    L.out = S.cfg.out;
    L.bias = S.cfg.bias;
    L.dt = S.cfg.dtype;
    L.fuse = S.cfg.fuse;
    L.lb = S.bufs;
  } else if (family == 1) {
    const LnSlot &S = ln_[slot % kLnSlots];
    if (!S.h || !S.bufs || !S.cfg.small()) return false;
    L.kind = 1 + S.cfg.kind;
    L.h = S.h;
    L.live = S.live;
    L.ctx = S.ctx;
    L.in = S.cfg.in;
    L.out = S.cfg.out;
    L.bias = S.cfg.bias;
    L.dt = S.cfg.dtype;
    L.fuse = S.cfg.fuse;
    L.ln = S.cfg;
    L.nb = S.bufs;
  } else {
    const MoeSlot &S = moe_[slot % kMoeSlots];
    if (!S.h || !S.bufs || !S.cfg.small()) return false;
    L.kind = 3;
    L.h = S.h;
    L.live = S.live;
    L.ctx = S.ctx;
    L.in = S.cfg.in;
    L.out = S.cfg.out;
    L.bias = S.cfg.bias;
    L.dt = S.cfg.dtype;
    L.fuse = S.cfg.fuse;
    L.n = S.cfg.n;
    L.mb = S.bufs;
  }
  if (L.dt < TE_DTYPE_F32 || L.dt > TE_DTYPE_BF16) return false;
  return true;
}

// Whether handle h (of the layer's kind) is live now.
inline bool Program::cr_live(const CrLayer &L) const {
  if (L.kind == 0) {
    for (const auto &S : lin_)
      if (S.live && S.h == L.h) return true;
  } else if (L.kind == 3) {
    for (const auto &S : moe_)
      if (S.live && S.h == L.h) return true;
  } else {
    for (const auto &S : ln_)
      if (S.live && S.h == L.h) return true;
  }
  return false;
}

inline std::vector<uint8_t> Program::cr_state(const CrLayer &L) {
  if (!cr_live(L) || !ctx_live(L.ctx)) return {};
  te_context *c = ctx_of(L.ctx);
  if (L.kind == 0) return layer_state(c, static_cast<te_linear *>(L.h));
  if (L.kind == 3) return moe_state(c, static_cast<te_grouped_linear *>(L.h));
  return ln_state(c, L.h, L.kind - 1);
}

// The forward's arguments for layer L and `tokens` rows (grouped: `splits`). mode 0: the layer's
// parameters; 1: shape only (every data NULL); 2: moved (fresh copies of the same values).
inline void Program::cr_args(const CrLayer &L, int64_t tokens, const std::vector<int64_t> &splits, int mode,
                             CrArgs &A) {
  const int dt = L.dt;
  const size_t e = dtype_bytes(dt);
  auto src = [&](const Blob &b, Blob &copy) -> void * {
    if (mode == 1) return nullptr;
    if (mode == 0) return b.data();
    copy = Blob(b.size());
    if (b.size()) std::memcpy(copy.data(), b.data(), b.size());
    return copy.data();
  };
  Shape xs = shape2(tokens, L.in);
  if (L.kind == 0) {
    A.x = cr_view(src(L.lb->x, A.mx), dt, tokens, L.in);
    A.w = cr_view(src(L.lb->w, A.mw), dt, L.out, L.in);
    A.b = cr_view(src(L.lb->b, A.mb), dt, 0, L.out);
    te_linear_forward_args_init(&A.la);
    A.la.input = &A.x;
    A.la.weight = &A.w;
    A.la.bias = L.bias == 1 ? &A.b : nullptr;
  } else if (L.kind == 1 || L.kind == 2) {
    A.x = cr_view(src(L.nb->x, A.mx), dt, tokens, L.in);
    A.gamma = cr_view(src(L.nb->gamma, A.mg), dt, 0, L.in);
    A.beta = cr_view(src(L.nb->beta, A.mbeta), dt, 0, L.in);
    const te_tensor *pbeta = L.ln.norm == TE_NORM_LAYERNORM ? &A.beta : nullptr;
    if (L.kind == 1) {
      A.w = cr_view(src(L.nb->w, A.mw), dt, L.out, L.in);
      A.b = cr_view(src(L.nb->b, A.mb), dt, 0, L.out);
      te_layernorm_linear_forward_args_init(&A.nla);
      A.nla.input = &A.x;
      A.nla.ln_weight = &A.gamma;
      A.nla.ln_bias = pbeta;
      A.nla.weight = &A.w;
      A.nla.bias = L.bias == 1 ? &A.b : nullptr;
    } else {
      A.w = cr_view(src(L.nb->w, A.mw), dt, L.ln.fc1_rows(), L.in);
      A.b = cr_view(src(L.nb->b, A.mb), dt, 0, L.ln.fc1_rows());
      A.w2 = cr_view(src(L.nb->w2, A.mw2), dt, L.in, L.out);
      A.b2 = cr_view(src(L.nb->b2, A.mb2), dt, 0, L.in);
      te_layernorm_mlp_forward_args_init(&A.nma);
      A.nma.input = &A.x;
      A.nma.ln_weight = &A.gamma;
      A.nma.ln_bias = pbeta;
      A.nma.fc1_weight = &A.w;
      A.nma.fc1_bias = L.bias == 1 ? &A.b : nullptr;
      A.nma.fc2_weight = &A.w2;
      A.nma.fc2_bias = L.bias == 1 ? &A.b2 : nullptr;
    }
  } else {
    A.x = cr_view(src(L.mb->x, A.mx), dt, tokens, L.in);
    uint8_t *wd = static_cast<uint8_t *>(src(L.mb->w, A.mw));
    uint8_t *bd = static_cast<uint8_t *>(src(L.mb->b, A.mb));
    A.splits = splits;
    A.ew.assign(static_cast<size_t>(L.n), te_tensor{});
    A.eb.assign(static_cast<size_t>(L.n), te_tensor{});
    A.ewp.clear();
    A.ebp.clear();
    for (int i = 0; i < L.n; ++i) {
      A.ew[static_cast<size_t>(i)] =
          cr_view(wd ? wd + static_cast<size_t>(i * L.out * L.in) * e : nullptr, dt, L.out, L.in);
      A.eb[static_cast<size_t>(i)] = cr_view(bd ? bd + static_cast<size_t>(i * L.out) * e : nullptr, dt, 0, L.out);
      A.ewp.push_back(&A.ew[static_cast<size_t>(i)]);
      A.ebp.push_back(&A.eb[static_cast<size_t>(i)]);
    }
    te_grouped_linear_forward_args_init(&A.ga);
    A.ga.input = &A.x;
    A.ga.m_splits = A.splits.data();
    A.ga.weights = A.ewp.data();
    A.ga.biases = L.bias == 1 ? A.ebp.data() : nullptr;
  }
  for (int i = 0; i < A.x.ndim; ++i) A.x.shape[i] = xs.d[i];
  A.x.device.type = A.w.device.type = A.b.device.type = A.w2.device.type = A.b2.device.type = TE_DEVICE_CPU;
  A.gamma.device.type = A.beta.device.type = TE_DEVICE_CPU;
  for (auto &t : A.ew) t.device.type = TE_DEVICE_CPU;
  for (auto &t : A.eb) t.device.type = TE_DEVICE_CPU;
}

inline const void *CrArgs::args(int kind) const {
  switch (kind) {
    case 0: return &la;
    case 1: return &nla;
    case 2: return &nma;
    default: return &ga;
  }
}

inline te_status Program::cr_size_call(int kind, te_context *ctx, void *h, const void *a, size_t *bytes) {
  switch (kind) {
    case 0:
      return TE_CALL(te_linear_residuals_size, ctx, static_cast<const te_linear *>(h),
                     static_cast<const te_linear_forward_args *>(a), bytes);
    case 1:
      return TE_CALL(te_layernorm_linear_residuals_size, ctx, static_cast<const te_layernorm_linear *>(h),
                     static_cast<const te_layernorm_linear_forward_args *>(a), bytes);
    case 2:
      return TE_CALL(te_layernorm_mlp_residuals_size, ctx, static_cast<const te_layernorm_mlp *>(h),
                     static_cast<const te_layernorm_mlp_forward_args *>(a), bytes);
    default:
      return TE_CALL(te_grouped_linear_residuals_size, ctx, static_cast<const te_grouped_linear *>(h),
                     static_cast<const te_grouped_linear_forward_args *>(a), bytes);
  }
}

// Picks a layer (family and slot from the input); false when that slot has none usable.
inline bool Program::cr_pick(CrLayer &L, int64_t &tokens, std::vector<int64_t> &splits, bool &mf) {
  const int family = static_cast<int>(R.pick(3));
  const int slot = static_cast<int>(R.pick(4));
  if (!cr_layer(family, slot, L)) return false;
  if (!L.live) CR_MUST_FAIL();
  static const int64_t kTok[8] = {16, 32, 48, 64, 16, 5, 1, 17};
  if (L.kind == 3) {
    bool smf = false;
    splits = moe_splits(L.n, tokens, smf);
    if (smf) CR_MUST_FAIL();
  } else {
    tokens = kTok[R.pick(8)];
  }
  return true;
}

inline void Program::cr_size() {
  bool mf = false;
  CrLayer L;
  int64_t tokens = 16;
  std::vector<int64_t> splits;
  if (!cr_pick(L, tokens, splits, mf)) return;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, L.ctx);
  if (cs != L.ctx) CR_MUST_FAIL();
  CrArgs full, shape_only;
  cr_args(L, tokens, splits, 0, full);
  cr_args(L, tokens, splits, 1, shape_only);
  const uint8_t v = R.u8();
  const bool null_args = v >= 250 && v < 252, null_bytes = v >= 252 && v < 254, small_args = v >= 254;
  if (null_args || null_bytes || small_args) CR_MUST_FAIL();
  if (small_args) {
    full.la.struct_size = shape_only.la.struct_size = 8;
    full.nla.struct_size = shape_only.nla.struct_size = 8;
    full.nma.struct_size = shape_only.nma.struct_size = 8;
    full.ga.struct_size = shape_only.ga.struct_size = 8;
  }
  const size_t kSent = 0x5EA5EA5EA5EA5EA5ull;
  size_t b1 = kSent, b2 = kSent;
  const te_status s1 = cr_size_call(L.kind, ctx, L.h, null_args ? nullptr : full.args(L.kind), null_bytes ? nullptr : &b1);
  const te_status s2 =
      cr_size_call(L.kind, ctx, L.h, null_args ? nullptr : shape_only.args(L.kind), null_bytes ? nullptr : &b2);
  if (mf) FUZZ_ASSERT(s1 != TE_SUCCESS && s2 != TE_SUCCESS, "residuals_size (kind %d) accepted what it must reject", L.kind);
  FUZZ_ASSERT(s1 == s2, "residuals_size (kind %d): %s with the tensors' data, %s with shapes only", L.kind,
              te_status_string(s1), te_status_string(s2));
  if (s1 != TE_SUCCESS) {
    FUZZ_ASSERT(b1 == kSent && b2 == kSent, "residuals_size (kind %d) failed but wrote *bytes", L.kind);
    return;
  }
  FUZZ_ASSERT(b1 == b2, "residuals_size (kind %d): %zu bytes with the data, %zu with shapes only", L.kind, b1, b2);
  const int fp8 = fp8_scope(cs);
  if ((L.kind == 0 || L.kind == 3) && fp8 == 0)
    FUZZ_ASSERT(b1 == 0, "residuals_size (kind %d) outside an FP8 scope: %zu bytes, not 0", L.kind, b1);
  if (L.kind == 1 || L.kind == 2 || (L.kind == 0 && fp8 != 0))
    FUZZ_ASSERT(b1 > 0, "residuals_size (kind %d, fp8 %d): 0 bytes", L.kind, fp8);
}

inline void Program::cr_clear(CrSlot &S) {
  std::free(S.mem);
  S = CrSlot();
}

inline void Program::cr_forward() {
  const int rs = static_cast<int>(R.pick(kCrSlots));  // first: seeds name it
  bool mf = false;
  CrLayer L;
  int64_t tokens = 16;
  std::vector<int64_t> splits;
  if (!cr_pick(L, tokens, splits, mf)) return;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, L.ctx);
  if (cs != L.ctx) CR_MUST_FAIL();
  CrArgs A;
  cr_args(L, tokens, splits, 0, A);
  // The size, asked as the caller would (with the layer's context).
  size_t need = 0;
  te_status ss = TE_SUCCESS;
  if (L.live && ctx_live(L.ctx))
    ss = cr_size_call(L.kind, ctx_of(L.ctx), L.h, A.args(L.kind), &need);
  else
    ss = TE_ERROR_INVALID_ARGUMENT;
  if (ss != TE_SUCCESS) {
    CR_MUST_FAIL();  // the forward checks what the size query checks
    need = 256;
  }
  const int expect_fp8 = fp8_scope(cs);
  Tensor y;
  const int64_t ycols = L.kind == 2 ? L.in : L.out;
  bool odd = false;
  make(y, pick_dtype(L.dt, odd), shape2(tokens, ycols));
  if (get_enum(y.t.dtype) != L.dt) CR_MUST_FAIL();
  // The block.
  uint8_t *mem = nullptr;     // what this call allocated
  uint8_t *block = nullptr;   // what it passes
  size_t bytes = need;
  int reuse = -1;
  const uint8_t b = R.u8();
  const int how = b < 180 ? 0 : b < 200 ? 1 : b < 215 ? 2 : b < 230 ? 3 : b < 240 ? 4 : 5;
  switch (how) {
    case 0: if (need) block = mem = cr_alloc(need); break;  // exact
    case 1: bytes = need + 48; block = mem = cr_alloc(bytes); break;  // larger
    case 2:  // one byte short
      if (need) {
        bytes = need - 1;
        block = mem = cr_alloc(bytes ? bytes : 1);
        CR_MUST_FAIL();
      }
      break;
    case 3:  // misaligned
      if (need) {
        mem = cr_alloc(need + 16);
        block = mem + 8;
        CR_MUST_FAIL();
      }
      break;
    case 4:  // NULL
      if (need) CR_MUST_FAIL();
      break;
    default:  // the block of an earlier forward of this layer: its record is replaced
      for (int i = 0; i < kCrSlots; ++i)
        if (cr_[i].filled && cr_[i].layer.h == L.h && cr_[i].mem && cr_[i].bytes >= need && need) reuse = i;
      if (reuse >= 0) {
        block = cr_[reuse].mem;
        bytes = cr_[reuse].bytes;
      } else if (need) {
        block = mem = cr_alloc(need);
      }
      break;
  }
  const std::vector<uint8_t> blk_before = block ? bytes_of(block, bytes) : std::vector<uint8_t>();
  y.snapshot();
  const std::vector<uint8_t> st_before = cr_state(L);
  te_tensor *py = &y.t;
  if (R.u8() >= 252) {
    py = nullptr;
    CR_MUST_FAIL();
  }
  te_status s;
  switch (L.kind) {
    case 0: s = TE_CALL(te_linear_forward_compute_into, ctx, static_cast<te_linear *>(L.h), &A.la, py, block, bytes); break;
    case 1:
      s = TE_CALL(te_layernorm_linear_forward_compute_into, ctx, static_cast<te_layernorm_linear *>(L.h), &A.nla, py,
                  block, bytes);
      break;
    case 2:
      s = TE_CALL(te_layernorm_mlp_forward_compute_into, ctx, static_cast<te_layernorm_mlp *>(L.h), &A.nma, py, block,
                  bytes);
      break;
    default:
      s = TE_CALL(te_grouped_linear_forward_compute_into, ctx, static_cast<te_grouped_linear *>(L.h), &A.ga, py,
                  block, bytes);
      break;
  }
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "forward_compute_into (kind %d, block case %d, need %zu, passed %zu) accepted what it must reject", L.kind, how, need, bytes);
  if (s != TE_SUCCESS) {
    if (block) FUZZ_ASSERT(same_bytes(block, blk_before), "forward_compute_into (kind %d) failed but wrote the residual block", L.kind);
    y.check_untouched("forward_compute_into", "y");
    FUZZ_ASSERT(cr_state(L) == st_before, "forward_compute_into (kind %d) failed but changed the layer's state", L.kind);
    std::free(mem);
    return;
  }
  CrSlot &S = cr_[rs];
  if (reuse >= 0) {  // the block moves to slot rs (the old slot's record is gone)
    uint8_t *keep = cr_[reuse].mem;
    cr_[reuse].mem = nullptr;
    cr_clear(cr_[reuse]);
    if (reuse != rs) cr_clear(S);
    mem = keep;
  } else {
    cr_clear(S);
  }
  S.filled = true;
  S.layer = L;
  S.ctx = cs;
  S.tokens = tokens;
  S.splits = splits;
  S.mem = mem;
  S.block = block;
  S.bytes = block ? bytes : 0;
  S.fp8 = (L.kind == 0 || L.kind == 3) ? (need > 0) : expect_fp8;
}

inline void Program::cr_backward() {
  bool mf = false;
  const int rs = static_cast<int>(R.pick(kCrSlots));
  CrSlot &S = cr_[rs];
  if (!S.filled) return;
  const CrLayer &L = S.layer;
  if (!cr_live(L)) CR_MUST_FAIL();
  int cs;
  te_context *ctx = ctx_arg(mf, cs, S.ctx);
  if (cs != S.ctx) CR_MUST_FAIL();
  // Records: after a TE_BACKWARD_ONCE the block names nothing.
  const bool had_record = S.block != nullptr;
  if (S.once_done && had_record) CR_MUST_FAIL();
  // The block: the slot's, or one no forward filled.
  const void *block = S.block;
  size_t bytes = S.bytes;
  uint8_t *fresh = nullptr;
  const uint8_t bv = R.u8();
  if (bv >= 245) {
    fresh = cr_alloc(S.bytes ? S.bytes : 256);
    block = fresh;
    bytes = S.bytes ? S.bytes : 256;
    CR_MUST_FAIL();
  }
  // The inputs: as the forward got them, moved, NULL, or of another token count.
  CrArgs A;
  const uint8_t iv = R.u8();
  int64_t in_tokens = S.tokens;
  std::vector<int64_t> splits = S.splits;
  const bool null_inputs = iv >= 240 && iv < 248;
  if (iv >= 248 && S.fp8 == 1 && L.kind != 3) {
    in_tokens = S.tokens == 16 ? 32 : 16;
    CR_MUST_FAIL();
  }
  cr_args(L, in_tokens, splits, iv >= 128 && iv < 240 ? 2 : 0, A);
  if (null_inputs && (L.kind == 1 || L.kind == 2 || (L.kind == 0 && !had_record) || (L.kind == 3 && !had_record)))
    CR_MUST_FAIL();
  const int dt = L.dt;
  const int64_t ycols = L.kind == 2 ? L.in : L.out;
  int64_t dy_rows = S.tokens;
  if (R.u8() >= 248) {
    dy_rows = S.tokens == 16 ? 32 : 16;
    CR_MUST_FAIL();
  }
  Tensor dy, dx;
  make(dy, dt, shape2(dy_rows, ycols));
  make(dx, dt, shape2(S.tokens, L.in));
  te_tensor *pdx = R.u8() >= 230 ? nullptr : &dx.t;
  te_linear_backward_args a;
  te_linear_backward_args_init(&a);
  const te_linear_backward_args *pa = &a;
  bool once = false;
  switch (R.pick(8)) {
    case 1: case 2: a.flags = TE_BACKWARD_ONCE; once = true; break;
    case 3: pa = nullptr; break;
    case 4: a.flags = 4; CR_MUST_FAIL(); break;
    case 5: a.struct_size = 0; CR_MUST_FAIL(); break;
    default: break;
  }
  dx.snapshot();
  const std::vector<uint8_t> st_before = cr_state(L);
  auto call = [&](const CrArgs *in, te_tensor *dxp) -> te_status {
    const void *ia = in ? in->args(L.kind) : nullptr;
    switch (L.kind) {
      case 0:
        return TE_CALL(te_linear_backward_from, ctx, static_cast<te_linear *>(L.h),
                       static_cast<const te_linear_forward_args *>(ia), block, bytes, &dy.t, dxp, nullptr, nullptr, pa);
      case 1: {
        te_layernorm_linear_grads g;
        te_layernorm_linear_grads_init(&g);
        g.dx = dxp;
        return TE_CALL(te_layernorm_linear_backward_from, ctx, static_cast<te_layernorm_linear *>(L.h),
                       static_cast<const te_layernorm_linear_forward_args *>(ia), block, bytes, &dy.t, &g, pa);
      }
      case 2: {
        te_layernorm_mlp_grads g;
        te_layernorm_mlp_grads_init(&g);
        g.dx = dxp;
        return TE_CALL(te_layernorm_mlp_backward_from, ctx, static_cast<te_layernorm_mlp *>(L.h),
                       static_cast<const te_layernorm_mlp_forward_args *>(ia), block, bytes, &dy.t, &g, pa);
      }
      default:
        return TE_CALL(te_grouped_linear_backward_from, ctx, static_cast<te_grouped_linear *>(L.h),
                       static_cast<const te_grouped_linear_forward_args *>(ia), block, bytes, &dy.t, dxp, nullptr,
                       nullptr, pa);
    }
  };
  const te_status s = call(null_inputs ? nullptr : &A, pdx);
  if (mf)
    FUZZ_ASSERT(s != TE_SUCCESS,
                "backward_from (kind %d) accepted what it must reject: live %d, ctx %d (forward's %d), once_done %d, "
                "record %d, fresh block %d, inputs %s, tokens %lld (forward %lld), dy rows %lld, flags 0x%x",
                L.kind, cr_live(L), cs, S.ctx, S.once_done, had_record, fresh != nullptr,
                null_inputs ? "NULL" : "given", (long long)in_tokens, (long long)S.tokens, (long long)dy_rows,
                a.flags);
  if (s != TE_SUCCESS) {
    dx.check_untouched("backward_from", "dx");
    FUZZ_ASSERT(cr_state(L) == st_before, "backward_from (kind %d) failed but changed the layer's state", L.kind);
    std::free(fresh);
    return;
  }
  std::free(fresh);
  if (once) {
    S.once_done = true;
    return;
  }
  // High precision: repeated with the inputs moved, the same dx.
  if (S.fp8 == 0 && pdx && !null_inputs && !fresh) {
    CrArgs moved;
    cr_args(L, in_tokens, splits, 2, moved);
    Tensor dx2;
    make(dx2, dt, shape2(S.tokens, L.in));
    const te_status s2 = call(&moved, &dx2.t);
    FUZZ_ASSERT(s2 == TE_SUCCESS, "backward_from (kind %d) repeated with moved inputs: %s", L.kind, te_status_string(s2));
    FUZZ_ASSERT(std::memcmp(dx.data.data(), dx2.data.data(), dx.data.size()) == 0,
                "backward_from (kind %d, high precision) repeated with moved inputs gave another dx", L.kind);
  }
}

// Destroys the layer of a slot whose record is pending (its later backward_from must fail).
inline void Program::cr_destroy() {
  CrSlot &S = cr_[R.pick(kCrSlots)];
  if (!S.filled || !cr_live(S.layer)) return;
  const CrLayer &L = S.layer;
  if (L.kind == 0) {
    for (auto &l : lin_)
      if (l.live && l.h == L.h) {
        te_linear_destroy(l.h);
        dead_lin_.push_back(l.h);
        l.live = false;
      }
  } else if (L.kind == 3) {
    for (auto &m : moe_)
      if (m.live && m.h == L.h) {
        te_grouped_linear_destroy(m.h);
        dead_moe_.push_back(m.h);
        m.live = false;
      }
  } else {
    for (auto &m : ln_)
      if (m.live && m.h == L.h) {
        ln_destroy_handle(m.h, m.cfg.kind);
        dead_ln_.push_back(m.h);
        m.live = false;
      }
  }
}

}  // namespace fuzz
