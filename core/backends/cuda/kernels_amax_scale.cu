// amax (max |x| with NaN propagation) and scale_from_amax (current scaling's formula).
// amax: 16-byte loads, a per-thread integer max of |x|'s bits, a block reduction, then one atomic
// per block into the destination (cleared first unless accumulating).
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch_items.cuh"
#include "backends/cuda/kernel_launch.cuh"
#include "base/check.h"

namespace te::cuda {

namespace {

constexpr int kAmaxThreads = 256;
constexpr int kAmaxMaxBlocks = 2048;
constexpr int kAmaxUnroll = 4;  // 16-byte loads in flight per thread

// max |x| bits over this thread's share of x (16-byte aligned, high precision): elements
// [tid, n) in steps of `stride` 16-byte vectors, kAmaxUnroll loads in flight, then the tail.
template <DType T>
__device__ __forceinline__ uint32_t strided_amax_vec(const void *x, int64_t n, int64_t tid, int64_t stride) {
  constexpr int kPer = InType<T>::kPerVec;
  const uint4 *v = static_cast<const uint4 *>(x);
  const int64_t nvec = n / kPer;
  uint32_t m = 0;
  int64_t i = tid;
  for (; i + (kAmaxUnroll - 1) * stride < nvec; i += kAmaxUnroll * stride) {
    uint4 r[kAmaxUnroll];
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) r[u] = __ldg(v + i + u * stride);
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) {
      float f[kPer];
      unpack16<T>(r[u], f);
#pragma unroll
      for (int j = 0; j < kPer; ++j) m = max(m, abs_bits(f[j]));
    }
  }
  for (; i < nvec; i += stride) {
    float f[kPer];
    unpack16<T>(__ldg(v + i), f);
#pragma unroll
    for (int j = 0; j < kPer; ++j) m = max(m, abs_bits(f[j]));
  }
  // The tail that does not fill a vector.
  for (int64_t t = nvec * kPer + tid; t < n; t += stride) m = max(m, abs_bits(load_scalar<T>(x, t)));
  return m;
}

template <DType T>
__global__ void __launch_bounds__(kAmaxThreads) amax_vec_kernel(const void *x, int64_t n, float *out) {
  __shared__ uint32_t scratch[32];
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t m = strided_amax_vec<T>(x, n, tid, stride);
  m = block_max_u32(m, scratch);
  if (threadIdx.x == 0) atomic_amax(out, canonical_amax_bits(m));
}

// Any dtype (unaligned data, FP8 codes): one element at a time.
__global__ void __launch_bounds__(kAmaxThreads) amax_scalar_kernel(const void *x, DType t, int64_t n, float *out) {
  __shared__ uint32_t scratch[32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t m = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    m = max(m, abs_bits(dev_load_as_float(x, t, i)));
  }
  m = block_max_u32(m, scratch);
  if (threadIdx.x == 0) atomic_amax(out, canonical_amax_bits(m));
}

__global__ void scale_from_amax_kernel(const float *amax, float *scale, float *scale_inv, float fp8_max,
                                       bool power_of_2, float epsilon) {
  const float s = dev_compute_scale_from_amax(*amax, fp8_max, power_of_2, epsilon);
  *scale = s;
  *scale_inv = reciprocal_rn(s);
}

unsigned grid_for(int64_t work_items) {
  const int64_t blocks = (work_items + kAmaxThreads * kAmaxUnroll - 1) / (kAmaxThreads * kAmaxUnroll);
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kAmaxMaxBlocks ? kAmaxMaxBlocks : blocks));
}

}  // namespace

