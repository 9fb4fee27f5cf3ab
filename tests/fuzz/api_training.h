// fuzz_api_sequence's training-step ops and checkpoints (api_program.h): te_add, te_split_columns
// / te_concat_columns, te_embedding_forward / _backward, te_cross_entropy, te_adamw_step (owners:
// the program's linears and LayerNorm modules) and te_checkpoint_* over slots of checkpoints,
// on a CPU context, with fuzzed shapes, dtypes, ids, names and bytes.
//
// Checked besides the common invariants (api_program.h): a call te.h says must fail fails and
// leaves its outputs (and an AdamW owner's state) untouched; te_add is the fp32 sum rounded once
// (F32 / BF16 exact); split then concat gives x back byte for byte and leaves FP8 scale_inv
// alone; an embedding forward copies the table's rows exactly, a backward is the fp32 sum of each
// row's tokens in increasing t; cross-entropy's loss is the fp64 reference's within 1e-4
// (count 0: exactly 0, zero dlogits); AdamW's param, moments and model_weight follow the fp64
// formula, and a non-finite gradient norm with clipping changes nothing; a checkpoint's records
// are what was put (names, dtypes, shapes, bytes), through serialize / deserialize and a file,
// and any one-byte change or truncation of a serialised checkpoint is refused.
#pragma once

#include <unistd.h>

#include <map>
#include <string>

#include "api_program.h"

#define TR_MUST_FAIL()                                                                     \
  do {                                                                                     \
    mf = true;                                                                             \
    if (tracing()) std::fprintf(stderr, "  (must fail: api_training.h:%d)\n", __LINE__);  \
  } while (0)

namespace fuzz {

// maybe_malform, minus the two changes that leave a well-formed tensor here: an I32 tensor given
// dtype 5 (I32 itself), and any tensor made I32 (its buffer may be too small for 4-byte
// elements: a caller error, not a library one).
inline void Program::malform_here(Tensor &x) {
  const te_tensor before = x.t;
  const bool was = x.malformed;
  maybe_malform(x);
  if (get_enum(x.t.dtype) == TE_DTYPE_I32 && get_enum(before.dtype) != TE_DTYPE_I32) {
    x.t = before;
    x.malformed = was;
  } else if (std::memcmp(&x.t, &before, sizeof before) == 0) {
    x.malformed = was;
  }
}

// A high-precision dtype for a fuzzed op; sometimes FP8 or I32 (`odd`).
inline int Program::hp_dtype(bool &odd) {
  const uint8_t v = R.u8();
  if (v < 150) return TE_DTYPE_F32;
  if (v < 200) return TE_DTYPE_BF16;
  if (v < 245) return TE_DTYPE_F16;
  odd = true;
  return v < 250 ? TE_DTYPE_E4M3 : TE_DTYPE_I32;
}

inline bool all_finite(const Tensor &x) {
  const int dt = get_enum(x.t.dtype);
  if (is_fp8(dt) || dt == TE_DTYPE_I32) return true;
  const int64_t n = static_cast<int64_t>(x.data.size() / dtype_bytes(dt));
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(load_hp(x.data.data(), dt, i))) return false;
  return true;
}

// ---- te_add -----------------------------------------------------------------------------------

inline void Program::add_op() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, live_ctx_slot());
  bool odd = false;
  const int dt = hp_dtype(odd);
  if (odd) TR_MUST_FAIL();  // F32/F16/BF16 only
  const Shape s = gen_shape(4096);
  Tensor a, b, y;
  make(a, dt, s);
  make(b, dt, s);
  make(y, dt, s);
  const uint8_t v = R.u8();
  if (v >= 245) {  // b of another shape
    Shape o = s;
    o.d[o.ndim - 1] += 1;
    make(b, dt, o);
    TR_MUST_FAIL();
  } else if (v >= 240) {  // y of another dtype
    make(y, dt == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32, s);
    TR_MUST_FAIL();
  } else if (v >= 236 && s.ndim >= 2 && s.d[0] != s.d[s.ndim - 1]) {  // y: the same count, another shape
    Shape o = s;
    std::swap(o.d[0], o.d[o.ndim - 1]);
    make(y, dt, o);
    TR_MUST_FAIL();
  }
  malform_here(a);
  malform_here(b);
  malform_here(y);
  if (a.malformed || b.malformed || y.malformed) TR_MUST_FAIL();
  const uint8_t ip = R.u8();
  te_tensor *yp = &y.t;
  if (ip >= 200 && !mf) yp = ip >= 228 ? &a.t : &b.t;  // in place: "y may be a or b"
  const std::vector<uint8_t> a0 = a.data.snapshot(), b0 = b.data.snapshot();
  y.snapshot();
  const te_status st = TE_CALL(te_add, ctx, &a.t, &b.t, yp);
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_add accepted what it must reject");
  if (st != TE_SUCCESS) {
    y.check_untouched("te_add", "y");
    FUZZ_ASSERT(a.data.equals(a0) && b.data.equals(b0), "te_add failed but wrote into a or b");
    return;
  }
  if (yp == &y.t) FUZZ_ASSERT(a.data.equals(a0) && b.data.equals(b0), "te_add wrote into a or b");
  if (mf || dt == TE_DTYPE_F16) return;  // F16: the harness's conversion truncates
  const void *out = yp->data;
  const int64_t n = s.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float want = load_hp(a0.data(), dt, i) + load_hp(b0.data(), dt, i);
    std::vector<uint8_t> cell(4);
    store_hp(cell.data(), dt, 0, want);
    const float w = load_hp(cell.data(), dt, 0), got = load_hp(out, dt, i);
    if (std::isnan(w)) FUZZ_ASSERT(std::isnan(got), "te_add: element %lld is not NaN", (long long)i);
    else FUZZ_ASSERT(std::memcmp(&w, &got, 4) == 0, "te_add: element %lld is %g, expected %g (fp32 sum rounded once)",
                     (long long)i, (double)got, (double)w);
  }
}

// ---- te_split_columns / te_concat_columns -----------------------------------------------------

