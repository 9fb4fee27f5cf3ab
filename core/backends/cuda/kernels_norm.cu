// LayerNorm / RMSNorm forward (fused with the FP8 cast, its transpose and the amax) and backward.
//
// Bit-identical to the CPU (numerics/norm.h): a row's sums are those of 256 lanes, lane l adding
// elements l, l + 256, ... in order from +0, then the warp tree (offsets 16..1) and the tree of the
// 8 warp totals (4, 2, 1); every operation is a separately rounded _rn intrinsic (nvcc would
// otherwise contract products and sums into FMAs), division and square root correctly rounded.
//
// Vectorised kernels (16-byte accesses; hidden % 8 == 0, aligned tensors): one warp holds the 256
// lanes of a row, thread u lanes 8u..8u+7, i.e. the 8 consecutive elements 256k + 8u.. of every
// 256-element chunk k, so a lane's sequential sum stays inside one thread and the two trees are
// shuffles (warp_lanes_total). A row too long for one warp's registers is split over a team of
// G = 2, 4 or 8 warps holding consecutive chunk ranges: each lane's sum runs through the team's
// warps in chunk order (warp g continues from warp g - 1's lane sums, handed over in shared
// memory), so the order is still the one above. The row stays in registers from the load to the
// last output: x is read from memory once.
//
// Forward: a CTA normalises a tile of R rows (R = 16 when it fits); each element's fp32 value v
// gives y, amax and the code fp8(v * scale), written to `out` straight from registers and to a
// [R][hidden] code tile in shared memory; when the tile is done, the CTA writes out_t from it: 4
// columns x 4 rows of codes at a time are transposed with byte permutes, and each out_t row gets
// the tile's R codes as one R-byte store.
//
// Backward: a CTA takes a band of rows; per row the team computes the two ordered sums (one pass
// through the chain), then dx. dgamma/dbeta: each column of a team belongs to one thread, which
// accumulates it over the team's rows in shared memory; the CTA adds its teams in order and
// writes one fp32 partial row to scratch, and a second kernel adds the bands' partials in a fixed
// order. The band count depends on the row count only, so results are the same on every run and
// device.
//
// Anything else (hidden % 8 != 0, unaligned views, rows longer than 8 warps' registers or than the
// code tile, mixed FP8 formats or dtypes) takes the generic kernels: the CTA's 256 threads are the
// 256 lanes themselves (thread t adds elements t, t + 256, ...), which is the order by definition;
// x is read again from L2 for each pass.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernels.h"

namespace te::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xFFFFFFFFu;
static_assert(kThreads == kNormLanes, "a CTA is the 256 lanes of numerics/norm.h");

__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ int64_t ceil_div_dev(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Branch-free forms of the CPU's conditionals, exact for every input because x + (-0) == x for
// every x (-0 included) and x - (+0) == x: zero-centred gamma is gamma + (zc ? 1 : -0), a missing
// beta is a beta of -0, and RMSNorm's x_hat = x * rsigma is (x - 0) * rsigma.
constexpr float kNegZero = -0.0f;

// rsigma = 1 / sqrt(second / n + eps), as norm_row_stats.
__device__ __forceinline__ float rsigma_of(float second, float count, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(add(__fdiv_rn(second, count), eps)));
}

// ---- the ordered sum's trees -----------------------------------------------------------------

// Vectorised layout: a[i] is lane 8u + i's sum in thread u of the warp. Returns the row total
// (in every thread): virtual warp w (lanes 32w..32w+31) lies in threads 4w..4w+3, so its offsets
// 16 and 8 are shuffles by 2 and 1 threads, 4, 2, 1 are inside a thread; its total ends in
// thread 4w, and the 8 totals' offsets 4, 2, 1 are shuffles by 16, 8, 4 threads. Threads whose
// values the tree no longer reads compute garbage, which nothing reads.
__device__ __forceinline__ float warp_lanes_total(float (&a)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = add(a[i], __shfl_down_sync(kFull, a[i], 2));
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = add(a[i], __shfl_down_sync(kFull, a[i], 1));
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = add(a[i], a[i + 4]);
  a[0] = add(a[0], a[2]);
  a[1] = add(a[1], a[3]);
  float t = add(a[0], a[1]);
  t = add(t, __shfl_down_sync(kFull, t, 16));
  t = add(t, __shfl_down_sync(kFull, t, 8));
  t = add(t, __shfl_down_sync(kFull, t, 4));
  return __shfl_sync(kFull, t, 0);
}

// Natural layout: v is lane threadIdx.x's sum. Returns the total in every thread. `red` holds
// kWarps + 1 floats of shared memory; consecutive calls may share it.
__device__ __forceinline__ float block_lanes_total(float v, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v = add(v, __shfl_down_sync(kFull, v, off));
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < kWarps ? red[lane] : 0.0f;
#pragma unroll
    for (int off = kWarps / 2; off >= 1; off >>= 1) w = add(w, __shfl_down_sync(kFull, w, off));
    if (lane == 0) red[kWarps] = w;
  }
  __syncthreads();
  return red[kWarps];
}

// ---- 8 consecutive elements as one or two 16-byte vectors ------------------------------------

template <DType T>
struct Vec8 {
  static constexpr int kVecs = T == DType::F32 ? 2 : 1;
  uint4 v[kVecs];
};

template <DType T>
__device__ __forceinline__ void load8(const void *base, int64_t elem, Vec8<T> &out) {
  using S = typename InType<T>::Storage;
  const uint4 *p = reinterpret_cast<const uint4 *>(static_cast<const S *>(base) + elem);
#pragma unroll
  for (int i = 0; i < Vec8<T>::kVecs; ++i) out.v[i] = __ldg(p + i);
}

