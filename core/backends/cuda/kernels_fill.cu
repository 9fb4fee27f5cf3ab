// fill_floats: dst[0..count) = value.
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"

namespace te::cuda {

namespace {

__global__ void fill_floats_kernel(float *dst, float value, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) dst[i] = value;
}

}  // namespace

void fill_floats(float *dst, float value, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  constexpr int kThreads = 256;
  const size_t blocks = (count + kThreads - 1) / kThreads;
  fill_floats_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(dst, value, count);
  TE_CUDA_CHECK_LAUNCH();
}

}  // namespace te::cuda
