// fuzz_api_sequence's norm operations (api_program.h): te_norm_forward and te_norm_backward
// (LayerNorm and RMSNorm) over fuzzed shapes, dtypes, options, FP8 outputs and scaling modes.
// Besides the common checks (a call the header rejects fails, a failed call leaves every output
// and the amax untouched), a successful call is repeated and must write the same bytes: outputs,
// statistics, FP8 codes and gradients are deterministic.
#pragma once

#include "api_program.h"

namespace fuzz {

// Shape of what a tensor struct says (after maybe_malform, which may prepend a 1).
inline Shape tensor_shape(const Tensor &x) {
  Shape s;
  s.ndim = x.t.ndim;
  for (int i = 0; i < x.t.ndim && i < TE_MAX_DIMS; ++i) s.d[i] = x.t.shape[i];
  return s;
}

// Options: usually the defaults or RMSNorm; sometimes a bad kind, eps, boolean or struct_size.
// Returns nullptr (the defaults: LayerNorm) or &o; *kind is the kind the call uses.
inline te_norm_options *Program::norm_opts(te_norm_options &o, int &kind, bool &mf) {
  FUZZ_ASSERT(TE_CALL(te_norm_options_init, &o) == TE_SUCCESS, "te_norm_options_init failed");
  FUZZ_ASSERT(o.struct_size == sizeof o && get_enum(o.kind) == TE_NORM_LAYERNORM && o.eps == 1e-5f &&
                  o.zero_centered_gamma == 0,
              "te_norm_options_init: not the documented defaults");
  kind = TE_NORM_LAYERNORM;
  const uint8_t k = R.u8();
  if (k >= 100) kind = TE_NORM_RMSNORM;
  if (k >= 250) {
    kind = k >= 253 ? -1 : 2;
    mf = true;
  }
  set_enum(o.kind, kind);
  switch (R.pick(12)) {
    case 1: o.eps = 1e-3f; break;
    case 2: o.eps = 1.0f; break;
    case 3: o.eps = 1e-30f; break;
    case 4: o.eps = 0.0f; mf = true; break;
    case 5: o.eps = -1e-5f; mf = true; break;
    case 6: o.eps = NAN; mf = true; break;
    case 7: o.eps = INFINITY; mf = true; break;
    default: break;
  }
  const uint8_t z = R.u8();
  o.zero_centered_gamma = z >= 128 ? 1 : 0;
  if (z >= 252) {
    o.zero_centered_gamma = 2;
    mf = true;
  }
  if (R.u8() >= 252) {
    o.struct_size = R.pick(sizeof o);
    mf = true;
  }
  // NULL options: the defaults, only when nothing above was changed.
  if (k < 100 && o.eps == 1e-5f && o.zero_centered_gamma == 0 && o.struct_size == sizeof o && R.u8() >= 200)
    return nullptr;
  return &o;
}

inline void Program::norm_forward() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  te_norm_options o;
  int kind;
  te_norm_options *po = norm_opts(o, kind, mf);
  const bool layer = kind == TE_NORM_LAYERNORM, rms = kind == TE_NORM_RMSNORM;
  bool odd = false;
  const int xd = pick_dtype(TE_DTYPE_BF16, odd);
  const bool x_hp = xd >= 0 && xd <= 2;
  if (!x_hp) mf = true;
  const Shape s = gen_shape(4096);
  const int64_t rows = s.rows(), hidden = s.cols();
  Tensor x, gamma, beta, out, out_t, mu, rsigma;
  make(x, xd, s);
  make(gamma, pick_dtype(xd, odd), R.u8() >= 250 ? shape1(hidden + 1) : shape1(hidden));
  make(beta, pick_dtype(xd, odd), R.u8() >= 250 ? shape2(1, hidden) : shape1(hidden));
  // The output: high precision, FP8 (per-tensor; sometimes block-scaled), or none.
  const uint32_t oc = R.pick(8);
  int od = oc <= 2 ? xd : oc == 3 ? TE_DTYPE_F32 : oc <= 5 ? TE_DTYPE_E4M3 : TE_DTYPE_E5M2;
  if (R.u8() >= 250) od = pick_dtype(od, odd);
  int osc = TE_SCALING_PER_TENSOR;
  if (is_fp8(od) && R.u8() >= 235) osc = pick_scaling();
  const uint8_t os = R.u8();
  make(out, od, os >= 250 ? gen_shape() : os >= 128 ? shape2(rows, hidden) : s, osc);
  const bool with_out = oc != 7 || R.u8() >= 128;
  // The transpose: FP8 [hidden, rows] of the output's dtype (when that is FP8), or none.
  int td = is_fp8(od) ? od : (R.u8() >= 128 ? TE_DTYPE_E4M3 : TE_DTYPE_E5M2);
  if (R.u8() >= 245) td = pick_dtype(td, odd);
  int tsc = TE_SCALING_PER_TENSOR;
  if (is_fp8(td) && R.u8() >= 245) tsc = pick_scaling();
  make(out_t, td, R.u8() >= 250 ? shape2(rows, hidden) : shape2(hidden, rows), tsc);
  const bool with_out_t = R.u8() >= 140 || !with_out;
  const uint8_t ms = R.u8();
  make(mu, R.u8() >= 250 ? TE_DTYPE_BF16 : TE_DTYPE_F32, ms >= 250 ? shape1(rows + 1) : shape1(rows));
  make(rsigma, R.u8() >= 250 ? TE_DTYPE_F16 : TE_DTYPE_F32, R.u8() >= 250 ? shape1(rows + 2) : shape1(rows));
  maybe_malform(x);
  maybe_malform(gamma);
  maybe_malform(beta);
  maybe_malform(out);
  maybe_malform(out_t);
  maybe_malform(mu);
  maybe_malform(rsigma);

