// Primitives on CPU tensors owned by the test: quantize / cast_transpose / dequantize / amax /
// gemm / activations / DLPack import, each against straightforward fp64 code written here.
#include <functional>

#include "api_test_util.h"
#include "dlpack_abi.h"

using namespace te_test;

namespace {

class Primitives : public CpuContextTest {
 protected:
  HostTensor quantize(const HostTensor &x, te_dtype dtype, te_scaling_mode mode = TE_SCALING_PER_TENSOR,
                      const te_quantize_options *o = nullptr) {
    std::vector<int64_t> shape(x.t.shape, x.t.shape + x.t.ndim);
    HostTensor out = make_tensor(dtype, shape, mode);
    EXPECT_TE_OK(te_quantize(ctx_, x.get(), out.get(), o));
    return out;
  }
};

// Expects out == saturate_rne(x * scale) element-wise (x * scale rounded to fp32 first, as the
// library computes in fp32), and out.scale_inv[0] == 1 / scale.
void expect_per_tensor_quantized(const HostTensor &x, const HostTensor &out, float scale) {
  ASSERT_EQ(out.numel(), x.numel());
  EXPECT_EQ(out.scale_inv[0], 1.0f / scale) << "scale " << scale;
  int bad = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    float v = static_cast<float>(x.at(i)) * scale;
    double want = fp8_round(v, out.t.dtype), got = out.at(i);
    bool ok = std::isnan(want) ? std::isnan(got) : got == want;
    if (!ok && bad++ < 5)
      ADD_FAILURE() << "element " << i << ": x=" << x.at(i) << " x*scale=" << v << " expected "
                    << want << " got " << got << " (code 0x" << std::hex << int(out.code(i)) << ")";
  }
  EXPECT_EQ(bad, 0);
}

HostTensor input_with_amax(te_dtype dtype, std::vector<int64_t> shape, float amax, uint32_t seed) {
  HostTensor x = random_tensor(dtype, shape, -amax * 0.95f, amax * 0.95f, seed);
  x.set(x.numel() / 3, -amax);
  return x;
}

te_quantize_options qopts() {
  te_quantize_options o;
  std::memset(&o, 0x5A, sizeof o);
  EXPECT_TE_OK(te_quantize_options_init(&o));
  return o;
}

// ---- tensors ---------------------------------------------------------------------------------

TEST(Tensor, Numel) {
  HostTensor t = make_tensor(TE_DTYPE_F32, {2, 3, 4});
  EXPECT_EQ(te_tensor_numel(t.get()), 24);
  EXPECT_EQ(te_tensor_numel(nullptr), 0);
  t.t.ndim = 0;
  EXPECT_EQ(te_tensor_numel(t.get()), 0);
  t.t.ndim = TE_MAX_DIMS + 1;
  EXPECT_EQ(te_tensor_numel(t.get()), 0);
  t.t.ndim = -1;
  EXPECT_EQ(te_tensor_numel(t.get()), 0);
  HostTensor big = make_tensor(TE_DTYPE_F32, {1, 1, 1, 1, 1, 1, 1, 5});
  EXPECT_EQ(te_tensor_numel(big.get()), 5);
}

TEST(Tensor, ScaleInvCount) {
  struct Case { std::vector<int64_t> shape; te_scaling_mode mode; int64_t want; };
  std::vector<Case> cases = {
      {{4, 300}, TE_SCALING_PER_TENSOR, 1},     {{4, 300}, TE_SCALING_BLOCK_1X128, 12},
      {{200, 260}, TE_SCALING_BLOCK_128X128, 6}, {{2, 3, 300}, TE_SCALING_BLOCK_1X128, 18},
      {{128, 128}, TE_SCALING_BLOCK_128X128, 1}, {{129, 129}, TE_SCALING_BLOCK_128X128, 4},
      {{7}, TE_SCALING_BLOCK_1X128, 1},          {{256, 1}, TE_SCALING_BLOCK_128X128, 2},
  };
  for (te_dtype dt : {TE_DTYPE_E4M3, TE_DTYPE_E5M2})
    for (const Case &c : cases) {
      HostTensor t = make_tensor(dt, c.shape, c.mode);
      int64_t n = -1;
      ASSERT_TE_OK(te_tensor_scale_inv_count(&n, t.get()));
      EXPECT_EQ(n, c.want) << "mode " << c.mode << " shape[0] " << c.shape[0];
    }
  HostTensor f = make_tensor(TE_DTYPE_BF16, {4, 4});
  int64_t n = -1;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_tensor_scale_inv_count", "t", te_tensor_scale_inv_count(&n, f.get()));
  EXPECT_EQ(n, -1);
  HostTensor e = make_tensor(TE_DTYPE_E4M3, {4, 4});
  e.t.ndim = 0;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_tensor_scale_inv_count", "t", te_tensor_scale_inv_count(&n, e.get()));
  e.t.ndim = 2;
  e.t.shape[1] = -4;
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_tensor_scale_inv_count", "t", te_tensor_scale_inv_count(&n, e.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_tensor_scale_inv_count", "t", te_tensor_scale_inv_count(&n, nullptr));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_tensor_scale_inv_count", "count", te_tensor_scale_inv_count(nullptr, f.get()));
  EXPECT_EQ(n, -1);
}

// ---- quantize ----------------------------------------------------------------------------------

TEST_F(Primitives, QuantizeOptionsDefaults) {
  te_quantize_options o = qopts();
  EXPECT_EQ(o.struct_size, sizeof(te_quantize_options));
  EXPECT_EQ(o.scale, nullptr);
  EXPECT_EQ(o.amax, nullptr);
  EXPECT_EQ(o.amax_epsilon, 0.0f);
  EXPECT_EQ(o.power_of_2_scales, 0);
}

TEST_F(Primitives, QuantizeCurrentScalingPerTensor) {
  for (te_dtype in : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16})
    for (te_dtype out : {TE_DTYPE_E4M3, TE_DTYPE_E5M2}) {
      SCOPED_TRACE(std::string(dtype_name(in)) + " -> " + dtype_name(out));
      HostTensor x = input_with_amax(in, {32, 48}, 3.3f, 1);
      float amax = static_cast<float>(std::fabs(x.at(x.numel() / 3)));  // 3.3 rounded to `in`
      HostTensor q = quantize(x, out);
      expect_per_tensor_quantized(x, q, static_cast<float>(fp8_max(out)) / amax);
      // Same with explicit default options.
      te_quantize_options o = qopts();
      HostTensor q2 = quantize(x, out, TE_SCALING_PER_TENSOR, &o);
      EXPECT_TRUE(same_contents(q, q2));
    }
}

TEST_F(Primitives, QuantizeAnyShape) {
  for (std::vector<int64_t> shape : {std::vector<int64_t>{7}, {2, 3, 5}, {1, 1, 1, 1, 1, 1, 1, 3}, {3, 17}}) {
    HostTensor x = input_with_amax(TE_DTYPE_F32, shape, 1.7f, 2);
    HostTensor q = quantize(x, TE_DTYPE_E4M3);
    expect_per_tensor_quantized(x, q, 448.0f / 1.7f);
  }
}

