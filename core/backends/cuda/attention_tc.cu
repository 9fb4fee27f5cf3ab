// Tensor-core attention (FA2 style, mma.sync) for the calls the general kernels of
// attention_kernels.cu would otherwise take: BF16 / F16 q, k, v, o (forward and backward) and
// E4M3 q, k, v with BF16 / F16 o (forward, sm_89+), head_dim 64 or 128, 16-byte aligned tensors;
// any mask, GQA ratio, fixed or variable lengths (offsets clamped as in the general kernels).
//
// Forward: one CTA of 4 warps per (128-query tile, head, sequence); each warp owns two 16-row
// m-tiles, so every K / V fragment read from shared memory feeds two mmas. K and V tiles of 64
// keys stream through shared memory with cp.async, double buffered; rows are 16-byte-chunk XOR
// swizzled so that ldmatrix is free of bank conflicts. S = Q K^T and O += P V are mma.sync
// m16n8k16 with fp32 accumulation; the softmax is online (running max and sum per row, in the
// log2 domain: scores times softmax_scale * log2(e), exp2f); P is rounded to the input dtype for
// the P V product (within the tests' bounds, tests/gpu/cuda_attention_test.cpp). Causal masks
// skip the key tiles no row of the tile sees, and only tiles crossing the diagonal or the
// sequence end are masked per element. Query tiles run heaviest first (grid x = head, y = the
// reversed tile index, so the heads of one tile are neighbours and share K / V in L2).
//
// Backward (deterministic, no atomics): D = rowsum(dO * O) comes from attention_kernels.cu.
//  - dK / dV: one CTA of 8 warps per (128-key tile, kv head, sequence), heaviest first; warp w
//    owns 16 keys and, for every query head of the group and 32-query step that sees the keys,
//    computes S^T = K Q^T and dP^T = V dO^T (keys are the rows, so the C fragments are directly
//    the A fragments of the next products), P^T, dS^T = P^T (dP^T - D), dV += P^T dO and
//    dK += dS^T Q. Q, dO, LSE and D steps are double buffered through cp.async.
//  - dQ: as the forward (128 queries, two m-tiles per warp, 32-key tiles): S, P, dP = dO V^T,
//    dS, dQ += dS K.
//
// FP8 forward: see tc_fwd_fp8_kernel.
// FP8 backward (E4M3 q / k / v, E4M3 or E5M2 dO8, BF16 / F16 gradients): a pre-pass writes the
// codes' values as F16 (exact) into scratch and the F16 backward kernels run with the FP8
// semantics in registers (kFp8): S and dP times their scale_invs, P8 = e4m3(P * s_scale) for dV,
// dS8 = fp8(dS * dp_scale) for dQ / dK, max |dS| into dp_amax (one atomicMax on the float bits
// per dK / dV CTA), the scale_invs applied to the fp32 sums at the end; dp_amax_only runs the
// dK / dV kernel alone. Still deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cuda/attention_tc.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_info.h"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {

namespace {

constexpr int kTcBQ = 64, kTcBK = 64, kTcThreads = 128;
// The forward's CTA: 4 warps of kFwdMT 16-row m-tiles each (K / V fragments feed kFwdMT mmas).
constexpr int kFwdMT = 2, kFwdBQ = 64 * kFwdMT;

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

// Rows [row0, row0 + rows) (those < valid) of head `head`, swizzled, zeros beyond.
template <int D>
__device__ __forceinline__ void load_rows_async(uint32_t dst, const uint16_t *src, int rows, int64_t row0, int valid,
                                                int64_t head, int64_t nh) {
  constexpr int kChunks = D / 8;
  for (int e = threadIdx.x; e < rows * kChunks; e += blockDim.x) {
    const int r = e / kChunks, c = e - r * kChunks;
    const bool ok = r < valid;
    const uint16_t *g = ok ? src + ((row0 + r) * nh + head) * D + c * 8 : src;
    cp_async16(dst + swz<D>(r, c), g, ok ? 16 : 0);
  }
}

template <int D, bool kBf16, int BKF>
__global__ void __launch_bounds__(kTcThreads) tc_fwd_kernel(TcFwdParams p) {
  extern __shared__ __align__(128) uint8_t tc_smem[];
  constexpr int kTile = 64 * D * 2;  // bytes of one 64-row Q tile
  constexpr int kKV = BKF * D * 2;   // bytes of one K or V tile
  constexpr int MT = kFwdMT;         // 16-row m-tiles per warp
  const uint32_t sQ = smem_u32(tc_smem), sK0 = sQ + MT * kTile;  // Q (64 MT rows), K0 V0 K1 V1
  const int64_t h = blockIdx.x, b = blockIdx.z;
  const int tile = p.tiles - 1 - static_cast<int>(blockIdx.y);
  const TcSeq s = tc_seq(p, b);
  const int64_t q0 = static_cast<int64_t>(tile) * kFwdBQ;
  if (q0 >= s.sq) return;
  const int nq = static_cast<int>(std::min<int64_t>(kFwdBQ, s.sq - q0));
  const int64_t g = h / (p.heads / p.kv_heads);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t kv_end = tc_key_end(p.mask, q0 + nq - 1, s.sq, s.skv);
  const int n_tiles = static_cast<int>((kv_end + BKF - 1) / BKF);

#pragma unroll
  for (int m = 0; m < MT; ++m)
    load_tile_async<D>(sQ + m * kTile, p.q, s.qs + q0 + m * 64, std::max(0, std::min(64, nq - m * 64)), h, p.heads);
  if (n_tiles > 0) {
    load_rows_async<D>(sK0, p.k, BKF, s.ks, static_cast<int>(std::min<int64_t>(BKF, s.skv)), g, p.kv_heads);
    load_rows_async<D>(sK0 + kKV, p.v, BKF, s.ks, static_cast<int>(std::min<int64_t>(BKF, s.skv)), g, p.kv_heads);
  }
  cp_async_commit();

  // Row (in the CTA's tile) of C fragment rows lane/4 (+8) of m-tile m: warp*16*MT + m*16 + lane/4.
  int end_r[MT][2];  // positions inside a sequence fit in int
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int r = warp * 16 * MT + m * 16 + (lane >> 2) + u * 8;
      end_r[m][u] = r < nq ? static_cast<int>(tc_key_end(p.mask, q0 + r, s.sq, s.skv)) : 0;
    }
  const int64_t all_end = tc_key_end(p.mask, q0, s.sq, s.skv);

