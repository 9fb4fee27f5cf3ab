// Softmax cross-entropy fused with its gradient on CUDA: three launches, no host sync, no atomics,
// bit-identical to the CPU reference (the arithmetic and the orders are
// training/cross_entropy_math.h's, which cpu_cross_entropy.cpp replays lane by lane).
//   1. count_kernel (one block): count = number of targets != ignore_index (integers: exact).
//   2. row_kernel (one block of kRowLanes threads per row): thread u walks columns u,
//      u + kRowLanes, ... keeping an online (max m, sum s of e^(x - m)); a warp butterfly
//      (xor offsets 16..1) then warp 0's butterfly over the 16 warps' pairs combine them (the
//      combine is symmetric, so this is the tree the header describes). Row loss into scratch;
//      when dlogits is wanted a second pass over the same row writes (e^(x - m) / s - onehot) *
//      grad_scale / count. Every thread reads x[target] before the reduction's barriers and its
//      own elements before writing them, so dlogits may be logits itself. Ignored rows: loss 0,
//      dlogits 0. A target outside [0, vocab) (not ignore_index): that row's loss and dlogits
//      are NaN (the mean is then NaN; no host sync to refuse it).
//   3. loss_kernel (one block of kLossLanes): strided sums of the row losses, a fixed tree,
//      loss = total / count (0 when count is 0).
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernel_launch.cuh"
#include "backends/training_args.h"
#include "base/check.h"
#include "training/cross_entropy_math.h"

