// cuDNN's backend (graph) API, loaded at run time like cuBLASLt (lt_api.h): the functions are
// looked up with dlsym and typed from <cudnn_graph.h> itself (decltype), so libte.so loads on
// machines without cuDNN and a signature change is a compile error here.
#pragma once

#include <cudnn_graph.h>

#include "base/dynamic_library.h"
#include "base/types.h"

namespace te::cuda {

class CudnnApi {
 public:
  // Loads libcudnn.so.9 (then libcudnn.so, then libcudnn_graph.so.9, which holds the backend
  // API). Throws te::Error(Unsupported) naming the library and dlerror() when none loads or a
  // function is missing.
  CudnnApi();
  CudnnApi(const CudnnApi &) = delete;
  CudnnApi &operator=(const CudnnApi &) = delete;

  decltype(&cudnnGetVersion) get_version = nullptr;
  decltype(&cudnnGetErrorString) get_error_string = nullptr;
  decltype(&cudnnGetLastErrorString) get_last_error_string = nullptr;  // optional
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnDestroy) destroy = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) create_descriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor = nullptr;
  decltype(&cudnnBackendSetAttribute) set_attribute = nullptr;
  decltype(&cudnnBackendGetAttribute) get_attribute = nullptr;
  decltype(&cudnnBackendFinalize) finalize = nullptr;
  decltype(&cudnnBackendExecute) execute = nullptr;

  // Throws te::Error(status_on_error) "<call> failed: <cuDNN's status text>: <cuDNN's last
  // error message>" unless status is CUDNN_STATUS_SUCCESS.
  void check(cudnnStatus_t status, const char *call, Status status_on_error = Status::Internal) const;

 private:
  DynamicLibrary lib_;
};

}  // namespace te::cuda
