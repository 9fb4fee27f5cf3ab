// te_bench_copy_ceiling: what bandwidth a kernel on the SMs can reach for the cast + transpose's
// traffic (read 2 bytes, write 2 bytes per element), beside cudaMemcpyAsync in the same process.
// Issue 15's target 4 measures libte's cast against a device-to-device cudaMemcpyAsync; this
// program asks how close plain SM copies get to that copy, and tries other structures for the
// cast itself (replicas of libte's BF16 -> E4M3 + E4M3^T cast with amax, built on fp8_tile.cuh).
//
//   copy peers: a grid-stride 16-byte copy; 4 vectors per thread in flight (with and without
//               streaming cache hints); a bulk-copy (TMA) ring of 16-32 KiB chunks, one thread per
//               CTA.
//   cast replicas, each checked bit for bit against the first (out, out_t and amax):
//     tile/block   libte's structure: one 128 x 128 tile per CTA, 3 CTAs per SM
//     group G      the same, tiles walked in groups of G tile rows (column-major inside a group)
//     hints        the same with ld.global.nc.L1::no_allocate loads and st.global.cs stores
//     persistent   grid of 2 CTAs per SM, the next tile's loads in registers while one is cast
//     cp.async S   persistent, S tiles of x in flight through shared memory
//     bulk         x in, out and out_t out through the bulk-copy engine (shared memory staging)
//   diagnostics: the tile/block cast writing out only, out_t only, or nothing (reads alone).
//
// Run: te_bench_copy_ceiling [one]   (one: a single launch of each at 16384 x 14336, for ncu)
// 16384 x 4096 and 16384 x 14336 BF16, random values in [-4, 4); median of 7 x 20 launches, two
// rounds. Built for sm_90 (bulk copies and mbarrier transactions need sm_90).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda_exit_checks.h"
#include "backends/cuda/fp8_tile.cuh"

using namespace te;
using namespace te::cuda;

struct P {
  const void *x;
  const float *scale;
  float *amax;
  uint8_t *out, *out_t;
  int64_t rows, cols, tiles_c, tiles;
};

