// Delayed-scaling maintenance: gather_amax (the current amax of every state into one packed
// buffer for the all-reduce, when the states' amax slots are not one contiguous range) and
// scale_update (delayed_scale_update of numerics.cpp for every state).
// The host-side items travel as kernel parameters, so that a bucket's update is one launch, needs
// no staging copy and can be captured in a CUDA graph. The driver copies a kernel's whole
// parameter block at every launch, whatever the items used (H100 host: <= 1 KiB as cheap as no
// parameters, 6 KiB +0.6-1.1 us, 30 KiB +4.2 us a launch), so the block is the smallest of three
// that holds the bucket: kTinyChunk items (one module's states), kSmallChunk, or kLargeChunk near
// the 32 KiB limit (one launch for buckets of up to 640 states; larger ones take several).
// scale_update runs one thread block per state; the history roll is done in place, in chunks of
// blockDim elements with a barrier between each chunk's reads and its writes.
#include <cfloat>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernel_launch.cuh"
#include "backends/cuda/scale_update_block.cuh"

namespace te::cuda {

namespace {

constexpr int kTinyChunk = kCarriedUpdateItems;  // 768 bytes of parameters
constexpr int kSmallChunk = 128;                  // 6 KiB
constexpr int kLargeChunk = 640;                  // 30 KiB: needs CUDA >= 12.1 (a 32 KiB parameter limit)
constexpr int kUpdateThreads = 256;
static_assert(sizeof(UpdateChunk<kLargeChunk>) + sizeof(float *) <= 32764, "over CUDA's kernel parameter limit");

template <int N>
__global__ void gather_amax_kernel(const __grid_constant__ UpdateChunk<N> chunk, int n, float *packed) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) packed[i] = *chunk.item[i].amax;
}

template <int N>
__global__ void __launch_bounds__(kUpdateThreads)
    scale_update_kernel(const __grid_constant__ UpdateChunk<N> chunk, const float *reduced_amax) {
  __shared__ uint32_t scratch[32];
  const UpdateItem &it = chunk.item[blockIdx.x];
  update_state(it, reduced_amax != nullptr ? reduced_amax[blockIdx.x] : *it.amax, scratch);
}

template <int N>
int launch_gather(const ScaleUpdateItem *items, int n, float *packed, cudaStream_t stream) {
  UpdateChunk<N> chunk;
  const int count = fill_chunk(chunk, items, n);
  launch_kernel<gather_amax_kernel<N>>(1, N, 0, stream, chunk, count, packed);
  return count;
}

template <int N>
int launch_update(const ScaleUpdateItem *items, int n, const float *reduced_amax, cudaStream_t stream) {
  UpdateChunk<N> chunk;
  const int count = fill_chunk(chunk, items, n);
  launch_kernel<scale_update_kernel<N>>(count, kUpdateThreads, 0, stream, chunk, reduced_amax);
  return count;
}

// launch(std::integral_constant<int, N>{}) with the smallest chunk size N that holds `left`
// items (or the largest); returns the items it took.
template <class Launch>
int launch_chunk(int left, Launch &&launch) {
  if (left <= kTinyChunk) return launch(std::integral_constant<int, kTinyChunk>{});
  if (left <= kSmallChunk) return launch(std::integral_constant<int, kSmallChunk>{});
  return launch(std::integral_constant<int, kLargeChunk>{});
}

}  // namespace

void gather_amax(const ScaleUpdateItem *items, int n, float *packed, cudaStream_t stream) {
  for (int done = 0; done < n;) {
    const int took = launch_chunk(n - done, [&](auto chunk) {
      return launch_gather<decltype(chunk)::value>(items + done, n - done, packed + done, stream);
    });
    done += took;
  }
}

void scale_update(const ScaleUpdateItem *items, int n, const float *reduced_amax, cudaStream_t stream) {
  for (int done = 0; done < n;) {
    const float *reduced = reduced_amax != nullptr ? reduced_amax + done : nullptr;
    const int took = launch_chunk(n - done, [&](auto chunk) {
      return launch_update<decltype(chunk)::value>(items + done, n - done, reduced, stream);
    });
    done += took;
  }
}

}  // namespace te::cuda
