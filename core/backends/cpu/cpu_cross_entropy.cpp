// STUB (replaced by the cross_entropy implementation).
#include "backends/cpu/cpu_backend.h"
#include "base/check.h"

namespace te {

void CpuBackend::cross_entropy(const CrossEntropyArgs &) { fail(Status::Unsupported, "cross_entropy: not built yet"); }

}  // namespace te
