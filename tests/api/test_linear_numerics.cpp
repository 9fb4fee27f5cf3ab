// te_linear numerics: forward (fprop), dgrad, wgrad and dbias against an fp64 reference computed
// on the DEQUANTIZED operands, for delayed, current and block scaling and for high precision,
// with and without bias, F32 and BF16 activations.
//
// The FP8 operands of the reference are the library's own residuals (x^T and W^T, dequantized
// here from codes * scale_inv) — which are themselves checked code by code against an
// independent quantizer (linear_test_util.h) — plus the quantizations the library does not
// expose (dy, and x row-wise under block scaling), done by that same independent quantizer with
// the scale the contract prescribes.
//
// Tolerance (fp32_gemm_tol): the library accumulates k products in fp32, so
// |err| <= ~k * 2^-24 * sum|a||b| (recursive summation bound; exact products of FP8 codes), plus a
// few ulps for the scale_inv multiplications and the bias add, plus the output rounding: 2^-8
// relative for BF16, 2^-24 for F32. A transposed operand, a wrong scale or a wrong block layout
// produces errors many orders of magnitude above this bound.
#include "linear_test_util.h"

#include <tuple>

namespace lt = te_test;

namespace {

// The recipe variants: TE's defaults for each kind, plus current scaling with power-of-2
// scales and an amax epsilon above amax(W) and amax(dy) (so both clamp), and block scaling with
// plain fp32 (not power-of-2) block scales.
enum RecipeChoice {
  kHighPrecision = -1,
  kDelayed = 0,
  kCurrent = 1,
  kBlock = 2,
  kCurrentPow2Eps = 3,
  kBlockFp32Scales = 4
};

const char *recipe_name(int r) {
  switch (r) {
    case kHighPrecision: return "HighPrecision";
    case kDelayed: return "Delayed";
    case kCurrent: return "Current";
    case kBlock: return "Block";
    case kCurrentPow2Eps: return "CurrentPow2Eps";
    case kBlockFp32Scales: return "BlockFp32Scales";
  }
  return "?";
}

int kind_of(int choice) {
  if (choice == kCurrentPow2Eps) return kCurrent;
  if (choice == kBlockFp32Scales) return kBlock;
  return choice;
}

lt::RecipePtr make_variant(int choice) {
  te_recipe_options o;
  te_recipe_options_init(&o, static_cast<te_recipe_kind>(kind_of(choice)));
  if (choice == kCurrentPow2Eps) {
    o.power_of_2_scales = 1;
    o.amax_epsilon = 0.7f;
  }
  if (choice == kBlockFp32Scales) o.power_of_2_scales = 0;
  te_recipe *r = nullptr;
  EXPECT_EQ(te_recipe_create(&r, &o), TE_SUCCESS) << te_last_error();
  return lt::RecipePtr(r);
}

using Param = std::tuple<int, int, te_dtype>;  // recipe, bias, activation dtype

class LinearNumerics : public ::testing::TestWithParam<Param> {};

float amax_of(const std::vector<float> &v) {
  float a = 0.0f;
  for (float x : v) a = std::max(a, std::fabs(x));
  return a;
}

// y [m, n] values plus bias[n] (bias added after the GEMM, in the bound too).
void add_bias(lt::RefResult &r, const std::vector<float> &b, int64_t m, int64_t n) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      r.value[i * n + j] += b[j];
      r.abs_sum[i * n + j] += std::fabs(b[j]);
    }
}

lt::RefResult column_sums(const std::vector<float> &dy, int64_t m, int64_t n) {
  lt::RefResult r;
  r.k = m;
  r.value.assign(static_cast<size_t>(n), 0.0);
  r.abs_sum.assign(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      r.value[j] += dy[i * n + j];
      r.abs_sum[j] += std::fabs(dy[i * n + j]);
    }
  return r;
}

