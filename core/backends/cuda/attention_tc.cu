// Tensor-core attention (FA2 style) for BF16 / F16 q, k, v, o with head_dim 64 or 128, 16-byte
// aligned tensors, any mask, GQA ratio, fixed or variable lengths (not FP8: the general kernels).
//
// Forward: one CTA of 4 warps per (64-query tile, head, sequence); each warp owns 16 query rows.
// Q lives in registers (ldmatrix A fragments); K and V tiles of 64 keys stream through shared
// memory with cp.async, double buffered (the next tile loads while the current one computes);
// rows are 16-byte-chunk XOR-swizzled so that ldmatrix is free of bank conflicts. S = Q K^T and
// O += P V are mma.sync m16n8k16 with fp32 accumulation; the softmax is online (running max m
// and sum l per row, in the log2 domain: scores scaled by softmax_scale * log2(e), exp2f), P is
// rounded to the input dtype for the P V product (the error stays within the tests' bounds:
// see tests/gpu/cuda_attention_test.cpp). Causal masks skip the key tiles no row of the tile
// sees, and only tiles crossing the diagonal or the sequence end are masked per element. The
// query tiles run heaviest first (the grid's x is the head, y the reversed tile index).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cuda/attention_tc.cuh"
#include "backends/cuda/cuda_check.h"

