// fuzz_api_sequence's operations on te_attention and te_rope (api_program.h). Create and destroy
// with fuzzed options (heads, kv heads, head_dim, softmax scale, mask, dtype, fp8, a short struct,
// NULL options or out); forwards (split: compute then save or release; fused) in BSHD and THD with
// fuzzed lengths and offsets (decreasing, not starting at 0, not ending at the token count,
// beyond max_seqlen, INT32_MIN / INT32_MAX entries, one without the other, other dtypes, counts
// and shapes: a CPU context must reject every one), heads and head_dim off the module's, other
// dtypes, malformed tensors, inside whatever autocast scope is open (FP8 when the module has fp8
// = 1); backward (any subset of dq, dk, dv, misshapen ones, TE_BACKWARD_ONCE, unknown flags,
// stale and wrong-type contexts) repeated; residuals in the caller's memory (size query with
// shape-only q, k, v; exactly sized, short, misaligned and NULL blocks; backward_from with the
// inputs moved, of other lengths, for a block no forward filled, after a TE_BACKWARD_ONCE one, on
// a destroyed module); state save / load and scaling-state reads; RoPE forward / backward with
// fuzzed shapes, rot_dim, interleaving, freqs and offsets.
//
// Besides the common checks (a call the header rejects fails; a failed call leaves its outputs,
// the residuals struct and the module's state untouched), successful calls are checked against
// the header: residuals.fp8 is the scope's mode for an fp8 module (0 otherwise), the LSE view is
// F32 [tokens_q, heads], a high-precision forward repeated writes the same o, a repeated backward
// the same gradients, the caller-memory path the same o and gradients as the opaque one, a loaded
// state saves back to the same bytes, RoPE in place equals RoPE out of place and its backward
// inverts its forward (F32).
#pragma once

#include "api_program.h"

namespace fuzz {

#define AT_MUST_FAIL()                                                                     \
  do {                                                                                     \
    mf = true;                                                                             \
    if (tracing()) std::fprintf(stderr, "  (must fail: api_attention.h:%d)\n", __LINE__); \
  } while (0)

inline te_attention *Program::attn_arg(bool &mf, int &slot) {
  const uint8_t v = R.u8();
  slot = -1;
  if (v < 245) {
    slot = v % kAttnSlots;
    if (!attn_[slot].live) AT_MUST_FAIL();
    return attn_[slot].h;
  }
  AT_MUST_FAIL();
  if (v < 249) return nullptr;
  if (!dead_attn_.empty() && v < 252) return dead_attn_[R.pick(static_cast<uint32_t>(dead_attn_.size()))];
  return static_cast<te_attention *>(some_live_handle(9));
}

inline std::vector<uint8_t> Program::attn_state(te_context *ctx, te_attention *m) {
  size_t n = 0;
  if (te_attention_state_save(ctx, m, nullptr, 0, &n) != TE_SUCCESS || n == 0 || n > (1u << 22)) return {};
  std::vector<uint8_t> buf(n);
  size_t n2 = 0;
  if (te_attention_state_save(ctx, m, buf.data(), n, &n2) != TE_SUCCESS)
    violation("te_attention_state_save failed after a size query");
  FUZZ_ASSERT(n2 == n, "te_attention_state_save: size %zu after a query of %zu", n2, n);
  return buf;
}

inline void Program::attn_create() {
  const int slot = static_cast<int>(R.pick(kAttnSlots));
  AttnSlot &M = attn_[slot];
  if (M.live) {
    te_attention_destroy(M.h);  // backward contexts and records keep what they need
    dead_attn_.push_back(M.h);
    M.live = false;
  }
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  AttnCfg c;
  static const int kHeads[8] = {2, 1, 4, 3, 2, 8, 0, -1};
  const uint8_t h = R.u8();
  c.heads = kHeads[h < 200 ? h % 4 : 4 + h % 4];
  if (c.heads < 1) AT_MUST_FAIL();
  const uint8_t kv = R.u8();
  c.kv = kv < 100 ? 0 : kv < 200 ? 1 : kv < 230 ? c.heads : kv < 240 ? 3 : kv < 250 ? -1 : INT32_MIN;
  const int kv_eff = c.kv ? c.kv : c.heads;
  if (c.heads >= 1 && (kv_eff < 1 || kv_eff > c.heads || c.heads % kv_eff)) AT_MUST_FAIL();
  static const int kHd[8] = {8, 16, 32, 64, 4, 12, 264, 0};
  const uint8_t d = R.u8();
  c.hd = kHd[d < 230 ? d % 4 : 4 + d % 4];
  if (c.hd < 8 || c.hd > 256 || c.hd % 8) AT_MUST_FAIL();
  static const float kScale[8] = {0.0f, 0.25f, 1.0f, 1e-3f, -1.0f, NAN, INFINITY, -0.0f};
  const uint8_t sc = R.u8();
  c.scale = kScale[sc < 200 ? sc % 4 : 4 + sc % 4];
  if (!(c.scale >= 0.0f) || std::isinf(c.scale)) AT_MUST_FAIL();
  const uint8_t mk = R.u8();
  c.mask = mk < 250 ? mk % 3 : mk % 2 ? 3 : -1;
  if (c.mask < 0 || c.mask > 2) AT_MUST_FAIL();
  static const int kDt[6] = {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16, TE_DTYPE_E4M3, TE_DTYPE_I32, -2};
  const uint8_t dt = R.u8();
  c.dtype = kDt[dt < 120 ? 0 : dt < 190 ? 1 : dt < 245 ? 2 : 3 + dt % 3];
  if (c.dtype > TE_DTYPE_BF16 || c.dtype < 0) AT_MUST_FAIL();
  const uint8_t f = R.u8();
  c.fp8 = f < 140 ? 0 : f < 250 ? 1 : 2;
  if (c.fp8 == 2) AT_MUST_FAIL();
  const uint8_t x = R.u8();
  const bool small_struct = x >= 252, null_opts = x >= 248 && x < 250, null_out = x >= 250 && x < 252;
  if (small_struct || null_opts || null_out) AT_MUST_FAIL();
  te_attention_options o;
  std::memset(&o, 0x6B, sizeof o);
  FUZZ_ASSERT(TE_CALL(te_attention_options_init, &o) == TE_SUCCESS, "te_attention_options_init failed");
  FUZZ_ASSERT(o.struct_size == sizeof o && o.num_heads == 0 && o.num_kv_heads == 0 && o.head_dim == 0 &&
                  o.softmax_scale == 0.0f && get_enum(o.mask) == TE_ATTN_MASK_NONE &&
                  get_enum(o.activation_dtype) == TE_DTYPE_BF16 && o.fp8 == 0,
              "te_attention_options_init defaults");
  o.num_heads = c.heads;
  o.num_kv_heads = c.kv;
  o.head_dim = c.hd;
  o.softmax_scale = c.scale;
  set_enum(o.mask, c.mask);
  set_enum(o.activation_dtype, c.dtype);
  o.fp8 = c.fp8;
  if (small_struct) o.struct_size = sizeof o - 4;
  te_attention *out = sentinel<te_attention>();
  const te_status s = TE_CALL(te_attention_create, null_out ? nullptr : &out, ctx, null_opts ? nullptr : &o);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_attention_create accepted invalid arguments");
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(out == sentinel<te_attention>(), "te_attention_create failed but wrote *out");
    return;
  }
  c.kv = kv_eff;
  M.h = out;
  M.live = true;
  M.ctx = cs;
  M.cfg = c;
}