TEST_P(LinearNumerics, ForwardBackwardMatchFp64ReferenceOnDequantizedOperands) {
  const int recipe_kind = kind_of(std::get<0>(GetParam()));
  const int has_bias = std::get<1>(GetParam());
  const te_dtype act = std::get<2>(GetParam());
  const bool fp8 = recipe_kind != kHighPrecision;
  const bool block = recipe_kind == kBlock;

  // Block scaling gets dims above 128 so that there are several 1x128 blocks per row and a 2x2
  // grid of 128x128 weight tiles (with partial last blocks); per-tensor recipes use small dims.
  const int64_t B = 2, S = block ? 72 : 16;
  const int64_t tokens = B * S, in = block ? 160 : 64, out = block ? 176 : 48;

  lt::ContextPtr ctx = lt::make_cpu_context();
  ASSERT_TRUE(ctx);
  lt::LinearPtr lin = lt::make_linear(ctx.get(), in, out, has_bias, act);
  ASSERT_TRUE(lin);
  lt::RecipePtr recipe;
  te_recipe_options ropts{};
  ropts.struct_size = sizeof(ropts);
  if (fp8) {
    recipe = make_variant(std::get<0>(GetParam()));
    ASSERT_TRUE(recipe);
    ASSERT_EQ(te_recipe_get_options(recipe.get(), &ropts), TE_SUCCESS) << te_last_error();
  }
  const bool pow2 = ropts.power_of_2_scales != 0;
  const float eps = ropts.amax_epsilon;
  const te_dtype bwd_dt = ropts.format == TE_FORMAT_HYBRID ? TE_DTYPE_E5M2 : TE_DTYPE_E4M3;

  lt::HostTensor x = lt::random_tensor(act, {B, S, in}, -2.0f, 2.0f, 11, block);
  lt::HostTensor w = lt::random_tensor(act, {out, in}, -0.5f, 0.5f, 12, block);
  lt::HostTensor b = lt::random_tensor(act, {out}, -1.0f, 1.0f, 13);
  lt::HostTensor dy = lt::random_tensor(act, {B, S, out}, -0.05f, 0.05f, 14, block);
  const std::vector<float> xv = x.values_f32(), wv = w.values_f32(), bv = b.values_f32(), dyv = dy.values_f32();

  te_linear_forward_args fa;
  ASSERT_EQ(te_linear_forward_args_init(&fa), TE_SUCCESS);
  fa.input = x.get();
  fa.weight = w.get();
  fa.bias = has_bias ? b.get() : nullptr;

  // Warm-up pass: under delayed scaling it turns every scale from 1.0 into fp8_max/amax, so the
  // checked pass runs with non-trivial (non power of 2) scales.
  if (fp8) {
    lt::HostTensor y0(act, {B, S, out}), dx0(act, {B, S, in}), dw0(act, {out, in}), db0(act, {out});
    te_linear_backward_ctx *bwd0 = nullptr;
    {
      lt::AutocastScope scope(ctx.get(), recipe.get());
      ASSERT_EQ(te_linear_forward(ctx.get(), lin.get(), &fa, y0.get(), &bwd0), TE_SUCCESS)
          << te_last_error();
    }
    lt::BackwardPtr hold(bwd0);
    ASSERT_EQ(te_linear_backward(ctx.get(), bwd0, dy.get(), dx0.get(), dw0.get(),
                                 has_bias ? db0.get() : nullptr, nullptr),
              TE_SUCCESS)
        << te_last_error();
  }

  const lt::ScalingSnapshot in_state = lt::live_scaling_state(ctx.get(), lin.get(), TE_ROLE_INPUT);
  const lt::ScalingSnapshot w_state = lt::live_scaling_state(ctx.get(), lin.get(), TE_ROLE_WEIGHT);
  if (recipe_kind == kDelayed) {
    // After one pass every scale is fp8_max / amax (history holds that one amax).
    EXPECT_EQ(in_state.info.scale, 448.0f / amax_of(xv));
    EXPECT_EQ(w_state.info.scale, 448.0f / amax_of(wv));
  }

  // ---- the checked pass ----
  lt::HostTensor y(act, {B, S, out});
  y.fill_byte(0xA5);
  te_linear_residuals res{};
  res.struct_size = sizeof(res);
  te_linear_backward_ctx *bwd_raw = nullptr;
  lt::HostTensor got_xt, got_wt;
  {
    std::unique_ptr<lt::AutocastScope> scope;
    if (fp8) scope.reset(new lt::AutocastScope(ctx.get(), recipe.get()));
    ASSERT_EQ(te_linear_forward_compute(ctx.get(), lin.get(), &fa, y.get(), &res), TE_SUCCESS)
        << te_last_error();
    ASSERT_EQ(res.fp8, fp8 ? 1 : 0);
    if (fp8) {
      ASSERT_EQ(res.input_t.dtype, TE_DTYPE_E4M3);
      ASSERT_EQ(res.input_t.ndim, 2);
      ASSERT_EQ(res.input_t.shape[0], in);
      ASSERT_EQ(res.input_t.shape[1], tokens);
      ASSERT_EQ(res.input_t.scaling, block ? TE_SCALING_BLOCK_1X128 : TE_SCALING_PER_TENSOR);
      ASSERT_NE(res.input_t.scale_inv, nullptr);
      ASSERT_EQ(res.weight_t.dtype, TE_DTYPE_E4M3);
      ASSERT_EQ(res.weight_t.ndim, 2);
      ASSERT_EQ(res.weight_t.shape[0], in);
      ASSERT_EQ(res.weight_t.shape[1], out);
      ASSERT_EQ(res.weight_t.scaling, block ? TE_SCALING_BLOCK_128X128 : TE_SCALING_PER_TENSOR);
      ASSERT_NE(res.weight_t.scale_inv, nullptr);
      EXPECT_NE(res.input_t.data, x.bytes.data());
      got_xt = lt::copy_tensor(res.input_t);
      got_wt = lt::copy_tensor(res.weight_t);
    } else {
      // High precision: the caller's x and W are referenced, not copied.
      EXPECT_EQ(res.input_t.data, static_cast<void *>(x.bytes.data()));
      EXPECT_EQ(res.weight_t.data, static_cast<void *>(w.bytes.data()));
      EXPECT_EQ(res.input_t.dtype, act);
      EXPECT_EQ(res.weight_t.dtype, act);
    }
    ASSERT_EQ(te_linear_forward_save(ctx.get(), lin.get(), &res, &bwd_raw), TE_SUCCESS)
        << te_last_error();
  }
  lt::BackwardPtr bwd(bwd_raw);
  EXPECT_EQ(res.internal, nullptr) << "forward_save must take ownership";

  const lt::ScalingSnapshot go_state = lt::live_scaling_state(ctx.get(), lin.get(), TE_ROLE_GRAD_OUTPUT);
  lt::HostTensor dx(act, {B, S, in}), dw(act, {out, in}), db(act, {out});
  ASSERT_EQ(te_linear_backward(ctx.get(), bwd.get(), dy.get(), dx.get(), dw.get(),
                               has_bias ? db.get() : nullptr, nullptr),
            TE_SUCCESS)
      << te_last_error();

  // ---- references ----
  const std::vector<float> xT = lt::transpose(xv, tokens, in);    // [in, tokens]
  const std::vector<float> wT = lt::transpose(wv, out, in);       // [in, out]
  const std::vector<float> dyT = lt::transpose(dyv, tokens, out); // [out, tokens]
  // High-precision references (exact fp64 on the unquantized values).
  lt::RefResult y_hp = lt::ref_gemm_nt(lt::to_double(xv), lt::to_double(wv), tokens, out, in);
  if (has_bias) add_bias(y_hp, bv, tokens, out);
  const lt::RefResult dx_hp = lt::ref_gemm_nt(lt::to_double(dyv), lt::to_double(wT), tokens, in, out);
  const lt::RefResult dw_hp = lt::ref_gemm_nt(lt::to_double(dyT), lt::to_double(xT), out, in, tokens);
  const lt::RefResult db_ref = column_sums(dyv, tokens, out);

  if (!fp8) {
    EXPECT_TRUE(lt::CloseToRef(y, y_hp, "y"));
    EXPECT_TRUE(lt::CloseToRef(dx, dx_hp, "dx"));
    EXPECT_TRUE(lt::CloseToRef(dw, dw_hp, "dw"));
    if (has_bias) {
      EXPECT_TRUE(lt::CloseToRef(db, db_ref, "db"));
    }
    return;
  }

  // 1. The residuals are exactly the contract's quantizations.
  const te_scaling_mode act_mode = block ? TE_SCALING_BLOCK_1X128 : TE_SCALING_PER_TENSOR;
  const te_scaling_mode w_mode = block ? TE_SCALING_BLOCK_128X128 : TE_SCALING_PER_TENSOR;
  float x_scale = 1.0f, w_scale = 1.0f;
  if (recipe_kind == kDelayed) {
    x_scale = in_state.info.scale;
    w_scale = w_state.info.scale;
  } else if (recipe_kind == kCurrent) {
    x_scale = lt::scale_from_amax(amax_of(xv), 448.0f, pow2, eps);
    w_scale = lt::scale_from_amax(amax_of(wv), 448.0f, pow2, eps);
  }
  const lt::HostTensor want_xt =
      lt::quantize_ref(xT, in, tokens, TE_DTYPE_E4M3, act_mode, x_scale, pow2, eps);
  const lt::HostTensor want_wt =
      lt::quantize_ref(wT, in, out, TE_DTYPE_E4M3, w_mode, w_scale, pow2, eps);
  EXPECT_TRUE(lt::SameQuantization(got_xt, want_xt)) << "residuals.input_t (FP8 x^T)";
  EXPECT_TRUE(lt::SameQuantization(got_wt, want_wt)) << "residuals.weight_t (FP8 W^T)";

  // 2. fprop on the dequantized operands. Block scaling quantizes x row-wise (1x128 along in)
  // for fprop, which the residuals (blocks along tokens) do not hold: use the oracle's.
  std::vector<double> x_op;  // [tokens, in]
  if (block) {
    x_op = lt::dequantize_ref(lt::quantize_ref(xv, tokens, in, TE_DTYPE_E4M3, act_mode, 1.0f, pow2, eps));
  } else {
    const std::vector<double> xt_deq = lt::dequantize_ref(got_xt);
    x_op.resize(xt_deq.size());
    for (int64_t i = 0; i < in; ++i)
      for (int64_t t = 0; t < tokens; ++t) x_op[t * in + i] = xt_deq[i * tokens + t];
  }
  const std::vector<double> wt_deq = lt::dequantize_ref(got_wt);  // [in, out]
  std::vector<double> w_op(wt_deq.size());                  // [out, in]
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o) w_op[o * in + i] = wt_deq[i * out + o];
  lt::RefResult y_ref = lt::ref_gemm_nt(x_op, w_op, tokens, out, in);
  if (has_bias) add_bias(y_ref, bv, tokens, out);
  EXPECT_TRUE(lt::CloseToRef(y, y_ref, "y (fprop)"));

  // 3. dy quantized with the prescribed scale: delayed = the GRAD_OUTPUT state's scale before
  // this backward; current = fp8_max / amax(dy); block = per 1x128 block, rowwise for dgrad and
  // along tokens (dy^T) for wgrad.
  float dy_scale = 1.0f;
  if (recipe_kind == kDelayed) dy_scale = go_state.info.scale;
  if (recipe_kind == kCurrent) dy_scale = lt::scale_from_amax(amax_of(dyv), lt::fp8_max(bwd_dt), pow2, eps);
  const lt::HostTensor dy_q = lt::quantize_ref(dyv, tokens, out, bwd_dt, act_mode, dy_scale, pow2, eps);
  const lt::HostTensor dyT_q = block ? lt::quantize_ref(dyT, out, tokens, bwd_dt, act_mode, 1.0f, pow2, eps)
                                  : lt::quantize_ref(dyT, out, tokens, bwd_dt, act_mode, dy_scale, pow2, eps);
  {
    // Diagnostic cross-check of the oracle against the library's own quantizer for dy: if this
    // fails, the oracle and te_quantize disagree (the linear checks below then point to it).
    lt::HostTensor q(bwd_dt, {tokens, out});
    std::vector<float> sinv(static_cast<size_t>(lt::scale_inv_count_ref(tokens, out, act_mode)));
    te_tensor *qt = q.get();
    qt->scale_inv = sinv.data();
    qt->scaling = act_mode;
    te_quantize_options qo;
    te_quantize_options_init(&qo);
    qo.scale = block ? nullptr : &dy_scale;
    qo.power_of_2_scales = pow2;
    qo.amax_epsilon = eps;
    lt::HostTensor dy2 = dy;
    dy2.reshape({tokens, out});
    te_status st = te_quantize(ctx.get(), dy2.get(), qt, &qo);
    if (st == TE_SUCCESS) {
      lt::HostTensor lib = lt::copy_tensor(*qt);
      EXPECT_TRUE(lt::SameQuantization(lib, dy_q)) << "te_quantize(dy) vs the test's oracle";
    } else {
      ADD_FAILURE() << "te_quantize(dy) failed: " << te_last_error();
    }
  }
  const lt::RefResult dx_ref = lt::ref_gemm_nt(lt::dequantize_ref(dy_q), wt_deq, tokens, in, out);
  const lt::RefResult dw_ref = lt::ref_gemm_nt(lt::dequantize_ref(dyT_q), lt::dequantize_ref(got_xt), out, in, tokens);
  EXPECT_TRUE(lt::CloseToRef(dx, dx_ref, "dx (dgrad)"));
  EXPECT_TRUE(lt::CloseToRef(dw, dw_ref, "dw (wgrad)"));
  if (has_bias) {
    EXPECT_TRUE(lt::CloseToRef(db, db_ref, "db (sum of the unquantized dy)"));
  }

  // 4. Quantization is sane: FP8 results are near the exact high-precision ones. E4M3 rounds
  // with relative error <= 2^-4 and E5M2 <= 2^-3 per operand; with random signs the normwise
  // error is a few percent. A 10% (fprop) / 20% (backward, E5M2 dy) bound still catches scales
  // off by a factor or a wrong operand.
  EXPECT_LT(lt::rel_norm_error(y, y_hp.value), 0.10) << "fprop FP8 vs high precision";
  EXPECT_LT(lt::rel_norm_error(dx, dx_hp.value), 0.20) << "dgrad FP8 vs high precision";
  EXPECT_LT(lt::rel_norm_error(dw, dw_hp.value), 0.20) << "wgrad FP8 vs high precision";
}

