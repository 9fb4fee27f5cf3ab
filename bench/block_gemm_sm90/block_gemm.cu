// The block-scaled FP8 GEMM of block_gemm.h. Built for sm_90a only (WGMMA, TMA, setmaxnreg and
// cp.async.mbarrier are arch-specific features).
#include <cuda.h>  // CUtensorMap and its encoder's signature (called through the runtime)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "block_gemm.h"

namespace block_gemm_sm90 {

namespace {

constexpr int kBlockM = 128, kBlockK = 128;   // kBlockK: the scales' block along k
constexpr int kGroupM = 16;                   // row blocks walked together (L2 reuse)
constexpr int kMathThreads = 256;             // two consumer warpgroups
constexpr int kThreads = kMathThreads + 128;  // + the producer warpgroup

constexpr int kBlockN = 128;  // = the 128x128 scale block: one B scale per tile and k block
// The cluster kernel's pair of CTAs: row blocks 2 p and 2 p + 1 of one column block, each CTA
// loading one half (64 rows) of the shared B tile and multicasting it to both.
constexpr int kClusterCtas = 2;
constexpr int kBHalfRows = kBlockN / kClusterCtas;

// The ring takes what shared memory the output tile leaves: 5 stages with a 16-bit output, 4 with
// fp32 (each consumer holds two stages while it works on them; the rest are loading). The cluster
// kernel stages the tile in two passes of half its columns and takes one stage more, since its
// stages are refilled only when both CTAs have freed them (on the H200 the sixth stage measured
// no faster than five: the cluster kernel's loss lies elsewhere).
template <class Out, bool kCluster>
struct Smem {
  static constexpr int kStages = (sizeof(Out) == 4 ? 4 : 5) + (kCluster ? 1 : 0);
  static constexpr int kStrips = kBlockN * int(sizeof(Out)) / 128;     // 128-byte column strips of a tile
  static constexpr int kStagedStrips = kCluster ? kStrips / 2 : kStrips;  // of them in shared memory at once
  uint8_t a[kStages][kBlockM * kBlockK];  // each 1024-byte aligned: TMA's and WGMMA's 128-byte swizzle
  uint8_t b[kStages][kBlockN * kBlockK];
  // The output tile, as 128-byte-wide column strips of [kBlockM rows], 128-byte swizzled (the
  // accumulators' row-scattered stores hit distinct banks); each consumer owns its 64 rows.
  uint8_t d[kStagedStrips * kBlockM * 128];
  float a_scale[kStages][kBlockM];
  float b_scale[kStages];
  uint64_t full[kStages], empty[kStages];
  // Cluster: this CTA's consumers have freed the stage (forwarded to both CTAs' `empty`).
  uint64_t consumed[kCluster ? kStages : 1];
};

template <class Out, bool kCluster>
constexpr size_t smem_bytes() {
  return sizeof(Smem<Out, kCluster>) + 1024;  // + slack to align the dynamic buffer to 1024 bytes
}

// ---- PTX wrappers ----------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// An arrival on the barrier at bar's offset in CTA `cta` of this cluster (which may be this CTA).
// Default semantics (release at CTA scope), as CUTLASS's ClusterBarrier: the other CTA only
// overwrites B, whose WGMMA reads are complete once wgmma.wait_group returns. (`.release.cluster`
// put a cluster-wide fence before every arrival: made by the consumers, it halved the speed.)
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// 4 bytes global -> shared without holding the thread (zeros when !valid), and an arrival on
// `bar` made when this thread's copies so far have landed (counted in bar's expected arrivals).
__device__ __forceinline__ void copy_scale_async(float *dst, const float *src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void copies_arrive(uint64_t *bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, int x, int y, uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_addr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(smem_addr(bar))
      : "memory");
}

// tma_load into the same offset of every CTA of the cluster in cta_mask, counted by the barrier at
// bar's offset in each of them.
__device__ __forceinline__ void tma_load_multicast(void *dst, const CUtensorMap *map, int x, int y, uint64_t *bar,
                                                   uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;" ::"r"(smem_addr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(smem_addr(bar)), "h"(cta_mask)
      : "memory");
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// Every thread of the cluster that has not exited meets here (a CTA's barriers and shared memory
// stay valid for the other CTA until both have).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

__device__ __forceinline__ void tma_store(const CUtensorMap *map, const void *src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(map), "r"(x), "r"(y),
               "r"(smem_addr(src))
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Until every committed store has read its shared-memory source (it may still be writing).
__device__ __forceinline__ void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Generic-proxy writes to shared memory become visible to the TMA unit (the async proxy).
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <int kRegs>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// WGMMA shared-memory descriptor of a K-major tile of 128-byte rows, 128-byte swizzle: stride
// between 8-row groups 1024 bytes (the leading offset is unused by this layout).
__device__ __forceinline__ uint64_t wgmma_desc(const void *p) {
  const uint32_t addr = smem_addr(p);
  return (uint64_t{(addr & 0x3FFFF) >> 4}) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>  // wait until at most kPending of this warpgroup's WGMMA groups run
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// The compiler does not know WGMMA writes its registers asynchronously: this pins the reads of
// an accumulator after the wait that completes it.
__device__ __forceinline__ void fence_operands(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 fp32 per thread: a 64x128 accumulator over the warpgroup) = [d +] A (64x32) B^T (128x32),
// both operands K-major in shared memory.
#define TE_WGMMA_REGS8(i)                                                                                         \
  "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define TE_WGMMA_M64N128K32(TYPES)                                                                        \
  asm volatile(                                                                                           \
      "{\n"                                                                                               \
      ".reg .pred p;\n"                                                                                   \
      "setp.ne.b32 p, %66, 0;\n"                                                                          \
      "wgmma.mma_async.sync.aligned.m64n128k32.f32." TYPES                                                \
      " {"                                                                                                \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                            \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                  \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                  \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                    \
      "}, %64, %65, p, 1, 1;\n"                                                                           \
      "}\n"                                                                                               \
      : TE_WGMMA_REGS8(0), TE_WGMMA_REGS8(8), TE_WGMMA_REGS8(16), TE_WGMMA_REGS8(24), TE_WGMMA_REGS8(32), \
        TE_WGMMA_REGS8(40), TE_WGMMA_REGS8(48), TE_WGMMA_REGS8(56)                                        \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))
template <bool kAE5, bool kBE5>
__device__ __forceinline__ void wgmma_m64n128k32(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  if constexpr (!kAE5 && !kBE5) TE_WGMMA_M64N128K32("e4m3.e4m3");
  if constexpr (!kAE5 && kBE5) TE_WGMMA_M64N128K32("e4m3.e5m2");
  if constexpr (kAE5 && !kBE5) TE_WGMMA_M64N128K32("e5m2.e4m3");
  if constexpr (kAE5 && kBE5) TE_WGMMA_M64N128K32("e5m2.e5m2");
}
#undef TE_WGMMA_M64N128K32
#undef TE_WGMMA_REGS8

// ---- the kernel ------------------------------------------------------------------------------

// Tile t of the persistent walk: groups of kGroup row blocks (or, in the cluster kernel, pairs of
// them), column blocks inside a group.
template <int kGroup>
__device__ __forceinline__ void tile_of(int t, int m_blocks, int n_blocks, int &mb, int &nb) {
  const int per_group = kGroup * n_blocks;
  const int first = (t / per_group) * kGroup;
  const int size = min(m_blocks - first, kGroup);
  const int r = t % per_group;
  mb = first + r % size;
  nb = r / size;
}

enum BiasKind : int { kNoBias = 0, kBiasBF16 = 1, kBiasF16 = 2, kBiasF32 = 3 };

__device__ __forceinline__ float bias_at(const void *bias, int kind, int c) {
  switch (kind) {
    case kBiasBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16 *>(bias)[c]);
    case kBiasF16:
      return __half2float(static_cast<const __half *>(bias)[c]);
    case kBiasF32:
      return static_cast<const float *>(bias)[c];
    default:
      return 0.0f;
  }
}

template <class Out>
__device__ __forceinline__ void store_pair(uint8_t *p, float x, float y) {
  if constexpr (sizeof(Out) == 4) {
    *reinterpret_cast<float2 *>(p) = make_float2(x, y);
  } else if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(x, y);
  } else {
    *reinterpret_cast<__half2 *>(p) = __floats2half2_rn(x, y);
  }
}

// kCluster: launched in clusters of kClusterCtas, each walking pairs of row blocks with B shared.
template <class Out, bool kAE5, bool kBE5, bool kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    block_gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                      const __grid_constant__ CUtensorMap map_d, const float *__restrict__ a_scale_inv,
                      const float *__restrict__ b_scale_inv, const void *__restrict__ bias, int bias_kind, int m, int n,
                      int k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = Smem<Out, kCluster>;
  constexpr int kStages = S::kStages;
  constexpr uint32_t kStageBytes = (kBlockM + kBlockN) * kBlockK;
  extern __shared__ uint8_t smem_raw[];
  // Aligned by an offset from the __shared__ array itself, so the compiler still knows every
  // access through `s` is to shared memory (through an integer cast they became generic loads,
  // which wait on the long scoreboard).
  S &s = *reinterpret_cast<S *>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));

  const int m_blocks = (m + kBlockM - 1) / kBlockM, n_blocks = (n + kBlockN - 1) / kBlockN;
  const int k_blocks = (k + kBlockK - 1) / kBlockK;
  const int warpgroup = threadIdx.x / 128, lane = threadIdx.x % 32;
  // The walk: over row blocks, or over pairs of them (this CTA takes row block kCtas p + rank of
  // pair p; past the last row block it still loads its half of B and keeps the barriers, but
  // stores nothing). Both CTAs of a cluster walk the same tiles, so they meet every stage.
  constexpr int kCtas = kCluster ? kClusterCtas : 1;
  const int rank = kCluster ? int(cluster_rank()) : 0;
  const int tiles = (m_blocks + kCtas - 1) / kCtas * n_blocks;
  const int first_tile = blockIdx.x / kCtas, tile_step = gridDim.x / kCtas;
  auto tile_at = [&](int t, int &mb, int &nb) {
    tile_of<kGroupM / kCtas>(t, (m_blocks + kCtas - 1) / kCtas, n_blocks, mb, nb);
    mb = mb * kCtas + rank;
  };

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&s.full[i], 1 + 32);              // the TMA thread's expect_tx + the scale warp's 32 lanes
      if constexpr (kCluster) {
        mbar_init(&s.consumed[i], kMathThreads / 32);  // one arrival per consumer warp
        mbar_init(&s.empty[i], kClusterCtas);          // one per CTA, forwarded from `consumed`
      } else {
        mbar_init(&s.empty[i], kMathThreads / 32);  // one arrival per consumer warp
      }
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // The other CTA multicasts into this one's stages and arrives on its barriers: not before they exist.
  if constexpr (kCluster)
    cluster_sync();
  else
    __syncthreads();

  if (warpgroup == 2) {  // ---- producer: warp 0 issues TMA, warp 1 copies the scales (warp 2: below)
    regs_dec<40>();
    const int warp = (threadIdx.x / 32) % 4;
    int stage = 0;
    uint32_t phase = 0;
    if constexpr (kCluster) {
      // Warp 2 forwards each stage's release by this CTA's consumers to the empty barriers of
      // both CTAs, so that the consumers' path stays that of the per-CTA kernel (a local
      // arrival). Measured against the consumers arriving remotely themselves: the same speed
      // within the noise.
      if (warp == 2) {
        for (int t = first_tile; t < tiles; t += tile_step)
          for (int kb = 0; kb < k_blocks; ++kb) {
            mbar_wait(&s.consumed[stage], phase);
            if (lane < kClusterCtas) mbar_arrive_cluster(&s.empty[stage], lane);
            if (++stage == kStages) stage = 0, phase ^= 1;
          }
      }
      if (warp > 1) {
        cluster_sync();
        return;
      }
    } else {
      if (warp > 1) return;
    }
    for (int t = first_tile; t < tiles; t += tile_step) {
      int mb, nb;
      tile_at(t, mb, nb);
      // Cluster: the halves of B that hold rows (the second may lie past n), and this CTA's A
      // tile unless its row block is past m; both CTAs count the same B bytes.
      const bool a_rows = !kCluster || mb < m_blocks;
      const bool b_upper_rows = !kCluster || nb * kBlockN + kBHalfRows < n;
      const uint32_t stage_bytes =
          kCluster ? (a_rows ? kBlockM * kBlockK : 0) + (b_upper_rows ? 2 : 1) * kBHalfRows * kBlockK : kStageBytes;
      for (int kb = 0; kb < k_blocks; ++kb) {
        mbar_wait(&s.empty[stage], phase ^ 1);
        if (warp == 0) {
          if (lane == 0) {
            mbar_arrive_expect_tx(&s.full[stage], stage_bytes);
            if (a_rows) tma_load(s.a[stage], &map_a, kb * kBlockK, mb * kBlockM, &s.full[stage]);
            if constexpr (kCluster) {
              if (rank == 0 || b_upper_rows)
                tma_load_multicast(s.b[stage] + rank * kBHalfRows * kBlockK, &map_b, kb * kBlockK,
                                   nb * kBlockN + rank * kBHalfRows, &s.full[stage], (1u << kClusterCtas) - 1);
            } else {
              tma_load(s.b[stage], &map_b, kb * kBlockK, nb * kBlockN, &s.full[stage]);
            }
          }
        } else {
          // Asynchronous copies, so that this warp runs ahead like the TMA thread: each lane's
          // arrival on `full` is made when its copies land (a warp waiting for its loads would
          // deliver one stage per memory latency, slower than the tensor cores consume them).
          for (int i = lane; i < kBlockM; i += 32) {
            const int row = mb * kBlockM + i;
            const int64_t src = int64_t(row < m ? row : m - 1) * k_blocks + kb;
            copy_scale_async(&s.a_scale[stage][i], a_scale_inv + src, row < m);
          }
          if (lane == 0) copy_scale_async(&s.b_scale[stage], b_scale_inv + int64_t(nb) * k_blocks + kb, true);
          copies_arrive(&s.full[stage]);
        }
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
    if constexpr (kCluster) cluster_sync();
    return;
  }

  // ---- consumers: warpgroup w computes rows [64 w, 64 w + 64) of each tile. Each 128-deep block
  // of k goes into a partial accumulator of its own, two in turn, so that the tensor cores run
  // the next block while this warpgroup folds the last one into acc with its scales.
  regs_inc<232>();

  const int wt = threadIdx.x % 128;            // thread in the warpgroup
  const int row0 = (wt / 32) * 16 + lane / 4;  // this thread's rows row0 and row0 + 8 (of 64)
  const int col0 = (lane % 4) * 2;             // and columns col0 + 8 j + {0, 1}
  int stage = 0;                               // the stage of the next block to issue
  uint32_t phase = 0;
  float acc[64], part0[64], part1[64];
  uint8_t *d_half = s.d + warpgroup * 64 * 128;  // this warpgroup's 64 rows of each 128-byte strip
  constexpr int kStripCols = 128 / sizeof(Out);
  constexpr int kStripBytes = kBlockM * 128;

  // A block of k in flight: its stage and its scales for this thread's two rows.
  struct Block {
    int stage;
    float scale0, scale1;
  };
  // Waits for the next stage, starts its block of k into `part` and reads the block's scales
  // while the tensor cores run (they are needed only once `part` is complete).
  auto issue = [&](float(&part)[64]) {
    Block blk;
    blk.stage = stage;
    mbar_wait(&s.full[blk.stage], phase);
    if (++stage == kStages) stage = 0, phase ^= 1;
    const uint8_t *a_tile = s.a[blk.stage] + warpgroup * 64 * 128;
    const uint8_t *b_tile = s.b[blk.stage];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockK / 32; ++kk)
      wgmma_m64n128k32<kAE5, kBE5>(part, wgmma_desc(a_tile + kk * 32), wgmma_desc(b_tile + kk * 32), kk);
    wgmma_commit();
    const float b_scale = s.b_scale[blk.stage];
    blk.scale0 = s.a_scale[blk.stage][warpgroup * 64 + row0] * b_scale;
    blk.scale1 = s.a_scale[blk.stage][warpgroup * 64 + row0 + 8] * b_scale;
    return blk;
  };
  // Once `part` is complete: frees its stage and adds part x the block's scales to acc.
  auto fold = [&](float(&part)[64], const Block &blk) {
    fence_operands(part);
    __syncwarp();
    if (lane == 0) mbar_arrive(kCluster ? &s.consumed[blk.stage] : &s.empty[blk.stage]);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      acc[4 * j + 0] = fmaf(part[4 * j + 0], blk.scale0, acc[4 * j + 0]);
      acc[4 * j + 1] = fmaf(part[4 * j + 1], blk.scale0, acc[4 * j + 1]);
      acc[4 * j + 2] = fmaf(part[4 * j + 2], blk.scale1, acc[4 * j + 2]);
      acc[4 * j + 3] = fmaf(part[4 * j + 3], blk.scale1, acc[4 * j + 3]);
    }
  };

  for (int t = first_tile; t < tiles; t += tile_step) {
    int mb, nb;
    tile_at(t, mb, nb);
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    // Eight blocks per iteration, two in flight, drained at its end (measured 3-8% faster on the
    // smaller shapes than a loop that keeps two in flight across its back edge). With a branch
    // inside the loop and a group pending at the back edge, ptxas serialized every WGMMA (C7514).
    int kb = 0;
    for (; kb + 8 <= k_blocks; kb += 8) {
      Block st0 = issue(part0);
      Block st1 = issue(part1);
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        wgmma_wait<1>();
        fold(part0, st0);
        st0 = issue(part0);
        wgmma_wait<1>();
        fold(part1, st1);
        st1 = issue(part1);
      }
      wgmma_wait<1>();
      fold(part0, st0);
      wgmma_wait<0>();
      fold(part1, st1);
    }
    for (; kb < k_blocks; ++kb) {
      const Block st0 = issue(part0);
      wgmma_wait<0>();
      fold(part0, st0);
    }
    // Epilogue: through the strips and a TMA store, which runs while the next tile's blocks do;
    // the previous store must have read the strips before they are rewritten. In passes of
    // S::kStagedStrips strips (one pass, but for the cluster kernel's two).
    constexpr int kPasses = S::kStrips / S::kStagedStrips, kPassCols = 16 / kPasses;  // of the 16 column pairs
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      if (wt == 0) tma_store_wait_read();
      named_barrier(1 + warpgroup, 128);
