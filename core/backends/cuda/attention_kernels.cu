// libte's own attention kernels (attention_kernels.h), following numerics/attention.h.
//
// General path (every dtype, head_dim <= 256, mask, GQA ratio, fixed or variable lengths, FP8):
//  - forward: one CTA of 128 threads per (16-query tile, head, sequence). Two passes over the
//    visible key tiles (32 keys): the first takes the row max and sum (online), hence LSE; the
//    second computes P = exp(S - LSE) exactly as numerics/attention.h defines it (so FP8 can
//    quantize the normalised P) and accumulates P V. Warp w owns rows 4w..4w+3 of the score
//    tile, lane = key; thread t owns O's row t / 8, columns t % 8 + 8k.
//  - backward: D = rowsum(dO * O) (one warp per token and head) into scratch; one kernel per
//    (32-key tile, kv head, sequence) loops over the group's query heads and the query tiles
//    that see the keys and writes dK and dV (thread t owns key t / 4, columns t % 4 + 4k);
//    another per (16-query tile, head, sequence) loops over the key tiles and writes dQ. No
//    float atomics, so two runs are bit-identical. dS's amax comes from the dK/dV kernel only
//    (it visits every (query, key, head) once); dp_amax_only runs that kernel alone, writing
//    nothing else.
// Tensor-core paths (attention_tc.cu: BF16 / F16 forward and backward, E4M3 forward and FP8
// backward incl. dp_amax_only, head_dim 64 and 128) take what they cover; everything else comes
// here.
// Sequence bounds: offsets are clamped into [0, tokens], lengths into [0, max_seq].
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/attention_tc.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_info.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernel_launch.cuh"
#include "base/check.h"

