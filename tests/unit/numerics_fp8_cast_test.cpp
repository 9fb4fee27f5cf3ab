// float <-> FP8 (E4M3 e4m3fn, E5M2) against the format definitions in numerics_reference.h:
// every code, every rounding boundary, saturation, signed zeros, subnormals and NaN.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>

#include "numerics_reference.h"
#include "numerics/numerics.h"

namespace {

using te_test::Fp8Format;

struct Fp8Case {
  const char *name;
  const Fp8Format *format;
  te::DType dtype;
  uint8_t nan_code;
};

class Fp8CastTest : public ::testing::TestWithParam<Fp8Case> {
 protected:
  uint8_t encode(float x) const { return te::float_to_fp8(x, GetParam().dtype); }
  float decode(uint8_t c) const { return te::fp8_to_float(c, GetParam().dtype); }
  const Fp8Format &fmt() const { return *GetParam().format; }
  // Expected code for a float input; NaN inputs expect the canonical NaN code.
  uint8_t expected(float x) const {
    if (std::isnan(x)) return GetParam().nan_code;
    return te_test::fp8_round_reference(fmt(), static_cast<double>(x));
  }
};

TEST_P(Fp8CastTest, EveryCodeDecodesExactlyAndReencodesToItself) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const double want = te_test::fp8_value(fmt(), code);
    const float got = decode(code);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      EXPECT_TRUE(std::isnan(decode(encode(got)))) << "code " << c;
      EXPECT_EQ(encode(got), GetParam().nan_code) << "code " << c;
      continue;
    }
    if (std::isinf(want)) {  // E5M2 infinities decode exactly but saturate on the way back
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(encode(got), (code & 0x80) | fmt().max_code) << "code " << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (code & 0x80) != 0) << "code " << c;
    EXPECT_EQ(encode(got), code) << "code " << c << " value " << got;
  }
}

TEST_P(Fp8CastTest, NeighbourMidpointsTieToEvenAndOneUlpAsideGoesToTheNearer) {
  for (int c = 0; c < fmt().max_code; ++c) {
    for (uint8_t sign : {uint8_t{0x00}, uint8_t{0x80}}) {
      const uint8_t lo = sign | static_cast<uint8_t>(c), hi = sign | static_cast<uint8_t>(c + 1);
      const double v_lo = te_test::fp8_value(fmt(), lo), v_hi = te_test::fp8_value(fmt(), hi);
      const float mid = static_cast<float>((v_lo + v_hi) / 2);  // exact: one more bit than a code
      ASSERT_EQ(static_cast<double>(mid), (v_lo + v_hi) / 2);
      const uint8_t even = (c % 2 == 0) ? lo : hi;
      EXPECT_EQ(encode(mid), even) << "midpoint of codes " << int(lo) << "," << int(hi);
      const float toward_lo = std::nextafter(mid, static_cast<float>(v_lo));
      const float toward_hi = std::nextafter(mid, static_cast<float>(v_hi));
      EXPECT_EQ(encode(toward_lo), lo) << "just inside code " << int(lo);
      EXPECT_EQ(encode(toward_hi), hi) << "just inside code " << int(hi);
      EXPECT_EQ(encode(static_cast<float>(v_lo)), lo);
      // Points strictly between a code and the midpoint.
      const float quarter = static_cast<float>(v_lo + (v_hi - v_lo) / 4);
      EXPECT_EQ(encode(quarter), lo);
      const float three_quarters = static_cast<float>(v_lo + 3 * (v_hi - v_lo) / 4);
      EXPECT_EQ(encode(three_quarters), hi);
    }
  }
}

TEST_P(Fp8CastTest, SaturatesFiniteOverflowAndInfinity) {
  const float max = static_cast<float>(fmt().max_value);
  const uint8_t pos_max = fmt().max_code, neg_max = 0x80 | fmt().max_code;
  EXPECT_EQ(encode(max), pos_max);
  EXPECT_EQ(encode(-max), neg_max);
  EXPECT_EQ(encode(std::nextafter(max, INFINITY)), pos_max);
  // Where the next (absent) code would start and beyond: all saturate.
  const float step = static_cast<float>(std::ldexp(1.0, static_cast<int>(std::floor(std::log2(fmt().max_value))) - fmt().mant_bits));
  EXPECT_EQ(encode(max + step / 2), pos_max);
  EXPECT_EQ(encode(max + step), pos_max);
  EXPECT_EQ(encode(-(max + step)), neg_max);
  EXPECT_EQ(encode(2 * max), pos_max);
  EXPECT_EQ(encode(FLT_MAX), pos_max);
  EXPECT_EQ(encode(-FLT_MAX), neg_max);
  EXPECT_EQ(encode(INFINITY), pos_max);
  EXPECT_EQ(encode(-INFINITY), neg_max);
}