#pragma unroll
      for (int j = pass * kPassCols; j < (pass + 1) * kPassCols; ++j) {
        const int c = 8 * j + col0;
        float bias0 = 0.0f, bias1 = 0.0f;
        if (bias_kind != kNoBias) {
          const int gc = nb * kBlockN + c;  // n is even: gc < n covers gc + 1
          if (gc < n) bias0 = bias_at(bias, bias_kind, gc), bias1 = bias_at(bias, bias_kind, gc + 1);
        }
        const int strip = c / kStripCols - pass * S::kStagedStrips, byte = (c % kStripCols) * int(sizeof(Out));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = row0 + 8 * h;
          uint8_t *p = d_half + strip * kStripBytes + r * 128 + (((byte / 16) ^ (r % 8)) * 16) + byte % 16;
          store_pair<Out>(p, acc[4 * j + 2 * h] + bias0, acc[4 * j + 2 * h + 1] + bias1);
        }
      }
      fence_async_smem();
      named_barrier(1 + warpgroup, 128);
      if (wt == 0) {
        const int y = mb * kBlockM + warpgroup * 64;
        if (y < m) {
#pragma unroll
          for (int strip = 0; strip < S::kStagedStrips; ++strip) {
            const int x = nb * kBlockN + (pass * S::kStagedStrips + strip) * kStripCols;
            if (x < n) tma_store(&map_d, d_half + strip * kStripBytes, x, y);
          }
        }
        tma_store_commit();
      }
    }
  }
  if (wt == 0) tma_store_wait_all();
  if constexpr (kCluster) cluster_sync();  // the other CTA's consumers may still arrive on this one's barriers
