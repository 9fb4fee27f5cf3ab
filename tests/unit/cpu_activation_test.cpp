// Activations and bias gradient on the CPU: forward against fp64 formulas, backward against
// fp64 analytic derivatives and against central finite differences of the fp64 forward.
// Tolerances: fp32 math with libm tanh/exp gives a few ulp (1e-6 relative + 1e-7 absolute),
// then one rounding into the tensor dtype. TE's GELU form x * (0.5 + 0.5 tanh(...)) cancels for
// large negative x, so GELU also gets an absolute |x| * 2^-22 (a few ulp of 0.5 |x|).
#include <gtest/gtest.h>

#include <cmath>

#include "cpu_test_support.h"

namespace {

using te::Activation;
using te::DType;
using te_test::HostTensor;

double gelu64(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
double dgelu64(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}
double silu64(double x) { return x / (1.0 + std::exp(-x)); }
double dsilu64(double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1.0 + x * (1.0 - s));
}

double central_difference(double (*f)(double), double x) {
  const double h = 1e-5;
  return (f(x + h) - f(x - h)) / (2 * h);
}

double tol_for(DType t, double ref) {
  const double rel = t == DType::F32 ? 0x1p-24 : (t == DType::F16 ? 0x1p-11 : 0x1p-8);
  return (1e-6 + rel) * std::fabs(ref) + 1e-7;
}

class CpuActivationTest : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<te::Backend> be = te::make_cpu_backend();
};

TEST_P(CpuActivationTest, ReluForwardBackward) {
  const DType t = GetParam();
  HostTensor x(t, 9, 300), y(t, 9, 300), dy(t, 9, 300), dx(t, 9, 300);
  te_test::fill_random(x, 1);
  te_test::fill_random(dy, 2);
  x.set(0, 0, 0.0f);
  x.set(0, 1, -0.0f);
  be->activation_forward(Activation::ReLU, x.view, y.view);
  be->activation_backward(Activation::ReLU, x.view, dy.view, dx.view);
  for (int64_t r = 0; r < 9; ++r) {
    for (int64_t c = 0; c < 300; ++c) {
      const float xv = x.get(r, c);
      EXPECT_EQ(y.get(r, c), xv > 0 ? xv : 0.0f);
      EXPECT_EQ(dx.get(r, c), xv > 0 ? dy.get(r, c) : 0.0f) << "grad at 0 is 0";
    }
  }
}

TEST_P(CpuActivationTest, GeluMatchesFp64AndFiniteDifferences) {
  const DType t = GetParam();
  const int64_t rows = 4, cols = 700;  // crosses the internal chunk size
  HostTensor x(t, rows, cols), y(t, rows, cols), dy(t, rows, cols), dx(t, rows, cols);
  te_test::fill_random(x, 3, 3.0f);
  te_test::fill_random(dy, 4);
  be->activation_forward(Activation::GELU, x.view, y.view);
  be->activation_backward(Activation::GELU, x.view, dy.view, dx.view);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double xv = x.get(r, c), g = dy.get(r, c);
      const double cancel = std::fabs(xv) * 0x1p-22;
      ASSERT_NEAR(y.get(r, c), gelu64(xv), tol_for(t, gelu64(xv)) + cancel) << xv;
      const double want = g * dgelu64(xv);
      ASSERT_NEAR(dx.get(r, c), want, tol_for(t, want) + (1e-6 + cancel) * std::fabs(g)) << xv;
      ASSERT_NEAR(dgelu64(xv), central_difference(gelu64, xv), 1e-6) << xv;
      ASSERT_NEAR(dx.get(r, c), g * central_difference(gelu64, xv), tol_for(t, want) + (2e-6 + cancel) * std::fabs(g));
    }
  }
}

TEST_P(CpuActivationTest, SwigluForwardBackward) {
  const DType t = GetParam();
  const int64_t rows = 3, n = 150;
  HostTensor x(t, rows, 2 * n), y(t, rows, n), dy(t, rows, n), dx(t, rows, 2 * n);
  te_test::fill_random(x, 5, 2.0f);
  te_test::fill_random(dy, 6);
  be->activation_forward(Activation::SwiGLU, x.view, y.view);
  be->activation_backward(Activation::SwiGLU, x.view, dy.view, dx.view);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      const double a = x.get(r, j), b = x.get(r, n + j), g = dy.get(r, j);
      const double want_y = silu64(a) * b;
      ASSERT_NEAR(y.get(r, j), want_y, tol_for(t, want_y) + 1e-6 * std::fabs(b));
      const double want_da = g * dsilu64(a) * b, want_db = g * silu64(a);
      ASSERT_NEAR(dx.get(r, j), want_da, tol_for(t, want_da) + 1e-6 * std::fabs(g * b));
      ASSERT_NEAR(dx.get(r, n + j), want_db, tol_for(t, want_db) + 1e-6 * std::fabs(g));
      // Finite differences of y = silu(a) * b in a and in b.
      const double h = 1e-5;
      const double fd_a = (silu64(a + h) - silu64(a - h)) / (2 * h) * b * g;
      const double fd_b = silu64(a) * g;  // linear in b: exact
      ASSERT_NEAR(dx.get(r, j), fd_a, tol_for(t, want_da) + 2e-6 * std::fabs(g * b));
      ASSERT_NEAR(dx.get(r, n + j), fd_b, tol_for(t, want_db) + 1e-6 * std::fabs(g));
    }
  }
}

TEST_P(CpuActivationTest, BiasGradSumsRowsInFp32) {
  const DType t = GetParam();
  const int64_t rows = 33, n = 70;
  HostTensor dy(t, rows, n), db(t, 1, n);
  te_test::fill_random(dy, 8);
  be->bias_grad(dy.view, db.view);
  for (int64_t j = 0; j < n; ++j) {
    double sum = 0.0, abs_sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      sum += dy.get(r, j);
      abs_sum += std::fabs(dy.get(r, j));
    }
    ASSERT_NEAR(db.get(0, j), sum, rows * 0x1p-24 * abs_sum + tol_for(t, sum)) << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuActivationTest, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType> &info) { return std::string(te::dtype_name(info.param)); });

TEST(CpuActivationEdge, ReluPassesNaN) {
  auto be = te::make_cpu_backend();
  HostTensor x(DType::F32, 1, 2), y(DType::F32, 1, 2);
  x.set(0, 0, NAN);
  x.set(0, 1, -INFINITY);
  be->activation_forward(Activation::ReLU, x.view, y.view);
  EXPECT_TRUE(std::isnan(y.get(0, 0)));
  EXPECT_EQ(y.get(0, 1), 0.0f);
}

}  // namespace