TEST_F(Primitives, QuantizeGivenScaleSaturatesAndKeepsNan) {
  for (te_dtype out : {TE_DTYPE_E4M3, TE_DTYPE_E5M2}) {
    SCOPED_TRACE(dtype_name(out));
    HostTensor x = random_tensor(TE_DTYPE_F32, {4, 16}, -2, 2, 3);
    x.set(0, INFINITY);
    x.set(1, -INFINITY);
    x.set(2, NAN);
    x.set(3, 1e30f);
    x.set(4, -1e-30f);
    x.set(5, 0.0f);
    x.set(6, -0.0f);
    float scale = out == TE_DTYPE_E4M3 ? 1000.0f : 100000.0f;  // many values saturate
    te_quantize_options o = qopts();
    o.scale = &scale;
    HostTensor q = quantize(x, out, TE_SCALING_PER_TENSOR, &o);
    expect_per_tensor_quantized(x, q, scale);
    EXPECT_EQ(q.at(0), fp8_max(out));
    EXPECT_EQ(q.at(1), -fp8_max(out));
    EXPECT_TRUE(std::isnan(q.at(2)));
  }
}

TEST_F(Primitives, QuantizeRoundsToNearestEvenAtTies) {
  // With scale 1: 1 + 1/16 lies halfway between 1 and 1.125 (E4M3): ties go to the even code
  // (1.0); 1 + 3/16 between 1.125 and 1.25 goes to 1.25. Also the subnormal tie 2^-10.
  HostTensor x = make_tensor(TE_DTYPE_F32, {8},
                             {1.0625f, 1.1875f, -1.0625f, 0.0009765625f, 0.0029296875f, 464.0f, 479.99f, 480.0f});
  float one = 1.0f;
  te_quantize_options o = qopts();
  o.scale = &one;
  HostTensor q = quantize(x, TE_DTYPE_E4M3, TE_SCALING_PER_TENSOR, &o);
  EXPECT_EQ(q.at(0), 1.0);
  EXPECT_EQ(q.at(1), 1.25);
  EXPECT_EQ(q.at(2), -1.0);
  EXPECT_EQ(q.at(3), 0.0);            // 2^-10 is half the smallest subnormal 2^-9: even -> 0
  EXPECT_EQ(q.at(4), 0.00390625);     // 1.5 * 2^-9 -> tie between 2^-9 and 2^-8: even is 2^-8
  EXPECT_EQ(q.at(5), 448.0);          // between 448 and (no larger finite): saturates
  EXPECT_EQ(q.at(6), 448.0);
  EXPECT_EQ(q.at(7), 448.0);
  expect_per_tensor_quantized(x, q, 1.0f);
}

TEST_F(Primitives, QuantizeAmaxIsMaxAccumulated) {
  HostTensor x = input_with_amax(TE_DTYPE_F32, {8, 8}, 3.0f, 4);
  te_quantize_options o = qopts();
  float acc = 10.0f;
  o.amax = &acc;
  quantize(x, TE_DTYPE_E4M3, TE_SCALING_PER_TENSOR, &o);
  EXPECT_EQ(acc, 10.0f);
  acc = 1.0f;
  HostTensor q = quantize(x, TE_DTYPE_E4M3, TE_SCALING_PER_TENSOR, &o);
  EXPECT_EQ(acc, 3.0f);
  expect_per_tensor_quantized(x, q, 448.0f / 3.0f);
  // With a given scale too.
  float scale = 2.0f;
  o.scale = &scale;
  acc = 0.0f;
  q = quantize(x, TE_DTYPE_E4M3, TE_SCALING_PER_TENSOR, &o);
  EXPECT_EQ(acc, 3.0f);
  expect_per_tensor_quantized(x, q, 2.0f);
}

TEST_F(Primitives, QuantizeDegenerateAmax) {
  // amax 0 -> scale 1; amax NaN -> scale 1 (NaN stays NaN); epsilon clamps the amax up.
  HostTensor zeros = make_tensor(TE_DTYPE_F32, {4, 4}, std::vector<float>(16, 0.0f));
  HostTensor q = quantize(zeros, TE_DTYPE_E4M3);
  EXPECT_EQ(q.scale_inv[0], 1.0f);
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(q.at(i), 0.0);

  HostTensor withnan = input_with_amax(TE_DTYPE_F32, {4, 4}, 3.0f, 5);
  withnan.set(9, NAN);
  q = quantize(withnan, TE_DTYPE_E4M3);
  expect_per_tensor_quantized(withnan, q, 1.0f);

  HostTensor small = input_with_amax(TE_DTYPE_F32, {4, 4}, 0.1f, 6);
  te_quantize_options o = qopts();
  o.amax_epsilon = 0.5f;
  q = quantize(small, TE_DTYPE_E4M3, TE_SCALING_PER_TENSOR, &o);
  expect_per_tensor_quantized(small, q, 896.0f);
  o.amax_epsilon = 0.01f;  // below the amax: no effect
  q = quantize(small, TE_DTYPE_E4M3, TE_SCALING_PER_TENSOR, &o);
  expect_per_tensor_quantized(small, q, 448.0f / 0.1f);
}

TEST_F(Primitives, QuantizePowerOfTwoScale) {
  HostTensor x = input_with_amax(TE_DTYPE_F32, {4, 32}, 3.3f, 7);
  te_quantize_options o = qopts();
  o.power_of_2_scales = 1;
  HostTensor q = quantize(x, TE_DTYPE_E4M3, TE_SCALING_PER_TENSOR, &o);
  expect_per_tensor_quantized(x, q, 128.0f);  // 448 / 3.3 = 135.8 -> 2^7
  q = quantize(x, TE_DTYPE_E5M2, TE_SCALING_PER_TENSOR, &o);
  expect_per_tensor_quantized(x, q, 16384.0f);  // 57344 / 3.3 = 17377 -> 2^14
}

// Block-scaled: each block has its own current scale. Rows/cols chosen to leave partial blocks;
// magnitudes vary per block; one block is all zeros (scale 1).
void expect_block_quantized(const HostTensor &x, const HostTensor &q, bool pow2) {
  int64_t rows = x.rows(), cols = x.cols(), cb = (cols + 127) / 128;
  bool tiles = q.t.scaling == TE_SCALING_BLOCK_128X128;
  int64_t nblocks = scale_inv_count_ref(rows, cols, q.t.scaling);
  ASSERT_EQ(static_cast<int64_t>(q.scale_inv.size()), nblocks);
  auto block_of = [&](int64_t r, int64_t c) { return tiles ? (r / 128) * cb + c / 128 : r * cb + c / 128; };
  std::vector<float> amax(static_cast<size_t>(nblocks), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float &a = amax[static_cast<size_t>(block_of(r, c))];
      a = std::max(a, static_cast<float>(std::fabs(x.at(r * cols + c))));
    }
  float fmax = static_cast<float>(fp8_max(q.t.dtype));
  std::vector<float> scale(static_cast<size_t>(nblocks));
  for (size_t b = 0; b < scale.size(); ++b) {
    float s = amax[b] == 0.0f ? 1.0f : fmax / amax[b];
    if (pow2) s = std::ldexp(1.0f, std::ilogb(s));
    scale[b] = s;
    EXPECT_EQ(q.scale_inv[b], 1.0f / s) << "block " << b << " amax " << amax[b];
  }
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      int64_t i = r * cols + c;
      float v = static_cast<float>(x.at(i)) * scale[static_cast<size_t>(block_of(r, c))];
      double want = fp8_round(v, q.t.dtype);
      if (q.at(i) != want && bad++ < 5)
        ADD_FAILURE() << "(" << r << "," << c << "): expected " << want << " got " << q.at(i);
    }
  EXPECT_EQ(bad, 0);
}

