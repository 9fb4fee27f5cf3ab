// One scaling state's delayed update (delayed_scale_update of numerics.cpp) done by one thread
// block, and the parameter form of the items. Used by scale_update's own kernel (a block per
// state) and by kernels that carry an update in blocks of their own (the norm backward: see
// NormBackwardArgs::then_update), which saves the update its launch.
#pragma once

#include <cfloat>
#include <cstdint>

#include "backends/backend.h"
#include "backends/cuda/fp8_convert.cuh"

namespace te::cuda {

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

// The items a launch carries beside its own work: one module's states and a deferred forward
// set's, as a step of one module has (768 bytes of parameters).
static_assert(kCarriedUpdateItems == 16, "the carried chunk's size is part of the norm kernels' parameters");
struct CarriedUpdate {
  UpdateChunk<kCarriedUpdateItems> chunk;
  int count;
};

// Fills a chunk with the first min(n, N) items; returns how many.
template <int N>
inline int fill_chunk(UpdateChunk<N> &chunk, const ScaleUpdateItem *items, int n) {
  const int count = n < N ? n : N;
  for (int i = 0; i < count; ++i) {
    const ScaleUpdateItem &s = items[i];
    chunk.item[i] = UpdateItem{s.history, s.amax, s.scale, s.scale_inv, s.len, s.margin, static_cast<int>(s.algo), s.fp8_max};
  }
  return count;
}

// The whole block updates `it` from last_amax (the state's amax, or its all-reduced value); every
// thread of the block must call it. The history roll is done in place, in chunks of blockDim
// elements with a barrier between each chunk's reads and its writes.
__device__ __forceinline__ void update_state(const UpdateItem &it, float last_amax, uint32_t *scratch) {
  float *h = it.history;
  const int len = it.len;
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

}  // namespace te::cuda