TEST_P(Fp8CastTest, ZerosSubnormalsAndNaN) {
  EXPECT_EQ(encode(0.0f), 0x00);
  EXPECT_EQ(encode(-0.0f), 0x80);
  const double min_sub = te_test::fp8_value(fmt(), 0x01);
  EXPECT_EQ(encode(static_cast<float>(min_sub)), 0x01);
  EXPECT_EQ(encode(static_cast<float>(-min_sub)), 0x81);
  EXPECT_EQ(encode(static_cast<float>(min_sub / 2)), 0x00);   // tie to even (zero)
  EXPECT_EQ(encode(static_cast<float>(-min_sub / 2)), 0x80);  // keeps the sign
  EXPECT_EQ(encode(std::nextafter(static_cast<float>(min_sub / 2), 1.0f)), 0x01);
  EXPECT_EQ(encode(static_cast<float>(min_sub * 1.5)), 0x02);  // tie between 1 and 2 -> 2
  EXPECT_EQ(encode(FLT_MIN), 0x00);
  EXPECT_EQ(encode(FLT_TRUE_MIN), 0x00);
  EXPECT_EQ(encode(-FLT_TRUE_MIN), 0x80);
  // The largest subnormal rounds up into the smallest normal.
  const uint8_t largest_sub = static_cast<uint8_t>((1 << fmt().mant_bits) - 1);
  const double v_sub = te_test::fp8_value(fmt(), largest_sub);
  const double v_norm = te_test::fp8_value(fmt(), largest_sub + 1);
  EXPECT_EQ(encode(std::nextafter(static_cast<float>((v_sub + v_norm) / 2), 1.0f)), largest_sub + 1);
  EXPECT_EQ(encode(NAN), GetParam().nan_code);
  EXPECT_EQ(encode(-NAN), GetParam().nan_code);
  EXPECT_EQ(encode(te_test::from_bits(0x7F800001u)), GetParam().nan_code);  // signalling
  EXPECT_EQ(encode(te_test::from_bits(0xFFFFFFFFu)), GetParam().nan_code);
}

TEST_P(Fp8CastTest, RandomAndEdgeFloatsMatchTheReference) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<double> log_mag(-30.0, 20.0);
  int checked = 0;
  for (int i = 0; i < 100000; ++i) {
    // Half: uniformly random bit patterns (all of float's range); half: magnitudes around the
    // format's range, where the interesting rounding happens.
    const float x = (i % 2 == 0) ? te_test::from_bits(any_bits(rng))
                                 : static_cast<float>((i % 4 == 1 ? 1 : -1) * std::exp2(log_mag(rng)));
    ASSERT_EQ(encode(x), expected(x)) << "x = " << x << " bits 0x" << std::hex << te_test::bits(x);
    ++checked;
  }
  EXPECT_EQ(checked, 100000);
}

INSTANTIATE_TEST_SUITE_P(Numerics, Fp8CastTest,
                         ::testing::Values(Fp8Case{"E4M3", &te_test::kE4M3, te::DType::E4M3, 0x7F},
                                           Fp8Case{"E5M2", &te_test::kE5M2, te::DType::E5M2, 0x7E}),
                         [](const ::testing::TestParamInfo<Fp8Case> &info) { return std::string(info.param.name); });

TEST(NumericsFp8Constants, MaxCodesAndValues) {
  EXPECT_EQ(te::float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(te::e4m3_to_float(0x7E), 448.0f);
  EXPECT_TRUE(std::isnan(te::e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(te::e4m3_to_float(0xFF)));
  EXPECT_EQ(te::e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(te::float_to_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(te::e5m2_to_float(0x7C), INFINITY);
  EXPECT_EQ(te::e5m2_to_float(0xFC), -INFINITY);
  for (int c = 0x7D; c <= 0x7F; ++c) EXPECT_TRUE(std::isnan(te::e5m2_to_float(static_cast<uint8_t>(c))));
  EXPECT_EQ(te::e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(te::fp8_max(te::DType::E4M3), 448.0f);
  EXPECT_EQ(te::fp8_max(te::DType::E5M2), 57344.0f);
  // Examples from the OCP FP8 spec.
  EXPECT_EQ(te::float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(te::float_to_e5m2(1.0f), 0x3C);
  EXPECT_EQ(te::float_to_e4m3(-2.0f), 0xC0);
}

}  // namespace
