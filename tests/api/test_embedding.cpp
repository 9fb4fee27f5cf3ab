// te_embedding_forward / te_embedding_backward on the CPU: the gather is an exact copy; the
// scatter-add matches an fp64 sum within its rounding budget and, bit for bit, an fp32 sum of
// each row's tokens in increasing t (the order te.h fixes); bad input of every argument is
// refused naming the function and the argument, with the outputs untouched.
#include "api_test_util.h"

namespace te_test {
namespace {

const te_dtype kFloatTypes[] = {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16};

HostTensor make_ids(std::vector<int64_t> shape, const std::vector<int32_t> &ids) {
  HostTensor h = make_tensor(TE_DTYPE_I32, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(ids.size()), h.numel());
  std::memcpy(h.bytes.data(), ids.data(), std::min(h.bytes.size(), ids.size() * sizeof(int32_t)));
  return h;
}

// n ids in [0, vocab) drawn so that some repeat many times and some rows get none.
std::vector<int32_t> skewed_ids(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto &id : v) {
    const uint32_t r = gen();
    id = (r % 3 == 0) ? static_cast<int32_t>(r % 4) : static_cast<int32_t>(r % static_cast<uint32_t>(vocab - 2));
  }
  return v;
}

class Embedding : public CpuContextTest {};

TEST_F(Embedding, ForwardIsAnExactGatherInEveryDtype) {
  const int64_t vocab = 50, dim = 37;
  for (te_dtype dt : kFloatTypes) {
    HostTensor table = random_tensor(dt, {vocab, dim}, -3.0f, 3.0f, 11);
    const std::vector<int32_t> ids_v = skewed_ids(21, static_cast<int32_t>(vocab), 5);
    HostTensor ids = make_ids({3, 7}, ids_v);
    // ids' shape followed by dim, and any shape of n * dim elements whose last dimension is dim.
    for (const std::vector<int64_t> &yshape : {std::vector<int64_t>{3, 7, dim}, std::vector<int64_t>{21, dim}}) {
      HostTensor y = make_tensor(dt, yshape);
      ASSERT_TE_OK(te_embedding_forward(ctx_, table.get(), ids.get(), y.get()));
      const size_t row = static_cast<size_t>(dim) * dtype_size(dt);
      for (size_t t = 0; t < ids_v.size(); ++t)
        ASSERT_EQ(0, std::memcmp(y.bytes.data() + t * row, table.bytes.data() + static_cast<size_t>(ids_v[t]) * row, row))
            << dtype_name(dt) << " token " << t;
    }
  }
}

// fp64 and sequential-fp32 references of dtable = init + scatter-add(dy).
void references(const std::vector<int32_t> &ids, const HostTensor &dy, int64_t vocab, int64_t dim,
                const std::vector<float> &init, std::vector<double> *f64, std::vector<float> *f32) {
  f64->assign(init.begin(), init.end());
  f32->assign(init.begin(), init.end());
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t c = 0; c < dim; ++c) {
      const double v = dy.at(static_cast<int64_t>(t) * dim + c);
      (*f64)[static_cast<size_t>(ids[t] * dim + c)] += v;
      float &acc = (*f32)[static_cast<size_t>(ids[t] * dim + c)];
      acc = acc + static_cast<float>(v);
    }
  (void)vocab;
}