// One row's 16 elements: m takes their amax, w their E4M3 codes of f * s.
__device__ __forceinline__ void encode_row(const float (&f)[kUnit], float s, uint32_t &m, uint32_t (&w)[4]) {
  m = max(m, row_abs_max(f));
  float v[kUnit];
#pragma unroll
  for (int j = 0; j < kUnit; ++j) v[j] = __fmul_rn(f[j], s);
#pragma unroll
  for (int q = 0; q < 4; ++q) w[q] = encode4<kFmtE4M3>(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}

__device__ __forceinline__ void cast_tile_row(const P &p, uint8_t *smem, const TileCoords &tc, float s, uint32_t &m,
                                              int i, const float (&f)[kUnit]) {
  const int64_t r = tc.r0 + kRowsPerThread * tc.g + i, c = tc.c0 + kUnit * tc.u;
  uint32_t w[4];
  encode_row(f, s, m, w);
  *reinterpret_cast<uint4 *>(p.out + r * p.cols + c) = make_uint4(w[0], w[1], w[2], w[3]);
  stash_row_codes(smem, tc, i, w);
}

// tile/block: libte's cast structure (one tile per CTA). kGroup > 0: tiles walked in groups of kGroup tile rows,
// column-major inside a group (GEMM-style L2 / DRAM page locality for out_t).
template <int kMinBlocks, int kGroup>
__global__ void __launch_bounds__(256, kMinBlocks) v0(const __grid_constant__ P p) {
  __shared__ alignas(16) uint8_t smem_t[kTile * kTile];
  __shared__ uint32_t scratch[32];
  int64_t bid = blockIdx.x;
  if (kGroup > 0) {
    const int64_t tiles_r = p.tiles / p.tiles_c, per_group = kGroup * p.tiles_c;
    const int64_t first = (bid / per_group) * kGroup, size = min(tiles_r - first, int64_t(kGroup));
    const int64_t rem = bid % per_group;
    bid = (first + rem % size) * p.tiles_c + rem / size;
  }
  const TileCoords tc = tile_coords(p.tiles_c, bid);
  const float s = *p.scale;
  uint32_t m = 0;
  for_tile_rows<DType::BF16>(p.x, p.rows, p.cols, tc, true,
                             [&](int i, const float (&f)[kUnit]) { cast_tile_row(p, smem_t, tc, s, m, i, f); });
  __syncthreads();
  write_transposed(smem_t, p.out_t, p.rows, p.cols, tc, true);
  m = block_max_u32(m, scratch);
  if (threadIdx.x == 0) atomic_amax(p.amax, canonical_amax_bits(m));
}

// Diagnostics: the tile/block cast writing only out (kParts 1), only out_t (2), or nothing but amax (0).
template <int kParts>
__global__ void __launch_bounds__(256, 3) v0_parts(const __grid_constant__ P p) {
  __shared__ alignas(16) uint8_t smem_t[kTile * kTile];
  __shared__ uint32_t scratch[32];
  const TileCoords tc = tile_coords(p.tiles_c);
  const float s = *p.scale;
  uint32_t m = 0;
  for_tile_rows<DType::BF16>(p.x, p.rows, p.cols, tc, true, [&](int i, const float (&f)[kUnit]) {
    const int64_t r = tc.r0 + kRowsPerThread * tc.g + i, c = tc.c0 + kUnit * tc.u;
    uint32_t w[4];
    encode_row(f, s, m, w);
    if (kParts & 1) *reinterpret_cast<uint4 *>(p.out + r * p.cols + c) = make_uint4(w[0], w[1], w[2], w[3]);
    if (kParts & 2) stash_row_codes(smem_t, tc, i, w);
    if (kParts == 0 && (w[0] ^ w[1] ^ w[2] ^ w[3]) == 0x12345678u) m = 7;
  });
  if (kParts & 2) {
    __syncthreads();
    write_transposed(smem_t, p.out_t, p.rows, p.cols, tc, true);
  }
  m = block_max_u32(m, scratch);
  if (threadIdx.x == 0) atomic_amax(p.amax, canonical_amax_bits(m));
}

// A plain 16-byte copy of the same bytes (the kernel peer of cudaMemcpyAsync).
__global__ void __launch_bounds__(256) copyk(const uint4 *__restrict__ src, uint4 *__restrict__ dst, int64_t n16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n16; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __ldg(src + i);
}

// persistent: the next tile's loads in registers while this tile is cast.
template <int kMinBlocks>
__global__ void __launch_bounds__(256, kMinBlocks) v1(const __grid_constant__ P p) {
  __shared__ alignas(16) uint8_t smem_t[2][kTile * kTile];
  __shared__ uint32_t scratch[32];
  const float s = *p.scale;
  uint32_t m = 0;
  UnitVecs<DType::BF16> raw[kRowsPerThread];
  auto load = [&](int64_t t) {
    const TileCoords tc = tile_coords(p.tiles_c, t);
    const int64_t r = tc.r0 + kRowsPerThread * tc.g, c = tc.c0 + kUnit * tc.u;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) raw[i].load(p.x, (r + i) * p.cols + c);
  };
  int64_t t = blockIdx.x;
  if (t < p.tiles) load(t);
  int buf = 0;
  for (; t < p.tiles; t += gridDim.x, buf ^= 1) {
    const TileCoords tc = tile_coords(p.tiles_c, t);
    float f[kRowsPerThread][kUnit];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) raw[i].unpack(f[i]);
    if (t + gridDim.x < p.tiles) load(t + gridDim.x);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) cast_tile_row(p, smem_t[buf], tc, s, m, i, f[i]);
    __syncthreads();
    write_transposed(smem_t[buf], p.out_t, p.rows, p.cols, tc, true);
  }
  m = block_max_u32(m, scratch);
  if (threadIdx.x == 0) atomic_amax(p.amax, canonical_amax_bits(m));
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// cp.async: persistent, kStages tiles of x in flight through shared memory (each thread copies the
// 16-byte vectors it will read itself: no barrier for the ring).
template <int kStages, int kMinBlocks, int kTBufs>
__global__ void __launch_bounds__(256, kMinBlocks) v2(const __grid_constant__ P p) {
  extern __shared__ __align__(128) uint8_t dyn[];
  uint4 *ring = reinterpret_cast<uint4 *>(dyn);  // [kStages][8 vectors][256 threads]
  uint8_t *smem_t = dyn + kStages * 8 * 256 * 16;  // [2][128*128]
  __shared__ uint32_t scratch[32];
  const float s = *p.scale;
  uint32_t m = 0;
  auto issue = [&](int64_t t, int stage) {
    if (t < p.tiles) {
      const TileCoords tc = tile_coords(p.tiles_c, t);
      const int64_t r = tc.r0 + kRowsPerThread * tc.g, c = tc.c0 + kUnit * tc.u;
      const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const __nv_bfloat16 *>(p.x));
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
        for (int k = 0; k < 2; ++k)
          cp_async16(ring + (stage * 8 + 2 * i + k) * 256 + threadIdx.x, src + ((r + i) * p.cols + c) / 8 + k);
    }
    cp_commit();
  };
  int64_t t = blockIdx.x;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) issue(t + st * int64_t(gridDim.x), st);
  int stage = 0, buf = 0;
  for (; t < p.tiles; t += gridDim.x, buf ^= 1) {
    issue(t + (kStages - 1) * int64_t(gridDim.x), (stage + kStages - 1) % kStages);
    cp_wait<kStages - 1>();
    const TileCoords tc = tile_coords(p.tiles_c, t);
    uint8_t *st_t = smem_t + (kTBufs == 2 ? buf : 0) * kTile * kTile;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      float f[kUnit];
      unpack16<DType::BF16>(ring[(stage * 8 + 2 * i) * 256 + threadIdx.x], f);
      unpack16<DType::BF16>(ring[(stage * 8 + 2 * i + 1) * 256 + threadIdx.x], f + 8);
      cast_tile_row(p, st_t, tc, s, m, i, f);
    }
    __syncthreads();
    write_transposed(st_t, p.out_t, p.rows, p.cols, tc, true);
    if (kTBufs == 1) __syncthreads();
    if (++stage == kStages) stage = 0;
  }
  cp_wait<0>();
  m = block_max_u32(m, scratch);
  if (threadIdx.x == 0) atomic_amax(p.amax, canonical_amax_bits(m));
}