inline void Program::attn_destroy() {
  const uint8_t v = R.u8();
  if (v >= 250) {
    te_attention_destroy(nullptr);
    return;
  }
  AttnSlot &M = attn_[v % kAttnSlots];
  if (!M.live) return;
  te_attention_destroy(M.h);
  dead_attn_.push_back(M.h);
  M.live = false;
}

// Sequence lengths and the forward's tensors for module configuration `c` (or a stand-in 2 x 1
// x 8 F32 when the module argument is unusable); every perturbation the header rejects on a CPU
// context sets mf. The tensors live until the end of the program (residuals reference them).
inline Program::AttnIn *Program::attn_inputs(const AttnCfg &c, bool &mf, bool allow_perturb) {
  attn_keep_.push_back(std::make_unique<AttnIn>());
  AttnIn &I = *attn_keep_.back();
  I.cfg = c;
  I.thd = R.u8() < 150;
  const int64_t batch = 1 + R.pick(3);
  int64_t max_q = 0, max_kv = 0;
  if (I.thd) {
    int64_t tq = 0, tkv = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t lq = static_cast<int32_t>(R.pick(7)), lkv = static_cast<int32_t>(R.pick(7));
      I.lens_q.push_back(lq);
      I.lens_kv.push_back(lkv);
      tq += lq;
      tkv += lkv;
      max_q = std::max<int64_t>(max_q, lq);
      max_kv = std::max<int64_t>(max_kv, lkv);
    }
    if (tq == 0) { I.lens_q[0] = 1; tq = 1; max_q = std::max<int64_t>(max_q, 1); }
    if (tkv == 0) { I.lens_kv[0] = 1; tkv = 1; max_kv = std::max<int64_t>(max_kv, 1); }
    I.tq = tq;
    I.tkv = tkv;
  } else {
    max_q = 1 + R.pick(6);
    max_kv = R.u8() < 160 ? max_q : 1 + R.pick(6);
    I.tq = batch * max_q;
    I.tkv = batch * max_kv;
  }
  I.batch = batch;
  I.max_q = max_q;
  I.max_kv = max_kv;
  const int64_t elems = I.tq * c.heads * c.hd;
  if (elems > kMaxElems) return nullptr;
  auto shape_of = [&](int64_t tokens, int64_t seq, int64_t heads, int64_t hd) {
    Shape s;
    if (I.thd) {
      s.ndim = 3;
      s.d[0] = tokens;
      s.d[1] = heads;
      s.d[2] = hd;
    } else {
      s.ndim = 4;
      s.d[0] = batch;
      s.d[1] = seq;
      s.d[2] = heads;
      s.d[3] = hd;
    }
    return s;
  };
  int qh = c.heads, kvh = c.kv, hd = c.hd, qdt = c.dtype, kdt = c.dtype;
  if (allow_perturb) {
    const uint8_t p = R.u8();
    if (p >= 246) {
      switch (p - 246) {
        case 0: qh = c.heads + 1; break;
        case 1: kvh = c.kv + 1; break;
        case 2: hd = c.hd + 8; break;
        case 3: qdt = c.dtype == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32; break;
        case 4: kdt = c.dtype == TE_DTYPE_F16 ? TE_DTYPE_BF16 : TE_DTYPE_F16; break;
        case 5: qdt = TE_DTYPE_I32; break;
        default: break;
      }
      if (p - 246 <= 5) AT_MUST_FAIL();
    }
  }
  make(I.q, qdt, shape_of(I.tq, max_q, qh, hd));
  make(I.k, kdt, shape_of(I.tkv, max_kv, kvh, c.hd));
  make(I.v, c.dtype, shape_of(I.tkv, max_kv, kvh, c.hd));
  make(I.o, c.dtype, shape_of(I.tq, max_q, c.heads, c.hd));
  if (allow_perturb) {
    for (Tensor *t : {&I.q, &I.k, &I.v, &I.o}) {
      const int nd = t->t.ndim;
      maybe_malform(*t);
      if (t->malformed || t->t.ndim != nd) AT_MUST_FAIL();
    }
    if (R.u8() >= 250) {  // v not like k
      make(I.v, c.dtype, shape_of(I.tkv + 1, max_kv + 1, kvh, c.hd));
      AT_MUST_FAIL();
    }
  }
  I.a = te_attention_forward_args{};
  I.a.struct_size = sizeof I.a;
  I.a.q = &I.q.t;
  I.a.k = &I.k.t;
  I.a.v = &I.v.t;
  if (I.thd) {
    auto offsets = [&](Tensor &t, const std::vector<int32_t> &lens) {
      make(t, TE_DTYPE_I32, shape1(static_cast<int64_t>(lens.size()) + 1));
      int32_t acc = 0;
      std::memcpy(t.data.data(), &acc, 4);
      for (size_t i = 0; i < lens.size(); ++i) {
        acc += lens[i];
        std::memcpy(t.data.data() + 4 * (i + 1), &acc, 4);
      }
    };
    offsets(I.cq, I.lens_q);
    offsets(I.ckv, I.lens_kv);
    I.a.cu_seqlens_q = &I.cq.t;
    I.a.cu_seqlens_kv = &I.ckv.t;
    I.a.max_seqlen_q = max_q;
    I.a.max_seqlen_kv = max_kv;
    const uint8_t p = allow_perturb ? R.u8() : 0;
    if (p >= 220) {
      Tensor &t = p % 2 ? I.cq : I.ckv;
      int32_t *e = reinterpret_cast<int32_t *>(t.data.data());
      const int64_t n = t.shape.d[0];
      const int64_t at = static_cast<int64_t>(R.pick(static_cast<uint32_t>(n)));
      switch ((p - 220) / 2) {
        case 0: e[0] += 1 + R.pick(3); break;                          // not from 0
        case 1: e[n - 1] += R.u8() < 128 ? 1 : -1; break;               // not the token count
        case 2: if (n >= 3) { e[1] = e[n - 1] + 1; } else { e[0] = -1; } break;  // decreasing
        case 3: e[at] = INT32_MAX; if (at == 0 || n == 2) e[0] = INT32_MAX; break;
        case 4: e[at] = INT32_MIN; if (at == 0 || n == 2) e[0] = INT32_MIN; break;
        case 5: set_enum(t.t.dtype, TE_DTYPE_F32); break;
        case 6: t.t.ndim = 2; t.t.shape[1] = 1; break;
        case 7: t.t.shape[0] = 1; break;                                   // batch 0
        case 8: if (p % 2) I.a.max_seqlen_q = 0; else I.a.max_seqlen_kv = -1; break;
        case 9: if (p % 2) I.a.cu_seqlens_q = nullptr; else I.a.cu_seqlens_kv = nullptr; break;
        case 10: t.t.device.type = TE_DEVICE_CUDA; break;
        case 11: t.t.data = nullptr; break;
        case 12: t.t.shape[0] = n + 1; t.data = Blob(4 * static_cast<size_t>(n + 1)); t.t.data = t.data.data(); {
                   int32_t *f = reinterpret_cast<int32_t *>(t.data.data());
                   const std::vector<int32_t> &l = p % 2 ? I.lens_q : I.lens_kv;
                   f[0] = 0;
                   for (size_t i = 0; i < l.size(); ++i) f[i + 1] = f[i] + l[i];
                   f[n] = f[n - 1];  // one more (empty) sequence than the other offsets
                 } break;
        case 13: {  // a length above max_seqlen: lower the bound below the longest sequence
          int64_t &mx = p % 2 ? I.a.max_seqlen_q : I.a.max_seqlen_kv;
          if (mx >= 2) mx -= 1; else e[0] = 5;
          break;
        }
        default: break;
      }
      if ((p - 220) / 2 <= 13) AT_MUST_FAIL();
    } else if (allow_perturb && p >= 215) {
      // Leave the bound above the longest sequence (still <= the token count): valid.
      if (I.a.max_seqlen_q < I.tq) I.a.max_seqlen_q += 1;
    }
  } else if (allow_perturb && R.u8() >= 250) {
    // BSHD with one offsets tensor: one cu_seqlens without the other.
    std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(max_q));
    make(I.cq, TE_DTYPE_I32, shape1(batch + 1));
    for (int64_t i = 0; i <= batch; ++i) {
      const int32_t v = static_cast<int32_t>(i * max_q);
      std::memcpy(I.cq.data.data() + 4 * i, &v, 4);
    }
    I.a.cu_seqlens_q = &I.cq.t;
    AT_MUST_FAIL();
  }
  if (allow_perturb && R.u8() >= 252) {
    I.a.struct_size = 4;
    AT_MUST_FAIL();
  }
  return &I;
}