namespace te::cuda {

// attention_tc.cu's FP8 backward (tensor cores; q, k, v, dO8 converted to F16 in `scratch` of
// attention_tc_backward_fp8_scratch_bytes, 0 when the call is not one it covers).
size_t attention_tc_backward_fp8_scratch_bytes(const AttentionBackwardArgs &args);
bool attention_tc_backward_fp8(const AttentionBackwardArgs &args, const float *dsum, void *scratch, cudaStream_t stream);

namespace {

constexpr int kBQ = 16, kBK = 32, kNT = 128;

struct GenParams {
  const void *q, *k, *v;
  DType qt, kt, vt;
  void *o;  // forward
  DType ot;
  float *lse;
  const float *lse_in;  // backward
  int64_t heads, kv_heads, D, tokens_q, tokens_kv, max_q, max_kv, batch;
  const int32_t *cu_q, *cu_kv;
  int mask;
  float scale;
  bool fp8;
  const float *q_si, *k_si, *v_si, *s_scale, *s_scale_inv;
  float *s_amax;
  // backward
  const void *d_o;  // high precision dO (for D and, without FP8, dP / dV)
  DType dot;        // d_o's dtype
  const void *do8;  // FP8 dO
  DType do8t;
  const float *do8_si, *dp_scale, *dp_scale_inv;
  float *dp_amax;
  bool amax_only;
  const float *dsum;
  void *dq, *dk, *dv;
  DType gt;  // gradients' dtype
};

struct Seq {
  int64_t qs, sq, ks, skv;
};

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

__device__ __forceinline__ Seq seq_of(const GenParams &p, int64_t b) {
  Seq s;
  if (p.cu_q != nullptr) {
    s.qs = clamp64(p.cu_q[b], 0, p.tokens_q);
    const int64_t qe = clamp64(p.cu_q[b + 1], s.qs, p.tokens_q);
    s.sq = std::min<int64_t>(qe - s.qs, p.max_q);
    s.ks = clamp64(p.cu_kv[b], 0, p.tokens_kv);
    const int64_t ke = clamp64(p.cu_kv[b + 1], s.ks, p.tokens_kv);
    s.skv = std::min<int64_t>(ke - s.ks, p.max_kv);
  } else {
    s.qs = clamp64(b * p.max_q, 0, p.tokens_q);
    s.sq = clamp64(p.tokens_q - s.qs, 0, p.max_q);
    s.ks = clamp64(b * p.max_kv, 0, p.tokens_kv);
    s.skv = clamp64(p.tokens_kv - s.ks, 0, p.max_kv);
  }
  return s;
}

// Keys [0, hi(i)) are visible to query i.
__device__ __forceinline__ int64_t key_end(int mask, int64_t i, int64_t sq, int64_t skv) {
  if (mask == 0) return skv;
  const int64_t off = mask == 1 ? 0 : skv - sq;
  return clamp64(i + 1 + off, 0, skv);
}

// dst[r * ld + d] = element (row0 + r, head, d) of src, as float (FP8: the code's value); rows
// at or beyond `valid` are zeros.
__device__ __forceinline__ void load_tile(float *dst, int ld, const void *src, DType t, int64_t row0, int rows,
                                          int valid, int64_t head, int64_t nh, int D) {
  for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
    const int r = e / D, d = e - r * D;
    float v = 0.0f;
    if (r < valid) v = dev_load_as_float(src, t, ((row0 + r) * nh + head) * D + d);
    dst[r * ld + d] = v;
  }
}

__device__ __forceinline__ float dot_smem(const float *a, const float *b, int D) {
  float acc = 0.0f;
  for (int d = 0; d < D; ++d) acc = fmaf(a[d], b[d], acc);
  return acc;
}

__device__ __forceinline__ float warp_max_f(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum_f(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// S[i, j] from the raw dot (numerics/attention.h: FP8 dots times q.scale_inv * k.scale_inv).
__device__ __forceinline__ float score_of(const GenParams &p, float dot, float qsi, float ksi) {
  if (p.fp8) dot = dot * (qsi * ksi);  // the CPU's order: dot * (q.si * k.si) * scale
  return dot * p.scale;
}

__device__ __forceinline__ float e4m3_round(float x) { return dev_e4m3_to_float(encode1<kFmtE4M3>(x)); }
__device__ __forceinline__ float fp8_round(float x, DType t) {
  return t == DType::E4M3 ? dev_e4m3_to_float(encode1<kFmtE4M3>(x)) : dev_e5m2_to_float(encode1<kFmtE5M2>(x));
}

// ---- forward --------------------------------------------------------------------------------
template <int KD>
__global__ void __launch_bounds__(kNT) fwd_general(GenParams p) {
  extern __shared__ float smem[];
  __shared__ uint32_t red[32];
  const int D = static_cast<int>(p.D), ld = D + 1;
  float *Qs = smem, *Ks = Qs + kBQ * ld, *Vs = Ks + kBK * ld, *Ps = Vs + kBK * ld, *lse_s = Ps + kBQ * kBK;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const Seq s = seq_of(p, b);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBQ;
  if (q0 >= s.sq) return;
  const int nq = static_cast<int>(std::min<int64_t>(kBQ, s.sq - q0));
  const int64_t g = h / (p.heads / p.kv_heads);
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const float qsi = p.fp8 ? *p.q_si : 1.0f, ksi = p.fp8 ? *p.k_si : 1.0f;
  load_tile(Qs, ld, p.q, p.qt, s.qs + q0, kBQ, nq, h, p.heads, D);
  const int64_t kv_end = key_end(p.mask, q0 + nq - 1, s.sq, s.skv);

  float m[4], l[4];
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) m[rr] = -INFINITY, l[rr] = 0.0f;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kBK) {
    const int nk = static_cast<int>(std::min<int64_t>(kBK, s.skv - k0));
    __syncthreads();
    load_tile(Ks, ld, p.k, p.kt, s.ks + k0, kBK, nk, g, p.kv_heads, D);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int r = w * 4 + rr;
      const int64_t i = q0 + r, j = k0 + lane;
      float sv = -INFINITY;
      if (r < nq && j < key_end(p.mask, i, s.sq, s.skv)) sv = score_of(p, dot_smem(Qs + r * ld, Ks + lane * ld, D), qsi, ksi);
      const float mnew = fmaxf(m[rr], warp_max_f(sv));
      if (mnew == -INFINITY) continue;
      const float e = sv == -INFINITY ? 0.0f : expf(sv - mnew);
      l[rr] = l[rr] * expf(m[rr] - mnew) + warp_sum_f(e);
      m[rr] = mnew;
    }
  }
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) {
    const int r = w * 4 + rr;
    const float lse = l[rr] > 0.0f ? m[rr] + logf(l[rr]) : -INFINITY;
    if (lane == 0) {
      lse_s[r] = lse;
      if (r < nq) p.lse[(s.qs + q0 + r) * p.heads + h] = lse;
    }
  }
  float o[KD];
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) o[kk] = 0.0f;
  const float s_scale = p.fp8 ? *p.s_scale : 1.0f;
  uint32_t pmax = 0;
  const int orow = tid >> 3, ocol = tid & 7;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kBK) {
    const int nk = static_cast<int>(std::min<int64_t>(kBK, s.skv - k0));
    __syncthreads();
    load_tile(Ks, ld, p.k, p.kt, s.ks + k0, kBK, nk, g, p.kv_heads, D);
    load_tile(Vs, ld, p.v, p.vt, s.ks + k0, kBK, nk, g, p.kv_heads, D);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int r = w * 4 + rr;
      const int64_t i = q0 + r, j = k0 + lane;
      float pv = 0.0f;
      if (r < nq && j < key_end(p.mask, i, s.sq, s.skv)) {
        const float sv = score_of(p, dot_smem(Qs + r * ld, Ks + lane * ld, D), qsi, ksi);
        pv = expf(sv - lse_s[r]);
        if (p.fp8) {
          pmax = std::max(pmax, abs_bits(pv));
          pv = e4m3_round(pv * s_scale);
        }
      }
      Ps[r * kBK + lane] = pv;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      const int c = ocol + 8 * kk;
      if (c < D) {
        float acc = o[kk];
        for (int j = 0; j < kBK; ++j) acc = fmaf(Ps[orow * kBK + j], Vs[j * ld + c], acc);
        o[kk] = acc;
      }
    }
  }
  if (p.fp8 && p.s_amax != nullptr) {
    const uint32_t mx = block_max_u32(pmax, red);
    if (tid == 0) atomic_amax(p.s_amax, canonical_amax_bits(mx));
  }
  if (orow < nq) {
    const bool none = lse_s[orow] == -INFINITY;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      const int c = ocol + 8 * kk;
      if (c < D) {
        float val = none ? 0.0f : (p.fp8 ? o[kk] * (*p.s_scale_inv * *p.v_si) : o[kk]);
        dev_store_from_float(p.o, p.ot, ((s.qs + q0 + orow) * p.heads + h) * D + c, val);
      }
    }
  }
}

