// CPU backend quantization against fp64 code written here: per-tensor cast + transpose + amax,
// 1x128 and 128x128 block quantization on odd shapes, dequantization, and amax with NaN.
// Codes must be bit-exact: each is the reference rounding of the float product x * scale
// (the product is rounded to float first, as the contract specifies).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "cpu_test_support.h"
#include "numerics_reference.h"

namespace {

using te::DType;
using te::ScalingMode;
using te_test::HostTensor;

const te_test::Fp8Format &format_of(DType t) { return t == DType::E4M3 ? te_test::kE4M3 : te_test::kE5M2; }

uint8_t reference_code(DType t, float x, float scale) {
  const float product = x * scale;
  if (std::isnan(product)) return t == DType::E4M3 ? 0x7F : 0x7E;
  return te_test::fp8_round_reference(format_of(t), static_cast<double>(product));
}

// compute_scale_from_amax re-derived: float division done in double is correctly rounded
// (53 >= 2 * 24 + 2), and the power-of-2 mode is 2^floor(log2(scale)).
float reference_scale(double amax, DType t, bool power_of_2, double epsilon) {
  if (amax < epsilon) amax = epsilon;
  if (std::isnan(amax) || std::isinf(amax) || amax == 0.0) return 1.0f;
  double q = static_cast<double>(static_cast<float>(static_cast<double>(te::fp8_max(t)) / amax));
  if (std::isinf(q) || q > FLT_MAX) q = FLT_MAX;
  if (power_of_2) {
    int e;
    std::frexp(q, &e);
    q = std::ldexp(1.0, e - 1);
  }
  return static_cast<float>(q);
}

double reference_abs_max(const HostTensor &x, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  double m = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      const double a = std::fabs(static_cast<double>(x.get(r, c)));
      if (std::isnan(a)) return NAN;
      m = std::max(m, a);
    }
  }
  return m;
}

class CpuQuantizeTest : public ::testing::Test {
 protected:
  std::unique_ptr<te::Backend> be = te::make_cpu_backend();
};

TEST_F(CpuQuantizeTest, CastTransposePerTensorIsBitExact) {
  struct Shape { int64_t rows, cols; };
  for (DType in : {DType::F32, DType::BF16, DType::F16}) {
    for (DType out_type : {DType::E4M3, DType::E5M2}) {
      for (Shape s : {Shape{37, 53}, Shape{128, 96}, Shape{1, 200}, Shape{65, 1}}) {
        HostTensor x(in, s.rows, s.cols);
        te_test::fill_random(x, 42 + static_cast<uint32_t>(s.rows), 3.0f);
        HostTensor out(out_type, s.rows, s.cols), out_t(out_type, s.cols, s.rows);
        const float scale = out_type == DType::E4M3 ? 17.5f : 1000.25f;
        float amax = 0.5f;
        be->cast_transpose(x.view, &scale, &amax, out.ptr(), out_t.ptr());
        for (int64_t r = 0; r < s.rows; ++r) {
          for (int64_t c = 0; c < s.cols; ++c) {
            ASSERT_EQ(out.code(r, c), reference_code(out_type, x.get(r, c), scale)) << r << "," << c;
            ASSERT_EQ(out_t.code(c, r), out.code(r, c));
          }
        }
        EXPECT_EQ(out.scale_inv[0], 1.0f / scale);
        EXPECT_EQ(out_t.scale_inv[0], 1.0f / scale);
        EXPECT_EQ(static_cast<double>(amax), std::max(0.5, reference_abs_max(x, 0, s.rows, 0, s.cols)));
      }
    }
  }
}

