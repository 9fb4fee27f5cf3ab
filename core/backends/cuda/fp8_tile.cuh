// The 128x128 tile machinery shared by cast_transpose and block_quantize.
//
// A block of 256 threads owns one 128x128 tile of x. Thread t holds rows 4*(t/8) .. +3 and
// columns 16*(t%8) .. +15 of the tile: per row, 16 elements = one 16-byte vector of FP8 codes.
// A warp's load instruction reads 4 rows x 256 contiguous bytes (BF16), its out stores 4 rows x
// 128 contiguous bytes.
//
// The transpose goes through shared memory as codes, row by row: each thread stores a row's 16
// codes (the 16-byte vector it also writes to out) to smem_t, a [128][128] byte array in x's
// orientation whose 16-byte units are XOR-swizzled by (row / 16) % 8, as soon as the row is
// encoded, so no thread holds its codes for out_t until the tile ends. After a barrier each
// thread reads a 16-row x 4-column block as 16 words, turns it into 4 column vectors with byte
// permutes and writes them to out_t: a warp's word reads hit 32 distinct banks, and 8 of its
// threads write 128 contiguous bytes of one out_t row.
#pragma once

#include "backends/cuda/fp8_convert.cuh"

namespace te::cuda {

constexpr int kTile = 128;
constexpr int kTileThreads = 256;
constexpr int kUnit = 16;  // elements per thread per row (one 16-byte vector of codes)
constexpr int kRowsPerThread = 4;

struct TileCoords {
  int64_t r0, c0;  // tile origin in x
  int g, u;        // thread's row group (rows 4g..4g+3) and column unit (cols 16u..16u+15)
};

// The coordinates of tile `bid` (row-major over tiles) for this thread.
__device__ __forceinline__ TileCoords tile_coords(int64_t tiles_c, int64_t bid = blockIdx.x) {
  TileCoords tc;
  tc.r0 = (bid / tiles_c) * kTile;
  tc.c0 = (bid % tiles_c) * kTile;
  tc.g = threadIdx.x >> 3;
  tc.u = threadIdx.x & 7;
  return tc;
}

// dst[i] = src for a run-time row index i (rows arrive from loops over the thread's rows), stored
// with constant indices: a dynamic index would move dst from registers to local memory.
template <class V, int N, int M>
__device__ __forceinline__ void set_row_at(V (&dst)[N][M], int i, const V (&src)[M]) {
#pragma unroll
  for (int k = 0; k < N; ++k)
#pragma unroll
    for (int j = 0; j < M; ++j)
      if (k == i) dst[k][j] = src[j];
}

// The 16-byte vectors of one unit, 16 consecutive elements p[i .. i+15] (16-byte aligned): the
// loads are issued by load() and used by unpack(), so that callers put several units' loads in
// flight before the first use.
template <DType T>
struct UnitVecs {
  static constexpr int kVecs = kUnit * sizeof(typename InType<T>::Storage) / 16;
  uint4 v[kVecs];
  __device__ __forceinline__ void load(const void *p, int64_t i) {
    const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const typename InType<T>::Storage *>(p) + i);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) v[k] = __ldg(src + k);
  }
  __device__ __forceinline__ void unpack(float *f) const {
#pragma unroll
    for (int k = 0; k < kVecs; ++k) unpack16<T>(v[k], &f[k * InType<T>::kPerVec]);
  }
};

// Calls row_fn(i, f) for each of the thread's 4 rows, f = its 16 elements as floats.
// full: the whole tile is in bounds and every vector is 16-byte aligned (checked by the launcher
// and the tile position): all 16-byte loads are issued before the first use. Otherwise element
// by element, one row at a time, with zeros outside the tensor (a zero never changes an amax).
template <DType T, class RowFn>
__device__ __forceinline__ void for_tile_rows(const void *x, int64_t rows, int64_t cols, const TileCoords &tc,
                                              bool full, RowFn &&row_fn) {
  const int64_t r = tc.r0 + kRowsPerThread * tc.g;
  const int64_t c = tc.c0 + kUnit * tc.u;
  if (full) {
    UnitVecs<T> raw[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) raw[i].load(x, (r + i) * cols + c);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      float f[kUnit];
      raw[i].unpack(f);
      row_fn(i, f);
    }
  } else {
#pragma unroll 1
    for (int i = 0; i < kRowsPerThread; ++i) {
      float f[kUnit];
#pragma unroll
      for (int j = 0; j < kUnit; ++j)
        f[j] = (r + i < rows && c + j < cols) ? load_scalar<T>(x, (r + i) * cols + c + j) : 0.0f;
      row_fn(i, f);
    }
  }
}

