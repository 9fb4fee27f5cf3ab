// te_grouped_linear (TE's GroupedLinear for mixture of experts) through the public API.
//
// Oracles, each able to fail on its own:
//  - an fp64 reference on the DEQUANTIZED operands, quantized here by the test's own quantizer
//    (api_test_util.h, itself checked code by code against te_quantize in the linear tests) with
//    the scale the contract prescribes: delayed = the expert's state before the pass, current =
//    fp8_max / amax of the expert's own rows, block = per block. Tolerance fp32_gemm_tol
//    (linear_test_util.h): fp32 accumulation of k exact FP8 products, ~k * 2^-24 * sum|a||b|,
//    plus the output rounding (2^-8 relative for BF16). The zero rows the library pads an expert
//    with add exact zeros, so the bound of the expert's own k = m_i holds. A wrong expert
//    offset, a wrong scale, a transposed operand or padding that leaks into the results is many
//    orders of magnitude above it;
//  - N separate te_linear layers given each expert's rows, zero-padded to a multiple of 16 under
//    FP8 (te_linear needs that): the results must be bitwise equal, over several steps, for every
//    recipe, as must every scaling state - zero rows change no amax, and the per-expert GEMMs are
//    the same GEMMs;
//  - the contract's own statements: empty experts get dW = 0 / db = 0 and leave their scaling
//    states out of the pass, one bucket update per pass, repeated backward identical, main_grad
//    accumulation, bit-exact state round trips, and every bad argument refused with nothing
//    changed.
#include "linear_test_util.h"

#include <functional>
#include <numeric>

namespace lt = te_test;

namespace {

using lt::HostTensor;

struct GroupedDeleter {
  void operator()(te_grouped_linear *g) const { te_grouped_linear_destroy(g); }
};
struct GroupedBwdDeleter {
  void operator()(te_grouped_linear_backward_ctx *b) const { te_grouped_linear_backward_ctx_destroy(b); }
};
using GroupedPtr = std::unique_ptr<te_grouped_linear, GroupedDeleter>;
using GroupedBwdPtr = std::unique_ptr<te_grouped_linear_backward_ctx, GroupedBwdDeleter>;

te_grouped_linear_options grouped_options(int n, int64_t in, int64_t out, int bias, te_dtype dt, int fuse = 0) {
  te_grouped_linear_options o;
  std::memset(&o, 0, sizeof o);
  EXPECT_EQ(te_grouped_linear_options_init(&o), TE_SUCCESS);
  o.num_gemms = n;
  o.in_features = in;
  o.out_features = out;
  o.bias = bias;
  o.activation_dtype = dt;
  o.fuse_wgrad_accumulation = fuse;
  return o;
}

GroupedPtr make_grouped(te_context *ctx, int n, int64_t in, int64_t out, int bias, te_dtype dt, int fuse = 0) {
  te_grouped_linear_options o = grouped_options(n, in, out, bias, dt, fuse);
  te_grouped_linear *g = nullptr;
  EXPECT_TE_OK(te_grouped_linear_create(&g, ctx, &o));
  return GroupedPtr(g);
}

template <class T>
T *sentinel() {
  return reinterpret_cast<T *>(static_cast<uintptr_t>(0xFEEDFACECAFEBEE1ull));
}

int64_t total(const std::vector<int64_t> &splits) { return std::accumulate(splits.begin(), splits.end(), int64_t{0}); }
int64_t pad16(int64_t m) { return (m + 15) / 16 * 16; }

// Every expert's parameters, and the arrays of pointers the API takes.
struct Params {
  std::vector<HostTensor> w, b;
  std::vector<const te_tensor *> wp, bp;
  Params(int n, int64_t in, int64_t out, te_dtype dt, uint32_t seed) {
    for (int i = 0; i < n; ++i) {
      // Experts differ in scale, so per-expert scales differ too.
      const float s = 0.25f + 0.125f * static_cast<float>(i % 5);
      w.push_back(lt::random_tensor(dt, {out, in}, -s, s, seed + 2u * i));
      b.push_back(lt::random_tensor(dt, {out}, -1.0f, 1.0f, seed + 2u * i + 1));
    }
    bind();
  }
  void bind() {
    wp.clear();
    bp.clear();
    for (auto &t : w) wp.push_back(t.get());
    for (auto &t : b) bp.push_back(t.get());
  }
};

// Every expert's gradients (pre-filled with a sentinel), and the arrays of pointers.
struct Grads {
  HostTensor dx;
  std::vector<HostTensor> dw, db;
  std::vector<te_tensor *> dwp, dbp;
  Grads(int n, int64_t tokens, int64_t in, int64_t out, te_dtype dt, te_dtype dw_dt) : dx(lt::make_tensor(dt, {tokens, in})) {
    for (int i = 0; i < n; ++i) {
      dw.push_back(lt::make_tensor(dw_dt, {out, in}));
      db.push_back(lt::make_tensor(dt, {out}));
    }
    bind();
  }
  void bind() {
    dwp.clear();
    dbp.clear();
    for (auto &t : dw) dwp.push_back(t.get());
    for (auto &t : db) dbp.push_back(t.get());
  }
};

te_grouped_linear_forward_args forward_args(const HostTensor &x, const std::vector<int64_t> &splits, const Params &p,
                                            bool bias, int weight_unchanged = 0) {
  te_grouped_linear_forward_args a;
  EXPECT_EQ(te_grouped_linear_forward_args_init(&a), TE_SUCCESS);
  a.input = x.get();
  a.m_splits = splits.data();
  a.weights = p.wp.data();
  a.biases = bias ? p.bp.data() : nullptr;
  a.weight_unchanged = weight_unchanged;
  return a;
}

te_linear_backward_args backward_flags(uint32_t flags) {
  te_linear_backward_args a;
  EXPECT_EQ(te_linear_backward_args_init(&a), TE_SUCCESS);
  a.flags = flags;
  return a;
}

// Rows [row0, row0 + rows) of a [R, cols] tensor as a new [max(rows, pad_to), cols] tensor, the
// extra rows zero.
HostTensor rows_of(const HostTensor &t, int64_t row0, int64_t rows, int64_t pad_to = 0) {
  const int64_t cols = t.cols();
  HostTensor r = lt::make_tensor(t.t.dtype, {std::max(rows, pad_to), cols}, TE_SCALING_PER_TENSOR, 0);
  const size_t es = lt::dtype_size(t.t.dtype);
  std::memcpy(r.bytes.data(), t.bytes.data() + static_cast<size_t>(row0 * cols) * es, static_cast<size_t>(rows * cols) * es);
  return r;
}

std::vector<unsigned char> grouped_state(te_context *ctx, const te_grouped_linear *g) {
  size_t size = 0;
  EXPECT_TE_OK(te_grouped_linear_state_save(ctx, g, nullptr, 0, &size));
  std::vector<unsigned char> buf(size);
  size_t written = 0;
  EXPECT_TE_OK(te_grouped_linear_state_save(ctx, g, buf.data(), buf.size(), &written));
  EXPECT_EQ(written, size);
  return buf;
}

lt::ScalingSnapshot expert_state(te_context *ctx, const te_grouped_linear *g, int expert, te_tensor_role role) {
  lt::ScalingSnapshot s;
  std::memset(&s.info, 0, sizeof s.info);
  s.info.struct_size = sizeof s.info;
  s.history.assign(4096, -7.0f);
  EXPECT_TE_OK(te_grouped_linear_get_scaling_state(ctx, g, expert, role, &s.info, s.history.data(), s.history.size()));
  s.history.resize(static_cast<size_t>(std::max(0, s.info.amax_history_len)));
  return s;
}

enum RecipeChoice { kHighPrecision = -1, kDelayed = 0, kCurrent = 1, kBlock = 2 };

const char *recipe_name(int r) {
  switch (r) {
    case kHighPrecision: return "HighPrecision";
    case kDelayed: return "Delayed";
    case kCurrent: return "Current";
    case kBlock: return "Block";
  }
  return "?";
}

lt::RecipePtr recipe_for(int choice) {
  if (choice == kHighPrecision) return lt::RecipePtr();
  te_recipe_options o = lt::recipe_defaults(static_cast<te_recipe_kind>(choice));
  if (choice == kDelayed) o.amax_history_len = 4;
  return lt::make_recipe(o);
}

// An autocast scope when `recipe` is set, none otherwise.
struct MaybeScope {
  std::unique_ptr<lt::AutocastScope> scope;
  MaybeScope(te_context *ctx, const te_recipe *recipe) {
    if (recipe) scope.reset(new lt::AutocastScope(ctx, recipe));
  }
  void end() { scope.reset(); }
};

// ---- 1. fp64 reference on the dequantized operands ------------------------------------------

float amax_of(const std::vector<float> &v) {
  float a = 0.0f;
  for (float x : v) a = std::max(a, std::fabs(x));
  return a;
}

std::vector<double> transpose_d(const std::vector<double> &x, int64_t rows, int64_t cols) {
  std::vector<double> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = x[static_cast<size_t>(r * cols + c)];
  return t;
}

::testing::AssertionResult close_rows(const HostTensor &got, int64_t row0, const lt::RefResult &ref, const char *what,
                                      int expert) {
  const int64_t rows = static_cast<int64_t>(ref.value.size()) / got.cols();
  HostTensor slice = rows_of(got, row0, rows);
  ::testing::AssertionResult r = lt::CloseToRef(slice, ref, what);
  if (!r) r << " (expert " << expert << ")";
  return r;
}

struct ReferenceCase {
  int recipe;
  int bias;
  te_dtype dt;
  int n;
  int64_t in, out;
  std::vector<int64_t> splits;
};

// Forward and backward of one grouped layer against the fp64 reference, expert by expert.
void check_against_reference(const ReferenceCase &c) {
  const bool fp8 = c.recipe != kHighPrecision, block = c.recipe == kBlock;
  const int n = c.n;
  const int64_t in = c.in, out = c.out, tokens = total(c.splits);
  lt::ContextPtr ctx = lt::make_cpu_context();
  GroupedPtr g = make_grouped(ctx.get(), n, in, out, c.bias, c.dt);
  ASSERT_TRUE(g);
  lt::RecipePtr recipe = recipe_for(c.recipe);
  te_recipe_options ro = lt::recipe_defaults(fp8 ? static_cast<te_recipe_kind>(c.recipe) : TE_RECIPE_DELAYED_SCALING);
  if (fp8) ASSERT_TE_OK(te_recipe_get_options(recipe.get(), &ro));
  const bool pow2 = ro.power_of_2_scales != 0;
  const float eps = ro.amax_epsilon;
  const te_dtype bwd_dt = ro.format == TE_FORMAT_HYBRID ? TE_DTYPE_E5M2 : TE_DTYPE_E4M3;
  const te_scaling_mode act_mode = block ? TE_SCALING_BLOCK_1X128 : TE_SCALING_PER_TENSOR;
  const te_scaling_mode w_mode = block ? TE_SCALING_BLOCK_128X128 : TE_SCALING_PER_TENSOR;

  Params p(n, in, out, c.dt, 100);
  HostTensor x = lt::random_tensor(c.dt, {tokens, in}, -2.0f, 2.0f, 7, block);
  HostTensor dy = lt::random_tensor(c.dt, {tokens, out}, -0.05f, 0.05f, 8, block);
  te_grouped_linear_forward_args fa = forward_args(x, c.splits, p, c.bias);

  // A warm-up step: under delayed scaling every used scale becomes fp8_max / amax.
  if (fp8) {
    HostTensor y0(c.dt, {tokens, out});
    Grads g0(n, tokens, in, out, c.dt, c.dt);
    te_grouped_linear_backward_ctx *raw = nullptr;
    {
      lt::AutocastScope scope(ctx.get(), recipe.get());
      ASSERT_TE_OK(te_grouped_linear_forward(ctx.get(), g.get(), &fa, y0.get(), &raw));
    }
    GroupedBwdPtr hold(raw);
    ASSERT_TE_OK(te_grouped_linear_backward(ctx.get(), raw, dy.get(), g0.dx.get(), g0.dwp.data(),
                                            c.bias ? g0.dbp.data() : nullptr, nullptr));
  }
  std::vector<lt::ScalingSnapshot> in_state, w_state;
  for (int i = 0; i < n; ++i) {
    in_state.push_back(expert_state(ctx.get(), g.get(), i, TE_ROLE_INPUT));
    w_state.push_back(expert_state(ctx.get(), g.get(), i, TE_ROLE_WEIGHT));
  }

  HostTensor y(c.dt, {tokens, out});
  y.fill_byte(0xA5);
  te_grouped_linear_residuals res;
  std::memset(&res, 0, sizeof res);
  res.struct_size = sizeof res;
  te_grouped_linear_backward_ctx *raw = nullptr;
  {
    MaybeScope scope(ctx.get(), recipe.get());
    ASSERT_TE_OK(te_grouped_linear_forward_compute(ctx.get(), g.get(), &fa, y.get(), &res));
    EXPECT_EQ(res.fp8, fp8 ? 1 : 0);
    ASSERT_TE_OK(te_grouped_linear_forward_save(ctx.get(), g.get(), &res, &raw));
    EXPECT_EQ(res.internal, nullptr);
  }
  GroupedBwdPtr bwd(raw);
  std::vector<lt::ScalingSnapshot> go_state;
  for (int i = 0; i < n; ++i) go_state.push_back(expert_state(ctx.get(), g.get(), i, TE_ROLE_GRAD_OUTPUT));
  Grads gr(n, tokens, in, out, c.dt, c.dt);
  ASSERT_TE_OK(te_grouped_linear_backward(ctx.get(), bwd.get(), dy.get(), gr.dx.get(), gr.dwp.data(),
                                          c.bias ? gr.dbp.data() : nullptr, nullptr));

  int64_t row0 = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t m = c.splits[static_cast<size_t>(i)];
    SCOPED_TRACE("expert " + std::to_string(i) + " with " + std::to_string(m) + " tokens");
    const std::vector<float> wv = p.w[static_cast<size_t>(i)].values_f32();
    const std::vector<float> bv = p.b[static_cast<size_t>(i)].values_f32();
    if (m == 0) {
      // No tokens: dW = 0, db = 0 (every byte, so +0), and no GEMM recorded anything.
      EXPECT_TRUE(std::all_of(gr.dw[i].bytes.begin(), gr.dw[i].bytes.end(), [](unsigned char b) { return b == 0; }));
      if (c.bias)
        EXPECT_TRUE(std::all_of(gr.db[i].bytes.begin(), gr.db[i].bytes.end(), [](unsigned char b) { return b == 0; }));
      continue;
    }
    const std::vector<float> xv = rows_of(x, row0, m).values_f32();
    const std::vector<float> dyv = rows_of(dy, row0, m).values_f32();
    float x_scale = 1.0f, w_scale = 1.0f, dy_scale = 1.0f;
    if (c.recipe == kDelayed) {
      x_scale = in_state[i].info.scale;
      w_scale = w_state[i].info.scale;
      dy_scale = go_state[i].info.scale;
      EXPECT_EQ(x_scale, 448.0f / amax_of(xv)) << "the warm-up step recorded this expert's own amax";
    } else if (c.recipe == kCurrent) {
      x_scale = lt::scale_from_amax(amax_of(xv), 448.0f, pow2, eps);
      w_scale = lt::scale_from_amax(amax_of(wv), 448.0f, pow2, eps);
      dy_scale = lt::scale_from_amax(amax_of(dyv), static_cast<float>(lt::fp8_max(bwd_dt)), pow2, eps);
    }
    std::vector<double> x_op, w_op, dy_op, xT_op, dyT_op;
    if (fp8) {
      x_op = lt::dequantize_ref(lt::quantize_ref(xv, m, in, TE_DTYPE_E4M3, act_mode, x_scale, pow2, eps));
      w_op = lt::dequantize_ref(lt::quantize_ref(wv, out, in, TE_DTYPE_E4M3, w_mode, w_scale, pow2, eps));
      dy_op = lt::dequantize_ref(lt::quantize_ref(dyv, m, out, bwd_dt, act_mode, dy_scale, pow2, eps));
      // wgrad's operands are quantized along the tokens (1x128 blocks of x^T and dy^T).
      xT_op = lt::dequantize_ref(
          lt::quantize_ref(lt::transpose(xv, m, in), in, m, TE_DTYPE_E4M3, act_mode, x_scale, pow2, eps));
      dyT_op = lt::dequantize_ref(
          lt::quantize_ref(lt::transpose(dyv, m, out), out, m, bwd_dt, act_mode, dy_scale, pow2, eps));
    } else {
      x_op = lt::to_double(xv);
      w_op = lt::to_double(wv);
      dy_op = lt::to_double(dyv);
      xT_op = lt::to_double(lt::transpose(xv, m, in));
      dyT_op = lt::to_double(lt::transpose(dyv, m, out));
    }
    lt::RefResult y_ref = lt::ref_gemm_nt(x_op, w_op, m, out, in);
    if (c.bias)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < out; ++j) {
          y_ref.value[static_cast<size_t>(r * out + j)] += bv[static_cast<size_t>(j)];
          y_ref.abs_sum[static_cast<size_t>(r * out + j)] += std::fabs(bv[static_cast<size_t>(j)]);
        }
    const lt::RefResult dx_ref = lt::ref_gemm_nt(dy_op, transpose_d(w_op, out, in), m, in, out);
    const lt::RefResult dw_ref = lt::ref_gemm_nt(dyT_op, xT_op, out, in, m);
    EXPECT_TRUE(close_rows(y, row0, y_ref, "y", i));
    EXPECT_TRUE(close_rows(gr.dx, row0, dx_ref, "dx", i));
    EXPECT_TRUE(lt::CloseToRef(gr.dw[i], dw_ref, "dw"));
    if (c.bias) {
      lt::RefResult db_ref;
      db_ref.k = m;
      db_ref.value.assign(static_cast<size_t>(out), 0.0);
      db_ref.abs_sum.assign(static_cast<size_t>(out), 0.0);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < out; ++j) {
          db_ref.value[static_cast<size_t>(j)] += dyv[static_cast<size_t>(r * out + j)];
          db_ref.abs_sum[static_cast<size_t>(j)] += std::fabs(dyv[static_cast<size_t>(r * out + j)]);
        }
      EXPECT_TRUE(lt::CloseToRef(gr.db[i], db_ref, "db"));
    }
    row0 += m;
  }
}