TEST_F(Embedding, BackwardIsTheInOrderFp32SumAndNearTheFp64One) {
  const int64_t vocab = 20, dim = 33, n = 96;
  for (te_dtype dt : kFloatTypes) {
    for (int accumulate = 0; accumulate <= 1; ++accumulate) {
      const std::vector<int32_t> ids_v = skewed_ids(n, static_cast<int32_t>(vocab), 9 + accumulate);
      HostTensor ids = make_ids({4, n / 4}, ids_v);
      HostTensor dy = random_tensor(dt, {4, n / 4, dim}, -1.0f, 1.0f, 17);
      HostTensor dtable = accumulate ? random_tensor(TE_DTYPE_F32, {vocab, dim}, -2.0f, 2.0f, 23)
                                     : make_tensor(TE_DTYPE_F32, {vocab, dim});  // sentinel bytes: must be zeroed
      const std::vector<float> init =
          accumulate ? dtable.values_f32() : std::vector<float>(static_cast<size_t>(vocab * dim), 0.0f);
      std::vector<double> f64;
      std::vector<float> f32;
      references(ids_v, dy, vocab, dim, init, &f64, &f32);
      ASSERT_TE_OK(te_embedding_backward(ctx_, ids.get(), dy.get(), dtable.get(), accumulate));
      std::vector<int> uses(static_cast<size_t>(vocab), 0);
      for (int32_t id : ids_v) ++uses[static_cast<size_t>(id)];
      for (int64_t r = 0; r < vocab; ++r)
        for (int64_t c = 0; c < dim; ++c) {
          const size_t i = static_cast<size_t>(r * dim + c);
          const float got = static_cast<float>(dtable.at(static_cast<int64_t>(i)));
          ASSERT_EQ(float_to_bits(got), float_to_bits(f32[i]))
              << dtype_name(dt) << " accumulate " << accumulate << " row " << r << " col " << c;
          // Each add rounds once: |error| <= uses * 2^-24 * (sum of |terms|) <= uses * 2^-24 * (uses + 2).
          const double budget = (uses[static_cast<size_t>(r)] + 1) * (uses[static_cast<size_t>(r)] + 3) * std::ldexp(1.0, -24);
          ASSERT_NEAR(got, f64[i], budget) << dtype_name(dt) << " row " << r << " col " << c;
        }
      ASSERT_EQ(uses[static_cast<size_t>(vocab - 1)], 0);  // a row no token names: 0 (or unchanged)
      for (int64_t c = 0; c < dim; ++c)
        ASSERT_EQ(float_to_bits(static_cast<float>(dtable.at((vocab - 1) * dim + c))),
                  float_to_bits(init[static_cast<size_t>((vocab - 1) * dim + c)]));
    }
  }
}

TEST_F(Embedding, BackwardAccumulatesOntoATiedHeadGradient) {
  // Two calls with accumulate = 1 on the same dtable: the second adds to the first's result.
  const int64_t vocab = 8, dim = 5, n = 12;
  const std::vector<int32_t> ids_v = skewed_ids(n, static_cast<int32_t>(vocab), 3);
  HostTensor ids = make_ids({n}, ids_v);
  HostTensor dy = random_tensor(TE_DTYPE_F32, {n, dim}, -1.0f, 1.0f, 4);
  HostTensor once = make_tensor(TE_DTYPE_F32, {vocab, dim});
  ASSERT_TE_OK(te_embedding_backward(ctx_, ids.get(), dy.get(), once.get(), 0));
  HostTensor twice = once.clone();
  ASSERT_TE_OK(te_embedding_backward(ctx_, ids.get(), dy.get(), twice.get(), 1));
  std::vector<double> f64;
  std::vector<float> f32;
  references(ids_v, dy, vocab, dim, once.values_f32(), &f64, &f32);
  for (int64_t i = 0; i < vocab * dim; ++i)
    ASSERT_EQ(float_to_bits(static_cast<float>(twice.at(i))), float_to_bits(f32[static_cast<size_t>(i)])) << i;
}

// A CPU tensor labelled as living on CUDA device 0.
te_tensor on_cuda(const te_tensor &t) {
  te_tensor c = t;
  c.device.type = TE_DEVICE_CUDA;
  c.device.index = 0;
  return c;
}