#endif
}

// ---- host side -------------------------------------------------------------------------------

void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

using EncodeTiled = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, found through the runtime once (libte links no libcuda).
EncodeTiled encoder() {
  static EncodeTiled fn = [] {
    void *p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found),
          "cudaGetDriverEntryPointByVersion");
    if (found != cudaDriverEntryPointSuccess || !p)
      throw std::runtime_error("the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A row-major [rows, cols] matrix of `elem` bytes per element, read or written in boxes of
// box_cols x box_rows through a 128-byte swizzle.
CUtensorMap tensor_map(const void *base, CUtensorMapDataType type, size_t elem, int64_t rows, int64_t cols,
                       int box_cols, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * elem};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encoder()(&map, type, 2, const_cast<void *>(base), dims, strides, box, element_strides,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ")");
  return map;
}

bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <class Out, bool kAE5, bool kBE5, bool kCluster>
void launch(const BlockGemmArgs &g, int sm_count, cudaStream_t stream) {
  const CUtensorMap map_a = tensor_map(g.a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, g.m, g.k, kBlockK, kBlockM);
  const CUtensorMap map_b =
      tensor_map(g.b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, g.n, g.k, kBlockK, kCluster ? kBHalfRows : kBlockN);
  constexpr CUtensorMapDataType d_type = sizeof(Out) == 4              ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                         : std::is_same_v<Out, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                       : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUtensorMap map_d = tensor_map(g.d, d_type, sizeof(Out), g.m, g.n, 128 / int(sizeof(Out)), 64);
  int bias_kind = kNoBias;
  if (g.bias) bias_kind = g.bias_dtype == DType::BF16 ? kBiasBF16 : g.bias_dtype == DType::F16 ? kBiasF16 : kBiasF32;
  auto *kernel = block_gemm_kernel<Out, kAE5, kBE5, kCluster>;
  constexpr size_t smem = smem_bytes<Out, kCluster>();
  static_assert(smem <= 227 * 1024, "more shared memory than an sm_90 CTA may have");
  static bool allowed = false;  // the opt-in above 48 KiB, once per kernel (one device: a benchmark)
  if (!allowed)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "cudaFuncSetAttribute"),
        allowed = true;
  const int64_t m_blocks = (g.m + kBlockM - 1) / kBlockM, n_blocks = (g.n + kBlockN - 1) / kBlockN;
  if constexpr (!kCluster) {
    const int64_t tiles = m_blocks * n_blocks;
    const int grid = static_cast<int>(tiles < sm_count ? tiles : sm_count);
    kernel<<<grid, kThreads, smem, stream>>>(map_a, map_b, map_d, g.a_scale_inv, g.b_scale_inv, g.bias, bias_kind,
                                             static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k));
    check(cudaGetLastError(), "block_gemm_kernel launch");
  } else {
    cudaLaunchAttribute cluster_dim{};
    cluster_dim.id = cudaLaunchAttributeClusterDimension;
    cluster_dim.val.clusterDim.x = kClusterCtas;
    cluster_dim.val.clusterDim.y = 1;
    cluster_dim.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(kClusterCtas);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = &cluster_dim;
    config.numAttrs = 1;
    // Not every SM may belong to a pair the GPU can co-schedule (GPCs of odd SM counts): ask.
    static int max_clusters = 0;  // once per kernel, like the opt-in
    if (!max_clusters)
      check(cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &config), "cudaOccupancyMaxActiveClusters");
    const int64_t pair_tiles = (m_blocks + kClusterCtas - 1) / kClusterCtas * n_blocks;
    int64_t clusters = sm_count / kClusterCtas;
    if (clusters > max_clusters) clusters = max_clusters;
    if (clusters > pair_tiles) clusters = pair_tiles;
    if (clusters < 1) throw std::runtime_error("block_gemm: no 2-CTA cluster fits on this device");
    config.gridDim = dim3(static_cast<unsigned>(clusters * kClusterCtas));
    check(cudaLaunchKernelEx(&config, kernel, map_a, map_b, map_d, g.a_scale_inv, g.b_scale_inv, g.bias, bias_kind,
                             static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k)),
          "block_gemm_kernel (cluster) launch");
  }
}