// ---- backward -------------------------------------------------------------------------------
__global__ void dsum_kernel(GenParams p) {
  const int64_t rows = p.tokens_q * p.heads;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
    float acc = 0.0f;
    for (int64_t d = lane; d < p.D; d += 32)
      acc = fmaf(dev_load_as_float(p.d_o, p.dot, r * p.D + d), dev_load_as_float(p.o, p.ot, r * p.D + d), acc);
    acc = warp_sum_f(acc);
    if (lane == 0) const_cast<float *>(p.dsum)[r] = acc;
  }
}

// The same with 16-byte loads (o and d_o of one dtype, head_dim % 8 == 0, aligned).
template <DType T>
__global__ void dsum_vec_kernel(GenParams p) {
  constexpr int V = InType<T>::kPerVec;
  const int64_t rows = p.tokens_q * p.heads;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  const int nvec = static_cast<int>(p.D / V);
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
    const uint4 *a = reinterpret_cast<const uint4 *>(static_cast<const char *>(p.d_o) + r * p.D * sizeof(typename InType<T>::Storage));
    const uint4 *b = reinterpret_cast<const uint4 *>(static_cast<const char *>(p.o) + r * p.D * sizeof(typename InType<T>::Storage));
    float acc = 0.0f;
    for (int c = lane; c < nvec; c += 32) {
      float x[V], y[V];
      unpack16<T>(a[c], x);
      unpack16<T>(b[c], y);
#pragma unroll
      for (int e = 0; e < V; ++e) acc = fmaf(x[e], y[e], acc);
    }
    acc = warp_sum_f(acc);
    if (lane == 0) const_cast<float *>(p.dsum)[r] = acc;
  }
}

