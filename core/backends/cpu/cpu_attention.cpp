#include "backends/cpu/cpu_backend.h"
#include "base/check.h"

namespace te {

void CpuBackend::attention_forward(const AttentionForwardArgs &) { fail(Status::Unsupported, "attention: soon"); }
void CpuBackend::attention_backward(const AttentionBackwardArgs &) { fail(Status::Unsupported, "attention: soon"); }
void CpuBackend::rope(const RopeArgs &) { fail(Status::Unsupported, "rope: soon"); }

}  // namespace te
