// Block quantization in one pass over x: a 128x128 tile per thread block (fp8_tile.cuh) is held
// in registers while its amaxes are reduced, then encoded straight to out and, through shared
// memory, to out_t.
//  - Block1x128: out has one scale per row and 128 columns (a reduction over the 8 threads that
//    share a row); out_t, x^T in its own 1x128 blocks, has one scale per column of x and 128 rows
//    (shuffles within a warp, then across the 8 warps through shared memory).
//  - Block128x128: one amax per tile, shared by out and out_t (whose tile grid is transposed).
// Scales: compute_scale_from_amax per block, scale_inv = 1 / scale, as the CPU reference.
// One launch quantizes up to kMaxCastItems tensors of one input dtype, each in its own mode
// (quantize_many: a layer's input, 1x128, and weight, 128x128).
#include "backends/cuda/activation_tile.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_tile.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch_items.cuh"
#include "backends/cuda/kernel_launch.cuh"
#include "base/check.h"

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
  ScalingMode mode;
  unsigned first_block;  // the tensor's first block in the grid (several tensors per launch)
  void *dbias;           // optional column sums of x, as CastItem's (kernels.h)
  DType dbias_dtype;
  ActivationTile act;    // optional: x is computed from an activation's input, not read
  bool paired;           // a gated backward (16-bit) by pairs of tiles: the grid covers d a's half
};

struct BlockQuantizeBatch {
  BlockQuantizeParams item[kMaxCastItems];
  int n;
};

__device__ __forceinline__ float fmt_max(int fmt) { return fmt == kFmtE4M3 ? kE4M3Max : kE5M2Max; }

__device__ __forceinline__ float amax_float(uint32_t bits) { return __uint_as_float(canonical_amax_bits(bits)); }

// Shared memory of one tile's quantization.
struct BlockSmem {
  alignas(16) uint8_t t[kTile * kTile];
  uint32_t col_amax[kTileThreads / 32][kTile];
  float col_scale[kTile];
  uint32_t scratch[32];
  ColumnSumSmem col_sums;
};

// The amaxes, scales, codes and bias-gradient partials of the tile at tc, whose row i (of the
// thread's 4) row(i, f) gives as floats; i is a compile-time constant at every call.
template <DType T, ScalingMode Mode, class RowFn>
__device__ __forceinline__ void quantize_rows(const BlockQuantizeParams &p, const TileCoords &tc, bool full,
                                              RowFn &&row, BlockSmem &sm) {
  uint8_t *smem_t = sm.t;
  auto &col_amax = sm.col_amax;
  float *col_scale = sm.col_scale;
  uint32_t *scratch = sm.scratch;
  const int64_t row_blocks = (p.rows + kTile - 1) / kTile;
  const int64_t rb = tc.r0 / kTile, cb = tc.c0 / kTile;
  const int64_t r_first = tc.r0 + kRowsPerThread * tc.g, c_first = tc.c0 + kUnit * tc.u;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // ---- amaxes and scales ----
  float row_scale[kRowsPerThread];  // out's scale for each of the thread's rows
  float tile_scale_t = 1.0f;        // out_t's scale (128x128)
  if constexpr (Mode == ScalingMode::Block1x128) {
    if (p.out_fmt != kFmtNone) {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        float fi[kUnit];
        row(i, fi);
        uint32_t m = row_abs_max(fi);
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 4));
        row_scale[i] = dev_compute_scale_from_amax(amax_float(m), fmt_max(p.out_fmt), p.power_of_2, p.epsilon);
        const int64_t r = r_first + i;
        if (tc.u == 0 && r < p.rows) p.out_scale_inv[r * p.tiles_c + cb] = reciprocal_rn(row_scale[i]);
      }
    }
    if (p.out_t_fmt != kFmtNone) {
      uint32_t cm[kUnit] = {};
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        float fi[kUnit];
        row(i, fi);
#pragma unroll
        for (int j = 0; j < kUnit; ++j) cm[j] = max(cm[j], abs_bits(fi[j]));
      }