// P, dS of (query row r of the tile, key lane of the tile); returns P as the dV GEMM uses it
// (FP8: its E4M3 value of P * s_scale) and dS as the dQ / dK GEMMs use it (FP8: its code's value).
struct PdS {
  float p, ds, ds_abs;
};
__device__ __forceinline__ PdS p_ds(const GenParams &p, bool vis, const float *qrow, const float *krow,
                                    const float *dorow, const float *vrow, int D, float lse, float dsum, float qsi,
                                    float ksi, float dpsi, float s_scale, float dp_scale) {
  PdS r{0.0f, 0.0f, 0.0f};
  if (!vis) return r;
  const float sv = score_of(p, dot_smem(qrow, krow, D), qsi, ksi);
  const float pv = expf(sv - lse);
  float dp = dot_smem(dorow, vrow, D);
  if (p.fp8) dp = dp * dpsi;
  const float ds = pv * (dp - dsum);
  r.ds_abs = fabsf(ds);
  if (p.fp8) {
    r.p = e4m3_round(pv * s_scale);
    r.ds = fp8_round(ds * dp_scale, p.do8t);
  } else {
    r.p = pv;
    r.ds = ds;
  }
  return r;
}

template <int KD4>
__global__ void __launch_bounds__(kNT) dkdv_general(GenParams p) {
  extern __shared__ float smem[];
  __shared__ uint32_t red[32];
  const int D = static_cast<int>(p.D), ld = D + 1;
  float *Ks = smem, *Vs = Ks + kBK * ld, *Qs = Vs + kBK * ld, *dOs = Qs + kBQ * ld, *Ps = dOs + kBQ * ld,
        *dSs = Ps + kBQ * kBK, *lse_s = dSs + kBQ * kBK, *dsum_s = lse_s + kBQ;
  const int64_t b = blockIdx.z, g = blockIdx.y;
  const Seq s = seq_of(p, b);
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kBK;
  if (k0 >= s.skv) return;
  const int nk = static_cast<int>(std::min<int64_t>(kBK, s.skv - k0));
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const int64_t group = p.heads / p.kv_heads;
  const float qsi = p.fp8 ? *p.q_si : 1.0f, ksi = p.fp8 ? *p.k_si : 1.0f;
  const float dpsi = p.fp8 ? *p.do8_si * *p.v_si : 1.0f;
  const float s_scale = p.fp8 && !p.amax_only ? *p.s_scale : 1.0f, dp_scale = p.fp8 && !p.amax_only ? *p.dp_scale : 1.0f;
  const void *dsrc = p.fp8 ? p.do8 : p.d_o;
  const DType dsrct = p.fp8 ? p.do8t : p.dot;
  load_tile(Ks, ld, p.k, p.kt, s.ks + k0, kBK, nk, g, p.kv_heads, D);
  load_tile(Vs, ld, p.v, p.vt, s.ks + k0, kBK, nk, g, p.kv_heads, D);
  // The first query that sees key k0.
  const int64_t i_min = p.mask == 0 ? 0 : std::max<int64_t>(0, k0 - (p.mask == 1 ? 0 : s.skv - s.sq));
  float dk[KD4], dv[KD4];
#pragma unroll
  for (int kk = 0; kk < KD4; ++kk) dk[kk] = 0.0f, dv[kk] = 0.0f;
  uint32_t dsmax = 0;
  const int krow = tid >> 2, kcol = tid & 3;
  for (int64_t hh = 0; hh < group; ++hh) {
    const int64_t h = g * group + hh;
    for (int64_t q0 = (i_min / kBQ) * kBQ; q0 < s.sq; q0 += kBQ) {
      const int nq = static_cast<int>(std::min<int64_t>(kBQ, s.sq - q0));
      __syncthreads();
      load_tile(Qs, ld, p.q, p.qt, s.qs + q0, kBQ, nq, h, p.heads, D);
      load_tile(dOs, ld, dsrc, dsrct, s.qs + q0, kBQ, nq, h, p.heads, D);
      if (tid < kBQ) {
        lse_s[tid] = tid < nq ? p.lse_in[(s.qs + q0 + tid) * p.heads + h] : 0.0f;
        dsum_s[tid] = tid < nq ? p.dsum[(s.qs + q0 + tid) * p.heads + h] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int rr = 0; rr < 4; ++rr) {
        const int r = w * 4 + rr;
        const int64_t i = q0 + r, j = k0 + lane;
        const bool vis = r < nq && j < key_end(p.mask, i, s.sq, s.skv);
        const PdS x = p_ds(p, vis, Qs + r * ld, Ks + lane * ld, dOs + r * ld, Vs + lane * ld, D, lse_s[r], dsum_s[r], qsi,
                           ksi, dpsi, s_scale, dp_scale);
        dsmax = std::max(dsmax, abs_bits(x.ds_abs));
        Ps[r * kBK + lane] = x.p;
        dSs[r * kBK + lane] = x.ds;
      }
      __syncthreads();
      if (!p.amax_only) {
#pragma unroll
        for (int kk = 0; kk < KD4; ++kk) {
          const int c = kcol + 4 * kk;
          if (c < D) {
            float a = dv[kk], bq = dk[kk];
            for (int r = 0; r < kBQ; ++r) {
              a = fmaf(Ps[r * kBK + krow], dOs[r * ld + c], a);
              bq = fmaf(dSs[r * kBK + krow], Qs[r * ld + c], bq);
            }
            dv[kk] = a, dk[kk] = bq;
          }
        }
      }
    }
  }
  if (p.fp8 && p.dp_amax != nullptr) {
    const uint32_t mx = block_max_u32(dsmax, red);
    if (tid == 0) atomic_amax(p.dp_amax, canonical_amax_bits(mx));
  }
  if (p.amax_only || krow >= nk) return;
  const float dvpost = p.fp8 ? *p.s_scale_inv * *p.do8_si : 1.0f;
  const float dkpost = p.fp8 ? *p.dp_scale_inv * qsi : 1.0f;
#pragma unroll
  for (int kk = 0; kk < KD4; ++kk) {
    const int c = kcol + 4 * kk;
    if (c < D) {
      const int64_t idx = ((s.ks + k0 + krow) * p.kv_heads + g) * D + c;
      dev_store_from_float(p.dv, p.gt, idx, p.fp8 ? dv[kk] * dvpost : dv[kk]);
      dev_store_from_float(p.dk, p.gt, idx, dk[kk] * (dkpost * p.scale));
    }
  }
}

