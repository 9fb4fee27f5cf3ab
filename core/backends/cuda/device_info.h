// Facts about a CUDA device that never change (compute capability, SM count, opt-in shared
// memory), asked of the runtime once per device instead of on every launch, and the occupancy
// of cluster launches, asked once per (kernel, shared memory, cluster size) and thread.
#pragma once

#include <cuda_runtime.h>

namespace te::cuda {

struct DeviceInfo {
  int major = 0, minor = 0;
  int sm_count = 0;
  int smem_optin = 0;  // bytes of shared memory a block may opt in to
};

// The current device (DeviceGuard made it current for this backend call) and its facts.
int current_device();
const DeviceInfo &device_info(int device);
inline const DeviceInfo &current_device_info() { return device_info(current_device()); }

// cudaOccupancyMaxActiveClusters for cfg (grid = one cluster, cluster along x) on the current
// device, 0 when the runtime cannot say; cached per thread by (kernel, dynamic shared memory,
// block size, cluster size, device).
int max_active_clusters(const void *kernel, const cudaLaunchConfig_t &cfg);

// Lets `kernel` take `bytes` of dynamic shared memory on the current device: above the default
// (48 KiB less the kernel's static shared memory) a kernel must opt in (cudaFuncSetAttribute), a
// host call that cost one per launch when made every time. Remembered per thread by (kernel,
// device), so it is asked again only for more.
// (cudaDeviceReset forgets the setting; libte's contexts do not survive one anyway.)
void allow_dynamic_smem(const void *kernel, size_t bytes);
template <class Kernel>
void allow_dynamic_smem(Kernel *kernel, size_t bytes) {
  allow_dynamic_smem(reinterpret_cast<const void *>(kernel), bytes);
}

}  // namespace te::cuda