inline void Program::attn_fresh_bwd(te_attention_backward_ctx *h, int cs, const AttnCfg &c, AttnIn *in, int fp8) {
  int bs = static_cast<int>(R.pick(kAttnBwdSlots));
  AttnBwdSlot &B = attn_bwd_[bs];
  if (B.live) te_attention_backward_ctx_destroy(B.h);
  B.h = h;
  B.live = true;
  B.ctx = cs;
  B.cfg = c;
  B.in = in;
  B.fp8 = fp8;
  B.once_done = false;
}

// The mode the forward must take for module `c` in context slot cs: 1 FP8, 0 high precision, -1
// not asserted (an enabled scope that also calibrates, as api_linear.h leaves it).
inline int Program::attn_mode(const AttnCfg &c, int cs) const {
  if (c.fp8 != 1) return 0;
  const int f = fp8_scope(cs);
  return f < 0 ? -1 : f;
}

inline void Program::attn_forward() {
  bool mf = false;
  int ms;
  te_attention *m = attn_arg(mf, ms);
  int cs;
  te_context *ctx = ctx_arg(mf, cs, ms >= 0 ? attn_[ms].ctx : -1);
  const bool usable = ms >= 0 && attn_[ms].live;
  AttnCfg c = usable ? attn_[ms].cfg : AttnCfg{};
  if (usable && cs != attn_[ms].ctx) AT_MUST_FAIL();
  AttnIn *in = attn_inputs(c, mf, true);
  if (!in) return;
  const uint8_t kind = R.u8();  // < 110 compute (+ save or release), < 230 fused, else compute twice
  const bool null_args = R.u8() >= 252, null_o = R.u8() >= 252;
  if (null_args || null_o) AT_MUST_FAIL();
  const int mode = usable ? attn_mode(c, cs) : 0;
  const std::vector<uint8_t> st_before = usable && ctx_live(attn_[ms].ctx) ? attn_state(ctx_of(attn_[ms].ctx), m)
                                                                           : std::vector<uint8_t>();
  in->o.snapshot();
  const te_attention_forward_args *pa = null_args ? nullptr : &in->a;
  te_tensor *po = null_o ? nullptr : &in->o.t;
  auto failed = [&](const char *fn) {
    in->o.check_untouched(fn, "o");
    if (usable && ctx_live(attn_[ms].ctx) && !st_before.empty())
      FUZZ_ASSERT(attn_state(ctx_of(attn_[ms].ctx), m) == st_before, "%s failed but changed the module's state", fn);
  };
  if (kind < 110 || kind >= 230) {
    te_attention_residuals r;
    std::memset(&r, 0x5A, sizeof r);
    r.struct_size = sizeof r;
    const bool null_res = R.u8() >= 252;
    if (null_res) AT_MUST_FAIL();
    const std::vector<uint8_t> rbefore = bytes_of(&r, sizeof r);
    te_status s = TE_CALL(te_attention_forward_compute, ctx, m, pa, po, null_res ? nullptr : &r);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_attention_forward_compute accepted what it must reject");
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(same_bytes(&r, rbefore), "te_attention_forward_compute failed but wrote *residuals");
      failed("te_attention_forward_compute");
      return;
    }
    FUZZ_ASSERT(r.fp8 == 0 || r.fp8 == 1, "te_attention_forward_compute: residuals.fp8 = %d", r.fp8);
    if (mode >= 0)
      FUZZ_ASSERT(r.fp8 == mode, "te_attention_forward_compute: residuals.fp8 %d, the scope's mode is %d", r.fp8, mode);
    FUZZ_ASSERT(get_enum(r.lse.dtype) == TE_DTYPE_F32 && r.lse.ndim == 2 && r.lse.shape[0] == in->tq &&
                    r.lse.shape[1] == c.heads,
                "te_attention_forward_compute: lse is not F32 [tokens_q, heads]");
    FUZZ_ASSERT(r.internal != nullptr, "te_attention_forward_compute: residuals.internal NULL");
    if (kind >= 230 && r.fp8 == 0) {
      // The same forward again: the same o, bit for bit.
      const std::vector<uint8_t> o1 = in->o.data.snapshot();
      te_attention_residuals r2;
      std::memset(&r2, 0, sizeof r2);
      r2.struct_size = sizeof r2;
      FUZZ_ASSERT(TE_CALL(te_attention_forward_compute, ctx, m, pa, po, &r2) == TE_SUCCESS,
                  "te_attention_forward_compute failed when repeated");
      FUZZ_ASSERT(in->o.data.equals(o1), "te_attention_forward_compute repeated wrote another o");
      te_attention_residuals_release(&r2);
      te_attention_residuals_release(&r2);  // released: a no-op
    }
    const uint8_t next = R.u8();  // < 160 save, < 250 release, else save with out NULL
    if (next >= 160 && next < 250) {
      te_attention_residuals_release(&r);
      FUZZ_ASSERT(r.internal == nullptr, "te_attention_residuals_release left internal set");
      return;
    }
    te_attention_residuals copy = r;
    te_attention_backward_ctx *b = sentinel<te_attention_backward_ctx>();
    const bool null_out = next >= 250;
    s = TE_CALL(te_attention_forward_save, ctx, m, &r, null_out ? nullptr : &b);
    if (null_out) {
      FUZZ_ASSERT(s != TE_SUCCESS, "te_attention_forward_save accepted out = NULL");
      te_attention_residuals_release(&r);
      return;
    }
    FUZZ_ASSERT(s == TE_SUCCESS, "te_attention_forward_save of fresh residuals failed");
    // The struct's copy is stale now: saving or releasing it must do nothing.
    te_attention_backward_ctx *b2 = sentinel<te_attention_backward_ctx>();
    FUZZ_ASSERT(TE_CALL(te_attention_forward_save, ctx, m, &copy, &b2) != TE_SUCCESS,
                "te_attention_forward_save accepted residuals already saved");
    FUZZ_ASSERT(b2 == sentinel<te_attention_backward_ctx>(), "te_attention_forward_save failed but wrote *out");
    te_attention_residuals_release(&copy);
    attn_fresh_bwd(b, cs, c, in, mode);
    return;
  }
  te_attention_backward_ctx *b = sentinel<te_attention_backward_ctx>();
  const bool null_out = R.u8() >= 252;
  if (null_out) AT_MUST_FAIL();
  te_status s = TE_CALL(te_attention_forward, ctx, m, pa, po, null_out ? nullptr : &b);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_attention_forward accepted what it must reject");
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(b == sentinel<te_attention_backward_ctx>(), "te_attention_forward failed but wrote *out");
    failed("te_attention_forward");
    return;
  }
  attn_fresh_bwd(b, cs, c, in, mode);
}