template <int KD>
__global__ void __launch_bounds__(kNT) dq_general(GenParams p) {
  extern __shared__ float smem[];
  const int D = static_cast<int>(p.D), ld = D + 1;
  float *Qs = smem, *dOs = Qs + kBQ * ld, *Ks = dOs + kBQ * ld, *Vs = Ks + kBK * ld, *dSs = Vs + kBK * ld,
        *lse_s = dSs + kBQ * kBK, *dsum_s = lse_s + kBQ;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const Seq s = seq_of(p, b);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBQ;
  if (q0 >= s.sq) return;
  const int nq = static_cast<int>(std::min<int64_t>(kBQ, s.sq - q0));
  const int64_t g = h / (p.heads / p.kv_heads);
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const float qsi = p.fp8 ? *p.q_si : 1.0f, ksi = p.fp8 ? *p.k_si : 1.0f;
  const float dpsi = p.fp8 ? *p.do8_si * *p.v_si : 1.0f;
  const float s_scale = p.fp8 ? *p.s_scale : 1.0f, dp_scale = p.fp8 ? *p.dp_scale : 1.0f;
  load_tile(Qs, ld, p.q, p.qt, s.qs + q0, kBQ, nq, h, p.heads, D);
  load_tile(dOs, ld, p.fp8 ? p.do8 : p.d_o, p.fp8 ? p.do8t : p.dot, s.qs + q0, kBQ, nq, h, p.heads, D);
  if (tid < kBQ) {
    lse_s[tid] = tid < nq ? p.lse_in[(s.qs + q0 + tid) * p.heads + h] : 0.0f;
    dsum_s[tid] = tid < nq ? p.dsum[(s.qs + q0 + tid) * p.heads + h] : 0.0f;
  }
  const int64_t kv_end = key_end(p.mask, q0 + nq - 1, s.sq, s.skv);
  float acc[KD];
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) acc[kk] = 0.0f;
  const int orow = tid >> 3, ocol = tid & 7;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kBK) {
    const int nk = static_cast<int>(std::min<int64_t>(kBK, s.skv - k0));
    __syncthreads();
    load_tile(Ks, ld, p.k, p.kt, s.ks + k0, kBK, nk, g, p.kv_heads, D);
    load_tile(Vs, ld, p.v, p.vt, s.ks + k0, kBK, nk, g, p.kv_heads, D);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int r = w * 4 + rr;
      const int64_t i = q0 + r, j = k0 + lane;
      const bool vis = r < nq && j < key_end(p.mask, i, s.sq, s.skv);
      const PdS x = p_ds(p, vis, Qs + r * ld, Ks + lane * ld, dOs + r * ld, Vs + lane * ld, D, lse_s[r], dsum_s[r], qsi,
                         ksi, dpsi, s_scale, dp_scale);
      dSs[r * kBK + lane] = x.ds;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      const int c = ocol + 8 * kk;
      if (c < D) {
        float a = acc[kk];
        for (int j = 0; j < kBK; ++j) a = fmaf(dSs[orow * kBK + j], Ks[j * ld + c], a);
        acc[kk] = a;
      }
    }
  }
  if (orow >= nq) return;
  const float post = p.fp8 ? *p.dp_scale_inv * ksi : 1.0f;
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) {
    const int c = ocol + 8 * kk;
    if (c < D)
      dev_store_from_float(p.dq, p.gt, ((s.qs + q0 + orow) * p.heads + h) * D + c,
                           acc[kk] * (post * p.scale));
  }
}

