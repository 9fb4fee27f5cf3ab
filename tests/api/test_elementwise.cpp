// te_add, te_split_columns, te_concat_columns on the CPU backend: exact results against values
// computed here, in place, every dtype, and bad input refused with the outputs untouched.
#include "api_test_util.h"

using namespace te_test;

namespace {

class Elementwise : public CpuContextTest {};

TEST_F(Elementwise, AddIsTheFp32SumRoundedOnce) {
  for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_F16}) {
    HostTensor a = random_tensor(dt, {3, 5, 7}, -4, 4, 1), b = random_tensor(dt, {3, 5, 7}, -4, 4, 2);
    HostTensor y = make_tensor(dt, {3, 5, 7});
    ASSERT_TE_OK(te_add(ctx_, &a.t, &b.t, &y.t));
    std::vector<double> va = a.values(), vb = b.values(), vy = y.values();
    for (size_t i = 0; i < vy.size(); ++i) {
      // a and b are exact in float; their float sum rounded to dt is the definition.
      HostTensor want = make_tensor(dt, {1}, {static_cast<float>(va[i]) + static_cast<float>(vb[i])});
      ASSERT_EQ(vy[i], want.values()[0]) << "dtype " << dt << " element " << i;
    }
    // In place: y = a + y.
    HostTensor b_copy = b;
    ASSERT_TE_OK(te_add(ctx_, &a.t, &b_copy.t, &b_copy.t));
    EXPECT_EQ(b_copy.bytes, y.bytes);
  }
}

TEST_F(Elementwise, AddPropagatesNaNAndInf) {
  const float nan = std::nanf(""), inf = INFINITY;
  HostTensor a = make_tensor(TE_DTYPE_F32, {4}, {nan, inf, inf, 1.0f});
  HostTensor b = make_tensor(TE_DTYPE_F32, {4}, {2.0f, -inf, 1.0f, 2.0f});
  HostTensor y = make_tensor(TE_DTYPE_F32, {4});
  ASSERT_TE_OK(te_add(ctx_, &a.t, &b.t, &y.t));
  std::vector<double> v = y.values();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_TRUE(std::isnan(v[1]));
  EXPECT_EQ(v[2], INFINITY);
  EXPECT_EQ(v[3], 3.0);
}

TEST_F(Elementwise, SplitThenConcatIsTheIdentity) {
  for (te_dtype dt : {TE_DTYPE_F32, TE_DTYPE_BF16, TE_DTYPE_E4M3, TE_DTYPE_I32}) {
    const size_t es = dtype_size(dt);
    HostTensor x = make_tensor(dt, {2, 3, 10});
    for (size_t i = 0; i < x.bytes.size(); ++i) x.bytes[i] = static_cast<unsigned char>(i * 7 + 1);
    HostTensor p0 = make_tensor(dt, {2, 3, 4}), p1 = make_tensor(dt, {6, 1}), p2 = make_tensor(dt, {2, 3, 5});
    te_tensor *outs[3] = {&p0.t, &p1.t, &p2.t};
    ASSERT_TE_OK(te_split_columns(ctx_, &x.t, outs, 3));
    const int64_t widths[3] = {4, 1, 5};
    HostTensor *parts[3] = {&p0, &p1, &p2};
    int64_t col = 0;
    for (int p = 0; p < 3; ++p) {
      for (int64_t r = 0; r < 6; ++r)
        ASSERT_EQ(0, std::memcmp(&parts[p]->bytes[r * widths[p] * es], &x.bytes[(r * 10 + col) * es], widths[p] * es))
            << "dtype " << dt << " part " << p << " row " << r;
      col += widths[p];
    }
    HostTensor y = make_tensor(dt, {6, 10});
    const te_tensor *ins[3] = {&p0.t, &p1.t, &p2.t};
    ASSERT_TE_OK(te_concat_columns(ctx_, ins, 3, &y.t));
    EXPECT_EQ(y.bytes, x.bytes) << "dtype " << dt;
  }
}

TEST_F(Elementwise, BadInputIsRefusedAndChangesNothing) {
  HostTensor a = random_tensor(TE_DTYPE_F32, {4, 6}, -1, 1, 3), b = random_tensor(TE_DTYPE_F32, {4, 6}, -1, 1, 4);
  HostTensor y = make_tensor(TE_DTYPE_F32, {4, 6});
  const std::vector<unsigned char> y0 = y.bytes;
  HostTensor wrong_shape = make_tensor(TE_DTYPE_F32, {6, 4}), wrong_dtype = make_tensor(TE_DTYPE_BF16, {4, 6});
  HostTensor ids = make_tensor(TE_DTYPE_I32, {4, 6});
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_add", "ctx", te_add(nullptr, &a.t, &b.t, &y.t));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_add", "b", te_add(ctx_, &a.t, &wrong_shape.t, &y.t));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_add", "b", te_add(ctx_, &a.t, &wrong_dtype.t, &y.t));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_add", "y", te_add(ctx_, &a.t, &b.t, &wrong_shape.t));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_add", "a", te_add(ctx_, &ids.t, &ids.t, &ids.t));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_add", "y", te_add(ctx_, &a.t, &b.t, nullptr));
  EXPECT_EQ(y.bytes, y0);

  HostTensor p0 = make_tensor(TE_DTYPE_F32, {4, 2}), p1 = make_tensor(TE_DTYPE_F32, {4, 3});
  const std::vector<unsigned char> p00 = p0.bytes;
  te_tensor *outs[2] = {&p0.t, &p1.t};
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_split_columns", "outputs", te_split_columns(ctx_, &a.t, outs, 2));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_split_columns", "n", te_split_columns(ctx_, &a.t, outs, 0));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_split_columns", "n", te_split_columns(ctx_, &a.t, outs, 65));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_split_columns", "outputs", te_split_columns(ctx_, &a.t, nullptr, 2));
  te_tensor *with_null[2] = {&p0.t, nullptr};
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_split_columns", "outputs[1]", te_split_columns(ctx_, &a.t, with_null, 2));
  HostTensor rows5 = make_tensor(TE_DTYPE_F32, {5, 4});
  te_tensor *bad_rows[2] = {&p0.t, &rows5.t};
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_split_columns", "outputs[1]", te_split_columns(ctx_, &a.t, bad_rows, 2));
  HostTensor bf = make_tensor(TE_DTYPE_BF16, {4, 4});
  te_tensor *bad_dtype[2] = {&p0.t, &bf.t};
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_split_columns", "outputs[1]", te_split_columns(ctx_, &a.t, bad_dtype, 2));
  // Overlap: an output inside x, or two outputs sharing memory.
  te_tensor inside = p0.t;
  inside.data = a.t.data;
  HostTensor p4 = make_tensor(TE_DTYPE_F32, {4, 4});
  te_tensor *overlap_x[2] = {&inside, &p4.t};
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_split_columns", "outputs[0]", te_split_columns(ctx_, &a.t, overlap_x, 2));
  te_tensor alias = p4.t;
  alias.shape[1] = 2;
  te_tensor *overlap_each[2] = {&alias, &p4.t};
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_split_columns", "outputs[1]", te_split_columns(ctx_, &a.t, overlap_each, 2));
  EXPECT_EQ(p0.bytes, p00);

  const te_tensor *ins[2] = {&p0.t, &p1.t};
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_concat_columns", "inputs", te_concat_columns(ctx_, ins, 2, &y.t));
  EXPECT_TE_FAIL(TE_ERROR_INVALID_ARGUMENT, "te_concat_columns", "y", te_concat_columns(ctx_, ins, 2, nullptr));
  EXPECT_EQ(y.bytes, y0);
}

}  // namespace
