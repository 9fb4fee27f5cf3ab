// fuzz_api_sequence's remaining operations (api_program.h): te_context_malloc/free/copy with
// fuzzed sizes and pointers, the tensor getters on huge and overflowing shapes, context getters,
// handles passed as another type, and whole training steps.
#pragma once

#include "api_program.h"

namespace fuzz {

// ---- context memory ----

inline void Program::malloc_op() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  size_t n;
  const uint32_t mode = R.pick(8);
  switch (mode) {
    case 1: n = 0; mf = true; break;
    case 2: n = SIZE_MAX; break;
    case 3: n = SIZE_MAX - R.pick(128); break;
    case 4: n = size_t{1} << (41 + R.pick(22)); break;
    case 5: n = (SIZE_MAX >> 1) + 1 + R.pick(64); break;
    case 6: n = 1 + R.pick(65536); break;
    case 7: n = 64; break;
    default: n = 1 + R.pick(4096); break;
  }
  const bool null_out = R.u8() >= 250;
  mf |= null_out;
  void *p = sentinel<void>();
  te_status s = TE_CALL(te_context_malloc, ctx, n, null_out ? nullptr : &p);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_malloc accepted what it must reject (%zu bytes)", n);
  if (s != TE_SUCCESS) {
    FUZZ_ASSERT(p == sentinel<void>(), "te_context_malloc failed but wrote *out");
    return;
  }
  FUZZ_ASSERT(p != nullptr && reinterpret_cast<uintptr_t>(p) % 64 == 0, "te_context_malloc: %p is not 64-byte aligned", p);
  // No block of 2^47 bytes or more exists on x86-64 (nor one that wraps the address space):
  // such a "success" is a size computation that overflowed.
  FUZZ_ASSERT(n < (size_t{1} << 47) && n - 1 <= UINTPTR_MAX - reinterpret_cast<uintptr_t>(p),
              "te_context_malloc succeeded for %zu bytes (%p): a block that cannot exist", n, p);
  uint8_t *b = static_cast<uint8_t *>(p);
  // The block is ours: its first and last bytes (all of it when small) must be writable.
  if (n <= 65536) std::memset(b, 0xA5, n);
  b[0] = 1;
  b[n - 1] = 2;
  blocks_.push_back(Block{cs, b, n});
  for (size_t i = 0; i < freed_blocks_.size();)
    if (freed_blocks_[i] == reinterpret_cast<uintptr_t>(b)) freed_blocks_.erase(freed_blocks_.begin() + static_cast<long>(i));
    else ++i;
  if (blocks_.size() > 12) free_block(0);
}

inline void Program::free_block(size_t i) {
  Block blk = blocks_[i];
  FUZZ_ASSERT(TE_CALL(te_context_free, ctx_[blk.ctx].h, blk.p) == TE_SUCCESS, "te_context_free of a live block failed");
  blocks_.erase(blocks_.begin() + static_cast<long>(i));
  freed_blocks_.push_back(reinterpret_cast<uintptr_t>(blk.p));
  if (freed_blocks_.size() > 32) freed_blocks_.erase(freed_blocks_.begin());
}

inline bool Program::is_live_block(const void *p) const {
  for (const Block &b : blocks_)
    if (b.p == p) return true;
  return false;
}

inline void Program::free_op() {
  const uint32_t how = R.pick(6);
  if (how == 0 || how == 5) {
    if (!blocks_.empty()) free_block(R.pick(static_cast<uint32_t>(blocks_.size())));
    return;
  }
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  void *p = nullptr;
  uint64_t local = 0;
  switch (how) {
    case 1: {  // another context's block
      for (const Block &b : blocks_)
        if (b.ctx != cs) { p = b.p; break; }
      if (!p) return;
      mf = true;
      break;
    }
    case 2: {  // freed before (and not handed out again)
      if (freed_blocks_.empty()) return;
      p = reinterpret_cast<void *>(freed_blocks_[R.pick(static_cast<uint32_t>(freed_blocks_.size()))]);
      if (is_live_block(p)) return;
      mf = true;
      break;
    }
    case 3: p = &local; mf = true; break;
    default: {  // inside a live block
      if (blocks_.empty()) return;
      const Block &b = blocks_[R.pick(static_cast<uint32_t>(blocks_.size()))];
      if (b.n < 2) return;
      p = b.p + 1 + R.pick(static_cast<uint32_t>(std::min<size_t>(b.n - 1, 4096)));
      mf = true;
      break;
    }
  }
  te_status s = TE_CALL(te_context_free, ctx, p);
  if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_free accepted a pointer the context did not hand out (how %u)", how);
}

