// LayerNorm / RMSNorm on the CPU: the reference of numerics/norm.h. The forward normalises one
// row at a time in fp32 and writes whichever outputs were asked for from those fp32 values; the
// FP8 codes are float_to_fp8(v * scale), as every cast.
#include <algorithm>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_convert.h"

namespace te {

void CpuBackend::plan_norm_forward(const NormForwardArgs &a, ScratchPlan *plan) const {
  plan->add(static_cast<size_t>(3 * a.x.cols()) * sizeof(float));
}

void CpuBackend::norm_forward(const NormForwardArgs &a) {
  const int64_t rows = a.x.rows(), n = a.x.cols();
  const bool layer = a.kind == NormKind::LayerNorm;
  Buffer scratch(this, static_cast<size_t>(3 * n) * sizeof(float));
  float *xf = scratch.floats(), *g = xf + n, *b = g + n;
  cpu::load_floats(a.gamma.data, a.gamma.dtype, 0, n, g);
  for (int64_t j = 0; j < n; ++j) g[j] = norm_gamma(g[j], a.zero_centered_gamma);
  if (a.beta.data) cpu::load_floats(a.beta.data, a.beta.dtype, 0, n, b);
  const float s = a.scale ? *a.scale : 1.0f;
  float m = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    cpu::load_floats(a.x.data, a.x.dtype, r * n, n, xf);
    float mu, rsigma;
    norm_row_stats(a.kind, xf, n, a.eps, &mu, &rsigma);
    for (int64_t j = 0; j < n; ++j) {
      const float x_hat = layer ? (xf[j] - mu) * rsigma : xf[j] * rsigma;
      const float scaled = x_hat * g[j];
      xf[j] = a.beta.data ? scaled + b[j] : scaled;
    }
    if (a.mu) a.mu[r] = mu;
    if (a.rsigma) a.rsigma[r] = rsigma;
    if (a.amax_accum) m = cpu::nan_max(m, cpu::abs_max(xf, n));
    if (a.y.data) cpu::store_floats(xf, n, a.y.data, a.y.dtype, r * n);
    if (a.out) {
      uint8_t *codes = static_cast<uint8_t *>(a.out->data) + r * n;
      for (int64_t j = 0; j < n; ++j) codes[j] = float_to_fp8(xf[j] * s, a.out->dtype);
    }
    if (a.out_t) {
      uint8_t *codes = static_cast<uint8_t *>(a.out_t->data);
      for (int64_t j = 0; j < n; ++j) codes[j * rows + r] = float_to_fp8(xf[j] * s, a.out_t->dtype);
    }
  }
  if (a.out) a.out->scale_inv[0] = 1.0f / s;
  if (a.out_t) a.out_t->scale_inv[0] = 1.0f / s;
  if (a.amax_accum) *a.amax_accum = cpu::nan_max(*a.amax_accum, m);
}

void CpuBackend::plan_norm_backward(const NormBackwardArgs &a, ScratchPlan *plan) const {
  plan->add(static_cast<size_t>(6 * a.x.cols()) * sizeof(float));
}

void CpuBackend::norm_backward(const NormBackwardArgs &a) {
  const int64_t rows = a.x.rows(), n = a.x.cols();
  const bool layer = a.kind == NormKind::LayerNorm;
  const float count = static_cast<float>(n);
  Buffer scratch(this, static_cast<size_t>(6 * n) * sizeof(float));
  float *xf = scratch.floats(), *dyf = xf + n, *g = dyf + n, *dyg = g + n, *dgamma = dyg + n, *dbeta = dgamma + n;
  cpu::load_floats(a.gamma.data, a.gamma.dtype, 0, n, g);
  for (int64_t j = 0; j < n; ++j) g[j] = norm_gamma(g[j], a.zero_centered_gamma);
  std::fill(dgamma, dgamma + 2 * n, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    cpu::load_floats(a.x.data, a.x.dtype, r * n, n, xf);
    cpu::load_floats(a.dy.data, a.dy.dtype, r * n, n, dyf);
    const float mu = layer ? a.mu[r] : 0.0f, rsigma = a.rsigma[r];
    // xf becomes x_hat in place.
    for (int64_t j = 0; j < n; ++j) {
      xf[j] = layer ? (xf[j] - mu) * rsigma : xf[j] * rsigma;
      dyg[j] = dyf[j] * g[j];
      dgamma[j] = dgamma[j] + dyf[j] * xf[j];
      dbeta[j] = dbeta[j] + dyf[j];
    }
    if (!a.dx.data) continue;
    const float c1 = norm_ordered_sum(n, [&](int64_t j) { return dyg[j] * xf[j]; }) / count;
    const float c2 = layer ? norm_ordered_sum(n, [&](int64_t j) { return dyg[j]; }) / count : 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      const float t = layer ? xf[j] * c1 + c2 : xf[j] * c1;
      dyf[j] = (dyg[j] - t) * rsigma;
    }
    cpu::store_floats(dyf, n, a.dx.data, a.dx.dtype, r * n);
  }
  if (a.dgamma.data) cpu::store_floats(dgamma, n, a.dgamma.data, a.dgamma.dtype, 0);
  if (a.dbeta.data) cpu::store_floats(dbeta, n, a.dbeta.data, a.dbeta.dtype, 0);
  if (a.then_update_count > 0) scale_update(a.then_update, a.then_update_count, nullptr);
}

}  // namespace te
