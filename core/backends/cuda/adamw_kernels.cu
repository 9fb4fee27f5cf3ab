// Multi-tensor AdamW (AdamwArgs, training_args.h): bit-identical to backends/cpu/cpu_adamw.cpp.
// The tensor list travels in the kernels' parameter struct, kMaxTensors descriptors per launch
// (no descriptor table in device memory: no cudaMalloc, no host->device copy, graph-capturable);
// one block of kAdamwLanes threads per chunk of kAdamwChunk elements. With a grad norm:
//   1. norm_partials_kernel: each block writes its chunk's sum of squares (lane sums in element
//      order, then a binary tree) to scratch[global chunk index];
//   2. norm_final_kernel (one block): the partials in the same lane / tree order, sqrt, written
//      to scratch[total_chunks] and to the caller's grad_norm;
//   3. update_kernel reads the norm from scratch (a non-finite one under clipping: returns).
// Every operation is a separately rounded _rn intrinsic, as the CPU computes it.
#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernel_launch.cuh"
#include "base/check.h"

namespace te::cuda {

namespace {

constexpr int kMaxTensors = 48;
constexpr int kPerThread = static_cast<int>(kAdamwChunk / kAdamwLanes);
static_assert(kAdamwChunk % kAdamwLanes == 0, "a chunk is a whole number of lane rows");

struct TensorDesc {
  float *p;
  const void *g;
  float *m;
  float *v;
  void *mw;
  int64_t numel;
  DType gt, mt;
  bool decay;
};

// One launch: up to kMaxTensors whole tensors; block b works on chunk b - block_start[k] of the
// tensor k with block_start[k] <= b < block_start[k + 1].
struct LaunchList {
  TensorDesc t[kMaxTensors];
  uint32_t block_start[kMaxTensors + 1];
  int n;
  int64_t chunk_base;  // global index of this launch's first chunk (norm partials)
};

struct UpdateScalars {
  float lr, beta1, beta2, eps, lr_wd, omb1, omb2, bc1, bc2, max_grad_norm;
  const float *norm;  // null: no clipping
};

static_assert(sizeof(LaunchList) + sizeof(UpdateScalars) + 64 <= 4096, "kernel parameters fit in 4 KiB");

__device__ __forceinline__ int tensor_of_block(const LaunchList &L, uint32_t b) {
  int k = 0;
  while (k + 1 < L.n && L.block_start[k + 1] <= b) ++k;
  return k;
}

// lanes[0] after the tree over kAdamwLanes values (lane l += lane l + s, s = 128 ... 1).
__device__ __forceinline__ float block_tree_sum(float v, float *lanes) {
  const int l = threadIdx.x;
  lanes[l] = v;
  __syncthreads();
  for (int s = kAdamwLanes / 2; s >= 1; s >>= 1) {
    if (l < s) lanes[l] = __fadd_rn(lanes[l], lanes[l + s]);
    __syncthreads();
  }
  return lanes[0];
}

__global__ void __launch_bounds__(kAdamwLanes) norm_partials_kernel(const __grid_constant__ LaunchList L, float *partials) {
  __shared__ float lanes[kAdamwLanes];
  const uint32_t b = blockIdx.x;
  const int k = tensor_of_block(L, b);
  const TensorDesc &t = L.t[k];
  const int64_t start = static_cast<int64_t>(b - L.block_start[k]) * kAdamwChunk;
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = start + static_cast<int64_t>(j) * kAdamwLanes + threadIdx.x;
    if (i < t.numel) {
      const float g = dev_load_as_float(t.g, t.gt, i);
      acc = __fadd_rn(acc, __fmul_rn(g, g));
    }
  }
  const float sum = block_tree_sum(acc, lanes);
  if (threadIdx.x == 0) partials[L.chunk_base + b] = sum;
}

__global__ void __launch_bounds__(kAdamwLanes) norm_final_kernel(const float *partials, int64_t count, float *norm,
                                                                  float *grad_norm) {
  __shared__ float lanes[kAdamwLanes];
  float acc = 0.0f;
  for (int64_t c = threadIdx.x; c < count; c += kAdamwLanes) acc = __fadd_rn(acc, partials[c]);
  const float total = block_tree_sum(acc, lanes);
  if (threadIdx.x == 0) {
    const float r = __fsqrt_rn(total);
    *norm = r;
    if (grad_norm) *grad_norm = r;
  }
}

__global__ void __launch_bounds__(kAdamwLanes) update_kernel(const __grid_constant__ LaunchList L, const UpdateScalars s) {
  float clip = 1.0f;
  if (s.norm) {
    const float norm = *s.norm;
    if (!isfinite(norm)) return;  // the whole step is skipped
    const float c = __fdiv_rn(s.max_grad_norm, __fadd_rn(norm, 1e-6f));
    clip = c < 1.0f ? c : 1.0f;
  }
  const uint32_t b = blockIdx.x;
  const int k = tensor_of_block(L, b);
  const TensorDesc &t = L.t[k];
  const int64_t start = static_cast<int64_t>(b - L.block_start[k]) * kAdamwChunk;
#pragma unroll 4
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = start + static_cast<int64_t>(j) * kAdamwLanes + threadIdx.x;
    if (i >= t.numel) break;
    const float g = __fmul_rn(dev_load_as_float(t.g, t.gt, i), clip);
    float p = t.p[i];
    if (t.decay) p = __fsub_rn(p, __fmul_rn(s.lr_wd, p));
    const float m = __fadd_rn(__fmul_rn(s.beta1, t.m[i]), __fmul_rn(s.omb1, g));
    const float v = __fadd_rn(__fmul_rn(s.beta2, t.v[i]), __fmul_rn(s.omb2, __fmul_rn(g, g)));
    const float mhat = __fdiv_rn(m, s.bc1);
    const float denom = __fadd_rn(__fsqrt_rn(__fdiv_rn(v, s.bc2)), s.eps);
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(s.lr, mhat), denom));
    t.m[i] = m;
    t.v[i] = v;
    t.p[i] = p;
    if (t.mw) dev_store_from_float(t.mw, t.mt, i, p);
  }
}