  float o[MT][D / 8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[m][i][0] = o[m][i][1] = o[m][i][2] = o[m][i][3] = 0.0f;
  float mrow[MT][2], lrow[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) mrow[m][0] = mrow[m][1] = -INFINITY, lrow[m][0] = lrow[m][1] = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < n_tiles) {
      const int64_t k0n = static_cast<int64_t>(t + 1) * BKF;
      const int nk = static_cast<int>(std::min<int64_t>(BKF, s.skv - k0n));
      const uint32_t dK = sK0 + (buf ^ 1) * 2 * kKV;
      load_rows_async<D>(dK, p.k, BKF, s.ks + k0n, nk, g, p.kv_heads);
      load_rows_async<D>(dK + kKV, p.v, BKF, s.ks + k0n, nk, g, p.kv_heads);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint32_t sK = sK0 + buf * 2 * kKV, sV = sK + kKV;
    const int64_t k0 = static_cast<int64_t>(t) * BKF;
    // S = Q K^T for this warp's 16 MT rows and the tile's 64 keys (Q re-read from shared memory).
    float sc[MT][BKF / 8][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < BKF / 8; ++n) sc[m][n][0] = sc[m][n][1] = sc[m][n][2] = sc[m][n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int mi = lane >> 3;
      uint32_t qa[MT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const int r = warp * 16 * MT + m * 16 + (mi & 1) * 8 + (lane & 7), c = kk * 2 + (mi >> 1);
        ldmatrix_x4(sQ + swz<D>(r, c), qa[m][0], qa[m][1], qa[m][2], qa[m][3]);
      }
#pragma unroll
      for (int np = 0; np < BKF / 16; ++np) {
        const int r = np * 16 + (mi >> 1) * 8 + (lane & 7), c = kk * 2 + (mi & 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(sK + swz<D>(r, c), b0, b1, b2, b3);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma16816<kBf16>(sc[m][2 * np], qa[m], b0, b1);
          mma16816<kBf16>(sc[m][2 * np + 1], qa[m], b2, b3);
        }
      }
    }
    const bool need_mask = k0 + BKF > all_end || k0 + BKF > s.skv;
    uint32_t pf[MT][BKF / 16][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < BKF / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = sc[m][n][e] * p.scale_log2;
          if (need_mask) {
            const int j = static_cast<int>(k0) + n * 8 + (lane & 3) * 2 + (e & 1);
            if (j >= end_r[m][e >> 1]) x = -INFINITY;
          }
          sc[m][n][e] = x;
          mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
      }
      float mu[2], alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xFFFFFFFFu, mx[u], 1));
        mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xFFFFFFFFu, mx[u], 2));
        const float mn = fmaxf(mrow[m][u], mx[u]);
        mu[u] = mn == -INFINITY ? 0.0f : mn;
        alpha[u] = exp2f(mrow[m][u] - mu[u]);
        mrow[m][u] = mn;
      }
#pragma unroll
      for (int n = 0; n < BKF / 8; ++n) {
        const float p0 = exp2f(sc[m][n][0] - mu[0]), p1 = exp2f(sc[m][n][1] - mu[0]);
        const float p2 = exp2f(sc[m][n][2] - mu[1]), p3 = exp2f(sc[m][n][3] - mu[1]);
        sum[0] += p0 + p1;
        sum[1] += p2 + p3;
        pf[m][n >> 1][(n & 1) * 2 + 0] = pack2<kBf16>(p0, p1);
        pf[m][n >> 1][(n & 1) * 2 + 1] = pack2<kBf16>(p2, p3);
      }
      lrow[m][0] = lrow[m][0] * alpha[0] + sum[0];
      lrow[m][1] = lrow[m][1] * alpha[1] + sum[1];
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        o[m][d][0] *= alpha[0], o[m][d][1] *= alpha[0];
        o[m][d][2] *= alpha[1], o[m][d][3] *= alpha[1];
      }
    }
    // O += P V.
#pragma unroll
    for (int kk = 0; kk < BKF / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        const int mi = lane >> 3;
        const int r = kk * 16 + (mi & 1) * 8 + (lane & 7), c = dp * 2 + (mi >> 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(sV + swz<D>(r, c), b0, b1, b2, b3);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma16816<kBf16>(o[m][2 * dp], pf[m][kk], b0, b1);
          mma16816<kBf16>(o[m][2 * dp + 1], pf[m][kk], b2, b3);
        }
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  constexpr float kLn2 = 0.69314718055994530942f;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      float l = lrow[m][u];
      l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
      l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
      const int r = warp * 16 * MT + m * 16 + (lane >> 2) + u * 8;
      if (r >= nq) continue;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int64_t i = s.qs + q0 + r;
      uint16_t *orow = p.o + (i * p.heads + h) * D + (lane & 3) * 2;
#pragma unroll
      for (int d = 0; d < D / 8; ++d)
        *reinterpret_cast<uint32_t *>(orow + d * 8) = pack2<kBf16>(o[m][d][2 * u] * inv, o[m][d][2 * u + 1] * inv);
      if ((lane & 3) == 0) p.lse[i * p.heads + h] = l > 0.0f ? (mrow[m][u] + log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

// ---- FP8 forward ---------------------------------------------------------------------------
// q, k, v E4M3 (sm_89+ mma.sync m16n8k32 e4m3 for S = Q K^T), head_dim 64 or 128, o BF16 / F16.
// numerics/attention.h quantizes the normalised P, so the CTA makes two passes over its key
// tiles: the first takes the row max and sum (LSE), the second recomputes S, forms
// P = exp(S - LSE), max-accumulates it into s_amax, rounds P * s_scale to E4M3 and accumulates
// P8 V8 with an f16 mma.sync (E4M3 values are exact in f16, so the products are the codes'
// exact products, accumulated in fp32), V's codes converted to an f16 tile in shared memory.
// 4 warps of two 16-row m-tiles (128 queries), 64-key tiles; K tiles double buffered (cp.async).
struct TcFp8Params {
  const uint8_t *q, *k, *v;
  void *o;
  float *lse;
  int64_t heads, kv_heads, tokens_q, tokens_kv, max_q, max_kv;
  const int32_t *cu_q, *cu_kv;
  int mask;
  float softmax_scale;
  const float *q_si, *k_si, *v_si, *s_scale, *s_scale_inv;
  float *s_amax;
  int tiles;
};

// Byte offset of 16-byte chunk c of row r in a swizzled [rows][D] 8-bit tile (D = 64 or 128):
// 8 consecutive rows at one chunk fall in 8 different 16-byte bank groups.
template <int D>
__device__ __forceinline__ uint32_t swz8(int r, int c) {
  if constexpr (D == 128) return static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
  else return static_cast<uint32_t>(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
}

template <int D>
__device__ __forceinline__ void load_rows8_async(uint32_t dst, const uint8_t *src, int rows, int64_t row0, int valid,
                                                 int64_t head, int64_t nh) {
  constexpr int kChunks = D / 16;
  for (int e = threadIdx.x; e < rows * kChunks; e += blockDim.x) {
    const int r = e / kChunks, c = e - r * kChunks;
    const bool ok = r < valid;
    const uint8_t *g = ok ? src + ((row0 + r) * nh + head) * D + c * 16 : src;
    cp_async16(dst + swz8<D>(r, c), g, ok ? 16 : 0);
  }
}

__device__ __forceinline__ void mma_e4m3(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two E4M3 codes (low byte first) -> their f16 values, exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t codes) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(codes));
  return r;
}

// Two floats -> E4M3 (round to nearest, saturating) -> f16 values (the P8 operand).
__device__ __forceinline__ uint32_t p8_pair(float lo, float hi) {
  uint16_t c;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(c) : "f"(lo), "f"(hi));
  return e4m3x2_to_f16x2(c);
}

