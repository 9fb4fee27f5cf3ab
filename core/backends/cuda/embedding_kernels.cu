// STUB (replaced by the embedding kernels).
#include "backends/cuda/cuda_backend.h"
#include "base/check.h"

namespace te::cuda {

void CudaBackend::embedding_forward(const EmbeddingForwardArgs &) { fail(Status::Unsupported, "embedding: not built yet"); }
void CudaBackend::embedding_backward(const EmbeddingBackwardArgs &) { fail(Status::Unsupported, "embedding: not built yet"); }
void CudaBackend::plan_embedding_backward(const EmbeddingBackwardArgs &, ScratchPlan *) const {}

}  // namespace te::cuda
