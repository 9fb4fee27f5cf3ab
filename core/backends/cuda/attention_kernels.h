// libte's own CUDA attention and RoPE kernels (attention_kernels.cu, rope_kernels.cu): every
// shape, mask, dtype (F32/F16/BF16, FP8 E4M3 q/k/v) and GQA ratio the core accepts, following
// numerics/attention.h. cuDNN's fused SDPA (cudnn_sdpa.h) is preferred where it applies; these
// kernels are the fallback and the GPU's own check of it.
#pragma once

#include <cuda_runtime.h>

#include "backends/backend.h"

namespace te::cuda {

// Scratch (bytes, taken with be.alloc inside the call) of the calls below.
size_t attention_forward_scratch_bytes(const AttentionForwardArgs &args);
size_t attention_backward_scratch_bytes(const AttentionBackwardArgs &args);
void attention_forward_kernels(Backend &be, const AttentionForwardArgs &args, cudaStream_t stream);
void attention_backward_kernels(Backend &be, const AttentionBackwardArgs &args, cudaStream_t stream);
// table: scratch of rope_table_bytes(args) bytes (nullptr when that is 0): the angles' cos and
// sin computed once per call.
size_t rope_table_bytes(const RopeArgs &args);
void rope_kernel(const RopeArgs &args, cudaStream_t stream, float *table);

}  // namespace te::cuda