// The thread's 4 x 16 elements as loaded, unpacked to floats one row at a time where used: 16-bit
// inputs take 32 registers so, not 64 as floats (block quantization holds the whole tile across
// its amax reductions). Same `full` rule and zeros as for_tile_rows.
template <DType T>
struct TileRowsRaw {
  using Storage = typename InType<T>::Storage;
  UnitVecs<T> raw[kRowsPerThread];
  __device__ __forceinline__ void load(const void *x, int64_t rows, int64_t cols, const TileCoords &tc, bool full) {
    const int64_t r = tc.r0 + kRowsPerThread * tc.g;
    const int64_t c = tc.c0 + kUnit * tc.u;
    if (full) {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) raw[i].load(x, (r + i) * cols + c);
      return;
    }
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      Storage e[kUnit];
#pragma unroll
      for (int j = 0; j < kUnit; ++j)
        e[j] = (r + i < rows && c + j < cols) ? static_cast<const Storage *>(x)[(r + i) * cols + c + j] : Storage{};
      memcpy(raw[i].v, e, sizeof e);
    }
  }
  __device__ __forceinline__ void row(int i, float (&f)[kUnit]) const { raw[i].unpack(f); }
};

// Stores one row's 16 codes (4 packed words) to out[r, c .. c+15].
__device__ __forceinline__ void store_row_codes(uint8_t *out, int64_t rows, int64_t cols, int64_t r, int64_t c,
                                                bool full, const uint32_t (&w)[4]) {
  if (full) {
    *reinterpret_cast<uint4 *>(out + r * cols + c) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
  if (r >= rows) return;
#pragma unroll
  for (int j = 0; j < kUnit; ++j)
    if (c + j < cols) out[r * cols + c + j] = static_cast<uint8_t>(w[j >> 2] >> (8 * (j & 3)));
}

// Byte offset of (tile row rl, tile column cl) in the swizzled tile of codes.
__device__ __forceinline__ int smem_t_offset(int rl, int cl) {
  return rl * kTile + ((((cl >> 4) ^ (rl >> 4)) & 7) << 4) + (cl & 15);
}

// Stores the thread's row i of codes (w: columns 4q .. 4q+3 in word q) for out_t.
__device__ __forceinline__ void stash_row_codes(uint8_t *smem_t, const TileCoords &tc, int i, const uint32_t (&w)[4]) {
  *reinterpret_cast<uint4 *>(smem_t + smem_t_offset(kRowsPerThread * tc.g + i, kUnit * tc.u)) =
      make_uint4(w[0], w[1], w[2], w[3]);
}

// The calling thread's part of the tile of codes in smem_t, transposed: tile rows 16p .. 16p+15
// (p = t % 8) of tile columns 4k .. 4k+3 (k = t / 8), as v[j][m] = column 4k+j, rows 16p+4m .. +3
// (one 16-byte vector of out_t per column). Call after a barrier that follows every thread's
// stash_row_codes.
__device__ __forceinline__ void transposed_codes(const uint8_t *smem_t, uint32_t (&v)[4][4]) {
  const int p = threadIdx.x & 7, k = threadIdx.x >> 3;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = *reinterpret_cast<const uint32_t *>(smem_t + smem_t_offset(16 * p + 4 * m + i, 4 * k));
    // The 4 x 4 bytes (rows i, columns j) to 4 words of one column each.
    const uint32_t t0 = __byte_perm(w[0], w[1], 0x5140), t1 = __byte_perm(w[0], w[1], 0x7362);
    const uint32_t t2 = __byte_perm(w[2], w[3], 0x5140), t3 = __byte_perm(w[2], w[3], 0x7362);
    v[0][m] = __byte_perm(t0, t2, 0x5410);
    v[1][m] = __byte_perm(t0, t2, 0x7632);
    v[2][m] = __byte_perm(t1, t3, 0x5410);
    v[3][m] = __byte_perm(t1, t3, 0x7632);
  }
}

