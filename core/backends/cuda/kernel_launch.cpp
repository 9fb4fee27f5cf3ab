#include "backends/cuda/kernel_launch.cuh"

#include <mutex>

#include "base/check.h"

namespace te::cuda {

namespace {

using LaunchKernelFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream, void **, void **);
using CtxGetCurrentFn = CUresult (*)(CUcontext *);
using CtxGetIdFn = CUresult (*)(CUcontext, unsigned long long *);
using GetErrorFn = CUresult (*)(CUresult, const char **);

struct DriverEntryPoints {
  LaunchKernelFn launch = nullptr;
  CtxGetCurrentFn current_context = nullptr;
  CtxGetIdFn context_id = nullptr;
  GetErrorFn error_name = nullptr, error_string = nullptr;
};

template <class Fn>
void find(const char *name, Fn *out) {
  void *p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess)
    *out = reinterpret_cast<Fn>(p);
  else
    cudaGetLastError();  // a failed query leaves nothing for the next runtime call to report
}

const DriverEntryPoints &entry_points() {
  static const DriverEntryPoints e = [] {
    DriverEntryPoints d;
    find("cuLaunchKernel", &d.launch);
    find("cuCtxGetCurrent", &d.current_context);
    find("cuCtxGetId", &d.context_id);
    find("cuGetErrorName", &d.error_name);
    find("cuGetErrorString", &d.error_string);
    if (!d.current_context || !d.context_id) d.launch = nullptr;  // the cache needs them
    return d;
  }();
  return e;
}

std::mutex g_fill;  // fills of any kernel's cache (first use per context: rare)

}  // namespace

CUfunction kernel_function(const void *kernel, KernelFunctions &cache) {
  const DriverEntryPoints &e = entry_points();
  if (!e.launch) return nullptr;
  CUcontext ctx = nullptr;
  unsigned long long id = 0;
  // No current context yet on this thread: the runtime's launch makes the device's primary one.
  if (e.current_context(&ctx) != CUDA_SUCCESS || !ctx || e.context_id(ctx, &id) != CUDA_SUCCESS) return nullptr;
  const int used = cache.used.load(std::memory_order_acquire);
  for (int i = 0; i < used; ++i)
    if (cache.context_id[i] == id) return cache.function[i];
  std::lock_guard<std::mutex> lock(g_fill);
  const int now = cache.used.load(std::memory_order_relaxed);
  for (int i = used; i < now; ++i)
    if (cache.context_id[i] == id) return cache.function[i];
  if (now == KernelFunctions::kSlots) return nullptr;
  cudaFunction_t f = nullptr;
  // Also loads the kernel's module into this context if lazy loading left it out.
  TE_CUDA_CHECK(cudaGetFuncBySymbol(&f, kernel));
  cache.context_id[now] = id;
  cache.function[now] = reinterpret_cast<CUfunction>(f);
  cache.used.store(now + 1, std::memory_order_release);
  return cache.function[now];
}

void driver_launch(CUfunction f, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, void **params) {
  const DriverEntryPoints &e = entry_points();
  const CUresult r = e.launch(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, static_cast<unsigned>(shared_bytes),
                              reinterpret_cast<CUstream>(stream), params, nullptr);
  if (r == CUDA_SUCCESS) return;
  const char *name = "?", *what = "unknown error";
  if (e.error_name) e.error_name(r, &name);
  if (e.error_string) e.error_string(r, &what);
  fail(r == CUDA_ERROR_OUT_OF_MEMORY ? Status::OutOfMemory : Status::Cuda, "cuLaunchKernel failed: %s (%s)", what, name);
}

}  // namespace te::cuda
