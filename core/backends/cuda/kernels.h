// Kernel launchers of the CUDA backend: one function per Backend operation (te/core/backend.h
// states the contract: same arguments, bit-identical results to the CPU backend for casts,
// quantization, amax, scale formulas and scale updates). Every launcher enqueues on `stream`,
// never synchronises, launches through launch_kernel (which throws on a failed launch), and handles any shape
// (1xN, Nx1, primes) without out-of-bounds access. Scratch memory comes from `be.alloc`, which is
// stream-ordered on this backend.
#pragma once

#include <cuda_runtime.h>

#include "backends/backend.h"

namespace te::cuda {

void fill_floats(float *dst, float value, size_t count, cudaStream_t stream);
void zero_many(const ByteRange *ranges, int n, cudaStream_t stream);
void copy_row_segments(void *dst, const void *src, size_t row_bytes, const RowSegment *segs, int n,
                       cudaStream_t stream);

void amax(Backend &be, const TensorView &x, float *amax, bool accumulate, cudaStream_t stream);
void scale_from_amax(const float *amax, float *scale, float *scale_inv, float fp8_max, bool power_of_2,
                     float epsilon, cudaStream_t stream);
void cast_transpose(Backend &be, const TensorView &x, const float *scale, float *amax_accum, TensorView *out,
                    TensorView *out_t, cudaStream_t stream);
void block_quantize(Backend &be, const TensorView &x, ScalingMode mode, bool power_of_2, float epsilon,
                    TensorView *out, TensorView *out_t, cudaStream_t stream);

// ---- several tensors per launch (Backend::quantize_many) ----
constexpr int kMaxCastItems = 8;        // tensors per launch

// The kernels that compute an activation in a cast (ActivationSource) are compiled once per class
// of source, so that their registers are those of one direction's formulas (with direction and
// gating read at run time the fused casts spilled 200-350 bytes): 0 no source, else 1 + backward
// + 2 * gated. One launch holds tensors of one class (quantize_many groups them so).
constexpr int kActivationClasses = 5;
inline int activation_class(const ActivationSource &src) {
  return src.active() ? 1 + (src.backward ? 1 : 0) + (is_gated(src.act) ? 2 : 0) : 0;
}
constexpr int kAmaxPartialBlocks = 256;  // at most this many amax partials per tensor
constexpr int64_t kSelfAmaxElements = 32768;  // current scaling: at most this many, no amax pass

// One tensor of cast_transpose_many: cast_transpose's arguments, or (scale == nullptr) current
// scaling from amax_partials' output: partials[0 .. npartials) -> amax -> *amax_out, the scale
// from compute_scale_from_amax -> *scale_out, its inverse -> *scale_inv_out, then the cast;
// partials == nullptr (x of at most kSelfAmaxElements): the amax of x itself.
struct CastItem {
  TensorView x;
  const float *scale = nullptr;
  float *amax_accum = nullptr;
  float *scale_copy = nullptr;  // delayed: receives *scale
  TensorView *out = nullptr, *out_t = nullptr;
  const uint32_t *partials = nullptr;
  int npartials = 0;
  float *amax_out = nullptr, *scale_out = nullptr, *scale_inv_out = nullptr;
  float fp8_max = 0.0f, epsilon = 0.0f;
  bool power_of_2 = false;
  // Optional: x's column sums (a bias gradient) in the same pass. x of at most 128 rows: the
  // gradient itself, dbias_dtype; else F32 partials [ceil(rows / 128)][cols] for sum_bias_partials.
  void *dbias = nullptr;
  DType dbias_dtype = DType::F32;
  // Optional: x is this activation's output or gradient, computed in the cast (backend.h); x.data
  // may then be null. Delayed scaling (scale set), or current scaling with partials from
  // activation_amax_partials.
  ActivationSource source;
};
// 1..kMaxCastItems items of one input dtype, one pair of output formats and one class of
// activation source (activation_class), one launch.
void cast_transpose_many(const CastItem *items, int n, cudaStream_t stream);
// One tensor of block_quantize_many: block_quantize's arguments.
struct BlockQuantizeItem {
  TensorView x;
  ScalingMode mode = ScalingMode::Block1x128;
  bool power_of_2 = false;
  float epsilon = 0.0f;
  TensorView *out = nullptr, *out_t = nullptr;
  void *dbias = nullptr;  // as CastItem's
  ActivationSource source;  // as CastItem's (x.data may then be null)
  DType dbias_dtype = DType::F32;
};
// 1..kMaxCastItems tensors of one input dtype and class of activation source (any modes), one launch.
void block_quantize_many(const BlockQuantizeItem *items, int n, cudaStream_t stream);
// For 1..kMaxCastItems tensors of one dtype, one launch: the bits of max |x| over each of a
// tensor's blocks go to partials[i * kAmaxPartialBlocks + b]; npartials[i] receives b's count.
void amax_partials(const TensorView *xs, int n, uint32_t *partials, int *npartials, cudaStream_t stream);
// amax_partials for tensors that are activation outputs or gradients (sources[i], all active; xs[i]
// gives the shape and dtype): of x as cast_transpose_many computes it from the same source.
void activation_amax_partials(const TensorView *xs, const ActivationSource *sources, int n, uint32_t *partials,
                              int *npartials, cudaStream_t stream);
void dequantize(const TensorView &x, const TensorView &out, cudaStream_t stream);

void activation_forward(Activation act, const TensorView &x, const TensorView &y, cudaStream_t stream);
void activation_backward(Activation act, const TensorView &x, const TensorView &dy, const TensorView &dx,
                         cudaStream_t stream);
void bias_grad(Backend &be, const TensorView &dy, const TensorView &db, cudaStream_t stream);
// Each (dys[i], dbs[i]) as bias_grad, bit for bit; those summed in one band of rows share launches.
void bias_grad_many(Backend &be, const TensorView *dys, const TensorView *dbs, int n, cudaStream_t stream);
// db = the sum over `parts` rows of partial[parts][cols] (F32), in row order (the second half of
// a bias gradient fused into a cast).
void sum_bias_partials(const float *partial, int64_t parts, int64_t cols, const TensorView &db, cudaStream_t stream);

// LayerNorm / RMSNorm (kernels_norm.cu): statistics in the order of numerics/norm.h, so that
// mu, rsigma, y and the FP8 codes are bit-identical to the CPU backend's. The forward takes no
// scratch; the backward takes norm_backward_scratch_bytes(args) (its dgamma/dbeta partials).
void norm_forward(const NormForwardArgs &args, cudaStream_t stream);
void norm_backward(Backend &be, const NormBackwardArgs &args, cudaStream_t stream);
size_t norm_backward_scratch_bytes(const NormBackwardArgs &args);
// out_t[cols, rows] = in[rows, cols]^T, FP8 codes byte for byte (kernels_transpose_codes.cu).
void transpose_codes(const uint8_t *in, uint8_t *out_t, int64_t rows, int64_t cols, cudaStream_t stream);

// items live on the host; the launchers pass them to the device by value (kernel parameters),
// in chunks when there are many, so that the update stays capturable in a CUDA graph.
void gather_amax(const ScaleUpdateItem *items, int n, float *packed, cudaStream_t stream);
void scale_update(const ScaleUpdateItem *items, int n, const float *reduced_amax, cudaStream_t stream);

}  // namespace te::cuda
