// Every CUDA runtime call in libte goes through TE_CUDA_CHECK: a failure becomes a te::Error with
// status Cuda naming the call and CUDA's own message, never an abort.
#pragma once

#include <cuda_runtime.h>

namespace te::cuda {

[[noreturn]] void fail_cuda(const char *call, cudaError_t err);

}  // namespace te::cuda

#define TE_CUDA_CHECK(call)                                          \
  do {                                                               \
    cudaError_t te_cuda_err_ = (call);                               \
    if (te_cuda_err_ != cudaSuccess) ::te::cuda::fail_cuda(#call, te_cuda_err_); \
  } while (0)

// After a kernel launch: a bad configuration is reported by the launch itself.
#define TE_CUDA_CHECK_LAUNCH() TE_CUDA_CHECK(cudaGetLastError())

namespace te::cuda {

// Makes `device` current for the scope of one backend call, restoring the caller's device:
// a program may drive several GPUs from one thread through several contexts.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    TE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) TE_CUDA_CHECK(cudaSetDevice(device));
    device_ = device;
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;

 private:
  int previous_ = 0, device_ = 0;
};

}  // namespace te::cuda
