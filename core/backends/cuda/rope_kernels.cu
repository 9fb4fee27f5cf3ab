// Rotary position embedding (RopeArgs, numerics/attention.h): bit-identical to the CPU backend.
// One thread per rotated pair (both of its elements, so y may alias x) or per copied feature.
// c and s come from the double cos / sin of the fp32 angle, rounded to float; every product and
// sum is a separately rounded _rn intrinsic (no FMA contraction), as the CPU computes them.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {

namespace {

struct RopeParams {
  const void *x;
  void *y;
  const float *freqs;
  DType xt, yt;
  int64_t tokens, heads, head_dim, half, extra, positions;
  int64_t seq_len, batch;
  const int32_t *cu;
  const float *table;  // optional: cos then sin of every freqs entry, [2][positions * half]
  bool interleaved, inverse;
};

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The position of token t: BSHD t % seq_len; THD t - start of the sequence holding t (offsets
// clamped into [0, tokens]); -1 for a token outside every sequence (before the first offset or
// at / after the last), which is left as it is, as on the CPU.
__device__ __forceinline__ int64_t rope_position(const RopeParams &p, int64_t t) {
  if (p.cu == nullptr) return p.seq_len > 0 ? t % p.seq_len : 0;
  if (p.batch <= 0) return -1;
  if (t < clamp64(p.cu[0], 0, p.tokens) || t >= clamp64(p.cu[p.batch], 0, p.tokens)) return -1;
  // Binary search for the last b in [0, batch) with start(b) <= t.
  int64_t lo = 0, hi = p.batch - 1, start = 0;
  while (lo <= hi) {
    const int64_t mid = (lo + hi) >> 1;
    int64_t s = clamp64(p.cu[mid], 0, p.tokens);
    if (s <= t) {
      start = s;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return t - start;
}

__global__ void rope_kernel_impl(RopeParams p) {
  const int64_t per_head = p.half + p.extra;
  const int64_t total = p.tokens * p.heads * per_head;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t item = idx % per_head;
    const int64_t th = idx / per_head;  // token * heads + head
    const int64_t t = th / p.heads;
    const int64_t base = th * p.head_dim;
    const int64_t pos0 = rope_position(p, t);
    if (pos0 < 0) continue;
    if (item >= p.half) {  // a copied feature
      const int64_t d = 2 * p.half + (item - p.half);
      dev_store_from_float(p.y, p.yt, base + d, dev_load_as_float(p.x, p.xt, base + d));
      continue;
    }
    const int64_t k = item;
    const int64_t pos = clamp64(pos0, 0, p.positions - 1);
    float c, s;
    if (p.table) {
      c = p.table[pos * p.half + k];
      s = p.table[p.positions * p.half + pos * p.half + k];
    } else {
      const double a = static_cast<double>(p.freqs[pos * p.half + k]);
      c = static_cast<float>(cos(a));
      s = static_cast<float>(sin(a));
    }
    if (p.inverse) s = -s;
    const int64_t d1 = p.interleaved ? 2 * k : k;
    const int64_t d2 = p.interleaved ? 2 * k + 1 : k + p.half;
    const float x1 = dev_load_as_float(p.x, p.xt, base + d1);
    const float x2 = dev_load_as_float(p.x, p.xt, base + d2);
    const float y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    const float y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
    dev_store_from_float(p.y, p.yt, base + d1, y1);
    dev_store_from_float(p.y, p.yt, base + d2, y2);
  }
}

// cos and sin of every angle of freqs, exactly as rope_kernel_impl computes them inline (double,
// rounded to float): the same bits, but each angle once instead of once per token and head.
__global__ void rope_table_kernel(const float *freqs, int64_t n, float *table) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double a = static_cast<double>(freqs[i]);
    table[i] = static_cast<float>(cos(a));
    table[n + i] = static_cast<float>(sin(a));
  }
}

}  // namespace

size_t rope_table_bytes(const RopeArgs &args) {
  const int64_t half = args.rot_dim / 2, entries = args.freqs.rows() * half;
  // Worth it when the angles are fewer than the rotated pairs (they are many times fewer in
  // training: every token of every head reuses its position's angles).
  if (half <= 0 || entries <= 0 || entries >= args.tokens * args.heads * half) return 0;
  return static_cast<size_t>(2 * entries) * sizeof(float);
}

void rope_kernel(const RopeArgs &args, cudaStream_t stream, float *table) {
  RopeParams p;
  p.x = args.x.data;
  p.y = args.y.data;
  p.freqs = static_cast<const float *>(args.freqs.data);
  p.xt = args.x.dtype;
  p.yt = args.y.dtype;
  p.tokens = args.tokens;
  p.heads = args.heads;
  p.head_dim = args.head_dim;
  p.half = args.rot_dim / 2;
  p.extra = args.head_dim - 2 * p.half;
  p.positions = args.freqs.rows();
  p.seq_len = args.seq_len;
  p.batch = args.batch;
  p.cu = args.cu_seqlens;
  p.interleaved = args.interleaved;
  p.inverse = args.inverse;
  p.table = nullptr;
  if (table && p.half > 0 && p.positions > 0) {
    const int64_t n = p.positions * p.half;
    const int64_t tb = std::min<int64_t>((n + 255) / 256, 4096);
    launch_kernel<rope_table_kernel>(static_cast<unsigned>(tb), 256, 0, stream, p.freqs, n, table);
    p.table = table;
  }
  const int64_t total = p.tokens * p.heads * (p.half + p.extra);
  if (total <= 0) return;
  if (p.positions <= 0 && p.half > 0) return;  // the core never passes this
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65535LL * 16);
  launch_kernel<rope_kernel_impl>(static_cast<unsigned>(blocks), threads, 0, stream, p);
}

}  // namespace te::cuda