TEST_F(CpuQuantizeTest, CastTransposeEitherOutputAloneAndSaturation) {
  HostTensor x(DType::F32, 3, 4);
  const float values[12] = {0.0f, -0.0f, 1e9f, -1e9f, INFINITY, -INFINITY, 448.0f, 1.0f / 64, 3.0f, -5.0f, 0.1f, 2.0f};
  for (int i = 0; i < 12; ++i) x.set(i / 4, i % 4, values[i]);
  const float scale = 1.0f;
  HostTensor out_t(DType::E4M3, 4, 3);
  be->cast_transpose(x.view, &scale, nullptr, nullptr, out_t.ptr());
  EXPECT_EQ(out_t.code(0, 0), 0x00);
  EXPECT_EQ(out_t.code(1, 0), 0x80);
  EXPECT_EQ(out_t.code(2, 0), 0x7E);  // saturated
  EXPECT_EQ(out_t.code(3, 0), 0xFE);
  EXPECT_EQ(out_t.code(0, 1), 0x7E);  // inf saturates too
  EXPECT_EQ(out_t.code(1, 1), 0xFE);
  HostTensor out(DType::E5M2, 3, 4);
  float amax = 0.0f;
  be->cast_transpose(x.view, &scale, &amax, out.ptr(), nullptr);
  EXPECT_EQ(out.code(0, 2), 0x7B);
  EXPECT_EQ(amax, INFINITY);
}

TEST_F(CpuQuantizeTest, AmaxPropagatesNaNAndAccumulates) {
  HostTensor x(DType::BF16, 5, 7);
  te_test::fill_random(x, 3);
  x.set(2, 3, -9.5f);
  float amax = -1.0f;
  be->amax(x.view, &amax, false);
  EXPECT_EQ(amax, 9.5f);
  float acc = 20.0f;
  be->amax(x.view, &acc, true);
  EXPECT_EQ(acc, 20.0f);
  acc = 1.0f;
  be->amax(x.view, &acc, true);
  EXPECT_EQ(acc, 9.5f);
  x.set(4, 6, NAN);
  be->amax(x.view, &amax, false);
  EXPECT_TRUE(std::isnan(amax));
  acc = 100.0f;
  be->amax(x.view, &acc, true);
  EXPECT_TRUE(std::isnan(acc));
  // A NaN in the middle of a cast's pass shows up in its amax and becomes the NaN code.
  const float scale = 2.0f;
  HostTensor out(DType::E4M3, 5, 7);
  float cast_amax = 0.0f;
  be->cast_transpose(x.view, &scale, &cast_amax, out.ptr(), nullptr);
  EXPECT_TRUE(std::isnan(cast_amax));
  EXPECT_EQ(out.code(4, 6), 0x7F);
  // A long tensor crosses the internal chunking.
  HostTensor big(DType::F32, 3, 1500);
  big.set(2, 1499, -123.0f);
  be->amax(big.view, &amax, false);
  EXPECT_EQ(amax, 123.0f);
}

TEST_F(CpuQuantizeTest, ScaleFromAmax) {
  float amax = 3.0f, scale = 0.0f, scale_inv = 0.0f;
  be->scale_from_amax(&amax, &scale, &scale_inv, 448.0f, false, 0.0f);
  EXPECT_EQ(scale, 149.3333333333f);
  EXPECT_EQ(scale_inv, 1.0f / scale);
  be->scale_from_amax(&amax, &scale, &scale_inv, 448.0f, true, 0.0f);
  EXPECT_EQ(scale, 128.0f);
  EXPECT_EQ(scale_inv, 1.0f / 128.0f);
}

struct BlockCase {
  int64_t rows, cols;
};

class CpuBlockQuantizeTest : public CpuQuantizeTest,
                             public ::testing::WithParamInterface<BlockCase> {};