// Gradient tensors for a forward's inputs (some NULL, some misshapen: mf).
inline void Program::attn_grads(AttnIn &I, AttnGrads &G, bool &mf, bool perturb) {
  const AttnCfg &c = I.cfg;
  make(G.d_o, c.dtype, I.o.shape);
  make(G.dq, c.dtype, I.q.shape);
  make(G.dk, c.dtype, I.k.shape);
  make(G.dv, c.dtype, I.v.shape);
  G.g = te_attention_grads{};
  G.g.struct_size = sizeof G.g;
  const uint8_t sel = R.u8();
  G.g.dq = sel & 1 ? nullptr : &G.dq.t;
  G.g.dk = sel & 2 ? nullptr : &G.dk.t;
  G.g.dv = sel & 4 ? nullptr : &G.dv.t;
  G.null_grads = sel >= 252;
  if (!perturb) return;
  const uint8_t p = R.u8();
  if (p >= 240) {
    switch (p - 240) {
      case 0: make(G.d_o, c.dtype, I.k.shape); if (!I.k.shape.same(I.o.shape)) AT_MUST_FAIL(); break;
      case 1: make(G.dq, c.dtype, I.k.shape); G.g.dq = &G.dq.t; if (!I.k.shape.same(I.q.shape)) AT_MUST_FAIL(); break;
      case 2: make(G.dk, c.dtype, I.q.shape); G.g.dk = &G.dk.t; if (!I.k.shape.same(I.q.shape)) AT_MUST_FAIL(); break;
      case 3: make(G.dv, c.dtype == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32, I.v.shape); G.g.dv = &G.dv.t; AT_MUST_FAIL(); break;
      case 4: maybe_malform(G.d_o); if (G.d_o.malformed || G.d_o.t.ndim != G.d_o.shape.ndim) AT_MUST_FAIL(); break;
      case 5: G.g.struct_size = 3; if (!G.null_grads) AT_MUST_FAIL(); break;
      case 6: G.d_o.t.data = nullptr; AT_MUST_FAIL(); break;
      default: break;
    }
  }
}