inline void Program::copy_op() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  Blob src(256), dst(256);
  for (size_t i = 0; i < 256; ++i) src.data()[i] = static_cast<uint8_t>(i);
  size_t n = R.pick(257);
  void *d = dst.data();
  const void *s = src.data();
  for (const Block &b : blocks_)
    if (b.ctx == cs && R.u8() >= 128) {
      d = b.p;
      n = std::min(n, b.n);
      break;
    }
  static const int kKinds[5] = {TE_COPY_HOST_TO_DEVICE, TE_COPY_DEVICE_TO_HOST, TE_COPY_DEVICE_TO_DEVICE, 3, -1};
  const int kind = kKinds[R.pick(5)];
  if (kind < 0 || kind > 2) mf = true;
  te_copy_kind k;
  set_enum(k, kind);
  const uint8_t z = R.u8();
  if (z >= 250) { d = nullptr; mf = true; }
  else if (z >= 245) { s = nullptr; mf = true; }
  te_status st = TE_CALL(te_context_copy, ctx, d, s, n, k);
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_context_copy accepted what it must reject");
}

// ---- tensor and context getters, wrong-type handles, training steps ----

inline void Program::tensor_query() {
  Tensor x;
  bool odd = false;
  const int dt = pick_dtype(TE_DTYPE_E4M3, odd);
  const int sc = pick_scaling();
  make(x, dt, gen_shape(), sc);
  maybe_malform(x);
  Shape s;
  s.ndim = x.t.ndim;
  bool huge = false;
  if (R.u8() >= 200) {  // huge dimensions without data: only the shape arithmetic runs
    static const int64_t kH[6] = {INT64_MAX, INT64_MAX - 127, int64_t{1} << 62, int64_t{1} << 40, 3037000499ll, 129};
    x.t.ndim = 1 + static_cast<int>(R.pick(3));
    for (int i = 0; i < x.t.ndim; ++i) x.t.shape[i] = kH[R.pick(6)];
    huge = true;
  }
  s.ndim = x.t.ndim;
  for (int i = 0; i < TE_MAX_DIMS; ++i) s.d[i] = x.t.shape[i];
  const bool good = s.good();
  const int64_t n = te_tensor_numel(&x.t);
  // A count no tensor can have may read as 0 (the library caps tensors at some huge size).
  if (good)
    FUZZ_ASSERT(n == s.numel() || (n == 0 && s.numel() > (int64_t{1} << 47)), "te_tensor_numel: %lld, expected %lld",
                (long long)n, (long long)s.numel());
  if (x.t.ndim < 1 || x.t.ndim > TE_MAX_DIMS) FUZZ_ASSERT(n == 0, "te_tensor_numel of ndim %d: %lld", x.t.ndim, (long long)n);
  FUZZ_ASSERT(te_tensor_numel(nullptr) == 0, "te_tensor_numel(NULL) != 0");
  int64_t count = -777;
  const bool null_count = R.u8() >= 250;
  te_status st = TE_CALL(te_tensor_scale_inv_count, null_count ? nullptr : &count, &x.t);
  const int xdt = get_enum(x.t.dtype), xsc = get_enum(x.t.scaling);
  const bool must_fail = null_count || !good || !is_fp8(xdt) || xsc < 0 || xsc > 2;
  if (must_fail) FUZZ_ASSERT(st != TE_SUCCESS, "te_tensor_scale_inv_count accepted a bad tensor");
  if (st != TE_SUCCESS) {
    FUZZ_ASSERT(count == -777, "te_tensor_scale_inv_count failed but wrote *count");
    return;
  }
  // The count of a tensor that exists (not one of the huge shapes) is the header's rule.
  __int128 rows = 1;
  for (int i = 0; i + 1 < s.ndim; ++i) rows *= s.d[i];
  const __int128 cols = s.d[s.ndim - 1];
  const __int128 bc = cols / 128 + (cols % 128 != 0), br = rows / 128 + (rows % 128 != 0);
  const __int128 want = xsc == 0 ? 1 : xsc == 1 ? rows * bc : br * bc;
  if (want <= INT64_MAX)
    FUZZ_ASSERT(count == static_cast<int64_t>(want), "te_tensor_scale_inv_count: %lld, expected %lld (huge %d)",
                (long long)count, (long long)want, huge);
  else
    violation("te_tensor_scale_inv_count succeeded with a count beyond int64 (%lld)", (long long)count);
}