GenParams common_params(const AttentionDims &d, const TensorView &q, const TensorView &k, const TensorView &v) {
  GenParams p{};
  p.q = q.data, p.k = k.data, p.v = v.data;
  p.qt = q.dtype, p.kt = k.dtype, p.vt = v.dtype;
  p.heads = d.heads, p.kv_heads = d.kv_heads, p.D = d.head_dim;
  p.tokens_q = d.tokens_q, p.tokens_kv = d.tokens_kv, p.max_q = d.max_seq_q, p.max_kv = d.max_seq_kv;
  p.batch = d.batch;
  p.cu_q = d.cu_seqlens_q, p.cu_kv = d.cu_seqlens_kv;
  p.mask = static_cast<int>(d.mask);
  p.scale = d.softmax_scale;
  p.fp8 = is_fp8(q.dtype);
  if (p.fp8) p.q_si = q.scale_inv, p.k_si = k.scale_inv, p.v_si = v.scale_inv;
  return p;
}

template <auto Kernel>
void launch(dim3 grid, size_t smem, cudaStream_t stream, const GenParams &p) {
  allow_dynamic_smem(Kernel, smem);
  launch_kernel<Kernel>(grid, kNT, smem, stream, p);
}

bool grid_ok(int64_t x, int64_t y, int64_t z) { return x > 0 && y > 0 && z > 0 && x < (1LL << 31) && y < 65536 && z < 65536; }

}  // namespace