  te_norm_forward_args a;
  std::memset(&a, 0x5C, sizeof a);
  FUZZ_ASSERT(TE_CALL(te_norm_forward_args_init, &a) == TE_SUCCESS, "te_norm_forward_args_init failed");
  FUZZ_ASSERT(a.struct_size == sizeof a && !a.input && !a.weight && !a.bias && !a.output && !a.output_t && !a.mu &&
                  !a.rsigma && !a.quantize,
              "te_norm_forward_args_init: not zeroed");
  a.input = maybe_null(x, mf) ? &x.t : nullptr;
  a.weight = maybe_null(gamma, mf) ? &gamma.t : nullptr;
  // beta: LayerNorm's, NULL for RMSNorm; sometimes the other way round.
  const bool flip_beta = R.u8() >= 245;
  const bool with_beta = layer != flip_beta;
  if (with_beta) {
    a.bias = &beta.t;
    if (beta.malformed || rms) mf = true;
  } else if (layer) {
    mf = true;
  }
  a.output = with_out ? &out.t : nullptr;
  a.output_t = with_out_t ? &out_t.t : nullptr;
  if (!with_out && !with_out_t) mf = true;
  const bool with_mu = R.u8() >= (rms ? 245 : 120);
  a.mu = with_mu ? &mu.t : nullptr;
  a.rsigma = R.u8() >= 120 ? &rsigma.t : nullptr;
  if (with_out && out.malformed) mf = true;
  if (with_out_t && out_t.malformed) mf = true;
  if (a.mu && (mu.malformed || rms)) mf = true;
  if (a.rsigma && rsigma.malformed) mf = true;

  // What the header rejects, from the tensors as passed (only where they are well-formed).
  const Shape xs = tensor_shape(x);
  const bool x_ok = a.input && !x.malformed && x_hp;
  if (x_ok) {
    const int64_t r = xs.rows(), n = xs.cols();
    auto bad_vector = [&](const Tensor &v) {
      return !v.malformed && (v.t.ndim != 1 || v.t.shape[0] != n || get_enum(v.t.dtype) != xd);
    };
    if (a.weight && bad_vector(gamma)) mf = true;
    if (a.bias && bad_vector(beta)) mf = true;
    if (a.output && !out.malformed) {
      const Shape sh = tensor_shape(out);
      const int d = get_enum(out.t.dtype);
      if (sh.numel() != xs.numel() || sh.cols() != n) mf = true;
      if (is_fp8(d) && get_enum(out.t.scaling) != TE_SCALING_PER_TENSOR) mf = true;
      if (!(d >= 0 && d <= 4)) mf = true;
    }
    if (a.output_t && !out_t.malformed) {
      const int d = get_enum(out_t.t.dtype);
      if (!is_fp8(d) || get_enum(out_t.t.scaling) != TE_SCALING_PER_TENSOR) mf = true;
      if (out_t.t.ndim != 2 || out_t.t.shape[0] != n || out_t.t.shape[1] != r) mf = true;
      if (a.output && !out.malformed && is_fp8(get_enum(out.t.dtype)) && get_enum(out.t.dtype) != d) mf = true;
    }
    for (const Tensor *st : {a.mu ? &mu : nullptr, a.rsigma ? &rsigma : nullptr})
      if (st && !st->malformed && (tensor_shape(*st).numel() != r || get_enum(st->t.dtype) != TE_DTYPE_F32)) mf = true;
  }
  const bool fp8_out = (a.output && is_fp8(get_enum(out.t.dtype))) || a.output_t;