inline void Program::context_misc() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  switch (R.pick(6)) {
    case 0: {
      te_status s = TE_CALL(te_context_set_stream, ctx, nullptr);
      if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_set_stream accepted a bad ctx");
      else FUZZ_ASSERT(s == TE_SUCCESS, "te_context_set_stream(NULL) failed on a CPU context");
      break;
    }
    case 1: {
      te_status s = TE_CALL(te_context_set_stream, ctx, reinterpret_cast<void *>(uintptr_t{0x1000}));
      FUZZ_ASSERT(s != TE_SUCCESS, "te_context_set_stream accepted a stream on a CPU context");
      break;
    }
    case 2: {
      te_status s = TE_CALL(te_context_synchronize, ctx);
      if (mf) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_synchronize accepted a bad ctx");
      break;
    }
    case 3: {
      te_device d;
      std::memset(&d, 0x3E, sizeof d);
      const std::vector<uint8_t> b = bytes_of(&d, sizeof d);
      const bool null_out = R.u8() >= 200;
      te_status s = TE_CALL(te_context_get_device, ctx, null_out ? nullptr : &d);
      if (mf || null_out) FUZZ_ASSERT(s != TE_SUCCESS, "te_context_get_device accepted bad arguments");
      if (s != TE_SUCCESS) FUZZ_ASSERT(same_bytes(&d, b), "te_context_get_device failed but wrote *out");
      break;
    }
    case 4: {
      te_status v;
      set_enum(v, static_cast<int>(R.u32()));
      const char *t = te_status_string(v);
      FUZZ_ASSERT(t && t[0], "te_status_string returned NULL or \"\"");
      FUZZ_ASSERT(te_version() == TE_VERSION_NUMBER, "te_version mismatch");
      break;
    }
    default: {  // options inits with NULL
      FUZZ_ASSERT(TE_CALL(te_context_options_init, nullptr) != TE_SUCCESS, "te_context_options_init(NULL)");
      FUZZ_ASSERT(TE_CALL(te_autocast_options_init, nullptr) != TE_SUCCESS, "te_autocast_options_init(NULL)");
      FUZZ_ASSERT(TE_CALL(te_linear_options_init, nullptr) != TE_SUCCESS, "te_linear_options_init(NULL)");
      FUZZ_ASSERT(TE_CALL(te_gemm_options_init, nullptr) != TE_SUCCESS, "te_gemm_options_init(NULL)");
      FUZZ_ASSERT(TE_CALL(te_quantize_options_init, nullptr) != TE_SUCCESS, "te_quantize_options_init(NULL)");
      break;
    }
  }
}