TEST_P(CpuBlockQuantizeTest, OneByOneTwentyEight) {
  const BlockCase s = GetParam();
  for (bool power_of_2 : {false, true}) {
    HostTensor x(DType::BF16, s.rows, s.cols);
    te_test::fill_random(x, 9, 5.0f);
    if (s.cols > 130) {  // one all-zero block: scale 1 (or epsilon's)
      for (int64_t c = 128; c < 256 && c < s.cols; ++c) x.set(0, c, 0.0f);
    }
    HostTensor out(DType::E4M3, s.rows, s.cols, ScalingMode::Block1x128);
    HostTensor out_t(DType::E4M3, s.cols, s.rows, ScalingMode::Block1x128);
    be->block_quantize(x.view, ScalingMode::Block1x128, power_of_2, 0.0f, out.ptr(), out_t.ptr());
    const int64_t cb = (s.cols + 127) / 128, rb = (s.rows + 127) / 128;
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t b = 0; b < cb; ++b) {
        const int64_t c0 = b * 128, c1 = std::min(s.cols, c0 + 128);
        const float scale = reference_scale(reference_abs_max(x, r, r + 1, c0, c1), DType::E4M3, power_of_2, 0.0);
        ASSERT_EQ(out.scale_inv[static_cast<size_t>(r * cb + b)], 1.0f / scale) << r << "," << b;
        for (int64_t c = c0; c < c1; ++c) ASSERT_EQ(out.code(r, c), reference_code(DType::E4M3, x.get(r, c), scale));
      }
    }
    // out_t: x^T [cols, rows], its own 1x128 blocks run along the original rows.
    for (int64_t c = 0; c < s.cols; ++c) {
      for (int64_t b = 0; b < rb; ++b) {
        const int64_t r0 = b * 128, r1 = std::min(s.rows, r0 + 128);
        const float scale = reference_scale(reference_abs_max(x, r0, r1, c, c + 1), DType::E4M3, power_of_2, 0.0);
        ASSERT_EQ(out_t.scale_inv[static_cast<size_t>(c * rb + b)], 1.0f / scale) << c << "," << b;
        for (int64_t r = r0; r < r1; ++r) ASSERT_EQ(out_t.code(c, r), reference_code(DType::E4M3, x.get(r, c), scale));
      }
    }
  }
}

