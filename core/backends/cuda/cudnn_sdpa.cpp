// Placeholder until the cuDNN path lands: cuDNN is reported unavailable.
#include "backends/cuda/cudnn_sdpa.h"

namespace te::cuda {

std::unique_ptr<CudnnSdpa> CudnnSdpa::create(int, const char **why) {
  if (why) *why = "libte's cuDNN attention is not built yet";
  return nullptr;
}

}  // namespace te::cuda