// BF16 is unpacked through opaque instructions: the row stays packed in registers between its
// passes (the compiler would otherwise keep the unpacked floats, twice the registers, and spill).
template <DType T>
__device__ __forceinline__ void unpack8(const Vec8<T> &in, float (&f)[8]) {
  if constexpr (T == DType::BF16) {
    const uint32_t w[4] = {in.v[0].x, in.v[0].y, in.v[0].z, in.v[0].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t lo, hi;
      asm volatile("shl.b32 %0, %1, 16;" : "=r"(lo) : "r"(w[j]));
      asm volatile("and.b32 %0, %1, 0xFFFF0000;" : "=r"(hi) : "r"(w[j]));
      f[2 * j] = __uint_as_float(lo);
      f[2 * j + 1] = __uint_as_float(hi);
    }
  } else {
#pragma unroll
    for (int i = 0; i < Vec8<T>::kVecs; ++i) unpack16<T>(in.v[i], f + i * InType<T>::kPerVec);
  }
}

// Asks L2 for the bytes [begin, end) of global memory, one 128-byte line per thread of the warp at
// a time (a hint: nothing waits for it).
__device__ __forceinline__ void prefetch_l2(const char *begin, const char *end) {
  for (const char *p = begin + 128 * (threadIdx.x & 31); p < end; p += 128 * 32)
    asm volatile("prefetch.global.L2 [%0];" : : "l"(p));
}

template <DType T>
__device__ __forceinline__ void load8_floats(const void *base, int64_t elem, float (&f)[8]) {
  Vec8<T> v;
  load8<T>(base, elem, v);
  unpack8<T>(v, f);
}

// Stores 8 floats as elements elem..elem+7 of an F32 / F16 / BF16 tensor (16-byte aligned).
__device__ __forceinline__ void store8(void *base, DType t, int64_t elem, const float (&v)[8]) {
  if (t == DType::F32) {
    float4 *p = reinterpret_cast<float4 *>(static_cast<float *>(base) + elem);
    p[0] = make_float4(v[0], v[1], v[2], v[3]);
    p[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t lo = t == DType::F16 ? float_to_f16_bits(v[2 * j]) : float_to_bf16_bits(v[2 * j]);
    const uint32_t hi = t == DType::F16 ? float_to_f16_bits(v[2 * j + 1]) : float_to_bf16_bits(v[2 * j + 1]);
    w[j] = lo | (hi << 16);
  }
  *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(base) + elem) = make_uint4(w[0], w[1], w[2], w[3]);
}

// ---- forward -------------------------------------------------------------------------------

struct FwdParams {
  const void *x, *gamma, *beta;  // beta nullable
  DType gamma_dtype, beta_dtype;
  void *y;  // nullable
  DType y_dtype;
  float *mu, *rsigma;  // nullable
  const float *scale;  // nullable when there is no FP8 output
  float *amax;         // nullable
  uint8_t *out, *out_t;
  float *out_scale_inv, *out_t_scale_inv;
  int out_fmt, out_t_fmt;  // generic kernel (kFmtNone: not written)
  int64_t rows, n;
  float eps;
  bool layer, zero_centered;
  // Vectorised kernel: warps per row, chunks per warp, rows per CTA, chunks per row, bytes of
  // the code tile, whether out_t takes R-byte stores.
  int G, kw, R;
  int64_t chunks;
  int tile_bytes;
  bool out_t_vec;
};

// Writes the CTA's [R][n] code tile to out_t [n, rows] at rows r0.. (call after a barrier).
__device__ __forceinline__ void write_tile_transposed(const uint8_t *tile, const FwdParams &p, int64_t r0) {
  const int64_t n = p.n;
  const int nr = static_cast<int>(min(static_cast<int64_t>(p.R), p.rows - r0));
  const bool vec = p.out_t_vec && nr == p.R;
  const int quads = static_cast<int>(n / 4);
  for (int q = threadIdx.x; q < quads; q += kThreads) {
    uint32_t col[4][4] = {};  // col[j][rq]: column 4q + j, rows 4rq..4rq+3
#pragma unroll
    for (int rq = 0; rq < 4; ++rq) {
      if (4 * rq >= p.R) break;
      uint32_t w[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) w[r] = *reinterpret_cast<const uint32_t *>(tile + (4 * rq + r) * n + 4 * q);
      const uint32_t t0 = __byte_perm(w[0], w[1], 0x5140), t1 = __byte_perm(w[0], w[1], 0x7362);
      const uint32_t t2 = __byte_perm(w[2], w[3], 0x5140), t3 = __byte_perm(w[2], w[3], 0x7362);
      col[0][rq] = __byte_perm(t0, t2, 0x5410);
      col[1][rq] = __byte_perm(t0, t2, 0x7632);
      col[2][rq] = __byte_perm(t1, t3, 0x5410);
      col[3][rq] = __byte_perm(t1, t3, 0x7632);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint8_t *dst = p.out_t + (4 * static_cast<int64_t>(q) + j) * p.rows + r0;
      if (vec && p.R == 16) {
        *reinterpret_cast<uint4 *>(dst) = make_uint4(col[j][0], col[j][1], col[j][2], col[j][3]);
      } else if (vec && p.R == 8) {
        *reinterpret_cast<uint2 *>(dst) = make_uint2(col[j][0], col[j][1]);
      } else if (vec) {
        *reinterpret_cast<uint32_t *>(dst) = col[j][0];
      } else {
#pragma unroll
        for (int b = 0; b < 16; ++b)
          if (b < nr) dst[b] = static_cast<uint8_t>(col[j][b >> 2] >> (8 * (b & 3)));
      }
    }
  }
}

__device__ __forceinline__ void finish_forward(const FwdParams &p, uint32_t m, float s, uint32_t *scratch) {
  if (p.amax != nullptr) {
    m = block_max_u32(m, scratch);
    if (threadIdx.x == 0) atomic_amax(p.amax, canonical_amax_bits(m));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const float scale_inv = reciprocal_rn(s);
    if (p.out_scale_inv != nullptr) *p.out_scale_inv = scale_inv;
    if (p.out_t_scale_inv != nullptr) *p.out_t_scale_inv = scale_inv;
  }
}