inline void Program::attn_backward() {
  const int bs = static_cast<int>(R.pick(kAttnBwdSlots));
  AttnBwdSlot &B = attn_bwd_[bs];
  bool mf = false;
  te_attention_backward_ctx *b = B.h;
  const uint8_t hv = R.u8();
  if (hv >= 250) {
    b = hv % 2 ? nullptr : static_cast<te_attention_backward_ctx *>(some_live_handle(10));
    AT_MUST_FAIL();
  } else if (!B.live) {
    return;  // a destroyed context's memory may be reused: not passed
  }
  if (B.live && B.once_done && b == B.h) AT_MUST_FAIL();
  int cs;
  te_context *ctx = ctx_arg(mf, cs, B.live ? B.ctx : -1);
  if (B.live && cs != B.ctx) AT_MUST_FAIL();
  AttnIn *in = B.in;
  if (!in) return;
  AttnGrads &G = *attn_grad_keep_.emplace_back(std::make_unique<AttnGrads>());
  attn_grads(*in, G, mf, true);
  te_linear_backward_args a;
  te_linear_backward_args_init(&a);
  const uint8_t f = R.u8();
  a.flags = f < 200 ? 0 : f < 250 ? TE_BACKWARD_ONCE : 0x2;
  const bool null_args = R.u8() < 60;  // no flags at all
  if (a.flags == 0x2 && !null_args) AT_MUST_FAIL();
  for (Tensor *t : {&G.dq, &G.dk, &G.dv}) t->snapshot();
  te_status s = TE_CALL(te_attention_backward, ctx, b, &G.d_o.t, G.null_grads ? nullptr : &G.g,
                        null_args ? nullptr : &a);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_attention_backward accepted what it must reject");
  if (s != TE_SUCCESS) {
    G.dq.check_untouched("te_attention_backward", "dq");
    G.dk.check_untouched("te_attention_backward", "dk");
    G.dv.check_untouched("te_attention_backward", "dv");
    return;
  }
  if (!null_args && a.flags == TE_BACKWARD_ONCE) {
    B.once_done = true;
    return;
  }
  if (R.u8() < 100 && !G.null_grads) {
    // Again: identical gradients (written, not accumulated).
    const std::vector<uint8_t> q1 = G.dq.data.snapshot(), k1 = G.dk.data.snapshot(), v1 = G.dv.data.snapshot();
    FUZZ_ASSERT(TE_CALL(te_attention_backward, ctx, b, &G.d_o.t, &G.g, nullptr) == TE_SUCCESS,
                "te_attention_backward failed when repeated");
    FUZZ_ASSERT(G.dq.data.equals(q1) && G.dk.data.equals(k1) && G.dv.data.equals(v1),
                "te_attention_backward repeated wrote other gradients");
  }
}

inline void Program::attn_backward_destroy() {
  const uint8_t v = R.u8();
  if (v >= 250) {
    te_attention_backward_ctx_destroy(nullptr);
    return;
  }
  AttnBwdSlot &B = attn_bwd_[v % kAttnBwdSlots];
  if (!B.live) return;
  te_attention_backward_ctx_destroy(B.h);
  B.live = false;
}

