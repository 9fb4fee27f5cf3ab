// STUB (replaced by the adamw kernels).
#include "backends/cuda/cuda_backend.h"
#include "base/check.h"

namespace te::cuda {

void CudaBackend::adamw(const AdamwArgs &) { fail(Status::Unsupported, "adamw: not built yet"); }
void CudaBackend::plan_adamw(const AdamwArgs &, ScratchPlan *) const {}

}  // namespace te::cuda