using RefParam = std::tuple<int, int, te_dtype>;  // recipe, bias, activation dtype

class GroupedLinearReference : public ::testing::TestWithParam<RefParam> {};

// Uneven splits, counts that are not multiples of 16 (1, 5, 37), empty experts (first, middle,
// last) and one of exactly 16. Block scaling gets in > 128 so that rows have several 1x128
// blocks, and out > 128 for a 2x2 tile grid of 128x128 weight tiles; 150 tokens in one expert
// cover two 1x128 blocks along the tokens with a zero-padded tail.
TEST_P(GroupedLinearReference, ForwardBackwardMatchFp64OnDequantizedOperands) {
  const int recipe = std::get<0>(GetParam());
  ReferenceCase c;
  c.recipe = recipe;
  c.bias = std::get<1>(GetParam());
  c.dt = std::get<2>(GetParam());
  c.n = 7;
  c.in = recipe == kBlock ? 160 : 48;
  c.out = recipe == kBlock ? 144 : 32;
  c.splits = {0, 5, 37, 16, 0, recipe == kBlock ? 150 : 1, 0};
  check_against_reference(c);
}

INSTANTIATE_TEST_SUITE_P(
    AllRecipes, GroupedLinearReference,
    ::testing::Combine(::testing::Values(kHighPrecision, kDelayed, kCurrent, kBlock), ::testing::Values(0, 1),
                       ::testing::Values(TE_DTYPE_F32, TE_DTYPE_BF16)),
    [](const ::testing::TestParamInfo<RefParam> &info) {
      return std::string(recipe_name(std::get<0>(info.param))) + (std::get<1>(info.param) ? "_Bias_" : "_NoBias_") +
             lt::dtype_name(std::get<2>(info.param));
    });