HostTensor blocky_input(int64_t rows, int64_t cols, uint32_t seed) {
  HostTensor x = random_tensor(TE_DTYPE_F32, {rows, cols}, -1, 1, seed);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float f = std::ldexp(1.0f, static_cast<int>((r / 64 + c / 128 * 3) % 9) - 4);  // 2^-4 .. 2^4
      if (r < 2 && c < 128) f = 0.0f;  // a zero 1x128 block
      x.set(r * cols + c, static_cast<float>(x.at(r * cols + c)) * f * 1.3f);
    }
  return x;
}

TEST_F(Primitives, QuantizeBlock1x128) {
  HostTensor x = blocky_input(4, 300, 8);
  for (te_dtype out : {TE_DTYPE_E4M3, TE_DTYPE_E5M2}) {
    HostTensor q = quantize(x, out, TE_SCALING_BLOCK_1X128);
    expect_block_quantized(x, q, false);
    te_quantize_options o = qopts();
    o.power_of_2_scales = 1;
    q = quantize(x, out, TE_SCALING_BLOCK_1X128, &o);
    expect_block_quantized(x, q, true);
  }
}

TEST_F(Primitives, QuantizeBlock128x128) {
  HostTensor x = blocky_input(200, 260, 9);
  HostTensor q = quantize(x, TE_DTYPE_E4M3, TE_SCALING_BLOCK_128X128);
  expect_block_quantized(x, q, false);
  // A 3-D tensor is seen as [prod(leading), last].
  HostTensor x3 = random_tensor(TE_DTYPE_BF16, {2, 3, 130}, -2, 2, 10);
  HostTensor q3 = quantize(x3, TE_DTYPE_E4M3, TE_SCALING_BLOCK_1X128);
  expect_block_quantized(x3, q3, false);
}

TEST_F(Primitives, QuantizeBlockAccumulatesAmax) {
  // te_quantize_options.amax is documented as optional for every mode ("x's amax is
  // max-accumulated into this float"); only a given per-tensor `scale` conflicts with blocks.
  HostTensor x = blocky_input(4, 300, 17);
  double want = 0;
  for (int64_t i = 0; i < x.numel(); ++i) want = std::max(want, std::fabs(x.at(i)));
  te_quantize_options o = qopts();
  float acc = 0.0f;
  o.amax = &acc;
  HostTensor q = make_tensor(TE_DTYPE_E4M3, {4, 300}, TE_SCALING_BLOCK_1X128);
  ASSERT_TE_OK(te_quantize(ctx_, x.get(), q.get(), &o));
  EXPECT_EQ(acc, static_cast<float>(want));
  expect_block_quantized(x, q, false);
}

// ---- dequantize --------------------------------------------------------------------------------

TEST_F(Primitives, DequantizeExact) {
  HostTensor x = input_with_amax(TE_DTYPE_F32, {16, 40}, 2.7f, 11);
  for (te_scaling_mode mode : {TE_SCALING_PER_TENSOR, TE_SCALING_BLOCK_1X128, TE_SCALING_BLOCK_128X128})
    for (te_dtype fp8 : {TE_DTYPE_E4M3, TE_DTYPE_E5M2})
      for (te_dtype hp : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16}) {
        SCOPED_TRACE(std::string(dtype_name(fp8)) + " -> " + dtype_name(hp) + " mode " + std::to_string(mode));
        HostTensor q = quantize(x, fp8, mode);
        HostTensor d = make_tensor(hp, {16, 40});
        ASSERT_TE_OK(te_dequantize(ctx_, q.get(), d.get()));
        std::vector<double> ref = dequantize_ref(q);
        int bad = 0;
        for (int64_t i = 0; i < d.numel(); ++i) {
          // code * scale_inv in fp32, then rounded to the output dtype.
          float f = static_cast<float>(q.at(i)) * static_cast<float>(ref[static_cast<size_t>(i)] / q.at(i));
          if (q.at(i) == 0) f = 0.0f;
          float want = hp == TE_DTYPE_F32 ? f : hp == TE_DTYPE_BF16 ? round_bf16(f) : round_f16(f);
          if (d.at(i) != want && bad++ < 5) ADD_FAILURE() << i << ": expected " << want << " got " << d.at(i);
          // And the round trip is within half an FP8 ulp (relative 2^-4 for E4M3, 2^-3 E5M2).
          double rel = fp8 == TE_DTYPE_E4M3 ? 0.0625 : 0.125;
          double sub = fp8 == TE_DTYPE_E4M3 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17);
          double tol = rel * std::fabs(x.at(i)) + sub * 2.7 + std::fabs(want) * std::ldexp(1.0, -8);
          if (std::fabs(d.at(i) - x.at(i)) > tol && bad++ < 5)
            ADD_FAILURE() << i << ": round trip " << x.at(i) << " -> " << d.at(i);
        }
        EXPECT_EQ(bad, 0);
      }
}

// ---- cast_transpose ------------------------------------------------------------------------------

TEST_F(Primitives, CastTransposePerTensor) {
  const int64_t R = 48, C = 32;
  HostTensor x = input_with_amax(TE_DTYPE_BF16, {R, C}, 5.0f, 12);
  for (te_dtype fp8 : {TE_DTYPE_E4M3, TE_DTYPE_E5M2}) {
    HostTensor out = make_tensor(fp8, {R, C}), out_t = make_tensor(fp8, {C, R});
    ASSERT_TE_OK(te_cast_transpose(ctx_, x.get(), out.get(), out_t.get(), nullptr));
    HostTensor q = quantize(x, fp8);
    EXPECT_TRUE(same_contents(out, q)) << "out must equal te_quantize(x)";
    EXPECT_EQ(out_t.scale_inv[0], out.scale_inv[0]);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out_t.code(c * R + r), out.code(r * C + c)) << r << "," << c;
    // Either output may be NULL.
    HostTensor only_t = make_tensor(fp8, {C, R});
    ASSERT_TE_OK(te_cast_transpose(ctx_, x.get(), nullptr, only_t.get(), nullptr));
    EXPECT_TRUE(same_contents(only_t, out_t));
    HostTensor only = make_tensor(fp8, {R, C});
    ASSERT_TE_OK(te_cast_transpose(ctx_, x.get(), only.get(), nullptr, nullptr));
    EXPECT_TRUE(same_contents(only, out));
  }
  // With a given scale and amax accumulation.
  float scale = 3.0f, acc = 0.0f;
  te_quantize_options o = qopts();
  o.scale = &scale;
  o.amax = &acc;
  HostTensor out = make_tensor(TE_DTYPE_E4M3, {R, C}), out_t = make_tensor(TE_DTYPE_E4M3, {C, R});
  ASSERT_TE_OK(te_cast_transpose(ctx_, x.get(), out.get(), out_t.get(), &o));
  expect_per_tensor_quantized(x, out, 3.0f);
  EXPECT_EQ(acc, 5.0f);
}

TEST_F(Primitives, CastTransposeBlock1x128) {
  const int64_t R = 160, C = 300;
  HostTensor x = blocky_input(R, C, 13);
  HostTensor out = make_tensor(TE_DTYPE_E4M3, {R, C}, TE_SCALING_BLOCK_1X128);
  HostTensor out_t = make_tensor(TE_DTYPE_E4M3, {C, R}, TE_SCALING_BLOCK_1X128);
  ASSERT_TE_OK(te_cast_transpose(ctx_, x.get(), out.get(), out_t.get(), nullptr));
  expect_block_quantized(x, out, false);
  HostTensor xt = make_tensor(TE_DTYPE_F32, {C, R});
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) xt.set(c * R + r, static_cast<float>(x.at(r * C + c)));
  expect_block_quantized(xt, out_t, false);  // x^T with its own 1x128 blocks
}