// The vectorised forward. Fmt: the format of out and out_t (the same; kFmtNone: neither).
// kCapVecs: 16-byte vectors of x a thread holds per row (kCapVecs / Vec8::kVecs chunks).
template <DType T, int Fmt, int kCapVecs>
__global__ void __launch_bounds__(kThreads, 2) norm_fwd_vec_kernel(const FwdParams p) {
  constexpr int kCap = kCapVecs / Vec8<T>::kVecs;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t amax_scratch[32];
  const int warp = threadIdx.x >> 5, u = threadIdx.x & 31;
  const int G = p.G, teams = kWarps / G, team = warp / G, g = warp % G;
  const int64_t n = p.n;
  // This thread's elements of a row: col0 + 256 kk + 0..7 for its chunks kk < nk (the warp's
  // chunks that exist for this thread); everything is addressed from col0 with constant offsets.
  const int64_t col0 = static_cast<int64_t>(g) * p.kw * kNormLanes + 8 * u;
  const int nk = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(p.kw), ceil_div_dev(n - col0, kNormLanes))));
  float *handoff = reinterpret_cast<float *>(smem + p.tile_bytes) + team * kNormLanes;  // G > 1
  float *total_slot = reinterpret_cast<float *>(smem + p.tile_bytes) + teams * kNormLanes + team;
  const float count = static_cast<float>(n);
  const float s = p.scale != nullptr ? *p.scale : 1.0f;
  const float g_base = p.zero_centered ? 1.0f : kNegZero;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * p.R;
  const int iters = (p.R + teams - 1) / teams;
  uint32_t m = 0;

#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    const int rl = team + it * teams;
    const int64_t r = r0 + rl;
    const bool active = rl < p.R && r < p.rows;
    const int64_t at = r * n + col0;  // this thread's first element in x, y and out
    Vec8<T> xr[kCap];
    if (active) {
#pragma unroll
      for (int kk = 0; kk < kCap; ++kk)
        if (kk < nk) load8<T>(p.x, at + kk * kNormLanes, xr[kk]);
      // The warp's part of its next row goes to L2 while this one is being normalised.
      const int64_t r_next = r + teams;
      if (rl + teams < p.R && r_next < p.rows) {
        using S = typename InType<T>::Storage;
        const int64_t first = r_next * n + (col0 - 8 * u);
        const S *row_x = static_cast<const S *>(p.x);
        prefetch_l2(reinterpret_cast<const char *>(row_x + first),
                    reinterpret_cast<const char *>(row_x + min(first + static_cast<int64_t>(p.kw) * kNormLanes, (r_next + 1) * n)));
      }
    }
    // The team's ordered sum of term(x) over the row.
    auto row_total = [&](auto term) -> float {
      float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      auto add_terms = [&] {
        if (!active) return;
#pragma unroll
        for (int kk = 0; kk < kCap; ++kk) {
          if (kk >= nk) continue;
          float f[8];
          unpack8<T>(xr[kk], f);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[i] = add(acc[i], term(f[i]));
        }
      };
      if (G == 1) {
        add_terms();
        return warp_lanes_total(acc);
      }
      for (int step = 0; step < G; ++step) {
        if (g == step) {
          if (step > 0) {
            const float4 *h = reinterpret_cast<const float4 *>(handoff + 8 * u);
            const float4 a0 = h[0], a1 = h[1];
            acc[0] = a0.x, acc[1] = a0.y, acc[2] = a0.z, acc[3] = a0.w;
            acc[4] = a1.x, acc[5] = a1.y, acc[6] = a1.z, acc[7] = a1.w;
          }
          add_terms();
          if (step < G - 1) {
            float4 *h = reinterpret_cast<float4 *>(handoff + 8 * u);
            h[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
            h[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
          } else {
            const float t = warp_lanes_total(acc);
            if (u == 0) *total_slot = t;
          }
        }
        __syncthreads();
      }
      return *total_slot;
    };
    float mu = 0.0f, second;
    if (p.layer) {
      mu = __fdiv_rn(row_total([](float v) { return v; }), count);
      second = row_total([mu](float v) {
        const float d = sub(v, mu);
        return mul(d, d);
      });
    } else {
      second = row_total([](float v) { return mul(v, v); });
    }
    const float rsigma = rsigma_of(second, count, p.eps);
    if (!active) continue;
    if (g == 0 && u == 0) {
      if (p.mu != nullptr) p.mu[r] = mu;
      if (p.rsigma != nullptr) p.rsigma[r] = rsigma;
    }
#pragma unroll
    for (int kk = 0; kk < kCap; ++kk) {
      if (kk >= nk) continue;
      const int off = kk * kNormLanes;
      float f[8], gm[8], b[8] = {kNegZero, kNegZero, kNegZero, kNegZero, kNegZero, kNegZero, kNegZero, kNegZero}, v[8];
      unpack8<T>(xr[kk], f);
      load8_floats<T>(p.gamma, col0 + off, gm);
      if (p.beta != nullptr) load8_floats<T>(p.beta, col0 + off, b);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = add(mul(mul(sub(f[i], mu), rsigma), add(g_base, gm[i])), b[i]);
      if (p.amax != nullptr) {
#pragma unroll
        for (int i = 0; i < 8; ++i) m = max(m, abs_bits(v[i]));
      }
      if (p.y != nullptr) store8(p.y, p.y_dtype, at + off, v);
      if constexpr (Fmt != kFmtNone) {
        const uint32_t w0 = encode4<Fmt>(mul(v[0], s), mul(v[1], s), mul(v[2], s), mul(v[3], s));
        const uint32_t w1 = encode4<Fmt>(mul(v[4], s), mul(v[5], s), mul(v[6], s), mul(v[7], s));
        if (p.out != nullptr) *reinterpret_cast<uint2 *>(p.out + at + off) = make_uint2(w0, w1);
        if (p.out_t != nullptr)  // the code tile
          *reinterpret_cast<uint2 *>(smem + rl * n + col0 + off) = make_uint2(w0, w1);
      }
    }
  }

  if constexpr (Fmt != kFmtNone) {
    if (p.out_t != nullptr) {
      __syncthreads();
      write_tile_transposed(smem, p, r0);
    }
  }
  finish_forward(p, m, s, amax_scratch);
}