template <int D>
__device__ __forceinline__ void fp8_scores(float (&sc)[kFwdMT][kTcBK / 8][4], uint32_t sQ, uint32_t sK, int warp,
                                           int lane) {
#pragma unroll
  for (int m = 0; m < kFwdMT; ++m)
#pragma unroll
    for (int n = 0; n < kTcBK / 8; ++n) sc[m][n][0] = sc[m][n][1] = sc[m][n][2] = sc[m][n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk) {
    const int mi = lane >> 3;
    uint32_t qa[kFwdMT][4];
#pragma unroll
    for (int m = 0; m < kFwdMT; ++m) {
      const int r = warp * 16 * kFwdMT + m * 16 + (mi & 1) * 8 + (lane & 7), c = kk * 2 + (mi >> 1);
      ldmatrix_x4(sQ + swz8<D>(r, c), qa[m][0], qa[m][1], qa[m][2], qa[m][3]);
    }
#pragma unroll
    for (int np = 0; np < kTcBK / 16; ++np) {
      const int r = np * 16 + (mi >> 1) * 8 + (lane & 7), c = kk * 2 + (mi & 1);
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4(sK + swz8<D>(r, c), b0, b1, b2, b3);
#pragma unroll
      for (int m = 0; m < kFwdMT; ++m) {
        mma_e4m3(sc[m][2 * np], qa[m], b0, b1);
        mma_e4m3(sc[m][2 * np + 1], qa[m], b2, b3);
      }
    }
  }
}

// The same for m-tile m alone (pass 2 holds O, so one m-tile's scores at a time).
template <int D>
__device__ __forceinline__ void fp8_scores1(float (&sc)[kTcBK / 8][4], uint32_t sQ, uint32_t sK, int warp, int lane, int m) {
#pragma unroll
  for (int n = 0; n < kTcBK / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk) {
    const int mi = lane >> 3;
    uint32_t qa[4];
    {
      const int r = warp * 16 * kFwdMT + m * 16 + (mi & 1) * 8 + (lane & 7), c = kk * 2 + (mi >> 1);
      ldmatrix_x4(sQ + swz8<D>(r, c), qa[0], qa[1], qa[2], qa[3]);
    }
#pragma unroll
    for (int np = 0; np < kTcBK / 16; ++np) {
      const int r = np * 16 + (mi >> 1) * 8 + (lane & 7), c = kk * 2 + (mi & 1);
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4(sK + swz8<D>(r, c), b0, b1, b2, b3);
      mma_e4m3(sc[2 * np], qa, b0, b1);
      mma_e4m3(sc[2 * np + 1], qa, b2, b3);
    }
  }
}

template <int D, bool kOutBf16>
__global__ void __launch_bounds__(kTcThreads) tc_fwd_fp8_kernel(TcFp8Params p) {
  extern __shared__ __align__(128) uint8_t tc_smem[];
  constexpr int MT = kFwdMT, BK = kTcBK;
  constexpr int kQ = MT * 64 * D, kK = BK * D;  // bytes (8-bit tiles)
  // Q, K0, K1, V codes 0 and 1 (plain rows), V (f16, swizzled)
  const uint32_t sQ = smem_u32(tc_smem), sK0 = sQ + kQ, sV8 = sK0 + 2 * kK, sV = sV8 + 2 * kK;
  const uint8_t *v8tile = tc_smem + kQ + 2 * kK;
  uint8_t *vtile = tc_smem + kQ + 4 * kK;
  __shared__ uint32_t red[32];
  const int64_t h = blockIdx.x, b = blockIdx.z;
  const int tile = p.tiles - 1 - static_cast<int>(blockIdx.y);
  const TcSeq s = tc_seq(p, b);
  const int64_t q0 = static_cast<int64_t>(tile) * kFwdBQ;
  if (q0 >= s.sq) return;  // uniform over the CTA
  const int nq = static_cast<int>(std::min<int64_t>(kFwdBQ, s.sq - q0));
  const int64_t g = h / (p.heads / p.kv_heads);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t kv_end = tc_key_end(p.mask, q0 + nq - 1, s.sq, s.skv);
  const int n_tiles = static_cast<int>((kv_end + BK - 1) / BK);
  constexpr float kLog2e = 1.4426950408889634f;
  // S in the log2 domain: dot * (q.si * k.si) * scale * log2(e).
  const float f = ((*p.q_si * *p.k_si) * p.softmax_scale) * kLog2e;
  const float s_scale = *p.s_scale;

  int end_r[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int r = warp * 16 * MT + m * 16 + (lane >> 2) + u * 8;
      end_r[m][u] = r < nq ? static_cast<int>(tc_key_end(p.mask, q0 + r, s.sq, s.skv)) : 0;
    }
  const int64_t all_end = tc_key_end(p.mask, q0, s.sq, s.skv);
  float mrow[MT][2], lrow[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) mrow[m][0] = mrow[m][1] = -INFINITY, lrow[m][0] = lrow[m][1] = 0.0f;

  load_rows8_async<D>(sQ, p.q, 64 * MT, s.qs + q0, nq, h, p.heads);
  // Pass 1: row max and sum.
  for (int t = 0; t < n_tiles; ++t) {
    if (t == 0) {
      load_rows8_async<D>(sK0, p.k, BK, s.ks, static_cast<int>(std::min<int64_t>(BK, s.skv)), g, p.kv_heads);
      cp_async_commit();
    }
    const int buf = t & 1;
    if (t + 1 < n_tiles) {
      const int64_t k0n = static_cast<int64_t>(t + 1) * BK;
      load_rows8_async<D>(sK0 + (buf ^ 1) * kK, p.k, BK, s.ks + k0n, static_cast<int>(std::min<int64_t>(BK, s.skv - k0n)), g,
                          p.kv_heads);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t k0 = static_cast<int64_t>(t) * BK;
    float sc[MT][BK / 8][4];
    fp8_scores<D>(sc, sQ, sK0 + buf * kK, warp, lane);
    const bool need_mask = k0 + BK > all_end || k0 + BK > s.skv;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < BK / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = sc[m][n][e] * f;
          if (need_mask && static_cast<int>(k0) + n * 8 + (lane & 3) * 2 + (e & 1) >= end_r[m][e >> 1]) x = -INFINITY;
          sc[m][n][e] = x;
          mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
      float mu[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xFFFFFFFFu, mx[u], 1));
        mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xFFFFFFFFu, mx[u], 2));
        const float mn = fmaxf(mrow[m][u], mx[u]);
        mu[u] = mn == -INFINITY ? 0.0f : mn;
        lrow[m][u] *= exp2f(mrow[m][u] - mu[u]);
        mrow[m][u] = mn;
      }