// hints: tile/block with streaming cache hints on the loads (no L1 allocation) and the stores (evict first).
__device__ __forceinline__ uint4 ld_stream(const void *p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ void st_stream(void *p, uint4 v) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__global__ void __launch_bounds__(256, 3) v3(const __grid_constant__ P p) {
  __shared__ alignas(16) uint8_t smem_t[kTile * kTile];
  __shared__ uint32_t scratch[32];
  const TileCoords tc = tile_coords(p.tiles_c);
  const float s = *p.scale;
  uint32_t m = 0;
  const int64_t r0 = tc.r0 + kRowsPerThread * tc.g, c0 = tc.c0 + kUnit * tc.u;
  uint4 raw[kRowsPerThread][2];
  const uint4 *src = static_cast<const uint4 *>(p.x);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
    for (int k = 0; k < 2; ++k) raw[i][k] = ld_stream(src + ((r0 + i) * p.cols + c0) / 8 + k);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    float f[kUnit];
    unpack16<DType::BF16>(raw[i][0], f);
    unpack16<DType::BF16>(raw[i][1], f + 8);
    uint32_t w[4];
    encode_row(f, s, m, w);
    st_stream(p.out + (r0 + i) * p.cols + c0, make_uint4(w[0], w[1], w[2], w[3]));
    stash_row_codes(smem_t, tc, i, w);
  }
  __syncthreads();
  // write_transposed with streaming stores.
  const int pp = threadIdx.x & 7, k = threadIdx.x >> 3;
  uint32_t v[4][4];
  transposed_codes(smem_t, v);
  const int64_t r = tc.r0 + 16 * pp;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t c = tc.c0 + 4 * k + j;
    st_stream(p.out_t + c * p.rows + r, make_uint4(v[j][0], v[j][1], v[j][2], v[j][3]));
  }
  m = block_max_u32(m, scratch);
  if (threadIdx.x == 0) atomic_amax(p.amax, canonical_amax_bits(m));
}

