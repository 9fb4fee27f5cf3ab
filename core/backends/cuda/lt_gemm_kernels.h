// The small kernels LtGemm needs around cuBLASLt (lt_block_scales.cu, lt_gemm_fallback.cu) and
// its own kernel for small GEMMs (small_gemm.cu).
// All enqueue on `stream`, never synchronise, and check their launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/types.h"

namespace te::cuda {

// ---- cuBLASLt's block-scaling layouts (lt_block_scales.cu) ----
// libte stores a 1x128 operand [rows, cols]'s scales as [rows][cb] (cb = ceil(cols/128)),
// row-major; cuBLASLt's VEC128_32F wants them outer-dimension-major: [cb][rows].
void transpose_scales(const float *src, float *dst, int64_t rows, int64_t cb, cudaStream_t stream);
// libte's 128x128 scales are [rb][cb] row-major; cuBLASLt's BLK128x128_32F wants the same with
// each row padded to `ld` floats (a multiple of 4: 16-byte aligned rows). Padding is zeroed.
void pad_scales(const float *src, float *dst, int64_t rb, int64_t cb, int64_t ld, cudaStream_t stream);

// ---- the fallback and the split epilogue (lt_gemm_fallback.cu) ----
// out[r, c] = code(x[r, c]) * scale_inv of its block (per-tensor, 1x128 or 128x128), in fp32:
// the exact dequantized operand (one rounding, as the CPU backend computes it).
void dequantize_to_f32(const TensorView &x, float *out, cudaStream_t stream);

// D[m, n] = gelu?(product (+ old D) (+ bias[n])), in cuBLASLt's order, computed in fp32 and
// rounded once into D's dtype; gelu_input (when not null) receives the value before the GELU.
// Used where cuBLASLt's own epilogue cannot do the job exactly (an F32 bias it would round to
// BF16, a pre-GELU output of another dtype, the block-scaled fallback, k = 0).
struct EpilogueArgs {
  const float *product = nullptr;  // [m, n] row-major
  int64_t m = 0, n = 0;
  void *d = nullptr;
  DType d_dtype = DType::F32;
  bool accumulate = false;
  const void *bias = nullptr;  // null: no bias
  DType bias_dtype = DType::F32;
  void *gelu_input = nullptr;  // null: not stored
  DType gelu_input_dtype = DType::F32;
  bool gelu = false;
};
void gemm_epilogue(const EpilogueArgs &args, cudaStream_t stream);

// ---- small GEMMs (small_gemm.cu) ----
// D[m, n] = op(A) op(B) x scales (+ old D) (+ bias[n]) in fp32, rounded once into D's dtype, for
// GEMMs too small for cuBLASLt's host work to pay (LtGemm decides). A is [m, k] ([k, m] when
// transa), B is [k, n] ([n, k] when transb); FP8 operands carry per-tensor or block scales in
// libte's layouts (a_scale / b_scale, null for high-precision operands).
struct SmallGemmArgs {
  const void *a = nullptr, *b = nullptr;
  DType a_dtype = DType::F32, b_dtype = DType::F32;
  bool transa = false, transb = false;
  int64_t m = 0, n = 0, k = 0;
  const float *a_scale = nullptr, *b_scale = nullptr;
  ScalingMode a_mode = ScalingMode::PerTensor, b_mode = ScalingMode::PerTensor;
  void *d = nullptr;
  DType d_dtype = DType::F32;
  bool accumulate = false;
  const void *bias = nullptr;  // null: no bias
  DType bias_dtype = DType::F32;
};
// GEMMs per launch: a GroupedLinear's experts. The parameter block is 8 x 112 bytes for up to 8
// (under 1 KiB: launches like an empty kernel), 32 x 112 beyond (3.5 KiB).
constexpr int kMaxSmallGemms = 32;
// 1..kMaxSmallGemms independent GEMMs (no output read by another) in one launch.
void small_gemm(const SmallGemmArgs *args, int n, cudaStream_t stream);

}  // namespace te::cuda
