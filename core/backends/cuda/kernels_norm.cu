// LayerNorm / RMSNorm forward (fused with the FP8 cast, its transpose and the amax) and backward.
//
// Bit-identical to the CPU (numerics/norm.h): a row's sums are those of 256 lanes, lane l adding
// elements l, l + 256, ... in order from +0, then the warp tree (offsets 16..1) and the tree of the
// 8 warp totals (4, 2, 1); every operation is a separately rounded _rn intrinsic (nvcc would
// otherwise contract products and sums into FMAs), division and square root correctly rounded.
//
// Forward, streaming kernel (hidden % 8 == 0, aligned tensors, hidden <= 16384 for 16-bit inputs
// and 8192 for F32, the code tile fits): persistent, one CTA of 16 warps per SM. Teams of G = 2
// or 4 warps (1 for short rows) each normalise one row at a time: the team's next row streams
// into its shared-memory slot with the bulk copy engine (cp.async.bulk on mbarriers) while it
// works on the current one, held in registers (64 per thread); the statistics come out in the
// order above with the lanes spread over the team's threads (thread u of warp g holds lanes
// 32Vg + Vu .. + V - 1, V = 8 / G, so every lane's sum stays inside one thread; the warp tree is
// shuffles then in-thread adds; the 8 warp totals go through shared memory when G > 1). y, `out`
// and amax come straight from registers; the codes also go to a [R][hidden] code tile in shared
// memory (R = 32 for hidden 4096, 16 for 8192, 8 for 14336; 16-row blocks XOR-swizzled so that
// the transposed read is free of bank conflicts), from which out_t is written with 16-byte stores
// per column. Where that tile would hold fewer than 32 rows (hidden > 4096 for 16-bit inputs),
// its out_t stores would be 16 bytes or less per column: the kernel then writes `out` alone and
// transpose_codes (kernels_transpose_codes.cu) writes out_t from it, 5 bytes moved per element
// instead of 4 but at close to copy speed. H200, 2026-11-25, bf16 16384 x hidden -> E4M3 out +
// out_t + amax + stats, LayerNorm: 117 us (0.57 of a device copy of the same bytes) for hidden
// 4096; hidden 8192 and 14336 took 440 and 870-910 us (0.29 / 0.25) when clusters of 8 CTAs wrote
// out_t through distributed shared memory, and now take the norm without out_t (188 / 433 us)
// plus the transpose.
//
// Backward, vectorised kernels (16-byte accesses; hidden % 8 == 0, aligned tensors): one warp
// holds the 256 lanes of a row, thread u lanes 8u..8u+7, i.e. the 8 consecutive elements 256k + 8u..
// of every 256-element chunk k, so a lane's sequential sum stays inside one thread and the two
// trees are shuffles (warp_lanes_total). A row too long for one warp's registers is split over a
// team of G = 2, 4 or 8 warps holding consecutive chunk ranges: each lane's sum runs through the
// team's warps in chunk order (warp g continues from warp g - 1's lane sums, handed over in
// shared memory), so the order is still the one above. A CTA takes a band of rows; per row the
// team computes the two ordered sums (one pass through the chain), then dx. dgamma/dbeta: each
// column of a team belongs to one thread, which accumulates it over the team's rows in shared
// memory; the CTA adds its teams in order and writes one fp32 partial row to scratch, and a
// second kernel adds the bands' partials in a fixed order. The band count depends on the row
// count only, so results are the same on every run and device.
//
// Anything else (hidden % 8 != 0, unaligned views, longer rows, mixed FP8 formats or dtypes)
// takes the generic kernels: the CTA's 256 threads are the 256 lanes themselves (thread t adds
// elements t, t + 256, ...), which is the order by definition; x is read again from L2 for each
// pass.
#include <algorithm>
#include <cstdint>
#include <type_traits>


#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_info.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernel_launch.cuh"
#include "backends/cuda/scale_update_block.cuh"

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

// Asks L2 for the 16-byte vectors load8 would read (no registers held, nothing waited for).
template <DType T>
__device__ __forceinline__ void prefetch8_l2(const void *base, int64_t elem) {
  using S = typename InType<T>::Storage;
  const uint4 *p = reinterpret_cast<const uint4 *>(static_cast<const S *>(base) + elem);
#pragma unroll
  for (int i = 0; i < Vec8<T>::kVecs; ++i) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + i));
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
  // The streaming kernel's layout (plan_fwd_rows): rows per tile, ring slots, bytes of a row of x
  // and of a ring slot, bytes per code-tile row (0: no code tile), tiles, whether out_t takes
  // 16/8/4-byte stores.
  int R, D, lg_R, lg_D, lg_rpt, row_bytes, slot_bytes, tile_stride;
  int64_t tiles;
  bool out_t_vec;
};

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

// ---- the streaming forward: its pieces ---------------------------------------------------------

// The streaming forward needs Hopper (sm_90): the bulk copy engine, mbarrier transactions and
// thread-block clusters. Its kernels compile to nothing for older targets, and the host sends
// those devices to the generic kernel (plan_fwd_rows).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define TE_NORM_SM90 1
#else
#define TE_NORM_SM90 0
#pragma nv_diag_suppress 177  // the streaming forward's helpers go unused on these targets
#endif
constexpr int kRowWarps = 16;                // warps of the streaming forward's CTA
constexpr int kRowThreads = kRowWarps * 32;  // ...its threads
constexpr int kTileBarrier = 15;             // named barrier of the whole CTA (teams use 1..8)
// kFmtRuntime (fp8_convert.cuh): the Fmt of the kernel for partial rows (p.out_fmt / p.out_t_fmt).

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

#if TE_NORM_SM90
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
  const uint32_t a = smem_u32(bar);
  uint32_t done;
  for (;;) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
    if (done != 0) return;
  }
}

