#include "numerics/norm.h"

#include <cmath>

namespace te {

void norm_row_stats(NormKind kind, const float *x, int64_t n, float eps, float *mu, float *rsigma) {
  const float count = static_cast<float>(n);
  float m = 0.0f, second;
  if (kind == NormKind::LayerNorm) {
    m = norm_ordered_sum(n, [&](int64_t i) { return x[i]; }) / count;
    second = norm_ordered_sum(n, [&](int64_t i) {
      const float d = x[i] - m;
      return d * d;
    });
  } else {
    second = norm_ordered_sum(n, [&](int64_t i) { return x[i] * x[i]; });
  }
  *mu = m;
  *rsigma = 1.0f / std::sqrt(second / count + eps);
}

}  // namespace te