  te_quantize_options q;
  Blob scale, amax;
  te_quantize_options *pq = quantize_opts(q, scale, amax, false, mf);
  if (pq && pq->scale && !fp8_out && x_ok && (!a.output || !out.malformed)) mf = true;
  a.quantize = pq;
  const uint8_t as = R.u8();
  if (as >= 252) {
    a.struct_size = R.pick(sizeof a);
    mf = true;
  }
  const bool null_args = as >= 248 && as < 252;
  mf |= null_args;

  out.snapshot();
  out_t.snapshot();
  mu.snapshot();
  rsigma.snapshot();
  const std::vector<uint8_t> ab = amax.snapshot();
  te_status st = TE_CALL(te_norm_forward, ctx, po, null_args ? nullptr : &a);
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_norm_forward accepted what it must reject");
  if (st != TE_SUCCESS) {
    out.check_untouched("te_norm_forward", "args->output");
    out_t.check_untouched("te_norm_forward", "args->output_t");
    mu.check_untouched("te_norm_forward", "args->mu");
    rsigma.check_untouched("te_norm_forward", "args->rsigma");
    FUZZ_ASSERT(amax.equals(ab), "te_norm_forward failed but wrote args->quantize->amax");
    return;
  }
  if (a.output && a.output_t && is_fp8(get_enum(out.t.dtype)))
    FUZZ_ASSERT(std::memcmp(out.t.scale_inv, out_t.t.scale_inv, 4) == 0,
                "te_norm_forward: output and output_t got different scale_inv");
  // Deterministic: the same call writes the same bytes (the amax accumulates the same value).
  out.snapshot();
  out_t.snapshot();
  mu.snapshot();
  rsigma.snapshot();
  float amax1;
  std::memcpy(&amax1, amax.data(), 4);
  st = TE_CALL(te_norm_forward, ctx, po, &a);
  FUZZ_ASSERT(st == TE_SUCCESS, "te_norm_forward failed on a repeat of a successful call");
  out.check_untouched("te_norm_forward (repeated)", "args->output");
  out_t.check_untouched("te_norm_forward (repeated)", "args->output_t");
  mu.check_untouched("te_norm_forward (repeated)", "args->mu");
  rsigma.check_untouched("te_norm_forward (repeated)", "args->rsigma");
  float amax2;
  std::memcpy(&amax2, amax.data(), 4);
  FUZZ_ASSERT(std::isnan(amax1) ? std::isnan(amax2) : amax1 == amax2,
              "te_norm_forward: a repeated call changed the accumulated amax from %g to %g", static_cast<double>(amax1),
              static_cast<double>(amax2));
}