#pragma unroll
      for (int j = 0; j < kUnit; ++j) {
        uint32_t m = cm[j];
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
    for (int i = 0; i < kRowsPerThread; ++i) {
      float fi[kUnit];
      row(i, fi);
      m = max(m, row_abs_max(fi));
    }
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
      float fi[kUnit];
      row(i, fi);
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        w[q] = encode4_rt(p.out_fmt, __fmul_rn(fi[4 * q], row_scale[i]), __fmul_rn(fi[4 * q + 1], row_scale[i]),
                          __fmul_rn(fi[4 * q + 2], row_scale[i]), __fmul_rn(fi[4 * q + 3], row_scale[i]));
      }
      store_row_codes(p.out, p.rows, p.cols, r_first + i, c_first, full, w);
    }
  }
  if (p.out_t_fmt != kFmtNone) {
    float s[kUnit];
#pragma unroll
    for (int j = 0; j < kUnit; ++j) s[j] = Mode == ScalingMode::Block1x128 ? col_scale[kUnit * tc.u + j] : tile_scale_t;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      float fi[kUnit];
      row(i, fi);
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        w[q] = encode4_rt(p.out_t_fmt, __fmul_rn(fi[4 * q], s[4 * q]), __fmul_rn(fi[4 * q + 1], s[4 * q + 1]),
                          __fmul_rn(fi[4 * q + 2], s[4 * q + 2]), __fmul_rn(fi[4 * q + 3], s[4 * q + 3]));
      stash_row_codes(smem_t, tc, i, w);
    }
    __syncthreads();
    write_transposed(smem_t, p.out_t, p.rows, p.cols, tc, full);
  }
  if (p.dbias != nullptr) {  // the bias gradient of dy, from the values already in registers
    float cs[kUnit] = {};
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      float fi[kUnit];
      row(i, fi);
#pragma unroll
      for (int j = 0; j < kUnit; ++j) cs[j] = __fadd_rn(cs[j], fi[j]);
    }
    const bool direct = p.rows <= kTile;
    void *row = direct ? p.dbias : static_cast<float *>(p.dbias) + rb * p.cols;
    tile_column_sums(cs, tc, p.cols, sm.col_sums, row, direct ? p.dbias_dtype : DType::F32);
  }
}

// Tile tc of one tensor, read or (Act > 0) computed from an activation's source.
// Act: every tensor's activation source class (kernels.h's activation_class; 0: none), a template
// parameter so that each kernel has the registers of its own path only.
template <DType T, ScalingMode Mode, int Act>
__device__ __forceinline__ void quantize_tile(const BlockQuantizeParams &p, const TileCoords &tc, BlockSmem &sm) {
  const bool full = tile_is_full(tc, p.rows, p.cols, p.aligned);
  if constexpr (Act > 0) {
    float f[kRowsPerThread][kUnit];
    for_tile_activation_rows<T, 1>(with_class<Act>(p.act), p.rows, p.cols, tc, full,
                                   [&](int i, const float (&v)[kUnit]) { set_row_at(f, i, v); });
    quantize_rows<T, Mode>(p, tc, full, [&](int i, float (&fi)[kUnit]) {
#pragma unroll
      for (int j = 0; j < kUnit; ++j) fi[j] = f[i][j];
    }, sm);
  } else {
    TileRowsRaw<T> tile;  // x as loaded
    tile.load(p.x, p.rows, p.cols, tc, full);
    quantize_rows<T, Mode>(p, tc, full, [&](int i, float (&fi)[kUnit]) { tile.row(i, fi); }, sm);
  }
}