inline void Program::columns_op() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, live_ctx_slot());
  static const int kDt[5] = {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_E4M3, TE_DTYPE_I32, TE_DTYPE_F16};
  const int dt = kDt[R.pick(5)];  // "any, FP8 included"
  const uint8_t nv = R.u8();
  size_t n = nv < 240 ? 1 + R.pick(4) : nv < 248 ? 0 : nv < 252 ? 65 : 64;
  if (n == 0 || n > 64) TR_MUST_FAIL();
  Shape lead;  // the leading dimensions
  lead.ndim = static_cast<int>(R.pick(3));
  static const int64_t kLead[6] = {4, 1, 3, 2, 7, 16};
  for (int i = 0; i < lead.ndim; ++i) lead.d[i] = kLead[R.pick(6)];
  int64_t rows = 1;
  for (int i = 0; i < lead.ndim; ++i) rows *= lead.d[i];
  const size_t parts = std::min<size_t>(n, 65);
  std::vector<int64_t> widths(parts);
  int64_t total = 0;
  for (auto &c : widths) total += (c = 1 + R.pick(n >= 64 ? 2 : 16));
  auto with_cols = [&](int64_t c) {
    Shape s = lead;
    s.d[s.ndim++] = c;
    return s;
  };
  Tensor x;
  make(x, dt, with_cols(total));
  std::vector<Tensor> outs(parts);
  std::vector<te_tensor *> ptrs(parts);
  for (size_t i = 0; i < parts; ++i) {
    Shape s = R.u8() < 200 ? with_cols(widths[i]) : shape2(rows, widths[i]);  // "or any shape of rows * c_i"
    make(outs[i], dt, s);
    ptrs[i] = &outs[i].t;
  }
  const uint8_t pv = R.u8();
  if (pv >= 200 && parts > 0) {
    const size_t k = R.pick(static_cast<uint32_t>(parts));
    switch (pv % 6) {
      case 0: ptrs[k] = nullptr; TR_MUST_FAIL(); break;
      case 1: make(outs[k], dt, shape2(rows + 1, widths[k])); TR_MUST_FAIL(); break;
      case 2: make(outs[k], dt, with_cols(widths[k] + 1)); TR_MUST_FAIL(); break;  // the widths no longer sum
      case 3: set_enum(outs[k].t.dtype, dt == TE_DTYPE_F32 ? TE_DTYPE_I32 : TE_DTYPE_F32);
              if (dtype_bytes(dt) != 4) make(outs[k], dt == TE_DTYPE_F32 ? TE_DTYPE_I32 : TE_DTYPE_F32, with_cols(widths[k]));
              TR_MUST_FAIL(); break;
      case 4: outs[k].t.data = x.data.data(); TR_MUST_FAIL(); break;  // "outputs must not overlap x"
      default: malform_here(outs[k]); if (outs[k].malformed) TR_MUST_FAIL(); break;
    }
  }
  malform_here(x);
  if (x.malformed) TR_MUST_FAIL();
  const std::vector<uint8_t> x0 = x.data.snapshot(), xs0 = x.scale.snapshot();
  for (auto &o : outs) o.snapshot();
  te_tensor *const *arr = ptrs.data();
  if (R.u8() >= 252) {
    arr = nullptr;
    TR_MUST_FAIL();
  }
  const te_status st = TE_CALL(te_split_columns, ctx, &x.t, arr, n);
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_split_columns accepted what it must reject");
  FUZZ_ASSERT(x.data.equals(x0) && x.scale.equals(xs0), "te_split_columns wrote into x");
  if (st != TE_SUCCESS) {
    for (auto &o : outs) o.check_untouched("te_split_columns", "outputs[i]");
    return;
  }
  if (mf) return;
  // Each output's rows are its columns of x; FP8 scale_inv untouched.
  const size_t es = dtype_bytes(dt), pitch = static_cast<size_t>(total) * es;
  size_t off = 0;
  for (size_t i = 0; i < parts; ++i) {
    const size_t w = static_cast<size_t>(widths[i]) * es;
    for (int64_t r = 0; r < rows; ++r)
      FUZZ_ASSERT(std::memcmp(outs[i].data.data() + static_cast<size_t>(r) * w, x0.data() + static_cast<size_t>(r) * pitch + off, w) == 0,
                  "te_split_columns: outputs[%zu] row %lld is not its columns of x", i, (long long)r);
    FUZZ_ASSERT(outs[i].scale.equals(outs[i].snap_scale), "te_split_columns touched outputs[%zu]'s scale_inv", i);
    off += w;
  }
  // concat_columns is its inverse: back into y, byte for byte.
  Tensor y;
  make(y, dt, with_cols(total));
  bool mf2 = false;
  std::vector<const te_tensor *> in(ptrs.begin(), ptrs.end());
  if (R.u8() >= 240) {
    in[R.pick(static_cast<uint32_t>(in.size()))] = nullptr;
    mf2 = true;
  }
  y.snapshot();
  const te_status s2 = TE_CALL(te_concat_columns, ctx, in.data(), n, &y.t);
  if (mf2) FUZZ_ASSERT(s2 != TE_SUCCESS, "te_concat_columns accepted a NULL input");
  if (s2 != TE_SUCCESS) {
    y.check_untouched("te_concat_columns", "y");
    FUZZ_ASSERT(mf2, "te_concat_columns refused the outputs of a successful split");
    return;
  }
  FUZZ_ASSERT(y.data.equals(x0), "te_concat_columns(te_split_columns(x)) is not x");
}

// ---- embedding --------------------------------------------------------------------------------

inline void Program::embedding_op() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, live_ctx_slot());
  const int64_t vocab = 1 + R.pick(48), dim = 1 + R.pick(24);
  const Shape is = gen_shape(64);
  const int64_t n = is.numel();
  bool odd = false;
  const int dt = hp_dtype(odd);
  const bool backward = R.u8() >= 140;  // the table is the forward's only
  Tensor table, ids;
  make(table, dt, shape2(vocab, dim));
  if (odd && !backward) TR_MUST_FAIL();
  make(ids, TE_DTYPE_I32, is);
  int32_t *id = reinterpret_cast<int32_t *>(ids.data.data());
  for (int64_t t = 0; t < n; ++t) id[t] = static_cast<int32_t>(R.pick(static_cast<uint32_t>(vocab)));
  const uint8_t bad = R.u8();
  if (bad >= 235) {  // "An id outside [0, vocab): the CPU refuses the call"
    static const int32_t kBad[4] = {-1, INT32_MIN, INT32_MAX, 0};
    const int32_t b = kBad[bad % 4] ? kBad[bad % 4] : static_cast<int32_t>(vocab);
    id[R.pick(static_cast<uint32_t>(n))] = b;
    TR_MUST_FAIL();
  }
  if (!backward) malform_here(table);
  malform_here(ids);
  if (table.malformed || ids.malformed) TR_MUST_FAIL();
  if (!backward) {
    Tensor y;
    const uint8_t yv = R.u8();
    Shape ys = is;
    if (ys.ndim < TE_MAX_DIMS) ys.d[ys.ndim++] = dim;
    else ys = shape2(n, dim);
    if (yv >= 200) ys = shape2(n, dim);  // "any shape of n * dim elements whose last dimension is dim"
    make(y, dt, ys);
    if (yv >= 245) {
      make(y, dt, shape2(n, dim + 1));
      TR_MUST_FAIL();
    } else if (yv >= 240) {
      make(y, dt == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32, ys);
      TR_MUST_FAIL();
    }
    malform_here(y);
    if (y.malformed) TR_MUST_FAIL();
    const std::vector<uint8_t> t0 = table.data.snapshot();
    y.snapshot();
    const te_status st = TE_CALL(te_embedding_forward, ctx, &table.t, &ids.t, &y.t);
    if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_embedding_forward accepted what it must reject");
    FUZZ_ASSERT(table.data.equals(t0), "te_embedding_forward wrote into the table");
    if (st != TE_SUCCESS) {
      y.check_untouched("te_embedding_forward", "y");
      return;
    }
    if (mf) return;
    const size_t row = static_cast<size_t>(dim) * dtype_bytes(dt);
    for (int64_t t = 0; t < n; ++t)
      FUZZ_ASSERT(std::memcmp(y.data.data() + static_cast<size_t>(t) * row, t0.data() + static_cast<size_t>(id[t]) * row, row) == 0,
                  "te_embedding_forward: token %lld is not table row %d", (long long)t, id[t]);
    return;
  }
  // Backward: dtable F32 [vocab, dim] (+= dy rows; zeroed first unless accumulate = 1).
  bool odd2 = false;
  const int ddt = hp_dtype(odd2);
  if (odd2) TR_MUST_FAIL();
  Tensor dy, dtable;
  make(dy, ddt, R.u8() < 128 ? shape2(n, dim) : [&] {
    Shape s = is;
    if (s.ndim < TE_MAX_DIMS) s.d[s.ndim++] = dim;
    else s = shape2(n, dim);
    return s;
  }());
  const uint8_t dv = R.u8();
  make(dtable, dv >= 245 ? TE_DTYPE_BF16 : TE_DTYPE_F32, shape2(vocab, dv >= 240 && dv < 245 ? dim + 1 : dim));
  if (dv >= 240) TR_MUST_FAIL();
  const uint8_t av = R.u8();
  const int32_t acc = av < 128 ? 0 : av < 250 ? 1 : 2;
  if (acc == 2) TR_MUST_FAIL();
  malform_here(dy);
  malform_here(dtable);
  if (dy.malformed || dtable.malformed) TR_MUST_FAIL();
  const std::vector<uint8_t> dy0 = dy.data.snapshot();
  dtable.snapshot();
  const std::vector<uint8_t> old = dtable.data.snapshot();
  const te_status st = TE_CALL(te_embedding_backward, ctx, &ids.t, &dy.t, &dtable.t, acc);
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_embedding_backward accepted what it must reject");
  FUZZ_ASSERT(dy.data.equals(dy0), "te_embedding_backward wrote into dy");
  if (st != TE_SUCCESS) {
    dtable.check_untouched("te_embedding_backward", "dtable");
    return;
  }
  if (mf) return;
  // Each row: its tokens summed in increasing t in fp32, from 0 (or from the old row, or the old
  // row plus the sum: te.h does not say which for accumulate = 1, so either passes).
  for (int64_t r = 0; r < vocab; ++r)
    for (int64_t d = 0; d < dim; ++d) {
      float sum = 0.0f, from_old = acc ? load_hp(old.data(), TE_DTYPE_F32, r * dim + d) : 0.0f;
      for (int64_t t = 0; t < n; ++t)
        if (id[t] == r) {
          const float g = load_hp(dy0.data(), ddt, t * dim + d);
          sum += g;
          from_old += g;
        }
      const float plus = acc ? load_hp(old.data(), TE_DTYPE_F32, r * dim + d) + sum : sum;
      const float got = load_hp(dtable.data.data(), TE_DTYPE_F32, r * dim + d);
      if (std::isnan(plus) || std::isnan(from_old))
        FUZZ_ASSERT(std::isnan(got), "te_embedding_backward: dtable[%lld, %lld] = %g, expected NaN", (long long)r,
                    (long long)d, (double)got);
      else
        FUZZ_ASSERT(std::memcmp(&got, &plus, 4) == 0 || std::memcmp(&got, &from_old, 4) == 0,
                    "te_embedding_backward: dtable[%lld, %lld] = %g, expected %g (fp32 sums in increasing t)",
                    (long long)r, (long long)d, (double)got, (double)plus);
    }
}

