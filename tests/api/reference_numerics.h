// Independent references for the number formats and scaling rules the public API tests check
// libte against. Written from the format definitions and DESIGN.md, never by calling libte (only
// <te/te.h> is included, for the te_dtype / te_scaling_mode enums). No GoogleTest here.
//
//  - Bits:     float_to_bits, bits_to_float
//  - FP8:      e4m3_to_double, e5m2_to_double, fp8_to_double (exact decode of every code),
//              fp8_encode (code: RNE, saturating), fp8_round (value of fp8_encode), fp8_max
//  - 16-bit:   f32_to_bf16, bf16_to_f32, round_bf16, f32_to_f16, f16_to_f32, round_f16
//  - Dtypes:   dtype_size, is_fp8, dtype_name
//  - Scaling:  scale_from_amax, ref_delayed_update, scale_inv_count_ref, scale_inv_index
#pragma once

#include <te/te.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace te_test {

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// ---- FP8 ----------------------------------------------------------------------------------

inline double e4m3_to_double(uint8_t c) {
  int s = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
  if (e == 0xF && m == 7) return std::nan("");
  double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}
inline double e5m2_to_double(uint8_t c) {
  int s = c >> 7, e = (c >> 2) & 0x1F, m = c & 3;
  double v;
  if (e == 0x1F) v = m == 0 ? INFINITY : std::nan("");
  else v = e == 0 ? std::ldexp(m / 4.0, -14) : std::ldexp(1.0 + m / 4.0, e - 15);
  return s ? -v : v;
}
inline double fp8_to_double(uint8_t c, te_dtype t) {
  return t == TE_DTYPE_E4M3 ? e4m3_to_double(c) : e5m2_to_double(c);
}
inline double fp8_max(te_dtype t) { return t == TE_DTYPE_E4M3 ? 448.0 : 57344.0; }

// x -> FP8 code: round to nearest, ties to the even code, saturate to +-max (infinities too),
// NaN -> the canonical NaN code. Found by search over the finite non-negative codes (whose
// values ascend with the code), so it shares no bit tricks with the library's encoder.
inline uint8_t fp8_encode(double x, te_dtype t) {
  if (std::isnan(x)) return t == TE_DTYPE_E4M3 ? 0x7F : 0x7E;
  static const std::vector<double> e4 = [] {
    std::vector<double> v;
    for (int c = 0; c <= 0x7E; ++c) v.push_back(e4m3_to_double(static_cast<uint8_t>(c)));
    return v;
  }();
  static const std::vector<double> e5 = [] {
    std::vector<double> v;
    for (int c = 0; c <= 0x7B; ++c) v.push_back(e5m2_to_double(static_cast<uint8_t>(c)));
    return v;
  }();
  const std::vector<double> &vals = t == TE_DTYPE_E4M3 ? e4 : e5;  // ascending, code == index
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  double a = std::fabs(x);
  size_t code;
  if (a >= vals.back()) {
    code = vals.size() - 1;
  } else {
    size_t hi = static_cast<size_t>(std::upper_bound(vals.begin(), vals.end(), a) - vals.begin());
    size_t lo = hi - 1;  // vals[lo] <= a < vals[hi]
    double dlo = a - vals[lo], dhi = vals[hi] - a;
    if (dlo < dhi) code = lo;
    else if (dhi < dlo) code = hi;
    else code = lo % 2 == 0 ? lo : hi;  // tie: even mantissa (code LSB 0)
  }
  return static_cast<uint8_t>(sign | code);
}
// The VALUE fp8_encode rounds x to (NaN -> NaN).
inline double fp8_round(double x, te_dtype t) { return fp8_to_double(fp8_encode(x, t), t); }

// ---- 16-bit floats ------------------------------------------------------------------------

// bfloat16, round to nearest even (NaN kept, quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t lsb = (u >> 16) & 1;
  u += 0x7FFF + lsb;
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