TEST(GroupedLinearReferenceExtra, OneExpert) {
  for (int r : {kHighPrecision, kDelayed, kCurrent, kBlock}) {
    SCOPED_TRACE(recipe_name(r));
    check_against_reference(ReferenceCase{r, 1, TE_DTYPE_BF16, 1, 32, 16, {21}});
  }
}

// 64 experts with counts 0..40 (a fifth of them empty): dozens of distinct padded sizes, so the
// scratch of the experts' steps does not fit one plan and is reserved in rounds.
TEST(GroupedLinearReferenceExtra, SixtyFourExperts) {
  std::mt19937 gen(5);
  std::vector<int64_t> splits(64);
  for (auto &m : splits) m = gen() % 5 == 0 ? 0 : static_cast<int64_t>(gen() % 41);
  for (int r : {kDelayed, kBlock}) {
    SCOPED_TRACE(recipe_name(r));
    check_against_reference(ReferenceCase{r, 1, TE_DTYPE_F32, 64, 32, 16, splits});
  }
}

// ---- 2. bitwise equal to one te_linear per expert --------------------------------------------

// Per step: the grouped layer, and one te_linear per non-empty expert given that expert's rows
// (zero-padded to 16 under FP8), inside the same kind of scope; backward of the linears in
// reverse order (the first forward's backward completes the pass, as in a model). Outputs,
// gradients and every scaling state must match bit for bit.
void check_against_linears(int recipe_choice, int bias, te_dtype dt, const std::vector<std::vector<int64_t>> &steps) {
  const bool fp8 = recipe_choice != kHighPrecision;
  const int n = static_cast<int>(steps[0].size());
  const int64_t in = 32, out = 48;
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr recipe = recipe_for(recipe_choice);
  GroupedPtr g = make_grouped(ctx.get(), n, in, out, bias, dt);
  std::vector<lt::LinearPtr> lins;
  for (int i = 0; i < n; ++i) lins.push_back(lt::make_linear(ctx.get(), in, out, bias, dt));
  Params p(n, in, out, dt, 300);

  for (size_t step = 0; step < steps.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<int64_t> &splits = steps[step];
    const int64_t tokens = total(splits);
    HostTensor x = lt::random_tensor(dt, {tokens, in}, -2.0f, 2.0f, 40 + static_cast<uint32_t>(step));
    HostTensor dy = lt::random_tensor(dt, {tokens, out}, -0.1f, 0.1f, 50 + static_cast<uint32_t>(step));
    // The second step reuses the cached FP8 weights; the third changes them.
    const int unchanged = step == 1 ? 1 : 0;
    if (step == 2)
      for (auto &w : p.w) lt::fill_uniform(w, -0.3f, 0.3f, 77 + static_cast<uint32_t>(step));

    HostTensor y(dt, {tokens, out});
    te_grouped_linear_backward_ctx *graw = nullptr;
    std::vector<te_linear_backward_ctx *> lraw(static_cast<size_t>(n), nullptr);
    // A high-precision forward references its input until the backward: keep every x_i.
    std::vector<HostTensor> lx(static_cast<size_t>(n)), ly(static_cast<size_t>(n)), ldy(static_cast<size_t>(n));
    std::vector<int64_t> row0(static_cast<size_t>(n));
    {
      te_grouped_linear_forward_args fa = forward_args(x, splits, p, bias, unchanged);
      MaybeScope scope(ctx.get(), recipe.get());
      ASSERT_TE_OK(te_grouped_linear_forward(ctx.get(), g.get(), &fa, y.get(), &graw));
    }
    {
      MaybeScope scope(ctx.get(), recipe.get());
      int64_t r = 0;
      for (int i = 0; i < n; ++i) {
        const int64_t m = splits[static_cast<size_t>(i)];
        row0[static_cast<size_t>(i)] = r;
        r += m;
        if (m == 0) continue;
        const int64_t rows = fp8 ? pad16(m) : m;
        lx[i] = rows_of(x, row0[i], m, rows);
        ldy[i] = rows_of(dy, row0[i], m, rows);
        ly[i] = lt::make_tensor(dt, {rows, out});
        te_linear_forward_args la;
        te_linear_forward_args_init(&la);
        la.input = lx[i].get();
        la.weight = p.w[i].get();
        la.bias = bias ? p.b[i].get() : nullptr;
        la.weight_unchanged = unchanged;
        ASSERT_TE_OK(te_linear_forward(ctx.get(), lins[i].get(), &la, ly[i].get(), &lraw[i]));
      }
    }
    GroupedBwdPtr gb(graw);
    Grads gg(n, tokens, in, out, dt, dt);
    ASSERT_TE_OK(te_grouped_linear_backward(ctx.get(), gb.get(), dy.get(), gg.dx.get(), gg.dwp.data(),
                                            bias ? gg.dbp.data() : nullptr, nullptr));
    for (int i = n - 1; i >= 0; --i) {
      const int64_t m = splits[static_cast<size_t>(i)];
      if (m == 0) continue;
      lt::BackwardPtr lb(lraw[i]);
      const int64_t rows = fp8 ? pad16(m) : m;
      HostTensor dx(dt, {rows, in}), dw(dt, {out, in}), db(dt, {out});
      ASSERT_TE_OK(te_linear_backward(ctx.get(), lb.get(), ldy[i].get(), dx.get(), dw.get(), bias ? db.get() : nullptr,
                                      nullptr));
      SCOPED_TRACE("expert " + std::to_string(i));
      EXPECT_EQ(rows_of(y, row0[i], m).bytes, rows_of(ly[i], 0, m).bytes) << "y";
      EXPECT_EQ(rows_of(gg.dx, row0[i], m).bytes, rows_of(dx, 0, m).bytes) << "dx";
      EXPECT_EQ(gg.dw[i].bytes, dw.bytes) << "dw";
      if (bias) EXPECT_EQ(gg.db[i].bytes, db.bytes) << "db";
    }
    for (int i = 0; i < n; ++i)
      for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT}) {
        const lt::ScalingSnapshot want = lt::live_scaling_state(ctx.get(), lins[i].get(), role);
        const lt::ScalingSnapshot got = expert_state(ctx.get(), g.get(), i, role);
        EXPECT_TRUE(lt::SameState(got, want)) << "expert " << i << " role " << role;
      }
  }
}

using LinParam = std::tuple<int, int, te_dtype>;
class GroupedLinearVsLinears : public ::testing::TestWithParam<LinParam> {};

TEST_P(GroupedLinearVsLinears, BitwiseEqualPerExpertOverSteps) {
  // Expert 1 gets tokens only in the first step, expert 4 only in the last; counts on and off
  // multiples of 16.
  check_against_linears(std::get<0>(GetParam()), std::get<1>(GetParam()), std::get<2>(GetParam()),
                        {{16, 7, 0, 33, 0}, {5, 0, 48, 1, 0}, {0, 0, 32, 17, 9}});
}

INSTANTIATE_TEST_SUITE_P(
    AllRecipes, GroupedLinearVsLinears,
    ::testing::Combine(::testing::Values(kHighPrecision, kDelayed, kCurrent, kBlock), ::testing::Values(0, 1),
                       ::testing::Values(TE_DTYPE_F32, TE_DTYPE_BF16)),
    [](const ::testing::TestParamInfo<LinParam> &info) {
      return std::string(recipe_name(std::get<0>(info.param))) + (std::get<1>(info.param) ? "_Bias_" : "_NoBias_") +
             lt::dtype_name(std::get<2>(info.param));
    });

// ---- 3. what the contract says besides the numbers --------------------------------------------

class GroupedLinearTest : public lt::CpuContextTest {
 protected:
  static constexpr int kN = 4;
  static constexpr int64_t kIn = 32, kOut = 16;
  void SetUp() override {
    lt::CpuContextTest::SetUp();
    g_ = make_grouped(ctx_, kN, kIn, kOut, 1, TE_DTYPE_F32);
    recipe_ = lt::make_recipe(TE_RECIPE_DELAYED_SCALING, 8);
  }
  // One FP8 forward in its own scope; returns the backward context.
  te_grouped_linear_backward_ctx *forward(const HostTensor &x, const std::vector<int64_t> &splits, HostTensor &y,
                                          int unchanged = 0, te_grouped_linear *g = nullptr) {
    te_grouped_linear_forward_args fa = forward_args(x, splits, p_, 1, unchanged);
    te_grouped_linear_backward_ctx *b = nullptr;
    lt::AutocastScope scope(ctx_, recipe_.get());
    EXPECT_TE_OK(te_grouped_linear_forward(ctx_, g ? g : g_.get(), &fa, y.get(), &b));
    return b;
  }
  GroupedPtr g_;
  lt::RecipePtr recipe_;
  Params p_{kN, kIn, kOut, TE_DTYPE_F32, 500};
  std::vector<int64_t> splits_{3, 0, 20, 9};
  HostTensor x_ = lt::random_tensor(TE_DTYPE_F32, {32, kIn}, -1.0f, 1.0f, 1);
  HostTensor dy_ = lt::random_tensor(TE_DTYPE_F32, {32, kOut}, -1.0f, 1.0f, 2);
};

TEST_F(GroupedLinearTest, OptionsDefaults) {
  te_grouped_linear_options o;
  std::memset(&o, 0x5A, sizeof o);
  ASSERT_TE_OK(te_grouped_linear_options_init(&o));
  EXPECT_EQ(o.struct_size, sizeof o);
  EXPECT_EQ(o.num_gemms, 0);
  EXPECT_EQ(o.in_features, 0);
  EXPECT_EQ(o.out_features, 0);
  EXPECT_EQ(o.bias, 1);
  EXPECT_EQ(o.activation_dtype, TE_DTYPE_BF16);
  EXPECT_EQ(o.fuse_wgrad_accumulation, 0);
  te_grouped_linear_forward_args a;
  std::memset(&a, 0x5A, sizeof a);
  ASSERT_TE_OK(te_grouped_linear_forward_args_init(&a));
  EXPECT_EQ(a.struct_size, sizeof a);
  EXPECT_EQ(a.input, nullptr);
  EXPECT_EQ(a.m_splits, nullptr);
  EXPECT_EQ(a.weights, nullptr);
  EXPECT_EQ(a.biases, nullptr);
  EXPECT_EQ(a.weight_unchanged, 0);
}