TEST_F(Primitives, CastTransposeBlock128x128) {
  const int64_t R = 200, C = 260;
  HostTensor x = blocky_input(R, C, 14);
  HostTensor out = make_tensor(TE_DTYPE_E4M3, {R, C}, TE_SCALING_BLOCK_128X128);
  HostTensor out_t = make_tensor(TE_DTYPE_E4M3, {C, R}, TE_SCALING_BLOCK_128X128);
  ASSERT_TE_OK(te_cast_transpose(ctx_, x.get(), out.get(), out_t.get(), nullptr));
  expect_block_quantized(x, out, false);
  // The transposed tile grid: same tiles, so same scales and transposed codes.
  ASSERT_EQ(out.scale_inv.size(), 6u);
  ASSERT_EQ(out_t.scale_inv.size(), 6u);
  for (int64_t tr = 0; tr < 2; ++tr)
    for (int64_t tc = 0; tc < 3; ++tc)
      EXPECT_EQ(out_t.scale_inv[static_cast<size_t>(tc * 2 + tr)], out.scale_inv[static_cast<size_t>(tr * 3 + tc)]);
  int bad = 0;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      if (out_t.at(c * R + r) != out.at(r * C + c) && bad++ < 5) ADD_FAILURE() << r << "," << c;
  EXPECT_EQ(bad, 0);
}

// ---- amax ----------------------------------------------------------------------------------------

TEST_F(Primitives, Amax) {
  for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16}) {
    HostTensor x = input_with_amax(dt, {33, 17}, 6.5f, 15);
    float a = -1.0f;
    ASSERT_TE_OK(te_amax(ctx_, x.get(), &a));
    EXPECT_EQ(a, 6.5f) << dtype_name(dt);
  }
  HostTensor x = random_tensor(TE_DTYPE_F32, {1000}, -1, 1, 16);
  for (int64_t pos : {int64_t(0), int64_t(500), int64_t(999)}) {
    HostTensor y = x.clone();
    y.set(pos, NAN);
    float a = 0.0f;
    ASSERT_TE_OK(te_amax(ctx_, y.get(), &a));
    EXPECT_TRUE(std::isnan(a)) << "NaN at " << pos << " gave " << a;
  }
  HostTensor z = x.clone();
  z.set(3, -INFINITY);
  float a = 0.0f;
  ASSERT_TE_OK(te_amax(ctx_, z.get(), &a));
  EXPECT_EQ(a, INFINITY);
  HostTensor zeros = make_tensor(TE_DTYPE_F32, {5}, std::vector<float>(5, -0.0f));
  a = 7.0f;
  ASSERT_TE_OK(te_amax(ctx_, zeros.get(), &a));
  EXPECT_EQ(a, 0.0f);
}

// ---- gemm ----------------------------------------------------------------------------------------

te_gemm_options gopts(int transa, int transb) {
  te_gemm_options o;
  std::memset(&o, 0x5A, sizeof o);
  EXPECT_TE_OK(te_gemm_options_init(&o));
  o.transa = transa;
  o.transb = transb;
  return o;
}

void expect_gemm_close(const HostTensor &d, const std::vector<double> &ref, const std::vector<double> &absdot,
                       int64_t k, const std::vector<double> *base = nullptr) {
  int bad = 0;
  for (int64_t i = 0; i < d.numel(); ++i) {
    double want = ref[static_cast<size_t>(i)] + (base ? (*base)[static_cast<size_t>(i)] : 0.0);
    double tol = gemm_tolerance(absdot[static_cast<size_t>(i)] + (base ? std::fabs((*base)[static_cast<size_t>(i)]) : 0.0),
                                want, k, d.t.dtype);
    if (!(std::fabs(d.at(i) - want) <= tol) && bad++ < 5)
      ADD_FAILURE() << "D[" << i << "] = " << d.at(i) << ", fp64 reference " << want << ", tolerance " << tol;
  }
  EXPECT_EQ(bad, 0);
}

TEST(GemmOptions, Defaults) {
  te_gemm_options o = gopts(0, 0);
  EXPECT_EQ(o.struct_size, sizeof(te_gemm_options));
  te_gemm_options f;
  ASSERT_TE_OK(te_gemm_options_init(&f));
  EXPECT_EQ(f.transa, 0);
  EXPECT_EQ(f.transb, 0);
  EXPECT_EQ(f.epilogue, TE_EPILOGUE_NONE);
  EXPECT_EQ(f.bias, nullptr);
  EXPECT_EQ(f.gelu_input, nullptr);
  EXPECT_EQ(f.accumulate, 0);
}

TEST_F(Primitives, GemmHighPrecisionAllTransposes) {
  const int64_t m = 5, n = 7, k = 33;
  for (te_dtype in : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16})
    for (te_dtype out : {TE_DTYPE_F32, TE_DTYPE_BF16})
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
          SCOPED_TRACE(std::string(dtype_name(in)) + "->" + dtype_name(out) + " ta " + std::to_string(ta) +
                       " tb " + std::to_string(tb));
          HostTensor a = random_tensor(in, ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, -2, 2, 20);
          HostTensor b = random_tensor(in, tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, -2, 2, 21);
          HostTensor d = make_tensor(out, {m, n});
          te_gemm_options o = gopts(ta, tb);
          ASSERT_TE_OK(te_gemm(ctx_, a.get(), b.get(), d.get(), &o));
          std::vector<double> absdot;
          auto ref = ref_gemm(a.values(), b.values(), m, n, k, ta, tb, &absdot);
          expect_gemm_close(d, ref, absdot, k);
        }
}

TEST_F(Primitives, GemmNullOptionsMeansNN) {
  HostTensor a = random_tensor(TE_DTYPE_F32, {3, 4}, -1, 1, 22), b = random_tensor(TE_DTYPE_F32, {4, 2}, -1, 1, 23);
  HostTensor d = make_tensor(TE_DTYPE_F32, {3, 2});
  ASSERT_TE_OK(te_gemm(ctx_, a.get(), b.get(), d.get(), nullptr));
  std::vector<double> absdot;
  auto ref = ref_gemm(a.values(), b.values(), 3, 2, 4, false, false, &absdot);
  expect_gemm_close(d, ref, absdot, 4);
}

TEST_F(Primitives, GemmFp8PerTensor) {
  const int64_t m = 32, n = 48, k = 64;
  HostTensor xa = input_with_amax(TE_DTYPE_F32, {m, k}, 3.0f, 24), xb = input_with_amax(TE_DTYPE_F32, {n, k}, 0.7f, 25);
  struct Pair { te_dtype a, b; };
  for (Pair p : {Pair{TE_DTYPE_E4M3, TE_DTYPE_E4M3}, Pair{TE_DTYPE_E4M3, TE_DTYPE_E5M2}, Pair{TE_DTYPE_E5M2, TE_DTYPE_E4M3}})
    for (te_dtype out : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16})
      for (int split = 0; split < 2; ++split) {
        SCOPED_TRACE(std::string(dtype_name(p.a)) + "x" + dtype_name(p.b) + "->" + dtype_name(out) +
                     (split ? " split" : ""));
        HostTensor a = quantize(xa, p.a), b = quantize(xb, p.b);
        HostTensor d = make_tensor(out, {m, n});
        te_gemm_options o = gopts(0, 1);
        o.use_split_accumulator = split;
        ASSERT_TE_OK(te_gemm(ctx_, a.get(), b.get(), d.get(), &o));
        std::vector<double> absdot;
        auto ref = ref_gemm(dequantize_ref(a), dequantize_ref(b), m, n, k, false, true, &absdot);
        expect_gemm_close(d, ref, absdot, k);
      }
}

