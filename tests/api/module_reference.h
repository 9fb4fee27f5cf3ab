// fp64 references for the transformer modules' tests: LayerNorm/RMSNorm forward and backward,
// the activations, and plain matrix products, written from their definitions (never by calling
// libte). Row-major, [rows, cols].
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace te_test {

using Vec = std::vector<double>;

struct NormRef {
  Vec y, x_hat, rsigma;
};

// layer = true: LayerNorm ((x - mean) * rsigma * g + b); false: RMSNorm (x * rsigma * g).
inline NormRef ref_norm(const Vec &x, const Vec &gamma, const Vec &beta, int64_t rows, int64_t n, double eps,
                        bool layer, bool zero_centered) {
  NormRef r;
  r.y.resize(x.size());
  r.x_hat.resize(x.size());
  r.rsigma.resize(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    const double *xr = &x[static_cast<size_t>(i * n)];
    double mu = 0, m2 = 0;
    if (layer) {
      for (int64_t j = 0; j < n; ++j) mu += xr[j];
      mu /= static_cast<double>(n);
    }
    for (int64_t j = 0; j < n; ++j) m2 += (xr[j] - mu) * (xr[j] - mu);
    const double rs = 1.0 / std::sqrt(m2 / static_cast<double>(n) + eps);
    r.rsigma[static_cast<size_t>(i)] = rs;
    for (int64_t j = 0; j < n; ++j) {
      const size_t k = static_cast<size_t>(i * n + j);
      const double g = zero_centered ? 1.0 + gamma[static_cast<size_t>(j)] : gamma[static_cast<size_t>(j)];
      r.x_hat[k] = (xr[j] - mu) * rs;
      r.y[k] = r.x_hat[k] * g + (layer && !beta.empty() ? beta[static_cast<size_t>(j)] : 0.0);
    }
  }
  return r;
}

struct NormGradRef {
  Vec dx, dgamma, dbeta;
};

inline NormGradRef ref_norm_backward(const Vec &dy, const NormRef &f, const Vec &gamma, int64_t rows, int64_t n,
                                     bool layer, bool zero_centered) {
  NormGradRef g;
  g.dx.resize(dy.size());
  g.dgamma.assign(static_cast<size_t>(n), 0.0);
  g.dbeta.assign(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double c1 = 0, c2 = 0;
    for (int64_t j = 0; j < n; ++j) {
      const size_t k = static_cast<size_t>(i * n + j);
      const double gm = zero_centered ? 1.0 + gamma[static_cast<size_t>(j)] : gamma[static_cast<size_t>(j)];
      c1 += dy[k] * gm * f.x_hat[k];
      c2 += dy[k] * gm;
      g.dgamma[static_cast<size_t>(j)] += dy[k] * f.x_hat[k];
      g.dbeta[static_cast<size_t>(j)] += dy[k];
    }
    c1 /= static_cast<double>(n);
    c2 = layer ? c2 / static_cast<double>(n) : 0.0;
    const double rs = f.rsigma[static_cast<size_t>(i)];
    for (int64_t j = 0; j < n; ++j) {
      const size_t k = static_cast<size_t>(i * n + j);
      const double gm = zero_centered ? 1.0 + gamma[static_cast<size_t>(j)] : gamma[static_cast<size_t>(j)];
      g.dx[k] = (dy[k] * gm - (f.x_hat[k] * c1 + c2)) * rs;
    }
  }
  return g;
}

// C[m, n] = sum_k A[m, k] B[n, k]  (x W^T)
inline Vec ref_nt(const Vec &a, const Vec &b, int64_t m, int64_t n, int64_t k) {
  Vec c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += a[static_cast<size_t>(i * k + p)] * b[static_cast<size_t>(j * k + p)];
      c[static_cast<size_t>(i * n + j)] = s;
    }
  return c;
}
// C[m, n] = sum_k A[m, k] B[k, n]  (dy W)
inline Vec ref_nn(const Vec &a, const Vec &b, int64_t m, int64_t n, int64_t k) {
  Vec c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) {
      const double av = a[static_cast<size_t>(i * k + p)];
      for (int64_t j = 0; j < n; ++j) c[static_cast<size_t>(i * n + j)] += av * b[static_cast<size_t>(p * n + j)];
    }
  return c;
}
// C[m, n] = sum_k A[k, m] B[k, n]  (dy^T x)
inline Vec ref_tn(const Vec &a, const Vec &b, int64_t m, int64_t n, int64_t k) {
  Vec c(static_cast<size_t>(m * n), 0.0);
  for (int64_t p = 0; p < k; ++p)
    for (int64_t i = 0; i < m; ++i) {
      const double av = a[static_cast<size_t>(p * m + i)];
      for (int64_t j = 0; j < n; ++j) c[static_cast<size_t>(i * n + j)] += av * b[static_cast<size_t>(p * n + j)];
    }
  return c;
}
// The transpose of a [rows, cols] matrix.
inline Vec ref_transpose(const Vec &a, int64_t rows, int64_t cols) {
  Vec t(a.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[static_cast<size_t>(j * rows + i)] = a[static_cast<size_t>(i * cols + j)];
  return t;
}

inline double ref_gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
inline double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }

// Max |got - want| / (atol + rtol |want|) over all elements (<= 1 passes).
inline double worst_ratio(const Vec &got, const Vec &want, double atol, double rtol) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = std::fabs(got[i] - want[i]) / (atol + rtol * std::fabs(want[i]));
    if (!(r <= worst)) worst = std::isnan(r) ? INFINITY : r;
  }
  return worst;
}

}  // namespace te_test