size_t attention_forward_scratch_bytes(const AttentionForwardArgs &) { return 0; }

// D's floats, then (FP8 on the tensor cores) the F16 copies of q, k, v, dO8.
static size_t dsum_scratch_bytes(const AttentionBackwardArgs &args) {
  const int64_t n = args.dims.tokens_q * args.dims.heads;
  return (static_cast<size_t>(n > 0 ? n : 1) * sizeof(float) + 255) & ~static_cast<size_t>(255);
}

size_t attention_backward_scratch_bytes(const AttentionBackwardArgs &args) {
  const bool fp8 = is_fp8(args.q.dtype) && args.dims.tokens_q > 0 && args.dims.heads > 0;
  return dsum_scratch_bytes(args) + (fp8 ? attention_tc_backward_fp8_scratch_bytes(args) : 0);
}

void attention_forward_kernels(Backend &be, const AttentionForwardArgs &args, cudaStream_t stream) {
  (void)be;
  const AttentionDims &d = args.dims;
  if (d.tokens_q <= 0 || d.heads <= 0) return;
  if (d.varlen() && args.o.data != nullptr)
    TE_CUDA_CHECK(cudaMemsetAsync(args.o.data, 0, args.o.bytes(), stream));  // rows outside every sequence
  if (attention_tc_forward(args, stream)) return;
  GenParams p = common_params(d, args.q, args.k, args.v);
  p.o = args.o.data, p.ot = args.o.dtype, p.lse = args.lse;
  if (p.fp8) p.s_scale = args.s_scale, p.s_scale_inv = args.s_scale_inv, p.s_amax = args.s_amax;
  const int64_t gx = (d.max_seq_q + kBQ - 1) / kBQ;
  if (!grid_ok(gx, d.heads, d.batch)) {
    if (gx <= 0 || d.batch <= 0) return;
    fail(Status::Unsupported, "attention on CUDA: grid too large");
  }
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(d.heads), static_cast<unsigned>(d.batch));
  const int ld = static_cast<int>(d.head_dim) + 1;
  const size_t smem = sizeof(float) * ((kBQ + 2 * kBK) * ld + kBQ * kBK + kBQ);
  if (d.head_dim <= 64) launch<fwd_general<8>>(grid, smem, stream, p);
  else if (d.head_dim <= 128) launch<fwd_general<16>>(grid, smem, stream, p);
  else launch<fwd_general<32>>(grid, smem, stream, p);
}