#pragma unroll
      for (int n = 0; n < BK / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[e >> 1] += exp2f(sc[m][n][e] - mu[e >> 1]);
      lrow[m][0] += sum[0];
      lrow[m][1] += sum[1];
    }
    __syncthreads();
  }
  // LSE (log2 domain) of every row this thread holds.
  float lse2[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      float l = lrow[m][u];
      l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
      l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
      lse2[m][u] = l > 0.0f ? mrow[m][u] + log2f(l) : -INFINITY;
      lrow[m][u] = l;
    }
  // Pass 2: P, P8, O.
  float o[MT][D / 8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[m][i][0] = o[m][i][1] = o[m][i][2] = o[m][i][3] = 0.0f;
  float pmax = 0.0f;
  // K and V's codes stream in double buffered (cp.async); V's codes become an f16 tile.
  auto issue = [&](int t, int buf) {
    const int64_t k0 = static_cast<int64_t>(t) * BK;
    const int nk = static_cast<int>(std::min<int64_t>(BK, s.skv - k0));
    load_rows8_async<D>(sK0 + buf * kK, p.k, BK, s.ks + k0, nk, g, p.kv_heads);
    constexpr int kChunks = D / 16;
    for (int e = tid; e < BK * kChunks; e += kTcThreads) {
      const int r = e / kChunks, c = e - r * kChunks;
      const bool ok = r < nk;
      const uint8_t *src = ok ? p.v + ((s.ks + k0 + r) * p.kv_heads + g) * D + c * 16 : p.v;
      cp_async16(sV8 + buf * kK + r * D + c * 16, src, ok ? 16 : 0);
    }
    cp_async_commit();
  };
  if (n_tiles > 0) issue(0, 0);
  for (int t = 0; t < n_tiles; ++t) {
    const int64_t k0 = static_cast<int64_t>(t) * BK;
    const int buf = t & 1;
    if (t + 1 < n_tiles) {
      issue(t + 1, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    // V's codes -> f16 tile (swizzled like the 16-bit tiles), 16 codes per step.
    for (int e = tid; e < BK * (D / 16); e += kTcThreads) {
      const int r = e / (D / 16), c16 = e - r * (D / 16);
      const uint4 w = *reinterpret_cast<const uint4 *>(v8tile + buf * kK + r * D + c16 * 16);
      const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
      uint32_t hv[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        hv[2 * i] = e4m3x2_to_f16x2(static_cast<uint16_t>(ws[i] & 0xFFFFu));
        hv[2 * i + 1] = e4m3x2_to_f16x2(static_cast<uint16_t>(ws[i] >> 16));
      }
      *reinterpret_cast<uint4 *>(vtile + swz<D>(r, 2 * c16)) = make_uint4(hv[0], hv[1], hv[2], hv[3]);
      *reinterpret_cast<uint4 *>(vtile + swz<D>(r, 2 * c16 + 1)) = make_uint4(hv[4], hv[5], hv[6], hv[7]);
    }
    __syncthreads();
    const uint32_t sK = sK0 + buf * kK;
    const bool need_mask = k0 + BK > all_end || k0 + BK > s.skv;
    uint32_t pf[MT][BK / 16][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float sc[BK / 8][4];
      fp8_scores1<D>(sc, sQ, sK, warp, lane, m);
#pragma unroll
      for (int n = 0; n < BK / 8; ++n) {
        float pv[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool vis = !need_mask || static_cast<int>(k0) + n * 8 + (lane & 3) * 2 + (e & 1) < end_r[m][e >> 1];
          pv[e] = vis ? exp2f(sc[n][e] * f - lse2[m][e >> 1]) : 0.0f;
          pmax = fmaxf(pmax, pv[e]);
        }
        pf[m][n >> 1][(n & 1) * 2 + 0] = p8_pair(pv[0] * s_scale, pv[1] * s_scale);
        pf[m][n >> 1][(n & 1) * 2 + 1] = p8_pair(pv[2] * s_scale, pv[3] * s_scale);
      }
    }
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        const int mi = lane >> 3;
        const int r = kk * 16 + (mi & 1) * 8 + (lane & 7), c = dp * 2 + (mi >> 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(sV + swz<D>(r, c), b0, b1, b2, b3);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma16816<false>(o[m][2 * dp], pf[m][kk], b0, b1);
          mma16816<false>(o[m][2 * dp + 1], pf[m][kk], b2, b3);
        }
      }
    }
    __syncthreads();
  }
  if (p.s_amax != nullptr) {
    uint32_t bits = __float_as_uint(pmax);
    bits = __reduce_max_sync(0xFFFFFFFFu, bits);
    if (lane == 0) red[warp] = bits;
    __syncthreads();
    if (tid == 0) {
      uint32_t mx = 0;
      for (int w = 0; w < kTcThreads / 32; ++w) mx = std::max(mx, red[w]);
      atomicMax(reinterpret_cast<int *>(p.s_amax), static_cast<int>(mx > 0x7F800000u ? 0x7FC00000u : mx));
    }
  }
  const float post = *p.s_scale_inv * *p.v_si;
  constexpr float kLn2 = 0.69314718055994530942f;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int r = warp * 16 * MT + m * 16 + (lane >> 2) + u * 8;
      if (r >= nq) continue;
      const bool none = !(lrow[m][u] > 0.0f);
      const int64_t i = s.qs + q0 + r;
      uint16_t *orow = static_cast<uint16_t *>(p.o) + (i * p.heads + h) * D + (lane & 3) * 2;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        const float x0 = none ? 0.0f : o[m][d][2 * u] * post, x1 = none ? 0.0f : o[m][d][2 * u + 1] * post;
        *reinterpret_cast<uint32_t *>(orow + d * 8) = pack2<kOutBf16>(x0, x1);
      }
      if ((lane & 3) == 0) p.lse[i * p.heads + h] = none ? -INFINITY : lse2[m][u] * kLn2;
    }
}

template <int D, bool kOutBf16>
void launch_fwd_fp8(const TcFp8Params &p, int64_t batch, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(kFwdMT * 64 * D + 4 * kTcBK * D + kTcBK * D * 2);
  constexpr auto kernel = tc_fwd_fp8_kernel<D, kOutBf16>;
  allow_dynamic_smem(kernel, smem);
  const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.tiles), static_cast<unsigned>(batch));
  launch_kernel<kernel>(grid, kTcThreads, smem, stream, p);
}

bool tc_forward_fp8(const AttentionForwardArgs &args, cudaStream_t stream) {
  const AttentionDims &d = args.dims;
  if (args.q.dtype != DType::E4M3 || args.k.dtype != DType::E4M3 || args.v.dtype != DType::E4M3) return false;
  if (args.o.dtype != DType::BF16 && args.o.dtype != DType::F16) return false;
  if (d.head_dim != 64 && d.head_dim != 128) return false;
  for (const void *ptr : {args.q.data, args.k.data, args.v.data, args.o.data})
    if ((reinterpret_cast<uintptr_t>(ptr) & 15u) != 0) return false;
  const DeviceInfo &dev = current_device_info();
  if (dev.major * 10 + dev.minor < 89) return false;
  const int64_t tiles = (d.max_seq_q + kFwdBQ - 1) / kFwdBQ;
  if (tiles <= 0 || d.batch <= 0) return true;
  if (tiles >= 65536 || d.batch >= 65536) return false;
  TcFp8Params p;
  p.q = static_cast<const uint8_t *>(args.q.data);
  p.k = static_cast<const uint8_t *>(args.k.data);
  p.v = static_cast<const uint8_t *>(args.v.data);
  p.o = args.o.data;
  p.lse = args.lse;
  p.heads = d.heads, p.kv_heads = d.kv_heads, p.tokens_q = d.tokens_q, p.tokens_kv = d.tokens_kv;
  p.max_q = d.max_seq_q, p.max_kv = d.max_seq_kv;
  p.cu_q = d.cu_seqlens_q, p.cu_kv = d.cu_seqlens_kv;
  p.mask = static_cast<int>(d.mask);
  p.softmax_scale = d.softmax_scale;
  p.q_si = args.q.scale_inv, p.k_si = args.k.scale_inv, p.v_si = args.v.scale_inv;
  p.s_scale = args.s_scale, p.s_scale_inv = args.s_scale_inv, p.s_amax = args.s_amax;
  p.tiles = static_cast<int>(tiles);
  const bool bf = args.o.dtype == DType::BF16;
  if (d.head_dim == 64) bf ? launch_fwd_fp8<64, true>(p, d.batch, stream) : launch_fwd_fp8<64, false>(p, d.batch, stream);
  else bf ? launch_fwd_fp8<128, true>(p, d.batch, stream) : launch_fwd_fp8<128, false>(p, d.batch, stream);
  return true;
}