// One row of x, global -> shared, by the bulk copy engine; completes on `bar`. x is read once:
// its lines leave L2 first (the code lines of out_t stay to be merged).
__device__ __forceinline__ void bulk_load_row(void *dst, const void *src, uint32_t bytes, uint64_t *bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
#endif  // TE_NORM_SM90

__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// max(a, b), NaN if either is NaN.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// fix_nan_codes4 in three or five integer operations: every code whose magnitude exceeds the
// largest finite one (E4M3 0x7E, E5M2 0x7B; satfinite never writes infinity) becomes the CPU's
// NaN (0x7F, 0x7E). Adding 0x01 (0x04) to each 7-bit magnitude sets bit 7 exactly for those.
template <int Fmt>
__device__ __forceinline__ uint32_t fix_nan_fast(uint32_t w) {
  if constexpr (Fmt == kFmtE4M3) {
    const uint32_t t = (w & 0x7F7F7F7Fu) + 0x01010101u;
    return w & ~(t & 0x80808080u);  // magnitude 0x7F: clear the sign
  } else {
    const uint32_t t = ((w & 0x7F7F7F7Fu) + 0x04040404u) & 0x80808080u;
    const uint32_t mask = t | (t - (t >> 7));  // 0xFF per NaN byte
    return (w & ~mask) | (0x7E7E7E7Eu & mask);
  }
}

// W 32-bit words of packed elements (W * 4 / sizeof(element) of them) -> floats. The ring's words
// are unpacked through opaque instructions so that the row stays packed in registers between its
// passes.
template <DType T, int W, bool kOpaque>
__device__ __forceinline__ void unpack_words(const uint32_t (&w)[W], float (&f)[W * 4 / (T == DType::F32 ? 4 : 2)]) {
#pragma unroll
  for (int j = 0; j < W; ++j) {
    if constexpr (T == DType::F32) {
      f[j] = __uint_as_float(w[j]);
    } else if constexpr (T == DType::BF16) {
      uint32_t lo, hi;
      if constexpr (kOpaque) {
        asm volatile("shl.b32 %0, %1, 16;" : "=r"(lo) : "r"(w[j]));
        asm volatile("and.b32 %0, %1, 0xFFFF0000;" : "=r"(hi) : "r"(w[j]));
      } else {
        lo = w[j] << 16;
        hi = w[j] & 0xFFFF0000u;
      }
      f[2 * j] = __uint_as_float(lo);
      f[2 * j + 1] = __uint_as_float(hi);
    } else {
      const float2 q = __half22float2(*reinterpret_cast<const __half2 *>(&w[j]));
      f[2 * j] = q.x;
      f[2 * j + 1] = q.y;
    }
  }
}

// W words at p (aligned to their size), shared or global memory.
template <int W>
__device__ __forceinline__ void load_words(const uint8_t *p, uint32_t (&w)[W]) {
  if constexpr (W == 8) {
    const uint4 a = reinterpret_cast<const uint4 *>(p)[0], b = reinterpret_cast<const uint4 *>(p)[1];
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else if constexpr (W == 4) {
    const uint4 a = *reinterpret_cast<const uint4 *>(p);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
  } else if constexpr (W == 2) {
    const uint2 a = *reinterpret_cast<const uint2 *>(p);
    w[0] = a.x, w[1] = a.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t *>(p);
  }
}

template <int W>
__device__ __forceinline__ void ldg_words(const uint8_t *p, uint32_t (&w)[W]) {
  if constexpr (W == 8) {
    const uint4 a = __ldg(reinterpret_cast<const uint4 *>(p)), b = __ldg(reinterpret_cast<const uint4 *>(p) + 1);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else if constexpr (W == 4) {
    const uint4 a = __ldg(reinterpret_cast<const uint4 *>(p));
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
  } else if constexpr (W == 2) {
    const uint2 a = __ldg(reinterpret_cast<const uint2 *>(p));
    w[0] = a.x, w[1] = a.y;
  } else {
    w[0] = __ldg(reinterpret_cast<const unsigned int *>(p));
  }
}

// V consecutive elements of a gamma / beta vector of dtype T, from column c, as floats.
template <DType T, int V>
__device__ __forceinline__ void ldg_floats(const void *base, int c, float (&f)[V]) {
  constexpr int kEs = T == DType::F32 ? 4 : 2;
  uint32_t w[V * kEs / 4];
  ldg_words<V * kEs / 4>(static_cast<const uint8_t *>(base) + static_cast<size_t>(c) * kEs, w);
  unpack_words<T, V * kEs / 4, false>(w, f);
}

// V floats as elements elem.. of an F32 / F16 / BF16 tensor (aligned to the store).
template <int V>
__device__ __forceinline__ void store_floats(void *base, DType t, int64_t elem, const float (&v)[V]) {
  if (t == DType::F32) {
    float *p = static_cast<float *>(base) + elem;
    if constexpr (V == 8) {
      reinterpret_cast<float4 *>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4 *>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else if constexpr (V == 4) {
      *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      *reinterpret_cast<float2 *>(p) = make_float2(v[0], v[1]);
    }
    return;
  }
  uint32_t w[V / 2];
#pragma unroll
  for (int j = 0; j < V / 2; ++j) {
    const uint32_t lo = t == DType::F16 ? float_to_f16_bits(v[2 * j]) : float_to_bf16_bits(v[2 * j]);
    const uint32_t hi = t == DType::F16 ? float_to_f16_bits(v[2 * j + 1]) : float_to_bf16_bits(v[2 * j + 1]);
    w[j] = lo | (hi << 16);
  }
  uint16_t *p = static_cast<uint16_t *>(base) + elem;
  if constexpr (V == 8) *reinterpret_cast<uint4 *>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  else if constexpr (V == 4) *reinterpret_cast<uint2 *>(p) = make_uint2(w[0], w[1]);
  else *reinterpret_cast<uint32_t *>(p) = w[0];
}

// V codes (V = 8, 4 or 2) at p, aligned to V bytes.
template <int V>
__device__ __forceinline__ void store_codes(uint8_t *p, const uint32_t (&c)[(V + 3) / 4]) {
  if constexpr (V == 8) *reinterpret_cast<uint2 *>(p) = make_uint2(c[0], c[1]);
  else if constexpr (V == 4) *reinterpret_cast<uint32_t *>(p) = c[0];
  else *reinterpret_cast<uint16_t *>(p) = static_cast<uint16_t>(c[0]);
}

// V floats times s -> V codes (packed little-endian).
template <int Fmt, int V>
__device__ __forceinline__ void encode_v(const float (&v)[V], float s, uint32_t (&code)[(V + 3) / 4]) {
#pragma unroll
  for (int q = 0; q < (V + 3) / 4; ++q) {
    if constexpr (V >= 4) {
      const uint32_t lo = cvt_fp8x2_raw<Fmt>(mul(v[4 * q], s), mul(v[4 * q + 1], s));
      const uint32_t hi = cvt_fp8x2_raw<Fmt>(mul(v[4 * q + 2], s), mul(v[4 * q + 3], s));
      code[q] = fix_nan_fast<Fmt>(lo | (hi << 16));
    } else {
      code[q] = fix_nan_fast<Fmt>(cvt_fp8x2_raw<Fmt>(mul(v[0], s), mul(v[1], s)));
    }
  }
}

// The XOR applied to the 32-bit word index of a code-tile row (bits 0..4): rows 16b..16b+15 of a
// tile of R >= 32 rows are shifted by b * 512 / R words, so that the transposed read, whose warp
// reads the same words of R / 16 row blocks at once, hits 32 distinct banks.
__device__ __forceinline__ int tile_swizzle(int row, int lg_R) { return lg_R >= 5 ? ((row >> 4) << (9 - lg_R)) & 31 : 0; }

// Columns 4q..4q+3 of RI consecutive tile rows (from src, stride apart) to out_t: one RI-byte
// store per column.
template <int RI>
__device__ __forceinline__ void transpose_block(const uint8_t *src, int stride, uint8_t *dst, int64_t rows) {
  uint32_t w[RI];
#pragma unroll
  for (int i = 0; i < RI; ++i) w[i] = *reinterpret_cast<const uint32_t *>(src + i * stride);
  uint32_t col[4][RI / 4];
#pragma unroll
  for (int rq = 0; rq < RI / 4; ++rq) {
    const uint32_t t0 = __byte_perm(w[4 * rq], w[4 * rq + 1], 0x5140), t1 = __byte_perm(w[4 * rq], w[4 * rq + 1], 0x7362);
    const uint32_t t2 = __byte_perm(w[4 * rq + 2], w[4 * rq + 3], 0x5140), t3 = __byte_perm(w[4 * rq + 2], w[4 * rq + 3], 0x7362);
    col[0][rq] = __byte_perm(t0, t2, 0x5410);
    col[1][rq] = __byte_perm(t0, t2, 0x7632);
    col[2][rq] = __byte_perm(t1, t3, 0x5410);
    col[3][rq] = __byte_perm(t1, t3, 0x7632);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint8_t *d = dst + j * rows;
    if constexpr (RI == 16) *reinterpret_cast<uint4 *>(d) = make_uint4(col[j][0], col[j][1], col[j][2], col[j][3]);
    else if constexpr (RI == 8) *reinterpret_cast<uint2 *>(d) = make_uint2(col[j][0], col[j][1]);
    else *reinterpret_cast<uint32_t *>(d) = col[j][0];
  }
}

// Writes the tile's nr rows of codes to out_t[:, r0 .. r0 + nr) (thread tid of the CTA's 512):
// whole blocks of RI = min(R, 16) rows as RI-byte stores, the rest byte by byte.
template <int RI>
__device__ __forceinline__ void write_out_t_blocks(const uint8_t *tile, const FwdParams &p, int64_t r0, int nr, int tid) {
  constexpr int kLgRI = RI == 16 ? 4 : RI == 8 ? 3 : 2;
  const int stride = p.tile_stride, lg_RB = p.lg_R - kLgRI, RB = 1 << lg_RB;
  const int rbv = p.out_t_vec ? nr / RI : 0;
  const int quads = static_cast<int>(p.n / 4);
  if (rbv > 0) {
    const int items = quads * RB;
    for (int item = tid; item < items; item += kRowThreads) {
      const int rb = item & (RB - 1), q = item >> lg_RB;
      if (rb >= rbv) continue;
      const uint8_t *src = tile + rb * RI * stride + ((q ^ tile_swizzle(rb * RI, p.lg_R)) << 2);
      transpose_block<RI>(src, stride, p.out_t + static_cast<int64_t>(4 * q) * p.rows + r0 + rb * RI, p.rows);
    }
  }
  const int first = rbv * RI, rem = nr - first;
  if (rem > 0) {
    const int64_t count = p.n * rem;
    for (int64_t idx = tid; idx < count; idx += kRowThreads) {
      const int c = static_cast<int>(idx / rem), rr = first + static_cast<int>(idx % rem);
      const int word = (c >> 2) ^ tile_swizzle(rr, p.lg_R);
      p.out_t[static_cast<int64_t>(c) * p.rows + r0 + rr] = tile[rr * stride + (word << 2) + (c & 3)];
    }
  }
}

// ---- the streaming forward ---------------------------------------------------------------------
//
// One CTA of 16 warps per SM, persistent: CTA b takes the tiles of R rows b, b + gridDim.x, ....
// The warps form teams of G = 8 / V warps; team tm normalises rows tm,
// tm + 16 / G, ... of the CTA's tile. Each team streams its own rows, in order, through its own D
// shared-memory slots (a slot has one consumer, so its mbarrier phases follow the team's row
// index): the bulk copy engine fills the slot (full[slot]), the team copies the row into
// registers (64 per thread), every thread arrives on empty[slot], and the team's first thread
// then loads the team's row D ahead into it, so that row's load overlaps this row's arithmetic.
// Thread u of warp g of a team holds lanes 32Vg + Vu .. + V - 1 of numerics/norm.h, i.e. the V
// consecutive columns 256k + 32Vg + Vu.. of every 256-column chunk k (K chunks at most; kExact:
// every thread has exactly K): a lane's sequential sum stays in one thread, the warp tree of a
// virtual warp (32 lanes = 32 / V threads) is shuffles by 16 / V.. threads then additions inside
// the thread, and the 8 virtual-warp totals (exchanged in shared memory when G > 1) are added by
// the tree of the 8 warp totals. Each element's fp32 value v gives y, amax and the code
// fp8(v * scale), written to `out` and to the tile's [R][n] code tile in shared memory; when the
// tile is done, out_t is written from it (one 16-byte store per column and 16 rows) while the
// teams' next rows are already loading.
template <DType T, int V, int K, bool kExact, int Fmt>
__global__ void __launch_bounds__(kRowThreads, 1) norm_fwd_rows_kernel(const FwdParams p) {
#if TE_NORM_SM90
  constexpr int kEs = T == DType::F32 ? 4 : 2;  // bytes per element
  constexpr int W = V * kEs / 4;                // words of x per thread and chunk
  static_assert(K * W <= 64, "64 registers of the row per thread");
  constexpr int G = 8 / V;                      // warps per row
  constexpr int kTeams = kRowWarps / G;
  constexpr int kTpv = 32 / V;                  // threads per virtual warp of 32 lanes
  constexpr int kCodeWords = (V + 3) / 4;
  extern __shared__ __align__(128) uint8_t smem[];
  const int R = p.R, D = p.D;
  const int warp = threadIdx.x >> 5, u = threadIdx.x & 31;
  const int team = warp / G, g = warp % G;
  uint8_t *ring = smem;
  uint8_t *tile = smem + static_cast<size_t>(kTeams) * D * p.slot_bytes;
  float *red = reinterpret_cast<float *>(tile + static_cast<size_t>(p.tile_stride) * R);  // [kTeams][2][8]
  uint64_t *full = reinterpret_cast<uint64_t *>(red + kTeams * 16) + team * D;  // this team's D slots
  uint64_t *empty = full + kTeams * D;
  uint8_t *slots = ring + static_cast<size_t>(team) * D * p.slot_bytes;
  const int64_t rows = p.rows, n = p.n;
  const int rpt = 1 << p.lg_rpt;  // rows of a tile per team (those at R and beyond do not exist)
  // The team's row i (row team + (i % rpt) * kTeams of the CTA's (i / rpt)-th tile) into its slot
  // i % D, if it exists. A team's rows exist up to some i and not after, so the slots' phases
  // follow i.
  auto load_row = [&](uint32_t i) {
    const int64_t t = blockIdx.x + static_cast<int64_t>(i >> p.lg_rpt) * gridDim.x;
    const int rl = team + static_cast<int>(i & (rpt - 1)) * kTeams;
    const int64_t r = t * R + rl;
    if (t >= p.tiles || rl >= R || r >= rows) return;
    const uint32_t slot = i & (D - 1);
    mbar_arrive_expect_tx(full + slot, static_cast<uint32_t>(p.row_bytes));
    bulk_load_row(slots + slot * p.slot_bytes, static_cast<const uint8_t *>(p.x) + r * p.row_bytes,
                  static_cast<uint32_t>(p.row_bytes), full + slot, evict_first_policy());
  };
  if (threadIdx.x == 0) {
    uint64_t *bars = reinterpret_cast<uint64_t *>(red + kTeams * 16);
    for (int i = 0; i < kTeams * D; ++i) {
      mbar_init(bars + i, 1);                   // full: the bulk copy's arrival
      mbar_init(bars + kTeams * D + i, G * 32);  // empty: every thread of the team has its row
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  if (g == 0 && u == 0)
    for (int i = 0; i < D; ++i) load_row(i);

  const int col0 = 32 * V * g + V * u;  // this thread's first column of every chunk
  const int nk = n > col0 ? static_cast<int>(min(static_cast<int64_t>(K), (n - col0 + kNormLanes - 1) / kNormLanes)) : 0;
  const float count = static_cast<float>(n);
  const float s = p.scale != nullptr ? *p.scale : 1.0f;
  const bool layer = p.layer, zc = p.zero_centered, has_beta = p.beta != nullptr, want_y = p.y != nullptr;
  const bool want_out = Fmt != kFmtNone && p.out != nullptr;
  const bool want_tile = Fmt != kFmtNone && p.out_t != nullptr;
  float m = 0.0f;
  int red_parity = 0;

  // The team's total of the lane sums a[] (numerics/norm.h steps 2 and 3), in every thread.
  auto team_total = [&](float (&a)[V]) -> float {
#pragma unroll
    for (int off = 16; off >= V; off >>= 1) {
#pragma unroll
      for (int i = 0; i < V; ++i) a[i] = add(a[i], __shfl_down_sync(kFull, a[i], off / V));
    }
#pragma unroll
    for (int off = V / 2; off >= 1; off >>= 1) {
#pragma unroll
      for (int i = 0; i < off; ++i) a[i] = add(a[i], a[i + off]);
    }
    // Virtual warp g * V + i's total is a[0] of thread kTpv * i.
    float w[8];
    if constexpr (G == 1) {
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = __shfl_sync(kFull, a[0], kTpv * i);
    } else {
      float *buf = red + team * 16 + red_parity * 8;
      red_parity ^= 1;
      if (u % kTpv == 0) buf[g * V + u / kTpv] = a[0];
      named_barrier(1 + team, G * 32);
      const float4 lo = reinterpret_cast<const float4 *>(buf)[0], hi = reinterpret_cast<const float4 *>(buf)[1];
      w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w, w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = add(w[i], w[i + 4]);
    w[0] = add(w[0], w[2]);
    w[1] = add(w[1], w[3]);
    return add(w[0], w[1]);
  };

  uint32_t i0 = 0;  // the team's row index of the tile's first row
  for (int64_t t = blockIdx.x; t < p.tiles; t += gridDim.x, i0 += rpt) {
    const int64_t r0 = t * R;
    const int nr = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(R), rows - r0)));
#pragma unroll 1
    for (int k = 0; k < rpt; ++k) {
      const int rl = team + k * kTeams;
      if (rl >= nr) break;
      const uint32_t seq = i0 + k, slot = seq & (D - 1), parity = (seq >> p.lg_D) & 1u;
      mbar_wait(full + slot, parity);
      uint32_t xr[K][W];
      const uint8_t *src = slots + slot * p.slot_bytes + col0 * kEs;
#pragma unroll
      for (int kk = 0; kk < K; ++kk)
        if (kExact || kk < nk) load_words<W>(src + kk * kNormLanes * kEs, xr[kk]);
      mbar_arrive(empty + slot);
      if (g == 0 && u == 0) {  // the slot's next row, once every thread of the team holds this one
        mbar_wait(empty + slot, parity);
        load_row(seq + D);
      }

      auto row_total = [&](auto term) -> float {
        float a[V];
#pragma unroll
        for (int i = 0; i < V; ++i) a[i] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < K; ++kk) {
          if (kExact || kk < nk) {
            float f[V];
            unpack_words<T, W, true>(xr[kk], f);
#pragma unroll
            for (int i = 0; i < V; ++i) a[i] = add(a[i], term(f[i]));
          }
        }
        return team_total(a);
      };
      float mu = 0.0f, second;
      if (layer) {
        mu = __fdiv_rn(row_total([](float v) { return v; }), count);
        second = row_total([mu](float v) {
          const float d = sub(v, mu);
          return mul(d, d);
        });
      } else {
        second = row_total([](float v) { return mul(v, v); });
      }
      const float rs = rsigma_of(second, count, p.eps);
      const int64_t r = r0 + rl;
      if (g == 0 && u == 0) {
        if (p.mu != nullptr) p.mu[r] = mu;
        if (p.rsigma != nullptr) p.rsigma[r] = rs;
      }
      const int64_t at = r * n + col0;
      uint8_t *tile_at = tile + rl * p.tile_stride + ((((col0 >> 2) ^ tile_swizzle(rl, p.lg_R)) << 2) | (col0 & 3));
#pragma unroll
      for (int kk = 0; kk < K; ++kk) {
        if (kExact || kk < nk) {
          const int c = col0 + kk * kNormLanes;
          float v[V], gm[V];
          unpack_words<T, W, true>(xr[kk], v);
          ldg_floats<T, V>(p.gamma, c, gm);
          if (layer) {
#pragma unroll
            for (int i = 0; i < V; ++i) v[i] = sub(v[i], mu);
          }
          if (zc) {
#pragma unroll
            for (int i = 0; i < V; ++i) gm[i] = add(1.0f, gm[i]);
          }
#pragma unroll
          for (int i = 0; i < V; ++i) v[i] = mul(mul(v[i], rs), gm[i]);
          if (has_beta) {
            float b[V];
            ldg_floats<T, V>(p.beta, c, b);
#pragma unroll
            for (int i = 0; i < V; ++i) v[i] = add(v[i], b[i]);
          }
          {
            float mm[V];
#pragma unroll
            for (int i = 0; i < V; ++i) mm[i] = fabsf(v[i]);
#pragma unroll
            for (int off = V / 2; off >= 1; off >>= 1) {
#pragma unroll
              for (int i = 0; i < off; ++i) mm[i] = max_nan(mm[i], mm[i + off]);
            }
            m = max_nan(m, mm[0]);
          }
          if (want_y) store_floats<V>(p.y, p.y_dtype, at + kk * kNormLanes, v);
          if constexpr (Fmt != kFmtNone) {
            uint32_t code[kCodeWords];
            if constexpr (Fmt == kFmtRuntime) {
              if (p.out_fmt == kFmtE4M3 || (p.out == nullptr && p.out_t_fmt == kFmtE4M3)) encode_v<kFmtE4M3, V>(v, s, code);
              else encode_v<kFmtE5M2, V>(v, s, code);
            } else {
              encode_v<Fmt, V>(v, s, code);
            }
            if (want_out) store_codes<V>(p.out + at + kk * kNormLanes, code);
            if (want_tile) store_codes<V>(tile_at + kk * kNormLanes, code);
          }
        }
      }
    }
    if (want_tile) {  // R bytes per column
      named_barrier(kTileBarrier, kRowThreads);
      if (R >= 16) write_out_t_blocks<16>(tile, p, r0, nr, threadIdx.x);
      else if (R == 8) write_out_t_blocks<8>(tile, p, r0, nr, threadIdx.x);
      else write_out_t_blocks<4>(tile, p, r0, nr, threadIdx.x);
      named_barrier(kTileBarrier, kRowThreads);
    }
  }

  if (p.amax != nullptr) {
    const uint32_t mb = warp_max_u32(__float_as_uint(m));
    if (u == 0) atomic_amax(p.amax, canonical_amax_bits(mb));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const float scale_inv = reciprocal_rn(s);
    if (p.out_scale_inv != nullptr) *p.out_scale_inv = scale_inv;
    if (p.out_t_scale_inv != nullptr) *p.out_t_scale_inv = scale_inv;
  }
#endif  // TE_NORM_SM90
}

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
  // One band on the vectorised kernel: it writes dgamma / dbeta (each nullable) itself, as the
  // finalize would (0 + the band's sum), and there is no partial and no second launch.
  bool direct;
  void *dgamma, *dbeta;
  DType dg_dtype, db_dtype;
  int64_t rows, n, rows_per_band, bands;
  bool layer, zero_centered;
  int G, kw;  // vectorised kernel: warps per row, chunks per warp
  int64_t chunks;
};

constexpr int kBwdCapVecs = 4;      // 16-byte vectors of x (and of dy) a thread holds per row
constexpr int kBandRows = 32;       // at least this many rows per band...
constexpr int64_t kMaxBands = 256;  // ...and at most this many bands (one wave at 2 CTAs per SM)

// The blocks past the bands run a carried scale update, one state each (NormBackwardArgs::
// then_update): its states are memory the backward never touches, and the amaxes it reads were
// completed by earlier launches.
__device__ __forceinline__ bool run_carried_update(const BwdParams &p, const CarriedUpdate &carried) {
  if (blockIdx.x < p.bands) return false;
  __shared__ uint32_t scratch[32];
  const UpdateItem &it = carried.chunk.item[blockIdx.x - p.bands];
  update_state(it, *it.amax, scratch);
  return true;
}

template <DType T>
__global__ void __launch_bounds__(kThreads, 2)
    norm_bwd_vec_kernel(const BwdParams p, const __grid_constant__ CarriedUpdate carried) {
  if (run_carried_update(p, carried)) return;
  constexpr int kCap = kBwdCapVecs / Vec8<T>::kVecs;
  extern __shared__ __align__(16) float fsmem[];
  const int warp = threadIdx.x >> 5, u = threadIdx.x & 31;
  const int G = p.G, teams = kWarps / G, team = warp / G, g = warp % G;
  const int64_t n = p.n;
  const int64_t col0 = static_cast<int64_t>(g) * p.kw * kNormLanes + 8 * u;  // as in the forward
  const int nk = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(p.kw), ceil_div_dev(n - col0, kNormLanes))));
  const bool want_dx = p.dx != nullptr, want_sums = p.partial != nullptr || p.direct;
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
      // The team's next row comes from DRAM while this one goes through the warps' chain of
      // sums (one warp at a time): its loads then wait on L2, not on DRAM. Registers for a
      // second row would cost the second block per SM.
      const int64_t next = r + teams;
      if (next < r_end) {
#pragma unroll
        for (int kk = 0; kk < kCap; ++kk) {
          if (kk >= nk) continue;
          prefetch8_l2<T>(p.x, next * n + col_of(kk));
          prefetch8_l2<T>(p.dy, next * n + col_of(kk));
        }
      }
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
      if (p.direct) {
        if (p.dgamma != nullptr) dev_store_from_float(p.dgamma, p.dg_dtype, c, add(0.0f, a));
        if (p.dbeta != nullptr) dev_store_from_float(p.dbeta, p.db_dtype, c, add(0.0f, b));
      } else {
        p.partial[blockIdx.x * n + c] = a;
        p.partial[(p.bands + blockIdx.x) * n + c] = b;
      }
    }
  }
}

