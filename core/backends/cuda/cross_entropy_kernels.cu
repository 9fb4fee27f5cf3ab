// Softmax cross-entropy fused with its gradient on CUDA: three launches, no host sync, no atomics.
//   1. count_kernel (one block): count = number of targets != ignore_index (integers: exact).
//   2. row_kernel (one block of kRowThreads per row): thread u walks columns u, u + kRowThreads,
//      ... keeping an online (max m, sum s of expf(x - m)); the pairs are then combined by a
//      warp butterfly (xor offsets 16..1) and the warps' pairs in warp order by warp 0's
//      butterfly: a fixed order, so two runs are bit-identical. Then row loss =
//      (logf(s) + m) - x[target] into scratch, and, when dlogits is wanted, a second pass over
//      the same row writes (expf(x - m) / s - onehot) * (grad_scale / count). Every thread reads
//      x[target] before the reduction's barriers and its own elements before writing them, so
//      dlogits may be logits itself. Ignored rows: loss 0, dlogits 0. A target outside
//      [0, vocab) (not ignore_index): loss NaN and dlogits NaN for that row (the mean is then
//      NaN; a clipped AdamW step then skips the update).
//   3. loss_kernel (one block of kLossThreads): thread u sums row losses u, u + kLossThreads, ...
//      in increasing row, then a fixed tree; loss = total / count (0 when count is 0).
// The formulas are the CPU reference's (cpu_cross_entropy.cpp, separately rounded _rn
// operations); the CPU sums s and the loss sequentially and uses the host's expf/logf, so the
// two agree to a few ulps rather than bit for bit.
#include <cfloat>
#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/training_args.h"
#include "base/check.h"

namespace te::cuda {

namespace {

constexpr int kCountThreads = 1024;
constexpr int kRowThreads = 512;
constexpr int kLossThreads = 1024;
constexpr size_t kAlign = 256;

struct MaxSum {
  float m, s;
};

// The pair of two disjoint sets of columns. An empty side (m = -inf) contributes nothing (also
// avoids -inf - -inf).
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  return MaxSum{m, __fadd_rn(__fmul_rn(a.s, expf(__fsub_rn(a.m, m))), __fmul_rn(b.s, expf(__fsub_rn(b.m, m))))};
}

__device__ __forceinline__ MaxSum warp_combine(MaxSum v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const MaxSum o{__shfl_xor_sync(0xffffffffu, v.m, off), __shfl_xor_sync(0xffffffffu, v.s, off)};
    v = combine(v, o);
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

__global__ void __launch_bounds__(kRowThreads)
    row_kernel(const void *logits, DType t_in, int64_t vocab, const int32_t *__restrict__ targets, int32_t ignore_index,
               const int64_t *__restrict__ count, float grad_scale, float *__restrict__ row_loss, void *dlogits,
               DType t_out) {
  __shared__ MaxSum warp_pairs[kRowThreads / 32];
  __shared__ MaxSum row_pair;
  const int64_t row = blockIdx.x;
  const int64_t off = row * vocab;
  const int32_t target = targets[row];
  if (target == ignore_index) {
    if (dlogits)
      for (int64_t j = threadIdx.x; j < vocab; j += kRowThreads) dev_store_from_float(dlogits, t_out, off + j, 0.0f);
    if (threadIdx.x == 0) row_loss[row] = 0.0f;
    return;
  }
  const bool valid = target >= 0 && target < vocab;
  // Read before any thread of the block writes (the writes come after the barriers below).
  const float x_target = valid ? dev_load_as_float(logits, t_in, off + target) : 0.0f;
  MaxSum v{-INFINITY, 0.0f};
  bool saw_nan = false;
  for (int64_t j = threadIdx.x; j < vocab; j += kRowThreads) {
    const float x = dev_load_as_float(logits, t_in, off + j);
    if (x != x) {
      saw_nan = true;  // the row's loss and gradient become NaN, as on the CPU
    } else if (x > v.m) {
      v.s = v.m == -INFINITY ? 1.0f : __fadd_rn(__fmul_rn(v.s, expf(__fsub_rn(v.m, x))), 1.0f);
      v.m = x;
    } else if (v.m != -INFINITY) {
      v.s = __fadd_rn(v.s, expf(__fsub_rn(x, v.m)));
    }  // else x = m = -inf: expf(-inf) = 0 once a finite max exists; an all -inf row gives s = 0
  }
  const bool row_nan = __syncthreads_or(saw_nan) != 0;
  v = warp_combine(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_pairs[warp] = v;
  __syncthreads();
  if (warp == 0) {
    MaxSum w = lane < kRowThreads / 32 ? warp_pairs[lane] : MaxSum{-INFINITY, 0.0f};
    w = warp_combine(w);
    if (lane == 0) row_pair = w;
  }
  __syncthreads();
  const float m = row_pair.m, s = row_nan ? NAN : row_pair.s;
  if (threadIdx.x == 0) row_loss[row] = valid ? __fsub_rn(__fadd_rn(logf(s), m), x_target) : NAN;
  if (!dlogits) return;
  const float factor = __fdiv_rn(grad_scale, static_cast<float>(*count));  // count >= 1: this row counts
  for (int64_t j = threadIdx.x; j < vocab; j += kRowThreads) {
    const float x = dev_load_as_float(logits, t_in, off + j);
    const float p = __fdiv_rn(expf(__fsub_rn(x, m)), s);
    const float d = valid ? __fmul_rn(__fsub_rn(p, j == target ? 1.0f : 0.0f), factor) : NAN;
    dev_store_from_float(dlogits, t_out, off + j, d);
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
  count_kernel<<<1, kCountThreads, 0, stream_>>>(targets, n, a.ignore_index, count);
  TE_CUDA_CHECK_LAUNCH();
  row_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, stream_>>>(a.logits.data, a.logits.dtype, vocab, targets,
                                                                   a.ignore_index, count, a.grad_scale, row_loss,
                                                                   a.dlogits.data, a.dlogits.dtype);
  TE_CUDA_CHECK_LAUNCH();
  loss_kernel<<<1, kLossThreads, 0, stream_>>>(row_loss, n, count, a.loss);
  TE_CUDA_CHECK_LAUNCH();
}

}  // namespace te::cuda