// ---- cross-entropy ----------------------------------------------------------------------------

inline void Program::cross_entropy_op() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, live_ctx_slot());
  const int64_t vocab = 1 + R.pick(40);
  Shape lead;
  lead.ndim = 1 + static_cast<int>(R.pick(2));
  for (int i = 0; i < lead.ndim; ++i) lead.d[i] = 1 + R.pick(8);
  const int64_t n = lead.numel();
  Shape ls = lead;
  ls.d[ls.ndim++] = vocab;
  bool odd = false;
  const int dt = hp_dtype(odd);
  if (odd) TR_MUST_FAIL();
  Tensor logits, targets, loss, dl;
  make(logits, dt, ls);
  te_cross_entropy_options o;
  std::memset(&o, 0x5A, sizeof o);
  FUZZ_ASSERT(TE_CALL(te_cross_entropy_options_init, &o) == TE_SUCCESS && o.struct_size == sizeof o &&
                  o.ignore_index == -100 && o.grad_scale == 1.0f,
              "te_cross_entropy_options_init defaults");
  const uint8_t iv = R.u8();
  if (iv >= 200) o.ignore_index = static_cast<int32_t>(iv % 4 == 0 ? R.pick(static_cast<uint32_t>(vocab)) : -1 - R.pick(4));
  const uint8_t gv = R.u8();
  bool scale_unbounded = false;  // a non-finite grad_scale: te.h does not say
  if (gv >= 180) {
    static const float kScale[8] = {0.5f, 2.0f, 0.0f, -1.0f, 1e-3f, 65536.0f, NAN, INFINITY};
    o.grad_scale = kScale[gv % 8];
    scale_unbounded = !std::isfinite(o.grad_scale);
  }
  make(targets, TE_DTYPE_I32, R.u8() < 200 ? lead : shape1(n));
  int32_t *tg = reinterpret_cast<int32_t *>(targets.data.data());
  for (int64_t t = 0; t < n; ++t) tg[t] = R.u8() >= 230 ? o.ignore_index : static_cast<int32_t>(R.pick(static_cast<uint32_t>(vocab)));
  const uint8_t tv = R.u8();
  if (tv >= 240) {  // a target outside [0, vocab) other than ignore_index
    const int32_t b = tv % 3 == 0 ? static_cast<int32_t>(vocab) : tv % 3 == 1 ? INT32_MIN : -7;
    if (b != o.ignore_index) {
      tg[R.pick(static_cast<uint32_t>(n))] = b;
      TR_MUST_FAIL();
    }
  } else if (tv >= 236) {
    make(targets, TE_DTYPE_I32, shape1(n + 1));
    TR_MUST_FAIL();
  }
  const uint8_t lv = R.u8();
  make(loss, lv >= 250 ? TE_DTYPE_BF16 : TE_DTYPE_F32, lv >= 245 && lv < 250 ? shape1(2) : shape1(1));
  if (lv >= 245) TR_MUST_FAIL();
  const uint8_t dv = R.u8();
  te_tensor *dlp = nullptr;
  bool in_place = false;
  if (dv < 150) {
    make(dl, dt, ls);
    dlp = &dl.t;
  } else if (dv < 200) {
    dlp = &logits.t;  // "may be logits itself (in place)"
    in_place = true;
  } else if (dv >= 245) {
    Shape w = ls;
    w.d[w.ndim - 1] += 1;
    make(dl, dt, w);
    dlp = &dl.t;
    TR_MUST_FAIL();
  } else if (dv >= 240) {
    make(dl, dt == TE_DTYPE_F32 ? TE_DTYPE_BF16 : TE_DTYPE_F32, ls);
    dlp = &dl.t;
    TR_MUST_FAIL();
  }
  malform_here(logits);
  malform_here(targets);
  malform_here(loss);
  if (logits.malformed || targets.malformed || loss.malformed) TR_MUST_FAIL();
  if (dlp == &dl.t) {
    malform_here(dl);
    if (dl.malformed) TR_MUST_FAIL();
  }
  const uint8_t ov = R.u8();
  const bool null_opts = ov >= 240;  // "opts may be NULL": the defaults
  if (ov >= 236 && ov < 240) {
    o.struct_size = 3;
    TR_MUST_FAIL();
  }
  const std::vector<uint8_t> x0 = logits.data.snapshot();
  loss.snapshot();
  if (dlp == &dl.t) dl.snapshot();
  const te_status st = TE_CALL(te_cross_entropy, ctx, null_opts ? nullptr : &o, &logits.t, &targets.t, &loss.t, dlp);
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_cross_entropy accepted what it must reject");
  if (!in_place) FUZZ_ASSERT(logits.data.equals(x0), "te_cross_entropy wrote into logits");
  if (st != TE_SUCCESS) {
    loss.check_untouched("te_cross_entropy", "loss");
    if (dlp == &dl.t) dl.check_untouched("te_cross_entropy", "dlogits");
    FUZZ_ASSERT(logits.data.equals(x0), "te_cross_entropy failed but wrote into logits");
    return;
  }
  if (mf || scale_unbounded) return;
  // The fp64 reference from the values given (te.h: stable for any finite logits).
  Tensor ref;
  ref.data = Blob(x0.size());
  std::memcpy(ref.data.data(), x0.data(), x0.size());
  set_enum(ref.t.dtype, dt);
  if (!all_finite(ref)) return;
  // Per-token losses beyond fp32's range (logits near it) cannot be summed in fp32: not checked.
  for (int64_t i = 0; i < n * vocab; ++i)
    if (std::fabs(load_hp(x0.data(), dt, i)) > 1e18f) return;
  const int32_t ign = null_opts ? -100 : o.ignore_index;
  const double gs = null_opts ? 1.0 : o.grad_scale;
  double total = 0;
  int64_t count = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (tg[t] == ign) continue;
    ++count;
    double mx = -INFINITY, s = 0;
    for (int64_t v = 0; v < vocab; ++v) mx = std::max(mx, (double)load_hp(x0.data(), dt, t * vocab + v));
    for (int64_t v = 0; v < vocab; ++v) s += std::exp((double)load_hp(x0.data(), dt, t * vocab + v) - mx);
    total += mx + std::log(s) - load_hp(x0.data(), dt, t * vocab + tg[t]);
  }
  const float got = load_hp(loss.data.data(), TE_DTYPE_F32, 0);
  if (count == 0) {
    FUZZ_ASSERT(got == 0.0f, "te_cross_entropy: count 0 gives loss 0, got %g", (double)got);
  } else {
    const double want = total / static_cast<double>(count);
    FUZZ_ASSERT(std::fabs(got - want) <= 1e-4 * std::max(1.0, std::fabs(want)) + 1e-3 * (dt != TE_DTYPE_F32),
                "te_cross_entropy: loss %.9g, fp64 reference %.9g (%lld tokens counted)", (double)got, want,
                (long long)count);
  }
  if (!dlp) return;
  const void *d = dlp->data;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t v = 0; v < vocab; ++v) {
      const float g = load_hp(d, dt, t * vocab + v);
      if (tg[t] == ign || count == 0) {
        FUZZ_ASSERT(g == 0.0f, "te_cross_entropy: dlogits of an ignored token (%lld) is %g, not 0", (long long)t, (double)g);
        continue;
      }
      if (dt != TE_DTYPE_F32 || std::fabs(gs) > 1e4) continue;
      double mx = -INFINITY, s = 0;
      for (int64_t u = 0; u < vocab; ++u) mx = std::max(mx, (double)load_hp(x0.data(), dt, t * vocab + u));
      for (int64_t u = 0; u < vocab; ++u) s += std::exp((double)load_hp(x0.data(), dt, t * vocab + u) - mx);
      const double want =
          gs * (std::exp((double)load_hp(x0.data(), dt, t * vocab + v) - mx) / s - (v == tg[t] ? 1.0 : 0.0)) / count;
      FUZZ_ASSERT(std::fabs(g - want) <= 1e-5 * std::max(1.0, std::fabs(gs)),
                  "te_cross_entropy: dlogits[%lld, %lld] = %.9g, fp64 reference %.9g", (long long)t, (long long)v,
                  (double)g, want);
    }
  }
}