namespace te::cuda {

namespace {

constexpr int kTcBQ = 64, kTcBK = 64, kTcThreads = 128;

struct TcFwdParams {
  const uint16_t *q, *k, *v;
  uint16_t *o;
  float *lse;
  int64_t heads, kv_heads, tokens_q, tokens_kv, max_q, max_kv;
  const int32_t *cu_q, *cu_kv;
  int mask;
  float scale_log2;  // softmax_scale * log2(e)
  int tiles;         // query tiles per sequence (grid y)
};

__device__ __forceinline__ int64_t clampi(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

struct TcSeq {
  int64_t qs, sq, ks, skv;
};

template <class P>
__device__ __forceinline__ TcSeq tc_seq(const P &p, int64_t b) {
  TcSeq s;
  if (p.cu_q != nullptr) {
    s.qs = clampi(p.cu_q[b], 0, p.tokens_q);
    s.sq = std::min<int64_t>(clampi(p.cu_q[b + 1], s.qs, p.tokens_q) - s.qs, p.max_q);
    s.ks = clampi(p.cu_kv[b], 0, p.tokens_kv);
    s.skv = std::min<int64_t>(clampi(p.cu_kv[b + 1], s.ks, p.tokens_kv) - s.ks, p.max_kv);
  } else {
    s.qs = clampi(b * p.max_q, 0, p.tokens_q);
    s.sq = clampi(p.tokens_q - s.qs, 0, p.max_q);
    s.ks = clampi(b * p.max_kv, 0, p.tokens_kv);
    s.skv = clampi(p.tokens_kv - s.ks, 0, p.max_kv);
  }
  return s;
}

__device__ __forceinline__ int64_t tc_key_end(int mask, int64_t i, int64_t sq, int64_t skv) {
  if (mask == 0) return skv;
  const int64_t off = mask == 1 ? 0 : skv - sq;
  return clampi(i + 1 + off, 0, skv);
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared; src_bytes 0 writes zeros (src is then never read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

template <bool kBf16>
__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kBf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
  }
}

// Byte offset of 16-byte chunk c of row r in a swizzled [rows][D] 16-bit tile.
template <int D>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>(r * (D * 2) + ((c ^ (r & 7)) << 4));
}

// Loads rows [row0, row0 + 64) (those < valid; zeros beyond) of head `head` into a swizzled tile.
template <int D>
__device__ __forceinline__ void load_tile_async(uint32_t dst, const uint16_t *src, int64_t row0, int valid, int64_t head,
                                                int64_t nh) {
  constexpr int kChunks = D / 8;
  for (int e = threadIdx.x; e < 64 * kChunks; e += kTcThreads) {
    const int r = e / kChunks, c = e - r * kChunks;
    const bool ok = r < valid;
    const uint16_t *g = ok ? src + ((row0 + r) * nh + head) * D + c * 8 : src;
    cp_async16(dst + swz<D>(r, c), g, ok ? 16 : 0);
  }
}

template <int D, bool kBf16>
__global__ void __launch_bounds__(kTcThreads) tc_fwd_kernel(TcFwdParams p) {
  extern __shared__ __align__(128) uint8_t tc_smem[];
  constexpr int kTile = 64 * D * 2;  // bytes of one 64-row tile
  const uint32_t sQ = smem_u32(tc_smem), sK0 = sQ + kTile;  // K0 V0 K1 V1
  const int64_t h = blockIdx.x, b = blockIdx.z;
  const int tile = p.tiles - 1 - static_cast<int>(blockIdx.y);
  const TcSeq s = tc_seq(p, b);
  const int64_t q0 = static_cast<int64_t>(tile) * kTcBQ;
  if (q0 >= s.sq) return;
  const int nq = static_cast<int>(std::min<int64_t>(kTcBQ, s.sq - q0));
  const int64_t g = h / (p.heads / p.kv_heads);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t kv_end = tc_key_end(p.mask, q0 + nq - 1, s.sq, s.skv);
  const int n_tiles = static_cast<int>((kv_end + kTcBK - 1) / kTcBK);

  load_tile_async<D>(sQ, p.q, s.qs + q0, nq, h, p.heads);
  if (n_tiles > 0) {
    load_tile_async<D>(sK0, p.k, s.ks, static_cast<int>(std::min<int64_t>(kTcBK, s.skv)), g, p.kv_heads);
    load_tile_async<D>(sK0 + kTile, p.v, s.ks, static_cast<int>(std::min<int64_t>(kTcBK, s.skv)), g, p.kv_heads);
  }
  cp_async_commit();

  // The rows this thread holds (C fragment rows lane/4 and lane/4 + 8 of its warp's 16).
  const int r_lo = warp * 16 + (lane >> 2);
  const int64_t i_lo = q0 + r_lo, i_hi = i_lo + 8;
  const int64_t end_lo = r_lo < nq ? tc_key_end(p.mask, i_lo, s.sq, s.skv) : 0;
  const int64_t end_hi = r_lo + 8 < nq ? tc_key_end(p.mask, i_hi, s.sq, s.skv) : 0;
  // Keys below this are visible to every valid row of the tile (no per-element mask needed).
  const int64_t all_end = tc_key_end(p.mask, q0, s.sq, s.skv);

  uint32_t qf[D / 16][4];
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < n_tiles) {
      const int64_t k0n = static_cast<int64_t>(t + 1) * kTcBK;
      const int nk = static_cast<int>(std::min<int64_t>(kTcBK, s.skv - k0n));
      const uint32_t dK = sK0 + (buf ^ 1) * 2 * kTile;
      load_tile_async<D>(dK, p.k, s.ks + k0n, nk, g, p.kv_heads);
      load_tile_async<D>(dK + kTile, p.v, s.ks + k0n, nk, g, p.kv_heads);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const int mi = lane >> 3;
        const int r = warp * 16 + (mi & 1) * 8 + (lane & 7), c = kk * 2 + (mi >> 1);
        ldmatrix_x4(sQ + swz<D>(r, c), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
      }
    }
    const uint32_t sK = sK0 + buf * 2 * kTile, sV = sK + kTile;
    const int64_t k0 = static_cast<int64_t>(t) * kTcBK;
    // S = Q K^T for this warp's 16 rows and the tile's 64 keys.
    float sc[kTcBK / 8][4];
#pragma unroll
    for (int n = 0; n < kTcBK / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kTcBK / 16; ++np) {
        const int mi = lane >> 3;
        const int r = np * 16 + (mi >> 1) * 8 + (lane & 7), c = kk * 2 + (mi & 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(sK + swz<D>(r, c), b0, b1, b2, b3);
        mma16816<kBf16>(sc[2 * np], qf[kk], b0, b1);
        mma16816<kBf16>(sc[2 * np + 1], qf[kk], b2, b3);
      }
    }
    // Scale (log2 domain) and mask.
    const bool need_mask = k0 + kTcBK > all_end || k0 + kTcBK > s.skv;
#pragma unroll
    for (int n = 0; n < kTcBK / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = sc[n][e] * p.scale_log2;
        if (need_mask) {
          const int64_t j = k0 + n * 8 + (lane & 3) * 2 + (e & 1);
          if (j >= (e < 2 ? end_lo : end_hi)) x = -INFINITY;
        }
        sc[n][e] = x;
      }
    }
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < kTcBK / 8; ++n) {
      mx_lo = fmaxf(mx_lo, fmaxf(sc[n][0], sc[n][1]));
      mx_hi = fmaxf(mx_hi, fmaxf(sc[n][2], sc[n][3]));
    }
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xFFFFFFFFu, mx_lo, 1));
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xFFFFFFFFu, mx_lo, 2));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xFFFFFFFFu, mx_hi, 1));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xFFFFFFFFu, mx_hi, 2));
    const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    const float mu_lo = mn_lo == -INFINITY ? 0.0f : mn_lo, mu_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
    const float a_lo = exp2f(m_lo - mu_lo), a_hi = exp2f(m_hi - mu_hi);
    m_lo = mn_lo, m_hi = mn_hi;
    float sum_lo = 0.0f, sum_hi = 0.0f;
    uint32_t pf[kTcBK / 16][4];
