// Activations (ReLU, GELU, SReLU; the gated SwiGLU and GEGLU) and the bias gradient on the CPU:
// fp32 math on chunks converted from and to the tensors' dtype, so each inner loop is one plain
// float loop.
#include <algorithm>

#include "backends/cpu/cpu_activation_math.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_convert.h"

namespace te {

namespace {

constexpr int64_t kChunk = 1024;

template <typename F>
void map_unary(const TensorView &x, const TensorView &y, F f) {
  float buf[kChunk];
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    cpu::load_floats(x.data, x.dtype, i, len, buf);
    for (int64_t j = 0; j < len; ++j) buf[j] = f(buf[j]);
    cpu::store_floats(buf, len, y.data, y.dtype, i);
  }
}

// dx = dy * f'(x), elementwise.
template <typename F>
void map_grad(const TensorView &x, const TensorView &dy, const TensorView &dx, F fprime) {
  float xs[kChunk], gs[kChunk];
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    cpu::load_floats(x.data, x.dtype, i, len, xs);
    cpu::load_floats(dy.data, dy.dtype, i, len, gs);
    for (int64_t j = 0; j < len; ++j) gs[j] *= fprime(xs[j]);
    cpu::store_floats(gs, len, dx.data, dx.dtype, i);
  }
}

// Gated: each row of x is [gate input a | linear part b]; y = gate(a) * b.
template <typename F>
void gated_forward(Backend *be, const TensorView &x, const TensorView &y, F gate) {
  const int64_t half = x.cols() / 2, rows = x.rows();
  Buffer row_storage(be, static_cast<size_t>(2 * half) * sizeof(float));
  float *xr = row_storage.floats();
  for (int64_t r = 0; r < rows; ++r) {
    cpu::load_floats(x.data, x.dtype, r * 2 * half, 2 * half, xr);
    for (int64_t j = 0; j < half; ++j) xr[j] = gate(xr[j]) * xr[half + j];
    cpu::store_floats(xr, half, y.data, y.dtype, r * half);
  }
}

// d/da = dy * gate'(a) * b, d/db = dy * gate(a); dx has x's shape [..., 2n].
template <typename F, typename DF>
void gated_backward(Backend *be, const TensorView &x, const TensorView &dy, const TensorView &dx, F gate,
                    DF dgate) {
  const int64_t half = x.cols() / 2, rows = x.rows();
  Buffer storage(be, static_cast<size_t>(3 * half) * sizeof(float));
  float *xr = storage.floats();     // [a | b], then overwritten by [da | db]
  float *gr = xr + 2 * half;        // dy row
  for (int64_t r = 0; r < rows; ++r) {
    cpu::load_floats(x.data, x.dtype, r * 2 * half, 2 * half, xr);
    cpu::load_floats(dy.data, dy.dtype, r * half, half, gr);
    for (int64_t j = 0; j < half; ++j) {
      const float a = xr[j], b = xr[half + j], g = gr[j];
      xr[j] = g * dgate(a) * b;
      xr[half + j] = g * gate(a);
    }
    cpu::store_floats(xr, 2 * half, dx.data, dx.dtype, r * 2 * half);
  }
}

}  // namespace

void CpuBackend::activation_forward(Activation act, const TensorView &x, const TensorView &y) {
  switch (act) {
    case Activation::ReLU: map_unary(x, y, cpu::relu); return;
    case Activation::GELU: map_unary(x, y, cpu::gelu); return;
    case Activation::SReLU: map_unary(x, y, cpu::srelu); return;
    case Activation::SwiGLU: gated_forward(this, x, y, [](float a) { return cpu::silu(a); }); return;
    case Activation::GeGLU: gated_forward(this, x, y, [](float a) { return cpu::gelu(a); }); return;
  }
}

void CpuBackend::activation_backward(Activation act, const TensorView &x, const TensorView &dy,
                                     const TensorView &dx) {
  switch (act) {
    case Activation::ReLU: map_grad(x, dy, dx, cpu::drelu); return;
    case Activation::GELU: map_grad(x, dy, dx, cpu::dgelu); return;
    case Activation::SReLU: map_grad(x, dy, dx, cpu::dsrelu); return;
    case Activation::SwiGLU:
      gated_backward(this, x, dy, dx, [](float a) { return cpu::silu(a); }, [](float a) { return cpu::dsilu(a); });
      return;
    case Activation::GeGLU:
      gated_backward(this, x, dy, dx, [](float a) { return cpu::gelu(a); }, [](float a) { return cpu::dgelu(a); });
      return;
  }
}

void CpuBackend::plan_bias_grad(const TensorView &dy, ScratchPlan *plan) const {
  plan->add(static_cast<size_t>(2 * dy.cols()) * sizeof(float));
}

void CpuBackend::bias_grad(const TensorView &dy, const TensorView &db) {
  const int64_t n = dy.cols(), rows = dy.rows();
  Buffer storage(this, static_cast<size_t>(2 * n) * sizeof(float));
  float *sum = storage.floats();
  float *row = sum + n;
  std::fill(sum, sum + n, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    cpu::load_floats(dy.data, dy.dtype, r * n, n, row);
    for (int64_t j = 0; j < n; ++j) sum[j] += row[j];
  }
  cpu::store_floats(sum, n, db.data, db.dtype, 0);
}

}  // namespace te