// ---- AdamW --------------------------------------------------------------------------------------

inline void Program::adamw_op() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs, live_ctx_slot());
  te_adamw_options o;
  std::memset(&o, 0x5A, sizeof o);
  FUZZ_ASSERT(TE_CALL(te_adamw_options_init, &o) == TE_SUCCESS && o.struct_size == sizeof o && o.lr == 1e-3f &&
                  o.beta1 == 0.9f && o.beta2 == 0.999f && o.eps == 1e-8f && o.weight_decay == 0.01f && o.step == 1 &&
                  o.max_grad_norm == 0.0f && o.grad_norm == nullptr,
              "te_adamw_options_init defaults");
  bool unbounded = false;  // an option te.h leaves open (a negative max_grad_norm)
  const uint8_t ov = R.u8();
  if (ov >= 128) {
    switch (ov % 10) {
      case 0: o.lr = -1e-3f; TR_MUST_FAIL(); break;
      case 1: o.beta1 = 1.0f; TR_MUST_FAIL(); break;
      case 2: o.beta2 = -0.5f; TR_MUST_FAIL(); break;
      case 3: o.eps = 0.0f; TR_MUST_FAIL(); break;
      case 4: o.step = static_cast<int64_t>(R.u8()) - 200; if (o.step < 1) TR_MUST_FAIL(); break;
      case 5: o.weight_decay = -0.01f; TR_MUST_FAIL(); break;
      case 6: o.max_grad_norm = 0.5f + R.pick(4); break;
      case 7: o.max_grad_norm = -1.0f; unbounded = true; break;
      case 8: o.lr = 0.1f; o.beta1 = 0.0f; o.step = 1 + R.pick(1000); break;
      default: o.struct_size = 1 + R.pick(static_cast<uint32_t>(sizeof o - 1)); TR_MUST_FAIL(); break;
    }
  }
  Blob norm(sizeof(float));
  if (R.u8() < 160) o.grad_norm = norm.floats();
  // The entries: a few parameters, sometimes of a module of the program.
  const size_t count = R.u8() >= 250 ? 0 : 1 + R.pick(3);
  struct Entry {
    Tensor p, g, m, v, mw;
    std::vector<uint8_t> p0, g0, m0, v0;
    bool has_mw = false;
    int owner_kind = 0, lin = -1, ln = -1;
  };
  std::vector<Entry> E(count);
  std::vector<te_adamw_param> P(count);
  std::vector<std::vector<uint8_t>> owner_state;
  std::vector<std::pair<void *, int>> owner_h;  // (handle, -1 linear / ln kind)
  std::set<const void *> owners_used;
  for (size_t i = 0; i < count; ++i) {
    Entry &e = E[i];
    te_adamw_param &p = P[i];
    FUZZ_ASSERT(TE_CALL(te_adamw_param_init, &p) == TE_SUCCESS && p.struct_size == sizeof p && p.weight_decay == 1 &&
                    get_enum(p.owner_kind) == TE_MODULE_NONE && !p.param && !p.owner,
                "te_adamw_param_init defaults");
    Shape s = gen_shape(1024);
    // An owner: a live linear or LayerNorm module of this context, the param shaped as its weight.
    const uint8_t wv = R.u8();
    if (wv >= 150 && cs >= 0) {
      if (wv < 200) {
        const int ls = static_cast<int>(R.pick(kLinearSlots));
        if (lin_[ls].live && lin_[ls].ctx == cs) {
          e.owner_kind = TE_MODULE_LINEAR;
          e.lin = ls;
          s = shape2(lin_[ls].cfg.out, lin_[ls].cfg.in);
          p.owner = lin_[ls].h;
        }
      } else {
        const int ns = static_cast<int>(R.pick(kLnSlots));
        if (ln_[ns].live && ln_[ns].ctx == cs) {
          const LnCfg &c = ln_[ns].cfg;
          e.ln = ns;
          p.owner = ln_[ns].h;
          if (c.kind == 0) {
            e.owner_kind = TE_MODULE_LAYERNORM_LINEAR;
            s = shape2(c.out, c.in);
          } else {
            e.owner_kind = TE_MODULE_LAYERNORM_MLP;
            p.owner_gemm = static_cast<int32_t>(R.pick(2));
            s = p.owner_gemm == TE_MLP_FC1 ? shape2(c.fc1_rows(), c.in) : shape2(c.in, c.out);
          }
        }
      }
      if (e.owner_kind && !(s.good() && s.numel() <= kMaxElems)) {  // a module too large to fuzz fast
        e.owner_kind = 0;
        e.lin = e.ln = -1;
        p.owner = nullptr;
        p.owner_gemm = 0;
        s = shape2(4, 4);
      }
      set_enum(p.owner_kind, e.owner_kind);
      if (e.owner_kind) {
        const uint8_t bv = R.u8();
        if (bv >= 240) {  // the owner of the wrong kind
          set_enum(p.owner_kind, e.owner_kind == TE_MODULE_LINEAR ? TE_MODULE_LAYERNORM_LINEAR : TE_MODULE_LINEAR);
          TR_MUST_FAIL();
        } else if (bv >= 232) {  // the param not shaped as the owner's weight
          s.d[0] += 1;
          TR_MUST_FAIL();
        } else if (bv >= 228 && e.owner_kind == TE_MODULE_LAYERNORM_MLP) {
          p.owner_gemm = bv % 2 ? 2 : -1;
          TR_MUST_FAIL();
        } else if (bv >= 224) {
          p.owner = nullptr;  // "the module handle of owner_kind, or NULL"
        }
        if (tracing())
          std::fprintf(stderr, "  (adamw entry %zu: owner kind %d%s)\n", i, get_enum(p.owner_kind), p.owner ? "" : ", NULL");
        if (p.owner) {
          // One module weight owning two params: te.h does not say (the implementation refuses it).
          if (!owners_used.insert(p.owner).second) unbounded = true;
          owner_h.push_back({const_cast<void *>(p.owner), e.lin >= 0 ? -1 : ln_[e.ln].cfg.kind});
        }
      }
    } else if (wv >= 145) {
      set_enum(p.owner_kind, wv == 149 ? 7 : TE_MODULE_NONE);
      p.owner = wv == 149 ? nullptr : static_cast<const void *>(ctx);  // a bad kind, or an owner with NONE
      TR_MUST_FAIL();
    }
    make(e.p, TE_DTYPE_F32, s);
    bool odd = false;
    make(e.g, hp_dtype(odd), s);
    if (odd) TR_MUST_FAIL();
    make(e.m, TE_DTYPE_F32, s);
    make(e.v, TE_DTYPE_F32, s);
    for (int64_t k = 0; k < s.numel(); ++k)  // a second moment is never negative
      store_hp(e.v.data.data(), TE_DTYPE_F32, k, std::fabs(load_hp(e.v.data.data(), TE_DTYPE_F32, k)));
    const uint8_t mv = R.u8();
    if (mv < 120) {
      bool odd2 = false;
      make(e.mw, hp_dtype(odd2), s);
      if (odd2) TR_MUST_FAIL();
      e.has_mw = true;
    }
    const uint8_t xv = R.u8();
    if (xv >= 248) {  // a moment of another size
      make(e.m, TE_DTYPE_F32, shape1(s.numel() + 1));
      TR_MUST_FAIL();
    } else if (xv >= 244) {  // a moment that is not F32
      make(e.v, TE_DTYPE_BF16, s);
      TR_MUST_FAIL();
    }
    malform_here(e.p);
    malform_here(e.g);
    malform_here(e.m);
    if (e.p.malformed || e.g.malformed || e.m.malformed) TR_MUST_FAIL();
    p.param = &e.p.t;
    p.grad = &e.g.t;
    p.exp_avg = &e.m.t;
    p.exp_avg_sq = &e.v.t;
    p.model_weight = e.has_mw ? &e.mw.t : nullptr;
    const uint8_t dv = R.u8();
    p.weight_decay = dv < 128 ? 1 : dv < 250 ? 0 : 2;
    if (p.weight_decay == 2) TR_MUST_FAIL();
    const uint8_t tv = R.u8();
    if (tv >= 250) {  // "a tensor given twice"
      p.exp_avg_sq = &e.m.t;
      TR_MUST_FAIL();
    } else if (tv >= 246 && i > 0) {
      p.param = P[0].param;
      TR_MUST_FAIL();
    }
  }
  for (auto &oh : owner_h)
    owner_state.push_back(oh.second < 0 ? layer_state(ctx, static_cast<te_linear *>(oh.first)) : ln_state(ctx, oh.first, oh.second));
  for (auto &e : E) {
    e.p0 = e.p.data.snapshot();
    e.g0 = e.g.data.snapshot();
    e.m0 = e.m.data.snapshot();
    e.v0 = e.v.data.snapshot();
    e.mw.snapshot();
  }
  const std::vector<uint8_t> norm0 = norm.snapshot();
  const te_status st = TE_CALL(te_adamw_step, ctx, &o, count ? P.data() : nullptr, count);
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_adamw_step accepted what it must reject");
  bool unchanged = true;
  for (auto &e : E)
    unchanged = unchanged && e.p.data.equals(e.p0) && e.m.data.equals(e.m0) && e.v.data.equals(e.v0) &&
                e.mw.data.equals(e.mw.snap_data);
  for (auto &e : E) FUZZ_ASSERT(e.g.data.equals(e.g0), "te_adamw_step wrote into a gradient");
  if (st != TE_SUCCESS) {
    FUZZ_ASSERT(unchanged && norm.equals(norm0), "te_adamw_step failed but changed a tensor (\"on failure nothing changes\")");
    for (size_t k = 0; k < owner_h.size(); ++k) {
      const auto now = owner_h[k].second < 0 ? layer_state(ctx, static_cast<te_linear *>(owner_h[k].first))
                                             : ln_state(ctx, owner_h[k].first, owner_h[k].second);
      FUZZ_ASSERT(now == owner_state[k], "te_adamw_step failed but changed an owner's state");
    }
    return;
  }
  if (mf || unbounded || count == 0) return;
  // The reference: PyTorch's AdamW in fp64 (te.h's formulas), clipping by the global norm.
  double sq = 0;
  for (auto &e : E)
    for (int64_t k = 0; k < e.p.shape.numel(); ++k) {
      const double g = load_hp(e.g0.data(), get_enum(e.g.t.dtype), k);
      sq += g * g;
    }
  const double gnorm = std::sqrt(sq);
  // Squares beyond fp32's range: the device's fp32 sum may overflow to inf where fp64's does not
  // (then "a non-finite norm skips the whole update"): either is fine.
  if (std::isfinite(gnorm) && gnorm > 1e18) return;
  if (o.grad_norm && std::isfinite(gnorm))
    FUZZ_ASSERT(std::fabs(*o.grad_norm - gnorm) <= 1e-4 * gnorm + 1e-6, "te_adamw_step: grad_norm %.9g, fp64 %.9g",
                (double)*o.grad_norm, gnorm);
  if (o.max_grad_norm > 0 && !std::isfinite(gnorm)) {
    FUZZ_ASSERT(unchanged, "te_adamw_step: a non-finite gradient norm with clipping must change nothing");
    return;
  }
  const double clip = o.max_grad_norm > 0 ? std::min(1.0, o.max_grad_norm / (gnorm + 1e-6)) : 1.0;
  const double bc1 = 1 - std::pow((double)o.beta1, (double)o.step), bc2 = 1 - std::pow((double)o.beta2, (double)o.step);
  for (size_t i = 0; i < count; ++i) {
    Entry &e = E[i];
    const int gd = get_enum(e.g.t.dtype);
    for (int64_t k = 0; k < e.p.shape.numel(); ++k) {
      const double g = load_hp(e.g0.data(), gd, k) * clip;
      double p = load_hp(e.p0.data(), TE_DTYPE_F32, k);
      const double m0 = load_hp(e.m0.data(), TE_DTYPE_F32, k), v0 = load_hp(e.v0.data(), TE_DTYPE_F32, k);
      if (!std::isfinite(g) || !std::isfinite(p) || !std::isfinite(m0) || !std::isfinite(v0)) continue;
      if (P[i].weight_decay) p -= (double)o.lr * o.weight_decay * p;
      const double m = o.beta1 * m0 + (1 - (double)o.beta1) * g, v = o.beta2 * v0 + (1 - (double)o.beta2) * g * g;
      // fp32 error bounds from the terms' sizes (b m0 + (1 - b) g may cancel), carried into p.
      const double tol_m = 1e-6 * (std::fabs(o.beta1 * m0) + std::fabs((1 - (double)o.beta1) * g)) + 1e-30;
      const double tol_v = 1e-6 * (std::fabs(o.beta2 * v0) + (1 - (double)o.beta2) * g * g) + 1e-30;
      const double den = std::sqrt(v / bc2) + o.eps, upd = o.lr * (m / bc1) / den;
      p -= upd;
      // Near fp32's range the fp32 steps (m / bc1, v / bc2, lr * m_hat) may overflow where fp64's do not.
      if (!(std::fabs(p) < 1e20) || !(v / bc2 < 1e30) || !(std::fabs(m / bc1) < 1e30)) continue;
      const double tol_p = 2e-6 * std::fabs(p) + 1e-5 * std::fabs(upd) + o.lr * (tol_m / bc1) / den +
                           std::fabs(upd) * std::sqrt(tol_v / bc2) / den + 1e-7;
      const float gp = load_hp(e.p.data.data(), TE_DTYPE_F32, k), gm = load_hp(e.m.data.data(), TE_DTYPE_F32, k),
                  gv = load_hp(e.v.data.data(), TE_DTYPE_F32, k);
      FUZZ_ASSERT(std::fabs(gm - m) <= tol_m,
                  "te_adamw_step: exp_avg[%lld] of entry %zu = %.9g, fp64 %.9g (m0 %.9g, grad %.9g, clip %.9g of norm "
                  "%.9g, beta1 %g)",
                  (long long)k, i, (double)gm, m, m0, load_hp(e.g0.data(), gd, k), clip, gnorm, (double)o.beta1);
      FUZZ_ASSERT(std::fabs(gv - v) <= tol_v, "te_adamw_step: exp_avg_sq[%lld] of entry %zu = %.9g, fp64 %.9g",
                  (long long)k, i, (double)gv, v);
      FUZZ_ASSERT(std::fabs(gp - p) <= tol_p, "te_adamw_step: param[%lld] of entry %zu = %.9g, fp64 %.9g (update %.9g)",
                  (long long)k, i, (double)gp, p, upd);
      if (e.has_mw) {
        const int md = get_enum(e.mw.t.dtype);
        if (md == TE_DTYPE_F16) continue;  // the harness's F16 conversion truncates
        std::vector<uint8_t> cell(4);
        store_hp(cell.data(), md, 0, gp);
        FUZZ_ASSERT(std::memcmp(e.mw.data.data() + k * dtype_bytes(md), cell.data(), dtype_bytes(md)) == 0,
                    "te_adamw_step: model_weight[%lld] is not the new param rounded to its dtype", (long long)k);
      }
    }
  }
}