// Copy peers.
// 4 vectors per thread in flight, loads before stores.
template <bool kHints>
__global__ void __launch_bounds__(256) copy4(const uint4 *__restrict__ src, uint4 *__restrict__ dst, int64_t n16) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * 4;
  for (int64_t base = blockIdx.x * int64_t(blockDim.x) * 4 + threadIdx.x; base < n16; base += stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (base + k * 256 < n16) v[k] = kHints ? ld_stream(src + base + k * 256) : __ldg(src + base + k * 256);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (base + k * 256 < n16) {
        if (kHints) st_stream(dst + base + k * 256, v[k]);
        else dst[base + k * 256] = v[k];
      }
  }
}

__device__ __forceinline__ uint32_t saddr(const void *p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_wait_parity(uint64_t *bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nW_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W_%=;\n}\n" ::"r"(saddr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(saddr(dst)),
               "l"(src), "r"(bytes), "r"(saddr(bar))
               : "memory");
}
__device__ __forceinline__ void bulk_store(void *dst, const void *src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(saddr(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Bulk (TMA) copy, one thread per block, kStages chunks of kChunk bytes in a ring.
template <int kStages, int kChunk>
__global__ void __launch_bounds__(32) copy_tma(const uint8_t *src, uint8_t *dst, int64_t bytes) {
  extern __shared__ __align__(128) uint8_t dyn[];
  uint8_t *ring = dyn;
  __shared__ uint64_t full[kStages];
  if (threadIdx.x != 0) return;
  for (int i = 0; i < kStages; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[i])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const int64_t chunks = bytes / kChunk;
  int64_t c = blockIdx.x;
  auto load = [&](int64_t cc, int st) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(&full[st])), "r"(kChunk) : "memory");
    bulk_load(ring + st * kChunk, src + cc * kChunk, kChunk, &full[st]);
  };
  for (int st = 0; st < kStages && c + st * int64_t(gridDim.x) < chunks; ++st) load(c + st * int64_t(gridDim.x), st);
  uint32_t phase = 0;
  int st = 0;
  for (; c < chunks; c += gridDim.x) {
    mbar_wait_parity(&full[st], phase);
    bulk_store(dst + c * kChunk, ring + st * kChunk, kChunk);
    bulk_commit();
    const int64_t next = c + kStages * int64_t(gridDim.x);
    if (next < chunks) {
      bulk_wait_read<0>();  // this stage's store has read it
      load(next, st);
    }
    if (++st == kStages) st = 0, phase ^= 1;
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// bulk: tile/block with every global access through the bulk-copy engine: x's 128 rows (256 B each) in,
// out's and out_t's 128 rows (128 B each) out from shared memory.
__global__ void __launch_bounds__(256, 3) v4(const __grid_constant__ P p) {
  extern __shared__ __align__(128) uint8_t dyn[];
  uint8_t *sx = dyn;               // [128][256 B]
  uint8_t *sot = dyn;              // [128][128] out_t codes, once x has been read
  uint8_t *so = dyn + 32768;       // [128][128] out codes
  uint8_t *smem_t = dyn + 49152;   // [128][128] swizzled stash (x's orientation)
  __shared__ uint64_t full;
  __shared__ uint32_t scratch[32];
  const TileCoords tc = tile_coords(p.tiles_c);
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    if (lane == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(&full)), "r"(32768) : "memory");
    __syncwarp();
    const uint8_t *x = static_cast<const uint8_t *>(p.x);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int r = lane + 32 * k;
      bulk_load(sx + r * 256, x + ((tc.r0 + r) * p.cols + tc.c0) * 2, 256, &full);
    }
  }
  const float s = *p.scale;
  uint32_t m = 0;
  mbar_wait_parity(&full, 0);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int rl = kRowsPerThread * tc.g + i;
    const uint4 *row = reinterpret_cast<const uint4 *>(sx + rl * 256) + 2 * tc.u;
    const int sw = (tc.u >> 2) & 1;  // odd half-rows read their vectors in the other order: no bank conflicts
    const uint4 a = row[sw], b = row[sw ^ 1];
    float f[kUnit];
    unpack16<DType::BF16>(sw ? b : a, f);
    unpack16<DType::BF16>(sw ? a : b, f + 8);
    uint32_t w[4];
    encode_row(f, s, m, w);
    *reinterpret_cast<uint4 *>(so + rl * 128 + 16 * tc.u) = make_uint4(w[0], w[1], w[2], w[3]);
    stash_row_codes(smem_t, tc, i, w);
  }
  __syncthreads();
  {
    const int pp = threadIdx.x & 7, k = threadIdx.x >> 3;
    uint32_t v[4][4];
    transposed_codes(smem_t, v);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      *reinterpret_cast<uint4 *>(sot + (4 * k + j) * 128 + 16 * pp) = make_uint4(v[j][0], v[j][1], v[j][2], v[j][3]);
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x < 32) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int r = lane + 32 * k;
      bulk_store(p.out + (tc.r0 + r) * p.cols + tc.c0, so + r * 128, 128);
      bulk_store(p.out_t + (tc.c0 + r) * p.rows + tc.r0, sot + r * 128, 128);
    }
    bulk_commit();
  }
  m = block_max_u32(m, scratch);
  if (threadIdx.x == 0) atomic_amax(p.amax, canonical_amax_bits(m));
  if (threadIdx.x < 32) bulk_wait_read<0>();
}