// ---- backward ------------------------------------------------------------------------------
// dK / dV: one CTA of 4 warps per (64-key tile, kv head, sequence); warp w owns keys 16w..16w+15
// and computes, for every query head of the group and every 32-query tile that sees the keys,
// S^T = K Q^T, P^T, dP^T = V dO^T, dS^T = P^T (dP^T - D) in registers (keys are the rows, so the
// C fragments are the A fragments of the next products), dV += P^T dO and dK += dS^T Q. Q, dO,
// LSE and D tiles are double buffered through cp.async.
// dQ: one CTA per (64-query tile, head, sequence) as the forward: S, P, dP = dO V^T, dS, dQ += dS K.
constexpr int kBwdBQ = 32;
// dK / dV's CTA: 8 warps of 16 keys (Q / dO tiles are loaded once for 128 keys).
constexpr int kDkvWarps = 8, kDkvThreads = 32 * kDkvWarps, kDkvBK = 16 * kDkvWarps;
// dQ's CTA: 4 warps of kDqMT 16-row m-tiles, key tiles of kDqBK.
constexpr int kDqMT = 2, kDqBQ = 64 * kDqMT, kDqBK = 32;

struct TcBwdParams {
  const uint16_t *q, *k, *v, *d_o;
  uint16_t *dq, *dk, *dv;
  const float *lse, *dsum;
  int64_t heads, kv_heads, tokens_q, tokens_kv, max_q, max_kv;
  const int32_t *cu_q, *cu_kv;
  int mask;
  float scale, scale_log2;
  int tiles;
  // FP8 kernels (kFp8): q, k, v, d_o above are F16 copies of the E4M3 / E5M2 codes' values
  // (exact), the scales are the args' device scalars.
  const float *q_si, *k_si, *v_si, *do_si, *s_scale, *s_scale_inv, *dp_scale, *dp_scale_inv;
  float *dp_amax;
  bool amax_only, ds_e5m2;
};

// Two E5M2 codes (low byte first) -> their f16 values, exactly.
__device__ __forceinline__ uint32_t e5m2x2_to_f16x2(uint16_t codes) {
  uint32_t r;
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(r) : "h"(codes));
  return r;
}
// Two floats -> dO8's format (round to nearest even, saturating) -> f16 values (the dS8 operand).
__device__ __forceinline__ uint32_t ds8_pair(float lo, float hi, bool e5m2) {
  uint16_t c;
  if (e5m2) {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;" : "=h"(c) : "f"(lo), "f"(hi));
    return e5m2x2_to_f16x2(c);
  }
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(c) : "f"(lo), "f"(hi));
  return e4m3x2_to_f16x2(c);
}

// FP8 codes -> f16 values of up to four tensors in one launch (blockIdx.y picks the tensor; 4 codes
// per step, n4 = count / 4). One launch, not one per tensor: at small shapes each is the cost.
constexpr int kMaxF16Ranges = 4;
struct F16Ranges {
  const uint32_t *src[kMaxF16Ranges];
  uint2 *dst[kMaxF16Ranges];
  int64_t n4[kMaxF16Ranges];
  bool e5m2[kMaxF16Ranges];
};

__global__ void fp8_to_f16_kernel(const __grid_constant__ F16Ranges r) {
  const int t = static_cast<int>(blockIdx.y);
  const uint32_t *src = r.src[t];
  uint2 *dst = r.dst[t];
  const int64_t n4 = r.n4[t];
  const bool e5m2 = r.e5m2[t];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t w = src[i];
    uint2 o;
    if (e5m2) o.x = e5m2x2_to_f16x2(static_cast<uint16_t>(w & 0xFFFFu)), o.y = e5m2x2_to_f16x2(static_cast<uint16_t>(w >> 16));
    else o.x = e4m3x2_to_f16x2(static_cast<uint16_t>(w & 0xFFFFu)), o.y = e4m3x2_to_f16x2(static_cast<uint16_t>(w >> 16));
    dst[i] = o;
  }
}

