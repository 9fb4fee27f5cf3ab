// CPU GEMM against fp64 on the dequantized operands. The backend accumulates in fp32, so each
// element may differ from the fp64 value by the accumulation error, bounded here by
// 2 * k * 2^-24 * sum_k |a_ik b_kj| (plus 1e-30 absolute), and then by one rounding into D's
// dtype: 2^-24 (F32), 2^-11 (F16), 2^-8 (BF16) relative. GELU is 1.13-Lipschitz, so the same
// bound, doubled, covers the GELU epilogues; the accumulated old D adds one more rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu_test_support.h"
#include "numerics_reference.h"

namespace {

using te::DType;
using te::Epilogue;
using te::ScalingMode;
using te_test::HostTensor;

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

double rel_rounding(DType t) {
  switch (t) {
    case DType::F32: return 0x1p-24;
    case DType::F16: return 0x1p-11;
    default: return 0x1p-8;
  }
}

// Element (r, c) of a stored operand as its exact dequantized value.
double dequantized(const HostTensor &t, int64_t r, int64_t c) {
  if (!te::is_fp8(t.view.dtype)) return t.get(r, c);
  const auto &fmt = t.view.dtype == DType::E4M3 ? te_test::kE4M3 : te_test::kE5M2;
  const int64_t cb = (t.cols() + 127) / 128;
  size_t block = 0;
  if (t.view.scaling == ScalingMode::Block1x128) block = static_cast<size_t>(r * cb + c / 128);
  if (t.view.scaling == ScalingMode::Block128x128) block = static_cast<size_t>((r / 128) * cb + c / 128);
  return te_test::fp8_value(fmt, t.code(r, c)) * static_cast<double>(t.scale_inv[block]);
}

struct GemmCase {
  bool transa = false, transb = false;
  Epilogue epilogue = Epilogue::None;
  bool accumulate = false;
  bool gelu_input = false;
  DType d_type = DType::F32;
};

class CpuGemmTest : public ::testing::Test {
 protected:
  std::unique_ptr<te::Backend> be = te::make_cpu_backend();

  // Runs D = op(A) op(B) (+ epilogue) and checks every element against fp64.
  void check(HostTensor &a, HostTensor &b, int64_t m, int64_t n, int64_t k, const GemmCase &g) {
    HostTensor d(g.d_type, m, n);
    HostTensor old_d(DType::F32, m, n);
    te_test::fill_random(d, 99);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) old_d.set(i, j, d.get(i, j));
    HostTensor bias(DType::BF16, 1, n);
    te_test::fill_random(bias, 5);
    HostTensor pre_gelu(DType::F32, m, n);

    te::GemmArgs args;
    args.a = a.view;
    args.b = b.view;
    args.d = d.view;
    args.transa = g.transa;
    args.transb = g.transb;
    args.epilogue = g.epilogue;
    args.bias = bias.view;
    args.bias.ndim = 1;
    args.bias.shape[0] = n;
    if (g.gelu_input) args.gelu_input = pre_gelu.view;
    args.accumulate = g.accumulate;
    be->gemm(args);

    const bool has_bias = g.epilogue == Epilogue::Bias || g.epilogue == Epilogue::BiasGelu;
    const bool has_gelu = g.epilogue == Epilogue::Gelu || g.epilogue == Epilogue::BiasGelu;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0, abs_sum = 0.0;
        for (int64_t p = 0; p < k; ++p) {
          const double av = g.transa ? dequantized(a, p, i) : dequantized(a, i, p);
          const double bv = g.transb ? dequantized(b, j, p) : dequantized(b, p, j);
          sum += av * bv;
          abs_sum += std::fabs(av * bv);
        }
        double tol = 2.0 * static_cast<double>(k) * 0x1p-24 * abs_sum + 1e-30;
        // cuBLASLt's order: D = gelu(AB + D_old + bias).
        if (g.accumulate) {
          sum += old_d.get(i, j);
          tol += 0x1p-24 * std::fabs(sum);
        }
        if (has_bias) {
          sum += bias.get(0, j);
          tol += 0x1p-24 * std::fabs(sum);
        }
        if (g.gelu_input) {
          ASSERT_NEAR(pre_gelu.get(i, j), sum, tol) << "pre-GELU " << i << "," << j;
        }
        if (has_gelu) {
          sum = gelu_ref(sum);
          tol = 2.0 * tol + 1e-6 * std::fabs(sum);  // also covers float tanh vs fp64 tanh
        }
        tol += rel_rounding(g.d_type) * std::fabs(sum);
        ASSERT_NEAR(d.get(i, j), sum, tol) << i << "," << j;
      }
    }
  }
};

