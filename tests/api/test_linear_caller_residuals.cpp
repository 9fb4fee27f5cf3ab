// te_linear's residuals in the caller's memory (residuals_size, forward_compute_into,
// backward_from): bitwise the same outputs, gradients and FP8 state as the opaque path for every
// recipe over several steps; high precision leaves nothing; records are keyed by address,
// replaced, dropped by TE_BACKWARD_ONCE and past TE_RESIDUAL_RECORDS; bad memory is an error
// that changes nothing.
#include <cstdlib>

#include "linear_test_util.h"

namespace lt = te_test;

namespace {

constexpr int64_t kTokens = 32, kIn = 64, kOut = 48;

struct Data {
  lt::HostTensor x, w, b, dy;
  explicit Data(uint32_t seed)
      : x(lt::random_tensor(TE_DTYPE_BF16, {2, kTokens / 2, kIn}, -2.0f, 2.0f, seed + 1)),
        w(lt::random_tensor(TE_DTYPE_BF16, {kOut, kIn}, -0.5f, 0.5f, seed + 2)),
        b(lt::random_tensor(TE_DTYPE_BF16, {kOut}, -1.0f, 1.0f, seed + 3)),
        dy(lt::random_tensor(TE_DTYPE_BF16, {2, kTokens / 2, kOut}, -0.05f, 0.05f, seed + 4)) {}
  te_linear_forward_args args() {
    te_linear_forward_args fa;
    te_linear_forward_args_init(&fa);
    fa.input = x.get();
    fa.weight = w.get();
    fa.bias = b.get();
    return fa;
  }
};

struct Grads {
  lt::HostTensor dx{TE_DTYPE_BF16, {2, kTokens / 2, kIn}}, dw{TE_DTYPE_BF16, {kOut, kIn}}, db{TE_DTYPE_BF16, {kOut}};
};

// Caller-owned residual memory, 256-byte aligned.
struct Block {
  void *p = nullptr;
  size_t bytes = 0;
  explicit Block(size_t n) : bytes(n) {
    if (n) p = std::aligned_alloc(256, (n + 255) / 256 * 256);
  }
  ~Block() { std::free(p); }
  Block(const Block &) = delete;
  Block &operator=(const Block &) = delete;
};

te_linear_backward_args once_args(uint32_t flags) {
  te_linear_backward_args ba;
  te_linear_backward_args_init(&ba);
  ba.flags = flags;
  return ba;
}

class CallerResiduals : public ::testing::TestWithParam<int> {};

// Three steps of forward + backward, one layer through the opaque path and one through the
// caller's memory, each in its own context with the same calls: y, dx, dw, db and the serialized
// FP8 state agree bit for bit after each step (the delayed recipe's scale updates included).
TEST_P(CallerResiduals, SameAsOpaquePathOverSteps) {
  lt::ContextPtr ctx_a = lt::make_cpu_context(), ctx_c = lt::make_cpu_context();
  lt::RecipePtr r = lt::make_recipe(static_cast<te_recipe_kind>(GetParam()));
  lt::LinearPtr a = lt::make_linear(ctx_a.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  lt::LinearPtr c = lt::make_linear(ctx_c.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  for (int step = 0; step < 3; ++step) {
    Data d(10 * step + 1);
    te_linear_forward_args fa = d.args();
    lt::HostTensor ya(TE_DTYPE_BF16, {2, kTokens / 2, kOut}), yc(TE_DTYPE_BF16, {2, kTokens / 2, kOut});
    te_linear_backward_ctx *bwd = nullptr;
    size_t need = 0;
    std::unique_ptr<Block> block;
    {
      lt::AutocastScope sa(ctx_a.get(), r.get()), sc(ctx_c.get(), r.get());
      ASSERT_TE_OK(te_linear_residuals_size(ctx_c.get(), c.get(), &fa, &need));
      // FP8 x^T [in, tokens] and its scale_inv, each piece on a 256-byte boundary.
      EXPECT_GE(need, static_cast<size_t>(kIn * kTokens));
      block.reset(new Block(need));
      ASSERT_TE_OK(te_linear_forward(ctx_a.get(), a.get(), &fa, ya.get(), &bwd));
      ASSERT_TE_OK(te_linear_forward_compute_into(ctx_c.get(), c.get(), &fa, yc.get(), block->p, block->bytes));
    }
    lt::BackwardPtr keep(bwd);
    EXPECT_TRUE(lt::bitwise_equal(ya, yc)) << "step " << step << ": y";
    EXPECT_EQ(lt::saved_state(ctx_a.get(), a.get()), lt::saved_state(ctx_c.get(), c.get())) << "after forward";
    Grads ga, ga2, gc, gc2;
    te_linear_backward_args none = once_args(0), once = once_args(TE_BACKWARD_ONCE);
    ASSERT_TE_OK(te_linear_backward(ctx_a.get(), bwd, d.dy.get(), ga.dx.get(), ga.dw.get(), ga.db.get(), &none));
    ASSERT_TE_OK(te_linear_backward(ctx_a.get(), bwd, d.dy.get(), ga2.dx.get(), ga2.dw.get(), ga2.db.get(), &once));
    // Inputs are optional in FP8; given here on the first call only.
    ASSERT_TE_OK(te_linear_backward_from(ctx_c.get(), c.get(), &fa, block->p, block->bytes, d.dy.get(),
                                         gc.dx.get(), gc.dw.get(), gc.db.get(), &none));
    ASSERT_TE_OK(te_linear_backward_from(ctx_c.get(), c.get(), nullptr, block->p, block->bytes, d.dy.get(),
                                         gc2.dx.get(), gc2.dw.get(), gc2.db.get(), &once));
    for (auto *g : {&gc, &gc2}) {
      EXPECT_TRUE(lt::bitwise_equal(ga.dx, g->dx)) << "step " << step << ": dx";
      EXPECT_TRUE(lt::bitwise_equal(ga.dw, g->dw)) << "step " << step << ": dw";
      EXPECT_TRUE(lt::bitwise_equal(ga.db, g->db)) << "step " << step << ": db";
    }
    EXPECT_EQ(lt::saved_state(ctx_a.get(), a.get()), lt::saved_state(ctx_c.get(), c.get())) << "after backward";
    // TE_BACKWARD_ONCE dropped the record.
    EXPECT_EQ(te_linear_backward_from(ctx_c.get(), c.get(), nullptr, block->p, block->bytes, d.dy.get(),
                                      gc.dx.get(), nullptr, nullptr, &none),
              TE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(te_last_error()).find("te_linear_backward_from: argument 'residuals'"), std::string::npos)
        << te_last_error();
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, CallerResiduals,
                         ::testing::Values(TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING,
                                           TE_RECIPE_BLOCK_SCALING),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return std::string(i.param == 0 ? "Delayed" : i.param == 1 ? "Current" : "Block");
                         });

// Outside autocast the forward leaves nothing, and the backward reads x and W again.
TEST(CallerResidualsHighPrecision, LeavesNothingAndBackwardReadsInputs) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::LinearPtr a = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  lt::LinearPtr c = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(7);
  te_linear_forward_args fa = d.args();
  size_t need = 1;
  ASSERT_TE_OK(te_linear_residuals_size(ctx.get(), c.get(), &fa, &need));
  EXPECT_EQ(need, 0u);
  lt::HostTensor ya(TE_DTYPE_BF16, {2, kTokens / 2, kOut}), yc(TE_DTYPE_BF16, {2, kTokens / 2, kOut});
  te_linear_backward_ctx *bwd = nullptr;
  ASSERT_TE_OK(te_linear_forward(ctx.get(), a.get(), &fa, ya.get(), &bwd));
  lt::BackwardPtr keep(bwd);
  ASSERT_TE_OK(te_linear_forward_compute_into(ctx.get(), c.get(), &fa, yc.get(), nullptr, 0));
  EXPECT_TRUE(lt::bitwise_equal(ya, yc));
  Grads ga, gc;
  te_linear_backward_args none = once_args(0);
  ASSERT_TE_OK(te_linear_backward(ctx.get(), bwd, d.dy.get(), ga.dx.get(), ga.dw.get(), ga.db.get(), &none));
  ASSERT_TE_OK(te_linear_backward_from(ctx.get(), c.get(), &fa, nullptr, 0, d.dy.get(), gc.dx.get(), gc.dw.get(),
                                       gc.db.get(), &none));
  EXPECT_TRUE(lt::bitwise_equal(ga.dx, gc.dx));
  EXPECT_TRUE(lt::bitwise_equal(ga.dw, gc.dw));
  EXPECT_TRUE(lt::bitwise_equal(ga.db, gc.db));
  // The backward never reads b: inputs without it give the same gradients.
  Grads gn;
  te_linear_forward_args no_bias = fa;
  no_bias.bias = nullptr;
  ASSERT_TE_OK(te_linear_backward_from(ctx.get(), c.get(), &no_bias, nullptr, 0, d.dy.get(), gn.dx.get(),
                                       gn.dw.get(), gn.db.get(), &none));
  EXPECT_TRUE(lt::bitwise_equal(ga.dx, gn.dx));
  EXPECT_TRUE(lt::bitwise_equal(ga.dw, gn.dw));
  EXPECT_TRUE(lt::bitwise_equal(ga.db, gn.db));
  // Without inputs there is nothing to differentiate against.
  EXPECT_EQ(te_linear_backward_from(ctx.get(), c.get(), nullptr, nullptr, 0, d.dy.get(), gc.dx.get(), nullptr,
                                    nullptr, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(te_last_error()).find("argument 'inputs'"), std::string::npos) << te_last_error();
}

// residuals_size reads shapes only: tensors without data are fine.
TEST(CallerResidualsSize, ReadsShapesOnly) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = lt::make_recipe(TE_RECIPE_CURRENT_SCALING);
  lt::LinearPtr c = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(3);
  te_tensor x = *d.x.get();
  x.data = nullptr;
  te_linear_forward_args fa = d.args();
  fa.input = &x;
  fa.weight = nullptr;
  size_t need = 0;
  lt::AutocastScope s(ctx.get(), r.get());
  ASSERT_TE_OK(te_linear_residuals_size(ctx.get(), c.get(), &fa, &need));
  EXPECT_EQ(need, 2048u + 256u);  // 64 x 32 codes; one scale_inv float, padded to 256
  x.shape[2] = kIn + 1;
  EXPECT_EQ(te_linear_residuals_size(ctx.get(), c.get(), &fa, &need), TE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(te_linear_residuals_size(ctx.get(), c.get(), &fa, nullptr), TE_ERROR_INVALID_ARGUMENT);
}

// Memory that cannot take the residuals is an error that changes neither y nor the FP8 state.
TEST(CallerResidualsErrors, BadMemoryChangesNothing) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = lt::make_recipe(TE_RECIPE_DELAYED_SCALING);
  lt::LinearPtr c = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(5);
  te_linear_forward_args fa = d.args();
  lt::HostTensor y(TE_DTYPE_BF16, {2, kTokens / 2, kOut});
  y.fill_byte(0x5A);
  const lt::HostTensor y0 = y;
  const std::vector<unsigned char> state0 = lt::saved_state(ctx.get(), c.get());
  lt::AutocastScope s(ctx.get(), r.get());
  size_t need = 0;
  ASSERT_TE_OK(te_linear_residuals_size(ctx.get(), c.get(), &fa, &need));
  Block block(need + 256);
  struct Case {
    void *p;
    size_t bytes;
    const char *what;
  } cases[] = {{nullptr, need, "NULL"},
               {block.p, need - 1, "residuals_bytes"},
               {static_cast<char *>(block.p) + 1, need, "aligned"}};
  for (const Case &k : cases) {
    EXPECT_EQ(te_linear_forward_compute_into(ctx.get(), c.get(), &fa, y.get(), k.p, k.bytes),
              TE_ERROR_INVALID_ARGUMENT)
        << k.what;
    EXPECT_NE(std::string(te_last_error()).find(k.what), std::string::npos) << te_last_error();
    EXPECT_TRUE(lt::bitwise_equal(y, y0)) << k.what;
  }
  s.end();
  EXPECT_EQ(lt::saved_state(ctx.get(), c.get()), state0);
  // Memory no forward filled.
  Grads g;
  te_linear_backward_args none = once_args(0);
  EXPECT_EQ(te_linear_backward_from(ctx.get(), c.get(), nullptr, block.p, block.bytes, d.dy.get(), g.dx.get(),
                                    nullptr, nullptr, &none),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(te_linear_backward_from(ctx.get(), c.get(), nullptr, nullptr, 16, d.dy.get(), g.dx.get(), nullptr,
                                    nullptr, &none),
            TE_ERROR_INVALID_ARGUMENT);
}

// Records: a forward into the same memory replaces the record; past TE_RESIDUAL_RECORDS pending
// forwards the oldest is dropped; destroying the layer frees the rest (ASan/LSan: no leak).
TEST(CallerResidualsRecords, ReplacedAndDropped) {
  lt::ContextPtr ctx = lt::make_cpu_context();
  lt::RecipePtr r = lt::make_recipe(TE_RECIPE_CURRENT_SCALING);
  lt::LinearPtr c = lt::make_linear(ctx.get(), kIn, kOut, 1, TE_DTYPE_BF16);
  Data d(9);
  te_linear_forward_args fa = d.args();
  lt::HostTensor y(TE_DTYPE_BF16, {2, kTokens / 2, kOut});
  size_t need = 0;
  std::vector<std::unique_ptr<Block>> blocks;
  {
    lt::AutocastScope s(ctx.get(), r.get());
    ASSERT_TE_OK(te_linear_residuals_size(ctx.get(), c.get(), &fa, &need));
    for (int i = 0; i < TE_RESIDUAL_RECORDS + 1; ++i) {
      blocks.emplace_back(new Block(need));
      ASSERT_TE_OK(te_linear_forward_compute_into(ctx.get(), c.get(), &fa, y.get(), blocks.back()->p, need));
    }
    // The same memory again: replaces its record (the count of records does not grow).
    ASSERT_TE_OK(te_linear_forward_compute_into(ctx.get(), c.get(), &fa, y.get(), blocks.back()->p, need));
  }
  Grads g;
  te_linear_backward_args none = once_args(0);
  EXPECT_EQ(te_linear_backward_from(ctx.get(), c.get(), nullptr, blocks[0]->p, need, d.dy.get(), g.dx.get(),
                                    nullptr, nullptr, &none),
            TE_ERROR_INVALID_ARGUMENT)
      << "the oldest record should have been dropped";
  for (size_t i = 1; i < blocks.size(); ++i)
    EXPECT_TE_OK(te_linear_backward_from(ctx.get(), c.get(), nullptr, blocks[i]->p, need, d.dy.get(), g.dx.get(),
                                         nullptr, nullptr, &none))
        << "block " << i;
  c.reset();  // frees the pending records
}

}  // namespace