// ---- checkpoints --------------------------------------------------------------------------------

inline te_checkpoint *Program::ck_arg(bool &mf, int &slot) {
  const uint8_t v = R.u8();
  slot = -1;
  if (v < 245) {
    slot = v % kCkSlots;
    if (!ck_[slot].live) mf = true;
    return ck_[slot].h;
  }
  mf = true;
  if (v < 249) return nullptr;
  if (v < 253 && !dead_ck_.empty()) return dead_ck_[R.pick(static_cast<uint32_t>(dead_ck_.size()))];
  return static_cast<te_checkpoint *>(some_live_handle(11));
}

// A record name: usually one of a few, sometimes empty, 255 or 256 bytes, or odd bytes.
inline std::string Program::ck_name(bool &mf, bool &null_name) {
  static const char *const kNames[6] = {"weight", "exp_avg", "step", "w", "layer.0.fc1", "state"};
  null_name = false;
  const uint8_t v = R.u8();
  if (v < 220) return kNames[v % 6];
  switch (v % 6) {
    case 0: mf = true; return "";
    case 1: return std::string(255, 'n');
    case 2: mf = true; return std::string(256, 'n');
    case 3: mf = true; null_name = true; return "";
    default: {
      std::string s;
      const size_t n = 1 + R.pick(12);
      for (size_t i = 0; i < n; ++i) s += static_cast<char>(1 + R.pick(255));  // no NUL inside
      return s;
    }
  }
}