// One pass, one bucket update for the forward and one for the backward, covering the states of
// the experts that got tokens and no others: an empty expert's states stay never-used.
TEST_F(GroupedLinearTest, OneBucketUpdatePerPassAndEmptyExpertsSitOut) {
  const te_context_stats s0 = lt::context_stats(ctx_);
  HostTensor y(TE_DTYPE_F32, {32, kOut});
  GroupedBwdPtr b(forward(x_, splits_, y));
  const te_context_stats s1 = lt::context_stats(ctx_);
  EXPECT_EQ(s1.bucket_updates - s0.bucket_updates, 1u);
  EXPECT_EQ(s1.states_updated - s0.states_updated, 2u * 3);  // input and weight of 3 experts
  Grads gr(kN, 32, kIn, kOut, TE_DTYPE_F32, TE_DTYPE_F32);
  ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b.get(), dy_.get(), gr.dx.get(), gr.dwp.data(), gr.dbp.data(), nullptr));
  const te_context_stats s2 = lt::context_stats(ctx_);
  EXPECT_EQ(s2.bucket_updates - s1.bucket_updates, 1u);
  EXPECT_EQ(s2.states_updated - s1.states_updated, 3u);  // grad_output of 3 experts
  for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT}) {
    EXPECT_EQ(expert_state(ctx_, g_.get(), 1, role).info.amax_history_len, 0) << "role " << role;
    EXPECT_EQ(expert_state(ctx_, g_.get(), 0, role).info.amax_history_len, 8) << "role " << role;
  }
  // The empty expert's gradients are zeros.
  for (unsigned char byte : gr.dw[1].bytes) ASSERT_EQ(byte, 0);
  for (unsigned char byte : gr.db[1].bytes) ASSERT_EQ(byte, 0);
}

// The first module's backward ends the pass even when it quantizes no dy (no dx and no dW asked
// for): the second module's GRAD_OUTPUT states are updated then, not at a later flush.
TEST_F(GroupedLinearTest, FirstModuleBackwardEndsThePassEvenWhenItQuantizesNothing) {
  for (int only_db = 0; only_db < 2; ++only_db) {
    SCOPED_TRACE(only_db ? "first module's backward: db only" : "first module's backward: nothing");
    GroupedPtr first = make_grouped(ctx_, kN, kIn, kOut, 1, TE_DTYPE_F32);
    GroupedPtr second = make_grouped(ctx_, kN, kIn, kOut, 1, TE_DTYPE_F32);
    HostTensor y(TE_DTYPE_F32, {32, kOut});
    te_grouped_linear_forward_args fa = forward_args(x_, splits_, p_, 1);
    te_grouped_linear_backward_ctx *b1 = nullptr, *b2 = nullptr;
    {
      lt::AutocastScope scope(ctx_, recipe_.get());
      ASSERT_TE_OK(te_grouped_linear_forward(ctx_, first.get(), &fa, y.get(), &b1));
      ASSERT_TE_OK(te_grouped_linear_forward(ctx_, second.get(), &fa, y.get(), &b2));
    }
    GroupedBwdPtr h1(b1), h2(b2);
    Grads gr(kN, 32, kIn, kOut, TE_DTYPE_F32, TE_DTYPE_F32);
    ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b2, dy_.get(), gr.dx.get(), gr.dwp.data(), gr.dbp.data(), nullptr));
    EXPECT_EQ(expert_state(ctx_, second.get(), 0, TE_ROLE_GRAD_OUTPUT).info.scale, 1.0f)
        << "updated before the first module's backward";
    const te_context_stats before = lt::context_stats(ctx_);
    ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b1, dy_.get(), nullptr, nullptr, only_db ? gr.dbp.data() : nullptr,
                                            nullptr));
    EXPECT_EQ(lt::context_stats(ctx_).bucket_updates - before.bucket_updates, 1u)
        << "the pass's backward bucket was not updated";
    EXPECT_EQ(expert_state(ctx_, second.get(), 0, TE_ROLE_GRAD_OUTPUT).info.scale,
              57344.0f / amax_of(rows_of(dy_, 0, splits_[0]).values_f32()));
  }
}

TEST_F(GroupedLinearTest, BackwardAgainIsIdenticalAndOnceFreesTheResiduals) {
  HostTensor y(TE_DTYPE_F32, {32, kOut});
  GroupedBwdPtr b(forward(x_, splits_, y));
  Grads g1(kN, 32, kIn, kOut, TE_DTYPE_F32, TE_DTYPE_F32), g2 = g1, g3 = g1;
  g2.bind();
  g3.bind();
  ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b.get(), dy_.get(), g1.dx.get(), g1.dwp.data(), g1.dbp.data(), nullptr));
  // The pass's update moved the grad_output scales in between; the repeat still quantizes dy
  // with the scales of the first backward.
  te_linear_backward_args once = backward_flags(TE_BACKWARD_ONCE);
  ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b.get(), dy_.get(), g2.dx.get(), g2.dwp.data(), g2.dbp.data(), &once));
  EXPECT_EQ(g1.dx.bytes, g2.dx.bytes);
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(g1.dw[i].bytes, g2.dw[i].bytes) << i;
    EXPECT_EQ(g1.db[i].bytes, g2.db[i].bytes) << i;
  }
  EXPECT_TRUE(lt::IsError(
      te_grouped_linear_backward(ctx_, b.get(), dy_.get(), g3.dx.get(), g3.dwp.data(), g3.dbp.data(), nullptr),
      TE_ERROR_INVALID_STATE, "te_grouped_linear_backward", "bwd"));
  EXPECT_EQ(g3.dx.bytes, lt::make_tensor(TE_DTYPE_F32, {32, kIn}).bytes) << "untouched after the failure";
}

TEST_F(GroupedLinearTest, EachGradientMayBeSkipped) {
  HostTensor y(TE_DTYPE_F32, {32, kOut});
  GroupedBwdPtr b(forward(x_, splits_, y));
  Grads all(kN, 32, kIn, kOut, TE_DTYPE_F32, TE_DTYPE_F32);
  ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b.get(), dy_.get(), all.dx.get(), all.dwp.data(), all.dbp.data(), nullptr));
  Grads some(kN, 32, kIn, kOut, TE_DTYPE_F32, TE_DTYPE_F32);
  ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b.get(), dy_.get(), nullptr, some.dwp.data(), nullptr, nullptr));
  for (int i = 0; i < kN; ++i) EXPECT_EQ(some.dw[i].bytes, all.dw[i].bytes) << i;
  EXPECT_EQ(some.dx.bytes, lt::make_tensor(TE_DTYPE_F32, {32, kIn}).bytes);
  ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b.get(), dy_.get(), some.dx.get(), nullptr, some.dbp.data(), nullptr));
  EXPECT_EQ(some.dx.bytes, all.dx.bytes);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(some.db[i].bytes, all.db[i].bytes) << i;
  ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b.get(), dy_.get(), nullptr, nullptr, nullptr, nullptr));
}

// main_grad accumulation: dW is added into F32 tensors; an expert without tokens adds nothing.
TEST_F(GroupedLinearTest, FuseWgradAccumulationAddsIntoMainGrad) {
  for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16}) {
    SCOPED_TRACE(lt::dtype_name(dt));
    GroupedPtr plain = make_grouped(ctx_, kN, kIn, kOut, 1, dt, 0);
    GroupedPtr fused = make_grouped(ctx_, kN, kIn, kOut, 1, dt, 1);
    Params p(kN, kIn, kOut, dt, 900);
    HostTensor x = lt::random_tensor(dt, {32, kIn}, -1.0f, 1.0f, 3);
    HostTensor dy = lt::random_tensor(dt, {32, kOut}, -1.0f, 1.0f, 4);
    te_grouped_linear_forward_args fa = forward_args(x, splits_, p, 1);
    HostTensor y1(dt, {32, kOut}), y2(dt, {32, kOut});
    te_grouped_linear_backward_ctx *b1 = nullptr, *b2 = nullptr;
    {
      lt::AutocastScope scope(ctx_, recipe_.get());
      ASSERT_TE_OK(te_grouped_linear_forward(ctx_, plain.get(), &fa, y1.get(), &b1));
      ASSERT_TE_OK(te_grouped_linear_forward(ctx_, fused.get(), &fa, y2.get(), &b2));
    }
    GroupedBwdPtr hold1(b1), hold2(b2);
    Grads g1(kN, 32, kIn, kOut, dt, dt), g2(kN, 32, kIn, kOut, dt, TE_DTYPE_F32);
    std::vector<HostTensor> main_before;
    for (int i = 0; i < kN; ++i) {
      lt::fill_uniform(g2.dw[i], -1.0f, 1.0f, 60 + i);
      main_before.push_back(g2.dw[i]);
    }
    g2.bind();
    ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b1, dy.get(), nullptr, g1.dwp.data(), nullptr, nullptr));
    ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b2, dy.get(), nullptr, g2.dwp.data(), nullptr, nullptr));
    for (int i = 0; i < kN; ++i) {
      SCOPED_TRACE("expert " + std::to_string(i));
      if (splits_[i] == 0) {
        EXPECT_EQ(g2.dw[i].bytes, main_before[i].bytes) << "nothing added";
        continue;
      }
      // The fused GEMM adds its fp32 result into main_grad; dW alone is that result rounded to
      // the activation dtype (exact for F32).
      for (int64_t k = 0; k < g2.dw[i].numel(); ++k) {
        const double want = main_before[i].at(k) + g1.dw[i].at(k);
        const double tol = dt == TE_DTYPE_F32 ? 0.0 : std::ldexp(std::fabs(g1.dw[i].at(k)), -8) + 1e-6;
        ASSERT_NEAR(g2.dw[i].at(k), want, tol + std::ldexp(std::fabs(want), -23)) << k;
      }
    }
  }
}