// Calls f(list, blocks) for consecutive groups of at most kMaxTensors tensors (and at most
// 2^31 - 1 blocks; the core refuses a single tensor larger than that).
template <class F>
void for_each_launch(const AdamwArgs &a, F &&f) {
  LaunchList L{};
  int64_t blocks = 0, chunk_base = 0;
  auto flush = [&] {
    if (L.n == 0) return;
    L.block_start[L.n] = static_cast<uint32_t>(blocks);
    L.chunk_base = chunk_base;
    f(L, static_cast<unsigned>(blocks));
    chunk_base += blocks;
    L = LaunchList{};
    blocks = 0;
  };
  for (int i = 0; i < a.count; ++i) {
    const AdamwTensor &s = a.tensors[i];
    const int64_t chunks = adamw_chunks(s.numel);
    if (L.n == kMaxTensors || blocks + chunks > INT32_MAX) flush();
    TensorDesc &d = L.t[L.n];
    d.p = s.param;
    d.g = s.grad;
    d.m = s.exp_avg;
    d.v = s.exp_avg_sq;
    d.mw = s.model_weight;
    d.numel = s.numel;
    d.gt = s.grad_dtype;
    d.mt = s.model_dtype;
    d.decay = s.decay;
    L.block_start[L.n] = static_cast<uint32_t>(blocks);
    ++L.n;
    blocks += chunks;
  }
  flush();
}

}  // namespace

// The whole step on `stream`; scratch: total_chunks + 1 floats when the args need the norm.
// Separate from the backend class so that the kernels can be exercised alone.
void adamw_enqueue(const AdamwArgs &a, float *scratch, cudaStream_t stream) {
  if (a.count == 0) return;
  UpdateScalars s{a.lr, a.beta1, a.beta2, a.eps, a.lr_wd, a.one_minus_beta1, a.one_minus_beta2,
                  a.bias_correction1, a.bias_correction2, a.max_grad_norm, nullptr};
  if (a.needs_norm()) {
    float *partials = scratch;
    float *norm = partials + a.total_chunks;
    for_each_launch(a, [&](const LaunchList &L, unsigned blocks) {
      launch_kernel<norm_partials_kernel>(blocks, kAdamwLanes, 0, stream, L, partials);
    });
    launch_kernel<norm_final_kernel>(1, kAdamwLanes, 0, stream, partials, a.total_chunks, norm, a.grad_norm);
    if (a.max_grad_norm > 0.0f) s.norm = norm;
  }
  for_each_launch(a, [&](const LaunchList &L, unsigned blocks) {
    launch_kernel<update_kernel>(blocks, kAdamwLanes, 0, stream, L, s);
  });
}

void CudaBackend::plan_adamw(const AdamwArgs &a, ScratchPlan *plan) const {
  if (a.needs_norm()) plan->add(static_cast<size_t>(a.total_chunks + 1) * sizeof(float));
}

void CudaBackend::adamw(const AdamwArgs &a) {
  if (a.count == 0) return;
  DeviceGuard guard(device_);
  Buffer scratch;  // freed stream-ordered: the kernels below are done with it first
  if (a.needs_norm()) scratch = Buffer(this, static_cast<size_t>(a.total_chunks + 1) * sizeof(float));
  adamw_enqueue(a, scratch.floats(), stream_);
}

}  // namespace te::cuda