// A gated backward's pair of tiles (d a's and d b's) as for_tile_gated_grad_pairs computes them,
// two 16-bit values per register (exact: the values are rounded to T): 64 registers for both
// tiles, what one tile takes as floats.
template <DType T>
struct GatedGradPairTiles {
  static_assert(T == DType::BF16 || T == DType::F16, "16-bit values");
  uint32_t w[2][kRowsPerThread][kUnit / 2];  // [d b's tile?][row][pair of columns]
  __device__ __forceinline__ static uint32_t bits(float v) {
    if constexpr (T == DType::BF16) return __float_as_uint(v) >> 16;  // a BF16 value's low half is 0
    else return float_to_f16_bits(v);
  }
  __device__ __forceinline__ static float value(uint32_t h) {
    if constexpr (T == DType::BF16) return __uint_as_float(h << 16);
    else return f16_bits_to_float(static_cast<uint16_t>(h));
  }
  // Row i of tile `second`.
  __device__ __forceinline__ void keep(bool second, int i, const float (&f)[kUnit]) {
    uint32_t v[kUnit / 2];
#pragma unroll
    for (int j = 0; j < kUnit / 2; ++j) v[j] = bits(f[2 * j]) | (bits(f[2 * j + 1]) << 16);
    if (second) set_row_at(w[1], i, v);
    else set_row_at(w[0], i, v);
  }
  __device__ __forceinline__ void row(int t, int i, float (&f)[kUnit]) const {
#pragma unroll
    for (int j = 0; j < kUnit / 2; ++j) {
      f[2 * j] = value(w[t][i][j] & 0xFFFFu);
      f[2 * j + 1] = value(w[t][i][j] >> 16);
    }
  }
};

// The pair of tiles of a gated backward (gated_grad_paired) at tc, in d a's half, and cols / 2 to
// its right: a, b and g are read once for both, SwiGLU's sigmoid taken once. Ragged pairs take
// each tile alone.
template <DType T, ScalingMode Mode, int Cls>
__device__ __forceinline__ void quantize_tile_pair(const BlockQuantizeParams &p, const TileCoords &tc, BlockSmem &sm) {
  TileCoords tb = tc;
  tb.c0 += p.cols / 2;
  if (!tile_is_full(tc, p.rows, p.cols, p.aligned)) {
    quantize_tile<T, Mode, Cls>(p, tc, sm);
    __syncthreads();  // sm is reused
    quantize_tile<T, Mode, Cls>(p, tb, sm);
    return;
  }
  GatedGradPairTiles<T> pair;
  for_tile_gated_grad_pairs<T>(with_class<Cls>(p.act), p.cols, tc,
                               [&](int i, bool second, const float (&f)[kUnit]) { pair.keep(second, i, f); });
  quantize_rows<T, Mode>(p, tc, true, [&](int i, float (&fi)[kUnit]) { pair.row(0, i, fi); }, sm);
  __syncthreads();
  quantize_rows<T, Mode>(p, tb, true, [&](int i, float (&fi)[kUnit]) { pair.row(1, i, fi); }, sm);
}

// Blocks per SM the registers must allow. A block holds its whole tile from load to codes, so the
// memory stays busy only with several blocks per SM: x as loaded fits three; an activation's
// floats (and its math), two.
template <int Act>
constexpr int kBlockMinBlocks = Act > 0 ? 2 : 3;

// Up to kMaxCastItems tensors (of one input dtype), one after the other in the grid
// (launch_items.cuh: read in place without an activation, which leaves x's own loads unspilled;
// by value with one), each in its scaling mode chosen at run time.
template <DType T, int Act>
__global__ void __launch_bounds__(kTileThreads, kBlockMinBlocks<Act>)
    block_quantize_kernel(const __grid_constant__ BlockQuantizeBatch b) {
  __shared__ BlockSmem sm;
  decltype(auto) p = block_item<Act == 0>(b);
  const int64_t bid = blockIdx.x - p.first_block;
  if constexpr (kGatedGrad<Act> && T != DType::F32) {
    if (p.paired) {
      const TileCoords tc = tile_coords(p.cols / 2 / kTile, bid);
      if (p.mode == ScalingMode::Block1x128) quantize_tile_pair<T, ScalingMode::Block1x128, Act>(p, tc, sm);
      else quantize_tile_pair<T, ScalingMode::Block128x128, Act>(p, tc, sm);
      return;
    }
  }
  const TileCoords tc = tile_coords(p.tiles_c, bid);
  if (p.mode == ScalingMode::Block1x128) quantize_tile<T, ScalingMode::Block1x128, Act>(p, tc, sm);
  else quantize_tile<T, ScalingMode::Block128x128, Act>(p, tc, sm);
}