// The cached FP8 weights: reused under weight_unchanged = 1, refreshed otherwise; an expert that
// got no tokens while its weight changed must not leave the old FP8 copy for a later reuse.
// Current scaling, so that an output depends on the inputs and the weights used, not on history.
TEST_F(GroupedLinearTest, WeightCachePerExpert) {
  recipe_ = lt::make_recipe(TE_RECIPE_CURRENT_SCALING);
  const std::vector<int64_t> all{8, 8, 8, 8}, none1{8, 0, 16, 8};
  HostTensor y_old(TE_DTYPE_F32, {32, kOut}), y(TE_DTYPE_F32, {32, kOut});
  te_grouped_linear_backward_ctx_destroy(forward(x_, all, y_old));
  // Change expert 1's weight: a forward with weight_unchanged = 1 still uses the old FP8 copy.
  lt::fill_uniform(p_.w[1], -0.9f, 0.9f, 1234);
  te_grouped_linear_backward_ctx_destroy(forward(x_, all, y, 1));
  EXPECT_EQ(rows_of(y, 8, 8).bytes, rows_of(y_old, 8, 8).bytes) << "the cached weight was reused";
  // weight_unchanged = 0 while expert 1 gets no tokens, then a reuse: it must see the new W.
  te_grouped_linear_backward_ctx_destroy(forward(x_, none1, y, 0));
  HostTensor y_reuse(TE_DTYPE_F32, {32, kOut}), y_new(TE_DTYPE_F32, {32, kOut});
  te_grouped_linear_backward_ctx_destroy(forward(x_, all, y_reuse, 1));
  GroupedPtr fresh = make_grouped(ctx_, kN, kIn, kOut, 1, TE_DTYPE_F32);
  te_grouped_linear_backward_ctx_destroy(forward(x_, all, y_new, 0, fresh.get()));
  EXPECT_EQ(y_reuse.bytes, y_new.bytes) << "expert 1 quantized its new weight";
  EXPECT_NE(rows_of(y_reuse, 8, 8).bytes, rows_of(y_old, 8, 8).bytes);
}

TEST_F(GroupedLinearTest, ResidualsReleaseAndCopies) {
  te_grouped_linear_forward_args fa = forward_args(x_, splits_, p_, 1);
  HostTensor y(TE_DTYPE_F32, {32, kOut});
  te_grouped_linear_residuals r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  {
    lt::AutocastScope scope(ctx_, recipe_.get());
    ASSERT_TE_OK(te_grouped_linear_forward_compute(ctx_, g_.get(), &fa, y.get(), &r));
  }
  EXPECT_EQ(r.fp8, 1);
  te_grouped_linear_residuals copy = r;
  te_grouped_linear_residuals_release(&r);
  EXPECT_EQ(r.internal, nullptr);
  te_grouped_linear_residuals_release(&r);     // idempotent
  te_grouped_linear_residuals_release(&copy);  // a copy names nothing any more: a no-op
  te_grouped_linear_residuals_release(nullptr);
  te_grouped_linear_backward_ctx *out = sentinel<te_grouped_linear_backward_ctx>();
  EXPECT_TRUE(lt::IsError(te_grouped_linear_forward_save(ctx_, g_.get(), &copy, &out), TE_ERROR_INVALID_ARGUMENT,
                          "te_grouped_linear_forward_save", "residuals"));
  EXPECT_EQ(out, sentinel<te_grouped_linear_backward_ctx>());
  // Saved residuals belong to the layer that made them.
  {
    lt::AutocastScope scope(ctx_, recipe_.get());
    ASSERT_TE_OK(te_grouped_linear_forward_compute(ctx_, g_.get(), &fa, y.get(), &r));
  }
  GroupedPtr other = make_grouped(ctx_, kN, kIn, kOut, 1, TE_DTYPE_F32);
  EXPECT_TRUE(lt::IsError(te_grouped_linear_forward_save(ctx_, other.get(), &r, &out), TE_ERROR_INVALID_ARGUMENT,
                          "te_grouped_linear_forward_save", "residuals"));
  ASSERT_TE_OK(te_grouped_linear_forward_save(ctx_, g_.get(), &r, &out));
  GroupedBwdPtr hold(out);
  // Destroying the layer first is fine: the backward context keeps what it needs, until a
  // TE_BACKWARD_ONCE backward lets go of the last reference to it.
  g_.reset();
  Grads gr(kN, 32, kIn, kOut, TE_DTYPE_F32, TE_DTYPE_F32);
  EXPECT_TE_OK(te_grouped_linear_backward(ctx_, out, dy_.get(), gr.dx.get(), gr.dwp.data(), gr.dbp.data(), nullptr));
  te_linear_backward_args once = backward_flags(TE_BACKWARD_ONCE);
  EXPECT_TE_OK(te_grouped_linear_backward(ctx_, out, dy_.get(), gr.dx.get(), gr.dwp.data(), gr.dbp.data(), &once));
}

TEST_F(GroupedLinearTest, StateRoundTripResumesBitExactly) {
  Grads gr(kN, 32, kIn, kOut, TE_DTYPE_F32, TE_DTYPE_F32);
  HostTensor y(TE_DTYPE_F32, {32, kOut});
  for (int step = 0; step < 3; ++step) {
    GroupedBwdPtr b(forward(x_, splits_, y));
    ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b.get(), dy_.get(), nullptr, gr.dwp.data(), nullptr, nullptr));
  }
  const std::vector<unsigned char> saved = grouped_state(ctx_, g_.get());
  // "TEGL", version, [num_gemms, in, out], then 3 states per expert.
  ASSERT_GE(saved.size(), 4u + 4u + 24u);
  EXPECT_EQ(std::memcmp(saved.data(), "TEGL", 4), 0);
  int64_t shape[3];
  std::memcpy(shape, saved.data() + 8, sizeof shape);
  EXPECT_EQ(shape[0], kN);
  EXPECT_EQ(shape[1], kIn);
  EXPECT_EQ(shape[2], kOut);
  size_t small = 0;
  EXPECT_TRUE(lt::IsError(te_grouped_linear_state_save(ctx_, g_.get(), std::vector<unsigned char>(8).data(), 8, &small),
                          TE_ERROR_INVALID_ARGUMENT, "te_grouped_linear_state_save", "capacity"));

  GroupedPtr twin = make_grouped(ctx_, kN, kIn, kOut, 1, TE_DTYPE_F32);
  ASSERT_TE_OK(te_grouped_linear_state_load(ctx_, twin.get(), saved.data(), saved.size()));
  EXPECT_EQ(grouped_state(ctx_, twin.get()), saved);
  for (int i = 0; i < kN; ++i)
    for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT})
      EXPECT_TRUE(lt::SameState(expert_state(ctx_, twin.get(), i, role), expert_state(ctx_, g_.get(), i, role)));
  // The next steps are bitwise the same on both.
  for (int step = 0; step < 2; ++step) {
    HostTensor y1(TE_DTYPE_F32, {32, kOut}), y2(TE_DTYPE_F32, {32, kOut});
    Grads a(kN, 32, kIn, kOut, TE_DTYPE_F32, TE_DTYPE_F32), b(kN, 32, kIn, kOut, TE_DTYPE_F32, TE_DTYPE_F32);
    GroupedBwdPtr b1(forward(x_, splits_, y1)), b2(forward(x_, splits_, y2, 0, twin.get()));
    ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b1.get(), dy_.get(), a.dx.get(), a.dwp.data(), a.dbp.data(), nullptr));
    ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b2.get(), dy_.get(), b.dx.get(), b.dwp.data(), b.dbp.data(), nullptr));
    EXPECT_EQ(y1.bytes, y2.bytes);
    EXPECT_EQ(a.dx.bytes, b.dx.bytes);
    for (int i = 0; i < kN; ++i) EXPECT_EQ(a.dw[i].bytes, b.dw[i].bytes);
  }
  EXPECT_EQ(grouped_state(ctx_, twin.get()), grouped_state(ctx_, g_.get()));
}

TEST_F(GroupedLinearTest, StateLoadRefusesForeignOrCorruptBuffersAndOpenPasses) {
  HostTensor y(TE_DTYPE_F32, {32, kOut});
  te_grouped_linear_backward_ctx_destroy(forward(x_, splits_, y));
  const std::vector<unsigned char> before = grouped_state(ctx_, g_.get());
  const char *fn = "te_grouped_linear_state_load";
  // Another layer's format, another shape (num_gemms, features), a truncated or padded buffer.
  lt::LinearPtr lin = lt::make_linear(ctx_, kIn, kOut);
  const std::vector<unsigned char> lin_state = lt::saved_state(ctx_, lin.get());
  EXPECT_TRUE(lt::IsError(te_grouped_linear_state_load(ctx_, g_.get(), lin_state.data(), lin_state.size()),
                          TE_ERROR_INVALID_ARGUMENT, fn, "buf"));
  for (int variant = 0; variant < 2; ++variant) {
    GroupedPtr other = variant == 0 ? make_grouped(ctx_, kN + 1, kIn, kOut, 1, TE_DTYPE_F32)
                                    : make_grouped(ctx_, kN, kIn, kOut + 16, 1, TE_DTYPE_F32);
    const std::vector<unsigned char> s = grouped_state(ctx_, other.get());
    EXPECT_TRUE(lt::IsError(te_grouped_linear_state_load(ctx_, g_.get(), s.data(), s.size()), TE_ERROR_INVALID_ARGUMENT,
                            fn, "buf"));
  }
  EXPECT_TRUE(lt::IsError(te_grouped_linear_state_load(ctx_, g_.get(), before.data(), before.size() - 1),
                          TE_ERROR_INVALID_ARGUMENT, fn, "buf"));
  std::vector<unsigned char> longer = before;
  longer.push_back(0);
  EXPECT_TRUE(lt::IsError(te_grouped_linear_state_load(ctx_, g_.get(), longer.data(), longer.size()),
                          TE_ERROR_INVALID_ARGUMENT, fn, "size"));
  // A corrupt scale in the last expert's grad_output state: refused, and the message names it.
  std::vector<unsigned char> corrupt = before;
  {
    // Walk to the last state: header, then per state (len, dtype, scale, scale_inv, history).
    size_t off = 4 + 4 + 3 * 8, last = 0;
    for (int s = 0; s < 3 * kN; ++s) {
      last = off;
      int32_t len;
      std::memcpy(&len, corrupt.data() + off, 4);
      off += 16 + 4 * static_cast<size_t>(len);
    }
    const float bad = -1.0f;
    std::memcpy(corrupt.data() + last + 8, &bad, 4);
  }
  EXPECT_TRUE(lt::IsError(te_grouped_linear_state_load(ctx_, g_.get(), corrupt.data(), corrupt.size()),
                          TE_ERROR_INVALID_ARGUMENT, fn, "buf"));
  EXPECT_NE(lt::last_error().find("expert 3 grad_output"), std::string::npos) << lt::last_error();
  EXPECT_EQ(grouped_state(ctx_, g_.get()), before);
  // While a pass holds the states: INVALID_STATE.
  {
    te_grouped_linear_forward_args fa = forward_args(x_, splits_, p_, 1);
    te_grouped_linear_backward_ctx *b = nullptr;
    lt::AutocastScope scope(ctx_, recipe_.get());
    ASSERT_TE_OK(te_grouped_linear_forward(ctx_, g_.get(), &fa, y.get(), &b));
    GroupedBwdPtr hold(b);
    EXPECT_TRUE(lt::IsError(te_grouped_linear_state_load(ctx_, g_.get(), before.data(), before.size()),
                            TE_ERROR_INVALID_STATE, fn, "g"));
  }
}