// The generic backward: thread t is lane t and owns columns t, t + 256, ...; it accumulates their
// dgamma/dbeta sums in the band's partial rows directly (no other thread touches them).
template <DType T>
__global__ void __launch_bounds__(kThreads)
    norm_bwd_generic_kernel(const BwdParams p, const __grid_constant__ CarriedUpdate carried) {
  if (run_carried_update(p, carried)) return;
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
int smem_optin_budget() { return current_device_info().smem_optin - 1024; }

// Warps per row for a row of `chunks` 256-element chunks when a warp holds up to `cap` of them:
// the smallest power of two that covers the row, or 0 above 8 warps.
int warps_per_row(int64_t chunks, int cap) {
  for (int G = 1; G <= kWarps; G *= 2)
    if (static_cast<int64_t>(G) * cap >= chunks) return G;
  return 0;
}

int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// The streaming forward's shared memory: the teams' ring slots, the code tile, the teams' exchange
// and the 2 mbarriers of every slot.
size_t fwd_rows_smem(const FwdParams &p, int V) {
  const int teams = kRowWarps / (8 / V);
  return static_cast<size_t>(teams) * p.D * (p.slot_bytes + 2 * sizeof(uint64_t)) + static_cast<size_t>(p.tile_stride) * p.R +
         teams * 16 * sizeof(float);
}

// The ring's size: rows of x in flight per SM, enough to cover the memory latency at the SM's share
// of the bandwidth several times over. Rows wider than a team's share take teams of more warps.
constexpr int64_t kFwdRingBytes = 64 * 1024;
// The code tile's size: R = 128, 64, ... rows while R * n bytes exceed it (R >= 4).
constexpr int64_t kFwdTileBytes = 128 * 1024;
// Fewer rows than this and out_t is written by transpose_codes instead (16-byte stores per column
// of a 16-row tile wrote at 0.29 of a copy on the H200).
constexpr int kMinCodeTileRows = 32;

int lg2(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return l;
}

// Fills the streaming kernel's layout into p and returns its V (lanes per thread: 8, 4 or 2), or 0
// when it cannot take these arguments (then the generic kernel does).
int plan_fwd_rows(const NormForwardArgs &a, FwdParams &p) {
  const DType t = a.x.dtype;
  if (p.rows < 1 || p.n < 1 || p.n % 8 != 0 || current_device_info().major < 9) return 0;
  if (a.gamma.dtype != t || (a.beta.data != nullptr && a.beta.dtype != t)) return 0;
  if (p.out != nullptr && p.out_t != nullptr && p.out_fmt != p.out_t_fmt) return 0;
  if (!aligned_to(p.x, 16) || !aligned_to(p.gamma, 16) || !aligned_to(p.beta, 16) || !aligned_to(p.y, 16) ||
      !aligned_to(p.out, 8))
    return 0;
  const int es = t == DType::F32 ? 4 : 2;
  const int64_t chunks = ceil_div(p.n, kNormLanes);
  const int64_t row_bytes = p.n * es, slot_bytes = round_up(row_bytes, 128);
  // V: the most lanes per thread (the fewest warps per row) such that a thread holds the row in 64
  // registers and the teams' slots (one row each) stay within kFwdRingBytes, if some V allows.
  int V = 0;
  for (int v = 8; v >= 2; v /= 2) {
    if (chunks > 64 / (v * es / 4)) continue;
    V = v;
    if ((kRowWarps / (8 / v)) * slot_bytes <= kFwdRingBytes) break;
  }
  if (V == 0) return 0;
  const int64_t teams = kRowWarps / (8 / V), slot_cost = slot_bytes + 2 * sizeof(uint64_t);
  const int64_t budget = smem_optin_budget() - teams * 16 * 4;
  int64_t stride = 0, R = 32;
  if (p.out_t != nullptr) {
    stride = round_up(p.n, 128);
    R = 128;
    while (R >= 4 && R * stride > std::min(kFwdTileBytes, budget - teams * slot_cost)) R /= 2;
    if (R < 4) return 0;
  }
  if (teams * slot_cost + R * stride > budget) return 0;
  int64_t D = 1;  // slots per team: more while they fit and the ring is under kFwdRingBytes
  while (D < 4 && teams * 2 * D * slot_cost + R * stride <= budget && teams * 2 * D * slot_bytes <= kFwdRingBytes) D *= 2;
  p.R = static_cast<int>(R);
  p.D = static_cast<int>(D);
  p.lg_R = lg2(R);
  p.lg_D = lg2(D);
  p.lg_rpt = R > teams ? lg2(R / teams) : 0;
  p.row_bytes = static_cast<int>(row_bytes);
  p.slot_bytes = static_cast<int>(slot_bytes);
  p.tile_stride = static_cast<int>(stride);
  p.tiles = ceil_div(p.rows, R);
  p.out_t_vec = p.out_t != nullptr && aligned_to(p.out_t, 16) && p.rows % std::min<int64_t>(R, 16) == 0;
  return V;
}

// One CTA per SM while tiles last. The occupancy query is device_info's cached cluster one (with a
// cluster of one CTA); the launch itself is a plain one, through the driver, since every CTA on
// sm_90 is its own cluster of one without the attribute.
template <DType T, int V, int K, bool kExact, int Fmt>
void launch_fwd_rows(FwdParams p, cudaStream_t stream) {
  auto kernel = norm_fwd_rows_kernel<T, V, K, kExact, Fmt>;
  const size_t smem = fwd_rows_smem(p, V);
  allow_dynamic_smem(kernel, smem);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.blockDim = dim3(kRowThreads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(1, 1, 1);
  int64_t ctas = std::min<int64_t>(p.tiles, max_active_clusters(reinterpret_cast<const void *>(kernel), cfg));
  if (ctas < 1) ctas = std::min<int64_t>(p.tiles, current_device_info().sm_count);
  launch_kernel<norm_fwd_rows_kernel<T, V, K, kExact, Fmt>>(dim3(static_cast<unsigned>(ctas)), cfg.blockDim, smem, stream,
                                                             p);
}

template <DType T, int V, int K, bool kExact>
void launch_fwd_rows_fmt(const FwdParams &p, int fmt, cudaStream_t stream) {
  if constexpr (kExact) {
    if (fmt == kFmtE4M3) launch_fwd_rows<T, V, K, true, kFmtE4M3>(p, stream);
    else launch_fwd_rows<T, V, K, true, kFmtE5M2>(p, stream);
  } else {
    if (fmt == kFmtNone) launch_fwd_rows<T, V, K, false, kFmtNone>(p, stream);
    else launch_fwd_rows<T, V, K, false, kFmtRuntime>(p, stream);
  }
}

// 16-bit rows whose threads all hold exactly K chunks (hidden 2048, 4096, 8192 and 14336) take
// kernels without the bounds checks of partial rows, one per format; any other row takes the
// checked kernel of its V (its FP8 format read at run time).
template <DType T, int V>
void dispatch_fwd_fmt(const FwdParams &p, int fmt, cudaStream_t stream) {
  constexpr int kEs = T == DType::F32 ? 4 : 2;
  constexpr int kMaxK = 64 / (V * kEs / 4);
  const int64_t chunks = p.n % kNormLanes == 0 ? p.n / kNormLanes : 0;
  if constexpr (kEs == 2) {
    if (fmt != kFmtNone) {
      if constexpr (V == 8) {
        if (chunks == 8) return launch_fwd_rows_fmt<T, 8, 8, true>(p, fmt, stream);
      } else if constexpr (V == 4) {
        if (chunks == 16) return launch_fwd_rows_fmt<T, 4, 16, true>(p, fmt, stream);
      } else {
        if (chunks == 32) return launch_fwd_rows_fmt<T, 2, 32, true>(p, fmt, stream);
        if (chunks == 56) return launch_fwd_rows_fmt<T, 2, 56, true>(p, fmt, stream);
      }
    }
  }
  launch_fwd_rows_fmt<T, V, kMaxK, false>(p, fmt, stream);
}

template <DType T>
void dispatch_fwd_v(const FwdParams &p, int V, int fmt, cudaStream_t stream) {
  switch (V) {
    case 8: dispatch_fwd_fmt<T, 8>(p, fmt, stream); return;
    case 4: dispatch_fwd_fmt<T, 4>(p, fmt, stream); return;
    default: dispatch_fwd_fmt<T, 2>(p, fmt, stream); return;
  }
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
  int V = plan_fwd_rows(a, p);
  // A code tile of fewer than kMinCodeTileRows rows: `out` here, out_t from it afterwards (see the
  // top of this file). The kernel still writes out_t's scale_inv.
  uint8_t *out_t_after = nullptr;
  if (V != 0 && p.out_t != nullptr && p.out != nullptr && p.R < kMinCodeTileRows) {
    FwdParams q = p;
    q.out_t = nullptr;
    if (const int Vq = plan_fwd_rows(a, q)) {
      out_t_after = p.out_t;
      p = q;
      V = Vq;
    }
  }
  if (V != 0) {
    const int fmt = p.out != nullptr ? p.out_fmt : p.out_t_fmt;
    switch (t) {
      case DType::F32: dispatch_fwd_v<DType::F32>(p, V, fmt, stream); break;
      case DType::F16: dispatch_fwd_v<DType::F16>(p, V, fmt, stream); break;
      default: dispatch_fwd_v<DType::BF16>(p, V, fmt, stream); break;
    }
  } else {
    p.R = kGenericRows;
    p.out_t_vec = p.out_t != nullptr && aligned_to(p.out_t, 16) && p.rows % kGenericRows == 0;
    // At least one block: it writes scale_inv (and folds amax 0) for an empty tensor too.
    const int64_t blocks = ceil_div(p.rows, kGenericRows);
    const unsigned grid = static_cast<unsigned>(blocks < 1 ? 1 : blocks);
    switch (t) {
      case DType::F32: launch_kernel<norm_fwd_generic_kernel<DType::F32>>(grid, kThreads, 0, stream, p); break;
      case DType::F16: launch_kernel<norm_fwd_generic_kernel<DType::F16>>(grid, kThreads, 0, stream, p); break;
      default: launch_kernel<norm_fwd_generic_kernel<DType::BF16>>(grid, kThreads, 0, stream, p); break;
    }
  }
  if (out_t_after != nullptr) transpose_codes(p.out, out_t_after, p.rows, p.n, stream);
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

// At most kBandRows rows on the vectorised kernel (a small batch, where launches are the cost):
// one band, whose sums are dgamma / dbeta.
bool writes_param_grads_directly(const NormBackwardArgs &a, BwdParams p) {
  return wants_param_grads(a) && p.rows > 0 && p.bands == 1 && plan_bwd_vec(a, p);
}

}  // namespace

size_t norm_backward_scratch_bytes(const NormBackwardArgs &a) {
  if (!wants_param_grads(a)) return 0;
  const BwdParams p = bwd_params(a);
  if (writes_param_grads_directly(a, p)) return 0;
  return static_cast<size_t>(2 * p.bands * p.n) * sizeof(float);
}

void norm_backward(Backend &be, const NormBackwardArgs &a, cudaStream_t stream) {
  BwdParams p = bwd_params(a);
  // The carried update rides on the band kernel's launch; where none is launched (nothing to
  // compute, or more items than a launch carries), it is launched on its own after the backward.
  CarriedUpdate carried;
  carried.count = 0;
  const bool carry = a.then_update_count > 0 && a.then_update_count <= kCarriedUpdateItems;
  bool carried_away = false;
  const bool grads = wants_param_grads(a);
  if (p.n > 0 && (p.dx != nullptr || grads)) {
    p.direct = writes_param_grads_directly(a, p);
    p.dgamma = a.dgamma.data, p.dg_dtype = a.dgamma.data != nullptr ? a.dgamma.dtype : DType::F32;
    p.dbeta = a.dbeta.data, p.db_dtype = a.dbeta.data != nullptr ? a.dbeta.dtype : DType::F32;
    Buffer partial;
    if (grads && !p.direct) partial = Buffer(&be, norm_backward_scratch_bytes(a));
    p.partial = partial.floats();
    if (p.rows > 0) {
      if (carry) carried.count = fill_chunk(carried.chunk, a.then_update, a.then_update_count);
      const unsigned grid = static_cast<unsigned>(p.bands + carried.count);
      const DType t = a.x.dtype;
      if (plan_bwd_vec(a, p)) {
        const int teams = kWarps / p.G;
        const size_t smem = ((grads ? 2 * teams * static_cast<size_t>(p.n) : 0) +
                             (p.G > 1 ? static_cast<size_t>(teams) * 2 * kNormLanes + 2 * kWarps : 0)) *
                            sizeof(float);
        switch (t) {
          case DType::F32:
            allow_dynamic_smem(norm_bwd_vec_kernel<DType::F32>, smem);
            launch_kernel<norm_bwd_vec_kernel<DType::F32>>(grid, kThreads, smem, stream, p, carried);
            break;
          case DType::F16:
            allow_dynamic_smem(norm_bwd_vec_kernel<DType::F16>, smem);
            launch_kernel<norm_bwd_vec_kernel<DType::F16>>(grid, kThreads, smem, stream, p, carried);
            break;
          default:
            allow_dynamic_smem(norm_bwd_vec_kernel<DType::BF16>, smem);
            launch_kernel<norm_bwd_vec_kernel<DType::BF16>>(grid, kThreads, smem, stream, p, carried);
            break;
        }
      } else {
        switch (t) {
          case DType::F32: launch_kernel<norm_bwd_generic_kernel<DType::F32>>(grid, kThreads, 0, stream, p, carried); break;
          case DType::F16: launch_kernel<norm_bwd_generic_kernel<DType::F16>>(grid, kThreads, 0, stream, p, carried); break;
          default: launch_kernel<norm_bwd_generic_kernel<DType::BF16>>(grid, kThreads, 0, stream, p, carried); break;
        }
      }
      carried_away = carried.count > 0;
    } else if (grads) {
      // No rows: the sums are zero.
      TE_CUDA_CHECK(cudaMemsetAsync(p.partial, 0, norm_backward_scratch_bytes(a), stream));
    }
    if (grads && !p.direct) {
      const unsigned grid = static_cast<unsigned>(ceil_div(p.n, 32));
      launch_kernel<norm_bwd_finalize_kernel>(grid, kThreads, 0, stream, p.partial, p.bands, p.n, a.dgamma.data,
          a.dgamma.dtype, a.dbeta.data, a.dbeta.dtype);
    }
  }
  if (a.then_update_count > 0 && !carried_away) scale_update(a.then_update, a.then_update_count, nullptr, stream);
}

}  // namespace te::cuda
