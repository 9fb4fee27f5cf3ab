// fuzz_api_sequence's primitive operations (api_program.h): quantize, dequantize,
// cast_transpose, amax, gemm and the activations over fuzzed shapes, dtypes and options.
#pragma once

#include "api_program.h"

namespace fuzz {

// ---- primitives ----

inline te_quantize_options *Program::quantize_opts(te_quantize_options &o, Blob &scale, Blob &amax, bool block, bool &mf) {
  FUZZ_ASSERT(TE_CALL(te_quantize_options_init, &o) == TE_SUCCESS, "te_quantize_options_init failed");
  const uint32_t mode = R.pick(8);
  scale = Blob(4);
  amax = Blob(4);
  switch (mode) {
    case 0: return nullptr;
    case 2: case 3: {
      static const float kS[8] = {1.0f, 448.0f, 0.0f, NAN, INFINITY, -2.0f, 1e-30f, 3e38f};
      const float v = kS[R.pick(8)];
      std::memcpy(scale.data(), &v, 4);
      o.scale = scale.floats();
      if (block) mf = true;
      break;
    }
    case 4: o.amax = amax.floats(); break;
    case 5: {
      static const float kE[6] = {1e-12f, -1.0f, INFINITY, NAN, 0.0f, 1e30f};
      const uint32_t k = R.pick(6);
      o.amax_epsilon = kE[k];
      if (k >= 1 && k <= 3) mf = true;
      break;
    }
    case 6: o.power_of_2_scales = static_cast<int32_t>(R.pick(3)); mf |= o.power_of_2_scales == 2; break;
    case 7: o.struct_size = 4; mf = true; break;
    default: break;
  }
  return &o;
}

inline void Program::quantize() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  bool odd = false;
  const Shape s = gen_shape();
  Tensor x, out;
  const int xd = pick_dtype(TE_DTYPE_F32, odd), od = pick_dtype(TE_DTYPE_E4M3, odd);
  if (!(xd >= 0 && xd <= 2) || !is_fp8(od)) mf = true;
  make(x, xd, s);
  const int sc = pick_scaling();
  make(out, od, R.u8() >= 245 ? gen_shape() : s, sc);
  if (out.shape.numel() != x.shape.numel()) mf = true;
  maybe_malform(x);
  maybe_malform(out);
  if (is_fp8(od) && (sc < 0 || sc > 2)) mf = true;
  te_quantize_options o;
  Blob scale, amax;
  te_quantize_options *po = quantize_opts(o, scale, amax, is_fp8(od) && sc != 0, mf);
  const te_tensor *px = maybe_null(x, mf) ? &x.t : nullptr;
  Tensor *pout = maybe_null(out, mf);
  out.snapshot();
  const std::vector<uint8_t> ab = amax.snapshot();
  te_status st = TE_CALL(te_quantize, ctx, px, pout ? &pout->t : nullptr, po);
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_quantize accepted what it must reject");
  if (st != TE_SUCCESS) {
    out.check_untouched("te_quantize", "out");
    FUZZ_ASSERT(amax.equals(ab), "te_quantize failed but wrote opts->amax");
  }
}

inline void Program::dequantize() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  bool odd = false;
  const Shape s = gen_shape();
  Tensor x, out;
  const int xd = pick_dtype(TE_DTYPE_E4M3, odd), od = pick_dtype(TE_DTYPE_F32, odd);
  if (!is_fp8(xd) || !(od >= 0 && od <= 2)) mf = true;
  const int sc = pick_scaling();
  if (is_fp8(xd) && (sc < 0 || sc > 2)) mf = true;
  make(x, xd, s, sc);
  make(out, od, R.u8() >= 245 ? gen_shape() : s);
  if (out.shape.numel() != x.shape.numel()) mf = true;
  maybe_malform(x);
  maybe_malform(out);
  const te_tensor *px = maybe_null(x, mf) ? &x.t : nullptr;
  Tensor *pout = maybe_null(out, mf);
  out.snapshot();
  te_status st = TE_CALL(te_dequantize, ctx, px, pout ? &pout->t : nullptr);
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_dequantize accepted what it must reject");
  if (st != TE_SUCCESS) out.check_untouched("te_dequantize", "out");
}