// Residuals in the caller's memory: a forward into a block of a slot, or a backward from it.
inline void Program::attn_caller() {
  const int rs = static_cast<int>(R.pick(kAttnCrSlots));
  AttnCrSlot &S = attn_cr_[rs];
  const bool into = R.u8() < 128 || !S.filled;
  bool mf = false;
  int ms;
  te_attention *m;
  // backward_from mostly names the module whose forward filled the block (it may be dead).
  if (!into && R.u8() < 220) {
    ms = S.ms;
    m = S.m;
    if (ms < 0 || !attn_[ms].live || attn_[ms].h != m) AT_MUST_FAIL();
  } else {
    m = attn_arg(mf, ms);
  }
  int cs;
  te_context *ctx = ctx_arg(mf, cs, ms >= 0 ? attn_[ms].ctx : -1);
  const bool usable = ms >= 0 && attn_[ms].live && attn_[ms].h == m;
  if (usable && cs != attn_[ms].ctx) AT_MUST_FAIL();
  if (into) {
    // forward_compute_into
    AttnCfg c = usable ? attn_[ms].cfg : AttnCfg{};
    AttnIn *in = attn_inputs(c, mf, true);
    if (!in) return;
    size_t bytes = 0;
    te_attention_forward_args shapes = in->a;
    te_tensor q = in->q.t, k = in->k.t, v = in->v.t, cq = in->cq.t, ckv = in->ckv.t;
    const bool shape_only = R.u8() < 80;
    if (shape_only) {
      // te.h: residuals_size reads shapes only (every data pointer, the offsets' too, may be NULL).
      q.data = k.data = v.data = cq.data = ckv.data = nullptr;
      shapes.q = &q;
      shapes.k = &k;
      shapes.v = &v;
      if (shapes.cu_seqlens_q) shapes.cu_seqlens_q = &cq;
      if (shapes.cu_seqlens_kv) shapes.cu_seqlens_kv = &ckv;
    }
    const te_status ss = TE_CALL(te_attention_residuals_size, ctx, m, &shapes, &bytes);
    if (ss != TE_SUCCESS) bytes = 64;
    else FUZZ_ASSERT(bytes > 0, "te_attention_residuals_size: 0 bytes (the block holds the LSE)");
    if (ss == TE_SUCCESS && shape_only) {
      size_t b2 = 0;
      // With the data given, CPU offsets are validated too (the forward's checks).
      if (TE_CALL(te_attention_residuals_size, ctx, m, &in->a, &b2) == TE_SUCCESS)
        FUZZ_ASSERT(b2 == bytes, "te_attention_residuals_size differs with shape-only tensors");
    }
    const uint8_t bv = R.u8();
    size_t give = bytes;
    size_t off = 0;
    bool null_block = false;
    if (bv >= 240) {
      switch (bv % 4) {
        case 0: give = bytes - 1; break;
        case 1: off = 1 + bv % 15; break;
        case 2: null_block = true; break;
        default: give = bytes + 64; break;
      }
      if (bv % 4 != 3) AT_MUST_FAIL();
    }
    attn_blocks_.emplace_back(bytes + 96);
    Blob &mem = attn_blocks_.back();
    uint8_t *base = mem.data();
    const uintptr_t al = (reinterpret_cast<uintptr_t>(base) + 15) & ~uintptr_t(15);
    uint8_t *block = null_block ? nullptr : reinterpret_cast<uint8_t *>(al) + off;
    const std::vector<uint8_t> blk_before = mem.snapshot();
    in->o.snapshot();
    const std::vector<uint8_t> st_before = usable && ctx_live(attn_[ms].ctx) ? attn_state(ctx_of(attn_[ms].ctx), m)
                                                                             : std::vector<uint8_t>();
    const te_status s = TE_CALL(te_attention_forward_compute_into, ctx, m, &in->a, &in->o.t, block, give);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_attention_forward_compute_into accepted what it must reject");
    if (s != TE_SUCCESS) {
      FUZZ_ASSERT(mem.equals(blk_before), "te_attention_forward_compute_into failed but wrote the block");
      in->o.check_untouched("te_attention_forward_compute_into", "o");
      if (!st_before.empty())
        FUZZ_ASSERT(attn_state(ctx_of(attn_[ms].ctx), m) == st_before,
                    "te_attention_forward_compute_into failed but changed the module's state");
      return;
    }
    FUZZ_ASSERT(ss == TE_SUCCESS, "te_attention_forward_compute_into succeeded where residuals_size failed");
    S.filled = true;
    S.once_done = false;
    S.ms = ms;
    S.m = m;
    S.ctx = cs;
    S.in = in;
    S.block = block;
    S.bytes = give;
    return;
  }
  // backward_from the slot's block.
  AttnIn *in = S.in;
  if (!in) return;
  if (!usable || m != S.m) AT_MUST_FAIL();  // another module (or a destroyed one) has no record of it
  if (S.once_done) AT_MUST_FAIL();
  // The inputs may have moved: copies of q, k, v (and the offsets) in new memory.
  AttnIn &mv = *attn_keep_.emplace_back(std::make_unique<AttnIn>());
  mv.cfg = in->cfg;
  auto move = [&](const Tensor &from, Tensor &to) {
    to.shape = from.shape;
    to.t = from.t;
    to.data = Blob(from.data.size());
    if (from.data.size()) std::memcpy(to.data.data(), from.data.data(), from.data.size());
    if (from.t.data) to.t.data = to.data.data();
  };
  move(in->q, mv.q);
  move(in->k, mv.k);
  move(in->v, mv.v);
  move(in->cq, mv.cq);
  move(in->ckv, mv.ckv);
  mv.a = in->a;
  mv.a.q = &mv.q.t;
  mv.a.k = &mv.k.t;
  mv.a.v = &mv.v.t;
  if (in->a.cu_seqlens_q) mv.a.cu_seqlens_q = &mv.cq.t;
  if (in->a.cu_seqlens_kv) mv.a.cu_seqlens_kv = &mv.ckv.t;
  const uint8_t p = R.u8();
  if (p >= 245) {
    if (in->thd) mv.a.max_seqlen_q = in->a.max_seqlen_q == 1 ? 2 : in->a.max_seqlen_q - 1;
    else mv.a.cu_seqlens_q = nullptr, mv.a.q = nullptr;
    if (in->thd && mv.a.max_seqlen_q > in->tq) mv.a.max_seqlen_q = 0;
    AT_MUST_FAIL();
  }
  AttnGrads &G = *attn_grad_keep_.emplace_back(std::make_unique<AttnGrads>());
  attn_grads(*in, G, mf, true);
  te_linear_backward_args a;
  te_linear_backward_args_init(&a);
  const uint8_t f = R.u8();
  a.flags = f < 180 ? 0 : f < 250 ? TE_BACKWARD_ONCE : 0x2;
  if (a.flags == 0x2) AT_MUST_FAIL();
  const uint8_t bv = R.u8();
  const void *block = S.block;
  size_t bytes = S.bytes;
  if (bv >= 246) {
    if (bv % 3 == 0) block = nullptr;
    else if (bv % 3 == 1) bytes -= 1;
    else {
      attn_blocks_.emplace_back(S.bytes + 32);
      block = attn_blocks_.back().data();
    }
    AT_MUST_FAIL();
  }
  for (Tensor *t : {&G.dq, &G.dk, &G.dv}) t->snapshot();
  te_status s = TE_CALL(te_attention_backward_from, ctx, m, &mv.a, &in->o.t, block, bytes, &G.d_o.t,
                        G.null_grads ? nullptr : &G.g, &a);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_attention_backward_from accepted what it must reject");
  if (s != TE_SUCCESS) {
    G.dq.check_untouched("te_attention_backward_from", "dq");
    G.dk.check_untouched("te_attention_backward_from", "dk");
    G.dv.check_untouched("te_attention_backward_from", "dv");
    return;
  }
  if (a.flags == TE_BACKWARD_ONCE) S.once_done = true;
}