void fill_codes(HostTensor &t, uint32_t seed) {
  std::mt19937 rng(seed);
  for (auto &byte : t.storage) {
    do {
      byte = static_cast<uint8_t>(rng() & 0xFF);
    } while (std::isnan(te::fp8_to_float(byte, t.view.dtype)) || std::isinf(te::fp8_to_float(byte, t.view.dtype)));
  }
  for (size_t i = 0; i < t.scale_inv.size(); ++i) t.scale_inv[i] = std::ldexp(1.0f + 0.37f * static_cast<float>(i % 5), -static_cast<int>(i % 7));
}

TEST_F(CpuGemmTest, HighPrecisionAllTransposeCombinations) {
  const int64_t m = 7, n = 5, k = 13;
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        HostTensor a(t, ta ? k : m, ta ? m : k), b(t, tb ? n : k, tb ? k : n);
        te_test::fill_random(a, 1);
        te_test::fill_random(b, 2);
        GemmCase g;
        g.transa = ta;
        g.transb = tb;
        g.d_type = t;
        SCOPED_TRACE(std::string(te::dtype_name(t)) + " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
        check(a, b, m, n, k, g);
      }
    }
  }
}

TEST_F(CpuGemmTest, Fp8PerTensorMultipliesBothScaleInvs) {
  const int64_t m = 32, n = 48, k = 64;
  for (DType ta : {DType::E4M3, DType::E5M2}) {
    for (DType d_type : {DType::F32, DType::BF16, DType::F16}) {
      HostTensor a(ta, m, k), b(DType::E4M3, n, k);
      fill_codes(a, 3);
      fill_codes(b, 4);
      a.scale_inv[0] = ta == DType::E5M2 ? 1.5e-4f : 0.0123f;  // keep D within F16's range
      b.scale_inv[0] = 3.75e-3f;
      GemmCase g;
      g.transb = true;
      g.d_type = d_type;
      check(a, b, m, n, k, g);
    }
  }
}

TEST_F(CpuGemmTest, Fp8BlockScaledOperands) {
  const int64_t m = 32, n = 144, k = 272;  // k spans three 128-blocks, the last one short
  for (ScalingMode b_mode : {ScalingMode::Block1x128, ScalingMode::Block128x128}) {
    HostTensor a(DType::E4M3, m, k, ScalingMode::Block1x128), b(DType::E4M3, n, k, b_mode);
    fill_codes(a, 5);
    fill_codes(b, 6);
    GemmCase g;
    g.transb = true;
    g.d_type = DType::BF16;
    check(a, b, m, n, k, g);
  }
}

TEST_F(CpuGemmTest, Epilogues) {
  const int64_t m = 16, n = 32, k = 48;
  struct Ep { Epilogue e; bool gelu_input; bool accumulate; DType d; };
  const Ep cases[] = {
      {Epilogue::Bias, false, false, DType::BF16},     {Epilogue::Gelu, true, false, DType::F32},
      {Epilogue::BiasGelu, true, false, DType::BF16},  {Epilogue::BiasGelu, false, false, DType::F16},
      {Epilogue::None, false, true, DType::F32},       {Epilogue::None, false, true, DType::BF16},
      {Epilogue::Bias, false, true, DType::F16},       {Epilogue::BiasGelu, true, true, DType::F32},
  };
  for (const Ep &ep : cases) {
    for (bool fp8 : {false, true}) {
      SCOPED_TRACE("epilogue " + std::to_string(static_cast<int>(ep.e)) + " acc " + std::to_string(ep.accumulate) +
                   " d " + te::dtype_name(ep.d) + " fp8 " + std::to_string(fp8));
      HostTensor a(fp8 ? DType::E4M3 : DType::BF16, m, k), b(fp8 ? DType::E4M3 : DType::BF16, n, k);
      if (fp8) {
        fill_codes(a, 7);
        fill_codes(b, 8);
        a.scale_inv[0] = 0.05f;
        b.scale_inv[0] = 0.02f;
      } else {
        te_test::fill_random(a, 7);
        te_test::fill_random(b, 8);
      }
      GemmCase g;
      g.transb = true;
      g.epilogue = ep.e;
      g.gelu_input = ep.gelu_input;
      g.accumulate = ep.accumulate;
      g.d_type = ep.d;
      check(a, b, m, n, k, g);
    }
  }
}

TEST_F(CpuGemmTest, EmptyInnerDimensionGivesZerosOrKeepsD) {
  HostTensor a(DType::F32, 3, 0), b(DType::F32, 0, 4), d(DType::F32, 3, 4);
  te_test::fill_random(d, 1);
  te::GemmArgs args;
  args.a = a.view;
  args.b = b.view;
  args.d = d.view;
  be->gemm(args);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(d.get(i, j), 0.0f);
}

}  // namespace
