#include "backends/backend.h"

#include "base/check.h"

namespace te {

void ScratchPlan::add(size_t b) {
  if (b == 0) return;
  if (n == kMax) fail(Status::Internal, "scratch plan of more than %d blocks", kMax);
  bytes[n++] = b;
}

}  // namespace te