// The vectorised forward's register capacity (16-byte vectors of x per thread): rows of up to 4
// vectors per thread take the small kernel (more CTAs per SM), longer ones the big one (64
// registers of the row; 32 for F32, whose loads the compiler hoists further).
constexpr int kFwdSmallCapVecs = 4;
template <DType T>
constexpr int kFwdBigCapVecs = T == DType::F32 ? 8 : 16;

constexpr int kGenericRows = 16;  // rows per CTA of the generic forward (one out_t store each)

// The generic forward: any shape, alignment, dtypes and formats. Statistics one row at a time
// (thread t is lane t), then the outputs 256 columns at a time for the CTA's rows.
template <DType T>
__global__ void __launch_bounds__(kThreads) norm_fwd_generic_kernel(const FwdParams p) {
  __shared__ float red[kWarps + 1];
  __shared__ float stat_mu[kGenericRows], stat_rs[kGenericRows];
  __shared__ __align__(16) uint8_t tile[kGenericRows][kThreads];
  __shared__ uint32_t amax_scratch[32];
  const int t = threadIdx.x;
  const int64_t n = p.n;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kGenericRows;
  const int nr = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(kGenericRows), p.rows - r0)));
  const float count = static_cast<float>(n);
  for (int rl = 0; rl < nr; ++rl) {
    const int64_t row = (r0 + rl) * n;
    float acc = 0.0f;
    for (int64_t i = t; i < n; i += kThreads) {
      const float v = load_scalar<T>(p.x, row + i);
      acc = add(acc, p.layer ? v : mul(v, v));
    }
    const float first = block_lanes_total(acc, red);
    float mu = 0.0f, second = first;
    if (p.layer) {
      mu = __fdiv_rn(first, count);
      acc = 0.0f;
      for (int64_t i = t; i < n; i += kThreads) {
        const float d = sub(load_scalar<T>(p.x, row + i), mu);
        acc = add(acc, mul(d, d));
      }
      second = block_lanes_total(acc, red);
    }
    if (t == 0) {
      const float rs = rsigma_of(second, count, p.eps);
      stat_mu[rl] = mu;
      stat_rs[rl] = rs;
      if (p.mu != nullptr) p.mu[r0 + rl] = mu;
      if (p.rsigma != nullptr) p.rsigma[r0 + rl] = rs;
    }
  }
  __syncthreads();
  const float s = p.scale != nullptr ? *p.scale : 1.0f;
  const bool vec_t = p.out_t_vec && nr == kGenericRows;
  uint32_t m = 0;
  for (int64_t c0 = 0; c0 < n; c0 += kThreads) {
    const int64_t c = c0 + t;
    if (c < n) {
      const float gm = add(p.zero_centered ? 1.0f : kNegZero, dev_load_as_float(p.gamma, p.gamma_dtype, c));
      const float b = p.beta != nullptr ? dev_load_as_float(p.beta, p.beta_dtype, c) : kNegZero;
      for (int rl = 0; rl < nr; ++rl) {
        const int64_t idx = (r0 + rl) * n + c;
        const float v = add(mul(mul(sub(load_scalar<T>(p.x, idx), stat_mu[rl]), stat_rs[rl]), gm), b);
        m = max(m, abs_bits(v));
        if (p.y != nullptr) dev_store_from_float(p.y, p.y_dtype, idx, v);
        const float q = mul(v, s);
        if (p.out != nullptr) p.out[idx] = encode1_rt(p.out_fmt, q);
        if (p.out_t != nullptr) tile[rl][t] = encode1_rt(p.out_t_fmt, q);
      }
    }
    if (p.out_t != nullptr) {
      __syncthreads();
      if (c < n) {
        uint8_t *dst = p.out_t + c * p.rows + r0;
        if (vec_t) {
          uint32_t w[4];
#pragma unroll
          for (int j = 0; j < 4; ++j)
            w[j] = tile[4 * j][t] | (tile[4 * j + 1][t] << 8) | (tile[4 * j + 2][t] << 16) |
                   (static_cast<uint32_t>(tile[4 * j + 3][t]) << 24);
          *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
          for (int rl = 0; rl < nr; ++rl) dst[rl] = tile[rl][t];
        }
      }
      __syncthreads();
    }
  }
  finish_forward(p, m, s, amax_scratch);
}

// ---- backward ------------------------------------------------------------------------------

struct BwdParams {
  const void *dy, *x, *gamma;
  DType dy_dtype, gamma_dtype;
  const float *mu, *rsigma;  // mu: LayerNorm only
  void *dx;                  // nullable
  DType dx_dtype;
  float *partial;  // [2][bands][n]: dgamma's, then dbeta's partial sums (nullable: neither wanted)
  int64_t rows, n, rows_per_band, bands;
  bool layer, zero_centered;
  int G, kw;  // vectorised kernel: warps per row, chunks per warp
  int64_t chunks;
};

constexpr int kBwdCapVecs = 4;      // 16-byte vectors of x (and of dy) a thread holds per row
constexpr int kBandRows = 32;       // at least this many rows per band...
constexpr int64_t kMaxBands = 256;  // ...and at most this many bands (one wave at 2 CTAs per SM)

