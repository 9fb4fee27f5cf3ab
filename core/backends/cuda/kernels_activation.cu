// Activations (ReLU, GELU, SReLU; the gated SwiGLU and GEGLU) and their gradients in fp32, the
// formulas of cpu/cpu_activation_math.h (TE's). Products and sums use the _rn intrinsics so that
// nothing is contracted into an FMA: the CPU reference rounds each operation, and only tanhf /
// expf may then differ from it (in the last ulp; ReLU and SReLU are bit-identical).
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernels.h"

namespace te::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }

__device__ __forceinline__ float relu(float x) { return x < 0.0f ? 0.0f : x; }
__device__ __forceinline__ float drelu(float x) { return x > 0.0f ? 1.0f : 0.0f; }
__device__ __forceinline__ float srelu(float x) { return mul(relu(x), relu(x)); }
__device__ __forceinline__ float dsrelu(float x) { return x > 0.0f ? mul(2.0f, x) : 0.0f; }

__device__ __forceinline__ float gelu(float x) {
  // x * (0.5 + 0.5 * tanh(x * (0.79788456 + 0.03567741 * x * x)))
  const float inner = mul(x, add(0.79788456f, mul(mul(0.03567741f, x), x)));
  return mul(x, add(0.5f, mul(0.5f, tanhf(inner))));
}

__device__ __forceinline__ float dgelu(float x) {
  const float tanh_out = tanhf(mul(mul(0.79788456f, x), add(1.0f, mul(mul(0.044715f, x), x))));
  const float a = mul(mul(0.5f, x), mul(sub(1.0f, mul(tanh_out, tanh_out)), add(0.79788456f, mul(mul(0.1070322243f, x), x))));
  return add(a, mul(0.5f, add(1.0f, tanh_out)));
}

__device__ __forceinline__ float sigmoid(float x) { return __fdiv_rn(1.0f, add(1.0f, expf(-x))); }
__device__ __forceinline__ float silu(float x) { return mul(x, sigmoid(x)); }
__device__ __forceinline__ float dsilu(float x) {
  const float s = sigmoid(x);
  return add(mul(mul(x, s), sub(1.0f, s)), s);
}

__device__ __forceinline__ float apply(Activation act, float x) {
  return act == Activation::ReLU ? relu(x) : act == Activation::SReLU ? srelu(x) : gelu(x);
}
__device__ __forceinline__ float apply_grad(Activation act, float x) {
  return act == Activation::ReLU ? drelu(x) : act == Activation::SReLU ? dsrelu(x) : dgelu(x);
}
// The gate of a gated activation: SiLU (SwiGLU) or GELU (GEGLU).
__device__ __forceinline__ float gate(Activation act, float a) { return act == Activation::GeGLU ? gelu(a) : silu(a); }
__device__ __forceinline__ float dgate(Activation act, float a) { return act == Activation::GeGLU ? dgelu(a) : dsilu(a); }

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
    gated_forward_kernel<<<grid_for(rows * half), kThreads, 0, stream>>>(act, x.data, x.dtype, y.data, y.dtype, rows,
                                                                        half);
  } else {
    const int64_t n = x.numel();
    if (n == 0) return;
    unary_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(act, x.data, x.dtype, y.data, y.dtype, n);
  }
  TE_CUDA_CHECK_LAUNCH();
}

void activation_backward(Activation act, const TensorView &x, const TensorView &dy, const TensorView &dx,
                         cudaStream_t stream) {
  if (is_gated(act)) {
    const int64_t half = x.cols() / 2, rows = x.rows();
    if (rows * half == 0) return;
    gated_backward_kernel<<<grid_for(rows * half), kThreads, 0, stream>>>(act, x.data, x.dtype, dy.data, dy.dtype,
                                                                         dx.data, dx.dtype, rows, half);
  } else {
    const int64_t n = x.numel();
    if (n == 0) return;
    unary_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(act, x.data, x.dtype, dy.data, dy.dtype, dx.data,
                                                                dx.dtype, n);
  }
  TE_CUDA_CHECK_LAUNCH();
}

}  // namespace te::cuda
