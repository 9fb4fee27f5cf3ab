// copy_row_segments (Backend::copy_row_segments): up to kMaxSegments blocks of rows per launch,
// grid row y taking segment y. Each thread moves units of 16, 4 or 1 bytes, the widest that the
// two base pointers and the row size allow.
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {

namespace {

constexpr int kMaxSegments = 32;  // 32 x 32 bytes of segments: a parameter block under 1 KiB
constexpr int kThreads = 256;

struct RowSegmentsParams {
  const unsigned char *src;
  unsigned char *dst;
  int64_t row_units;  // units per row
  RowSegment seg[kMaxSegments];
};

template <class U>
__global__ void __launch_bounds__(kThreads) copy_row_segments_kernel(const __grid_constant__ RowSegmentsParams p) {
  const RowSegment &s = p.seg[blockIdx.y];
  const int64_t copy_units = s.rows * p.row_units, total = copy_units + s.zero_rows * p.row_units;
  const U *src = reinterpret_cast<const U *>(p.src) + s.src_row * p.row_units;
  U *dst = reinterpret_cast<U *>(p.dst) + s.dst_row * p.row_units;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total; i += stride)
    dst[i] = i < copy_units ? src[i] : U{};
}

template <class U>
void launch(RowSegmentsParams &p, int n, int64_t most_units, cudaStream_t stream) {
  p.row_units /= static_cast<int64_t>(sizeof(U));
  most_units /= static_cast<int64_t>(sizeof(U));
  const int64_t blocks = std::min<int64_t>((most_units + kThreads - 1) / kThreads, 1024);
  launch_kernel<copy_row_segments_kernel<U>>(dim3(static_cast<unsigned>(std::max<int64_t>(blocks, 1)), static_cast<unsigned>(n)),
      kThreads, 0, stream, p);
}

}  // namespace

void copy_row_segments(void *dst, const void *src, size_t row_bytes, const RowSegment *segs, int n,
                       cudaStream_t stream) {
  if (row_bytes == 0) return;
  const uintptr_t align = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | row_bytes;
  for (int first = 0; first < n; first += kMaxSegments) {
    RowSegmentsParams p{};
    p.src = static_cast<const unsigned char *>(src);
    p.dst = static_cast<unsigned char *>(dst);
    p.row_units = static_cast<int64_t>(row_bytes);
    const int count = std::min(kMaxSegments, n - first);
    int64_t most_bytes = 0;  // of one segment
    for (int i = 0; i < count; ++i) {
      p.seg[i] = segs[first + i];
      most_bytes = std::max(most_bytes, (p.seg[i].rows + p.seg[i].zero_rows) * static_cast<int64_t>(row_bytes));
    }
    if (most_bytes == 0) continue;
    if (align % 16 == 0) launch<uint4>(p, count, most_bytes, stream);
    else if (align % 4 == 0) launch<uint32_t>(p, count, most_bytes, stream);
    else launch<unsigned char>(p, count, most_bytes, stream);
  }
}

}  // namespace te::cuda
