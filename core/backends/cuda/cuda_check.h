// Every CUDA runtime call in libte goes through TE_CUDA_CHECK: a failure becomes a te::Error with
// status Cuda naming the call and CUDA's own message, never an abort.
#pragma once

#include <cuda_runtime.h>

#include "base/api_call.h"

namespace te::cuda {

[[noreturn]] void fail_cuda(const char *call, cudaError_t err);

}  // namespace te::cuda

#define TE_CUDA_CHECK(call)                                          \
  do {                                                               \
    cudaError_t te_cuda_err_ = (call);                               \
    if (te_cuda_err_ != cudaSuccess) ::te::cuda::fail_cuda(#call, te_cuda_err_); \
  } while (0)


namespace te::cuda {

// The device a DeviceGuard found current on this thread, and during which API call.
struct KnownDevice {
  uint64_t call = 0;
  int device = -1;
};
inline thread_local KnownDevice t_known_device;

// Makes `device` current for the scope of one backend call, restoring the caller's device:
// a program may drive several GPUs from one thread through several contexts. Within one C API
// call (base/api_call.h) a device found current stays current (every guard restores what it
// changed), so a guard asks the runtime once per call and thread, not once per backend call.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    const uint64_t call = api_call_epoch();
    if (call != 0 && t_known_device.call == call && t_known_device.device == device) return;
    TE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) {
      TE_CUDA_CHECK(cudaSetDevice(device));
      restore_ = true;
      forget();  // current only until this guard restores previous_
    } else if (call != 0) {
      t_known_device = KnownDevice{call, device};
    }
  }
  ~DeviceGuard() {
    if (restore_) {
      cudaSetDevice(previous_);
      forget();  // an inner guard may have recorded device as current
    }
  }
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;

  // For code that makes a device current without restoring it (the backend's destructor).
  static void forget() { t_known_device = KnownDevice{}; }
  // *device = the device a guard found current during this API call, if one did.
  static bool known_current(int *device) {
    const uint64_t call = api_call_epoch();
    if (call == 0 || t_known_device.call != call) return false;
    *device = t_known_device.device;
    return true;
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace te::cuda