// The most experts the header allows, in high precision and FP8. Counts 1..80 (every seventh
// expert empty): in high precision each count is its own scratch block size, more than one
// ScratchPlan holds, so the scratch is reserved in rounds.
TEST_F(GroupedLinearTest, MaxGemms) {
  const int n = TE_GROUPED_LINEAR_MAX_GEMMS;
  GroupedPtr g = make_grouped(ctx_, n, 16, 16, 0, TE_DTYPE_BF16);
  ASSERT_TRUE(g);
  Params p(n, 16, 16, TE_DTYPE_BF16, 7);
  std::vector<int64_t> splits(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) splits[static_cast<size_t>(i)] = i % 7 == 3 ? 0 : 1 + (i * 37) % 80;
  const int64_t tokens = total(splits);
  HostTensor x = lt::random_tensor(TE_DTYPE_BF16, {tokens, 16}, -1.0f, 1.0f, 9);
  HostTensor dy = lt::random_tensor(TE_DTYPE_BF16, {tokens, 16}, -1.0f, 1.0f, 10);
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "FP8" : "high precision");
    te_grouped_linear_forward_args fa = forward_args(x, splits, p, 0);
    HostTensor y(TE_DTYPE_BF16, {tokens, 16});
    te_grouped_linear_backward_ctx *b = nullptr;
    {
      MaybeScope scope(ctx_, fp8 ? recipe_.get() : nullptr);
      ASSERT_TE_OK(te_grouped_linear_forward(ctx_, g.get(), &fa, y.get(), &b));
    }
    GroupedBwdPtr hold(b);
    Grads gr(n, tokens, 16, 16, TE_DTYPE_BF16, TE_DTYPE_BF16);
    ASSERT_TE_OK(te_grouped_linear_backward(ctx_, b, dy.get(), gr.dx.get(), gr.dwp.data(), nullptr, nullptr));
    for (unsigned char byte : gr.dw[3].bytes) ASSERT_EQ(byte, 0);
    if (fp8) continue;
    // The last experts (after every round of reserving) against the fp64 reference.
    int64_t row0 = tokens;
    for (int i = n - 1; i >= n - 8; --i) {
      const int64_t m = splits[static_cast<size_t>(i)];
      row0 -= m;
      if (m == 0) continue;
      const std::vector<float> xv = rows_of(x, row0, m).values_f32(), wv = p.w[i].values_f32();
      EXPECT_TRUE(close_rows(y, row0, lt::ref_gemm_nt(lt::to_double(xv), lt::to_double(wv), m, 16, 16), "y", i));
    }
  }
  // An odd-sized BF16 weight (in = out = 1 are fine outside FP8) of an empty expert is zeroed
  // to the last byte, whatever the alignment of the caller's tensor.
  GroupedPtr odd = make_grouped(ctx_, 2, 3, 5, 1, TE_DTYPE_BF16);
  Params po(2, 3, 5, TE_DTYPE_BF16, 3);
  HostTensor xo = lt::random_tensor(TE_DTYPE_BF16, {4, 3}, -1.0f, 1.0f, 1);
  HostTensor dyo = lt::random_tensor(TE_DTYPE_BF16, {4, 5}, -1.0f, 1.0f, 2);
  const std::vector<int64_t> so{4, 0};
  te_grouped_linear_forward_args fo = forward_args(xo, so, po, 1);
  HostTensor yo(TE_DTYPE_BF16, {4, 5});
  te_grouped_linear_backward_ctx *bo = nullptr;
  ASSERT_TE_OK(te_grouped_linear_forward(ctx_, odd.get(), &fo, yo.get(), &bo));
  GroupedBwdPtr hold(bo);
  std::vector<unsigned char> storage(2 + 2 * 15 + 2 + 2 * 5, 0xA5);
  te_tensor dw0 = *po.w[0].get(), dw1 = dw0, db0 = *po.b[0].get(), db1 = db0;
  std::vector<unsigned char> dw0s(30, 0xA5), db0s(10, 0xA5);
  dw0.data = dw0s.data();
  db0.data = db0s.data();
  dw1.data = storage.data() + 2;  // 2 bytes off a float: a ragged head and tail
  db1.data = storage.data() + 2 + 30 + 2;
  te_tensor *dws[2] = {&dw0, &dw1}, *dbs[2] = {&db0, &db1};
  ASSERT_TE_OK(te_grouped_linear_backward(ctx_, bo, dyo.get(), nullptr, dws, dbs, nullptr));
  for (size_t i = 0; i < storage.size(); ++i) {
    const bool inside = (i >= 2 && i < 32) || (i >= 34 && i < 44);
    EXPECT_EQ(storage[i], inside ? 0 : 0xA5) << i;
  }
}

TEST_F(GroupedLinearTest, Fp8FeaturesMustBeMultiplesOf16ButTokensNeedNot) {
  GroupedPtr g = make_grouped(ctx_, 2, 24, 16, 1, TE_DTYPE_F32);
  Params p(2, 24, 16, TE_DTYPE_F32, 1);
  HostTensor x = lt::random_tensor(TE_DTYPE_F32, {7, 24}, -1.0f, 1.0f, 1);
  const std::vector<int64_t> splits{3, 4};
  te_grouped_linear_forward_args fa = forward_args(x, splits, p, 1);
  HostTensor y = lt::make_tensor(TE_DTYPE_F32, {7, 16});
  const HostTensor y0 = y;
  te_grouped_linear_backward_ctx *b = nullptr;
  {
    lt::AutocastScope scope(ctx_, recipe_.get());
    EXPECT_TRUE(lt::IsError(te_grouped_linear_forward(ctx_, g.get(), &fa, y.get(), &b), TE_ERROR_UNSUPPORTED,
                            "te_grouped_linear_forward", "g"));
  }
  EXPECT_EQ(b, nullptr);
  EXPECT_TRUE(lt::same_contents(y, y0));
  // Outside FP8 the same call computes.
  ASSERT_TE_OK(te_grouped_linear_forward(ctx_, g.get(), &fa, y.get(), &b));
  te_grouped_linear_backward_ctx_destroy(b);
}

// ---- 4. bad input: status, message, nothing changed ------------------------------------------

class GroupedLinearBadInput : public GroupedLinearTest {
 protected:
  // Runs `call`, which must fail with `status` naming fn and arg, and checks that y, every
  // gradient and the layer's state are untouched.
  void expect_fail(te_status status, const char *fn, const char *arg, const std::function<te_status()> &call) {
    const std::vector<unsigned char> state = grouped_state(ctx_, g_.get());
    const HostTensor y0 = y_, dx0 = gr_.dx, dw0 = gr_.dw[0], db0 = gr_.db[0];
    const te_autocast_state ac = lt::autocast_state(ctx_);
    lt::prime_last_error(fn);
    EXPECT_TRUE(lt::IsError(call(), status, fn, arg)) << "argument " << (arg ? arg : "-");
    EXPECT_TRUE(lt::same_contents(y_, y0)) << arg;
    EXPECT_TRUE(lt::same_contents(gr_.dx, dx0)) << arg;
    EXPECT_TRUE(lt::same_contents(gr_.dw[0], dw0)) << arg;
    EXPECT_TRUE(lt::same_contents(gr_.db[0], db0)) << arg;
    EXPECT_EQ(grouped_state(ctx_, g_.get()), state) << arg;
    EXPECT_EQ(lt::autocast_state(ctx_).depth, ac.depth);
  }
  HostTensor y_ = lt::make_tensor(TE_DTYPE_F32, {32, kOut});
  Grads gr_{kN, 32, kIn, kOut, TE_DTYPE_F32, TE_DTYPE_F32};
};

TEST_F(GroupedLinearBadInput, Create) {
  const char *fn = "te_grouped_linear_create";
  te_grouped_linear *out = reinterpret_cast<te_grouped_linear *>(0x1);
  te_grouped_linear_options o = grouped_options(kN, kIn, kOut, 1, TE_DTYPE_F32);
  auto with = [&](const char *arg, te_grouped_linear_options bad) {
    expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, arg, [&] { return te_grouped_linear_create(&out, ctx_, &bad); });
    EXPECT_EQ(out, reinterpret_cast<te_grouped_linear *>(0x1));
  };
  expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "out", [&] { return te_grouped_linear_create(nullptr, ctx_, &o); });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "ctx", [&] { return te_grouped_linear_create(&out, nullptr, &o); });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "opts", [&] { return te_grouped_linear_create(&out, ctx_, nullptr); });
  te_grouped_linear_options b = o;
  b.struct_size = sizeof b - 1;
  with("opts", b);
  for (int32_t n : {0, -1, TE_GROUPED_LINEAR_MAX_GEMMS + 1}) {
    b = o;
    b.num_gemms = n;
    with("opts->num_gemms", b);
  }
  b = o;
  b.in_features = 0;
  with("opts->in_features", b);
  b = o;
  b.out_features = -3;
  with("opts->out_features", b);
  b = o;
  b.in_features = b.out_features = int64_t{1} << 31;
  with("opts", b);
  b = o;
  b.bias = 2;
  with("opts->bias", b);
  b = o;
  b.fuse_wgrad_accumulation = -1;
  with("opts->fuse_wgrad_accumulation", b);
  b = o;
  b.activation_dtype = TE_DTYPE_E4M3;
  with("opts->activation_dtype", b);
  b = o;
  b.activation_dtype = static_cast<te_dtype>(77);
  with("opts->activation_dtype", b);
  expect_fail(TE_ERROR_INVALID_ARGUMENT, "te_grouped_linear_options_init", "opts",
              [&] { return te_grouped_linear_options_init(nullptr); });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, "te_grouped_linear_forward_args_init", "args",
              [&] { return te_grouped_linear_forward_args_init(nullptr); });
  te_grouped_linear_destroy(nullptr);
  te_grouped_linear_backward_ctx_destroy(nullptr);
}