inline void Program::ck_check_model(int slot) {
  CkSlot &c = ck_[slot];
  size_t n = 0;
  FUZZ_ASSERT(TE_CALL(te_checkpoint_count, c.h, &n) == TE_SUCCESS && n == c.recs.size(),
              "te_checkpoint_count: %zu records, the model has %zu", n, c.recs.size());
  std::set<std::string> names;
  for (size_t i = 0; i < n; ++i) {
    const char *name = nullptr;
    FUZZ_ASSERT(TE_CALL(te_checkpoint_name, c.h, i, &name) == TE_SUCCESS && name, "te_checkpoint_name(%zu)", i);
    FUZZ_ASSERT(c.recs.count(name) && names.insert(name).second, "te_checkpoint_name(%zu): '%s' is not a record of the model (or twice)", i, name);
    // What te_checkpoint_record_info says of it: kind, dtype, shape, payload size.
    const CkRec &r = c.recs[name];
    int32_t is_tensor = 7;
    te_tensor info;
    std::memset(&info, 0x5C, sizeof info);
    const te_tensor untouched = info;
    size_t size = 0;
    FUZZ_ASSERT(TE_CALL(te_checkpoint_record_info, c.h, name, &is_tensor, &info, &size) == TE_SUCCESS,
                "te_checkpoint_record_info of a record");
    FUZZ_ASSERT(size == r.bytes.size() && is_tensor == (r.tensor ? 1 : 0),
                "te_checkpoint_record_info('%s'): is_tensor %d, size %zu; the model: %d, %zu", name, is_tensor, size,
                r.tensor ? 1 : 0, r.bytes.size());
    if (!r.tensor) {
      FUZZ_ASSERT(std::memcmp(&info, &untouched, sizeof info) == 0, "te_checkpoint_record_info wrote *shape for a byte record");
    } else {
      bool same = get_enum(info.dtype) == r.dtype && info.ndim == r.shape.ndim && !info.data && !info.scale_inv &&
                  info.device.type == TE_DEVICE_CPU;
      for (int d = 0; same && d < info.ndim; ++d) same = info.shape[d] == r.shape.d[d];
      FUZZ_ASSERT(same, "te_checkpoint_record_info('%s'): *shape is not the record's dtype and shape", name);
    }
  }
  {
    int32_t is_tensor = 7;
    size_t size = 99;
    const std::string missing = "no such record \x01";
    if (!c.recs.count(missing))
      FUZZ_ASSERT(TE_CALL(te_checkpoint_record_info, c.h, missing.c_str(), &is_tensor, nullptr, &size) ==
                          TE_ERROR_INVALID_ARGUMENT && is_tensor == 7 && size == 99,
                  "te_checkpoint_record_info of no record must fail and leave the outputs");
  }
  const char *name = sentinel<const char>();
  FUZZ_ASSERT(TE_CALL(te_checkpoint_name, c.h, n, &name) == TE_ERROR_INVALID_ARGUMENT && name == sentinel<const char>(),
              "te_checkpoint_name(count) must fail and leave *name");
}