inline uint16_t f32_to_f16(float f) {
  uint32_t x = float_to_bits(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return sign | 0x7E00;
  if (x >= 0x477FF000u) return sign | 0x7C00;  // >= 65520 rounds to infinity
  if (x < 0x38800000u) {                        // below 2^-14: half subnormal, unit 2^-24
    double q = std::nearbyint(static_cast<double>(bits_to_float(x)) * 16777216.0);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  uint32_t mant = x & 0x7FFFFF;
  uint32_t h = ((((x >> 23) - 127 + 15) << 10) | (mant >> 13));
  uint32_t rem = mant & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}
inline float f16_to_f32(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v;
  if (e == 0x1F) v = m ? NAN : INFINITY;
  else v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024.0 + m, e - 25);
  return static_cast<float>(s ? -v : v);
}
inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

// ---- dtypes -------------------------------------------------------------------------------

inline size_t dtype_size(te_dtype t) {
  switch (t) {
    case TE_DTYPE_F32: case TE_DTYPE_I32: return 4;
    case TE_DTYPE_F16: case TE_DTYPE_BF16: return 2;
    default: return 1;
  }
}
inline bool is_fp8(te_dtype t) { return t == TE_DTYPE_E4M3 || t == TE_DTYPE_E5M2; }
inline const char *dtype_name(te_dtype t) {
  switch (t) {
    case TE_DTYPE_F32: return "F32";
    case TE_DTYPE_F16: return "F16";
    case TE_DTYPE_BF16: return "BF16";
    case TE_DTYPE_E4M3: return "E4M3";
    case TE_DTYPE_E5M2: return "E5M2";
    case TE_DTYPE_I32: return "I32";
  }
  return "?";
}

// ---- scaling rules ------------------------------------------------------------------------

// TE's compute_scale_from_amax, written from DESIGN.md: amax clamped up to epsilon;
// amax 0 / inf / NaN -> 1; scale = fp8_max / amax (fp32 division); inf -> FLT_MAX;
// power-of-2 mode keeps only sign and exponent.
inline float scale_from_amax(float amax, float max, bool pow2, float eps) {
  float a = std::max(amax, eps);
  if (!(a > 0.0f) || std::isinf(a) || std::isnan(amax)) return 1.0f;
  float s = max / a;
  if (std::isinf(s)) s = FLT_MAX;
  if (pow2) s = bits_to_float(float_to_bits(s) & 0xFF800000u);
  return s;
}

// Delayed-scaling update of one state, TE's rule (DESIGN.md "Scaling state"): the scale from the
// history's amax (MAX over it, or slot 0 for most_recent) with margin, kept when that amax is 0
// or not finite; then the history rolls by one and slot 0 is cleared.
inline void ref_delayed_update(std::vector<float> &hist, float *scale, float max, int margin,
                               bool most_recent) {
  float amax = 0.0f;
  if (most_recent) {
    amax = hist[0];
  } else {
    for (float h : hist) amax = std::max(amax, h);
  }
  if (std::isfinite(amax) && amax > 0.0f) {
    float s = (max / amax) / std::ldexp(1.0f, margin);
    if (std::isinf(s)) s = FLT_MAX;
    *scale = s;
  }
  const float first = hist[0];
  for (size_t i = 0; i + 1 < hist.size(); ++i) hist[i] = hist[i + 1];
  hist.back() = first;
  hist[0] = 0.0f;
}

// Floats scale_inv holds for an FP8 [rows, cols] matrix under `mode`, and the index of the one
// that element (r, c) uses.
inline int64_t scale_inv_count_ref(int64_t rows, int64_t cols, te_scaling_mode mode) {
  switch (mode) {
    case TE_SCALING_BLOCK_1X128: return rows * ((cols + 127) / 128);
    case TE_SCALING_BLOCK_128X128: return ((rows + 127) / 128) * ((cols + 127) / 128);
    default: return 1;
  }
}
inline int64_t scale_inv_index(int64_t r, int64_t c, int64_t cols, te_scaling_mode mode) {
  switch (mode) {
    case TE_SCALING_BLOCK_1X128: return r * ((cols + 127) / 128) + c / 128;
    case TE_SCALING_BLOCK_128X128: return (r / 128) * ((cols + 127) / 128) + c / 128;
    default: return 0;
  }
}

}  // namespace te_test
