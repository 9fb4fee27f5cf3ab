#include "backends/cuda/kernel_launch.cuh"

#include "base/check.h"

namespace te::cuda {

namespace {

using LaunchKernelFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream, void **, void **);
using GetErrorFn = CUresult (*)(CUresult, const char **);

struct DriverEntryPoints {
  LaunchKernelFn launch = nullptr;
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
    find("cuGetErrorName", &d.error_name);
    find("cuGetErrorString", &d.error_string);
    return d;
  }();
  return e;
}

}  // namespace

CUfunction kernel_handle(const void *kernel) {
  if (!entry_points().launch) return nullptr;
  cudaKernel_t k = nullptr;
  // A CUkernel belongs to the library, not to a context: the driver loads the kernel into each
  // context it is launched in, including one made after a cudaDeviceReset.
  if (cudaGetKernel(&k, kernel) != cudaSuccess || !k) {
    cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<CUfunction>(k);
}

bool driver_launch(CUfunction f, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, void **params) {
  const DriverEntryPoints &e = entry_points();
  const CUresult r = e.launch(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, static_cast<unsigned>(shared_bytes),
                              reinterpret_cast<CUstream>(stream), params, nullptr);
  if (r == CUDA_SUCCESS) return true;
  if (r == CUDA_ERROR_INVALID_CONTEXT) return false;  // the legacy stream, and no context current yet
  const char *name = "?", *what = "unknown error";
  if (e.error_name) e.error_name(r, &name);
  if (e.error_string) e.error_string(r, &what);
  fail(r == CUDA_ERROR_OUT_OF_MEMORY ? Status::OutOfMemory : Status::Cuda,
       "cuLaunchKernel failed: %s (%s); grid (%u, %u, %u), block (%u, %u, %u), %zu bytes of dynamic shared memory",
       what, name, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes);
}

}  // namespace te::cuda