__global__ void fill(uint16_t *x, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    const float u = (h & 0xFFFFFF) / 16777216.0f * 8.0f - 4.0f;
    x[i] = static_cast<uint16_t>(__float_as_uint(u) >> 16);
  }
}

int main(int argc, char **argv) {
  const bool one = argc > 1 && !strcmp(argv[1], "one");
  int sms = 0, major = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 9) {
    printf("SKIPPED: bulk copies need sm_90 or later (this device is sm_%d0)\n", major);
    return 0;
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int64_t cols : {4096, 14336}) {
    if (one && cols != 14336) continue;
    const int64_t rows = 16384, n = rows * cols;
    void *x, *cp;
    uint8_t *out[2], *out_t[2];
    float *scale, *amax;
    CK(cudaMalloc(&x, n * 2));
    CK(cudaMalloc(&cp, n * 2));
    for (int i = 0; i < 2; ++i) {
      CK(cudaMalloc(&out[i], n));
      CK(cudaMalloc(&out_t[i], n));
    }
    CK(cudaMalloc(&scale, 4));
    CK(cudaMalloc(&amax, 8));
    fill<<<1024, 256>>>(static_cast<uint16_t *>(x), n);
    CK(cudaGetLastError());
    const float sc = 37.0f;
    CK(cudaMemcpy(scale, &sc, 4, cudaMemcpyHostToDevice));
    P p{x, scale, amax, out[0], out_t[0], rows, cols, cols / kTile, (rows / kTile) * (cols / kTile)};
    struct Variant {
      const char *name;
      void (*run)(const P &, int sms);
      double bytes_per_element = 4;  // read + written (diagnostics move fewer)
    };
    const Variant variants[] = {
        {"cast tile/block", [](const P &q, int) { v0<3, 0><<<unsigned(q.tiles), 256>>>(q); }},
        {"cast tile/block, bound for 4/SM", [](const P &q, int) { v0<4, 0><<<unsigned(q.tiles), 256>>>(q); }},
        {"cast group 4", [](const P &q, int) { v0<3, 4><<<unsigned(q.tiles), 256>>>(q); }},
        {"cast group 16", [](const P &q, int) { v0<3, 16><<<unsigned(q.tiles), 256>>>(q); }},
        {"cast group 64", [](const P &q, int) { v0<3, 64><<<unsigned(q.tiles), 256>>>(q); }},
        {"cast persistent, regs", [](const P &q, int sms) { v1<2><<<unsigned(std::min<int64_t>(q.tiles, 2 * sms)), 256>>>(q); }},
        {"cast cp.async 4, 1/SM", [](const P &q, int sms) { v2<4, 1, 2><<<unsigned(std::min<int64_t>(q.tiles, sms)), 256, 4 * 32768 + 32768>>>(q); }},
        {"cast bulk in/out", [](const P &q, int) { v4<<<unsigned(q.tiles), 256, 65536>>>(q); }},
        {"cast hints", [](const P &q, int) { v3<<<unsigned(q.tiles), 256>>>(q); }},
    };
    CK(cudaFuncSetAttribute(v4, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    CK(cudaFuncSetAttribute(copy_tma<4, 32768>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 32768));
    CK(cudaFuncSetAttribute(copy_tma<6, 32768>, cudaFuncAttributeMaxDynamicSharedMemorySize, 6 * 32768));
    CK(cudaFuncSetAttribute(copy_tma<8, 16384>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 16384));
    CK(cudaFuncSetAttribute(v2<4, 1, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 32768 + 32768));
    // Every cast's bytes and amax equal the tile/block cast's.
    std::vector<uint8_t> ref(n), ref_t(n), got(n), got_t(n);
    float ref_amax = 0;
    for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; ++vi) {
      P q = p;
      q.out = out[vi ? 1 : 0];
      q.out_t = out_t[vi ? 1 : 0];
      CK(cudaMemset(amax, 0, 4));
      CK(cudaMemset(q.out, 0xAA, n));
      CK(cudaMemset(q.out_t, 0xAA, n));
      variants[vi].run(q, sms);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      float am;
      CK(cudaMemcpy(&am, amax, 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(vi ? got.data() : ref.data(), q.out, n, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(vi ? got_t.data() : ref_t.data(), q.out_t, n, cudaMemcpyDeviceToHost));
      if (vi == 0) {
        ref_amax = am;
        // Spot check: out_t is out's transpose.
        for (int64_t i = 0; i < 100000; ++i) {
          const int64_t r = (i * 7919) % rows, c = (i * 104729) % cols;
          if (ref[r * cols + c] != ref_t[c * rows + r]) {
            printf("tile/block cast: out_t is not out's transpose\n");
            return 1;
          }
        }
      } else if (am != ref_amax || memcmp(got.data(), ref.data(), n) || memcmp(got_t.data(), ref_t.data(), n)) {
        printf("%s: MISMATCH (amax %g vs %g)\n", variants[vi].name, am, ref_amax);
        return 1;
      }
    }
    printf("16384 x %lld: every cast matches the tile/block cast (amax %g)\n", (long long)cols, ref_amax);
    auto copy_kernel = [&] {
      copyk<<<unsigned(sms * 8), 256>>>(static_cast<const uint4 *>(x), static_cast<uint4 *>(cp), n * 2 / 16);
    };
    {
      std::vector<uint8_t> a(n * 2), b(n * 2);
      CK(cudaMemset(cp, 0, n * 2));
      copy_tma<6, 32768><<<unsigned(sms), 32, 6 * 32768>>>(static_cast<const uint8_t *>(x), static_cast<uint8_t *>(cp), n * 2);
      CK(cudaGetLastError());
      CK(cudaMemcpy(a.data(), x, n * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(b.data(), cp, n * 2, cudaMemcpyDeviceToHost));
      if (memcmp(a.data(), b.data(), n * 2)) {
        printf("bulk copy: MISMATCH\n");
        return 1;
      }
    }
    if (one) {
      copy_kernel();
      for (const Variant &v : variants) v.run(p, sms);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      return 0;
    }
    auto time = [&](auto &&f) {
      constexpr int kReps = 20;
      std::vector<float> ms;
      for (int rep = 0; rep < 7; ++rep) {
        CK(cudaEventRecord(e0));
        for (int i = 0; i < kReps; ++i) f();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t / kReps);
      }
      std::sort(ms.begin(), ms.end());
      return ms[3];
    };
    const Variant diags[] = {
        {"diag: out only", [](const P &q, int) { v0_parts<1><<<unsigned(q.tiles), 256>>>(q); }, 3},
        {"diag: out_t only", [](const P &q, int) { v0_parts<2><<<unsigned(q.tiles), 256>>>(q); }, 3},
        {"diag: reads only", [](const P &q, int) { v0_parts<0><<<unsigned(q.tiles), 256>>>(q); }, 2},
    };
    for (int round = 0; round < 2; ++round) {
      const float t_copy = time([&] { CK(cudaMemcpyAsync(cp, x, n * 2, cudaMemcpyDeviceToDevice)); });
      printf("  cudaMemcpyAsync %.4f ms (%.2f TB/s)\n", t_copy, 4.0 * n / t_copy / 1e9);
      const float t_copyk = time(copy_kernel);
      printf("  %-28s %.4f ms  %.3f of copy\n", "copy kernel", t_copyk, t_copy / t_copyk);
      const uint4 *s16 = static_cast<const uint4 *>(x);
      uint4 *d16 = static_cast<uint4 *>(cp);
      const int64_t n16 = n * 2 / 16;
      printf("  %-28s %.3f of copy\n", "copy kernel, 4 in flight", t_copy / time([&] { copy4<false><<<unsigned(sms * 8), 256>>>(s16, d16, n16); }));
      printf("  %-28s %.3f of copy\n", "same, hints", t_copy / time([&] { copy4<true><<<unsigned(sms * 8), 256>>>(s16, d16, n16); }));
      const uint8_t *s8 = static_cast<const uint8_t *>(x);
      uint8_t *d8 = static_cast<uint8_t *>(cp);
      printf("  %-28s %.3f of copy\n", "bulk copy 4 x 32K, 1/SM", t_copy / time([&] { copy_tma<4, 32768><<<unsigned(sms), 32, 4 * 32768>>>(s8, d8, n * 2); }));
      printf("  %-28s %.3f of copy\n", "bulk copy 6 x 32K, 1/SM", t_copy / time([&] { copy_tma<6, 32768><<<unsigned(sms), 32, 6 * 32768>>>(s8, d8, n * 2); }));
      printf("  %-28s %.3f of copy\n", "bulk copy 8 x 16K, 1/SM", t_copy / time([&] { copy_tma<8, 16384><<<unsigned(sms), 32, 8 * 16384>>>(s8, d8, n * 2); }));
      printf("  %-28s %.3f of copy\n", "bulk copy 4 x 32K, grid 2xSMs", t_copy / time([&] { copy_tma<4, 32768><<<unsigned(2 * sms), 32, 4 * 32768>>>(s8, d8, n * 2); }));
      CK(cudaGetLastError());
      for (const Variant &v : variants) {
        const float t = time([&] { v.run(p, sms); });
        CK(cudaGetLastError());
        printf("  %-28s %.4f ms  %.3f of copy\n", v.name, t, t_copy / t);
      }
      for (const Variant &v : diags) {
        const float t = time([&] { v.run(p, sms); });
        CK(cudaGetLastError());
        printf("  %-28s %.4f ms  %.2f TB/s (%.0f bytes per element)\n", v.name, t, v.bytes_per_element * n / t / 1e9,
               v.bytes_per_element);
      }
    }
    CK(cudaFree(x));
    CK(cudaFree(cp));
    for (int i = 0; i < 2; ++i) {
      CK(cudaFree(out[i]));
      CK(cudaFree(out_t[i]));
    }
    CK(cudaFree(scale));
    CK(cudaFree(amax));
  }
  return 0;
}