template <DType T>
__global__ void __launch_bounds__(kThreads, 2) norm_bwd_vec_kernel(const BwdParams p) {
  constexpr int kCap = kBwdCapVecs / Vec8<T>::kVecs;
  extern __shared__ __align__(16) float fsmem[];
  const int warp = threadIdx.x >> 5, u = threadIdx.x & 31;
  const int G = p.G, teams = kWarps / G, team = warp / G, g = warp % G;
  const int64_t n = p.n;
  const int64_t col0 = static_cast<int64_t>(g) * p.kw * kNormLanes + 8 * u;  // as in the forward
  const int nk = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(p.kw), ceil_div_dev(n - col0, kNormLanes))));
  const bool want_dx = p.dx != nullptr, want_sums = p.partial != nullptr;
  // Shared memory: [teams][n] dgamma and dbeta sums (when wanted), then the chain's hand-over
  // [teams][2][256] and the two totals per team.
  float *dg = fsmem + static_cast<int64_t>(team) * n;
  float *db = fsmem + static_cast<int64_t>(teams + team) * n;
  float *chain = fsmem + (want_sums ? 2 * static_cast<int64_t>(teams) * n : 0);
  float *handoff = chain + team * 2 * kNormLanes;
  float *totals = chain + teams * 2 * kNormLanes + 2 * team;
  if (want_sums) {
    for (int64_t i = threadIdx.x; i < 2 * teams * n; i += kThreads) fsmem[i] = 0.0f;
    __syncthreads();
  }
  const float count = static_cast<float>(n);
  const float g_base = p.zero_centered ? 1.0f : kNegZero;
  auto col_of = [&](int kk) { return col0 + kk * kNormLanes; };
  const int64_t r_begin = static_cast<int64_t>(blockIdx.x) * p.rows_per_band;
  const int64_t r_end = min(p.rows, r_begin + p.rows_per_band);
  const int iters = static_cast<int>((p.rows_per_band + teams - 1) / teams);

#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    const int64_t r = r_begin + team + static_cast<int64_t>(it) * teams;
    const bool active = r < r_end;
    const int64_t row = r * n;
    Vec8<T> xr[kCap], dyr[kCap];
    float mu = 0.0f, rs = 0.0f;
    if (active) {
#pragma unroll
      for (int kk = 0; kk < kCap; ++kk) {
        if (kk >= nk) continue;
        load8<T>(p.x, row + col_of(kk), xr[kk]);
        load8<T>(p.dy, row + col_of(kk), dyr[kk]);
      }
      mu = p.layer ? p.mu[r] : 0.0f;
      rs = p.rsigma[r];
    }
    // x_hat, dy * g and dy of chunk kk.
    auto terms = [&](int kk, float (&xh)[8], float (&dyg)[8], float (&dyf)[8]) {
      float f[8], gm[8];
      unpack8<T>(xr[kk], f);
      unpack8<T>(dyr[kk], dyf);
      load8_floats<T>(p.gamma, col_of(kk), gm);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        xh[i] = mul(sub(f[i], mu), rs);
        dyg[i] = mul(dyf[i], add(g_base, gm[i]));
      }
    };
    // This thread's part of the row: the two sums' terms and the dgamma/dbeta sums.
    float s1[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float s2[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    auto add_terms = [&] {
      if (!active) return;
#pragma unroll
      for (int kk = 0; kk < kCap; ++kk) {
        if (kk >= nk) continue;
        float xh[8], dyg[8], dyf[8];
        terms(kk, xh, dyg, dyf);
        if (want_dx) {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            s1[i] = add(s1[i], mul(dyg[i], xh[i]));
            s2[i] = add(s2[i], dyg[i]);
          }
        }
        if (want_sums) {
          float4 *pg = reinterpret_cast<float4 *>(dg + col_of(kk));
          float4 *pb = reinterpret_cast<float4 *>(db + col_of(kk));
          float4 g0 = pg[0], g1 = pg[1], b0 = pb[0], b1 = pb[1];
          g0.x = add(g0.x, mul(dyf[0], xh[0]));
          g0.y = add(g0.y, mul(dyf[1], xh[1]));
          g0.z = add(g0.z, mul(dyf[2], xh[2]));
          g0.w = add(g0.w, mul(dyf[3], xh[3]));
          g1.x = add(g1.x, mul(dyf[4], xh[4]));
          g1.y = add(g1.y, mul(dyf[5], xh[5]));
          g1.z = add(g1.z, mul(dyf[6], xh[6]));
          g1.w = add(g1.w, mul(dyf[7], xh[7]));
          b0.x = add(b0.x, dyf[0]);
          b0.y = add(b0.y, dyf[1]);
          b0.z = add(b0.z, dyf[2]);
          b0.w = add(b0.w, dyf[3]);
          b1.x = add(b1.x, dyf[4]);
          b1.y = add(b1.y, dyf[5]);
          b1.z = add(b1.z, dyf[6]);
          b1.w = add(b1.w, dyf[7]);
          pg[0] = g0;
          pg[1] = g1;
          pb[0] = b0;
          pb[1] = b1;
        }
      }
    };
    if (!want_dx) {
      add_terms();
      continue;
    }
    float c1, c2;
    if (G == 1) {
      add_terms();
      c1 = warp_lanes_total(s1);
      c2 = warp_lanes_total(s2);
    } else {
      for (int step = 0; step < G; ++step) {
        if (g == step) {
          if (step > 0) {
            const float4 *h = reinterpret_cast<const float4 *>(handoff + 8 * u);
            const float4 a0 = h[0], a1 = h[1], b0 = h[64], b1 = h[65];
            s1[0] = a0.x, s1[1] = a0.y, s1[2] = a0.z, s1[3] = a0.w;
            s1[4] = a1.x, s1[5] = a1.y, s1[6] = a1.z, s1[7] = a1.w;
            s2[0] = b0.x, s2[1] = b0.y, s2[2] = b0.z, s2[3] = b0.w;
            s2[4] = b1.x, s2[5] = b1.y, s2[6] = b1.z, s2[7] = b1.w;
          }
          add_terms();
          if (step < G - 1) {
            float4 *h = reinterpret_cast<float4 *>(handoff + 8 * u);
            h[0] = make_float4(s1[0], s1[1], s1[2], s1[3]);
            h[1] = make_float4(s1[4], s1[5], s1[6], s1[7]);
            h[64] = make_float4(s2[0], s2[1], s2[2], s2[3]);
            h[65] = make_float4(s2[4], s2[5], s2[6], s2[7]);
          } else {
            const float t1 = warp_lanes_total(s1);
            const float t2 = warp_lanes_total(s2);
            if (u == 0) totals[0] = t1, totals[1] = t2;
          }
        }
        __syncthreads();
      }
      c1 = totals[0];
      c2 = totals[1];
    }
    if (!active) continue;
    c1 = __fdiv_rn(c1, count);
    c2 = p.layer ? __fdiv_rn(c2, count) : kNegZero;
#pragma unroll
    for (int kk = 0; kk < kCap; ++kk) {
      if (kk >= nk) continue;
      float xh[8], dyg[8], dyf[8], d[8];
      terms(kk, xh, dyg, dyf);
#pragma unroll
      for (int i = 0; i < 8; ++i) d[i] = mul(sub(dyg[i], add(mul(xh[i], c1), c2)), rs);
      store8(p.dx, p.dx_dtype, row + col_of(kk), d);
    }
  }

  if (want_sums) {
    __syncthreads();
    // The band's partial: the teams' sums added in team order.
    for (int64_t c = threadIdx.x; c < n; c += kThreads) {
      float a = fsmem[c], b = fsmem[teams * n + c];
      for (int tm = 1; tm < teams; ++tm) {
        a = add(a, fsmem[tm * n + c]);
        b = add(b, fsmem[(teams + tm) * n + c]);
      }
      p.partial[blockIdx.x * n + c] = a;
      p.partial[(p.bands + blockIdx.x) * n + c] = b;
    }
  }
}