// A new checkpoint handle parsed from bytes must hold exactly the model's records.
inline void Program::ck_check_same(te_checkpoint *h, const std::map<std::string, CkRec> &recs) {
  size_t n = 0;
  FUZZ_ASSERT(TE_CALL(te_checkpoint_count, h, &n) == TE_SUCCESS && n == recs.size(), "a round trip changed the record count");
  for (auto &r : recs) {
    if (r.second.tensor) {
      te_tensor t{};
      set_enum(t.dtype, r.second.dtype);
      t.ndim = r.second.shape.ndim;
      for (int i = 0; i < t.ndim; ++i) t.shape[i] = r.second.shape.d[i];
      t.device.type = TE_DEVICE_CPU;
      Blob b(r.second.bytes.size());
      t.data = b.data();
      bool mf = false;
      int cs;
      te_context *ctx = ctx_arg(mf, cs, live_ctx_slot());
      if (mf) continue;
      FUZZ_ASSERT(TE_CALL(te_checkpoint_get_tensor, h, ctx, r.first.c_str(), &t) == TE_SUCCESS && b.equals(r.second.bytes),
                  "a round trip changed tensor record '%s'", r.first.c_str());
    } else {
      size_t sz = 0;
      Blob b(r.second.bytes.size());
      FUZZ_ASSERT(TE_CALL(te_checkpoint_get_bytes, h, r.first.c_str(), b.data(), b.size(), &sz) == TE_SUCCESS &&
                      sz == b.size() && b.equals(r.second.bytes),
                  "a round trip changed byte record '%s'", r.first.c_str());
    }
  }
}

