// dequantize: out = decode(code) * scale_inv of the code's block (per-tensor, 1x128 or 128x128),
// stored as F32 / F16 / BF16 with the CPU's bits, NaNs included (x86's NaN rules for the product).
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kBlock = 128;

__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t *codes, DType in_t, ScalingMode mode, const float *scale_inv, int64_t rows,
                      int64_t cols, void *out, DType out_t) {
  const int64_t n = rows * cols;
  const int64_t col_blocks = (cols + kBlock - 1) / kBlock;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float si = scale_inv[0];
    if (mode != ScalingMode::PerTensor) {
      const int64_t r = i / cols, cb = (i - r * cols) / kBlock;
      si = scale_inv[(mode == ScalingMode::Block1x128 ? r : r / kBlock) * col_blocks + cb];
    }
    dev_store_from_float(out, out_t, i, mul_x86(dev_fp8_to_float(codes[i], in_t), si));
  }
}

}  // namespace

void dequantize(const TensorView &x, const TensorView &out, cudaStream_t stream) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  launch_kernel<dequantize_kernel>(static_cast<unsigned>(blocks < 8192 ? blocks : 8192), kThreads, 0, stream,
      static_cast<const uint8_t *>(x.data), x.dtype, x.scaling, x.scale_inv, x.rows(), x.cols(), out.data, out.dtype);
}

}  // namespace te::cuda