inline void Program::norm_backward() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  te_norm_options o;
  int kind;
  te_norm_options *po = norm_opts(o, kind, mf);
  const bool layer = kind == TE_NORM_LAYERNORM, rms = kind == TE_NORM_RMSNORM;
  bool odd = false;
  const int xd = pick_dtype(TE_DTYPE_BF16, odd);
  const bool x_hp = xd >= 0 && xd <= 2;
  if (!x_hp) mf = true;
  const Shape s = gen_shape(4096);
  const int64_t rows = s.rows(), hidden = s.cols();
  Tensor x, dy, gamma, mu, rsigma, dx, dgamma, dbeta;
  make(x, xd, s);
  const uint8_t ds = R.u8();
  make(dy, pick_dtype(xd, odd), ds >= 250 ? gen_shape() : ds >= 160 ? shape2(rows, hidden) : s);
  make(gamma, pick_dtype(xd, odd), R.u8() >= 250 ? shape1(hidden + 1) : shape1(hidden));
  make(mu, R.u8() >= 250 ? TE_DTYPE_BF16 : TE_DTYPE_F32, R.u8() >= 250 ? shape1(rows + 1) : shape1(rows));
  make(rsigma, R.u8() >= 250 ? TE_DTYPE_F16 : TE_DTYPE_F32, R.u8() >= 250 ? shape1(rows + 2) : shape1(rows));
  make(dx, pick_dtype(xd, odd), R.u8() >= 250 ? gen_shape() : s);
  make(dgamma, pick_dtype(xd, odd), R.u8() >= 250 ? shape2(hidden, 1) : shape1(hidden));
  make(dbeta, pick_dtype(xd, odd), shape1(hidden));
  for (Tensor *t : {&x, &dy, &gamma, &mu, &rsigma, &dx, &dgamma, &dbeta}) maybe_malform(*t);

  const te_tensor *px = maybe_null(x, mf) ? &x.t : nullptr;
  const te_tensor *pdy = maybe_null(dy, mf) ? &dy.t : nullptr;
  const te_tensor *pg = maybe_null(gamma, mf) ? &gamma.t : nullptr;
  const te_tensor *pr = maybe_null(rsigma, mf) ? &rsigma.t : nullptr;
  const bool with_mu = layer != (R.u8() >= 245);
  const te_tensor *pmu = with_mu ? &mu.t : nullptr;
  if (with_mu && (mu.malformed || rms)) mf = true;
  if (!with_mu && layer) mf = true;
  te_tensor *pdx = R.u8() >= 60 ? &dx.t : nullptr;
  te_tensor *pdg = R.u8() >= 60 ? &dgamma.t : nullptr;
  const bool with_db = R.u8() >= (rms ? 245 : 60);
  te_tensor *pdb = with_db ? &dbeta.t : nullptr;
  if (pdx && dx.malformed) mf = true;
  if (pdg && dgamma.malformed) mf = true;
  if (pdb && (dbeta.malformed || rms)) mf = true;

  if (px && !x.malformed && x_hp) {
    const Shape xs = tensor_shape(x);
    const int64_t r = xs.rows(), n = xs.cols();
    auto bad_like_x = [&](const Tensor &v) {
      const Shape vs = tensor_shape(v);
      return !v.malformed && (vs.numel() != xs.numel() || vs.cols() != n || get_enum(v.t.dtype) != xd);
    };
    auto bad_vector = [&](const Tensor &v, int dtype) {
      return !v.malformed && (v.t.ndim != 1 || v.t.shape[0] != n || get_enum(v.t.dtype) != dtype);
    };
    auto bad_stats = [&](const Tensor &v) {
      return !v.malformed && (tensor_shape(v).numel() != r || get_enum(v.t.dtype) != TE_DTYPE_F32);
    };
    if (pdy && bad_like_x(dy)) mf = true;
    if (pdx && bad_like_x(dx)) mf = true;
    if (pg && bad_vector(gamma, xd)) mf = true;
    if (pg && !gamma.malformed) {
      if (pdg && bad_vector(dgamma, get_enum(gamma.t.dtype))) mf = true;
      if (pdb && bad_vector(dbeta, get_enum(gamma.t.dtype))) mf = true;
    }
    if (pmu && bad_stats(mu)) mf = true;
    if (pr && bad_stats(rsigma)) mf = true;
  }

  dx.snapshot();
  dgamma.snapshot();
  dbeta.snapshot();
  te_status st = TE_CALL(te_norm_backward, ctx, po, pdy, px, pg, pmu, pr, pdx, pdg, pdb);
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_norm_backward accepted what it must reject");
  if (st != TE_SUCCESS) {
    dx.check_untouched("te_norm_backward", "dx");
    dgamma.check_untouched("te_norm_backward", "dgamma");
    dbeta.check_untouched("te_norm_backward", "dbeta");
    return;
  }
  // Deterministic: dgamma and dbeta are written, not accumulated, so a repeat gives the same bytes.
  dx.snapshot();
  dgamma.snapshot();
  dbeta.snapshot();
  st = TE_CALL(te_norm_backward, ctx, po, pdy, px, pg, pmu, pr, pdx, pdg, pdb);
  FUZZ_ASSERT(st == TE_SUCCESS, "te_norm_backward failed on a repeat of a successful call");
  dx.check_untouched("te_norm_backward (repeated)", "dx");
  dgamma.check_untouched("te_norm_backward (repeated)", "dgamma");
  dbeta.check_untouched("te_norm_backward (repeated)", "dbeta");
}

}  // namespace fuzz