#pragma unroll
    for (int n = 0; n < kTcBK / 8; ++n) {
      const float p0 = exp2f(sc[n][0] - mu_lo), p1 = exp2f(sc[n][1] - mu_lo);
      const float p2 = exp2f(sc[n][2] - mu_hi), p3 = exp2f(sc[n][3] - mu_hi);
      sum_lo += p0 + p1;
      sum_hi += p2 + p3;
      pf[n >> 1][(n & 1) * 2 + 0] = pack2<kBf16>(p0, p1);
      pf[n >> 1][(n & 1) * 2 + 1] = pack2<kBf16>(p2, p3);
    }
    l_lo = l_lo * a_lo + sum_lo;
    l_hi = l_hi * a_hi + sum_hi;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      o[d][0] *= a_lo, o[d][1] *= a_lo;
      o[d][2] *= a_hi, o[d][3] *= a_hi;
    }
    // O += P V.
#pragma unroll
    for (int kk = 0; kk < kTcBK / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        const int mi = lane >> 3;
        const int r = kk * 16 + (mi & 1) * 8 + (lane & 7), c = dp * 2 + (mi >> 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(sV + swz<D>(r, c), b0, b1, b2, b3);
        mma16816<kBf16>(o[2 * dp], pf[kk], b0, b1);
        mma16816<kBf16>(o[2 * dp + 1], pf[kk], b2, b3);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  l_lo += __shfl_xor_sync(0xFFFFFFFFu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xFFFFFFFFu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xFFFFFFFFu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xFFFFFFFFu, l_hi, 2);
  constexpr float kLn2 = 0.69314718055994530942f;
  const float inv_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f, inv_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;
  if (r_lo < nq) {
    uint16_t *orow = p.o + ((s.qs + i_lo) * p.heads + h) * D + (lane & 3) * 2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) *reinterpret_cast<uint32_t *>(orow + d * 8) = pack2<kBf16>(o[d][0] * inv_lo, o[d][1] * inv_lo);
    if ((lane & 3) == 0) p.lse[(s.qs + i_lo) * p.heads + h] = l_lo > 0.0f ? (m_lo + log2f(l_lo)) * kLn2 : -INFINITY;
  }
  if (r_lo + 8 < nq) {
    uint16_t *orow = p.o + ((s.qs + i_hi) * p.heads + h) * D + (lane & 3) * 2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) *reinterpret_cast<uint32_t *>(orow + d * 8) = pack2<kBf16>(o[d][2] * inv_hi, o[d][3] * inv_hi);
    if ((lane & 3) == 0) p.lse[(s.qs + i_hi) * p.heads + h] = l_hi > 0.0f ? (m_hi + log2f(l_hi)) * kLn2 : -INFINITY;
  }
}


// ---- backward ------------------------------------------------------------------------------
// dK / dV: one CTA of 4 warps per (64-key tile, kv head, sequence); warp w owns keys 16w..16w+15
// and computes, for every query head of the group and every 32-query tile that sees the keys,
// S^T = K Q^T, P^T, dP^T = V dO^T, dS^T = P^T (dP^T - D) in registers (keys are the rows, so the
// C fragments are the A fragments of the next products), dV += P^T dO and dK += dS^T Q. Q, dO,
// LSE and D tiles are double buffered through cp.async.
// dQ: one CTA per (64-query tile, head, sequence) as the forward: S, P, dP = dO V^T, dS, dQ += dS K.
constexpr int kBwdBQ = 32;

struct TcBwdParams {
  const uint16_t *q, *k, *v, *d_o;
  uint16_t *dq, *dk, *dv;
  const float *lse, *dsum;
  int64_t heads, kv_heads, tokens_q, tokens_kv, max_q, max_kv;
  const int32_t *cu_q, *cu_kv;
  int mask;
  float scale, scale_log2;
  int tiles;
};

