// The 128x128 tile machinery shared by cast_transpose and block_quantize.
//
// A block of 256 threads owns one 128x128 tile of x. Thread t holds rows 4*(t/8) .. +3 and
// columns 16*(t%8) .. +15 of the tile: per row, 16 elements = one 16-byte vector of FP8 codes.
// A warp's load instruction reads 4 rows x 256 contiguous bytes (BF16), its out stores 4 rows x
// 128 contiguous bytes.
//
// The transpose goes through shared memory as codes: each thread turns its 4 rows x 4 columns
// byte blocks into 4 column words with byte permutes, and stores words to smem_t[col][row],
// a [128][128] byte array whose 16-byte units are XOR-swizzled by (col / 16) % 8. A warp's word
// stores then hit 32 distinct banks, and its 16-byte reads of one transposed row are
// conflict-free too. The transposed tile is written to out_t as 16-byte vectors, 128 contiguous
// bytes per out_t row.
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

// Byte offset of (tile column cl, tile row rl) in the swizzled transposed tile.
__device__ __forceinline__ int smem_t_offset(int cl, int rl) {
  return cl * kTile + ((((rl >> 4) ^ (cl >> 4)) & 7) << 4) + (rl & 15);
}

// Writes the thread's codes for out_t into smem_t: w[i][q] holds row i's columns 4q..4q+3.
__device__ __forceinline__ void stash_transposed(uint8_t *smem_t, const TileCoords &tc,
                                                 const uint32_t (&w)[kRowsPerThread][4]) {
  const int rl = kRowsPerThread * tc.g;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t t0 = __byte_perm(w[0][q], w[1][q], 0x5140);
    const uint32_t t1 = __byte_perm(w[0][q], w[1][q], 0x7362);
    const uint32_t t2 = __byte_perm(w[2][q], w[3][q], 0x5140);
    const uint32_t t3 = __byte_perm(w[2][q], w[3][q], 0x7362);
    const uint32_t col[4] = {__byte_perm(t0, t2, 0x5410), __byte_perm(t0, t2, 0x7632), __byte_perm(t1, t3, 0x5410),
                             __byte_perm(t1, t3, 0x7632)};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int cl = kUnit * tc.u + 4 * q + j;
      *reinterpret_cast<uint32_t *>(smem_t + smem_t_offset(cl, rl)) = col[j];
    }
  }
}

// Writes the transposed tile from smem_t to out_t ([cols, rows]); call after a barrier.
__device__ __forceinline__ void write_transposed(const uint8_t *smem_t, uint8_t *out_t, int64_t rows, int64_t cols,
                                                 const TileCoords &tc, bool full) {
#pragma unroll
  for (int k = 0; k < kTile * kTile / 16 / kTileThreads; ++k) {
    const int idx = threadIdx.x + k * kTileThreads;
    const int cl = idx >> 3, p = idx & 7;
    const uint4 v = *reinterpret_cast<const uint4 *>(smem_t + smem_t_offset(cl, 16 * p));
    const int64_t c = tc.c0 + cl, r = tc.r0 + 16 * p;
    if (full) {
      *reinterpret_cast<uint4 *>(out_t + c * rows + r) = v;
    } else if (c < cols) {
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int b = 0; b < 16; ++b)
        if (r + b < rows) out_t[c * rows + r + b] = static_cast<uint8_t>(w[b >> 2] >> (8 * (b & 3)));
    }
  }
}

// wt[i] = w for a row index i that may be a run-time value (the partial-tile path): constant
// indices only, so wt stays in registers.
__device__ __forceinline__ void set_row_words(uint32_t (&wt)[kRowsPerThread][4], int i, const uint32_t (&w)[4]) {
#pragma unroll
  for (int k = 0; k < kRowsPerThread; ++k)
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (k == i) wt[k][q] = w[q];
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