// The parameters of one tensor; false when it has nothing to write (no blocks, no scales).
bool tensor_params(const BlockQuantizeItem &q, BlockQuantizeParams *out_p) {
  const TensorView &x = q.x;
  TensorView *out = q.out, *out_t = q.out_t;
  if (x.numel() == 0 || (out == nullptr && out_t == nullptr)) return false;
  BlockQuantizeParams p;
  p.mode = q.mode;
  p.power_of_2 = q.power_of_2;
  p.epsilon = q.epsilon;
  p.x = x.data;
  p.out = out != nullptr ? static_cast<uint8_t *>(out->data) : nullptr;
  p.out_t = out_t != nullptr ? static_cast<uint8_t *>(out_t->data) : nullptr;
  p.out_scale_inv = out != nullptr ? out->scale_inv : nullptr;
  p.out_t_scale_inv = out_t != nullptr ? out_t->scale_inv : nullptr;
  p.out_fmt = fmt_of(out);
  p.out_t_fmt = fmt_of(out_t);
  p.rows = x.rows();
  p.cols = x.cols();
  p.tiles_c = (p.cols + kTile - 1) / kTile;
  p.aligned = tile_vectors_aligned(p.x, p.out, p.out_t, p.rows, p.cols);
  p.first_block = 0;
  p.dbias = q.dbias;
  p.dbias_dtype = q.dbias_dtype;
  p.act = activation_tile(q.source, p.cols);
  p.paired = gated_grad_paired(p.act, p.cols) && x.dtype != DType::F32;
  *out_p = p;
  return true;
}

template <DType T>
void launch(const BlockQuantizeBatch &b, int cls, unsigned grid, cudaStream_t stream) {
  if (cls == 0) {
    launch_kernel<block_quantize_kernel<T, 0>>(grid, kTileThreads, 0, stream, b);
    return;
  }
  dispatch_activation_class(cls, [&](auto c) {
    launch_kernel<block_quantize_kernel<T, decltype(c)::value>>(grid, kTileThreads, 0, stream, b);
  });
}

}  // namespace

void block_quantize_many(const BlockQuantizeItem *items, int n, cudaStream_t stream) {
  if (n < 1 || n > kMaxCastItems) fail(Status::Internal, "block_quantize_many: %d items (1..%d)", n, kMaxCastItems);
  BlockQuantizeBatch b{};
  unsigned grid = 0;
  for (int i = 0; i < n; ++i) {
    BlockQuantizeParams p;
    if (!tensor_params(items[i], &p)) continue;
    p.first_block = grid;
    grid += static_cast<unsigned>((p.paired ? p.tiles_c / 2 : p.tiles_c) * ((p.rows + kTile - 1) / kTile));
    b.item[b.n++] = p;
  }
  if (b.n == 0) return;
  const int cls = activation_class(items[0].source);
  for (int i = 1; i < n; ++i)
    if (activation_class(items[i].source) != cls)
      fail(Status::Internal, "block_quantize_many: item %d's activation source is of another class than item 0's", i);
  switch (items[0].x.dtype) {
    case DType::F32: launch<DType::F32>(b, cls, grid, stream); break;
    case DType::F16: launch<DType::F16>(b, cls, grid, stream); break;
    default: launch<DType::BF16>(b, cls, grid, stream); break;
  }
}

void block_quantize(Backend &, const TensorView &x, ScalingMode mode, bool power_of_2, float epsilon, TensorView *out,
                    TensorView *out_t, cudaStream_t stream) {
  BlockQuantizeItem q;
  q.x = x, q.mode = mode, q.power_of_2 = power_of_2, q.epsilon = epsilon, q.out = out, q.out_t = out_t;
  block_quantize_many(&q, 1, stream);
}

}  // namespace te::cuda
