// Kernel launches through the driver: cuLaunchKernel on the kernel's context-free handle (a
// CUkernel, which the driver resolves in the stream's context), looked up once per kernel. A
// `<<<>>>` launch is two runtime calls (the configuration push and cudaLaunchKernel) and a lookup
// of the kernel each time; at the tiny shapes where host time decides a step's speed, that layer
// is a tenth of the launch (te_bench_gpu_host on an H200: bare_launch 3.8-4.1 us,
// bare_launch_driver 3.4 us, same program), and a step makes 4-12 launches. A handle per context
// (cudaGetFuncBySymbol) would need two more driver calls per launch to find the context. Where the
// driver's entry points are unavailable, or the launch has no context to run in (the legacy
// stream on a thread that never made one current), the same launch goes through cudaLaunchKernel.
//
//   launch_kernel<kernel>(grid, block, shared_bytes, stream, args...);  // throws te::Error on failure
//
// The arguments are converted to the kernel's parameter types first, exactly as `<<<>>>` does.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "backends/cuda/cuda_check.h"

namespace te::cuda {

// `kernel`'s (a __global__ function's host address) context-free handle, cast to the CUfunction
// that cuLaunchKernel takes, or nullptr: then the caller launches through the runtime.
CUfunction kernel_handle(const void *kernel);

// cuLaunchKernel, checked (the driver's message and name on failure). False, with nothing
// launched and no error left, where the launch has no context: the caller uses the runtime,
// which makes the device's primary context current.
bool driver_launch(CUfunction f, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, void **params);

template <auto Kernel>
CUfunction kernel_handle() {
  static const CUfunction handle = kernel_handle(reinterpret_cast<const void *>(Kernel));
  return handle;
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
        const CUfunction f = kernel_handle<Kernel>();
        if (!f || !driver_launch(f, grid, block, shared_bytes, stream, params))
          TE_CUDA_CHECK(cudaLaunchKernel(k, grid, block, params, shared_bytes, stream));
      },
      values);
}

template <auto Kernel, class... Args>
void launch_kernel(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, Args &&...args) {
  launch_as<Kernel>(Kernel, grid, block, shared_bytes, stream, std::forward<Args>(args)...);
}

}  // namespace te::cuda
