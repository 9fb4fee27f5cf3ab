// Elementwise add and strided block copies (the CPU backend's cpu_elementwise.cpp, bit for bit).
#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {

namespace {

// a + b with x86's NaN rules (the CPU reference's addss): the first NaN operand, quietened;
// inf + -inf gives x86's default NaN.
__device__ __forceinline__ float add_x86(float x, float y) {
  const uint32_t bx = __float_as_uint(x), by = __float_as_uint(y);
  if ((bx & kAbsMask) > kFloatInfBits) return __uint_as_float(bx | 0x00400000u);
  if ((by & kAbsMask) > kFloatInfBits) return __uint_as_float(by | 0x00400000u);
  const float r = __fadd_rn(x, y);
  return isnan(r) ? __uint_as_float(0xFFC00000u) : r;
}

__global__ void add_kernel(const void *a, const void *b, void *y, DType t, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dev_store_from_float(y, t, i, add_x86(dev_load_as_float(a, t, i), dev_load_as_float(b, t, i)));
}

}  // namespace

void CudaBackend::add(const TensorView &a, const TensorView &b, const TensorView &y) {
  const int64_t n = y.numel();
  if (n == 0) return;
  DeviceGuard g(device_);
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  launch_kernel<add_kernel>(static_cast<unsigned>(blocks < 8192 ? blocks : 8192), kThreads, 0, stream_, a.data, b.data,
      y.data, y.dtype, n);
}

void CudaBackend::copy_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                          size_t rows) {
  if (rows == 0 || width == 0) return;
  DeviceGuard g(device_);
  TE_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, stream_));
}

}  // namespace te::cuda