TEST_F(Primitives, GemmFp8BlockScaled) {
  // A 1x128 blocks; B 1x128 or 128x128; k spans two blocks of different magnitudes.
  const int64_t m = 32, n = 144, k = 256;
  HostTensor xa = blocky_input(m, k, 26), xb = blocky_input(n, k, 27);
  for (te_scaling_mode bm : {TE_SCALING_BLOCK_1X128, TE_SCALING_BLOCK_128X128}) {
    HostTensor a = quantize(xa, TE_DTYPE_E4M3, TE_SCALING_BLOCK_1X128), b = quantize(xb, TE_DTYPE_E4M3, bm);
    HostTensor d = make_tensor(TE_DTYPE_F32, {m, n});
    te_gemm_options o = gopts(0, 1);
    ASSERT_TE_OK(te_gemm(ctx_, a.get(), b.get(), d.get(), &o)) << "B mode " << bm;
    std::vector<double> absdot;
    auto ref = ref_gemm(dequantize_ref(a), dequantize_ref(b), m, n, k, false, true, &absdot);
    expect_gemm_close(d, ref, absdot, k);
  }
}

TEST_F(Primitives, GemmFp8Rules) {
  HostTensor xa = random_tensor(TE_DTYPE_F32, {32, 64}, -1, 1, 28), xb = random_tensor(TE_DTYPE_F32, {48, 64}, -1, 1, 29);
  HostTensor a4 = quantize(xa, TE_DTYPE_E4M3), b4 = quantize(xb, TE_DTYPE_E4M3);
  HostTensor a5 = quantize(xa, TE_DTYPE_E5M2), b5 = quantize(xb, TE_DTYPE_E5M2);
  HostTensor d = make_tensor(TE_DTYPE_F32, {32, 48});
  HostTensor d0 = d.clone();
  te_gemm_options o = gopts(0, 1);
  EXPECT_TE_FAIL(TE_ERROR_UNSUPPORTED, "te_gemm", nullptr, te_gemm(ctx_, a5.get(), b5.get(), d.get(), &o));
  EXPECT_TRUE(same_contents(d, d0));
  // transa = 1: A [k, m]; transb = 0: B [k, n]. Shapes consistent, layout not TN.
  HostTensor at = quantize(random_tensor(TE_DTYPE_F32, {64, 32}, -1, 1, 30), TE_DTYPE_E4M3);
  HostTensor bn = quantize(random_tensor(TE_DTYPE_F32, {64, 48}, -1, 1, 31), TE_DTYPE_E4M3);
  te_gemm_options o_tt = gopts(1, 1);
  EXPECT_TE_FAIL(TE_ERROR_UNSUPPORTED, "te_gemm", nullptr, te_gemm(ctx_, at.get(), b4.get(), d.get(), &o_tt));
  te_gemm_options o_nn = gopts(0, 0);
  EXPECT_TE_FAIL(TE_ERROR_UNSUPPORTED, "te_gemm", nullptr, te_gemm(ctx_, a4.get(), bn.get(), d.get(), &o_nn));
  EXPECT_TRUE(same_contents(d, d0));
  // Dims not multiples of 16: m = 24, n = 40, k = 72 one at a time.
  {
    HostTensor a = quantize(random_tensor(TE_DTYPE_F32, {24, 64}, -1, 1, 32), TE_DTYPE_E4M3);
    HostTensor dd = make_tensor(TE_DTYPE_F32, {24, 48}), dd0 = dd.clone();
    EXPECT_TE_FAIL(TE_ERROR_UNSUPPORTED, "te_gemm", nullptr, te_gemm(ctx_, a.get(), b4.get(), dd.get(), &o));
    EXPECT_TRUE(same_contents(dd, dd0));
  }
  {
    HostTensor b = quantize(random_tensor(TE_DTYPE_F32, {40, 64}, -1, 1, 33), TE_DTYPE_E4M3);
    HostTensor dd = make_tensor(TE_DTYPE_F32, {32, 40}), dd0 = dd.clone();
    EXPECT_TE_FAIL(TE_ERROR_UNSUPPORTED, "te_gemm", nullptr, te_gemm(ctx_, a4.get(), b.get(), dd.get(), &o));
    EXPECT_TRUE(same_contents(dd, dd0));
  }
  {
    HostTensor a = quantize(random_tensor(TE_DTYPE_F32, {32, 72}, -1, 1, 34), TE_DTYPE_E4M3);
    HostTensor b = quantize(random_tensor(TE_DTYPE_F32, {48, 72}, -1, 1, 35), TE_DTYPE_E4M3);
    EXPECT_TE_FAIL(TE_ERROR_UNSUPPORTED, "te_gemm", nullptr, te_gemm(ctx_, a.get(), b.get(), d.get(), &o));
    EXPECT_TRUE(same_contents(d, d0));
  }
  // Mixed FP8 / high precision operands are an argument error.
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_gemm", "b", te_gemm(ctx_, a4.get(), xb.get(), d.get(), &o));
  EXPECT_TRUE(same_contents(d, d0));
}

double gelu_ref(double x) {
  const double c = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double gelu_grad_ref(double x) {
  const double c = std::sqrt(2.0 / 3.14159265358979323846);
  double t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}
double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
double silu_grad_ref(double x) {
  double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1.0 + x * (1.0 - s));
}

TEST_F(Primitives, GemmEpilogues) {
  const int64_t m = 16, n = 32, k = 48;
  HostTensor a = random_tensor(TE_DTYPE_F32, {m, k}, -0.5f, 0.5f, 36), b = random_tensor(TE_DTYPE_F32, {n, k}, -0.5f, 0.5f, 37);
  HostTensor bias = random_tensor(TE_DTYPE_F32, {n}, -1, 1, 38);
  std::vector<double> absdot;
  auto ref = ref_gemm(a.values(), b.values(), m, n, k, false, true, &absdot);
  for (te_epilogue ep : {TE_EPILOGUE_BIAS, TE_EPILOGUE_GELU, TE_EPILOGUE_BIAS_GELU}) {
    SCOPED_TRACE("epilogue " + std::to_string(ep));
    bool has_bias = ep == TE_EPILOGUE_BIAS || ep == TE_EPILOGUE_BIAS_GELU;
    bool has_gelu = ep != TE_EPILOGUE_BIAS;
    HostTensor d = make_tensor(TE_DTYPE_F32, {m, n}), pre = make_tensor(TE_DTYPE_F32, {m, n});
    te_gemm_options o = gopts(0, 1);
    o.epilogue = ep;
    o.bias = has_bias ? bias.get() : nullptr;
    o.gelu_input = has_gelu ? pre.get() : nullptr;
    ASSERT_TE_OK(te_gemm(ctx_, a.get(), b.get(), d.get(), &o));
    int bad = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        size_t ij = static_cast<size_t>(i * n + j);
        double z = ref[ij] + (has_bias ? bias.at(j) : 0.0);
        // GEMM bound on z (the bias adds one more fp32 rounding), then GELU is 1.13-Lipschitz and
        // computed in fp32 (a few ulps of |gelu(z)| plus fp32 absolute noise near 0).
        double tol_z = gemm_tolerance(absdot[ij] + std::fabs(z), z, k + 1, TE_DTYPE_F32);
        double want = has_gelu ? gelu_ref(z) : z;
        double tol = has_gelu ? 1.2 * tol_z + 4e-7 * (std::fabs(want) + std::fabs(z)) + 1e-7 : tol_z;
        if (!(std::fabs(d.at(static_cast<int64_t>(ij)) - want) <= tol) && bad++ < 5)
          ADD_FAILURE() << "D(" << i << "," << j << ") = " << d.at(static_cast<int64_t>(ij)) << " want " << want;
        if (has_gelu && !(std::fabs(pre.at(static_cast<int64_t>(ij)) - z) <= tol_z) && bad++ < 5)
          ADD_FAILURE() << "gelu_input(" << i << "," << j << ") = " << pre.at(static_cast<int64_t>(ij)) << " want " << z;
      }
    EXPECT_EQ(bad, 0);
  }
}