inline void Program::cast_transpose() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  bool odd = false;
  Shape s = gen_shape();
  if (s.ndim != 2) s = shape2(s.rows(), s.cols());
  Tensor x, out, out_t;
  const int xd = pick_dtype(TE_DTYPE_BF16, odd), od = pick_dtype(TE_DTYPE_E4M3, odd);
  if (!(xd >= 0 && xd <= 2) || !is_fp8(od)) mf = true;
  const int sc = pick_scaling();
  if (is_fp8(od) && (sc < 0 || sc > 2)) mf = true;
  make(x, xd, s);
  make(out, od, s, sc);
  make(out_t, od, shape2(s.d[1], s.d[0]), sc);
  maybe_malform(x);
  maybe_malform(out);
  maybe_malform(out_t);
  te_quantize_options o;
  Blob scale, amax;
  te_quantize_options *po = quantize_opts(o, scale, amax, is_fp8(od) && sc != 0, mf);
  const te_tensor *px = maybe_null(x, mf) ? &x.t : nullptr;
  const uint32_t which = R.pick(4);  // 0, 1: both; 2: out only; 3: out_t only
  Tensor *po1 = which == 3 ? nullptr : maybe_null(out, mf, true);
  Tensor *po2 = which == 2 ? nullptr : maybe_null(out_t, mf, true);
  if (po1 && out.malformed) mf = true;
  if (po2 && out_t.malformed) mf = true;
  if (!po1 && !po2) mf = true;
  out.snapshot();
  out_t.snapshot();
  const std::vector<uint8_t> ab = amax.snapshot();
  te_status st = TE_CALL(te_cast_transpose, ctx, px, po1 ? &po1->t : nullptr, po2 ? &po2->t : nullptr, po);
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_cast_transpose accepted what it must reject");
  if (st != TE_SUCCESS) {
    out.check_untouched("te_cast_transpose", "out");
    out_t.check_untouched("te_cast_transpose", "out_t");
    FUZZ_ASSERT(amax.equals(ab), "te_cast_transpose failed but wrote opts->amax");
  }
}

inline void Program::amax_op() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  bool odd = false;
  Tensor x;
  const int xd = pick_dtype(TE_DTYPE_F32, odd);
  if (!(xd >= 0 && xd <= 2)) mf = true;
  make(x, xd, gen_shape());
  maybe_malform(x);
  const te_tensor *px = maybe_null(x, mf) ? &x.t : nullptr;
  Blob a(4);
  const float sent = -12345.0f;
  std::memcpy(a.data(), &sent, 4);
  const bool null_out = R.u8() >= 250;
  mf |= null_out;
  te_status st = TE_CALL(te_amax, ctx, px, null_out ? nullptr : a.floats());
  if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_amax accepted what it must reject");
  if (st != TE_SUCCESS) {
    FUZZ_ASSERT(std::memcmp(a.data(), &sent, 4) == 0, "te_amax failed but wrote *amax");
  } else {
    float v;
    std::memcpy(&v, a.data(), 4);
    FUZZ_ASSERT(!(v < 0.0f), "te_amax returned a negative amax %g", static_cast<double>(v));
  }
}

inline void Program::gemm() {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  static const int64_t kG[8] = {16, 32, 48, 64, 1, 3, 17, 128};
  const int64_t m = kG[R.pick(8)], n = kG[R.pick(8)], k = kG[R.pick(8)];
  const uint32_t mode = R.pick(8);
  int ad, bd;
  switch (mode) {
    case 1: ad = bd = TE_DTYPE_BF16; break;
    case 2: ad = bd = TE_DTYPE_F32; break;
    case 3: ad = bd = TE_DTYPE_F16; break;
    case 4: ad = TE_DTYPE_E5M2; bd = TE_DTYPE_E4M3; break;
    case 5: ad = bd = TE_DTYPE_E5M2; mf = true; break;  // not both E5M2
    case 6: ad = TE_DTYPE_E4M3; bd = TE_DTYPE_BF16; mf = true; break;
    case 7: ad = TE_DTYPE_F32; bd = TE_DTYPE_BF16; mf = true; break;
    default: ad = bd = TE_DTYPE_E4M3; break;
  }
  const bool fp8 = is_fp8(ad);
  const uint8_t tv = R.u8();
  int ta = fp8 ? 0 : 0, tb = fp8 ? 1 : 0;
  if (tv >= 160) { ta = static_cast<int>(tv & 1); tb = static_cast<int>((tv >> 1) & 1); }
  if (tv >= 250) { ta = 2; mf = true; }
  if (fp8 && (ta != 0 || tb != 1)) mf = true;
  if (fp8 && (m % 16 || n % 16 || k % 16)) mf = true;
  bool odd = false;
  const int dd = pick_dtype(TE_DTYPE_F32, odd);
  if (!(dd >= 0 && dd <= 2)) mf = true;
  Tensor a, b, d, bias, gelu;
  const int sa = fp8 ? (R.u8() >= 200 ? TE_SCALING_BLOCK_1X128 : TE_SCALING_PER_TENSOR) : 0;
  const int sb = fp8 ? (sa == 0 ? 0 : (R.u8() >= 128 ? TE_SCALING_BLOCK_128X128 : TE_SCALING_BLOCK_1X128)) : 0;
  make(a, ad, ta == 1 ? shape2(k, m) : shape2(m, k), sa);
  make(b, bd, tb == 1 ? shape2(n, k) : shape2(k, n), sb);
  make(d, dd, shape2(m, n));
  make(bias, TE_DTYPE_F32, shape1(n));
  make(gelu, dd >= 0 && dd <= 2 ? dd : TE_DTYPE_F32, shape2(m, n));
  maybe_malform(a);
  maybe_malform(b);
  maybe_malform(d);
  te_gemm_options o;
  std::memset(&o, 0x12, sizeof o);
  FUZZ_ASSERT(TE_CALL(te_gemm_options_init, &o) == TE_SUCCESS, "te_gemm_options_init failed");
  o.transa = ta;
  o.transb = tb;
  const uint32_t ep = R.pick(6);
  set_enum(o.epilogue, ep < 4 ? static_cast<int>(ep) : (ep == 4 ? 0 : 9));
  if (ep == 5) mf = true;
  const bool has_bias = ep == 1 || ep == 3, has_gelu = ep == 2 || ep == 3;
  if (has_bias) {
    maybe_malform(bias);
    o.bias = R.u8() >= 250 ? nullptr : &bias.t;
    if (!o.bias || bias.malformed) mf = true;
  } else if (R.u8() >= 250) {
    o.bias = &bias.t;
    mf = true;
  }
  if (R.u8() >= 200) {
    o.gelu_input = &gelu.t;
    if (!has_gelu) mf = true;
  }
  const uint8_t acc = R.u8();
  o.accumulate = acc < 200 ? 0 : acc < 250 ? 1 : 2;
  mf |= o.accumulate == 2;
  o.use_split_accumulator = R.u8() >= 128 ? 1 : 0;
  const uint8_t z = R.u8();
  if (z >= 252) { o.struct_size = 0; mf = true; }
  const bool null_opts = z >= 240 && z < 252 && (ep == 0 || ep == 4) && !o.bias && !o.gelu_input && o.accumulate == 0 &&
                         ta == 0 && tb == 0;  // NULL options are these defaults
  const bool null_d = R.u8() >= 252;
  mf |= null_d;
  if (a.malformed || b.malformed || d.malformed) mf = true;
  d.snapshot();
  gelu.snapshot();
  te_status st = TE_CALL(te_gemm, ctx, &a.t, &b.t, null_d ? nullptr : &d.t, null_opts ? nullptr : &o);
  if (mf)
    FUZZ_ASSERT(st != TE_SUCCESS,
                "te_gemm accepted what it must reject: m %lld n %lld k %lld, a %d b %d d %d, transa %d transb %d, "
                "epilogue %d, bias %s, gelu_input %s, accumulate %d, malformed a/b/d/bias %d%d%d%d, opts %s, d %s",
                (long long)m, (long long)n, (long long)k, ad, bd, dd, ta, tb, get_enum(o.epilogue),
                o.bias ? "given" : "NULL", o.gelu_input ? "given" : "NULL", o.accumulate, a.malformed, b.malformed,
                d.malformed, bias.malformed, null_opts ? "NULL" : "given", null_d ? "NULL" : "given");
  if (st != TE_SUCCESS) {
    d.check_untouched("te_gemm", "d");
    gelu.check_untouched("te_gemm", "opts->gelu_input");
  }
}