// The generic backward: thread t is lane t and owns columns t, t + 256, ...; it accumulates their
// dgamma/dbeta sums in the band's partial rows directly (no other thread touches them).
template <DType T>
__global__ void __launch_bounds__(kThreads) norm_bwd_generic_kernel(const BwdParams p) {
  __shared__ float red[kWarps + 1];
  const int t = threadIdx.x;
  const int64_t n = p.n;
  const float count = static_cast<float>(n);
  float *dg = p.partial != nullptr ? p.partial + blockIdx.x * n : nullptr;
  float *db = p.partial != nullptr ? p.partial + (p.bands + blockIdx.x) * n : nullptr;
  if (dg != nullptr)
    for (int64_t c = t; c < n; c += kThreads) dg[c] = db[c] = 0.0f;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.x) * p.rows_per_band;
  const int64_t r_end = min(p.rows, r_begin + p.rows_per_band);
  const float g_base = p.zero_centered ? 1.0f : kNegZero;
  auto terms = [&](int64_t idx, int64_t c, float mu, float rs, float &xh, float &dyg, float &dyf) {
    const float gm = add(g_base, dev_load_as_float(p.gamma, p.gamma_dtype, c));
    dyf = dev_load_as_float(p.dy, p.dy_dtype, idx);
    xh = mul(sub(load_scalar<T>(p.x, idx), mu), rs);
    dyg = mul(dyf, gm);
  };
  for (int64_t r = r_begin; r < r_end; ++r) {
    const int64_t row = r * n;
    const float mu = p.layer ? p.mu[r] : 0.0f, rs = p.rsigma[r];
    float c1 = 0.0f, c2 = kNegZero;
    if (p.dx != nullptr) {
      float s1 = 0.0f, s2 = 0.0f;
      for (int64_t c = t; c < n; c += kThreads) {
        float xh, dyg, dyf;
        terms(row + c, c, mu, rs, xh, dyg, dyf);
        s1 = add(s1, mul(dyg, xh));
        s2 = add(s2, dyg);
      }
      c1 = __fdiv_rn(block_lanes_total(s1, red), count);
      c2 = p.layer ? __fdiv_rn(block_lanes_total(s2, red), count) : kNegZero;
    }
    for (int64_t c = t; c < n; c += kThreads) {
      float xh, dyg, dyf;
      terms(row + c, c, mu, rs, xh, dyg, dyf);
      if (dg != nullptr) {
        dg[c] = add(dg[c], mul(dyf, xh));
        db[c] = add(db[c], dyf);
      }
      if (p.dx != nullptr) dev_store_from_float(p.dx, p.dx_dtype, row + c, mul(sub(dyg, add(mul(xh, c1), c2)), rs));
    }
  }
}