TEST_F(Primitives, GemmAccumulate) {
  const int64_t m = 16, n = 16, k = 32;
  HostTensor xa = random_tensor(TE_DTYPE_F32, {m, k}, -1, 1, 39), xb = random_tensor(TE_DTYPE_F32, {n, k}, -1, 1, 40);
  HostTensor a = quantize(xa, TE_DTYPE_E4M3), b = quantize(xb, TE_DTYPE_E4M3);
  HostTensor d = random_tensor(TE_DTYPE_F32, {m, n}, -3, 3, 41);
  std::vector<double> base = d.values();
  te_gemm_options o = gopts(0, 1);
  o.accumulate = 1;
  ASSERT_TE_OK(te_gemm(ctx_, a.get(), b.get(), d.get(), &o));
  std::vector<double> absdot;
  auto ref = ref_gemm(dequantize_ref(a), dequantize_ref(b), m, n, k, false, true, &absdot);
  expect_gemm_close(d, ref, absdot, k + 1, &base);
}

// ---- activations ---------------------------------------------------------------------------------

double act_ref(te_activation act, double x) {
  if (act == TE_ACTIVATION_RELU) return std::max(x, 0.0);
  if (act == TE_ACTIVATION_SRELU) return std::max(x, 0.0) * std::max(x, 0.0);
  return gelu_ref(x);
}
double act_grad_ref(te_activation act, double x) {
  if (act == TE_ACTIVATION_RELU) return x > 0 ? 1.0 : 0.0;
  if (act == TE_ACTIVATION_SRELU) return x > 0 ? 2.0 * x : 0.0;
  return gelu_grad_ref(x);
}
const char *act_name(te_activation act) {
  return act == TE_ACTIVATION_RELU ? "relu " : act == TE_ACTIVATION_SRELU ? "srelu " : "gelu ";
}

// Inputs in [-5, 5] kept away from ReLU's kink (finite differences need |x| > h).
HostTensor act_input(te_dtype dt, std::vector<int64_t> shape, uint32_t seed) {
  HostTensor x = random_tensor(dt, shape, -5, 5, seed);
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::fabs(x.at(i)) < 0.05) x.set(i, 0.25f);
  return x;
}

// fp32 computation of act(x) for |x| <= 5: a few fp32 ulps of the larger of |x| and |y|
// (tanh/exp in fp32 are within 2 ulps; products and sums add a few more).
double act_tol(double x, double y, te_dtype dt) {
  double t = 8 * std::ldexp(1.0, -24) * (std::fabs(x) + std::fabs(y)) + 1e-30;
  if (dt == TE_DTYPE_BF16) t += std::ldexp(1.0, -8) * std::fabs(y);
  if (dt == TE_DTYPE_F16) t += std::ldexp(1.0, -11) * std::fabs(y) + std::ldexp(1.0, -25);
  return t;
}

TEST_F(Primitives, ElementwiseActivationsForwardBackward) {
  for (te_activation act : {TE_ACTIVATION_RELU, TE_ACTIVATION_GELU, TE_ACTIVATION_SRELU})
    for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16}) {
      SCOPED_TRACE(std::string(act_name(act)) + dtype_name(dt));
      HostTensor x = act_input(dt, {6, 40}, 50), dy = random_tensor(dt, {6, 40}, -2, 2, 51);
      HostTensor y = make_tensor(dt, {6, 40}), dx = make_tensor(dt, {6, 40});
      ASSERT_TE_OK(te_activation_forward(ctx_, act, x.get(), y.get()));
      ASSERT_TE_OK(te_activation_backward(ctx_, act, x.get(), dy.get(), dx.get()));
      int bad = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        double want = act_ref(act, x.at(i));
        if (!(std::fabs(y.at(i) - want) <= act_tol(x.at(i), want, dt)) && bad++ < 5)
          ADD_FAILURE() << "y(" << x.at(i) << ") = " << y.at(i) << " want " << want;
        double gwant = dy.at(i) * act_grad_ref(act, x.at(i));
        double gtol = act_tol(x.at(i) * 4, gwant, dt) * (1 + std::fabs(dy.at(i)));
        if (!(std::fabs(dx.at(i) - gwant) <= gtol) && bad++ < 5)
          ADD_FAILURE() << "dx at x=" << x.at(i) << " dy=" << dy.at(i) << ": " << dx.at(i) << " want " << gwant;
      }
      EXPECT_EQ(bad, 0);
    }
}

TEST_F(Primitives, ElementwiseBackwardMatchesFiniteDifferencesOfForward) {
  // Central differences of the library's own forward (F32), step h: truncation ~ h^2 |f'''| / 6
  // (<= 2e-5 here) plus fp32 rounding ~ 2 * 2^-24 * |y| / (2h) (<= 2e-5): tolerance 2e-4.
  const float h = 1e-2f;
  for (te_activation act : {TE_ACTIVATION_RELU, TE_ACTIVATION_GELU, TE_ACTIVATION_SRELU}) {
    HostTensor x = act_input(TE_DTYPE_F32, {4, 32}, 52);
    HostTensor ones = make_tensor(TE_DTYPE_F32, {4, 32}, std::vector<float>(128, 1.0f));
    HostTensor xp = x.clone(), xm = x.clone();
    for (int64_t i = 0; i < x.numel(); ++i) {
      xp.set(i, static_cast<float>(x.at(i)) + h);
      xm.set(i, static_cast<float>(x.at(i)) - h);
    }
    HostTensor yp = make_tensor(TE_DTYPE_F32, {4, 32}), ym = make_tensor(TE_DTYPE_F32, {4, 32}),
               dx = make_tensor(TE_DTYPE_F32, {4, 32});
    ASSERT_TE_OK(te_activation_forward(ctx_, act, xp.get(), yp.get()));
    ASSERT_TE_OK(te_activation_forward(ctx_, act, xm.get(), ym.get()));
    ASSERT_TE_OK(te_activation_backward(ctx_, act, x.get(), ones.get(), dx.get()));
    for (int64_t i = 0; i < x.numel(); ++i) {
      double fd = (yp.at(i) - ym.at(i)) / (xp.at(i) - xm.at(i));
      EXPECT_NEAR(dx.at(i), fd, 2e-4 * (1 + std::fabs(x.at(i)))) << "x = " << x.at(i) << " act " << act;
    }
  }
}