// Rows [row0, row0 + rows) (those < valid) of head `head`, swizzled, zeros beyond.
template <int D>
__device__ __forceinline__ void load_rows_async(uint32_t dst, const uint16_t *src, int rows, int64_t row0, int valid,
                                                int64_t head, int64_t nh) {
  constexpr int kChunks = D / 8;
  for (int e = threadIdx.x; e < rows * kChunks; e += kTcThreads) {
    const int r = e / kChunks, c = e - r * kChunks;
    const bool ok = r < valid;
    const uint16_t *g = ok ? src + ((row0 + r) * nh + head) * D + c * 8 : src;
    cp_async16(dst + swz<D>(r, c), g, ok ? 16 : 0);
  }
}

template <int D, bool kBf16>
__global__ void __launch_bounds__(kTcThreads) tc_dkdv_kernel(TcBwdParams p) {
  extern __shared__ __align__(128) uint8_t tc_smem[];
  constexpr int kKV = 64 * D * 2, kQ = kBwdBQ * D * 2;
  const uint32_t sK = smem_u32(tc_smem), sV = sK + kKV, sQ0 = sV + kKV;  // Q0 dO0 Q1 dO1
  float *stats = reinterpret_cast<float *>(tc_smem + 2 * kKV + 4 * kQ);  // [2][lse 32, dsum 32]
  const int64_t g = blockIdx.x, b = blockIdx.z;
  const int ktile = p.tiles - 1 - static_cast<int>(blockIdx.y);
  const TcSeq s = tc_seq(p, b);
  const int64_t k0 = static_cast<int64_t>(ktile) * 64;
  if (k0 >= s.skv) return;
  const int nk = static_cast<int>(std::min<int64_t>(64, s.skv - k0));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t group = p.heads / p.kv_heads;
  const int64_t off = p.mask == 2 ? s.skv - s.sq : 0;
  const int64_t i_min = p.mask == 0 ? 0 : std::max<int64_t>(0, k0 - off);
  const int64_t qt0 = i_min / kBwdBQ, qt_end = (s.sq + kBwdBQ - 1) / kBwdBQ;
  const int64_t per_head = std::max<int64_t>(0, qt_end - qt0);
  const int64_t steps = per_head * group;

  load_rows_async<D>(sK, p.k, 64, s.ks + k0, nk, g, p.kv_heads);
  load_rows_async<D>(sV, p.v, 64, s.ks + k0, nk, g, p.kv_heads);
  auto issue = [&](int64_t step, int buf) {
    const int64_t h = g * group + step / per_head;
    const int64_t q0 = (qt0 + step % per_head) * kBwdBQ;
    const int nq = static_cast<int>(std::min<int64_t>(kBwdBQ, s.sq - q0));
    const uint32_t dQ = sQ0 + buf * 2 * kQ;
    load_rows_async<D>(dQ, p.q, kBwdBQ, s.qs + q0, nq, h, p.heads);
    load_rows_async<D>(dQ + kQ, p.d_o, kBwdBQ, s.qs + q0, nq, h, p.heads);
    if (tid < 2 * kBwdBQ) {
      const int r = tid & (kBwdBQ - 1);
      const float *src = tid < kBwdBQ ? p.lse : p.dsum;
      const bool ok = r < nq;
      const uint32_t dst = smem_u32(stats + buf * 2 * kBwdBQ + tid);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst),
                   "l"(ok ? src + (s.qs + q0 + r) * p.heads + h : src), "r"(ok ? 4 : 0));
    }
  };
  if (steps > 0) issue(0, 0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;
  // This thread's keys (rows of the C fragments).
  const int64_t j_lo = k0 + warp * 16 + (lane >> 2), j_hi = j_lo + 8;

  for (int64_t st = 0; st < steps; ++st) {
    const int buf = static_cast<int>(st & 1);
    if (st + 1 < steps) {
      issue(st + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint32_t sQ = sQ0 + buf * 2 * kQ, sdO = sQ + kQ;
    const float *lse_s = stats + buf * 2 * kBwdBQ, *dsum_s = lse_s + kBwdBQ;
    const int64_t q0 = (qt0 + st % per_head) * kBwdBQ;
    // S^T = K Q^T and dP^T = V dO^T: 16 keys x 32 queries per warp.
    float sc[kBwdBQ / 8][4], dp[kBwdBQ / 8][4];
#pragma unroll
    for (int n = 0; n < kBwdBQ / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[n][e] = dp[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int mi = lane >> 3;
      uint32_t ka[4], va[4];
      {
        const int r = warp * 16 + (mi & 1) * 8 + (lane & 7), c = kk * 2 + (mi >> 1);
        ldmatrix_x4(sK + swz<D>(r, c), ka[0], ka[1], ka[2], ka[3]);
        ldmatrix_x4(sV + swz<D>(r, c), va[0], va[1], va[2], va[3]);
      }
#pragma unroll
      for (int np = 0; np < kBwdBQ / 16; ++np) {
        const int r = np * 16 + (mi >> 1) * 8 + (lane & 7), c = kk * 2 + (mi & 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(sQ + swz<D>(r, c), b0, b1, b2, b3);
        mma16816<kBf16>(sc[2 * np], ka, b0, b1);
        mma16816<kBf16>(sc[2 * np + 1], ka, b2, b3);
        ldmatrix_x4(sdO + swz<D>(r, c), b0, b1, b2, b3);
        mma16816<kBf16>(dp[2 * np], va, b0, b1);
        mma16816<kBf16>(dp[2 * np + 1], va, b2, b3);
      }
    }
    const bool need_mask = (p.mask != 0 && q0 + off < k0 + 63) || q0 + kBwdBQ > s.sq || k0 + 64 > s.skv;
    uint32_t pa[kBwdBQ / 16][4], dsa[kBwdBQ / 16][4];
#pragma unroll
    for (int n = 0; n < kBwdBQ / 8; ++n) {
      float pv[4], ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = n * 8 + (lane & 3) * 2 + (e & 1);
        const int64_t i = q0 + qc, j = e < 2 ? j_lo : j_hi;
        bool vis = true;
        if (need_mask) vis = i < s.sq && j < tc_key_end(p.mask, i, s.sq, s.skv);
        const float lse2 = lse_s[qc] * 1.4426950408889634f;
        const float pp = vis ? exp2f(sc[n][e] * p.scale_log2 - lse2) : 0.0f;
        pv[e] = pp;
        ds[e] = pp * (dp[n][e] - dsum_s[qc]);
      }
      pa[n >> 1][(n & 1) * 2 + 0] = pack2<kBf16>(pv[0], pv[1]);
      pa[n >> 1][(n & 1) * 2 + 1] = pack2<kBf16>(pv[2], pv[3]);
      dsa[n >> 1][(n & 1) * 2 + 0] = pack2<kBf16>(ds[0], ds[1]);
      dsa[n >> 1][(n & 1) * 2 + 1] = pack2<kBf16>(ds[2], ds[3]);
    }
    // dV += P^T dO, dK += dS^T Q (k = queries).
#pragma unroll
    for (int kk = 0; kk < kBwdBQ / 16; ++kk) {
#pragma unroll
      for (int dp2 = 0; dp2 < D / 16; ++dp2) {
        const int mi = lane >> 3;
        const int r = kk * 16 + (mi & 1) * 8 + (lane & 7), c = dp2 * 2 + (mi >> 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(sdO + swz<D>(r, c), b0, b1, b2, b3);
        mma16816<kBf16>(dv[2 * dp2], pa[kk], b0, b1);
        mma16816<kBf16>(dv[2 * dp2 + 1], pa[kk], b2, b3);
        ldmatrix_x4_trans(sQ + swz<D>(r, c), b0, b1, b2, b3);
        mma16816<kBf16>(dk[2 * dp2], dsa[kk], b0, b1);
        mma16816<kBf16>(dk[2 * dp2 + 1], dsa[kk], b2, b3);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  const int r_lo = warp * 16 + (lane >> 2);
  if (r_lo < nk) {
    const int64_t base = ((s.ks + j_lo) * p.kv_heads + g) * D + (lane & 3) * 2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      *reinterpret_cast<uint32_t *>(p.dv + base + d * 8) = pack2<kBf16>(dv[d][0], dv[d][1]);
      *reinterpret_cast<uint32_t *>(p.dk + base + d * 8) = pack2<kBf16>(dk[d][0] * p.scale, dk[d][1] * p.scale);
    }
  }
  if (r_lo + 8 < nk) {
    const int64_t base = ((s.ks + j_hi) * p.kv_heads + g) * D + (lane & 3) * 2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      *reinterpret_cast<uint32_t *>(p.dv + base + d * 8) = pack2<kBf16>(dv[d][2], dv[d][3]);
      *reinterpret_cast<uint32_t *>(p.dk + base + d * 8) = pack2<kBf16>(dk[d][2] * p.scale, dk[d][3] * p.scale);
    }
  }
}

template <int D, bool kBf16>
__global__ void __launch_bounds__(kTcThreads) tc_dq_kernel(TcBwdParams p) {
  extern __shared__ __align__(128) uint8_t tc_smem[];
  constexpr int kTile = 64 * D * 2;
  const uint32_t sQ = smem_u32(tc_smem), sdO = sQ + kTile, sK0 = sdO + kTile;  // K0 V0 K1 V1
  const int64_t h = blockIdx.x, b = blockIdx.z;
  const int tile = p.tiles - 1 - static_cast<int>(blockIdx.y);
  const TcSeq s = tc_seq(p, b);
  const int64_t q0 = static_cast<int64_t>(tile) * kTcBQ;
  if (q0 >= s.sq) return;
  const int nq = static_cast<int>(std::min<int64_t>(kTcBQ, s.sq - q0));
  const int64_t g = h / (p.heads / p.kv_heads);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t kv_end = tc_key_end(p.mask, q0 + nq - 1, s.sq, s.skv);
  const int n_tiles = static_cast<int>((kv_end + kTcBK - 1) / kTcBK);
  load_tile_async<D>(sQ, p.q, s.qs + q0, nq, h, p.heads);
  load_tile_async<D>(sdO, p.d_o, s.qs + q0, nq, h, p.heads);
  if (n_tiles > 0) {
    load_tile_async<D>(sK0, p.k, s.ks, static_cast<int>(std::min<int64_t>(kTcBK, s.skv)), g, p.kv_heads);
    load_tile_async<D>(sK0 + kTile, p.v, s.ks, static_cast<int>(std::min<int64_t>(kTcBK, s.skv)), g, p.kv_heads);
  }
  cp_async_commit();
  const int r_lo = warp * 16 + (lane >> 2);
  const int64_t i_lo = q0 + r_lo, i_hi = i_lo + 8;
  const int64_t end_lo = r_lo < nq ? tc_key_end(p.mask, i_lo, s.sq, s.skv) : 0;
  const int64_t end_hi = r_lo + 8 < nq ? tc_key_end(p.mask, i_hi, s.sq, s.skv) : 0;
  const int64_t all_end = tc_key_end(p.mask, q0, s.sq, s.skv);
  constexpr float kLog2e = 1.4426950408889634f;
  const float lse_lo = r_lo < nq ? p.lse[(s.qs + i_lo) * p.heads + h] * kLog2e : 0.0f;
  const float lse_hi = r_lo + 8 < nq ? p.lse[(s.qs + i_hi) * p.heads + h] * kLog2e : 0.0f;
  const float ds_lo = r_lo < nq ? p.dsum[(s.qs + i_lo) * p.heads + h] : 0.0f;
  const float ds_hi = r_lo + 8 < nq ? p.dsum[(s.qs + i_hi) * p.heads + h] : 0.0f;
  float dq[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  for (int t = 0; t < n_tiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < n_tiles) {
      const int64_t k0n = static_cast<int64_t>(t + 1) * kTcBK;
      const int nk = static_cast<int>(std::min<int64_t>(kTcBK, s.skv - k0n));
      const uint32_t dK = sK0 + (buf ^ 1) * 2 * kTile;
      load_tile_async<D>(dK, p.k, s.ks + k0n, nk, g, p.kv_heads);
      load_tile_async<D>(dK + kTile, p.v, s.ks + k0n, nk, g, p.kv_heads);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint32_t sK = sK0 + buf * 2 * kTile, sV = sK + kTile;
    const int64_t k0 = static_cast<int64_t>(t) * kTcBK;
    float sc[kTcBK / 8][4], dp[kTcBK / 8][4];
#pragma unroll
    for (int n = 0; n < kTcBK / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[n][e] = dp[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int mi = lane >> 3;
      uint32_t qa[4], da[4];
      {
        const int r = warp * 16 + (mi & 1) * 8 + (lane & 7), c = kk * 2 + (mi >> 1);
        ldmatrix_x4(sQ + swz<D>(r, c), qa[0], qa[1], qa[2], qa[3]);
        ldmatrix_x4(sdO + swz<D>(r, c), da[0], da[1], da[2], da[3]);
      }
#pragma unroll
      for (int np = 0; np < kTcBK / 16; ++np) {
        const int r = np * 16 + (mi >> 1) * 8 + (lane & 7), c = kk * 2 + (mi & 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(sK + swz<D>(r, c), b0, b1, b2, b3);
        mma16816<kBf16>(sc[2 * np], qa, b0, b1);
        mma16816<kBf16>(sc[2 * np + 1], qa, b2, b3);
        ldmatrix_x4(sV + swz<D>(r, c), b0, b1, b2, b3);
        mma16816<kBf16>(dp[2 * np], da, b0, b1);
        mma16816<kBf16>(dp[2 * np + 1], da, b2, b3);
      }
    }
    const bool need_mask = k0 + kTcBK > all_end || k0 + kTcBK > s.skv;
    uint32_t dsa[kTcBK / 16][4];
#pragma unroll
    for (int n = 0; n < kTcBK / 8; ++n) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = k0 + n * 8 + (lane & 3) * 2 + (e & 1);
        const bool vis = !need_mask || j < (e < 2 ? end_lo : end_hi);
        const float pp = vis ? exp2f(sc[n][e] * p.scale_log2 - (e < 2 ? lse_lo : lse_hi)) : 0.0f;
        ds[e] = pp * (dp[n][e] - (e < 2 ? ds_lo : ds_hi));
      }
      dsa[n >> 1][(n & 1) * 2 + 0] = pack2<kBf16>(ds[0], ds[1]);
      dsa[n >> 1][(n & 1) * 2 + 1] = pack2<kBf16>(ds[2], ds[3]);
    }
#pragma unroll
    for (int kk = 0; kk < kTcBK / 16; ++kk) {
#pragma unroll
      for (int dp2 = 0; dp2 < D / 16; ++dp2) {
        const int mi = lane >> 3;
        const int r = kk * 16 + (mi & 1) * 8 + (lane & 7), c = dp2 * 2 + (mi >> 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(sK + swz<D>(r, c), b0, b1, b2, b3);
        mma16816<kBf16>(dq[2 * dp2], dsa[kk], b0, b1);
        mma16816<kBf16>(dq[2 * dp2 + 1], dsa[kk], b2, b3);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  if (r_lo < nq) {
    uint16_t *row = p.dq + ((s.qs + i_lo) * p.heads + h) * D + (lane & 3) * 2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) *reinterpret_cast<uint32_t *>(row + d * 8) = pack2<kBf16>(dq[d][0] * p.scale, dq[d][1] * p.scale);
  }
  if (r_lo + 8 < nq) {
    uint16_t *row = p.dq + ((s.qs + i_hi) * p.heads + h) * D + (lane & 3) * 2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) *reinterpret_cast<uint32_t *>(row + d * 8) = pack2<kBf16>(dq[d][2] * p.scale, dq[d][3] * p.scale);
  }
}

template <int D, bool kBf16>
void launch_bwd(TcBwdParams p, int64_t batch, cudaStream_t stream) {
  {
    const size_t smem = static_cast<size_t>(2) * 64 * D * 2 + 4 * kBwdBQ * D * 2 + 4 * kBwdBQ * sizeof(float);
    auto kernel = tc_dkdv_kernel<D, kBf16>;
    TE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    TcBwdParams pk = p;
    pk.tiles = static_cast<int>((p.max_kv + 63) / 64);
    if (pk.tiles > 0) {
      const dim3 grid(static_cast<unsigned>(p.kv_heads), static_cast<unsigned>(pk.tiles), static_cast<unsigned>(batch));
      kernel<<<grid, kTcThreads, smem, stream>>>(pk);
      TE_CUDA_CHECK_LAUNCH();
    }
  }
  {
    const size_t smem = static_cast<size_t>(6) * 64 * D * 2;
    auto kernel = tc_dq_kernel<D, kBf16>;
    TE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    p.tiles = static_cast<int>((p.max_q + kTcBQ - 1) / kTcBQ);
    if (p.tiles > 0) {
      const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.tiles), static_cast<unsigned>(batch));
      kernel<<<grid, kTcThreads, smem, stream>>>(p);
      TE_CUDA_CHECK_LAUNCH();
    }
  }
}

bool aligned16p(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <int D, bool kBf16>
void launch_fwd(const TcFwdParams &p, int64_t batch, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(5) * 64 * D * 2;
  auto kernel = tc_fwd_kernel<D, kBf16>;
  TE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.tiles), static_cast<unsigned>(batch));
  kernel<<<grid, kTcThreads, smem, stream>>>(p);
  TE_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_tc_forward(const AttentionForwardArgs &args, cudaStream_t stream) {
  const AttentionDims &d = args.dims;
  const DType t = args.q.dtype;
  if (t != DType::BF16 && t != DType::F16) return false;
  if (args.k.dtype != t || args.v.dtype != t || args.o.dtype != t) return false;
  if (d.head_dim != 64 && d.head_dim != 128) return false;
  if (!aligned16p(args.q.data) || !aligned16p(args.k.data) || !aligned16p(args.v.data) || !aligned16p(args.o.data))
    return false;
  const int64_t tiles = (d.max_seq_q + kTcBQ - 1) / kTcBQ;
  if (tiles <= 0 || d.batch <= 0) return tiles <= 0 || d.batch <= 0;  // nothing to compute
  if (tiles >= 65536 || d.batch >= 65536 || d.heads >= (1LL << 31)) return false;
  TcFwdParams p;
  p.q = static_cast<const uint16_t *>(args.q.data);
  p.k = static_cast<const uint16_t *>(args.k.data);
  p.v = static_cast<const uint16_t *>(args.v.data);
  p.o = static_cast<uint16_t *>(args.o.data);
  p.lse = args.lse;
  p.heads = d.heads, p.kv_heads = d.kv_heads, p.tokens_q = d.tokens_q, p.tokens_kv = d.tokens_kv;
  p.max_q = d.max_seq_q, p.max_kv = d.max_seq_kv;
  p.cu_q = d.cu_seqlens_q, p.cu_kv = d.cu_seqlens_kv;
  p.mask = static_cast<int>(d.mask);
  p.scale_log2 = d.softmax_scale * 1.4426950408889634f;
  p.tiles = static_cast<int>(tiles);
  const bool bf = t == DType::BF16;
  if (d.head_dim == 64) bf ? launch_fwd<64, true>(p, d.batch, stream) : launch_fwd<64, false>(p, d.batch, stream);
  else bf ? launch_fwd<128, true>(p, d.batch, stream) : launch_fwd<128, false>(p, d.batch, stream);
  return true;
}


bool attention_tc_backward(const AttentionBackwardArgs &args, const float *dsum, cudaStream_t stream) {
  const AttentionDims &d = args.dims;
  const DType t = args.q.dtype;
  if (t != DType::BF16 && t != DType::F16 || args.dp_amax_only) return false;
  if (args.k.dtype != t || args.v.dtype != t || args.o.dtype != t || args.d_o.dtype != t || args.dq.dtype != t ||
      args.dk.dtype != t || args.dv.dtype != t)
    return false;
  if (d.head_dim != 64 && d.head_dim != 128) return false;
  for (const void *ptr : {args.q.data, args.k.data, args.v.data, args.d_o.data, args.dq.data, args.dk.data, args.dv.data})
    if (!aligned16p(ptr)) return false;
  if (d.batch <= 0 || d.batch >= 65536 || d.max_seq_q / 64 >= 65535 || d.max_seq_kv / 64 >= 65535) return false;
  TcBwdParams p;
  p.q = static_cast<const uint16_t *>(args.q.data);
  p.k = static_cast<const uint16_t *>(args.k.data);
  p.v = static_cast<const uint16_t *>(args.v.data);
  p.d_o = static_cast<const uint16_t *>(args.d_o.data);
  p.dq = static_cast<uint16_t *>(args.dq.data);
  p.dk = static_cast<uint16_t *>(args.dk.data);
  p.dv = static_cast<uint16_t *>(args.dv.data);
  p.lse = args.lse, p.dsum = dsum;
  p.heads = d.heads, p.kv_heads = d.kv_heads, p.tokens_q = d.tokens_q, p.tokens_kv = d.tokens_kv;
  p.max_q = d.max_seq_q, p.max_kv = d.max_seq_kv;
  p.cu_q = d.cu_seqlens_q, p.cu_kv = d.cu_seqlens_kv;
  p.mask = static_cast<int>(d.mask);
  p.scale = d.softmax_scale;
  p.scale_log2 = d.softmax_scale * 1.4426950408889634f;
  p.tiles = 0;
  const bool bf = t == DType::BF16;
  if (d.head_dim == 64) bf ? launch_bwd<64, true>(p, d.batch, stream) : launch_bwd<64, false>(p, d.batch, stream);
  else bf ? launch_bwd<128, true>(p, d.batch, stream) : launch_bwd<128, false>(p, d.batch, stream);
  return true;
}

}  // namespace te::cuda
