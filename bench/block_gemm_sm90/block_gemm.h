// An experiment toward issue 15's target 2: libte's own block-scaled FP8 GEMM for Hopper (sm_90a),
// D[m, n] = A[m, k] B[n, k]^T (+ bias), A scaled 1x128 (one fp32 dequantization factor per row and
// 128 of k) and B 128x128, read in libte's scale layouts as they are (cuBLASLt needs both
// rearranged: two launches and two allocations per GEMM in lt_gemm.cpp).
//
// Not wired into libte: on the H200 it runs at 0.91-1.06x the speed of cuBLASLt's block-scaled
// kernel (bench/RESULTS.md, "Eleventh session"): a regression on some benchmark shapes, so libte
// keeps cuBLASLt. It lives here, with its checks and its peer (main.cu), as the base for the next
// attempt.
//
// Design: persistent CTAs of 384 threads walk 128x128 output tiles in groups of 16 row blocks
// (L2 reuse). A producer warp issues TMA loads of A's and B's 128x128 FP8 tiles (128-byte
// swizzle) into a 5-stage ring (4 with fp32 output); a second producer warp copies the stage's
// 128 A scales and one B scale with cp.async, its arrival on the stage's barrier made when they
// land. Two consumer warpgroups run WGMMA m64n128k32 over their 64 rows, each 128-deep block of
// k into one of two partial accumulators in turn, and fold the finished one into the result with
// its block's scales (a[row] * b) while the tensor cores run the next. The tile leaves through a
// swizzled shared-memory strip and a TMA store that overlaps the next tile's blocks.
//
// The cluster variant (BlockGemmArgs::cluster): the same CTAs in clusters of two, which walk pairs
// of row blocks (2 p, 2 p + 1) of one column block. Each CTA loads its own A tile and one half (64
// rows) of the shared B tile, multicast to both, so B crosses from L2 once per pair; a stage is
// refilled only when the consumers of both CTAs have freed it (a spare producer warp in each CTA
// forwards its consumers' release to both CTAs' barriers). Six stages (five with fp32 output),
// the output tile staged in two halves to make room. On the H200 it runs at only 0.80-0.88x the
// per-CTA kernel's speed: its consumers wait longer for full stages while its producers find the
// ring full, so stages take longer to land (not understood yet).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace block_gemm_sm90 {

enum class DType : int { F32, F16, BF16, E4M3, E5M2 };

struct BlockGemmArgs {
  const void *a = nullptr, *b = nullptr;  // FP8 codes, rows contiguous: a [m, k], b [n, k]
  DType a_dtype = DType::E4M3, b_dtype = DType::E4M3;
  const float *a_scale_inv = nullptr;  // [m, ceil(k / 128)], row-major (libte's 1x128 layout)
  const float *b_scale_inv = nullptr;  // [ceil(n / 128), ceil(k / 128)] (libte's 128x128 layout)
  void *d = nullptr;                   // [m, n], rows contiguous
  DType d_dtype = DType::BF16;         // BF16, F16 or F32
  const void *bias = nullptr;          // [n] or null
  DType bias_dtype = DType::BF16;      // BF16, F16 or F32
  int64_t m = 0, n = 0, k = 0;
  bool cluster = false;  // the 2-CTA cluster kernel (B multicast to a pair of row blocks)
};

// Null when block_gemm can run `g` on a device of compute capability major.minor; otherwise why
// not: not an sm_90 device, a dtype it has no kernel for, a size it cannot take (k not a multiple
// of 16, or an output row not a multiple of 16 bytes: TMA's row strides; a dimension of 2^31 or more) or
// a pointer not 16-byte aligned.
const char *block_gemm_unsupported(const BlockGemmArgs &g, int major, int minor);

// Runs `g` (which block_gemm_unsupported accepted) on `stream` with at most sm_count CTAs (the
// cluster kernel: an even number, as many as the device can co-schedule in pairs).
// Throws std::runtime_error when a CUDA call fails.
void block_gemm(const BlockGemmArgs &g, int sm_count, cudaStream_t stream);

}  // namespace block_gemm_sm90
