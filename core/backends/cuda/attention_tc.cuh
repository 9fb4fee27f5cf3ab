// Tensor-core attention paths (mma.sync), used by attention_kernels.cu where they apply.
#pragma once

#include <cuda_runtime.h>

#include "backends/backend.h"

namespace te::cuda {

// Each returns false (enqueuing nothing) when the call is not one it covers.
bool attention_tc_forward(const AttentionForwardArgs &args, cudaStream_t stream);
bool attention_tc_backward(const AttentionBackwardArgs &args, const float *dsum, cudaStream_t stream);

}  // namespace te::cuda
