#include "backends/cuda/device_info.h"

#include <mutex>

#include "backends/cuda/cuda_check.h"
#include "base/check.h"

namespace te::cuda {

namespace {

constexpr int kMaxDevices = 64;

struct InfoSlot {
  std::once_flag once;
  DeviceInfo info;
};
InfoSlot g_info[kMaxDevices];

DeviceInfo query(int device) {
  DeviceInfo d;
  TE_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device));
  TE_CUDA_CHECK(cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, device));
  TE_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device));
  TE_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return d;
}

struct ClusterEntry {
  const void *kernel = nullptr;
  size_t smem = 0;
  unsigned block = 0, cluster = 0;
  int device = -1;
  int active = 0;
};
constexpr int kClusterEntries = 16;
thread_local ClusterEntry t_clusters[kClusterEntries];
thread_local int t_next_cluster = 0;

struct SmemEntry {
  const void *kernel = nullptr;
  int device = -1;
  size_t bytes = 0;  // allowed so far
};
constexpr int kSmemEntries = 32;
thread_local SmemEntry t_smem[kSmemEntries];
thread_local int t_next_smem = 0;

}  // namespace

int current_device() {
  int device = 0;
  if (!DeviceGuard::known_current(&device)) TE_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

const DeviceInfo &device_info(int device) {
  if (device < 0 || device >= kMaxDevices) fail(Status::Internal, "device_info: device %d out of range", device);
  InfoSlot &s = g_info[device];
  // A failed query throws out of call_once, which leaves the slot to be tried again.
  std::call_once(s.once, [&] { s.info = query(device); });
  return s.info;
}

int max_active_clusters(const void *kernel, const cudaLaunchConfig_t &cfg) {
  const int device = current_device();
  unsigned cluster = 1;
  for (unsigned i = 0; i < cfg.numAttrs; ++i)
    if (cfg.attrs[i].id == cudaLaunchAttributeClusterDimension) cluster = cfg.attrs[i].val.clusterDim.x;
  const unsigned block = cfg.blockDim.x * cfg.blockDim.y * cfg.blockDim.z;
  for (const ClusterEntry &e : t_clusters)
    if (e.kernel == kernel && e.smem == cfg.dynamicSmemBytes && e.block == block && e.cluster == cluster &&
        e.device == device)
      return e.active;
  int active = 0;
  if (cudaOccupancyMaxActiveClusters(&active, kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();  // the query's error is ours: nobody else sees it
    return 0;                  // not cached: asked again next time
  }
  t_clusters[t_next_cluster] = ClusterEntry{kernel, cfg.dynamicSmemBytes, block, cluster, device, active};
  t_next_cluster = (t_next_cluster + 1) % kClusterEntries;
  return active;
}

void allow_dynamic_smem(const void *kernel, size_t bytes) {
  if (bytes == 0) return;
  const int device = current_device();
  SmemEntry *slot = nullptr;
  for (SmemEntry &e : t_smem)
    if (e.kernel == kernel && e.device == device) {
      if (e.bytes >= bytes) return;
      slot = &e;
    }
  // Without opting in, a kernel takes 48 KiB less its static shared memory: one with static
  // arrays cannot take 48 KiB (the launch fails with an invalid argument).
  cudaFuncAttributes fa{};
  TE_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  if (bytes + fa.sharedSizeBytes > 48 * 1024)
    TE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  if (!slot) {
    slot = &t_smem[t_next_smem];
    t_next_smem = (t_next_smem + 1) % kSmemEntries;
  }
  *slot = SmemEntry{kernel, device, bytes};
}

}  // namespace te::cuda
