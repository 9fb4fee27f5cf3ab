// The kernels of LtGemm's fallback paths (lt_gemm_kernels.h): per-block dequantization of FP8
// operands to fp32, for block-scaled GEMMs that cuBLASLt's block-scaling modes cannot run, and
// the GEMM epilogue in fp32, for epilogues cuBLASLt cannot run exactly.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/lt_gemm_kernels.h"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

template <DType T>
__device__ __forceinline__ float decode_fp8(uint8_t code) {
  if constexpr (T == DType::E4M3) {
    __nv_fp8_e4m3 v;
    v.__x = code;
    return static_cast<float>(v);
  } else {
    __nv_fp8_e5m2 v;
    v.__x = code;
    return static_cast<float>(v);
  }
}

// Mode 0: per-tensor, 1: 1x128 blocks, 2: 128x128 tiles (ScalingMode's values).
template <DType T, int Mode>
__global__ void dequantize_kernel(const uint8_t *__restrict__ x, const float *__restrict__ scale_inv,
                                  float *__restrict__ out, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols, cb = (cols + 127) / 128;
  const float tensor_scale = Mode == 0 ? scale_inv[0] : 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    float s;
    if constexpr (Mode == 0) s = tensor_scale;
    else if constexpr (Mode == 1) s = scale_inv[r * cb + c / 128];
    else s = scale_inv[(r / 128) * cb + c / 128];
    out[i] = decode_fp8<T>(x[i]) * s;
  }
}

template <DType T>
void launch_dequantize(const TensorView &x, float *out, cudaStream_t stream) {
  const auto *codes = static_cast<const uint8_t *>(x.data);
  const int64_t rows = x.rows(), cols = x.cols();
  const int blocks = blocks_for(rows * cols);
  switch (x.scaling) {
    case ScalingMode::PerTensor:
      launch_kernel<dequantize_kernel<T, 0>>(blocks, kThreads, 0, stream, codes, x.scale_inv, out, rows, cols);
      break;
    case ScalingMode::Block1x128:
      launch_kernel<dequantize_kernel<T, 1>>(blocks, kThreads, 0, stream, codes, x.scale_inv, out, rows, cols);
      break;
    case ScalingMode::Block128x128:
      launch_kernel<dequantize_kernel<T, 2>>(blocks, kThreads, 0, stream, codes, x.scale_inv, out, rows, cols);
      break;
  }
}

__device__ __forceinline__ float load(const void *p, DType t, int64_t i) {
  switch (t) {
    case DType::F16: return __half2float(static_cast<const __half *>(p)[i]);
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    default: return static_cast<const float *>(p)[i];
  }
}

__device__ __forceinline__ void store(void *p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F16: static_cast<__half *>(p)[i] = __float2half_rn(v); break;
    case DType::BF16: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float *>(p)[i] = v; break;
  }
}

// The CPU reference's GELU (cpu_activation_math.h, TE's factoring), with IEEE tanhf.
__device__ __forceinline__ float gelu(float x) {
  return x * (0.5f + 0.5f * tanhf(x * (0.79788456f + 0.03567741f * x * x)));
}

__global__ void epilogue_kernel(EpilogueArgs a) {
  const int64_t total = a.m * a.n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float v = a.product[i];
    if (a.accumulate) v += load(a.d, a.d_dtype, i);
    if (a.bias) v += load(a.bias, a.bias_dtype, i % a.n);
    if (a.gelu_input) store(a.gelu_input, a.gelu_input_dtype, i, v);
    if (a.gelu) v = gelu(v);
    store(a.d, a.d_dtype, i, v);
  }
}

}  // namespace

void dequantize_to_f32(const TensorView &x, float *out, cudaStream_t stream) {
  if (x.numel() == 0) return;
  if (x.dtype == DType::E4M3)
    launch_dequantize<DType::E4M3>(x, out, stream);
  else
    launch_dequantize<DType::E5M2>(x, out, stream);
}

void gemm_epilogue(const EpilogueArgs &args, cudaStream_t stream) {
  if (args.m * args.n == 0) return;
  launch_kernel<epilogue_kernel>(blocks_for(args.m * args.n), kThreads, 0, stream, args);
}

}  // namespace te::cuda
