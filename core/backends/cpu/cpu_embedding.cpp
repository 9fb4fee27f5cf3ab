// STUB (replaced by the embedding implementation).
#include "backends/cpu/cpu_backend.h"
#include "base/check.h"

namespace te {

void CpuBackend::embedding_forward(const EmbeddingForwardArgs &) { fail(Status::Unsupported, "embedding: not built yet"); }
void CpuBackend::embedding_backward(const EmbeddingBackwardArgs &) { fail(Status::Unsupported, "embedding: not built yet"); }

}  // namespace te
