// Independent fp64 references for the numerics tests. Nothing here calls the code under test:
// FP8 values come from the format's definition, and rounding picks the nearest representable
// value by comparing exact double distances, so the bit-twiddling in numerics.cpp is checked
// against plain arithmetic.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace te_test {

struct Fp8Format {
  int mant_bits;
  int bias;
  bool fn;           // e4m3fn: no infinities, only S.1111.111 is NaN
  uint8_t max_code;  // largest finite magnitude code
  double max_value;
};

inline const Fp8Format kE4M3{3, 7, true, 0x7E, 448.0};
inline const Fp8Format kE5M2{2, 15, false, 0x7B, 57344.0};

// The value of a code by the definition of the format (NaN / inf as doubles).
inline double fp8_value(const Fp8Format &f, uint8_t code) {
  const int exp_bits = 7 - f.mant_bits;
  const int exp_field = (code & 0x7F) >> f.mant_bits;
  const int mant = code & ((1 << f.mant_bits) - 1);
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int exp_all_ones = (1 << exp_bits) - 1;
  if (f.fn && exp_field == exp_all_ones && mant == (1 << f.mant_bits) - 1) return std::nan("");
  if (!f.fn && exp_field == exp_all_ones) {
    return mant == 0 ? sign * std::numeric_limits<double>::infinity() : std::nan("");
  }
  if (exp_field == 0) return sign * std::ldexp(mant, 1 - f.bias - f.mant_bits);
  return sign * std::ldexp(1.0 + std::ldexp(mant, -f.mant_bits), exp_field - f.bias);
}

inline bool fp8_is_nan_code(const Fp8Format &f, uint8_t code) { return std::isnan(fp8_value(f, code)); }

// Saturating round-to-nearest-even of an exactly given value (a float widened to double).
// NaN -> the caller's NaN check; returns 0xFF as a "some NaN" marker.
inline uint8_t fp8_round_reference(const Fp8Format &f, double x) {
  if (std::isnan(x)) return 0xFF;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  if (a >= f.max_value) return sign | f.max_code;
  // Finite magnitudes increase with the code: find the last code whose value <= a.
  int lo = 0;
  while (lo + 1 <= f.max_code && fp8_value(f, static_cast<uint8_t>(lo + 1)) <= a) ++lo;
  const double v_lo = fp8_value(f, static_cast<uint8_t>(lo));
  if (v_lo == a) return sign | static_cast<uint8_t>(lo);
  const double v_hi = fp8_value(f, static_cast<uint8_t>(lo + 1));
  const double d_lo = a - v_lo, d_hi = v_hi - a;  // exact: both are short dyadic numbers
  int pick;
  if (d_lo < d_hi) {
    pick = lo;
  } else if (d_hi < d_lo) {
    pick = lo + 1;
  } else {
    pick = (lo % 2 == 0) ? lo : lo + 1;
  }
  return sign | static_cast<uint8_t>(pick);
}

inline uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

inline float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

}  // namespace te_test
