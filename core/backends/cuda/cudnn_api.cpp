#include "backends/cuda/cudnn_api.h"

#include <string>

#include "base/check.h"

namespace te::cuda {

// cuDNN 9's front library first (it loads its engine libraries from its own folder), then the
// unversioned name, then the graph library alone (the backend API lives there).
CudnnApi::CudnnApi()
    : lib_({"libcudnn.so.9", "libcudnn.so", "libcudnn_graph.so.9"}, "cuDNN",
           "cuDNN's fused attention needs it; libte's own attention kernels run without it") {
  lib_.bind("cudnnGetVersion", &get_version);
  lib_.bind("cudnnGetErrorString", &get_error_string);
  lib_.bind("cudnnGetLastErrorString", &get_last_error_string, /*required=*/false);
  lib_.bind("cudnnCreate", &create);
  lib_.bind("cudnnDestroy", &destroy);
  lib_.bind("cudnnSetStream", &set_stream);
  lib_.bind("cudnnBackendCreateDescriptor", &create_descriptor);
  lib_.bind("cudnnBackendDestroyDescriptor", &destroy_descriptor);
  lib_.bind("cudnnBackendSetAttribute", &set_attribute);
  lib_.bind("cudnnBackendGetAttribute", &get_attribute);
  lib_.bind("cudnnBackendFinalize", &finalize);
  lib_.bind("cudnnBackendExecute", &execute);
}

void CudnnApi::check(cudnnStatus_t status, const char *call, Status status_on_error) const {
  if (status == CUDNN_STATUS_SUCCESS) return;
  const char *text = get_error_string ? get_error_string(status) : nullptr;
  char last[1024] = {0};
  if (get_last_error_string) get_last_error_string(last, sizeof(last));
  fail(status_on_error, "%s failed: %s (status %d)%s%s", call, text ? text : "unknown cuDNN status",
       static_cast<int>(status), last[0] ? ": " : "", last);
}

}  // namespace te::cuda