INSTANTIATE_TEST_SUITE_P(
    AllRecipes, LinearNumerics,
    ::testing::Combine(::testing::Values(kHighPrecision, kDelayed, kCurrent, kBlock, kCurrentPow2Eps,
                                         kBlockFp32Scales),
                       ::testing::Values(0, 1), ::testing::Values(TE_DTYPE_F32, TE_DTYPE_BF16)),
    [](const ::testing::TestParamInfo<Param> &info) {
      return std::string(recipe_name(std::get<0>(info.param))) +
             (std::get<1>(info.param) ? "_Bias_" : "_NoBias_") +
             lt::dtype_name(std::get<2>(info.param));
    });

// 2-D input (no leading batch dims) and E4M3-everywhere delayed scaling: dy is quantized to
// E4M3, not E5M2, and the GRAD_OUTPUT state reports E4M3.
TEST(LinearNumericsExtra, E4M3FormatQuantizesGradOutputToE4M3) {
  const int64_t tokens = 32, in = 48, out = 32;
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::LinearPtr lin = lt::make_linear(ctx.get(), in, out, 1, TE_DTYPE_F32);
  te_recipe_options o;
  te_recipe_options_init(&o, TE_RECIPE_CURRENT_SCALING);
  o.format = TE_FORMAT_E4M3;
  te_recipe *r = nullptr;
  ASSERT_EQ(te_recipe_create(&r, &o), TE_SUCCESS) << te_last_error();
  lt::RecipePtr recipe(r);

  lt::HostTensor x = lt::random_tensor(TE_DTYPE_F32, {tokens, in}, -1.0f, 1.0f, 21);
  lt::HostTensor w = lt::random_tensor(TE_DTYPE_F32, {out, in}, -1.0f, 1.0f, 22);
  lt::HostTensor b = lt::random_tensor(TE_DTYPE_F32, {out}, -1.0f, 1.0f, 23);
  lt::HostTensor dy = lt::random_tensor(TE_DTYPE_F32, {tokens, out}, -1.0f, 1.0f, 24);
  te_linear_forward_args fa;
  te_linear_forward_args_init(&fa);
  fa.input = x.get();
  fa.weight = w.get();
  fa.bias = b.get();
  lt::HostTensor y(TE_DTYPE_F32, {tokens, out});
  te_linear_residuals res{};
  res.struct_size = sizeof(res);
  te_linear_backward_ctx *raw = nullptr;
  {
    lt::AutocastScope scope(ctx.get(), recipe.get());
    ASSERT_EQ(te_linear_forward_compute(ctx.get(), lin.get(), &fa, y.get(), &res), TE_SUCCESS)
        << te_last_error();
    ASSERT_EQ(res.fp8, 1);
    ASSERT_EQ(res.weight_t.dtype, TE_DTYPE_E4M3);
    ASSERT_EQ(res.weight_t.scaling, TE_SCALING_PER_TENSOR);
  }
  const lt::HostTensor wt = lt::copy_tensor(res.weight_t);
  ASSERT_EQ(te_linear_forward_save(ctx.get(), lin.get(), &res, &raw), TE_SUCCESS) << te_last_error();
  lt::BackwardPtr bwd(raw);
  lt::HostTensor dx(TE_DTYPE_F32, {tokens, in});
  ASSERT_EQ(te_linear_backward(ctx.get(), bwd.get(), dy.get(), dx.get(), nullptr, nullptr, nullptr),
            TE_SUCCESS)
      << te_last_error();
  const std::vector<float> dyv = dy.values_f32();
  float a = 0;
  for (float v : dyv) a = std::max(a, std::fabs(v));
  const float s = lt::scale_from_amax(a, 448.0f, false, 0.0f);
  const lt::HostTensor dyq =
      lt::quantize_ref(dyv, tokens, out, TE_DTYPE_E4M3, TE_SCALING_PER_TENSOR, s, false, 0.0f);
  EXPECT_TRUE(lt::CloseToRef(dx, lt::ref_gemm_nt(lt::dequantize_ref(dyq), lt::dequantize_ref(wt), tokens, in, out),
                             "dx with E4M3 dy"));
}

}  // namespace