TEST_F(GroupedLinearBadInput, Forward) {
  for (int variant = 0; variant < 2; ++variant) {  // forward_compute, forward
    const char *fn = variant ? "te_grouped_linear_forward" : "te_grouped_linear_forward_compute";
    SCOPED_TRACE(fn);
    auto call = [&](te_context *ctx, te_grouped_linear *g, const te_grouped_linear_forward_args *a, te_tensor *y) {
      if (variant) {
        te_grouped_linear_backward_ctx *out = nullptr;
        te_status s = te_grouped_linear_forward(ctx, g, a, y, &out);
        if (s == TE_SUCCESS) te_grouped_linear_backward_ctx_destroy(out);
        else EXPECT_EQ(out, nullptr);
        return s;
      }
      te_grouped_linear_residuals r;
      std::memset(&r, 0x3C, sizeof r);
      r.struct_size = sizeof r;
      const te_grouped_linear_residuals before = r;
      te_status s = te_grouped_linear_forward_compute(ctx, g, a, y, &r);
      if (s == TE_SUCCESS) te_grouped_linear_residuals_release(&r);
      else EXPECT_EQ(std::memcmp(&r, &before, sizeof r), 0) << "residuals written on failure";
      return s;
    };
    // In an FP8 scope, so that a failure must also leave the pass untouched.
    lt::AutocastScope scope(ctx_, recipe_.get());
    auto bad = [&](const char *arg, const std::function<void(te_grouped_linear_forward_args &, std::vector<int64_t> &,
                                                             Params &, HostTensor &, HostTensor &)> &mutate,
                   te_status status = TE_ERROR_INVALID_ARGUMENT) {
      std::vector<int64_t> splits = splits_;
      Params p = p_;
      p.bind();
      HostTensor x = x_, y = y_;
      te_grouped_linear_forward_args a = forward_args(x, splits, p, 1);
      mutate(a, splits, p, x, y);
      const HostTensor y0 = y;
      expect_fail(status, fn, arg, [&] { return call(ctx_, g_.get(), &a, y.get()); });
      EXPECT_TRUE(lt::same_contents(y, y0)) << arg;
    };
    using A = te_grouped_linear_forward_args;
    using S = std::vector<int64_t>;
    bad("args", [](A &a, S &, Params &, HostTensor &, HostTensor &) { a.struct_size = 4; });
    bad("args->weight_unchanged", [](A &a, S &, Params &, HostTensor &, HostTensor &) { a.weight_unchanged = 3; });
    bad("args->input", [](A &a, S &, Params &, HostTensor &, HostTensor &) { a.input = nullptr; });
    bad("args->input", [](A &, S &, Params &, HostTensor &x, HostTensor &) { x.t.dtype = TE_DTYPE_BF16; });
    bad("args->input", [](A &, S &, Params &, HostTensor &x, HostTensor &) { x.reshape({16, 2 * kIn}); });
    bad("args->m_splits", [](A &a, S &, Params &, HostTensor &, HostTensor &) { a.m_splits = nullptr; });
    bad("args->m_splits", [](A &, S &s, Params &, HostTensor &, HostTensor &) { s[2] += 1; });
    bad("args->m_splits", [](A &, S &s, Params &, HostTensor &, HostTensor &) { s[0] -= 1; });
    bad("args->m_splits[1]", [](A &, S &s, Params &, HostTensor &, HostTensor &) { s[1] = -2; s[2] += 2; });
    bad("args->m_splits", [](A &, S &s, Params &, HostTensor &, HostTensor &) { s[0] = INT64_MAX; s[3] = INT64_MAX; });
    bad("args->weights", [](A &a, S &, Params &, HostTensor &, HostTensor &) { a.weights = nullptr; });
    bad("args->weights[2]", [](A &, S &, Params &p, HostTensor &, HostTensor &) { p.wp[2] = nullptr; });
    bad("args->weights[3]", [](A &, S &, Params &p, HostTensor &, HostTensor &) { p.w[3].t.dtype = TE_DTYPE_F16; });
    bad("args->weights[1]", [](A &, S &, Params &p, HostTensor &, HostTensor &) { p.w[1].reshape({kIn, kOut}); });
    bad("args->weights[0]", [](A &, S &, Params &p, HostTensor &, HostTensor &) { p.w[0].t.shape[0] = -1; });
    bad("args->weights[1]", [](A &, S &, Params &p, HostTensor &, HostTensor &) { p.w[1].t.device.type = TE_DEVICE_CUDA; });
    bad("args->biases", [](A &a, S &, Params &, HostTensor &, HostTensor &) { a.biases = nullptr; });
    bad("args->biases[0]", [](A &, S &, Params &p, HostTensor &, HostTensor &) { p.bp[0] = nullptr; });
    bad("args->biases[3]", [](A &, S &, Params &p, HostTensor &, HostTensor &) { p.b[3].reshape({1, kOut}); });
    bad("args->biases[2]", [](A &, S &, Params &p, HostTensor &, HostTensor &) { p.b[2].t.data = nullptr; });
    bad("y", [](A &, S &, Params &, HostTensor &, HostTensor &y) { y.t.dtype = TE_DTYPE_BF16; });
    bad("y", [](A &, S &, Params &, HostTensor &, HostTensor &y) { y.reshape({16, 2 * kOut}); });
    expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "args", [&] { return call(ctx_, g_.get(), nullptr, y_.get()); });
    te_grouped_linear_forward_args a = forward_args(x_, splits_, p_, 1);
    expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "y", [&] { return call(ctx_, g_.get(), &a, nullptr); });
    expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "ctx", [&] { return call(nullptr, g_.get(), &a, y_.get()); });
    expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "g", [&] { return call(ctx_, nullptr, &a, y_.get()); });
    // Handles of the wrong type, destroyed ones, and a layer of another context.
    lt::LinearPtr lin = lt::make_linear(ctx_, kIn, kOut);
    expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "g",
                [&] { return call(ctx_, reinterpret_cast<te_grouped_linear *>(lin.get()), &a, y_.get()); });
    expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "ctx",
                [&] { return call(reinterpret_cast<te_context *>(g_.get()), g_.get(), &a, y_.get()); });
    te_grouped_linear *dead = make_grouped(ctx_, kN, kIn, kOut, 1, TE_DTYPE_F32).release();
    te_grouped_linear_destroy(dead);
    expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "g", [&] { return call(ctx_, dead, &a, y_.get()); });
    lt::ContextPtr other = lt::make_cpu_context();
    GroupedPtr foreign = make_grouped(other.get(), kN, kIn, kOut, 1, TE_DTYPE_F32);
    expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "g", [&] { return call(ctx_, foreign.get(), &a, y_.get()); });
  }
  // A layer without bias refuses biases.
  GroupedPtr nb = make_grouped(ctx_, kN, kIn, kOut, 0, TE_DTYPE_F32);
  te_grouped_linear_forward_args a = forward_args(x_, splits_, p_, 1);
  te_grouped_linear_backward_ctx *out = nullptr;
  EXPECT_TRUE(lt::IsError(te_grouped_linear_forward(ctx_, nb.get(), &a, y_.get(), &out), TE_ERROR_INVALID_ARGUMENT,
                          "te_grouped_linear_forward", "args->biases"));
  EXPECT_TRUE(lt::IsError(te_grouped_linear_forward(ctx_, nb.get(), &a, y_.get(), nullptr), TE_ERROR_INVALID_ARGUMENT,
                          "te_grouped_linear_forward", "out"));
  te_grouped_linear_forward_args ok = forward_args(x_, splits_, p_, 1);
  EXPECT_TRUE(lt::IsError(te_grouped_linear_forward_compute(ctx_, g_.get(), &ok, y_.get(), nullptr),
                          TE_ERROR_INVALID_ARGUMENT, "te_grouped_linear_forward_compute", "residuals"));
}

