// Placeholder until the fused norm kernels land: the CUDA backend reports norms as unsupported.
#include "backends/cuda/cuda_backend.h"

namespace te::cuda {

void CudaBackend::norm_forward(const NormForwardArgs &) {
  throw Error(Status::Unsupported, "LayerNorm/RMSNorm are not implemented on CUDA yet");
}
void CudaBackend::norm_backward(const NormBackwardArgs &) {
  throw Error(Status::Unsupported, "LayerNorm/RMSNorm are not implemented on CUDA yet");
}

}  // namespace te::cuda