TEST_P(CpuBlockQuantizeTest, OneTwentyEightByOneTwentyEight) {
  const BlockCase s = GetParam();
  for (DType t : {DType::E4M3, DType::E5M2}) {
    HostTensor x(DType::F32, s.rows, s.cols);
    te_test::fill_random(x, 21, 0.01f);
    HostTensor out(t, s.rows, s.cols, ScalingMode::Block128x128);
    HostTensor out_t(t, s.cols, s.rows, ScalingMode::Block128x128);
    be->block_quantize(x.view, ScalingMode::Block128x128, false, 0.0f, out.ptr(), out_t.ptr());
    const int64_t cb = (s.cols + 127) / 128, rb = (s.rows + 127) / 128;
    for (int64_t i = 0; i < rb; ++i) {
      for (int64_t j = 0; j < cb; ++j) {
        const int64_t r0 = i * 128, r1 = std::min(s.rows, r0 + 128);
        const int64_t c0 = j * 128, c1 = std::min(s.cols, c0 + 128);
        const float scale = reference_scale(reference_abs_max(x, r0, r1, c0, c1), t, false, 0.0);
        ASSERT_EQ(out.scale_inv[static_cast<size_t>(i * cb + j)], 1.0f / scale);
        ASSERT_EQ(out_t.scale_inv[static_cast<size_t>(j * rb + i)], 1.0f / scale);  // transposed grid
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t c = c0; c < c1; ++c) {
            ASSERT_EQ(out.code(r, c), reference_code(t, x.get(r, c), scale));
            ASSERT_EQ(out_t.code(c, r), out.code(r, c));
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuBlockQuantizeTest,
                         ::testing::Values(BlockCase{1, 300}, BlockCase{300, 1}, BlockCase{131, 257},
                                           BlockCase{128, 128}, BlockCase{256, 384}, BlockCase{1, 1},
                                           BlockCase{5, 129}),
                         [](const ::testing::TestParamInfo<BlockCase> &info) {
                           return std::to_string(info.param.rows) + "x" + std::to_string(info.param.cols);
                         });

TEST_F(CpuQuantizeTest, BlockEpsilonAndOnlyOneOutput) {
  HostTensor x(DType::F32, 2, 200);  // row 0 all zero, row 1 tiny
  for (int64_t c = 0; c < 200; ++c) x.set(1, c, 1e-6f);
  HostTensor out(DType::E4M3, 2, 200, ScalingMode::Block1x128);
  be->block_quantize(x.view, ScalingMode::Block1x128, false, 0.5f, out.ptr(), nullptr);
  EXPECT_EQ(out.scale_inv[0], 1.0f / 896.0f);  // zero block: amax -> epsilon 0.5
  EXPECT_EQ(out.scale_inv[2], 1.0f / 896.0f);  // 1e-6 < epsilon as well
  HostTensor out_t(DType::E4M3, 200, 2, ScalingMode::Block1x128);
  be->block_quantize(x.view, ScalingMode::Block1x128, false, 0.0f, nullptr, out_t.ptr());
  EXPECT_EQ(out_t.scale_inv[0], 1.0f / reference_scale(1e-6f, DType::E4M3, false, 0.0));
  EXPECT_EQ(out_t.code(0, 1), 0x7E);  // the block's amax maps to fp8_max
}

TEST_F(CpuQuantizeTest, DequantizeEveryModeAndDtype) {
  for (ScalingMode mode : {ScalingMode::PerTensor, ScalingMode::Block1x128, ScalingMode::Block128x128}) {
    for (DType out_type : {DType::F32, DType::BF16, DType::F16}) {
      const int64_t rows = 131, cols = 257;
      HostTensor q(DType::E5M2, rows, cols, mode);
      std::mt19937 rng(5);
      for (auto &b : q.storage) b = static_cast<uint8_t>(rng() & 0xFF);
      for (size_t i = 0; i < q.scale_inv.size(); ++i) q.scale_inv[i] = 0.001f * static_cast<float>(i + 1);
      HostTensor out(out_type, rows, cols);
      be->dequantize(q.view, out.view);
      const int64_t cb = (cols + 127) / 128;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          size_t block = 0;
          if (mode == ScalingMode::Block1x128) block = static_cast<size_t>(r * cb + c / 128);
          if (mode == ScalingMode::Block128x128) block = static_cast<size_t>((r / 128) * cb + c / 128);
          // Code value (<= 4 significant bits) times a float: exact in double, one rounding.
          const double v = te_test::fp8_value(te_test::kE5M2, q.code(r, c)) * static_cast<double>(q.scale_inv[block]);
          const float want_f = static_cast<float>(v);
          HostTensor one(out_type, 1, 1);
          one.set(0, 0, want_f);
          const float want = one.get(0, 0);
          const float got = out.get(r, c);
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got));
          } else {
            ASSERT_EQ(got, want) << r << "," << c;
          }
        }
      }
    }
  }
}

TEST_F(CpuQuantizeTest, BlockQuantizeThenDequantizeIsClose) {
  HostTensor x(DType::F32, 131, 257);
  te_test::fill_random(x, 77);
  HostTensor q(DType::E4M3, 131, 257, ScalingMode::Block1x128);
  be->block_quantize(x.view, ScalingMode::Block1x128, true, 0.0f, q.ptr(), nullptr);
  HostTensor back(DType::F32, 131, 257);
  be->dequantize(q.view, back.view);
  for (int64_t r = 0; r < 131; ++r) {
    for (int64_t c = 0; c < 257; ++c) {
      const int64_t c0 = c / 128 * 128;
      const double amax = reference_abs_max(x, r, r + 1, c0, std::min<int64_t>(257, c0 + 128));
      // E4M3 keeps 3 mantissa bits: relative error <= 2^-4, plus subnormal quanta of the block.
      ASSERT_NEAR(back.get(r, c), x.get(r, c), std::fabs(x.get(r, c)) / 16 + amax * 0x1p-15) << r << "," << c;
    }
  }
}

}  // namespace