// Writes the tile of codes in smem_t transposed to out_t ([cols, rows]) (transposed_codes' rule).
__device__ __forceinline__ void write_transposed(const uint8_t *smem_t, uint8_t *out_t, int64_t rows, int64_t cols,
                                                 const TileCoords &tc, bool full) {
  const int p = threadIdx.x & 7, k = threadIdx.x >> 3;
  uint32_t v[4][4];
  transposed_codes(smem_t, v);
  const int64_t r = tc.r0 + 16 * p;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t c = tc.c0 + 4 * k + j;
    if (full) {
      *reinterpret_cast<uint4 *>(out_t + c * rows + r) = make_uint4(v[j][0], v[j][1], v[j][2], v[j][3]);
    } else if (c < cols) {
#pragma unroll
      for (int b = 0; b < 16; ++b)
        if (r + b < rows) out_t[c * rows + r + b] = static_cast<uint8_t>(v[j][b >> 2] >> (8 * (b & 3)));
    }
  }
}

// Max of |x| bits over the thread's 16 elements of one row.
__device__ __forceinline__ uint32_t row_abs_max(const float (&f)[kUnit]) {
  uint32_t m = 0;
#pragma unroll
  for (int j = 0; j < kUnit; ++j) m = max(m, abs_bits(f[j]));
  return m;
}

// The launcher's part of `full`: every vector of a full tile is 16-byte aligned.
inline bool tile_vectors_aligned(const void *x, const void *out, const void *out_t, int64_t rows, int64_t cols) {
  return aligned16(x) && (out == nullptr || aligned16(out)) && (out_t == nullptr || aligned16(out_t)) &&
         cols % kUnit == 0 && (out_t == nullptr || rows % kUnit == 0);
}

__device__ __forceinline__ bool tile_is_full(const TileCoords &tc, int64_t rows, int64_t cols, bool aligned) {
  return aligned && tc.r0 + kTile <= rows && tc.c0 + kTile <= cols;
}

// ---- column sums of a tile (a bias gradient fused into the cast of dy) ----
// Shared memory for tile_column_sums.
struct ColumnSumSmem {
  float warp[kTileThreads / 32][kTile];
};

// cs = the thread's sums over its 4 rows (in row order) of its 16 columns. The tile's 128 column
// sums, in a fixed order (rows 4g..4g+3 in a thread, then the 4 row groups of a warp pairwise,
// then the 8 warps in order), are stored as dbias partials: out[c] for the tile's columns c in
// bounds, in `dtype` (F32 partials, or the gradient itself when one tile spans every row).
__device__ __forceinline__ void tile_column_sums(float (&cs)[kUnit], const TileCoords &tc, int64_t cols,
                                                 ColumnSumSmem &sm, void *out, DType dtype) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < kUnit; ++j) {
    cs[j] = __fadd_rn(cs[j], __shfl_xor_sync(0xFFFFFFFFu, cs[j], 8));
    cs[j] = __fadd_rn(cs[j], __shfl_xor_sync(0xFFFFFFFFu, cs[j], 16));
  }
  if (lane < 8) {
#pragma unroll
    for (int j = 0; j < kUnit; ++j) sm.warp[warp][kUnit * tc.u + j] = cs[j];
  }
  __syncthreads();
  if (threadIdx.x < kTile && tc.c0 + threadIdx.x < cols) {
    float total = sm.warp[0][threadIdx.x];
#pragma unroll
    for (int w = 1; w < kTileThreads / 32; ++w) total = __fadd_rn(total, sm.warp[w][threadIdx.x]);
    dev_store_from_float(out, dtype, tc.c0 + threadIdx.x, total);
  }
}

}  // namespace te::cuda
