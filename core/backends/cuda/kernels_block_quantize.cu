// Block quantization in one pass over x: a 128x128 tile per thread block (fp8_tile.cuh) is held
// in registers while its amaxes are reduced, then encoded straight to out and, through shared
// memory, to out_t.
//  - Block1x128: out has one scale per row and 128 columns (a reduction over the 8 threads that
//    share a row); out_t, x^T in its own 1x128 blocks, has one scale per column of x and 128 rows
//    (shuffles within a warp, then across the 8 warps through shared memory).
//  - Block128x128: one amax per tile, shared by out and out_t (whose tile grid is transposed).
// Scales: compute_scale_from_amax per block, scale_inv = 1 / scale, as the CPU reference.
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_tile.cuh"
#include "backends/cuda/kernels.h"

namespace te::cuda {

namespace {

struct BlockQuantizeParams {
  const void *x;
  uint8_t *out, *out_t;
  float *out_scale_inv, *out_t_scale_inv;
  int out_fmt, out_t_fmt;  // kFmtNone: not written
  bool power_of_2;
  float epsilon;
  int64_t rows, cols, tiles_c;
  bool aligned;
};

__device__ __forceinline__ float fmt_max(int fmt) { return fmt == kFmtE4M3 ? kE4M3Max : kE5M2Max; }

__device__ __forceinline__ float amax_float(uint32_t bits) { return __uint_as_float(canonical_amax_bits(bits)); }

template <DType T, ScalingMode Mode>
__global__ void __launch_bounds__(kTileThreads) block_quantize_kernel(const BlockQuantizeParams p) {
  __shared__ alignas(16) uint8_t smem_t[kTile * kTile];
  __shared__ uint32_t col_amax[kTileThreads / 32][kTile];
  __shared__ float col_scale[kTile];
  __shared__ uint32_t scratch[32];
  const TileCoords tc = tile_coords(p.tiles_c);
  const bool full = tile_is_full(tc, p.rows, p.cols, p.aligned);
  const int64_t row_blocks = (p.rows + kTile - 1) / kTile;
  const int64_t rb = tc.r0 / kTile, cb = tc.c0 / kTile;
  const int64_t r_first = tc.r0 + kRowsPerThread * tc.g, c_first = tc.c0 + kUnit * tc.u;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float f[kRowsPerThread][kUnit];
  load_tile_rows<T>(p.x, p.rows, p.cols, tc, full, f);

  // ---- amaxes and scales ----
  float row_scale[kRowsPerThread];  // out's scale for each of the thread's rows
  float tile_scale_t = 1.0f;        // out_t's scale (128x128)
  if constexpr (Mode == ScalingMode::Block1x128) {
    if (p.out_fmt != kFmtNone) {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        uint32_t m = row_abs_max(f[i]);
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 4));
        row_scale[i] = dev_compute_scale_from_amax(amax_float(m), fmt_max(p.out_fmt), p.power_of_2, p.epsilon);
        const int64_t r = r_first + i;
        if (tc.u == 0 && r < p.rows) p.out_scale_inv[r * p.tiles_c + cb] = reciprocal_rn(row_scale[i]);
      }
    }
    if (p.out_t_fmt != kFmtNone) {
#pragma unroll
      for (int j = 0; j < kUnit; ++j) {
        uint32_t m = 0;
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) m = max(m, abs_bits(f[i][j]));
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 8));
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 16));
        if (lane < 8) col_amax[warp][kUnit * tc.u + j] = m;
      }
      __syncthreads();
      if (threadIdx.x < kTile) {
        const int cl = threadIdx.x;
        uint32_t m = 0;
#pragma unroll
        for (int w = 0; w < kTileThreads / 32; ++w) m = max(m, col_amax[w][cl]);
        const float s = dev_compute_scale_from_amax(amax_float(m), fmt_max(p.out_t_fmt), p.power_of_2, p.epsilon);
        col_scale[cl] = s;
        if (tc.c0 + cl < p.cols) p.out_t_scale_inv[(tc.c0 + cl) * row_blocks + rb] = reciprocal_rn(s);
      }
      __syncthreads();
    }
  } else {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) m = max(m, row_abs_max(f[i]));
    const float amax = amax_float(block_max_u32(m, scratch));
    if (p.out_fmt != kFmtNone) {
      const float s = dev_compute_scale_from_amax(amax, fmt_max(p.out_fmt), p.power_of_2, p.epsilon);
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) row_scale[i] = s;
      if (threadIdx.x == 0) p.out_scale_inv[rb * p.tiles_c + cb] = reciprocal_rn(s);
    }
    if (p.out_t_fmt != kFmtNone) {
      tile_scale_t = dev_compute_scale_from_amax(amax, fmt_max(p.out_t_fmt), p.power_of_2, p.epsilon);
      if (threadIdx.x == 0) p.out_t_scale_inv[cb * row_blocks + rb] = reciprocal_rn(tile_scale_t);
    }
  }

  // ---- codes ----
  if (p.out_fmt != kFmtNone) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        w[q] = encode4_rt(p.out_fmt, __fmul_rn(f[i][4 * q], row_scale[i]), __fmul_rn(f[i][4 * q + 1], row_scale[i]),
                          __fmul_rn(f[i][4 * q + 2], row_scale[i]), __fmul_rn(f[i][4 * q + 3], row_scale[i]));
      }
      store_row_codes(p.out, p.rows, p.cols, r_first + i, c_first, full, w);
    }
  }
  if (p.out_t_fmt != kFmtNone) {
    float s[kUnit];
#pragma unroll
    for (int j = 0; j < kUnit; ++j) s[j] = Mode == ScalingMode::Block1x128 ? col_scale[kUnit * tc.u + j] : tile_scale_t;
    uint32_t wt[kRowsPerThread][4];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        wt[i][q] = encode4_rt(p.out_t_fmt, __fmul_rn(f[i][4 * q], s[4 * q]), __fmul_rn(f[i][4 * q + 1], s[4 * q + 1]),
                              __fmul_rn(f[i][4 * q + 2], s[4 * q + 2]), __fmul_rn(f[i][4 * q + 3], s[4 * q + 3]));
    stash_transposed(smem_t, tc, wt);
    __syncthreads();
    write_transposed(smem_t, p.out_t, p.rows, p.cols, tc, full);
  }
}

