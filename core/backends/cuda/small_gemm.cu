// LtGemm's route for small GEMMs (lt_gemm_kernels.h): one plain tiled kernel on the CUDA cores.
//
// Why: below a few million multiply-adds the device finishes a GEMM in a few microseconds, and
// cublasLtMatmul's own host work (about 6-7 us per call on an H100 host, measured beside a bare
// launch) costs more than the product. This kernel is one launch with its arguments by value: no
// descriptor, no workspace, no scale rearrangement (block scales are read in libte's layout), no
// scratch. Every operand is decoded exactly to fp32 and multiplied-added in fp32 in increasing k;
// block-scaled operands sum each 128-deep block first and add it times its two scales, as
// cuBLASLt's block-scaling modes do. The epilogue runs in cuBLASLt's order: product x scales,
// + old D, + bias, rounded once.
#include <cuda_runtime.h>

#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/lt_gemm_kernels.h"
#include "backends/cuda/kernel_launch.cuh"
#include "base/check.h"

namespace te::cuda {

namespace {

constexpr int kTile = 32;     // output tile kTile x kTile per block, k consumed kTile at a time
constexpr int kThreads = 256;  // 16 x 16 threads, each 2 x 2 outputs

// Scale of operand element (row, k-block kb): per-tensor, one per 1x128 block of each row, or
// one per 128x128 tile; cb = number of 128-wide k blocks.
__device__ __forceinline__ float block_scale(const float *s, ScalingMode mode, int64_t row, int64_t kb, int64_t cb) {
  switch (mode) {
    case ScalingMode::Block1x128: return s[row * cb + kb];
    case ScalingMode::Block128x128: return s[(row / 128) * cb + kb];
    default: return s[0];
  }
}

// The driver copies a kernel's whole parameter block at every launch, so a launch of few GEMMs
// (a layer's dgrad and wgrad) takes the small block.
constexpr int kFewGemms = 8;
template <int N>
struct SmallGemmBatch {
  SmallGemmArgs g[N];
};
static_assert(sizeof(SmallGemmBatch<kFewGemms>) <= 1024, "parameter blocks up to 1 KiB launch like an empty kernel");

// One launch runs every GEMM of the batch: blockIdx.z picks the GEMM (read in place from the
// parameter space: __grid_constant__ lets a dynamic index do that without a local copy), blocks
// past its tile grid return at once.
template <int N>
__global__ void __launch_bounds__(kThreads) small_gemm_kernel(const __grid_constant__ SmallGemmBatch<N> batch) {
  const SmallGemmArgs &p = batch.g[blockIdx.z];
  __shared__ float as[kTile][kTile + 1];  // [m in tile][k in tile]
  __shared__ float bs[kTile][kTile + 1];  // [n in tile][k in tile]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  // Tiles row-major over the GEMM's output, numbered along x (y would cap m at 65535 tiles).
  const int64_t tiles_n = (p.n + kTile - 1) / kTile, tile = blockIdx.x;
  const int64_t m0 = (tile / tiles_n) * kTile, n0 = (tile % tiles_n) * kTile;
  if (m0 >= p.m) return;
  const bool block = p.a_mode != ScalingMode::PerTensor || p.b_mode != ScalingMode::PerTensor;
  const int64_t cb = (p.k + 127) / 128;
  float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}}, part[2][2] = {{0.f, 0.f}, {0.f, 0.f}};

  for (int64_t k0 = 0; k0 < p.k; k0 += kTile) {
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, c = e % kTile;
      const int64_t i = m0 + r, j = n0 + r, kk = k0 + c;
      float av = 0.f, bv = 0.f;
      if (i < p.m && kk < p.k) av = dev_load_as_float(p.a, p.a_dtype, p.transa ? kk * p.m + i : i * p.k + kk);
      if (j < p.n && kk < p.k) bv = dev_load_as_float(p.b, p.b_dtype, p.transb ? j * p.k + kk : kk * p.n + j);
      as[r][c] = av;
      bs[r][c] = bv;
    }
    __syncthreads();
    for (int c = 0; c < kTile; ++c) {
      const float a0 = as[ty][c], a1 = as[ty + 16][c], b0 = bs[tx][c], b1 = bs[tx + 16][c];
      part[0][0] = __fmaf_rn(a0, b0, part[0][0]);
      part[0][1] = __fmaf_rn(a0, b1, part[0][1]);
      part[1][0] = __fmaf_rn(a1, b0, part[1][0]);
      part[1][1] = __fmaf_rn(a1, b1, part[1][1]);
    }
    __syncthreads();
    // A 128-deep block ends (or k does): fold its partial sums in with the block's two scales.
    const int64_t next = k0 + kTile;
    if (block && (next % 128 == 0 || next >= p.k)) {
      const int64_t kb = k0 / 128;
      for (int u = 0; u < 2; ++u)
        for (int v = 0; v < 2; ++v) {
          const int64_t i = m0 + ty + 16 * u, j = n0 + tx + 16 * v;
          if (i >= p.m || j >= p.n) continue;
          const float s = __fmul_rn(block_scale(p.a_scale, p.a_mode, i, kb, cb), block_scale(p.b_scale, p.b_mode, j, kb, cb));
          acc[u][v] = __fadd_rn(acc[u][v], __fmul_rn(part[u][v], s));
          part[u][v] = 0.f;
        }
    }
  }
  float scale = 1.0f;
  if (!block && p.a_scale) scale = __fmul_rn(p.a_scale[0], p.b_scale[0]);
  for (int u = 0; u < 2; ++u)
    for (int v = 0; v < 2; ++v) {
      const int64_t i = m0 + ty + 16 * u, j = n0 + tx + 16 * v;
      if (i >= p.m || j >= p.n) continue;
      float x = block ? acc[u][v] : __fmul_rn(part[u][v], scale);
      const int64_t o = i * p.n + j;
      if (p.accumulate) x = __fadd_rn(x, dev_load_as_float(p.d, p.d_dtype, o));
      if (p.bias) x = __fadd_rn(x, dev_load_as_float(p.bias, p.bias_dtype, j));
      dev_store_from_float(p.d, p.d_dtype, o, x);
    }
}

template <int N>
void launch(const SmallGemmArgs *args, int n, cudaStream_t stream) {
  SmallGemmBatch<N> batch{};
  int64_t tiles = 1;
  for (int i = 0; i < n; ++i) {
    batch.g[i] = args[i];
    tiles = std::max<int64_t>(tiles, ((args[i].m + kTile - 1) / kTile) * ((args[i].n + kTile - 1) / kTile));
  }
  const dim3 grid(static_cast<unsigned>(tiles), 1, static_cast<unsigned>(n));
  launch_kernel<small_gemm_kernel<N>>(grid, kThreads, 0, stream, batch);
}

}  // namespace

void small_gemm(const SmallGemmArgs *args, int n, cudaStream_t stream) {
  if (n < 1 || n > kMaxSmallGemms) fail(Status::Internal, "small_gemm: %d GEMMs (1..%d)", n, kMaxSmallGemms);
  if (n <= kFewGemms) launch<kFewGemms>(args, n, stream);
  else launch<kMaxSmallGemms>(args, n, stream);
}

}  // namespace te::cuda
