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
