// Scale arrays of block-scaled FP8 operands, rearranged into the layouts cuBLASLt's block-scaling
// modes read (lt_gemm_kernels.h). They are tiny (one float per 128 or 128x128 elements), so
// plain one-thread-per-element kernels are enough.
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/lt_gemm_kernels.h"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void transpose_scales_kernel(const float *__restrict__ src, float *__restrict__ dst, int64_t rows,
                                        int64_t cb) {
  const int64_t total = rows * cb;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i % rows, c = i / rows;  // i indexes dst, [cb][rows]
    dst[i] = src[r * cb + c];
  }
}

__global__ void pad_scales_kernel(const float *__restrict__ src, float *__restrict__ dst, int64_t rb, int64_t cb,
                                  int64_t ld) {
  const int64_t total = rb * ld;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / ld, c = i % ld;
    dst[i] = c < cb ? src[r * cb + c] : 0.0f;
  }
}

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

}  // namespace

void transpose_scales(const float *src, float *dst, int64_t rows, int64_t cb, cudaStream_t stream) {
  if (rows * cb == 0) return;
  launch_kernel<transpose_scales_kernel>(blocks_for(rows * cb), kThreads, 0, stream, src, dst, rows, cb);
}

void pad_scales(const float *src, float *dst, int64_t rb, int64_t cb, int64_t ld, cudaStream_t stream) {
  if (rb * ld == 0) return;
  launch_kernel<pad_scales_kernel>(blocks_for(rb * ld), kThreads, 0, stream, src, dst, rb, cb, ld);
}

}  // namespace te::cuda