inline void Program::attn_state_op() {
  bool mf = false;
  int ms;
  te_attention *m = attn_arg(mf, ms);
  int cs;
  te_context *ctx = ctx_arg(mf, cs, ms >= 0 ? attn_[ms].ctx : -1);
  if (ms >= 0 && attn_[ms].live && cs != attn_[ms].ctx) AT_MUST_FAIL();
  const uint8_t what = R.u8();
  if (what < 100) {
    // A scaling state.
    const uint8_t w = R.u8();
    const int which = w < 240 ? w % 6 : w % 2 ? 6 : -1;
    if (which < 0 || which > 5) AT_MUST_FAIL();
    te_scaling_state_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    float hist[8];
    for (float &h : hist) h = -7.0f;
    const bool null_info = R.u8() >= 250;
    if (null_info) AT_MUST_FAIL();
    const bool null_hist = R.u8() < 60;
    te_attention_tensor wt;
    set_enum(wt, which);
    const te_status s = TE_CALL(te_attention_get_scaling_state, ctx, m, wt, null_info ? nullptr : &info,
                                null_hist ? nullptr : hist, 8);
    if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_attention_get_scaling_state accepted what it must reject");
    if (s != TE_SUCCESS) {
      for (float h : hist) FUZZ_ASSERT(h == -7.0f, "te_attention_get_scaling_state failed but wrote history");
      return;
    }
    FUZZ_ASSERT(info.amax_history_len >= 0 && info.amax_history_len <= 65536,
                "te_attention_get_scaling_state: history length %d", info.amax_history_len);
    return;
  }
  const bool usable = !mf && ms >= 0 && attn_[ms].live;
  size_t n = 0;
  te_status s = TE_CALL(te_attention_state_save, ctx, m, nullptr, 0, &n);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_attention_state_save accepted what it must reject");
  if (s != TE_SUCCESS || !usable) return;
  std::vector<uint8_t> buf(n + 8, 0xCC);
  size_t n2 = 0;
  if (R.u8() >= 240) {
    FUZZ_ASSERT(TE_CALL(te_attention_state_save, ctx, m, buf.data(), n - 1, &n2) != TE_SUCCESS,
                "te_attention_state_save accepted a short buffer");
    for (size_t i = 0; i < buf.size(); ++i) FUZZ_ASSERT(buf[i] == 0xCC, "a failed state_save wrote its buffer");
  }
  FUZZ_ASSERT(TE_CALL(te_attention_state_save, ctx, m, buf.data(), n, &n2) == TE_SUCCESS && n2 == n,
              "te_attention_state_save failed after its size query");
  buf.resize(n);
  const std::vector<uint8_t> original = buf;
  // Load it back (maybe corrupted, truncated, or another module's).
  std::vector<uint8_t> in = buf;
  const uint8_t c = R.u8();
  bool must_fail = false;
  if (c >= 200) {
    switch (c % 5) {
      case 0: in.pop_back(); must_fail = true; break;
      case 1: in.push_back(0); must_fail = true; break;
      case 2: in[0] ^= 0x20; must_fail = true; break;
      case 3: in[R.pick(static_cast<uint32_t>(in.size()))] ^= static_cast<uint8_t>(1u << R.pick(8)); break;
      default: {
        int32_t bad = R.u8() < 128 ? -1 : 0x7fffffff;
        if (in.size() >= 36) std::memcpy(in.data() + 32, &bad, 4), must_fail = true;
        break;
      }
    }
  }
  s = TE_CALL(te_attention_state_load, ctx, m, in.data(), in.size());
  if (must_fail) FUZZ_ASSERT(s != TE_SUCCESS, "te_attention_state_load accepted a broken buffer");
  const std::vector<uint8_t> now = attn_state(ctx, m);
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(now == original, "te_attention_state_load failed but changed the state");
    return;
  }
  FUZZ_ASSERT(now == in, "te_attention_state_load: the state saves back to other bytes");
}