TEST_F(Embedding, ForwardRefusesBadInputNamingItAndWritesNothing) {
  const char *fn = "te_embedding_forward";
  HostTensor table = random_tensor(TE_DTYPE_BF16, {10, 4}, -1.0f, 1.0f, 1);
  HostTensor ids = make_ids({2, 3}, {0, 1, 2, 9, 3, 0});
  HostTensor y = make_tensor(TE_DTYPE_BF16, {2, 3, 4});
  const HostTensor y0 = y.clone();
  auto unchanged = [&] { EXPECT_TRUE(bitwise_equal(y, y0)); };

  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "ctx", te_embedding_forward(nullptr, table.get(), ids.get(), y.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "table", te_embedding_forward(ctx_, nullptr, ids.get(), y.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "ids", te_embedding_forward(ctx_, table.get(), nullptr, y.get()));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "y", te_embedding_forward(ctx_, table.get(), ids.get(), nullptr));
  {
    HostTensor t8 = make_tensor(TE_DTYPE_E4M3, {10, 4});
    HostTensor ti = make_ids({10, 4}, std::vector<int32_t>(40, 0));
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "table", te_embedding_forward(ctx_, t8.get(), ids.get(), y.get()));
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "table", te_embedding_forward(ctx_, ti.get(), ids.get(), y.get()));
    HostTensor t3 = make_tensor(TE_DTYPE_BF16, {2, 5, 4});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "table", te_embedding_forward(ctx_, t3.get(), ids.get(), y.get()));
    te_tensor tc = on_cuda(table.t);
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "table", te_embedding_forward(ctx_, &tc, ids.get(), y.get()));
  }
  {
    HostTensor idf = make_tensor(TE_DTYPE_F32, {2, 3});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "ids", te_embedding_forward(ctx_, table.get(), idf.get(), y.get()));
    te_tensor ic = on_cuda(ids.t);
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "ids", te_embedding_forward(ctx_, table.get(), &ic, y.get()));
    te_tensor bad_shape = ids.t;
    bad_shape.shape[1] = 0;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "ids", te_embedding_forward(ctx_, table.get(), &bad_shape, y.get()));
  }
  {
    HostTensor yf = make_tensor(TE_DTYPE_F32, {2, 3, 4});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "y", te_embedding_forward(ctx_, table.get(), ids.get(), yf.get()));
    HostTensor ylast = make_tensor(TE_DTYPE_BF16, {3, 8});  // 24 elements, but last dimension 8
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "y", te_embedding_forward(ctx_, table.get(), ids.get(), ylast.get()));
    HostTensor ynum = make_tensor(TE_DTYPE_BF16, {5, 4});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "y", te_embedding_forward(ctx_, table.get(), ids.get(), ynum.get()));
    te_tensor yc = on_cuda(y.t);
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "y", te_embedding_forward(ctx_, table.get(), ids.get(), &yc));
  }
  {  // y sharing memory with an input
    te_tensor yt = y.t;
    yt.data = table.bytes.data();
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "y", te_embedding_forward(ctx_, table.get(), ids.get(), &yt));
    te_tensor yi = y.t;
    yi.data = ids.bytes.data() + 4;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "y", te_embedding_forward(ctx_, table.get(), ids.get(), &yi));
  }
  // Ids out of range: refused naming the position, before anything is written.
  for (int32_t bad : {-1, 10, INT32_MIN, INT32_MAX}) {
    HostTensor bad_ids = make_ids({2, 3}, {0, 1, 2, 3, bad, 0});
    prime_last_error(fn);
    EXPECT_EQ(te_embedding_forward(ctx_, table.get(), bad_ids.get(), y.get()), TE_ERROR_INVALID_ARGUMENT);
    const std::string msg = last_error();
    EXPECT_TRUE(contains_identifier(msg, fn) && contains_identifier(msg, "ids")) << msg;
    EXPECT_NE(msg.find("position 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
  }
  unchanged();
}

TEST_F(Embedding, BackwardRefusesBadInputNamingItAndWritesNothing) {
  const char *fn = "te_embedding_backward";
  HostTensor ids = make_ids({6}, {0, 1, 2, 9, 3, 0});
  HostTensor dy = random_tensor(TE_DTYPE_F16, {6, 4}, -1.0f, 1.0f, 2);
  HostTensor dtable = random_tensor(TE_DTYPE_F32, {10, 4}, -1.0f, 1.0f, 3);
  const HostTensor d0 = dtable.clone();

  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "ctx", te_embedding_backward(nullptr, ids.get(), dy.get(), dtable.get(), 0));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "ids", te_embedding_backward(ctx_, nullptr, dy.get(), dtable.get(), 0));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dy", te_embedding_backward(ctx_, ids.get(), nullptr, dtable.get(), 0));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dtable", te_embedding_backward(ctx_, ids.get(), dy.get(), nullptr, 0));
  for (int32_t acc : {-1, 2, 7})
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "accumulate", te_embedding_backward(ctx_, ids.get(), dy.get(), dtable.get(), acc));
  {
    HostTensor idf = make_tensor(TE_DTYPE_BF16, {6});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "ids", te_embedding_backward(ctx_, idf.get(), dy.get(), dtable.get(), 0));
    te_tensor ic = on_cuda(ids.t);
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "ids", te_embedding_backward(ctx_, &ic, dy.get(), dtable.get(), 0));
  }
  {
    HostTensor d8 = make_tensor(TE_DTYPE_E5M2, {6, 4});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dy", te_embedding_backward(ctx_, ids.get(), d8.get(), dtable.get(), 0));
    HostTensor dlast = make_tensor(TE_DTYPE_F16, {4, 6});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dy", te_embedding_backward(ctx_, ids.get(), dlast.get(), dtable.get(), 0));
    HostTensor dnum = make_tensor(TE_DTYPE_F16, {7, 4});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dy", te_embedding_backward(ctx_, ids.get(), dnum.get(), dtable.get(), 0));
    te_tensor dc = on_cuda(dy.t);
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dy", te_embedding_backward(ctx_, ids.get(), &dc, dtable.get(), 0));
  }
  {
    HostTensor tb = make_tensor(TE_DTYPE_BF16, {10, 4});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dtable", te_embedding_backward(ctx_, ids.get(), dy.get(), tb.get(), 0));
    HostTensor t1 = make_tensor(TE_DTYPE_F32, {40});
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dtable", te_embedding_backward(ctx_, ids.get(), dy.get(), t1.get(), 0));
    te_tensor tc = on_cuda(dtable.t);
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dtable", te_embedding_backward(ctx_, ids.get(), dy.get(), &tc, 1));
  }
  {  // dtable sharing memory with an input
    HostTensor big = make_tensor(TE_DTYPE_F32, {10, 4});
    te_tensor dyt = dy.t;
    dyt.data = big.bytes.data() + 8;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dtable", te_embedding_backward(ctx_, ids.get(), &dyt, big.get(), 0));
    HostTensor big_ids = make_ids({40}, std::vector<int32_t>(40, 0));
    te_tensor idt = big_ids.t;
    idt.shape[0] = 6;
    te_tensor dtt = dtable.t;
    dtt.data = big_ids.bytes.data();
    big_ids.t.shape[0] = 40;
    EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, fn, "dtable", te_embedding_backward(ctx_, &idt, dy.get(), &dtt, 0));
  }
  for (int32_t bad : {-5, 10}) {
    HostTensor bad_ids = make_ids({6}, {0, 1, bad, 3, 4, 0});
    for (int acc = 0; acc <= 1; ++acc) {
      prime_last_error(fn);
      EXPECT_EQ(te_embedding_backward(ctx_, bad_ids.get(), dy.get(), dtable.get(), acc), TE_ERROR_INVALID_ARGUMENT);
      const std::string msg = last_error();
      EXPECT_TRUE(contains_identifier(msg, fn) && contains_identifier(msg, "ids")) << msg;
      EXPECT_NE(msg.find("position 2"), std::string::npos) << msg;
    }
  }
  EXPECT_TRUE(bitwise_equal(dtable, d0));
}

}  // namespace
}  // namespace te_test