template <int D, bool kBf16, bool kFp8, bool kOutBf16>
__global__ void __launch_bounds__(kDkvThreads) tc_dkdv_kernel(TcBwdParams p) {
  extern __shared__ __align__(128) uint8_t tc_smem[];
  constexpr int kKV = kDkvBK * D * 2, kQ = kBwdBQ * D * 2;
  const uint32_t sK = smem_u32(tc_smem), sV = sK + kKV, sQ0 = sV + kKV;  // Q0 dO0 Q1 dO1
  float *stats = reinterpret_cast<float *>(tc_smem + 2 * kKV + 4 * kQ);  // [2][lse 32, dsum 32]
  const int64_t g = blockIdx.x, b = blockIdx.z;
  const int ktile = static_cast<int>(blockIdx.y);  // the first key tiles are the heaviest (causal)
  const TcSeq s = tc_seq(p, b);
  const int64_t k0 = static_cast<int64_t>(ktile) * kDkvBK;
  if (k0 >= s.skv) return;
  const int nk = static_cast<int>(std::min<int64_t>(kDkvBK, s.skv - k0));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t group = p.heads / p.kv_heads;
  const int64_t off = p.mask == 2 ? s.skv - s.sq : 0;
  const int64_t i_min = p.mask == 0 ? 0 : std::max<int64_t>(0, k0 - off);
  const int64_t qt0 = i_min / kBwdBQ, qt_end = (s.sq + kBwdBQ - 1) / kBwdBQ;
  const int64_t per_head = std::max<int64_t>(0, qt_end - qt0);
  const int64_t steps = per_head * group;

  load_rows_async<D>(sK, p.k, kDkvBK, s.ks + k0, nk, g, p.kv_heads);
  load_rows_async<D>(sV, p.v, kDkvBK, s.ks + k0, nk, g, p.kv_heads);
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
  // FP8: scores and dP from the codes' values times their scale_invs; P8 = e4m3(P * s_scale),
  // dS8 = fp8(dS * dp_scale); max |dS| (unquantized) into dp_amax.
  float sl2 = p.scale_log2, dpsi = 1.0f, s_scale = 1.0f, dp_scale = 1.0f;
  uint32_t dsmax = 0;
  if constexpr (kFp8) {
    sl2 = (*p.q_si * *p.k_si) * p.scale_log2;
    dpsi = *p.do_si * *p.v_si;
    if (!p.amax_only) s_scale = *p.s_scale, dp_scale = *p.dp_scale;
  }

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
    const bool need_mask = (p.mask != 0 && q0 + off < k0 + kDkvBK - 1) || q0 + kBwdBQ > s.sq || k0 + kDkvBK > s.skv;
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
        const float pp = vis ? exp2f(sc[n][e] * sl2 - lse2) : 0.0f;
        if constexpr (kFp8) {
          const float dsv = pp * (dp[n][e] * dpsi - dsum_s[qc]);
          dsmax = max(dsmax, __float_as_uint(dsv) & 0x7FFFFFFFu);
          pv[e] = pp * s_scale;
          ds[e] = dsv * dp_scale;
        } else {
          pv[e] = pp;
          ds[e] = pp * (dp[n][e] - dsum_s[qc]);
        }
      }
      if constexpr (kFp8) {
        pa[n >> 1][(n & 1) * 2 + 0] = p8_pair(pv[0], pv[1]);
        pa[n >> 1][(n & 1) * 2 + 1] = p8_pair(pv[2], pv[3]);
        dsa[n >> 1][(n & 1) * 2 + 0] = ds8_pair(ds[0], ds[1], p.ds_e5m2);
        dsa[n >> 1][(n & 1) * 2 + 1] = ds8_pair(ds[2], ds[3], p.ds_e5m2);
      } else {
        pa[n >> 1][(n & 1) * 2 + 0] = pack2<kBf16>(pv[0], pv[1]);
        pa[n >> 1][(n & 1) * 2 + 1] = pack2<kBf16>(pv[2], pv[3]);
        dsa[n >> 1][(n & 1) * 2 + 0] = pack2<kBf16>(ds[0], ds[1]);
        dsa[n >> 1][(n & 1) * 2 + 1] = pack2<kBf16>(ds[2], ds[3]);
      }
    }
    if (kFp8 && p.amax_only) {
      __syncthreads();
      continue;
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
  float dvs = 1.0f, dks = p.scale;
  if constexpr (kFp8) {
    if (p.dp_amax != nullptr) {
      __shared__ uint32_t red[kDkvWarps];
      const uint32_t wm = __reduce_max_sync(0xFFFFFFFFu, dsmax);
      if (lane == 0) red[warp] = wm;
      __syncthreads();
      if (tid == 0) {
        uint32_t mx = 0;
#pragma unroll
        for (int w = 0; w < kDkvWarps; ++w) mx = max(mx, red[w]);
        atomicMax(reinterpret_cast<int *>(p.dp_amax), static_cast<int>(mx > 0x7F800000u ? 0x7FC00000u : mx));
      }
    }
    if (p.amax_only) return;
    dvs = *p.s_scale_inv * *p.do_si;
    dks = (*p.dp_scale_inv * *p.q_si) * p.scale;
  }
  const int r_lo = warp * 16 + (lane >> 2);
  if (r_lo < nk) {
    const int64_t base = ((s.ks + j_lo) * p.kv_heads + g) * D + (lane & 3) * 2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      *reinterpret_cast<uint32_t *>(p.dv + base + d * 8) = pack2<kOutBf16>(dv[d][0] * dvs, dv[d][1] * dvs);
      *reinterpret_cast<uint32_t *>(p.dk + base + d * 8) = pack2<kOutBf16>(dk[d][0] * dks, dk[d][1] * dks);
    }
  }
  if (r_lo + 8 < nk) {
    const int64_t base = ((s.ks + j_hi) * p.kv_heads + g) * D + (lane & 3) * 2;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
      *reinterpret_cast<uint32_t *>(p.dv + base + d * 8) = pack2<kOutBf16>(dv[d][2] * dvs, dv[d][3] * dvs);
      *reinterpret_cast<uint32_t *>(p.dk + base + d * 8) = pack2<kOutBf16>(dk[d][2] * dks, dk[d][3] * dks);
    }
  }
}