void amax(Backend &be, const TensorView &x, float *amax, bool accumulate, cudaStream_t stream) {
  // Not accumulating: start from +0, which is also the amax of an empty tensor.
  if (!accumulate) TE_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  const int64_t n = x.numel();
  if (n == 0 && !accumulate) return;
  const bool vec = aligned16(x.data) && is_high_precision(x.dtype);
  if (!vec) {
    launch_kernel<amax_scalar_kernel>(grid_for(n), kAmaxThreads, 0, stream, x.data, x.dtype, n, amax);
  } else {
    const int64_t nvec = n / (x.dtype == DType::F32 ? 4 : 8);
    const unsigned grid = grid_for(nvec);
    switch (x.dtype) {
      case DType::F32: launch_kernel<amax_vec_kernel<DType::F32>>(grid, kAmaxThreads, 0, stream, x.data, n, amax); break;
      case DType::F16: launch_kernel<amax_vec_kernel<DType::F16>>(grid, kAmaxThreads, 0, stream, x.data, n, amax); break;
      default: launch_kernel<amax_vec_kernel<DType::BF16>>(grid, kAmaxThreads, 0, stream, x.data, n, amax); break;
    }
  }
}

void scale_from_amax(const float *amax, float *scale, float *scale_inv, float fp8_max, bool power_of_2,
                     float epsilon, cudaStream_t stream) {
  launch_kernel<scale_from_amax_kernel>(1, 1, 0, stream, amax, scale, scale_inv, fp8_max, power_of_2, epsilon);
}

}  // namespace te::cuda

// ---- amax partials of several tensors (current scaling's first pass in quantize_many) ----------
namespace te::cuda {

namespace {

struct AmaxItemParams {
  const void *x;
  int64_t n;
  uint32_t *partials;
  unsigned first_block, blocks;
  bool vec;  // 16-byte aligned: vector loads
  DType dtype;
};

struct AmaxManyParams {
  AmaxItemParams item[kMaxCastItems];
  int n;
};

template <DType T>
__global__ void __launch_bounds__(kAmaxThreads) amax_partials_kernel(const AmaxManyParams p) {
  __shared__ uint32_t scratch[32];
  const auto it = block_item<false>(p);
  const int64_t b = blockIdx.x - it.first_block;
  const int64_t tid = b * kAmaxThreads + threadIdx.x, stride = static_cast<int64_t>(it.blocks) * kAmaxThreads;
  uint32_t m = 0;
  if (it.vec) {
    m = strided_amax_vec<T>(it.x, it.n, tid, stride);
  } else {
    for (int64_t t = tid; t < it.n; t += stride) m = max(m, abs_bits(dev_load_as_float(it.x, it.dtype, t)));
  }
  m = block_max_u32(m, scratch);
  if (threadIdx.x == 0) it.partials[b] = m;
}

}  // namespace

void amax_partials(const TensorView *xs, int n, uint32_t *partials, int *npartials, cudaStream_t stream) {
  if (n < 1 || n > kMaxCastItems) fail(Status::Internal, "amax_partials: %d tensors (1..%d)", n, kMaxCastItems);
  AmaxManyParams p{};
  p.n = n;
  unsigned grid = 0;
  for (int i = 0; i < n; ++i) {
    AmaxItemParams &q = p.item[i];
    q.x = xs[i].data;
    q.n = xs[i].numel();
    q.dtype = xs[i].dtype;
    q.vec = aligned16(q.x) && is_high_precision(q.dtype);
    q.partials = partials + static_cast<size_t>(i) * kAmaxPartialBlocks;
    const int64_t work = q.vec ? q.n / (q.dtype == DType::F32 ? 4 : 8) : q.n;
    const unsigned g = grid_for(work);
    q.blocks = g < unsigned(kAmaxPartialBlocks) ? g : unsigned(kAmaxPartialBlocks);
    q.first_block = grid;
    grid += q.blocks;
    npartials[i] = static_cast<int>(q.blocks);
  }
  switch (xs[0].dtype) {
    case DType::F32: launch_kernel<amax_partials_kernel<DType::F32>>(grid, kAmaxThreads, 0, stream, p); break;
    case DType::F16: launch_kernel<amax_partials_kernel<DType::F16>>(grid, kAmaxThreads, 0, stream, p); break;
    default: launch_kernel<amax_partials_kernel<DType::BF16>>(grid, kAmaxThreads, 0, stream, p); break;
  }
}

}  // namespace te::cuda