// A gated activation over x = [a | b] (gate rows first): y = gate(a) * b and its gradient against
// fp64, then against finite differences of the library's own forward.
void check_gated(te_context *ctx, te_activation act, double (*gate)(double), double (*gate_grad)(double)) {
  const int64_t T = 3, H = 24;  // x [T, 2H] -> y [T, H]
  for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    HostTensor x = random_tensor(dt, {T, 2 * H}, -4, 4, 53), dy = random_tensor(dt, {T, H}, -2, 2, 54);
    HostTensor y = make_tensor(dt, {T, H}), dx = make_tensor(dt, {T, 2 * H});
    ASSERT_TE_OK(te_activation_forward(ctx, act, x.get(), y.get()));
    ASSERT_TE_OK(te_activation_backward(ctx, act, x.get(), dy.get(), dx.get()));
    int bad = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H; ++j) {
        double a = x.at(t * 2 * H + j), b = x.at(t * 2 * H + H + j), g = dy.at(t * H + j);
        double want = gate(a) * b;
        if (!(std::fabs(y.at(t * H + j) - want) <= act_tol(std::fabs(a * b), want, dt)) && bad++ < 5)
          ADD_FAILURE() << "y(" << t << "," << j << ") = " << y.at(t * H + j) << " want " << want;
        double da = g * gate_grad(a) * b, db = g * gate(a);
        double ta = act_tol(4 * std::fabs(a * b * g), da, dt) + 1e-6, tb = act_tol(4 * std::fabs(a * g), db, dt) + 1e-6;
        if (!(std::fabs(dx.at(t * 2 * H + j) - da) <= ta) && bad++ < 5)
          ADD_FAILURE() << "dx_a(" << t << "," << j << ") = " << dx.at(t * 2 * H + j) << " want " << da;
        if (!(std::fabs(dx.at(t * 2 * H + H + j) - db) <= tb) && bad++ < 5)
          ADD_FAILURE() << "dx_b(" << t << "," << j << ") = " << dx.at(t * 2 * H + H + j) << " want " << db;
      }
    EXPECT_EQ(bad, 0);
  }
  // Finite differences of the library's forward: perturb all gate (a) inputs, then all
  // up (b) inputs; each output depends on one of each, so L = sum(y) separates per element.
  const float h = 1e-2f;
  HostTensor x = random_tensor(TE_DTYPE_F32, {T, 2 * H}, -4, 4, 55);
  HostTensor ones = make_tensor(TE_DTYPE_F32, {T, H}, std::vector<float>(static_cast<size_t>(T * H), 1.0f));
  HostTensor dx = make_tensor(TE_DTYPE_F32, {T, 2 * H});
  ASSERT_TE_OK(te_activation_backward(ctx, act, x.get(), ones.get(), dx.get()));
  for (int half = 0; half < 2; ++half) {
    HostTensor xp = x.clone(), xm = x.clone();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H; ++j) {
        int64_t i = t * 2 * H + half * H + j;
        xp.set(i, static_cast<float>(x.at(i)) + h);
        xm.set(i, static_cast<float>(x.at(i)) - h);
      }
    HostTensor yp = make_tensor(TE_DTYPE_F32, {T, H}), ym = make_tensor(TE_DTYPE_F32, {T, H});
    ASSERT_TE_OK(te_activation_forward(ctx, act, xp.get(), yp.get()));
    ASSERT_TE_OK(te_activation_forward(ctx, act, xm.get(), ym.get()));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H; ++j) {
        int64_t i = t * 2 * H + half * H + j;
        double fd = (yp.at(t * H + j) - ym.at(t * H + j)) / (xp.at(i) - xm.at(i));
        EXPECT_NEAR(dx.at(i), fd, 5e-4 * (1 + std::fabs(x.at(t * 2 * H + H + j)))) << (half ? "up " : "gate ") << t << "," << j;
      }
  }
}

TEST_F(Primitives, SwiGLU) { check_gated(ctx_, TE_ACTIVATION_SWIGLU, silu_ref, silu_grad_ref); }
TEST_F(Primitives, GEGLU) { check_gated(ctx_, TE_ACTIVATION_GEGLU, gelu_ref, gelu_grad_ref); }

