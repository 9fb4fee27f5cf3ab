// Kernel launches through the driver: cuLaunchKernel on the CUfunction the runtime resolved once
// per kernel and CUDA context. A `<<<>>>` launch is two runtime calls (the configuration push and
// cudaLaunchKernel) and a lookup of the kernel each time; at the tiny shapes where host time
// decides a step's speed, that layer is a tenth of the launch (te_bench_gpu_host on an H200:
// bare_launch 3.8-4.1 us, bare_launch_driver 3.4 us, same program), and a step makes 4-12
// launches. Where the driver's entry points are unavailable, or a process uses more contexts
// than a kernel's cache holds, the same launch goes through cudaLaunchKernel.
//
//   launch_kernel<kernel>(grid, block, shared_bytes, stream, args...);  // throws te::Error on failure
//
// The arguments are converted to the kernel's parameter types first, exactly as `<<<>>>` does.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <tuple>
#include <type_traits>
#include <utility>

#include "backends/cuda/cuda_check.h"

namespace te::cuda {

// One kernel's CUfunction per CUDA context, filled on first use; lookups take no lock. Contexts
// are told apart by their process-unique id (cuCtxGetId), not their handle, which a context
// created after another's destruction (cudaDeviceReset) may reuse.
struct KernelFunctions {
  static constexpr int kSlots = 8;
  std::atomic<int> used{0};
  unsigned long long context_id[kSlots] = {};
  CUfunction function[kSlots] = {};
};

// The CUfunction of `kernel` (a __global__ function's host address) in the calling thread's
// current context, or nullptr: then the caller launches through the runtime.
CUfunction kernel_function(const void *kernel, KernelFunctions &cache);

// cuLaunchKernel, checked (the driver's message and name on failure).
void driver_launch(CUfunction f, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, void **params);

template <auto Kernel>
KernelFunctions &kernel_functions() {
  static KernelFunctions cache;
  return cache;
}

template <auto Kernel, class... Params, class... Args>
void launch_as(void (*)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
               Args &&...args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch_kernel: wrong number of kernel arguments");
  std::tuple<std::remove_cv_t<Params>...> values(std::forward<Args>(args)...);
  std::apply(
      [&](auto &...v) {
        void *params[sizeof...(Params) + 1] = {const_cast<void *>(static_cast<const void *>(&v))..., nullptr};
        const void *k = reinterpret_cast<const void *>(Kernel);
        if (CUfunction f = kernel_function(k, kernel_functions<Kernel>())) {
          driver_launch(f, grid, block, shared_bytes, stream, params);
        } else {
          TE_CUDA_CHECK(cudaLaunchKernel(k, grid, block, params, shared_bytes, stream));
        }
      },
      values);
}

template <auto Kernel, class... Args>
void launch_kernel(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, Args &&...args) {
  launch_as<Kernel>(Kernel, grid, block, shared_bytes, stream, std::forward<Args>(args)...);
}

}  // namespace te::cuda
