// STUB (replaced by the cross_entropy kernels).
#include "backends/cuda/cuda_backend.h"
#include "base/check.h"

namespace te::cuda {

void CudaBackend::cross_entropy(const CrossEntropyArgs &) { fail(Status::Unsupported, "cross_entropy: not built yet"); }
void CudaBackend::plan_cross_entropy(const CrossEntropyArgs &, ScratchPlan *) const {}

}  // namespace te::cuda
