#include "backends/cuda/cudnn_sdpa_kernels.h"

#include <cmath>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {
namespace {

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

__device__ __forceinline__ int64_t offset_at(const int32_t *cu, int64_t b, int64_t tokens) {
  return clamp64(cu[b], 0, tokens);
}

// Sequence b's clamped [start, start + len).
__device__ __forceinline__ void seq_range(const int32_t *cu, int64_t b, int64_t tokens, int64_t max_len, int64_t *start,
                                          int64_t *len) {
  const int64_t o = offset_at(cu, b, tokens), e = offset_at(cu, b + 1, tokens);
  *start = o;
  *len = clamp64(e - o, 0, max_len);
}

__global__ void prepare_lengths_kernel(SdpaSeqInfo s, int32_t *seq_q, int32_t *seq_kv, int64_t *off_q, int64_t *off_kv,
                                       int64_t *off_stats) {
  for (int64_t b = threadIdx.x + (int64_t)blockIdx.x * blockDim.x; b <= s.batch; b += (int64_t)blockDim.x * gridDim.x) {
    if (!s.cu_q) {
      if (b < s.batch) {
        seq_q[b] = (int32_t)s.max_q;
        seq_kv[b] = (int32_t)s.max_kv;
      }
      continue;
    }
    const int64_t oq = offset_at(s.cu_q, b, s.tokens_q), okv = offset_at(s.cu_kv, b, s.tokens_kv);
    if (off_q) off_q[b] = oq * s.heads * s.head_dim;
    if (off_kv) off_kv[b] = okv * s.kv_heads * s.head_dim;
    if (off_stats) off_stats[b] = oq * s.heads;
    if (b < s.batch) {
      int64_t st, len;
      seq_range(s.cu_q, b, s.tokens_q, s.max_q, &st, &len);
      seq_q[b] = (int32_t)len;
      seq_range(s.cu_kv, b, s.tokens_kv, s.max_kv, &st, &len);
      seq_kv[b] = (int32_t)len;
    }
  }
}

// Token t's sequence b and row i in it; false when t lies in no sequence.
__device__ bool locate(const SdpaSeqInfo &s, int64_t t, int64_t *b, int64_t *i, int64_t *sq, int64_t *skv) {
  if (!s.cu_q) {
    *b = t / s.max_q;
    *i = t % s.max_q;
    *sq = s.max_q;
    *skv = s.max_kv;
    return true;
  }
  // Largest b with start(b) <= t (clamped offsets are non-decreasing when the input is sane;
  // otherwise this finds some b and the range check below decides).
  int64_t lo = 0, hi = s.batch - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (offset_at(s.cu_q, mid, s.tokens_q) <= t) lo = mid; else hi = mid - 1;
  }
  int64_t start, len;
  seq_range(s.cu_q, lo, s.tokens_q, s.max_q, &start, &len);
  if (t < start || t >= start + len) return false;
  int64_t kst, klen;
  seq_range(s.cu_kv, lo, s.tokens_kv, s.max_kv, &kst, &klen);
  *b = lo;
  *i = t - start;
  *sq = len;
  *skv = klen;
  return true;
}

__global__ void finish_forward_kernel(SdpaSeqInfo s, const float *stats_bhs, float *lse, char *o, int o_elem_bytes) {
  const int64_t t = blockIdx.x;
  int64_t b, i, sq, skv;
  if (!locate(s, t, &b, &i, &sq, &skv)) return;
  const bool visible = skv > 0 && (s.mask != 2 || i + skv - sq >= 0);
  if (lse) {
    for (int64_t h = threadIdx.x; h < s.heads; h += blockDim.x) {
      if (!visible) lse[t * s.heads + h] = -INFINITY;
      else if (stats_bhs) lse[t * s.heads + h] = stats_bhs[(b * s.heads + h) * s.max_q + i];
    }
  }
  if (!visible && o) {
    const int64_t bytes = s.heads * s.head_dim * o_elem_bytes;
    char *row = o + t * bytes;
    for (int64_t k = threadIdx.x; k < bytes; k += blockDim.x) row[k] = 0;
  }
}

__global__ void prepare_backward_stats_kernel(SdpaSeqInfo s, const float *lse, float *stats) {
  const int64_t t = blockIdx.x;
  int64_t b, i, sq, skv;
  if (!locate(s, t, &b, &i, &sq, &skv)) return;
  for (int64_t h = threadIdx.x; h < s.heads; h += blockDim.x) {
    float v = lse[t * s.heads + h];
    if (v == -INFINITY || v != v) v = INFINITY;
    if (s.cu_q) stats[t * s.heads + h] = v;
    else stats[(b * s.heads + h) * s.max_q + i] = v;
  }
}

__global__ void max_merge_kernel(const float *src, float *dst) {
  const float a = *dst, b = *src;
  *dst = (a != a || b != b) ? NAN : (b > a ? b : a);
}

}  // namespace

void sdpa_max_merge(const float *src, float *dst, cudaStream_t stream) {
  launch_kernel<max_merge_kernel>(1, 1, 0, stream, src, dst);
  TE_CUDA_CHECK(cudaGetLastError());
}

void sdpa_prepare_lengths(const SdpaSeqInfo &s, int32_t *seq_q, int32_t *seq_kv, int64_t *off_q, int64_t *off_kv,
                          int64_t *off_stats, cudaStream_t stream) {
  const int64_t n = s.batch + 1;
  const int threads = 256;
  const int blocks = (int)((n + threads - 1) / threads);
  launch_kernel<prepare_lengths_kernel>(blocks, threads, 0, stream, s, seq_q, seq_kv, off_q, off_kv, off_stats);
  TE_CUDA_CHECK(cudaGetLastError());
}

void sdpa_finish_forward(const SdpaSeqInfo &s, const float *stats_bhs, float *lse, void *o, int o_elem_bytes,
                         cudaStream_t stream) {
  if (s.tokens_q <= 0) return;
  launch_kernel<finish_forward_kernel>((unsigned)s.tokens_q, 128, 0, stream, s, stats_bhs, lse, static_cast<char *>(o),
      o_elem_bytes);
  TE_CUDA_CHECK(cudaGetLastError());
}

void sdpa_prepare_backward_stats(const SdpaSeqInfo &s, const float *lse, float *stats, cudaStream_t stream) {
  if (s.tokens_q <= 0) return;
  launch_kernel<prepare_backward_stats_kernel>((unsigned)s.tokens_q, 64, 0, stream, s, lse, stats);
  TE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace te::cuda
