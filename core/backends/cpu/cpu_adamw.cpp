// STUB (replaced by the adamw implementation).
#include "backends/cpu/cpu_backend.h"
#include "base/check.h"

namespace te {

void CpuBackend::adamw(const AdamwArgs &) { fail(Status::Unsupported, "adamw: not built yet"); }

}  // namespace te