template <class Out, bool kCluster>
void launch_formats(const BlockGemmArgs &g, int sm_count, cudaStream_t stream) {
  const bool a5 = g.a_dtype == DType::E5M2, b5 = g.b_dtype == DType::E5M2;
  if (!a5 && !b5) launch<Out, false, false, kCluster>(g, sm_count, stream);
  if (!a5 && b5) launch<Out, false, true, kCluster>(g, sm_count, stream);
  if (a5 && !b5) launch<Out, true, false, kCluster>(g, sm_count, stream);
  if (a5 && b5) launch<Out, true, true, kCluster>(g, sm_count, stream);
}

template <bool kCluster>
void launch_outputs(const BlockGemmArgs &g, int sm_count, cudaStream_t stream) {
  switch (g.d_dtype) {
    case DType::BF16:
      launch_formats<__nv_bfloat16, kCluster>(g, sm_count, stream);
      break;
    case DType::F16:
      launch_formats<__half, kCluster>(g, sm_count, stream);
      break;
    default:
      launch_formats<float, kCluster>(g, sm_count, stream);
      break;
  }
}

}  // namespace

const char *block_gemm_unsupported(const BlockGemmArgs &g, int major, int minor) {
  if (major != 9 || minor != 0) return "not an sm_90 device";
  const auto fp8 = [](DType t) { return t == DType::E4M3 || t == DType::E5M2; };
  const auto wide = [](DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; };
  if (!fp8(g.a_dtype) || !fp8(g.b_dtype)) return "operands not FP8";
  if (!wide(g.d_dtype)) return "output not F32, F16 or BF16";
  if (g.bias && !wide(g.bias_dtype)) return "bias not F32, F16 or BF16";
  if (g.m < 1 || g.n < 1 || g.k < 1) return "an empty dimension";
  constexpr int64_t kMax = int64_t{1} << 31;
  if (g.m >= kMax || g.n >= kMax || g.k >= kMax) return "a dimension of 2^31 or more";
  // TMA: global row strides are multiples of 16 bytes, bases 16-byte aligned.
  if (g.k % 16 != 0) return "k not a multiple of 16";
  const int64_t out_bytes = g.d_dtype == DType::F32 ? 4 : 2;
  if (g.n * out_bytes % 16 != 0) return "an output row not a multiple of 16 bytes (TMA stores it)";
  if (!aligned16(g.a) || !aligned16(g.b) || !aligned16(g.d)) return "an operand not 16-byte aligned";
  if (!g.a_scale_inv || !g.b_scale_inv) return "missing scales";
  return nullptr;
}

void block_gemm(const BlockGemmArgs &g, int sm_count, cudaStream_t stream) {
  if (g.cluster)
    launch_outputs<true>(g, sm_count, stream);
  else
    launch_outputs<false>(g, sm_count, stream);
}

}  // namespace block_gemm_sm90