inline void Program::checkpoint_op() {
  bool mf = false;
  const uint8_t what = R.u8() % 10;
  if (what == 0) {  // create
    CkSlot &c = ck_[R.pick(kCkSlots)];
    if (c.live) return;
    te_checkpoint *h = sentinel<te_checkpoint>();
    FUZZ_ASSERT(TE_CALL(te_checkpoint_create, &h) == TE_SUCCESS && h && h != sentinel<te_checkpoint>(), "te_checkpoint_create");
    c.h = h;
    c.live = true;
    c.recs.clear();
    return;
  }
  if (what == 1) {  // destroy (a destroyed or NULL handle: nothing happens)
    CkSlot &c = ck_[R.pick(kCkSlots)];
    te_checkpoint_destroy(c.h);
    if (c.live) dead_ck_.push_back(c.h);
    c.live = false;
    c.recs.clear();
    return;
  }
  int slot;
  te_checkpoint *h = ck_arg(mf, slot);
  CkSlot *c = slot >= 0 && ck_[slot].live ? &ck_[slot] : nullptr;
  bool null_name = false;
  const std::string name = what <= 6 ? ck_name(mf, null_name) : std::string();
  const char *np = null_name ? nullptr : name.c_str();
  const std::string before = c ? ck_state(*c) : "";
  switch (what) {
    case 2: case 3: {  // put_tensor
      int cs;
      te_context *ctx = ctx_arg(mf, cs, live_ctx_slot());
      static const int kDt[6] = {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16, TE_DTYPE_I32, TE_DTYPE_E4M3, TE_DTYPE_E5M2};
      const int dt = kDt[R.u8() < 220 ? R.pick(4) : 4 + R.pick(2)];
      if (is_fp8(dt)) TR_MUST_FAIL();  // "FP8 tensors are refused"
      Tensor t;
      make(t, dt, gen_shape(512));
      malform_here(t);
      if (t.malformed) TR_MUST_FAIL();
      const std::vector<uint8_t> t0 = t.data.snapshot();
      const te_status st = TE_CALL(te_checkpoint_put_tensor, h, ctx, np, &t.t);
      if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_checkpoint_put_tensor accepted what it must reject");
      FUZZ_ASSERT(t.data.equals(t0), "te_checkpoint_put_tensor wrote into t");
      if (st == TE_SUCCESS && c && !mf) {
        CkRec r;
        r.tensor = true;
        r.dtype = dt;
        r.shape.ndim = t.t.ndim;  // as given (maybe_malform may add leading 1s)
        for (int i = 0; i < t.t.ndim; ++i) r.shape.d[i] = t.t.shape[i];
        r.bytes = t0;
        c->recs[name] = r;
      }
      break;
    }
    case 4: {  // put_bytes
      const size_t n = R.u8() < 240 ? R.pick(64) : 0;
      Blob b(n);
      for (size_t i = 0; i < n; ++i) b.data()[i] = R.u8();
      const void *data = b.data();
      const uint8_t dv = R.u8();
      if (dv >= 250 && n > 0) {
        data = nullptr;
        TR_MUST_FAIL();
      }
      const te_status st = TE_CALL(te_checkpoint_put_bytes, h, np, data, n);
      if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_checkpoint_put_bytes accepted what it must reject");
      if (st == TE_SUCCESS && c && !mf) {
        CkRec r;
        r.bytes = b.snapshot();
        c->recs[name] = r;
      }
      break;
    }
    case 5: {  // get_tensor: of the stored dtype and shape, or not
      int cs;
      te_context *ctx = ctx_arg(mf, cs, live_ctx_slot());
      std::map<std::string, CkRec>::iterator it{};
      if (c) it = c->recs.find(name);
      const bool known = c && it != c->recs.end();
      if (!known || !it->second.tensor) TR_MUST_FAIL();  // no such record, or a byte record
      Tensor t;
      if (known && it->second.tensor) {
        make(t, it->second.dtype, it->second.shape);
        const uint8_t sv = R.u8();
        if (sv >= 240) {
          Shape s = it->second.shape;
          s.d[0] += 1;
          make(t, it->second.dtype, s);
          TR_MUST_FAIL();
        } else if (sv >= 236) {
          make(t, it->second.dtype == TE_DTYPE_F32 ? TE_DTYPE_I32 : TE_DTYPE_F32, it->second.shape);
          TR_MUST_FAIL();
        }
      } else {
        make(t, TE_DTYPE_F32, shape2(2, 2));
      }
      malform_here(t);
      if (t.malformed) TR_MUST_FAIL();
      t.snapshot();
      const te_status st = TE_CALL(te_checkpoint_get_tensor, h, ctx, np, &t.t);
      if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_checkpoint_get_tensor accepted what it must reject");
      if (st != TE_SUCCESS) t.check_untouched("te_checkpoint_get_tensor", "t");
      else if (!mf) FUZZ_ASSERT(t.data.equals(it->second.bytes), "te_checkpoint_get_tensor: not the bytes put");
      break;
    }
    case 6: {  // get_bytes: size query, exact, larger, short
      std::map<std::string, CkRec>::iterator it{};
      if (c) it = c->recs.find(name);
      const bool known = c && it != c->recs.end() && !it->second.tensor;
      if (!known) TR_MUST_FAIL();
      const size_t len = known ? it->second.bytes.size() : 0;
      const uint8_t cv = R.u8();
      size_t cap = cv < 64 ? 0 : cv < 200 ? len : cv < 240 ? len + 5 : (len ? len - 1 : 0);
      Blob b(cap);
      void *buf = cv < 64 ? nullptr : b.data();
      if (cv >= 240 && len) TR_MUST_FAIL();  // "A capacity below the length: INVALID_ARGUMENT, *size set"
      if (cv >= 64 && cv < 70) {  // NULL with a capacity
        buf = nullptr;
        cap = len + 1;
        TR_MUST_FAIL();
      }
      const std::vector<uint8_t> b0 = b.snapshot();
      size_t size = 0xDEAD;
      const te_status st = TE_CALL(te_checkpoint_get_bytes, h, np, buf, cap, &size);
      if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_checkpoint_get_bytes accepted what it must reject");
      if (st != TE_SUCCESS) {
        FUZZ_ASSERT(b.equals(b0), "te_checkpoint_get_bytes failed but wrote into buf");
        if (known && buf && cap < len) FUZZ_ASSERT(size == len, "te_checkpoint_get_bytes: a short capacity must set *size");
      } else if (!mf) {
        FUZZ_ASSERT(size == len, "te_checkpoint_get_bytes: *size %zu, the record has %zu bytes", size, len);
        if (buf && len) FUZZ_ASSERT(std::memcmp(b.data(), it->second.bytes.data(), len) == 0, "te_checkpoint_get_bytes: not the bytes put");
      }
      break;
    }
    case 7: {  // serialize, deserialize; a damaged copy must be refused
      size_t need = 0;
      const te_status st = TE_CALL(te_checkpoint_serialize, h, nullptr, 0, &need);
      if (mf) {
        FUZZ_ASSERT(st != TE_SUCCESS, "te_checkpoint_serialize accepted what it must reject");
        break;
      }
      FUZZ_ASSERT(st == TE_SUCCESS && need > 0 && need < (1u << 24), "te_checkpoint_serialize size query");
      Blob b(need);
      size_t got = 0;
      if (R.u8() >= 240) {
        Blob s(need - 1);
        const std::vector<uint8_t> s0 = s.snapshot();
        FUZZ_ASSERT(TE_CALL(te_checkpoint_serialize, h, s.data(), need - 1, &got) == TE_ERROR_INVALID_ARGUMENT && s.equals(s0),
                    "te_checkpoint_serialize into a buffer one byte short must fail and write nothing");
      }
      FUZZ_ASSERT(TE_CALL(te_checkpoint_serialize, h, b.data(), need, &got) == TE_SUCCESS && got == need,
                  "te_checkpoint_serialize");
      std::vector<uint8_t> bytes = b.snapshot();
      const uint8_t dv = R.u8();
      bool damaged = false;
      if (dv >= 128) {
        damaged = true;
        switch (dv % 4) {
          case 0: bytes.resize(R.pick(static_cast<uint32_t>(bytes.size()))); break;  // truncated
          case 1: bytes[R.pick(static_cast<uint32_t>(bytes.size()))] ^= static_cast<uint8_t>(1 + R.pick(255)); break;
          case 2: bytes.push_back(R.u8()); break;
          default: {  // a length or count field: bytes 8..40 hold the header and the first record's
            const size_t at = std::min<size_t>(bytes.size() - 1, 8 + R.pick(32));
            bytes[at] ^= static_cast<uint8_t>(1 + R.pick(255));
            break;
          }
        }
      }
      Blob in(bytes.size());
      if (!bytes.empty()) std::memcpy(in.data(), bytes.data(), bytes.size());
      te_checkpoint *back = sentinel<te_checkpoint>();
      const te_status ds = TE_CALL(te_checkpoint_deserialize, &back, in.data(), in.size());
      if (damaged) {
        FUZZ_ASSERT(ds != TE_SUCCESS, "te_checkpoint_deserialize accepted a damaged checkpoint (%s)",
                    dv % 4 == 0 ? "truncated" : dv % 4 == 2 ? "a trailing byte" : "a changed byte");
        FUZZ_ASSERT(back == sentinel<te_checkpoint>(), "te_checkpoint_deserialize failed but wrote *out");
        break;
      }
      FUZZ_ASSERT(ds == TE_SUCCESS && back != sentinel<te_checkpoint>(), "te_checkpoint_deserialize of its own bytes");
      if (c) ck_check_same(back, c->recs);
      te_checkpoint_destroy(back);
      break;
    }
    case 8: {  // write and read back (a file of this process)
      const std::string path = "/tmp/te_fuzz_ckpt_" + std::to_string(getpid()) + ".ckpt";
      const te_status st = TE_CALL(te_checkpoint_write, h, path.c_str());
      if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_checkpoint_write accepted what it must reject");
      if (st != TE_SUCCESS) break;
      te_checkpoint *back = nullptr;
      FUZZ_ASSERT(TE_CALL(te_checkpoint_read, &back, path.c_str()) == TE_SUCCESS, "te_checkpoint_read of a file just written");
      unlink(path.c_str());
      if (c && !mf) ck_check_same(back, c->recs);
      te_checkpoint_destroy(back);
      break;
    }
    default: {  // count, names, an index out of range
      if (c && !mf) {
        ck_check_model(slot);
      } else {
        size_t n = 0xBEEF;
        FUZZ_ASSERT(TE_CALL(te_checkpoint_count, h, &n) != TE_SUCCESS && n == 0xBEEF, "te_checkpoint_count on a bad handle");
      }
      break;
    }
  }
  if (c && mf) FUZZ_ASSERT(ck_state(*c) == before, "a failed checkpoint call changed the checkpoint");
}

// Records' names and serialised bytes (what a failed call must leave alone).
inline std::string Program::ck_state(CkSlot &c) {
  size_t n = 0;
  if (te_checkpoint_serialize(c.h, nullptr, 0, &n) != TE_SUCCESS) return "?";
  std::string s(n, '\0');
  if (te_checkpoint_serialize(c.h, &s[0], n, &n) != TE_SUCCESS) return "?";
  return s;
}

}  // namespace fuzz