inline void Program::activation(bool backward_pass) {
  bool mf = false;
  int cs;
  te_context *ctx = ctx_arg(mf, cs);
  static const int kAct[5] = {TE_ACTIVATION_RELU, TE_ACTIVATION_GELU, TE_ACTIVATION_SWIGLU, TE_ACTIVATION_GEGLU, -1};
  const int act = kAct[R.pick(5)];
  if (act < 0 || act > TE_ACTIVATION_SRELU) mf = true;
  const bool gated = act == TE_ACTIVATION_SWIGLU || act == TE_ACTIVATION_GEGLU;
  te_activation ae;
  set_enum(ae, act);
  bool odd = false;
  const int xd = pick_dtype(TE_DTYPE_BF16, odd);
  if (!(xd >= 0 && xd <= 2)) mf = true;
  const Shape s = gen_shape();
  Shape ys = s;
  if (gated) {
    if (s.cols() % 2) mf = true;
    ys.d[ys.ndim - 1] = std::max<int64_t>(1, s.cols() / 2);
  }
  const int yd = pick_dtype(xd, odd);
  if (yd != xd) mf = true;
  Tensor x, y, dx;
  make(x, xd, s);
  make(y, yd, R.u8() >= 245 ? gen_shape() : ys);
  if (y.shape.numel() != ys.numel()) mf = true;
  make(dx, xd, s);
  maybe_malform(x);
  maybe_malform(y);
  maybe_malform(dx);
  const te_tensor *px = maybe_null(x, mf) ? &x.t : nullptr;
  Tensor *py = maybe_null(y, mf);
  if (!backward_pass) {
    y.snapshot();
    te_status st = TE_CALL(te_activation_forward, ctx, ae, px, py ? &py->t : nullptr);
    if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_activation_forward accepted what it must reject");
    if (st != TE_SUCCESS) y.check_untouched("te_activation_forward", "y");
  } else {
    Tensor *pdx = maybe_null(dx, mf);
    dx.snapshot();
    te_status st = TE_CALL(te_activation_backward, ctx, ae, px, py ? &py->t : nullptr, pdx ? &pdx->t : nullptr);
    if (mf) FUZZ_ASSERT(st != TE_SUCCESS, "te_activation_backward accepted what it must reject");
    if (st != TE_SUCCESS) dx.check_untouched("te_activation_backward", "dx");
  }
}

}  // namespace fuzz
