// Kernel launchers of the CUDA backend: one function per Backend operation (te/core/backend.h
// states the contract: same arguments, bit-identical results to the CPU backend for casts,
// quantization, amax, scale formulas and scale updates). Every launcher enqueues on `stream`,
// never synchronises, checks its launch with TE_CUDA_CHECK_LAUNCH, and handles any shape
// (1xN, Nx1, primes) without out-of-bounds access. Scratch memory comes from `be.alloc`, which is
// stream-ordered on this backend.
#pragma once

#include <cuda_runtime.h>

#include "backends/backend.h"

namespace te::cuda {

void fill_floats(float *dst, float value, size_t count, cudaStream_t stream);

void amax(Backend &be, const TensorView &x, float *amax, bool accumulate, cudaStream_t stream);
void scale_from_amax(const float *amax, float *scale, float *scale_inv, float fp8_max, bool power_of_2,
                     float epsilon, cudaStream_t stream);
void cast_transpose(Backend &be, const TensorView &x, const float *scale, float *amax_accum, TensorView *out,
                    TensorView *out_t, cudaStream_t stream);
void block_quantize(Backend &be, const TensorView &x, ScalingMode mode, bool power_of_2, float epsilon,
                    TensorView *out, TensorView *out_t, cudaStream_t stream);
void dequantize(const TensorView &x, const TensorView &out, cudaStream_t stream);

void activation_forward(Activation act, const TensorView &x, const TensorView &y, cudaStream_t stream);
void activation_backward(Activation act, const TensorView &x, const TensorView &dy, const TensorView &dx,
                         cudaStream_t stream);
void bias_grad(Backend &be, const TensorView &dy, const TensorView &db, cudaStream_t stream);

// LayerNorm / RMSNorm (kernels_norm.cu): statistics in the order of numerics/norm.h, so that
// mu, rsigma, y and the FP8 codes are bit-identical to the CPU backend's. The forward takes no
// scratch; the backward takes norm_backward_scratch_bytes(args) (its dgamma/dbeta partials).
void norm_forward(const NormForwardArgs &args, cudaStream_t stream);
void norm_backward(Backend &be, const NormBackwardArgs &args, cudaStream_t stream);
size_t norm_backward_scratch_bytes(const NormBackwardArgs &args);

// items live on the host; the launchers pass them to the device by value (kernel parameters),
// in chunks when there are many, so that the update stays capturable in a CUDA graph.
void gather_amax(const ScaleUpdateItem *items, int n, float *packed, cudaStream_t stream);
void scale_update(const ScaleUpdateItem *items, int n, const float *reduced_amax, cudaStream_t stream);

}  // namespace te::cuda