// dgamma[c] (and dbeta[c]) = the bands' partials added in a fixed order: warp w adds bands
// w, w + 8, ... in order, then the 8 warp sums are added in warp order.
__global__ void __launch_bounds__(kThreads) norm_bwd_finalize_kernel(const float *partial, int64_t bands, int64_t n,
                                                                     void *dgamma, DType dg_dtype, void *dbeta,
                                                                     DType db_dtype) {
  __shared__ float sums[2][kWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  float a = 0.0f, b = 0.0f;
  if (c < n) {
    for (int64_t k = warp; k < bands; k += kWarps) {
      a = add(a, partial[k * n + c]);
      b = add(b, partial[(bands + k) * n + c]);
    }
  }
  sums[0][warp][lane] = a;
  sums[1][warp][lane] = b;
  __syncthreads();
  if (warp == 0 && c < n) {
    for (int w = 1; w < kWarps; ++w) {
      a = add(a, sums[0][w][lane]);
      b = add(b, sums[1][w][lane]);
    }
    if (dgamma != nullptr) dev_store_from_float(dgamma, dg_dtype, c, a);
    if (dbeta != nullptr) dev_store_from_float(dbeta, db_dtype, c, b);
  }
}

// ---- launchers -----------------------------------------------------------------------------

bool aligned_to(const void *p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Shared memory a block may opt in to on the current device (less the kernels' static arrays).
int smem_optin_budget() {
  int device = 0, bytes = 0;
  TE_CUDA_CHECK(cudaGetDevice(&device));
  TE_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes - 1024;
}

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    TE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Warps per row for a row of `chunks` 256-element chunks when a warp holds up to `cap` of them:
// the smallest power of two that covers the row, or 0 above 8 warps.
int warps_per_row(int64_t chunks, int cap) {
  for (int G = 1; G <= kWarps; G *= 2)
    if (static_cast<int64_t>(G) * cap >= chunks) return G;
  return 0;
}

template <DType T, int Fmt, int kCapVecs>
void launch_fwd_vec(FwdParams p, cudaStream_t stream) {
  const int teams = kWarps / p.G;
  const size_t smem = static_cast<size_t>(p.tile_bytes) + (p.G > 1 ? (teams * kNormLanes + kWarps) * sizeof(float) : 0);
  allow_smem(norm_fwd_vec_kernel<T, Fmt, kCapVecs>, smem);
  const unsigned grid = static_cast<unsigned>(ceil_div(p.rows, p.R));
  norm_fwd_vec_kernel<T, Fmt, kCapVecs><<<grid, kThreads, smem, stream>>>(p);
}

template <DType T, int Fmt>
void dispatch_fwd_cap(const FwdParams &p, bool small, cudaStream_t stream) {
  if (small) launch_fwd_vec<T, Fmt, kFwdSmallCapVecs>(p, stream);
  else launch_fwd_vec<T, Fmt, kFwdBigCapVecs<T>>(p, stream);
}

template <DType T>
void dispatch_fwd_fmt(const FwdParams &p, int fmt, bool small, cudaStream_t stream) {
  switch (fmt) {
    case kFmtE4M3: dispatch_fwd_cap<T, kFmtE4M3>(p, small, stream); return;
    case kFmtE5M2: dispatch_fwd_cap<T, kFmtE5M2>(p, small, stream); return;
    default: dispatch_fwd_cap<T, kFmtNone>(p, small, stream); return;
  }
}

// Fills the vectorised kernel's layout into p and returns the kernel's kCapVecs (the small or the
// big capacity), or 0 when it cannot take these arguments.
int plan_fwd_vec(const NormForwardArgs &a, FwdParams &p) {
  const DType t = a.x.dtype;
  if (p.rows < 1 || p.n < 1 || p.n % 8 != 0) return 0;
  if (a.gamma.dtype != t || (a.beta.data != nullptr && a.beta.dtype != t)) return 0;
  if (p.out != nullptr && p.out_t != nullptr && p.out_fmt != p.out_t_fmt) return 0;
  if (!aligned_to(p.x, 16) || !aligned_to(p.gamma, 16) || !aligned_to(p.beta, 16) || !aligned_to(p.y, 16) ||
      !aligned_to(p.out, 8))
    return 0;
  const int per_chunk = t == DType::F32 ? 2 : 1;  // 16-byte vectors per thread per chunk
  p.chunks = ceil_div(p.n, kNormLanes);
  const bool small = p.chunks <= kFwdSmallCapVecs / per_chunk;
  const int big_cap = t == DType::F32 ? kFwdBigCapVecs<DType::F32> : kFwdBigCapVecs<DType::BF16>;
  p.G = small ? 1 : warps_per_row(p.chunks, big_cap / per_chunk);
  if (p.G == 0) return 0;
  p.kw = static_cast<int>(ceil_div(p.chunks, p.G));
  p.R = 16;
  p.tile_bytes = 0;
  p.out_t_vec = false;
  if (p.out_t != nullptr) {
    // R rows of codes: 16 (out_t stores of 16 bytes) when two CTAs still fit an SM, else the
    // most that fit one.
    const int64_t chain = p.G > 1 ? (kWarps / p.G * kNormLanes + kWarps) * 4 : 0;
    const int64_t budget = smem_optin_budget();
    if (16 * p.n + chain <= std::min<int64_t>(100 * 1024, budget)) p.R = 16;
    else if (8 * p.n + chain <= budget) p.R = 8;
    else if (4 * p.n + chain <= budget) p.R = 4;
    else return 0;
    p.tile_bytes = static_cast<int>(p.R * p.n);
    p.out_t_vec = aligned_to(p.out_t, 16) && p.rows % p.R == 0;
  }
  return small ? kFwdSmallCapVecs : big_cap;
}

}  // namespace

void norm_forward(const NormForwardArgs &a, cudaStream_t stream) {
  FwdParams p{};
  p.x = a.x.data;
  p.gamma = a.gamma.data;
  p.beta = a.beta.data;
  p.gamma_dtype = a.gamma.dtype;
  p.beta_dtype = a.beta.data != nullptr ? a.beta.dtype : a.gamma.dtype;
  p.y = a.y.data;
  p.y_dtype = a.y.data != nullptr ? a.y.dtype : DType::F32;
  p.mu = a.mu;
  p.rsigma = a.rsigma;
  p.scale = a.scale;
  p.amax = a.amax_accum;
  p.out = a.out != nullptr ? static_cast<uint8_t *>(a.out->data) : nullptr;
  p.out_t = a.out_t != nullptr ? static_cast<uint8_t *>(a.out_t->data) : nullptr;
  p.out_scale_inv = a.out != nullptr ? a.out->scale_inv : nullptr;
  p.out_t_scale_inv = a.out_t != nullptr ? a.out_t->scale_inv : nullptr;
  p.out_fmt = fmt_of(a.out);
  p.out_t_fmt = fmt_of(a.out_t);
  p.rows = a.x.numel() == 0 ? 0 : a.x.rows();
  p.n = a.x.numel() == 0 ? 0 : a.x.cols();
  p.eps = a.eps;
  p.layer = a.kind == NormKind::LayerNorm;
  p.zero_centered = a.zero_centered_gamma;
  const DType t = a.x.dtype;
  if (const int cap_vecs = plan_fwd_vec(a, p)) {
    const int fmt = p.out != nullptr ? p.out_fmt : p.out_t_fmt;
    const bool small = cap_vecs == kFwdSmallCapVecs;
    switch (t) {
      case DType::F32: dispatch_fwd_fmt<DType::F32>(p, fmt, small, stream); break;
      case DType::F16: dispatch_fwd_fmt<DType::F16>(p, fmt, small, stream); break;
      default: dispatch_fwd_fmt<DType::BF16>(p, fmt, small, stream); break;
    }
  } else {
    p.R = kGenericRows;
    p.out_t_vec = p.out_t != nullptr && aligned_to(p.out_t, 16) && p.rows % kGenericRows == 0;
    // At least one block: it writes scale_inv (and folds amax 0) for an empty tensor too.
    const int64_t blocks = ceil_div(p.rows, kGenericRows);
    const unsigned grid = static_cast<unsigned>(blocks < 1 ? 1 : blocks);
    switch (t) {
      case DType::F32: norm_fwd_generic_kernel<DType::F32><<<grid, kThreads, 0, stream>>>(p); break;
      case DType::F16: norm_fwd_generic_kernel<DType::F16><<<grid, kThreads, 0, stream>>>(p); break;
      default: norm_fwd_generic_kernel<DType::BF16><<<grid, kThreads, 0, stream>>>(p); break;
    }
  }
  TE_CUDA_CHECK_LAUNCH();
}

namespace {

// The backward's band split: a function of the row count only (not of the device), so that
// dgamma/dbeta come out the same everywhere.
void plan_bands(BwdParams &p) {
  p.bands = p.rows == 0 ? 1 : ceil_div(p.rows, kBandRows);
  if (p.bands > kMaxBands) p.bands = kMaxBands;
  p.rows_per_band = p.rows == 0 ? 0 : ceil_div(p.rows, p.bands);
}

bool plan_bwd_vec(const NormBackwardArgs &a, BwdParams &p) {
  const DType t = a.x.dtype;
  if (p.rows < 1 || p.n < 1 || p.n % 8 != 0) return false;
  if (a.gamma.dtype != t || a.dy.dtype != t) return false;
  if (!aligned_to(p.x, 16) || !aligned_to(p.dy, 16) || !aligned_to(p.gamma, 16) || !aligned_to(p.dx, 16)) return false;
  const int per_chunk = t == DType::F32 ? 2 : 1;
  p.chunks = ceil_div(p.n, kNormLanes);
  p.G = warps_per_row(p.chunks, kBwdCapVecs / per_chunk);
  if (p.G == 0) return false;
  p.kw = static_cast<int>(ceil_div(p.chunks, p.G));
  return true;
}

BwdParams bwd_params(const NormBackwardArgs &a) {
  BwdParams p{};
  p.dy = a.dy.data;
  p.x = a.x.data;
  p.gamma = a.gamma.data;
  p.dy_dtype = a.dy.dtype;
  p.gamma_dtype = a.gamma.dtype;
  p.mu = a.mu;
  p.rsigma = a.rsigma;
  p.dx = a.dx.data;
  p.dx_dtype = a.dx.data != nullptr ? a.dx.dtype : DType::F32;
  p.rows = a.x.numel() == 0 ? 0 : a.x.rows();
  p.n = a.x.cols();
  p.layer = a.kind == NormKind::LayerNorm;
  p.zero_centered = a.zero_centered_gamma;
  plan_bands(p);
  return p;
}

bool wants_param_grads(const NormBackwardArgs &a) { return a.dgamma.data != nullptr || a.dbeta.data != nullptr; }

}  // namespace

size_t norm_backward_scratch_bytes(const NormBackwardArgs &a) {
  if (!wants_param_grads(a)) return 0;
  const BwdParams p = bwd_params(a);
  return static_cast<size_t>(2 * p.bands * p.n) * sizeof(float);
}

void norm_backward(Backend &be, const NormBackwardArgs &a, cudaStream_t stream) {
  BwdParams p = bwd_params(a);
  if (p.n == 0) return;  // nothing to write (dgamma / dbeta have no element)
  const bool grads = wants_param_grads(a);
  if (p.dx == nullptr && !grads) return;
  Buffer partial;
  if (grads) partial = Buffer(&be, norm_backward_scratch_bytes(a));
  p.partial = partial.floats();
  if (p.rows > 0) {
    const unsigned grid = static_cast<unsigned>(p.bands);
    const DType t = a.x.dtype;
    if (plan_bwd_vec(a, p)) {
      const int teams = kWarps / p.G;
      const size_t smem = ((grads ? 2 * teams * static_cast<size_t>(p.n) : 0) +
                           (p.G > 1 ? static_cast<size_t>(teams) * 2 * kNormLanes + 2 * kWarps : 0)) *
                          sizeof(float);
      switch (t) {
        case DType::F32:
          allow_smem(norm_bwd_vec_kernel<DType::F32>, smem);
          norm_bwd_vec_kernel<DType::F32><<<grid, kThreads, smem, stream>>>(p);
          break;
        case DType::F16:
          allow_smem(norm_bwd_vec_kernel<DType::F16>, smem);
          norm_bwd_vec_kernel<DType::F16><<<grid, kThreads, smem, stream>>>(p);
          break;
        default:
          allow_smem(norm_bwd_vec_kernel<DType::BF16>, smem);
          norm_bwd_vec_kernel<DType::BF16><<<grid, kThreads, smem, stream>>>(p);
          break;
      }
    } else {
      switch (t) {
        case DType::F32: norm_bwd_generic_kernel<DType::F32><<<grid, kThreads, 0, stream>>>(p); break;
        case DType::F16: norm_bwd_generic_kernel<DType::F16><<<grid, kThreads, 0, stream>>>(p); break;
        default: norm_bwd_generic_kernel<DType::BF16><<<grid, kThreads, 0, stream>>>(p); break;
      }
    }
    TE_CUDA_CHECK_LAUNCH();
  } else if (grads) {
    // No rows: the sums are zero.
    TE_CUDA_CHECK(cudaMemsetAsync(p.partial, 0, norm_backward_scratch_bytes(a), stream));
  }
  if (grads) {
    const unsigned grid = static_cast<unsigned>(ceil_div(p.n, 32));
    norm_bwd_finalize_kernel<<<grid, kThreads, 0, stream>>>(p.partial, p.bands, p.n, a.dgamma.data, a.dgamma.dtype,
                                                            a.dbeta.data, a.dbeta.dtype);
    TE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace te::cuda