template <ScalingMode Mode>
void launch(DType t, const BlockQuantizeParams &p, unsigned grid, cudaStream_t stream) {
  switch (t) {
    case DType::F32: block_quantize_kernel<DType::F32, Mode><<<grid, kTileThreads, 0, stream>>>(p); return;
    case DType::F16: block_quantize_kernel<DType::F16, Mode><<<grid, kTileThreads, 0, stream>>>(p); return;
    default: block_quantize_kernel<DType::BF16, Mode><<<grid, kTileThreads, 0, stream>>>(p); return;
  }
}

}  // namespace

void block_quantize(Backend &be, const TensorView &x, ScalingMode mode, bool power_of_2, float epsilon,
                    TensorView *out, TensorView *out_t, cudaStream_t stream) {
  if (x.numel() == 0 || (out == nullptr && out_t == nullptr)) return;  // no blocks, no scales
  BlockQuantizeParams p;
  p.x = x.data;
  p.out = out != nullptr ? static_cast<uint8_t *>(out->data) : nullptr;
  p.out_t = out_t != nullptr ? static_cast<uint8_t *>(out_t->data) : nullptr;
  p.out_scale_inv = out != nullptr ? out->scale_inv : nullptr;
  p.out_t_scale_inv = out_t != nullptr ? out_t->scale_inv : nullptr;
  p.out_fmt = fmt_of(out);
  p.out_t_fmt = fmt_of(out_t);
  p.power_of_2 = power_of_2;
  p.epsilon = epsilon;
  p.rows = x.rows();
  p.cols = x.cols();
  p.tiles_c = (p.cols + kTile - 1) / kTile;
  p.aligned = tile_vectors_aligned(p.x, p.out, p.out_t, p.rows, p.cols);
  const unsigned grid = static_cast<unsigned>(p.tiles_c * ((p.rows + kTile - 1) / kTile));
  if (mode == ScalingMode::Block1x128) launch<ScalingMode::Block1x128>(x.dtype, p, grid, stream);
  else launch<ScalingMode::Block128x128>(x.dtype, p, grid, stream);
  TE_CUDA_CHECK_LAUNCH();
}

}  // namespace te::cuda
