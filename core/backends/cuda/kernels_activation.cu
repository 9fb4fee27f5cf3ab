// Activations (ReLU, GELU, SReLU; the gated SwiGLU and GEGLU) and their gradients, elementwise
// (activation_math.cuh has the formulas; the FP8 casts, block quantization and current scaling's
// amax pass also run them, fused, through activation_tile.cuh).
#include "backends/cuda/activation_math.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {

namespace {

using namespace act_math;

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    unary_forward_kernel(Activation act, const void *x, DType xt, void *y, DType yt, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dev_store_from_float(y, yt, i, apply(act, dev_load_as_float(x, xt, i)));
}

__global__ void __launch_bounds__(kThreads) unary_backward_kernel(Activation act, const void *x, DType xt, const void *dy,
                                                                  DType dyt, void *dx, DType dxt, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dev_store_from_float(dx, dxt, i, mul(dev_load_as_float(dy, dyt, i), apply_grad(act, dev_load_as_float(x, xt, i))));
}

// x: [rows, 2 * half] = [a | b] per row; y: [rows, half] = gate(a) * b.
__global__ void __launch_bounds__(kThreads)
    gated_forward_kernel(Activation act, const void *x, DType xt, void *y, DType yt, int64_t rows, int64_t half) {
  const int64_t n = rows * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / half, j = i - r * half;
    const float a = dev_load_as_float(x, xt, r * 2 * half + j), b = dev_load_as_float(x, xt, r * 2 * half + half + j);
    dev_store_from_float(y, yt, i, mul(gate(act, a), b));
  }
}

// dx = [dy * gate'(a) * b | dy * gate(a)].
__global__ void __launch_bounds__(kThreads) gated_backward_kernel(Activation act, const void *x, DType xt, const void *dy,
                                                                  DType dyt, void *dx, DType dxt, int64_t rows,
                                                                  int64_t half) {
  const int64_t n = rows * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / half, j = i - r * half;
    const int64_t ia = r * 2 * half + j, ib = ia + half;
    const float a = dev_load_as_float(x, xt, ia), b = dev_load_as_float(x, xt, ib);
    const float g = dev_load_as_float(dy, dyt, i);
    dev_store_from_float(dx, dxt, ia, mul(mul(g, dgate(act, a)), b));
    dev_store_from_float(dx, dxt, ib, mul(g, gate(act, a)));
  }
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 8192 ? 8192 : blocks));
}

}  // namespace

void activation_forward(Activation act, const TensorView &x, const TensorView &y, cudaStream_t stream) {
  if (is_gated(act)) {
    const int64_t half = x.cols() / 2, rows = x.rows();
    if (rows * half == 0) return;
    launch_kernel<gated_forward_kernel>(grid_for(rows * half), kThreads, 0, stream, act, x.data, x.dtype, y.data,
        y.dtype, rows, half);
  } else {
    const int64_t n = x.numel();
    if (n == 0) return;
    launch_kernel<unary_forward_kernel>(grid_for(n), kThreads, 0, stream, act, x.data, x.dtype, y.data, y.dtype, n);
  }
}

void activation_backward(Activation act, const TensorView &x, const TensorView &dy, const TensorView &dx,
                         cudaStream_t stream) {
  if (is_gated(act)) {
    const int64_t half = x.cols() / 2, rows = x.rows();
    if (rows * half == 0) return;
    launch_kernel<gated_backward_kernel>(grid_for(rows * half), kThreads, 0, stream, act, x.data, x.dtype, dy.data,
        dy.dtype, dx.data, dx.dtype, rows, half);
  } else {
    const int64_t n = x.numel();
    if (n == 0) return;
    launch_kernel<unary_backward_kernel>(grid_for(n), kThreads, 0, stream, act, x.data, x.dtype, dy.data, dy.dtype,
        dx.data, dx.dtype, n);
  }
}

}  // namespace te::cuda