// A live handle passed as another type: every call must reject it; getters answer as for NULL.
inline void Program::wrong_handle() {
  void *h = some_live_handle(static_cast<int>(R.pick(5)));
  if (!h) return;
  const uint32_t fn = R.pick(8);
  bool is_ctx = false, is_rec = false, is_grp = false, is_lin = false, is_bwd = false;
  for (auto &s : ctx_) is_ctx |= s.live && s.h == h;
  for (auto &s : rec_) is_rec |= s.refs && s.h == h;
  for (auto &s : grp_) is_grp |= s.live && s.h == h;
  for (auto &s : lin_) is_lin |= s.live && s.h == h;
  for (auto &s : bwd_) is_bwd |= s.live && s.h == h;
  const int c0 = live_ctx_slot();
  te_context *ctx = c0 >= 0 ? ctx_[c0].h : nullptr;
  switch (fn) {
    case 0:
      if (!is_rec) {
        FUZZ_ASSERT(te_recipe_key(static_cast<te_recipe *>(h)) == 0, "te_recipe_key of a non-recipe handle is not 0");
        FUZZ_ASSERT(te_recipe_describe(static_cast<te_recipe *>(h))[0] == 0, "te_recipe_describe of a non-recipe handle");
        te_recipe_retain(static_cast<te_recipe *>(h));   // no-ops
        te_recipe_release(static_cast<te_recipe *>(h));
      }
      break;
    case 1:
      if (!is_grp)
        FUZZ_ASSERT(te_group_id(static_cast<te_group *>(h)) == 0 && te_group_rank(static_cast<te_group *>(h)) == 0 &&
                        te_group_size(static_cast<te_group *>(h)) == 1,
                    "group getters on a non-group handle");
      if (!is_grp) te_group_destroy(static_cast<te_group *>(h));  // a no-op
      break;
    case 2:
      if (!is_ctx) {
        te_autocast_options o;
        te_autocast_options_init(&o);
        te_autocast_token t = 7;
        FUZZ_ASSERT(TE_CALL(te_autocast_begin, static_cast<te_context *>(h), &o, &t) != TE_SUCCESS && t == 7,
                    "te_autocast_begin accepted a non-context handle");
        te_context_destroy(static_cast<te_context *>(h));  // a no-op
      }
      break;
    case 3:
      if (!is_lin) {
        te_linear_destroy(static_cast<te_linear *>(h));  // a no-op
        size_t n = 0;
        FUZZ_ASSERT(TE_CALL(te_linear_state_save, ctx, static_cast<te_linear *>(h), nullptr, 0, &n) != TE_SUCCESS,
                    "te_linear_state_save accepted a non-linear handle");
      }
      break;
    case 4:
      if (!is_bwd) {
        te_linear_backward_ctx_destroy(static_cast<te_linear_backward_ctx *>(h));  // a no-op
        Tensor dy;
        make(dy, TE_DTYPE_BF16, shape2(16, 16));
        FUZZ_ASSERT(TE_CALL(te_linear_backward, ctx, static_cast<te_linear_backward_ctx *>(h), &dy.t, nullptr, nullptr,
                            nullptr, nullptr) != TE_SUCCESS,
                    "te_linear_backward accepted a non-backward handle");
      }
      break;
    case 5:
      if (!is_ctx) {
        Tensor x;
        make(x, TE_DTYPE_F32, shape2(4, 4));
        float a = 0;
        FUZZ_ASSERT(TE_CALL(te_amax, static_cast<te_context *>(h), &x.t, &a) != TE_SUCCESS, "te_amax accepted a non-context handle");
      }
      break;
    case 6:
      if (!is_rec) {
        te_recipe_options o;
        std::memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        FUZZ_ASSERT(TE_CALL(te_recipe_get_options, static_cast<te_recipe *>(h), &o) != TE_SUCCESS,
                    "te_recipe_get_options accepted a non-recipe handle");
      }
      break;
    default:
      if (!is_grp) {
        FUZZ_ASSERT(TE_CALL(te_group_abort, static_cast<te_group *>(h)) != TE_SUCCESS, "te_group_abort accepted a non-group handle");
      } else {
        FUZZ_ASSERT(TE_CALL(te_group_abort, static_cast<te_group *>(h)) != TE_SUCCESS,
                    "te_group_abort succeeded on a single-rank group (INVALID_STATE expected)");
      }
      break;
  }
}

