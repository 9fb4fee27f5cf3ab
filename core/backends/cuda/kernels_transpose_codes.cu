// FP8 codes [rows, cols] -> their transpose [cols, rows], byte for byte, through the 128x128 tile
// machinery of fp8_tile.cuh: each thread loads its 4 rows' 16-byte units, stashes them in the
// swizzled tile and, after one barrier, writes 16-row x 4-column blocks of out_t as 16-byte stores.
//
// The norm forward's second half for wide rows (kernels_norm.cu): there a code tile in shared
// memory holds too few rows for full 16-byte out_t stores, and writing the row-major codes then
// transposing them here moves 5 bytes per element instead of 4 at close to copy speed.
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_tile.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {

namespace {

__global__ void __launch_bounds__(kTileThreads) transpose_codes_kernel(const uint8_t *in, uint8_t *out_t,
                                                                       int64_t rows, int64_t cols, int64_t tiles_c,
                                                                       bool aligned) {
  __shared__ alignas(16) uint8_t smem_t[kTile * kTile];
  const TileCoords tc = tile_coords(tiles_c);
  const bool full = tile_is_full(tc, rows, cols, aligned);
  const int64_t r = tc.r0 + kRowsPerThread * tc.g, c = tc.c0 + kUnit * tc.u;
  uint32_t w[kRowsPerThread][4];
  if (full) {
    uint4 v[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) v[i] = __ldcs(reinterpret_cast<const uint4 *>(in + (r + i) * cols + c));
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      w[i][0] = v[i].x;
      w[i][1] = v[i].y;
      w[i][2] = v[i].z;
      w[i][3] = v[i].w;
    }
  } else {
    // Bytes outside the tensor are zeros; write_transposed never stores them.
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t word = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int64_t cc = c + 4 * q + b;
          if (r + i < rows && cc < cols) word |= static_cast<uint32_t>(in[(r + i) * cols + cc]) << (8 * b);
        }
        w[i][q] = word;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) stash_row_codes(smem_t, tc, i, w[i]);
  __syncthreads();
  write_transposed(smem_t, out_t, rows, cols, tc, full);
}

}  // namespace

void transpose_codes(const uint8_t *in, uint8_t *out_t, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows < 1 || cols < 1) return;
  const int64_t tiles_c = (cols + kTile - 1) / kTile, tiles = (rows + kTile - 1) / kTile * tiles_c;
  const bool aligned = tile_vectors_aligned(in, nullptr, out_t, rows, cols);
  launch_kernel<transpose_codes_kernel>(static_cast<unsigned>(tiles), kTileThreads, 0, stream, in, out_t, rows, cols,
      tiles_c, aligned);
}

}  // namespace te::cuda