template <int D, bool kBf16, bool kFp8, bool kOutBf16>
__global__ void __launch_bounds__(kTcThreads) tc_dq_kernel(TcBwdParams p) {
  extern __shared__ __align__(128) uint8_t tc_smem[];
  constexpr int MT = kDqMT, BK = kDqBK;
  constexpr int kQ = MT * 64 * D * 2, kKV = BK * D * 2;
  const uint32_t sQ = smem_u32(tc_smem), sdO = sQ + kQ, sK0 = sdO + kQ;  // K0 V0 K1 V1
  const int64_t h = blockIdx.x, b = blockIdx.z;
  const int tile = p.tiles - 1 - static_cast<int>(blockIdx.y);
  const TcSeq s = tc_seq(p, b);
  const int64_t q0 = static_cast<int64_t>(tile) * kDqBQ;
  if (q0 >= s.sq) return;
  const int nq = static_cast<int>(std::min<int64_t>(kDqBQ, s.sq - q0));
  const int64_t g = h / (p.heads / p.kv_heads);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t kv_end = tc_key_end(p.mask, q0 + nq - 1, s.sq, s.skv);
  const int n_tiles = static_cast<int>((kv_end + BK - 1) / BK);
  load_rows_async<D>(sQ, p.q, 64 * MT, s.qs + q0, nq, h, p.heads);
  load_rows_async<D>(sdO, p.d_o, 64 * MT, s.qs + q0, nq, h, p.heads);
  if (n_tiles > 0) {
    load_rows_async<D>(sK0, p.k, BK, s.ks, static_cast<int>(std::min<int64_t>(BK, s.skv)), g, p.kv_heads);
    load_rows_async<D>(sK0 + kKV, p.v, BK, s.ks, static_cast<int>(std::min<int64_t>(BK, s.skv)), g, p.kv_heads);
  }
  cp_async_commit();
  constexpr float kLog2e = 1.4426950408889634f;
  int end_r[MT][2];  // positions inside a sequence fit in int
  float lse_r[MT][2], dsum_r[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int r = warp * 16 * MT + m * 16 + (lane >> 2) + u * 8;
      const bool ok = r < nq;
      end_r[m][u] = ok ? static_cast<int>(tc_key_end(p.mask, q0 + r, s.sq, s.skv)) : 0;
      lse_r[m][u] = ok ? p.lse[(s.qs + q0 + r) * p.heads + h] * kLog2e : 0.0f;
      dsum_r[m][u] = ok ? p.dsum[(s.qs + q0 + r) * p.heads + h] : 0.0f;
    }
  const int64_t all_end = tc_key_end(p.mask, q0, s.sq, s.skv);
  float sl2 = p.scale_log2, dpsi = 1.0f, dp_scale = 1.0f, dqs = p.scale;
  if constexpr (kFp8) {
    sl2 = (*p.q_si * *p.k_si) * p.scale_log2;
    dpsi = *p.do_si * *p.v_si;
    dp_scale = *p.dp_scale;
    dqs = (*p.dp_scale_inv * *p.k_si) * p.scale;
  }
  float dq[MT][D / 8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int i = 0; i < D / 8; ++i) dq[m][i][0] = dq[m][i][1] = dq[m][i][2] = dq[m][i][3] = 0.0f;
  for (int t = 0; t < n_tiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < n_tiles) {
      const int64_t k0n = static_cast<int64_t>(t + 1) * BK;
      const int nk = static_cast<int>(std::min<int64_t>(BK, s.skv - k0n));
      const uint32_t dK = sK0 + (buf ^ 1) * 2 * kKV;
      load_rows_async<D>(dK, p.k, BK, s.ks + k0n, nk, g, p.kv_heads);
      load_rows_async<D>(dK + kKV, p.v, BK, s.ks + k0n, nk, g, p.kv_heads);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint32_t sK = sK0 + buf * 2 * kKV, sV = sK + kKV;
    const int64_t k0 = static_cast<int64_t>(t) * BK;
    float sc[MT][BK / 8][4], dp[MT][BK / 8][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < BK / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[m][n][e] = dp[m][n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int mi = lane >> 3;
      uint32_t qa[MT][4], da[MT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const int r = warp * 16 * MT + m * 16 + (mi & 1) * 8 + (lane & 7), c = kk * 2 + (mi >> 1);
        ldmatrix_x4(sQ + swz<D>(r, c), qa[m][0], qa[m][1], qa[m][2], qa[m][3]);
        ldmatrix_x4(sdO + swz<D>(r, c), da[m][0], da[m][1], da[m][2], da[m][3]);
      }
#pragma unroll
      for (int np = 0; np < BK / 16; ++np) {
        const int r = np * 16 + (mi >> 1) * 8 + (lane & 7), c = kk * 2 + (mi & 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(sK + swz<D>(r, c), b0, b1, b2, b3);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma16816<kBf16>(sc[m][2 * np], qa[m], b0, b1);
          mma16816<kBf16>(sc[m][2 * np + 1], qa[m], b2, b3);
        }
        ldmatrix_x4(sV + swz<D>(r, c), b0, b1, b2, b3);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma16816<kBf16>(dp[m][2 * np], da[m], b0, b1);
          mma16816<kBf16>(dp[m][2 * np + 1], da[m], b2, b3);
        }
      }
    }
    const bool need_mask = k0 + BK > all_end || k0 + BK > s.skv;
    uint32_t dsa[MT][BK / 16][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < BK / 8; ++n) {
        float ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = static_cast<int>(k0) + n * 8 + (lane & 3) * 2 + (e & 1);
          const bool vis = !need_mask || j < end_r[m][e >> 1];
          const float pp = vis ? exp2f(sc[m][n][e] * sl2 - lse_r[m][e >> 1]) : 0.0f;
          if constexpr (kFp8) ds[e] = pp * (dp[m][n][e] * dpsi - dsum_r[m][e >> 1]) * dp_scale;
          else ds[e] = pp * (dp[m][n][e] - dsum_r[m][e >> 1]);
        }
        if constexpr (kFp8) {
          dsa[m][n >> 1][(n & 1) * 2 + 0] = ds8_pair(ds[0], ds[1], p.ds_e5m2);
          dsa[m][n >> 1][(n & 1) * 2 + 1] = ds8_pair(ds[2], ds[3], p.ds_e5m2);
        } else {
          dsa[m][n >> 1][(n & 1) * 2 + 0] = pack2<kBf16>(ds[0], ds[1]);
          dsa[m][n >> 1][(n & 1) * 2 + 1] = pack2<kBf16>(ds[2], ds[3]);
        }
      }
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
      for (int dp2 = 0; dp2 < D / 16; ++dp2) {
        const int mi = lane >> 3;
        const int r = kk * 16 + (mi & 1) * 8 + (lane & 7), c = dp2 * 2 + (mi >> 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(sK + swz<D>(r, c), b0, b1, b2, b3);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma16816<kBf16>(dq[m][2 * dp2], dsa[m][kk], b0, b1);
          mma16816<kBf16>(dq[m][2 * dp2 + 1], dsa[m][kk], b2, b3);
        }
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int r = warp * 16 * MT + m * 16 + (lane >> 2) + u * 8;
      if (r >= nq) continue;
      uint16_t *row = p.dq + ((s.qs + q0 + r) * p.heads + h) * D + (lane & 3) * 2;
#pragma unroll
      for (int d = 0; d < D / 8; ++d)
        *reinterpret_cast<uint32_t *>(row + d * 8) = pack2<kOutBf16>(dq[m][d][2 * u] * dqs, dq[m][d][2 * u + 1] * dqs);
    }
}

template <int D, bool kBf16, bool kFp8 = false, bool kOutBf16 = kBf16>
void launch_bwd(TcBwdParams p, int64_t batch, cudaStream_t stream) {
  {
    const size_t smem = static_cast<size_t>(2) * kDkvBK * D * 2 + 4 * kBwdBQ * D * 2 + 4 * kBwdBQ * sizeof(float);
    constexpr auto kernel = tc_dkdv_kernel<D, kBf16, kFp8, kOutBf16>;
    allow_dynamic_smem(kernel, smem);
    TcBwdParams pk = p;
    pk.tiles = static_cast<int>((p.max_kv + kDkvBK - 1) / kDkvBK);
    if (pk.tiles > 0) {
      const dim3 grid(static_cast<unsigned>(p.kv_heads), static_cast<unsigned>(pk.tiles), static_cast<unsigned>(batch));
      launch_kernel<kernel>(grid, kDkvThreads, smem, stream, pk);
    }
  }
  if (kFp8 && p.amax_only) return;
  {
    const size_t smem = static_cast<size_t>(2 * kDqBQ + 4 * kDqBK) * D * 2;
    constexpr auto kernel = tc_dq_kernel<D, kBf16, kFp8, kOutBf16>;
    allow_dynamic_smem(kernel, smem);
    p.tiles = static_cast<int>((p.max_q + kDqBQ - 1) / kDqBQ);
    if (p.tiles > 0) {
      const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.tiles), static_cast<unsigned>(batch));
      launch_kernel<kernel>(grid, kTcThreads, smem, stream, p);
    }
  }
}

bool aligned16p(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <int D, bool kBf16, int BKF>
void launch_fwd(const TcFwdParams &p, int64_t batch, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(kFwdMT * 64 + 4 * BKF) * D * 2;
  constexpr auto kernel = tc_fwd_kernel<D, kBf16, BKF>;
  allow_dynamic_smem(kernel, smem);
  const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.tiles), static_cast<unsigned>(batch));
  launch_kernel<kernel>(grid, kTcThreads, smem, stream, p);
}

}  // namespace