void attention_backward_kernels(Backend &be, const AttentionBackwardArgs &args, cudaStream_t stream) {
  const AttentionDims &d = args.dims;
  if (d.tokens_q <= 0 || d.heads <= 0) {
    // No query: dK and dV are zeros.
    if (!args.dp_amax_only) {
      if (args.dk.data) TE_CUDA_CHECK(cudaMemsetAsync(args.dk.data, 0, args.dk.bytes(), stream));
      if (args.dv.data) TE_CUDA_CHECK(cudaMemsetAsync(args.dv.data, 0, args.dv.bytes(), stream));
    }
    return;
  }
  if (!args.dp_amax_only && (d.varlen() || d.tokens_kv > 0)) {
    // Rows outside every sequence (varlen) and keys of empty tiles get zeros.
    if (d.varlen()) {
      TE_CUDA_CHECK(cudaMemsetAsync(args.dq.data, 0, args.dq.bytes(), stream));
      TE_CUDA_CHECK(cudaMemsetAsync(args.dk.data, 0, args.dk.bytes(), stream));
      TE_CUDA_CHECK(cudaMemsetAsync(args.dv.data, 0, args.dv.bytes(), stream));
    }
  }
  Buffer scratch(&be, attention_backward_scratch_bytes(args));
  GenParams p = common_params(d, args.q, args.k, args.v);
  p.o = args.o.data, p.ot = args.o.dtype;
  p.lse_in = args.lse;
  p.d_o = args.d_o.data, p.dot = args.d_o.dtype;
  if (p.fp8) {
    p.do8 = args.d_o8.data, p.do8t = args.d_o8.dtype, p.do8_si = args.d_o8.scale_inv;
    p.s_scale = args.s_scale, p.s_scale_inv = args.s_scale_inv;
    p.dp_scale = args.dp_scale, p.dp_scale_inv = args.dp_scale_inv, p.dp_amax = args.dp_amax;
  }
  p.amax_only = args.dp_amax_only;
  p.dsum = static_cast<const float *>(scratch.get());
  p.dq = args.dq.data, p.dk = args.dk.data, p.dv = args.dv.data;
  p.gt = args.dp_amax_only ? args.o.dtype : args.dq.dtype;
  {
    const int64_t rows = d.tokens_q * d.heads;
    const int64_t blocks = std::min<int64_t>((rows + 7) / 8, 65535LL * 8);
    const bool vec = args.o.dtype == args.d_o.dtype && aligned16(args.o.data) && aligned16(args.d_o.data) &&
                     d.head_dim % (args.o.dtype == DType::F32 ? 4 : 8) == 0;
    if (vec && args.o.dtype == DType::BF16) launch_kernel<dsum_vec_kernel<DType::BF16>>(static_cast<unsigned>(blocks),
        256, 0, stream, p);
    else if (vec && args.o.dtype == DType::F16) launch_kernel<dsum_vec_kernel<DType::F16>>(static_cast<unsigned>(blocks),
        256, 0, stream, p);
    else if (vec && args.o.dtype == DType::F32) launch_kernel<dsum_vec_kernel<DType::F32>>(static_cast<unsigned>(blocks),
        256, 0, stream, p);
    else launch_kernel<dsum_kernel>(static_cast<unsigned>(blocks), 256, 0, stream, p);
  }
  if (p.fp8) {
    if (attention_tc_backward_fp8(args, p.dsum, static_cast<char *>(scratch.get()) + dsum_scratch_bytes(args), stream))
      return;
  } else if (!args.dp_amax_only && attention_tc_backward(args, p.dsum, stream)) {
    return;
  }
  const int ld = static_cast<int>(d.head_dim) + 1;
  const int64_t gk = (d.max_seq_kv + kBK - 1) / kBK;
  if (grid_ok(gk, d.kv_heads, d.batch)) {
    const dim3 grid(static_cast<unsigned>(gk), static_cast<unsigned>(d.kv_heads), static_cast<unsigned>(d.batch));
    const size_t smem = sizeof(float) * ((2 * kBK + 2 * kBQ) * ld + 2 * kBQ * kBK + 2 * kBQ);
    if (d.head_dim <= 64) launch<dkdv_general<16>>(grid, smem, stream, p);
    else if (d.head_dim <= 128) launch<dkdv_general<32>>(grid, smem, stream, p);
    else launch<dkdv_general<64>>(grid, smem, stream, p);
  } else if (gk > 0 && d.batch > 0) {
    fail(Status::Unsupported, "attention on CUDA: grid too large");
  }
  if (args.dp_amax_only) return;
  const int64_t gq = (d.max_seq_q + kBQ - 1) / kBQ;
  if (grid_ok(gq, d.heads, d.batch)) {
    const dim3 grid(static_cast<unsigned>(gq), static_cast<unsigned>(d.heads), static_cast<unsigned>(d.batch));
    const size_t smem = sizeof(float) * ((2 * kBK + 2 * kBQ) * ld + kBQ * kBK + 2 * kBQ);
    if (d.head_dim <= 64) launch<dq_general<8>>(grid, smem, stream, p);
    else if (d.head_dim <= 128) launch<dq_general<16>>(grid, smem, stream, p);
    else launch<dq_general<32>>(grid, smem, stream, p);
  }
}

}  // namespace te::cuda
