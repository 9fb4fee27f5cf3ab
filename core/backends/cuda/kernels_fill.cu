// fill_floats: dst[0..count) = value. zero_many: zero bytes over up to kMaxZeroRanges ranges per
// launch, grid row y taking range y; each range is written as its unaligned head, 16-byte units,
// and its tail, so that any address and size works.
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxZeroRanges = 32;  // 32 x 16 bytes: a parameter block under 1 KiB

__global__ void fill_floats_kernel(float *dst, float value, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) dst[i] = value;
}

struct ZeroRanges {
  ByteRange r[kMaxZeroRanges];
};

__global__ void __launch_bounds__(kThreads) zero_many_kernel(const __grid_constant__ ZeroRanges p) {
  const ByteRange &r = p.r[blockIdx.y];
  auto *d = static_cast<unsigned char *>(r.data);
  const size_t head = std::min(r.bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  const size_t units = (r.bytes - head) / 16, tail_at = head + units * 16;
  const size_t first = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  if (first < head) d[first] = 0;
  if (first < r.bytes - tail_at) d[tail_at + first] = 0;
  uint4 *u = reinterpret_cast<uint4 *>(d + head);
  for (size_t i = first; i < units; i += stride) u[i] = make_uint4(0, 0, 0, 0);
}

}  // namespace

void fill_floats(float *dst, float value, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  const size_t blocks = (count + kThreads - 1) / kThreads;
  launch_kernel<fill_floats_kernel>(static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, stream, dst,
      value, count);
}

void zero_many(const ByteRange *ranges, int n, cudaStream_t stream) {
  for (int first = 0; first < n; first += kMaxZeroRanges) {
    ZeroRanges p{};
    const int count = std::min(kMaxZeroRanges, n - first);
    size_t most = 0;
    for (int i = 0; i < count; ++i) {
      p.r[i] = ranges[first + i];
      most = std::max(most, p.r[i].bytes);
    }
    if (most == 0) continue;
    // Enough threads for the largest range's 16-byte units (heads and tails are < 16 bytes).
    const size_t blocks = std::min<size_t>((most / 16 + kThreads) / kThreads, 1024);
    launch_kernel<zero_many_kernel>(dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(count)), kThreads, 0,
        stream, p);
  }
}

}  // namespace te::cuda
