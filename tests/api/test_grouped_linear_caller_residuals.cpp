// te_grouped_linear's residuals in the caller's memory (residuals_size, forward_compute_into,
// backward_from): bitwise the same outputs, gradients and FP8 state as the opaque path over
// several steps for the three recipes and high precision, with m_splits holding an expert without
// tokens and ones that are not multiples of 16; exact shape-only sizes; bad memory and bad inputs
// are errors that change nothing; TE_BACKWARD_ONCE drops the record.
#include "caller_residuals_test_util.h"
#include "layernorm_modules_test_util.h"

namespace lt = te_test;
using lt::HostTensor;
using lt::Mode;

namespace {

constexpr int kN = 4;
constexpr int64_t kIn = 64, kOut = 48;
const int64_t kSplits[kN] = {20, 0, 16, 13};  // 49 rows: an empty expert, two padded ones
constexpr int64_t kTokens = 49;

struct GroupedDeleter {
  void operator()(te_grouped_linear *g) const { te_grouped_linear_destroy(g); }
};
struct GroupedBwdDeleter {
  void operator()(te_grouped_linear_backward_ctx *b) const { te_grouped_linear_backward_ctx_destroy(b); }
};
using GroupedPtr = std::unique_ptr<te_grouped_linear, GroupedDeleter>;
using GroupedBwdPtr = std::unique_ptr<te_grouped_linear_backward_ctx, GroupedBwdDeleter>;

GroupedPtr make_grouped(te_context *ctx) {
  te_grouped_linear_options o;
  EXPECT_TE_OK(te_grouped_linear_options_init(&o));
  o.num_gemms = kN;
  o.in_features = kIn;
  o.out_features = kOut;
  o.bias = 1;
  o.activation_dtype = TE_DTYPE_BF16;
  te_grouped_linear *g = nullptr;
  EXPECT_TE_OK(te_grouped_linear_create(&g, ctx, &o));
  return GroupedPtr(g);
}

std::vector<unsigned char> state_of(te_context *ctx, const te_grouped_linear *g) {
  size_t size = 0;
  EXPECT_TE_OK(te_grouped_linear_state_save(ctx, g, nullptr, 0, &size));
  std::vector<unsigned char> buf(size);
  EXPECT_TE_OK(te_grouped_linear_state_save(ctx, g, buf.data(), buf.size(), &size));
  return buf;
}

struct Data {
  HostTensor x, dy;
  std::vector<HostTensor> w, b;
  std::vector<const te_tensor *> wp, bp;
  std::vector<int64_t> splits{kSplits, kSplits + kN};
  explicit Data(uint32_t seed)
      : x(lt::random_tensor(TE_DTYPE_BF16, {kTokens, kIn}, -2.0f, 2.0f, seed + 1)),
        dy(lt::random_tensor(TE_DTYPE_BF16, {kTokens, kOut}, -0.5f, 0.5f, seed + 2)) {
    for (int i = 0; i < kN; ++i) {
      w.push_back(lt::random_tensor(TE_DTYPE_BF16, {kOut, kIn}, -0.3f, 0.3f, seed + 10 + i));
      b.push_back(lt::random_tensor(TE_DTYPE_BF16, {kOut}, -1.0f, 1.0f, seed + 20 + i));
    }
  }
  Data(const Data &o) : x(o.x), dy(o.dy), w(o.w), b(o.b), splits(o.splits) {}
  te_grouped_linear_forward_args args() {
    wp.clear();
    bp.clear();
    for (int i = 0; i < kN; ++i) {
      wp.push_back(w[i].get());
      bp.push_back(b[i].get());
    }
    te_grouped_linear_forward_args a;
    EXPECT_TE_OK(te_grouped_linear_forward_args_init(&a));
    a.input = x.get();
    a.m_splits = splits.data();
    a.weights = wp.data();
    a.biases = bp.data();
    return a;
  }
  void scribble() {
    x.fill_byte(0x7F);
    for (auto &t : w) t.fill_byte(0x7F);
  }
};

struct Grads {
  HostTensor dx = lt::make_tensor(TE_DTYPE_BF16, {kTokens, kIn});
  std::vector<HostTensor> dw, db;
  std::vector<te_tensor *> dwp, dbp;
  Grads() {
    for (int i = 0; i < kN; ++i) {
      dw.push_back(lt::make_tensor(TE_DTYPE_BF16, {kOut, kIn}));
      db.push_back(lt::make_tensor(TE_DTYPE_BF16, {kOut}));
    }
    for (int i = 0; i < kN; ++i) {
      dwp.push_back(dw[i].get());
      dbp.push_back(db[i].get());
    }
  }
  bool operator==(const Grads &o) const {
    bool same = lt::bitwise_equal(dx, o.dx);
    for (int i = 0; i < kN; ++i) same = same && lt::bitwise_equal(dw[i], o.dw[i]) && lt::bitwise_equal(db[i], o.db[i]);
    return same;
  }
};

class GroupedCallerResiduals : public ::testing::TestWithParam<Mode> {};

TEST_P(GroupedCallerResiduals, SameAsOpaquePathOverSteps) {
  const Mode mode = GetParam();
  const bool fp8 = lt::is_fp8_mode(mode);
  lt::ContextPtr ctx_a = lt::make_cpu_context(), ctx_c = lt::make_cpu_context();
  lt::RecipePtr r = lt::recipe_for(mode);
  GroupedPtr a = make_grouped(ctx_a.get()), c = make_grouped(ctx_c.get());
  std::unique_ptr<lt::Block> pending;
  for (int step = 0; step < 3; ++step) {
    Data d(10 * step + 1), dc(d);
    te_grouped_linear_forward_args fa = d.args(), fc = dc.args();
    HostTensor ya = lt::make_tensor(TE_DTYPE_BF16, {kTokens, kOut}), yc = ya;
    te_grouped_linear_backward_ctx *bwd = nullptr;
    std::unique_ptr<lt::Block> block;
    {
      auto sa = lt::scope_for(ctx_a.get(), mode, r.get()), sc = lt::scope_for(ctx_c.get(), mode, r.get());
      size_t need = 1;
      ASSERT_TE_OK(te_grouped_linear_residuals_size(ctx_c.get(), c.get(), &fc, &need));
      if (fp8)
        EXPECT_GT(need, static_cast<size_t>(kIn * 64));
      else
        EXPECT_EQ(need, 0u);
      block.reset(new lt::Block(need));
      ASSERT_TE_OK(te_grouped_linear_forward(ctx_a.get(), a.get(), &fa, ya.get(), &bwd));
      ASSERT_TE_OK(te_grouped_linear_forward_compute_into(ctx_c.get(), c.get(), &fc, yc.get(), block->p,
                                                          block->bytes));
    }
    GroupedBwdPtr keep(bwd);
    EXPECT_TRUE(lt::bitwise_equal(ya, yc)) << "step " << step << ": y";
    EXPECT_TRUE(lt::SameBytes(state_of(ctx_a.get(), a.get()), state_of(ctx_c.get(), c.get()))) << "after forward";
    Data moved(dc);  // the same values at other addresses; the forward's are overwritten
    dc.scribble();
    te_grouped_linear_forward_args fm = moved.args();
    Grads ga, ga2, gc, gc2;
    const te_linear_backward_args none = lt::backward_flags(0), once = lt::backward_flags(TE_BACKWARD_ONCE);
    ASSERT_TE_OK(te_grouped_linear_backward(ctx_a.get(), bwd, moved.dy.get(), ga.dx.get(), ga.dwp.data(),
                                            ga.dbp.data(), &none));
    ASSERT_TE_OK(te_grouped_linear_backward(ctx_a.get(), bwd, moved.dy.get(), ga2.dx.get(), ga2.dwp.data(),
                                            ga2.dbp.data(), &once));
    ASSERT_TE_OK(te_grouped_linear_backward_from(ctx_c.get(), c.get(), &fm, block->p, block->bytes, moved.dy.get(),
                                                 gc.dx.get(), gc.dwp.data(), gc.dbp.data(), &none));
    // FP8 needs no inputs.
    ASSERT_TE_OK(te_grouped_linear_backward_from(ctx_c.get(), c.get(), fp8 ? nullptr : &fm, block->p, block->bytes,
                                                 moved.dy.get(), gc2.dx.get(), gc2.dwp.data(), gc2.dbp.data(),
                                                 &once));
    EXPECT_TRUE(ga == gc) << "step " << step;
    EXPECT_TRUE(ga2 == gc2) << "step " << step;
    EXPECT_TRUE(ga == ga2) << "step " << step;
    EXPECT_TRUE(lt::SameBytes(state_of(ctx_a.get(), a.get()), state_of(ctx_c.get(), c.get()))) << "after backward";
    if (fp8) {
      EXPECT_EQ(te_grouped_linear_backward_from(ctx_c.get(), c.get(), &fm, block->p, block->bytes, moved.dy.get(),
                                                gc.dx.get(), nullptr, nullptr, &none),
                TE_ERROR_INVALID_ARGUMENT);
      EXPECT_TRUE(lt::error_names("te_grouped_linear_backward_from: argument 'residuals'")) << te_last_error();
    }
    if (step == 2 && fp8) {  // a pending forward: destroying the layer frees its record (LSan)
      auto sc = lt::scope_for(ctx_c.get(), mode, r.get());
      pending = std::move(block);
      ASSERT_TE_OK(te_grouped_linear_forward_compute_into(ctx_c.get(), c.get(), &fm, yc.get(), pending->p,
                                                          pending->bytes));
    }
  }
  c.reset();
}

INSTANTIATE_TEST_SUITE_P(Modes, GroupedCallerResiduals,
                         ::testing::Values(Mode::HighPrecision, Mode::Calibrating, Mode::Delayed, Mode::Current,
                                           Mode::Block),
                         [](const ::testing::TestParamInfo<Mode> &i) { return std::string(lt::mode_name(i.param)); });

// residuals_size reads m_splits and the input's shape only, and is exact.
TEST(GroupedCallerResidualsSize, ReadsShapesOnly) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr cur = lt::make_recipe(TE_RECIPE_CURRENT_SCALING), blk = lt::make_recipe(TE_RECIPE_BLOCK_SCALING);
  GroupedPtr g = make_grouped(ctx.get());
  Data d(3);
  te_tensor x = *d.x.get();
  x.data = nullptr;
  te_grouped_linear_forward_args fa;
  ASSERT_TE_OK(te_grouped_linear_forward_args_init(&fa));
  fa.input = &x;
  fa.m_splits = d.splits.data();
  size_t need = 1;
  ASSERT_TE_OK(te_grouped_linear_residuals_size(ctx.get(), g.get(), &fa, &need));
  EXPECT_EQ(need, 0u);
  {
    lt::AutocastScope s(ctx.get(), cur.get());
    // Padded rows 32, 16, 16: x^T codes [64, rows] each (2048, 1024, 1024 bytes), one scale each.
    ASSERT_TE_OK(te_grouped_linear_residuals_size(ctx.get(), g.get(), &fa, &need));
    EXPECT_EQ(need, 2048u + 256u + 1024u + 256u + 1024u + 256u);
    std::vector<int64_t> bad = d.splits;
    bad[1] = 1;
    fa.m_splits = bad.data();
    EXPECT_EQ(te_grouped_linear_residuals_size(ctx.get(), g.get(), &fa, &need), TE_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(lt::error_names("args->m_splits")) << te_last_error();
    fa.m_splits = nullptr;
    EXPECT_EQ(te_grouped_linear_residuals_size(ctx.get(), g.get(), &fa, &need), TE_ERROR_INVALID_ARGUMENT);
    fa.m_splits = d.splits.data();
  }
  {
    lt::AutocastScope s(ctx.get(), blk.get());
    // Block scaling: 1x128 blocks of the [64, rows] x^T (one per row of 64: 64 floats = 256 bytes).
    ASSERT_TE_OK(te_grouped_linear_residuals_size(ctx.get(), g.get(), &fa, &need));
    EXPECT_EQ(need, 2048u + 256u + 1024u + 256u + 1024u + 256u);
  }
}

TEST(GroupedCallerResidualsErrors, BadMemoryChangesNothing) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = lt::make_recipe(TE_RECIPE_DELAYED_SCALING);
  GroupedPtr g = make_grouped(ctx.get());
  Data d(5);
  te_grouped_linear_forward_args fa = d.args();
  HostTensor y = lt::make_tensor(TE_DTYPE_BF16, {kTokens, kOut});
  const HostTensor y0 = y;
  const std::vector<unsigned char> state0 = state_of(ctx.get(), g.get());
  size_t need = 0;
  std::unique_ptr<lt::Block> block;
  {
    lt::AutocastScope s(ctx.get(), r.get());
    ASSERT_TE_OK(te_grouped_linear_residuals_size(ctx.get(), g.get(), &fa, &need));
    block.reset(new lt::Block(need + 256));
    struct Case {
      void *p;
      size_t bytes;
      const char *what;
    } cases[] = {{nullptr, need, "NULL"},
                 {block->p, need - 1, "residuals_bytes"},
                 {static_cast<char *>(block->p) + 1, need, "aligned"}};
    for (const Case &k : cases) {
      EXPECT_EQ(te_grouped_linear_forward_compute_into(ctx.get(), g.get(), &fa, y.get(), k.p, k.bytes),
                TE_ERROR_INVALID_ARGUMENT)
          << k.what;
      EXPECT_TRUE(lt::error_names(k.what)) << te_last_error();
      EXPECT_TRUE(lt::bitwise_equal(y, y0)) << k.what;
    }
  }
  EXPECT_EQ(state_of(ctx.get(), g.get()), state0);
  Grads gr, g0;
  const te_linear_backward_args none = lt::backward_flags(0);
  EXPECT_EQ(te_grouped_linear_backward_from(ctx.get(), g.get(), &fa, block->p, block->bytes, d.dy.get(),
                                            gr.dx.get(), gr.dwp.data(), gr.dbp.data(), &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("argument 'residuals'")) << te_last_error();
  EXPECT_EQ(te_grouped_linear_backward_from(ctx.get(), g.get(), &fa, nullptr, 16, d.dy.get(), gr.dx.get(),
                                            nullptr, nullptr, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(te_grouped_linear_backward_from(ctx.get(), g.get(), nullptr, nullptr, 0, d.dy.get(), gr.dx.get(),
                                            nullptr, nullptr, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("argument 'inputs'")) << te_last_error();
  {
    lt::AutocastScope s(ctx.get(), r.get());
    ASSERT_TE_OK(te_grouped_linear_forward_compute_into(ctx.get(), g.get(), &fa, y.get(), block->p, need));
  }
  EXPECT_EQ(te_grouped_linear_backward_from(ctx.get(), g.get(), &fa, block->p, need - 1, d.dy.get(), gr.dx.get(),
                                            gr.dwp.data(), gr.dbp.data(), &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("residuals_bytes")) << te_last_error();
  std::vector<int64_t> other = {16, 4, 16, 13};
  te_grouped_linear_forward_args bad = fa;
  bad.m_splits = other.data();
  EXPECT_EQ(te_grouped_linear_backward_from(ctx.get(), g.get(), &bad, block->p, need, d.dy.get(), gr.dx.get(),
                                            gr.dwp.data(), gr.dbp.data(), &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(lt::error_names("inputs->m_splits[0]")) << te_last_error();
  EXPECT_TRUE(gr == g0);
  EXPECT_TE_OK(te_grouped_linear_backward_from(ctx.get(), g.get(), &fa, block->p, need, d.dy.get(), gr.dx.get(),
                                               gr.dwp.data(), gr.dbp.data(), &none));
}

}  // namespace