namespace te::cuda {

namespace {

constexpr int kCountThreads = 1024;
constexpr int kRowThreads = ce::kRowLanes;
constexpr int kLossThreads = ce::kLossLanes;
constexpr size_t kAlign = 256;
constexpr int kBatch = 8;  // loads in flight per thread in the row passes
using ce::MaxSum;

__device__ __forceinline__ MaxSum warp_combine(MaxSum v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    MaxSum o;
    o.m = __shfl_xor_sync(0xffffffffu, v.m, off);
    o.s = __shfl_xor_sync(0xffffffffu, v.s, off);
    v = ce::combine(v, o);
  }
  return v;
}

__global__ void __launch_bounds__(kCountThreads)
    count_kernel(const int32_t *__restrict__ targets, int64_t n, int32_t ignore_index, int64_t *__restrict__ count) {
  __shared__ int64_t part[kCountThreads];
  int64_t c = 0;
  for (int64_t t = threadIdx.x; t < n; t += kCountThreads) c += targets[t] != ignore_index;
  part[threadIdx.x] = c;
  __syncthreads();
  for (int w = kCountThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = part[0];
}

// kIn: the dtype of logits and dlogits (one dtype: a compile-time switch).
template <DType kIn>
__global__ void __launch_bounds__(kRowThreads)
    row_kernel(const void *logits, int64_t vocab, const int32_t *__restrict__ targets, int32_t ignore_index,
               const int64_t *__restrict__ count, float grad_scale, float *__restrict__ row_loss, void *dlogits) {
  __shared__ float warp_m[kRowThreads / 32], warp_s[kRowThreads / 32];
  __shared__ float row_m, row_s;
  const int64_t row = blockIdx.x;
  const int64_t off = row * vocab;
  const int32_t target = targets[row];
  if (target == ignore_index) {
    if (dlogits)
      for (int64_t j = threadIdx.x; j < vocab; j += kRowThreads) dev_store_from_float(dlogits, kIn, off + j, 0.0f);
    if (threadIdx.x == 0) row_loss[row] = 0.0f;
    return;
  }
  const bool valid = target >= 0 && target < vocab;
  // Read before any thread of the block writes (the writes come after the barriers below).
  const float x_target = valid ? dev_load_as_float(logits, kIn, off + target) : 0.0f;
  MaxSum v;
  bool saw_nan = false;
  // Each thread's columns in order, kBatch loads issued before they are used (memory-level
  // parallelism without changing the order).
  int64_t j = threadIdx.x;
  for (; j + (kBatch - 1) * kRowThreads < vocab; j += kBatch * kRowThreads) {
    float xs[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) xs[b] = dev_load_as_float(logits, kIn, off + j + b * kRowThreads);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (xs[b] != xs[b]) saw_nan = true;  // the row's loss and gradient become NaN, as on the CPU
      else ce::push(v, xs[b]);
    }
  }
  for (; j < vocab; j += kRowThreads) {
    const float x = dev_load_as_float(logits, kIn, off + j);
    if (x != x) saw_nan = true;
    else ce::push(v, x);
  }
  const bool row_nan = __syncthreads_or(saw_nan) != 0;
  v = warp_combine(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_m[warp] = v.m, warp_s[warp] = v.s;
  __syncthreads();
  if (warp == 0) {
    MaxSum w;  // lanes past the warp count: the empty pair, which every combine leaves as is
    if (lane < kRowThreads / 32) w.m = warp_m[lane], w.s = warp_s[lane];
    w = warp_combine(w);
    if (lane == 0) row_m = w.m, row_s = w.s;
  }
  __syncthreads();
  MaxSum r;
  r.m = row_m;
  r.s = row_s;
  if (row_nan) r.s = NAN;
  if (threadIdx.x == 0) row_loss[row] = valid ? ce::row_loss(r, x_target) : NAN;
  if (!dlogits) return;
  const float factor = ce::grad_factor(grad_scale, *count);  // count >= 1: this row counts
  j = threadIdx.x;
  for (; j + (kBatch - 1) * kRowThreads < vocab; j += kBatch * kRowThreads) {
    float xs[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) xs[b] = dev_load_as_float(logits, kIn, off + j + b * kRowThreads);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t c = j + b * kRowThreads;
      dev_store_from_float(dlogits, kIn, off + c, valid ? ce::grad(xs[b], r, c == target, factor) : NAN);
    }
  }
  for (; j < vocab; j += kRowThreads) {
    const float x = dev_load_as_float(logits, kIn, off + j);
    dev_store_from_float(dlogits, kIn, off + j, valid ? ce::grad(x, r, j == target, factor) : NAN);
  }
}

__global__ void __launch_bounds__(kLossThreads)
    loss_kernel(const float *__restrict__ row_loss, int64_t n, const int64_t *__restrict__ count, float *__restrict__ loss) {
  __shared__ float part[kLossThreads];
  float s = 0.0f;
  for (int64_t t = threadIdx.x; t < n; t += kLossThreads) s = __fadd_rn(s, row_loss[t]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = kLossThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] = __fadd_rn(part[threadIdx.x], part[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int64_t c = *count;
    *loss = c ? __fdiv_rn(part[0], static_cast<float>(c)) : 0.0f;
  }
}

// Scratch: the count, then one float per row.
size_t scratch_bytes(int64_t rows) { return kAlign + static_cast<size_t>(rows) * sizeof(float); }

}  // namespace

void CudaBackend::plan_cross_entropy(const CrossEntropyArgs &a, ScratchPlan *plan) const {
  plan->add(scratch_bytes(a.logits.rows()));
}

void CudaBackend::cross_entropy(const CrossEntropyArgs &a) {
  DeviceGuard g(device_);
  const int64_t vocab = a.logits.cols(), n = a.logits.rows();
  if (n >= (int64_t{1} << 31)) fail(Status::Unsupported, "cross_entropy: more than 2^31 - 1 rows on CUDA");
  Buffer scratch(this, scratch_bytes(n));
  auto *count = static_cast<int64_t *>(scratch.get());
  auto *row_loss = reinterpret_cast<float *>(static_cast<char *>(scratch.get()) + kAlign);
  const int32_t *targets = static_cast<const int32_t *>(a.targets.data);
  launch_kernel<count_kernel>(1, kCountThreads, 0, stream_, targets, n, a.ignore_index, count);
  auto launch_rows = [&](auto dtype) {  // dtype: std::integral_constant<DType, the logits' dtype>
    launch_kernel<row_kernel<decltype(dtype)::value>>(static_cast<unsigned>(n), kRowThreads, 0, stream_, a.logits.data,
                                                      vocab, targets, a.ignore_index, count, a.grad_scale, row_loss,
                                                      a.dlogits.data);
  };
  switch (a.logits.dtype) {  // dlogits has the logits' dtype (checked by the core)
    case DType::F32: launch_rows(std::integral_constant<DType, DType::F32>()); break;
    case DType::F16: launch_rows(std::integral_constant<DType, DType::F16>()); break;
    case DType::BF16: launch_rows(std::integral_constant<DType, DType::BF16>()); break;
    default: fail(Status::InvalidArgument, "cross_entropy: logits must be F32, F16 or BF16, got %s", dtype_name(a.logits.dtype));
  }
  launch_kernel<loss_kernel>(1, kLossThreads, 0, stream_, row_loss, n, count, a.loss);
}

}  // namespace te::cuda
