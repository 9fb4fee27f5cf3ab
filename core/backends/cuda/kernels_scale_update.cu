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

namespace te::cuda {

namespace {

constexpr int kTinyChunk = 16;    // 768 bytes of parameters
constexpr int kSmallChunk = 128;  // 6 KiB
constexpr int kLargeChunk = 640;  // 30 KiB: needs CUDA >= 12.1 (a 32 KiB parameter limit)
constexpr int kUpdateThreads = 256;

struct UpdateItem {
  float *history;
  float *amax;
  float *scale;
  float *scale_inv;
  int len;
  int margin;
  int algo;
  float fp8_max;
};

template <int N>
struct UpdateChunk {
  UpdateItem item[N];
};
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
  float *h = it.history;
  const int len = it.len;
  const float last_amax = reduced_amax != nullptr ? reduced_amax[blockIdx.x] : *it.amax;

  float amax = last_amax;
  if (it.algo == static_cast<int>(AmaxAlgo::Max)) {
    // fmaxf from 0, written as `v > m ? v : m`: NaN never wins, nor does -0, so m is a
    // non-negative non-NaN float and its bits order like its value.
    float m = 0.0f;
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
      const float v = i == 0 ? last_amax : h[i];
      m = v > m ? v : m;
    }
    amax = __uint_as_float(block_max_u32(__float_as_uint(m), scratch));
  }

  if (threadIdx.x == 0) {
    float new_scale = *it.scale;
    if (isfinite(amax) && amax > 0.0f) new_scale = __fdiv_rn(__fdiv_rn(it.fp8_max, amax), ldexpf(1.0f, it.margin));
    if (isinf(new_scale)) new_scale = FLT_MAX;
    if (new_scale < kMinScale) new_scale = kMinScale;  // as numerics.cpp
    *it.scale = new_scale;
    *it.scale_inv = reciprocal_rn(new_scale);
  }

  __syncthreads();  // every read of h above happens before the roll writes it
  for (int base = 0; base < len - 1; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const float v = i < len - 1 ? h[i + 1] : 0.0f;
    __syncthreads();
    if (i < len - 1) h[i] = v;
  }
  if (threadIdx.x == 0) {
    if (len > 1) h[len - 1] = last_amax;
    h[0] = 0.0f;
    *it.amax = 0.0f;
  }
}

// Fills a chunk with the first min(n, N) items; returns how many.
template <int N>
int fill_chunk(UpdateChunk<N> &chunk, const ScaleUpdateItem *items, int n) {
  const int count = n < N ? n : N;
  for (int i = 0; i < count; ++i) {
    const ScaleUpdateItem &s = items[i];
    chunk.item[i] = UpdateItem{s.history, s.amax, s.scale, s.scale_inv, s.len, s.margin, static_cast<int>(s.algo), s.fp8_max};
  }
  return count;
}

template <int N>
int launch_gather(const ScaleUpdateItem *items, int n, float *packed, cudaStream_t stream) {
  UpdateChunk<N> chunk;
  const int count = fill_chunk(chunk, items, n);
  launch_kernel<gather_amax_kernel<N>>(1, N, 0, stream, chunk, count, packed);
  TE_CUDA_CHECK_LAUNCH();
  return count;
}

template <int N>
int launch_update(const ScaleUpdateItem *items, int n, const float *reduced_amax, cudaStream_t stream) {
  UpdateChunk<N> chunk;
  const int count = fill_chunk(chunk, items, n);
  launch_kernel<scale_update_kernel<N>>(count, kUpdateThreads, 0, stream, chunk, reduced_amax);
  TE_CUDA_CHECK_LAUNCH();
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