bool attention_tc_forward(const AttentionForwardArgs &args, cudaStream_t stream) {
  const AttentionDims &d = args.dims;
  const DType t = args.q.dtype;
  if (t == DType::E4M3) return tc_forward_fp8(args, stream);
  if (t != DType::BF16 && t != DType::F16) return false;
  if (args.k.dtype != t || args.v.dtype != t || args.o.dtype != t) return false;
  if (d.head_dim != 64 && d.head_dim != 128) return false;
  if (!aligned16p(args.q.data) || !aligned16p(args.k.data) || !aligned16p(args.v.data) || !aligned16p(args.o.data))
    return false;
  const int64_t tiles = (d.max_seq_q + kFwdBQ - 1) / kFwdBQ;
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
  if (d.head_dim == 64) bf ? launch_fwd<64, true, 64>(p, d.batch, stream) : launch_fwd<64, false, 64>(p, d.batch, stream);
  else bf ? launch_fwd<128, true, 64>(p, d.batch, stream) : launch_fwd<128, false, 64>(p, d.batch, stream);
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
  p.q_si = p.k_si = p.v_si = p.do_si = p.s_scale = p.s_scale_inv = p.dp_scale = p.dp_scale_inv = nullptr;
  p.dp_amax = nullptr;
  p.amax_only = p.ds_e5m2 = false;
  const bool bf = t == DType::BF16;
  if (d.head_dim == 64) bf ? launch_bwd<64, true>(p, d.batch, stream) : launch_bwd<64, false>(p, d.batch, stream);
  else bf ? launch_bwd<128, true>(p, d.batch, stream) : launch_bwd<128, false>(p, d.batch, stream);
  return true;
}

// FP8 backward on the tensor cores: a pre-pass writes the q, k, v and dO8 codes' values as F16
// (exact for E4M3 and E5M2) into scratch, then the F16 backward kernels run with the FP8
// semantics in registers (tc_dkdv_kernel / tc_dq_kernel with kFp8). dp_amax_only runs the dK / dV
// kernel alone, writing only dp_amax. Declared in attention_kernels.cu.
namespace {
bool tc_fp8_bwd_ok(const AttentionBackwardArgs &args) {
  const AttentionDims &d = args.dims;
  if (args.q.dtype != DType::E4M3 || args.k.dtype != DType::E4M3 || args.v.dtype != DType::E4M3) return false;
  if (args.d_o8.dtype != DType::E4M3 && args.d_o8.dtype != DType::E5M2) return false;
  if (d.head_dim != 64 && d.head_dim != 128) return false;
  if (args.q.scale_inv == nullptr || args.k.scale_inv == nullptr || args.v.scale_inv == nullptr ||
      args.d_o8.scale_inv == nullptr || args.d_o8.data == nullptr)
    return false;
  for (const void *ptr : {args.q.data, args.k.data, args.v.data, args.d_o8.data})
    if ((reinterpret_cast<uintptr_t>(ptr) & 3u) != 0) return false;
  if (!args.dp_amax_only) {
    const DType g = args.dq.dtype;
    if (g != DType::BF16 && g != DType::F16) return false;
    if (args.dk.dtype != g || args.dv.dtype != g) return false;
    if (args.s_scale == nullptr || args.s_scale_inv == nullptr || args.dp_scale == nullptr || args.dp_scale_inv == nullptr)
      return false;
    for (const void *ptr : {args.dq.data, args.dk.data, args.dv.data})
      if (!aligned16p(ptr)) return false;
  }
  if (d.batch <= 0 || d.batch >= 65536 || d.max_seq_q / 64 >= 65535 || d.max_seq_kv / 64 >= 65535) return false;
  return true;
}
size_t align256(size_t n) { return (n + 255) & ~static_cast<size_t>(255); }
size_t elems_q(const AttentionBackwardArgs &a) { return static_cast<size_t>(a.dims.tokens_q * a.dims.heads * a.dims.head_dim); }
size_t elems_kv(const AttentionBackwardArgs &a) {
  return static_cast<size_t>(std::max<int64_t>(0, a.dims.tokens_kv) * a.dims.kv_heads * a.dims.head_dim);
}
// Adds a tensor of n codes (a multiple of 4) to the launch's ranges; empty ones are left out.
void add_f16_range(F16Ranges *r, int *count, const void *src, void *dst, size_t n, bool e5m2) {
  if (n / 4 == 0) return;
  r->src[*count] = static_cast<const uint32_t *>(src);
  r->dst[*count] = static_cast<uint2 *>(dst);
  r->n4[*count] = static_cast<int64_t>(n / 4);
  r->e5m2[(*count)++] = e5m2;
}
void to_f16(const F16Ranges &r, int count, cudaStream_t stream) {
  if (count == 0) return;
  int64_t n4 = 0;  // the longest range's: the grid strides over it
  for (int i = 0; i < count; ++i) n4 = std::max(n4, r.n4[i]);
  const int64_t blocks = std::min<int64_t>((n4 + 255) / 256, 8192);
  launch_kernel<fp8_to_f16_kernel>(dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(count)), 256, 0, stream, r);
}
}  // namespace

size_t attention_tc_backward_fp8_scratch_bytes(const AttentionBackwardArgs &args) {
  if (!tc_fp8_bwd_ok(args)) return 0;
  return 2 * align256(elems_q(args) * 2) + 2 * align256(elems_kv(args) * 2);
}

bool attention_tc_backward_fp8(const AttentionBackwardArgs &args, const float *dsum, void *scratch, cudaStream_t stream) {
  if (scratch == nullptr || !tc_fp8_bwd_ok(args)) return false;
  const AttentionDims &d = args.dims;
  const size_t nq = elems_q(args), nkv = elems_kv(args);
  uint8_t *base = static_cast<uint8_t *>(scratch);
  uint16_t *q16 = reinterpret_cast<uint16_t *>(base);
  uint16_t *do16 = reinterpret_cast<uint16_t *>(base + align256(nq * 2));
  uint16_t *k16 = reinterpret_cast<uint16_t *>(base + 2 * align256(nq * 2));
  uint16_t *v16 = reinterpret_cast<uint16_t *>(base + 2 * align256(nq * 2) + align256(nkv * 2));
  const bool e5m2 = args.d_o8.dtype == DType::E5M2;
  F16Ranges ranges{};
  int count = 0;
  add_f16_range(&ranges, &count, args.q.data, q16, nq, false);
  add_f16_range(&ranges, &count, args.d_o8.data, do16, nq, e5m2);
  add_f16_range(&ranges, &count, args.k.data, k16, nkv, false);
  add_f16_range(&ranges, &count, args.v.data, v16, nkv, false);
  to_f16(ranges, count, stream);
  TcBwdParams p;
  p.q = q16, p.k = k16, p.v = v16, p.d_o = do16;
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
  p.q_si = args.q.scale_inv, p.k_si = args.k.scale_inv, p.v_si = args.v.scale_inv, p.do_si = args.d_o8.scale_inv;
  p.s_scale = args.s_scale, p.s_scale_inv = args.s_scale_inv;
  p.dp_scale = args.dp_scale, p.dp_scale_inv = args.dp_scale_inv;
  p.dp_amax = args.dp_amax;
  p.amax_only = args.dp_amax_only;
  p.ds_e5m2 = e5m2;
  if (p.amax_only && p.dp_amax == nullptr) return true;  // nothing to compute
  const bool bf = args.dp_amax_only || args.dq.dtype == DType::BF16;
  if (d.head_dim == 64) bf ? launch_bwd<64, false, true, true>(p, d.batch, stream) : launch_bwd<64, false, true, false>(p, d.batch, stream);
  else bf ? launch_bwd<128, false, true, true>(p, d.batch, stream) : launch_bwd<128, false, true, false>(p, d.batch, stream);
  return true;
}

}  // namespace te::cuda