// One training step on a linear: begin, forward, end, backward, destroy.
inline void Program::train_step() {
  const int ls = static_cast<int>(R.pick(kLinearSlots));
  LinSlot &L = lin_[ls];
  if (!L.live || !L.bufs || !ctx_live(L.ctx)) return;
  te_context *ctx = ctx_[L.ctx].h;
  bool mf = false;
  te_autocast_options o;
  te_autocast_options_init(&o);
  o.recipe = recipe_arg(mf);
  o.group = group_arg(mf);
  if (mf) return;
  te_autocast_token tok;
  if (TE_CALL(te_autocast_begin, ctx, &o, &tok) != TE_SUCCESS) return;
  ctx_[L.ctx].scopes.push_back(Scope{tok, 1, 0, o.recipe});
  const int64_t tokens = R.u8() >= 128 ? 32 : 16;
  const int dt = L.cfg.dtype;
  Tensor x, w, b, y;
  make(x, dt, shape2(tokens, L.cfg.in));
  make(w, dt, shape2(L.cfg.out, L.cfg.in));
  make(b, dt, shape1(L.cfg.out));
  make(y, dt, shape2(tokens, L.cfg.out));
  x.t.data = L.bufs->x.data();
  w.t.data = L.bufs->w.data();
  b.t.data = L.bufs->b.data();
  te_linear_forward_args a;
  te_linear_forward_args_init(&a);
  a.input = &x.t;
  a.weight = &w.t;
  a.bias = L.cfg.bias ? &b.t : nullptr;
  a.weight_unchanged = R.u8() >= 128 ? 1 : 0;
  int bs;
  BwdSlot &B = fresh_bwd_slot(bs);
  te_linear_backward_ctx *h = nullptr;
  te_status s = TE_CALL(te_linear_forward, ctx, L.h, &a, &y.t, &h);
  if (s == TE_SUCCESS) {
    B.h = h;
    B.live = true;
    B.ctx = L.ctx;
    B.lin = L.h;
    B.cfg = L.cfg;
    B.bufs = L.bufs;
    B.tokens = tokens;
    B.once_done = false;
  }
  if (TE_CALL(te_autocast_end, ctx, tok) == TE_SUCCESS) {
    ctx_[L.ctx].scopes.pop_back();
    ++ctx_[L.ctx].closed;
    ended_tokens_.push_back(tok);
  }
  check_autocast_state(L.ctx);
  if (s != TE_SUCCESS) return;
  Tensor dy, dx, dw, db;
  make(dy, dt, shape2(tokens, L.cfg.out));
  make(dx, dt, shape2(tokens, L.cfg.in));
  make(dw, L.cfg.fuse ? TE_DTYPE_F32 : dt, shape2(L.cfg.out, L.cfg.in));
  make(db, dt, shape1(L.cfg.out));
  te_linear_backward_args ba;
  te_linear_backward_args_init(&ba);
  const uint8_t v = R.u8();
  ba.flags = v >= 128 ? TE_BACKWARD_ONCE : 0;
  s = TE_CALL(te_linear_backward, ctx, h, &dy.t, &dx.t, &dw.t, L.cfg.bias ? &db.t : nullptr, &ba);
  if (s == TE_SUCCESS && ba.flags) {
    B.once_done = true;
    FUZZ_ASSERT(TE_CALL(te_linear_backward, ctx, h, &dy.t, &dx.t, &dw.t, L.cfg.bias ? &db.t : nullptr, &ba) ==
                    TE_ERROR_INVALID_STATE,
                "a second backward after TE_BACKWARD_ONCE did not fail with INVALID_STATE");
  }
  if (R.u8() < 200) {
    te_linear_backward_ctx_destroy(h);
    B.live = false;
  }
}

}  // namespace fuzz