// GEGLU has SwiGLU's shape rule (an even last dimension, halved in y and dy); SReLU keeps x's.
TEST_F(Primitives, GatedShapeRule) {
  const char *ff = "te_activation_forward", *fb = "te_activation_backward";
  HostTensor x = random_tensor(TE_DTYPE_F32, {4, 32}, -1, 1, 56), x_odd = random_tensor(TE_DTYPE_F32, {4, 31}, -1, 1, 57);
  HostTensor y_full = make_tensor(TE_DTYPE_F32, {4, 32}), y_half = make_tensor(TE_DTYPE_F32, {4, 16});
  HostTensor y_odd = make_tensor(TE_DTYPE_F32, {4, 15}), dx = make_tensor(TE_DTYPE_F32, {4, 32});
  HostTensor dy_half = random_tensor(TE_DTYPE_F32, {4, 16}, -1, 1, 58), dy_full = random_tensor(TE_DTYPE_F32, {4, 32}, -1, 1, 59);
  const te_activation G = TE_ACTIVATION_GEGLU, S = TE_ACTIVATION_SRELU;
  EXPECT_TE_OK(te_activation_forward(ctx_, G, x.get(), y_half.get()));
  EXPECT_TE_OK(te_activation_backward(ctx_, G, x.get(), dy_half.get(), dx.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "y", te_activation_forward(ctx_, G, x.get(), y_full.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "x", te_activation_forward(ctx_, G, x_odd.get(), y_odd.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fb, "dy", te_activation_backward(ctx_, G, x.get(), dy_full.get(), dx.get()));
  EXPECT_TE_OK(te_activation_forward(ctx_, S, x.get(), y_full.get()));
  EXPECT_TE_OK(te_activation_backward(ctx_, S, x.get(), dy_full.get(), dx.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "y", te_activation_forward(ctx_, S, x.get(), y_half.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, ff, "act",
                 te_activation_forward(ctx_, static_cast<te_activation>(TE_ACTIVATION_SRELU + 1), x.get(), y_full.get()));
}

// ---- DLPack import ---------------------------------------------------------------------------------
using namespace dlpack;  // the ABI written out from the spec (dlpack_abi.h)

int g_deleter_calls = 0;
void count_deleter(DLManagedTensor *) { ++g_deleter_calls; }
void count_deleter_v(DLManagedTensorVersioned *) { ++g_deleter_calls; }

struct DLFixture {
  alignas(64) unsigned char buf[4096] = {};
  int64_t shape[16] = {4, 5};
  int64_t strides[16] = {5, 1};
  DLManagedTensor m{};
  DLFixture(uint8_t code, uint8_t bits, int32_t ndim = 2) {
    m.dl_tensor.data = buf;
    m.dl_tensor.device = {kDLCPU, 0};
    m.dl_tensor.ndim = ndim;
    m.dl_tensor.dtype = {code, bits, 1};
    m.dl_tensor.shape = shape;
    m.dl_tensor.strides = nullptr;
    m.dl_tensor.byte_offset = 0;
    m.manager_ctx = nullptr;
    m.deleter = count_deleter;
  }
};

te_tensor sentinel_tensor() {
  te_tensor t;
  std::memset(&t, 0x6C, sizeof t);
  return t;
}

TEST(DLPack, ImportsFloatTypes) {
  g_deleter_calls = 0;
  struct Case { uint8_t code, bits; te_dtype want; };
  for (Case c : {Case{kDLFloat, 32, TE_DTYPE_F32}, Case{kDLFloat, 16, TE_DTYPE_F16}, Case{kDLBfloat, 16, TE_DTYPE_BF16}}) {
    DLFixture f(c.code, c.bits);
    te_tensor t = sentinel_tensor();
    ASSERT_TE_OK(te_tensor_from_dlpack(&t, &f.m, 0, TE_DTYPE_E4M3));
    EXPECT_EQ(t.dtype, c.want);
    EXPECT_EQ(t.data, static_cast<void *>(f.buf));
    EXPECT_EQ(t.ndim, 2);
    EXPECT_EQ(t.shape[0], 4);
    EXPECT_EQ(t.shape[1], 5);
    EXPECT_EQ(t.device.type, TE_DEVICE_CPU);
    EXPECT_EQ(t.device.index, 0);
    EXPECT_EQ(te_tensor_numel(&t), 20);
    // Explicit row-major strides are contiguous too.
    f.m.dl_tensor.strides = f.strides;
    te_tensor t2 = sentinel_tensor();
    ASSERT_TE_OK(te_tensor_from_dlpack(&t2, &f.m, 0, TE_DTYPE_E4M3));
    EXPECT_EQ(t2.dtype, c.want);
    EXPECT_EQ(t2.shape[1], 5);
  }
  EXPECT_EQ(g_deleter_calls, 0) << "ownership stays with the producer";
}

TEST(DLPack, Uint8AsFp8) {
  for (te_dtype fp8 : {TE_DTYPE_E4M3, TE_DTYPE_E5M2}) {
    DLFixture f(kDLUInt, 8);
    te_tensor t = sentinel_tensor();
    ASSERT_TE_OK(te_tensor_from_dlpack(&t, &f.m, 0, fp8));
    EXPECT_EQ(t.dtype, fp8);
    EXPECT_EQ(t.data, static_cast<void *>(f.buf));
    EXPECT_EQ(t.shape[0], 4);
    EXPECT_EQ(t.scaling, TE_SCALING_PER_TENSOR);
  }
  DLFixture f(kDLUInt, 8);
  for (int bad : {int(TE_DTYPE_F32), int(TE_DTYPE_BF16), 9}) {
    te_tensor t = sentinel_tensor(), before = t;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_tensor_from_dlpack", "fp8_dtype",
                   te_tensor_from_dlpack(&t, &f.m, 0, static_cast<te_dtype>(bad)));
    EXPECT_EQ(std::memcmp(&t, &before, sizeof t), 0);
  }
}

TEST(DLPack, DevicesAndOffsets) {
  DLFixture f(kDLFloat, 32);
  f.m.dl_tensor.device = {kDLCUDA, 3};
  te_tensor t = sentinel_tensor();
  ASSERT_TE_OK(te_tensor_from_dlpack(&t, &f.m, 0, TE_DTYPE_E4M3));
  EXPECT_EQ(t.device.type, TE_DEVICE_CUDA);
  EXPECT_EQ(t.device.index, 3);
  f.m.dl_tensor.device = {kDLCUDAHost, 0};  // pinned host memory is accepted
  ASSERT_TE_OK(te_tensor_from_dlpack(&t, &f.m, 0, TE_DTYPE_E4M3));
  f.m.dl_tensor.device = {kDLCPU, 0};
  f.m.dl_tensor.byte_offset = 16;
  ASSERT_TE_OK(te_tensor_from_dlpack(&t, &f.m, 0, TE_DTYPE_E4M3));
  EXPECT_EQ(t.data, static_cast<void *>(f.buf + 16));
}

TEST(DLPack, Versioned) {
  alignas(64) unsigned char buf[256] = {};
  int64_t shape[3] = {2, 3, 4};
  DLManagedTensorVersioned v{};
  v.version = {1, 0};
  v.deleter = count_deleter_v;
  v.dl_tensor.data = buf;
  v.dl_tensor.device = {kDLCPU, 0};
  v.dl_tensor.ndim = 3;
  v.dl_tensor.dtype = {kDLBfloat, 16, 1};
  v.dl_tensor.shape = shape;
  te_tensor t = sentinel_tensor();
  g_deleter_calls = 0;
  ASSERT_TE_OK(te_tensor_from_dlpack(&t, &v, 1, TE_DTYPE_E4M3));
  EXPECT_EQ(t.dtype, TE_DTYPE_BF16);
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.shape[2], 4);
  EXPECT_EQ(t.data, static_cast<void *>(buf));
  EXPECT_EQ(g_deleter_calls, 0);
}

TEST(DLPack, Int32IsI32) {
  DLFixture f(kDLInt, 32);
  te_tensor t = sentinel_tensor();
  ASSERT_TE_OK(te_tensor_from_dlpack(&t, &f.m, 0, TE_DTYPE_E4M3));
  EXPECT_EQ(t.dtype, TE_DTYPE_I32);
}

TEST(DLPack, Rejections) {
  struct Case { const char *what; const char *arg; std::function<void(DLFixture &)> apply; };
  std::vector<Case> cases = {
      {"column-major strides", nullptr, [](DLFixture &f) { f.strides[0] = 1; f.strides[1] = 4; f.m.dl_tensor.strides = f.strides; }},
      {"padded rows", nullptr, [](DLFixture &f) { f.strides[0] = 8; f.strides[1] = 1; f.m.dl_tensor.strides = f.strides; }},
      {"ndim 9", nullptr, [](DLFixture &f) {
         f.m.dl_tensor.ndim = 9;
         for (int i = 0; i < 9; ++i) f.shape[i] = 1;
       }},
      {"ndim -1", nullptr, [](DLFixture &f) { f.m.dl_tensor.ndim = -1; }},
      {"int64", nullptr, [](DLFixture &f) { f.m.dl_tensor.dtype = {kDLInt, 64, 1}; }},
      {"uint32", nullptr, [](DLFixture &f) { f.m.dl_tensor.dtype = {kDLUInt, 32, 1}; }},
      {"float64", nullptr, [](DLFixture &f) { f.m.dl_tensor.dtype = {kDLFloat, 64, 1}; }},
      {"2 lanes", nullptr, [](DLFixture &f) { f.m.dl_tensor.dtype.lanes = 2; }},
      {"bfloat32", nullptr, [](DLFixture &f) { f.m.dl_tensor.dtype = {kDLBfloat, 32, 1}; }},
      {"vulkan device", nullptr, [](DLFixture &f) { f.m.dl_tensor.device = {kDLVulkan, 0}; }},
      {"misaligned offset", nullptr, [](DLFixture &f) { f.m.dl_tensor.byte_offset = 2; }},
      {"negative dim", nullptr, [](DLFixture &f) { f.shape[1] = -5; }},
  };
  for (Case &c : cases) {
    SCOPED_TRACE(c.what);
    DLFixture f(kDLFloat, 32);
    c.apply(f);
    te_tensor t = sentinel_tensor(), before = t;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_tensor_from_dlpack", c.arg, te_tensor_from_dlpack(&t, &f.m, 0, TE_DTYPE_E4M3));
    EXPECT_EQ(std::memcmp(&t, &before, sizeof t), 0);
  }
  DLFixture f(kDLFloat, 32);
  te_tensor t = sentinel_tensor();
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_tensor_from_dlpack", "out", te_tensor_from_dlpack(nullptr, &f.m, 0, TE_DTYPE_E4M3));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_tensor_from_dlpack", "dl_managed_tensor",
                 te_tensor_from_dlpack(&t, nullptr, 0, TE_DTYPE_E4M3));
}

}  // namespace