TEST_F(GroupedLinearBadInput, Backward) {
  const char *fn = "te_grouped_linear_backward";
  HostTensor y(TE_DTYPE_F32, {32, kOut});
  GroupedBwdPtr b(forward(x_, splits_, y));
  GroupedPtr nb = make_grouped(ctx_, kN, kIn, kOut, 0, TE_DTYPE_F32);
  Params pnb = p_;
  pnb.bind();
  te_grouped_linear_forward_args fa = forward_args(x_, splits_, pnb, 0);
  te_grouped_linear_backward_ctx *nb_raw = nullptr;
  ASSERT_TE_OK(te_grouped_linear_forward(ctx_, nb.get(), &fa, y.get(), &nb_raw));
  GroupedBwdPtr nbb(nb_raw);
  auto bad = [&](te_status status, const char *arg,
                 const std::function<void(HostTensor &dy, Grads &g, te_linear_backward_args &a)> &mutate,
                 te_grouped_linear_backward_ctx *ctx_b = nullptr) {
    HostTensor dy = dy_;
    Grads g = gr_;
    g.bind();
    te_linear_backward_args a = backward_flags(0);
    mutate(dy, g, a);
    const Grads before = g;
    expect_fail(status, fn, arg, [&] {
      return te_grouped_linear_backward(ctx_, ctx_b ? ctx_b : b.get(), dy.get(), g.dx.get(), g.dwp.data(),
                                        g.dbp.data(), &a);
    });
    EXPECT_TRUE(lt::same_contents(g.dx, before.dx)) << arg;
    for (int i = 0; i < kN; ++i) {
      EXPECT_TRUE(lt::same_contents(g.dw[i], before.dw[i])) << arg << " dw " << i;
      EXPECT_TRUE(lt::same_contents(g.db[i], before.db[i])) << arg << " db " << i;
    }
  };
  using G = Grads;
  using A = te_linear_backward_args;
  bad(TE_ERROR_INVALID_ARGUMENT, "args", [](HostTensor &, G &, A &a) { a.struct_size = 0; });
  bad(TE_ERROR_INVALID_ARGUMENT, "args->flags", [](HostTensor &, G &, A &a) { a.flags = 4; });
  bad(TE_ERROR_INVALID_ARGUMENT, "dy", [](HostTensor &dy, G &, A &) { dy.t.dtype = TE_DTYPE_BF16; });
  bad(TE_ERROR_INVALID_ARGUMENT, "dy", [](HostTensor &dy, G &, A &) { dy.reshape({16, 2 * kOut}); });
  bad(TE_ERROR_INVALID_ARGUMENT, "dy", [](HostTensor &dy, G &, A &) { dy.t.ndim = 0; });
  bad(TE_ERROR_INVALID_ARGUMENT, "dx", [](HostTensor &, G &g, A &) { g.dx.reshape({64, kIn / 2}); });
  bad(TE_ERROR_INVALID_ARGUMENT, "dx", [](HostTensor &, G &g, A &) { g.dx.t.dtype = TE_DTYPE_F16; });
  bad(TE_ERROR_INVALID_ARGUMENT, "dw[2]", [](HostTensor &, G &g, A &) { g.dwp[2] = nullptr; });
  bad(TE_ERROR_INVALID_ARGUMENT, "dw[1]", [](HostTensor &, G &g, A &) { g.dw[1].reshape({kIn, kOut}); });
  bad(TE_ERROR_INVALID_ARGUMENT, "dw[3]", [](HostTensor &, G &g, A &) { g.dw[3].t.dtype = TE_DTYPE_BF16; });
  bad(TE_ERROR_INVALID_ARGUMENT, "db[0]", [](HostTensor &, G &g, A &) { g.db[0].reshape({1, kOut}); });
  bad(TE_ERROR_INVALID_ARGUMENT, "db[3]", [](HostTensor &, G &g, A &) { g.dbp[3] = nullptr; });
  bad(TE_ERROR_INVALID_ARGUMENT, "db", [](HostTensor &, G &, A &) {}, nb_raw);
  expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "dy", [&] {
    return te_grouped_linear_backward(ctx_, b.get(), nullptr, gr_.dx.get(), gr_.dwp.data(), gr_.dbp.data(), nullptr);
  });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "bwd", [&] {
    return te_grouped_linear_backward(ctx_, nullptr, dy_.get(), gr_.dx.get(), gr_.dwp.data(), gr_.dbp.data(), nullptr);
  });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "ctx", [&] {
    return te_grouped_linear_backward(nullptr, b.get(), dy_.get(), gr_.dx.get(), gr_.dwp.data(), gr_.dbp.data(), nullptr);
  });
  // A te_linear backward context is not a grouped one.
  lt::LinearPtr lin = lt::make_linear(ctx_, kIn, kOut, 1, TE_DTYPE_F32);
  HostTensor lx = lt::random_tensor(TE_DTYPE_F32, {16, kIn}, -1, 1, 3), ly(TE_DTYPE_F32, {16, kOut});
  te_linear_forward_args la;
  te_linear_forward_args_init(&la);
  la.input = lx.get();
  la.weight = p_.w[0].get();
  la.bias = p_.b[0].get();
  te_linear_backward_ctx *lb = nullptr;
  ASSERT_TE_OK(te_linear_forward(ctx_, lin.get(), &la, ly.get(), &lb));
  lt::BackwardPtr lhold(lb);
  expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "bwd", [&] {
    return te_grouped_linear_backward(ctx_, reinterpret_cast<te_grouped_linear_backward_ctx *>(lb), dy_.get(),
                                      gr_.dx.get(), gr_.dwp.data(), gr_.dbp.data(), nullptr);
  });
  // Another context; a destroyed backward context.
  lt::ContextPtr other = lt::make_cpu_context();
  expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "bwd", [&] {
    return te_grouped_linear_backward(other.get(), b.get(), dy_.get(), gr_.dx.get(), gr_.dwp.data(), gr_.dbp.data(),
                                      nullptr);
  });
  te_grouped_linear_backward_ctx *dead = b.release();
  te_grouped_linear_backward_ctx_destroy(dead);
  te_grouped_linear_backward_ctx_destroy(dead);  // a no-op
  expect_fail(TE_ERROR_INVALID_ARGUMENT, fn, "bwd", [&] {
    return te_grouped_linear_backward(ctx_, dead, dy_.get(), gr_.dx.get(), gr_.dwp.data(), gr_.dbp.data(), nullptr);
  });
  // fuse_wgrad_accumulation wants F32 main_grads even for a BF16 layer.
  GroupedPtr fused = make_grouped(ctx_, kN, kIn, kOut, 1, TE_DTYPE_BF16, 1);
  Params pb(kN, kIn, kOut, TE_DTYPE_BF16, 2);
  HostTensor xb = lt::random_tensor(TE_DTYPE_BF16, {32, kIn}, -1, 1, 3), yb(TE_DTYPE_BF16, {32, kOut});
  HostTensor dyb = lt::random_tensor(TE_DTYPE_BF16, {32, kOut}, -1, 1, 4);
  te_grouped_linear_forward_args fb = forward_args(xb, splits_, pb, 1);
  te_grouped_linear_backward_ctx *fbw = nullptr;
  ASSERT_TE_OK(te_grouped_linear_forward(ctx_, fused.get(), &fb, yb.get(), &fbw));
  GroupedBwdPtr fhold(fbw);
  Grads wrong(kN, 32, kIn, kOut, TE_DTYPE_BF16, TE_DTYPE_BF16);
  EXPECT_TRUE(lt::IsError(te_grouped_linear_backward(ctx_, fbw, dyb.get(), nullptr, wrong.dwp.data(), nullptr, nullptr),
                          TE_ERROR_INVALID_ARGUMENT, fn, "dw[0]"));
}

TEST_F(GroupedLinearBadInput, SaveQueryAndState) {
  te_grouped_linear_backward_ctx *out = sentinel<te_grouped_linear_backward_ctx>();
  te_grouped_linear_residuals none;
  std::memset(&none, 0, sizeof none);
  none.struct_size = sizeof none;
  const char *save = "te_grouped_linear_forward_save";
  expect_fail(TE_ERROR_INVALID_ARGUMENT, save, "residuals",
              [&] { return te_grouped_linear_forward_save(ctx_, g_.get(), &none, &out); });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, save, "residuals",
              [&] { return te_grouped_linear_forward_save(ctx_, g_.get(), nullptr, &out); });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, save, "out",
              [&] { return te_grouped_linear_forward_save(ctx_, g_.get(), &none, nullptr); });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, save, "g", [&] { return te_grouped_linear_forward_save(ctx_, nullptr, &none, &out); });
  none.internal = g_.get();  // a live handle of another type
  expect_fail(TE_ERROR_INVALID_ARGUMENT, save, "residuals",
              [&] { return te_grouped_linear_forward_save(ctx_, g_.get(), &none, &out); });
  EXPECT_EQ(out, sentinel<te_grouped_linear_backward_ctx>());

  const char *get = "te_grouped_linear_get_scaling_state";
  te_scaling_state_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  for (int32_t e : {-1, kN})
    expect_fail(TE_ERROR_INVALID_ARGUMENT, get, "expert",
                [&] { return te_grouped_linear_get_scaling_state(ctx_, g_.get(), e, TE_ROLE_INPUT, &info, nullptr, 0); });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, get, "role", [&] {
    return te_grouped_linear_get_scaling_state(ctx_, g_.get(), 0, static_cast<te_tensor_role>(3), &info, nullptr, 0);
  });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, get, "info",
              [&] { return te_grouped_linear_get_scaling_state(ctx_, g_.get(), 0, TE_ROLE_INPUT, nullptr, nullptr, 0); });
  lt::LinearPtr lin = lt::make_linear(ctx_, kIn, kOut);
  expect_fail(TE_ERROR_INVALID_ARGUMENT, get, "g", [&] {
    return te_grouped_linear_get_scaling_state(ctx_, reinterpret_cast<te_grouped_linear *>(lin.get()), 0, TE_ROLE_INPUT,
                                               &info, nullptr, 0);
  });
  ASSERT_TE_OK(te_grouped_linear_get_scaling_state(ctx_, g_.get(), kN - 1, TE_ROLE_GRAD_OUTPUT, &info, nullptr, 0));
  EXPECT_EQ(info.amax_history_len, 0);
  EXPECT_EQ(info.scale, 1.0f);
  EXPECT_EQ(info.fp8_dtype, TE_DTYPE_E4M3);

  size_t size = 0;
  expect_fail(TE_ERROR_INVALID_ARGUMENT, "te_grouped_linear_state_save", "size",
              [&] { return te_grouped_linear_state_save(ctx_, g_.get(), nullptr, 0, nullptr); });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, "te_grouped_linear_state_save", "g",
              [&] { return te_grouped_linear_state_save(ctx_, nullptr, nullptr, 0, &size); });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, "te_grouped_linear_state_load", "buf",
              [&] { return te_grouped_linear_state_load(ctx_, g_.get(), nullptr, 16); });
  const std::vector<unsigned char> s = grouped_state(ctx_, g_.get());
  expect_fail(TE_ERROR_INVALID_ARGUMENT, "te_grouped_linear_state_load", "g", [&] {
    return te_grouped_linear_state_load(ctx_, reinterpret_cast<te_grouped_linear *>(lin.get()), s.data(), s.size());
  });
  expect_fail(TE_ERROR_INVALID_ARGUMENT, "te_grouped_linear_state_load", "ctx",
              [&] { return te_grouped_linear_state_load(nullptr, g_.get(), s.data(), s.size()); });
}

}  // namespace