// RoPE: x [batch, seq, heads, hd] or [tokens, heads, hd] with offsets.
inline void Program::rope_op() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, live_ctx_slot());
  const bool thd = R.u8() < 128;
  static const int64_t kHd[8] = {8, 16, 4, 6, 2, 10, 7, 1};
  const int64_t hd = kHd[R.u8() < 200 ? R.pick(3) : R.pick(8)];
  const int64_t heads = 1 + R.pick(3);
  const int64_t batch = 1 + R.pick(3);
  std::vector<int32_t> lens;
  int64_t tokens = 0, seq = 0, longest = 0;
  if (thd) {
    for (int64_t b = 0; b < batch; ++b) {
      lens.push_back(static_cast<int32_t>(R.pick(6)));
      tokens += lens.back();
      longest = std::max<int64_t>(longest, lens.back());
    }
    if (tokens == 0) { lens[0] = 1; tokens = 1; longest = std::max<int64_t>(longest, 1); }
  } else {
    seq = 1 + R.pick(6);
    tokens = batch * seq;
    longest = seq;
  }
  const uint8_t rv = R.u8();
  int32_t rot = rv < 150 ? 0 : rv < 200 ? static_cast<int32_t>(2 * (1 + R.pick(static_cast<uint32_t>(std::max<int64_t>(1, hd / 2)))))
                  : rv < 220 ? static_cast<int32_t>(hd + 2) : rv < 235 ? 3 : rv < 245 ? -2 : INT32_MIN;
  const int64_t eff = rot ? rot : hd;
  if (rot < 0 || eff < 2 || eff % 2 || eff > hd) AT_MUST_FAIL();
  const uint8_t iv = R.u8();
  const int inter = iv < 120 ? 0 : iv < 250 ? 1 : 2;
  if (inter == 2) AT_MUST_FAIL();
  static const int kDt[4] = {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16, TE_DTYPE_E4M3};
  const uint8_t dv = R.u8();
  const int dt = kDt[dv < 120 ? 0 : dv < 190 ? 1 : dv < 250 ? 2 : 3];
  if (dt == TE_DTYPE_E4M3) AT_MUST_FAIL();
  Shape xs;
  if (thd) {
    xs.ndim = 3;
    xs.d[0] = tokens;
    xs.d[1] = heads;
    xs.d[2] = hd;
  } else {
    xs.ndim = 4;
    xs.d[0] = batch;
    xs.d[1] = seq;
    xs.d[2] = heads;
    xs.d[3] = hd;
  }
  RopeBufs &Bf = *rope_keep_.emplace_back(std::make_unique<RopeBufs>());
  make(Bf.x, dt, xs);
  make(Bf.y, dt, xs);
  const uint8_t pv = R.u8();
  const int64_t positions = std::max<int64_t>(1, pv < 220 ? longest + R.pick(3) : longest - 1);
  if (positions < longest) AT_MUST_FAIL();
  const int64_t fcols = eff >= 2 && eff % 2 == 0 ? eff / 2 : 1;
  const uint8_t fv = R.u8();
  const int64_t fc = fv < 245 ? fcols : fcols + 1;
  if (fc != fcols) AT_MUST_FAIL();
  make(Bf.freqs, fv >= 253 ? TE_DTYPE_BF16 : TE_DTYPE_F32, shape2(positions, fc));
  if (fv >= 253) AT_MUST_FAIL();
  {
    Rng rng(R.u8() + 31u * serial_);
    const int64_t n = positions * fc;
    if (get_enum(Bf.freqs.t.dtype) == TE_DTYPE_F32)
      for (int64_t i = 0; i < n; ++i) store_hp(Bf.freqs.data.data(), TE_DTYPE_F32, i, rng.uniform(-3, 3));
  }
  const te_tensor *cu = nullptr;
  if (thd) {
    make(Bf.cu, TE_DTYPE_I32, shape1(batch + 1));
    int32_t *e = reinterpret_cast<int32_t *>(Bf.cu.data.data());
    e[0] = 0;
    for (int64_t b = 0; b < batch; ++b) e[b + 1] = e[b] + lens[static_cast<size_t>(b)];
    const uint8_t ov = R.u8();
    if (ov >= 230) {
      switch (ov % 6) {
        case 0: e[0] = 1; break;
        case 1: e[batch] -= 1; break;
        case 2: if (batch >= 2) { e[1] = e[batch] + 1; } else { e[0] = -1; } break;
        case 3: e[batch > 1 ? 1 : 0] = INT32_MIN; break;
        case 4: e[batch > 1 ? 1 : 0] = INT32_MAX; break;
        default: set_enum(Bf.cu.t.dtype, TE_DTYPE_F32); break;
      }
      AT_MUST_FAIL();
    }
    cu = R.u8() < 250 ? &Bf.cu.t : nullptr;
    if (!cu) AT_MUST_FAIL();  // [tokens, heads, hd] read as BSHD: 3 dimensions refused
  } else if (R.u8() >= 252) {
    make(Bf.cu, TE_DTYPE_I32, shape1(batch + 1));
    cu = &Bf.cu.t;
    AT_MUST_FAIL();  // 4 dimensions with offsets
  }
  maybe_malform(Bf.x);
  if (Bf.x.malformed || Bf.x.t.ndim != xs.ndim) AT_MUST_FAIL();
  const uint8_t yv = R.u8();
  if (yv >= 248) {
    Shape ys = xs;
    ys.d[ys.ndim - 1] += 2;
    make(Bf.y, dt, ys);
    AT_MUST_FAIL();
  } else if (yv >= 244) {
    make(Bf.y, dt == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32, xs);
    AT_MUST_FAIL();
  }
  te_rope_options o;
  std::memset(&o, 0x6B, sizeof o);
  FUZZ_ASSERT(TE_CALL(te_rope_options_init, &o) == TE_SUCCESS && o.struct_size == sizeof o && o.rot_dim == 0 &&
                  o.interleaved == 0,
              "te_rope_options_init defaults");
  o.rot_dim = rot;
  o.interleaved = inter;
  const uint8_t ov = R.u8();
  // NULL opts: te.h does not say; the implementation takes the defaults. Not asserted either way.
  const bool null_opts = ov >= 250;
  if (ov >= 246 && ov < 250) {
    o.struct_size = 2;
    AT_MUST_FAIL();
  }
  const bool backward = R.u8() < 100;
  const char *fn = backward ? "te_rope_backward" : "te_rope_forward";
  Bf.y.snapshot();
  const std::vector<uint8_t> x_before = Bf.x.data.snapshot();
  te_status s = backward ? TE_CALL(te_rope_backward, ctx, null_opts ? nullptr : &o, &Bf.x.t, &Bf.freqs.t, cu, &Bf.y.t)
                         : TE_CALL(te_rope_forward, ctx, null_opts ? nullptr : &o, &Bf.x.t, &Bf.freqs.t, cu, &Bf.y.t);
  FUZZ_ASSERT(Bf.x.data.equals(x_before), "%s wrote into x", fn);
  if (mf && !null_opts) FUZZ_ASSERT(s != TE_SUCCESS, "%s accepted what it must reject", fn);
  if (s != TE_SUCCESS) {
    Bf.y.check_untouched(fn, "y");
    return;
  }
  if (null_opts || mf) return;
  // In place: the same bytes.
  Tensor &ip = Bf.inplace;
  make(ip, dt, xs);
  std::memcpy(ip.data.data(), x_before.data(), x_before.size());
  s = backward ? TE_CALL(te_rope_backward, ctx, &o, &ip.t, &Bf.freqs.t, cu, &ip.t)
               : TE_CALL(te_rope_forward, ctx, &o, &ip.t, &Bf.freqs.t, cu, &ip.t);
  FUZZ_ASSERT(s == TE_SUCCESS, "%s failed in place after succeeding out of place", fn);
  FUZZ_ASSERT(ip.data.equals(Bf.y.data.snapshot()), "%s in place differs from out of place", fn);
  if (dt != TE_DTYPE_F32) return;
  // The other direction inverts it (F32, finite inputs).
  Tensor &back = Bf.back;
  make(back, dt, xs);
  s = backward ? TE_CALL(te_rope_forward, ctx, &o, &Bf.y.t, &Bf.freqs.t, cu, &back.t)
               : TE_CALL(te_rope_backward, ctx, &o, &Bf.y.t, &Bf.freqs.t, cu, &back.t);
  FUZZ_ASSERT(s == TE_SUCCESS, "the inverse rope failed");
  const int64_t n = xs.numel();
  float maxabs = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = load_hp(x_before.data(), dt, i);
    if (!std::isfinite(a)) return;  // a NaN or inf spreads to its pair partner
    maxabs = std::max(maxabs, std::fabs(a));
  }
  if (maxabs > 1e37f) return;  // a rotation of values near FLT_MAX may overflow (x1 cos - x2 sin)
  for (int64_t i = 0; i < n; ++i) {
    const float a = load_hp(x_before.data(), dt, i), b = load_hp(back.data.data(), dt, i);
    FUZZ_ASSERT(std::fabs(a - b) <= 1e-5f * (1.0f + maxabs), "rope backward does not invert forward: %g vs %g", a, b);
  }
}

inline void Program::attn_drop_context(int slot) {
  for (auto &b : attn_bwd_)
    if (b.live && b.ctx == slot) {
      te_attention_backward_ctx_destroy(b.h);
      b.live = false;
    }
  for (auto &m : attn_)
    if (m.live && m.ctx == slot) {
      te_attention_destroy(m.h);
      m.live = false;
      dead_attn_.push_back(m.h);
    }
  for (auto &c : attn_cr_)
    if (c.filled && c.ctx == slot) c.filled = false;
}

#undef AT_MUST_FAIL

}  // namespace fuzz
