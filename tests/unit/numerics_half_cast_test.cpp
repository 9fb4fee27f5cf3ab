// float <-> binary16 and bfloat16: exhaustive round trips of every 16-bit code, and rounding of
// floats against an independent nearest-neighbour reference.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>

#include "numerics_reference.h"
#include "numerics/numerics.h"

namespace {

using te_test::bits;
using te_test::from_bits;

// The nearest representable value among a code and its upper neighbour, ties to the even code.
// `value_of` decodes by definition; `lo` is the candidate toward zero.
template <typename ValueOf>
uint16_t nearest_of_two(double a, uint16_t lo, ValueOf value_of) {
  const double v_lo = value_of(lo), v_hi = value_of(static_cast<uint16_t>(lo + 1));
  if (a - v_lo < v_hi - a) return lo;
  if (v_hi - a < a - v_lo) return static_cast<uint16_t>(lo + 1);
  return (lo % 2 == 0) ? lo : static_cast<uint16_t>(lo + 1);
}

// Magnitude codes only (sign handled by callers). 0x7F80 counts as 2^128, the value IEEE
// rounding with an unbounded exponent would give it: past the midpoint below it, finite floats
// round up to it, i.e. overflow to infinity.
double bf16_value(uint16_t b) {
  const int e = b >> 7, m = b & 0x7F;
  if (e == 0xFF) return m == 0 ? std::ldexp(1.0, 128) : NAN;
  if (e == 0) return std::ldexp(m, -133);
  return std::ldexp(1.0 + m / 128.0, e - 127);
}

double f16_value(uint16_t h) {
  const int e = h >> 10, m = h & 0x3FF;
  if (e == 0x1F) return m == 0 ? INFINITY : NAN;
  if (e == 0) return std::ldexp(m, -24);
  return std::ldexp(1.0 + m / 1024.0, e - 15);
}

// Reference float -> bf16 for finite, non-NaN x: bf16 codes are float's top 16 bits, so the
// candidates are the truncation and the next code up.
uint16_t bf16_reference(float x) {
  const uint16_t sign = (bits(x) >> 16) & 0x8000;
  const double a = std::fabs(static_cast<double>(x));
  // Halfway past the largest finite bf16 (0x7F7F) and beyond: IEEE overflow to inf.
  if (a >= std::ldexp(1.0, 128) - std::ldexp(1.0, 119)) return sign | 0x7F80;
  const uint16_t lo = static_cast<uint16_t>((bits(x) & 0x7FFFFFFF) >> 16);
  if (bf16_value(lo) == a) return sign | lo;
  return sign | nearest_of_two(a, lo, bf16_value);
}

uint16_t f16_reference(float x) {
  const uint16_t sign = (bits(x) >> 16) & 0x8000;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return sign | 0x7C00;  // halfway past the largest finite value: overflow
  uint16_t lo = 0;
  // Binary search the last finite code with value <= a.
  uint16_t hi = 0x7BFF;
  if (f16_value(hi) <= a) {
    lo = hi;
  } else {
    while (hi - lo > 1) {
      const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
      (f16_value(mid) <= a ? lo : hi) = mid;
    }
  }
  if (f16_value(lo) == a) return sign | lo;
  return sign | nearest_of_two(a, lo, f16_value);
}

TEST(NumericsHalfCast, Bf16EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t code = static_cast<uint16_t>(c);
    const float f = te::bf16_to_float(code);
    EXPECT_EQ(bits(f), c << 16);
    if (std::isnan(f)) {
      const uint16_t back = te::float_to_bf16(f);
      EXPECT_TRUE(std::isnan(te::bf16_to_float(back))) << c;
      EXPECT_NE(back & 0x0040, 0) << "quiet bit set for " << c;
    } else {
      EXPECT_EQ(te::float_to_bf16(f), code) << c;
    }
  }
}

TEST(NumericsHalfCast, F16EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t code = static_cast<uint16_t>(c);
    const float f = te::f16_to_float(code);
    const double want = ((code & 0x8000) ? -1 : 1) * f16_value(code & 0x7FFF);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << c;
      const uint16_t back = te::float_to_f16(f);
      EXPECT_TRUE(std::isnan(te::f16_to_float(back))) << c;
      EXPECT_EQ(back, code | 0x0200) << "payload kept, quiet bit set, for " << c;
    } else {
      EXPECT_EQ(static_cast<double>(f), want) << c;
      EXPECT_EQ(te::float_to_f16(f), code) << c;
    }
  }
}

TEST(NumericsHalfCast, Bf16RoundsToNearestEven) {
  EXPECT_EQ(te::float_to_bf16(from_bits(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(te::float_to_bf16(from_bits(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_EQ(te::float_to_bf16(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(te::float_to_bf16(from_bits(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(te::float_to_bf16(FLT_MAX), 0x7F80);                 // IEEE overflow to inf
  EXPECT_EQ(te::float_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(te::float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(te::float_to_bf16(from_bits(0x00018000u)), 0x0002);  // subnormal tie -> even
  EXPECT_TRUE(std::isnan(te::bf16_to_float(te::float_to_bf16(from_bits(0x7F800001u)))));
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(any_bits(rng));
    if (std::isnan(x)) continue;
    ASSERT_EQ(te::float_to_bf16(x), bf16_reference(x)) << std::hex << bits(x);
  }
}

TEST(NumericsHalfCast, F16RoundsToNearestEven) {
  EXPECT_EQ(te::float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(te::float_to_f16(65519.996f), 0x7BFF);
  EXPECT_EQ(te::float_to_f16(65520.0f), 0x7C00);  // the tie past max overflows (IEEE)
  EXPECT_EQ(te::float_to_f16(1e30f), 0x7C00);
  EXPECT_EQ(te::float_to_f16(-INFINITY), 0xFC00);
  EXPECT_EQ(te::float_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(te::float_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(te::float_to_f16(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(te::float_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 quanta -> 2
  EXPECT_EQ(te::float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie -> even
  EXPECT_EQ(te::float_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3C02);
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<double> log_mag(-26.0, 17.0);
  for (int i = 0; i < 200000; ++i) {
    const float x = (i % 2) ? from_bits(any_bits(rng)) : static_cast<float>(std::exp2(log_mag(rng)));
    if (std::isnan(x)) continue;
    ASSERT_EQ(te::float_to_f16(x), f16_reference(x)) << std::hex << bits(x);
  }
}

TEST(NumericsHalfCast, LoadAndStoreByDtype) {
  float f32[2] = {};
  uint16_t h[2] = {}, b[2] = {};
  te::store_from_float(f32, te::DType::F32, 1, 1.5f);
  te::store_from_float(h, te::DType::F16, 1, 1.5f);
  te::store_from_float(b, te::DType::BF16, 1, 1.5f);
  EXPECT_EQ(f32[1], 1.5f);
  EXPECT_EQ(h[1], 0x3E00);
  EXPECT_EQ(b[1], 0x3FC0);
  EXPECT_EQ(te::load_as_float(f32, te::DType::F32, 1), 1.5f);
  EXPECT_EQ(te::load_as_float(h, te::DType::F16, 1), 1.5f);
  EXPECT_EQ(te::load_as_float(b, te::DType::BF16, 1), 1.5f);
  uint8_t codes[1] = {0x38};
  EXPECT_EQ(te::load_as_float(codes, te::DType::E4M3, 0), 1.0f);
  EXPECT_EQ(te::load_as_float(codes, te::DType::E5M2, 0), 0.5f);  // 0 01110 00 = 2^-1
}

}  // namespace
