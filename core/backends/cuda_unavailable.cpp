// The CUDA backend's factory in builds without it: asking for a CUDA context is a clear
// Unsupported error, never a crash.
#include "backends/backend.h"

#if !TE_HAVE_CUDA_BACKEND
namespace te {

bool cuda_backend_available() { return false; }

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  (void)device_index;
  throw Error(Status::Unsupported,
              "argument 'device': CUDA requested, but this libte was built without the CUDA backend "
              "(configure where the CUDA toolkit with cuBLASLt is installed, TE_WITH_CUDA=AUTO or ON)");
}

}  // namespace te
#endif
