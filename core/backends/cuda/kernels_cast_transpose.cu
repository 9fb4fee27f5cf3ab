// Per-tensor cast_transpose: one read of x per element gives amax (optional), out = fp8(x * scale)
// row-major and out_t = its transpose, through the 128x128 tile machinery of fp8_tile.cuh.
// Templated on the input dtype and both output formats (kFmtNone: not written), so each
// instantiation's inner loop is straight-line code.
//
// One launch casts up to kMaxCastItems tensors of one (dtype, formats) kind: the grid is the
// items' tile grids one after the other (quantize_many: a layer's input and weight in one launch).
// An item's scale is *scale (delayed), or comes from the per-block amax maxima that
// amax_partials wrote (current scaling): every block reduces them and applies
// compute_scale_from_amax itself, so amax -> scale -> cast takes two launches and no memset.
// A small tensor (kSelfAmaxElements at most) needs no amax pass at all: each of its few blocks
// reads all of it (from L2) and takes the amax itself, so it is one launch.
#include "backends/cuda/activation_tile.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_tile.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch_items.cuh"
#include "backends/cuda/kernel_launch.cuh"
#include "base/check.h"

namespace te::cuda {

namespace {

struct CastItemParams {
  const void *x;
  const float *scale;  // null: from partials
  float *amax;         // nullable: max-accumulates max |x|
  float *scale_copy;   // nullable: receives the scale (delayed: a backward's snapshot of it)
  uint8_t *out, *out_t;
  float *out_scale_inv, *out_t_scale_inv;
  int64_t rows, cols, tiles_c;
  unsigned first_block;  // the item's first block in the grid
  bool aligned;
  // Current scaling: the amax is the max of partials[0 .. npartials) (bits); block 0 of the item
  // stores it, the scale and its inverse.
  const uint32_t *partials;
  int npartials;
  float *amax_out, *scale_out, *scale_inv_out;
  float fp8_max, epsilon;
  bool power_of_2;
  // Optional bias gradient of x (dy): column sums per row of tiles, [row tiles][cols] F32, or,
  // when one row of tiles covers x, the gradient itself in dbias_dtype.
  void *dbias;
  DType dbias_dtype;
  ActivationTile act;      // optional: x is computed from an activation's input, not read
  bool paired;             // a gated backward cast by pairs of tiles (gated_grad_paired)
  int out_fmt, out_t_fmt;  // Fp8Fmt of out / out_t, for the kernel of run-time formats
};

struct CastTransposeParams {
  CastItemParams item[kMaxCastItems];
  int n;
};

// Blocks per SM the register budget must allow. A block has its whole tile's loads in flight
// only until it starts casting, so the memory stays busy only with several blocks per SM: left
// free, the compiler took 107 registers for the BF16 cast (two blocks per SM), and the H200
// reached 0.85x of a device copy; at three blocks (71 registers then, no spill; 56-64 since a
// tile's codes for out_t go to shared memory row by row) it reaches 0.91x, and four gain nothing
// more (measured again at 56-64 registers). A bias gradient's 16 column sums take registers too,
// but three blocks pay off there as well: at two (126-128 registers, no spill) the BF16 dy cast
// of 16384 x 4096 took 95-96 us on an H200; at three (80 registers, 16-112 bytes of spills) it
// takes 76 us (ncu, same run). An activation's math needs more: two blocks.
template <bool Act>
constexpr int kCastMinBlocks = Act ? 2 : 3;

// Dbias: the launch has an item with a bias gradient to take (a template flag, so that casts
// without one keep their registers).
// Act: every item's activation source class (kernels.h's activation_class; 0: none), for the same
// reason.
template <DType T, int OutFmt, int OutTFmt, bool Dbias, int Act>
__global__ void __launch_bounds__(kTileThreads, kCastMinBlocks<(Act > 0)>)
    cast_transpose_kernel(const __grid_constant__ CastTransposeParams p) {
  // The tile's codes for out_t (fp8_tile.cuh); a gated backward's pair of tiles takes two.
  __shared__ alignas(16) uint8_t smem_t[kGatedGrad<Act> ? 2 : 1][OutTFmt != kFmtNone ? kTile * kTile : 16];
  __shared__ uint32_t scratch[32];
  __shared__ ColumnSumSmem col_sums[1];  // unused (and dropped) without Dbias
  // In place where an activation's math needs the registers (fewer spills); by value otherwise.
  decltype(auto) it = block_item<(Act > 0)>(p);
  const int64_t bid = blockIdx.x - it.first_block;
  const TileCoords tc = tile_coords(it.tiles_c, bid);
  const bool full = tile_is_full(tc, it.rows, it.cols, it.aligned);
  float s;
  if (it.scale != nullptr) {
    s = *it.scale;
  } else {
    uint32_t pm = 0;
    if (it.partials != nullptr) {
      for (int i = threadIdx.x; i < it.npartials; i += kTileThreads) pm = max(pm, it.partials[i]);
    } else {
      const int64_t n = it.rows * it.cols;
      for (int64_t i = threadIdx.x; i < n; i += kTileThreads) pm = max(pm, abs_bits(load_scalar<T>(it.x, i)));
    }
    const float amax = __uint_as_float(canonical_amax_bits(block_max_u32(pm, scratch)));
    s = dev_compute_scale_from_amax(amax, it.fp8_max, it.power_of_2, it.epsilon);
    if (bid == 0 && threadIdx.x == 0) {
      *it.amax_out = amax;
      *it.scale_out = s;
      *it.scale_inv_out = reciprocal_rn(s);
    }
  }

  uint32_t m = 0;
  const bool dbias = Dbias && it.dbias != nullptr;
  const bool has_out_t = OutTFmt == kFmtRuntime ? it.out_t != nullptr : OutTFmt != kFmtNone;  // block-uniform
  // Row i of tile t (whose codes for out_t go to smem): amax, codes, column sums cs.
  auto cast_row = [&](uint8_t *smem, float (&cs)[kUnit], const TileCoords &t, bool full_t, int i,
                      const float (&f)[kUnit]) {
    m = max(m, row_abs_max(f));
    if (dbias) {
#pragma unroll
      for (int j = 0; j < kUnit; ++j) cs[j] = __fadd_rn(cs[j], f[j]);
    }
    float v[kUnit];
#pragma unroll
    for (int j = 0; j < kUnit; ++j) v[j] = __fmul_rn(f[j], s);
    const int64_t r = t.r0 + kRowsPerThread * t.g + i, c = t.c0 + kUnit * t.u;
    if constexpr (OutFmt == kFmtRuntime) {
      // Formats read at run time (the activation kernels: the activation is the cost).
      const bool shared_words = it.out != nullptr && it.out_t_fmt == it.out_fmt;
      if (it.out != nullptr) {
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) w[q] = encode4_rt(it.out_fmt, v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
        store_row_codes(it.out, it.rows, it.cols, r, c, full_t, w);
        if (shared_words) stash_row_codes(smem, t, i, w);
      }
      if (it.out_t != nullptr && !shared_words) {
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) w[q] = encode4_rt(it.out_t_fmt, v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
        stash_row_codes(smem, t, i, w);
      }
    } else {
      if constexpr (OutFmt != kFmtNone) {
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) w[q] = encode4<OutFmt>(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
        store_row_codes(it.out, it.rows, it.cols, r, c, full_t, w);
        if constexpr (OutTFmt == OutFmt) stash_row_codes(smem, t, i, w);
      }
      if constexpr (OutTFmt != kFmtNone && OutTFmt != OutFmt) {
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) w[q] = encode4<OutTFmt>(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
        stash_row_codes(smem, t, i, w);
      }
    }
  };
  // After every row of tile t: its out_t and bias-gradient partials.
  auto finish_tile = [&](const uint8_t *smem, float (&cs)[kUnit], const TileCoords &t, bool full_t) {
    if (has_out_t) {
      __syncthreads();
      write_transposed(smem, it.out_t, it.rows, it.cols, t, full_t);
    }
    if (dbias) {
      const bool direct = it.rows <= kTile;  // one row of tiles: these sums are the gradient
      void *row = direct ? it.dbias : static_cast<float *>(it.dbias) + (t.r0 / kTile) * it.cols;
      tile_column_sums(cs, t, it.cols, col_sums[0], row, direct ? it.dbias_dtype : DType::F32);
    }
  };
  float cs[kUnit] = {};
  auto cast_row_here = [&](int i, const float (&f)[kUnit]) { cast_row(smem_t[0], cs, tc, full, i, f); };
  bool paired = false;
  if constexpr (kGatedGrad<Act>) {
    paired = it.paired;
    if (paired) {
      // The pair's second tile, in d b's half.
      TileCoords tb = tc;
      tb.c0 += it.cols / 2;
      float cs_b[kUnit] = {};
      auto cast_row_b = [&](int i, const float (&f)[kUnit]) { cast_row(smem_t[1], cs_b, tb, full, i, f); };
      const ActivationTile at = with_class<Act>(it.act);
      if (full) {
        for_tile_gated_grad_pairs<T>(at, it.cols, tc, [&](int i, bool second, const float (&f)[kUnit]) {
          if (second) cast_row_b(i, f);
          else cast_row_here(i, f);
        });
      } else {
        for_tile_activation_rows<T>(at, it.rows, it.cols, tc, false, cast_row_here);
        for_tile_activation_rows<T>(at, it.rows, it.cols, tb, false, cast_row_b);
      }
      finish_tile(smem_t[0], cs, tc, full);
      if (dbias) __syncthreads();  // col_sums is reused
      finish_tile(smem_t[1], cs_b, tb, full);
    }
  }
  if (!paired) {
    if constexpr (Act > 0)
      for_tile_activation_rows<T>(with_class<Act>(it.act), it.rows, it.cols, tc, full, cast_row_here);
    else
      for_tile_rows<T>(it.x, it.rows, it.cols, tc, full, cast_row_here);
    finish_tile(smem_t[0], cs, tc, full);
  }
  if (it.amax != nullptr) {
    m = block_max_u32(m, scratch);
    if (threadIdx.x == 0) atomic_amax(it.amax, canonical_amax_bits(m));
  }
  if (bid == 0 && threadIdx.x == 0) {
    const float scale_inv = reciprocal_rn(s);
    if (it.out_scale_inv != nullptr) *it.out_scale_inv = scale_inv;
    if (it.out_t_scale_inv != nullptr) *it.out_t_scale_inv = scale_inv;
    if (it.scale_copy != nullptr) *it.scale_copy = s;
  }
}

bool any_dbias(const CastTransposeParams &p) {
  for (int i = 0; i < p.n; ++i)
    if (p.item[i].dbias != nullptr) return true;
  return false;
}

template <DType T, int OutFmt, int OutTFmt>
void launch(const CastTransposeParams &p, unsigned grid, cudaStream_t stream) {
  if (any_dbias(p)) launch_kernel<cast_transpose_kernel<T, OutFmt, OutTFmt, true, 0>>(grid, kTileThreads, 0, stream, p);
  else launch_kernel<cast_transpose_kernel<T, OutFmt, OutTFmt, false, 0>>(grid, kTileThreads, 0, stream, p);
}

// A launch of activation-sourced items (class Act): formats at run time, one kernel per dtype,
// class and dbias.
template <DType T, int Act>
void launch_activation_class(const CastTransposeParams &p, unsigned grid, cudaStream_t stream) {
  if (any_dbias(p)) launch_kernel<cast_transpose_kernel<T, kFmtRuntime, kFmtRuntime, true, Act>>(grid, kTileThreads, 0,
      stream, p);
  else launch_kernel<cast_transpose_kernel<T, kFmtRuntime, kFmtRuntime, false, Act>>(grid, kTileThreads, 0, stream, p);
}

template <DType T>
void launch_activation(const CastTransposeParams &p, int cls, unsigned grid, cudaStream_t stream) {
  dispatch_activation_class(cls, [&](auto c) { launch_activation_class<T, decltype(c)::value>(p, grid, stream); });
}

template <DType T, int OutFmt>
void dispatch_out_t(const CastTransposeParams &p, int out_t_fmt, unsigned grid, cudaStream_t stream) {
  switch (out_t_fmt) {
    case kFmtE4M3: launch<T, OutFmt, kFmtE4M3>(p, grid, stream); return;
    case kFmtE5M2: launch<T, OutFmt, kFmtE5M2>(p, grid, stream); return;
    default: launch<T, OutFmt, kFmtNone>(p, grid, stream); return;
  }
}

template <DType T>
void dispatch_out(const CastTransposeParams &p, int out_fmt, int out_t_fmt, unsigned grid, cudaStream_t stream) {
  switch (out_fmt) {
    case kFmtE4M3: dispatch_out_t<T, kFmtE4M3>(p, out_t_fmt, grid, stream); return;
    case kFmtE5M2: dispatch_out_t<T, kFmtE5M2>(p, out_t_fmt, grid, stream); return;
    default: dispatch_out_t<T, kFmtNone>(p, out_t_fmt, grid, stream); return;
  }
}

}  // namespace

void cast_transpose_many(const CastItem *items, int n, cudaStream_t stream) {
  if (n < 1 || n > kMaxCastItems) fail(Status::Internal, "cast_transpose_many: %d items (1..%d)", n, kMaxCastItems);
  CastTransposeParams p{};
  p.n = n;
  unsigned grid = 0;
  for (int i = 0; i < n; ++i) {
    const CastItem &c = items[i];
    CastItemParams &q = p.item[i];
    q.x = c.x.data;
    q.scale = c.scale;
    q.amax = c.amax_accum;
    q.scale_copy = c.scale_copy;
    q.out = c.out != nullptr ? static_cast<uint8_t *>(c.out->data) : nullptr;
    q.out_t = c.out_t != nullptr ? static_cast<uint8_t *>(c.out_t->data) : nullptr;
    q.out_scale_inv = c.out != nullptr ? c.out->scale_inv : nullptr;
    q.out_t_scale_inv = c.out_t != nullptr ? c.out_t->scale_inv : nullptr;
    q.rows = c.x.rows();
    q.cols = c.x.cols();
    if (c.x.numel() == 0) q.rows = q.cols = 0;
    q.tiles_c = q.cols == 0 ? 1 : (q.cols + kTile - 1) / kTile;
    q.aligned = tile_vectors_aligned(q.x, q.out, q.out_t, q.rows, q.cols);
    q.partials = c.partials;
    q.npartials = c.npartials;
    q.amax_out = c.amax_out, q.scale_out = c.scale_out, q.scale_inv_out = c.scale_inv_out;
    q.fp8_max = c.fp8_max, q.epsilon = c.epsilon, q.power_of_2 = c.power_of_2;
    q.dbias = c.dbias, q.dbias_dtype = c.dbias_dtype;
    q.out_fmt = fmt_of(c.out), q.out_t_fmt = fmt_of(c.out_t);
    q.act = activation_tile(c.source, q.cols);
    // A gated backward by pairs of tiles: the grid covers d a's half, each block one tile of each.
    q.paired = gated_grad_paired(q.act, q.cols) && q.aligned;
    if (q.paired) q.tiles_c = q.cols / 2 / kTile;
    // An activation-sourced x cannot take its own amax (the small-tensor path reads x).
    if (q.act.active && c.scale == nullptr && c.partials == nullptr)
      fail(Status::Internal, "cast_transpose_many: an activation source needs a scale or amax partials");
    const int64_t tiles = q.tiles_c * ((q.rows + kTile - 1) / kTile);
    // At least one block: it writes scale_inv (and folds amax 0) for an empty tensor too.
    q.first_block = grid;
    grid += static_cast<unsigned>(tiles < 1 ? 1 : tiles);
  }
  const TensorView &x = items[0].x;
  const int out_fmt = fmt_of(items[0].out), out_t_fmt = fmt_of(items[0].out_t);
  const int cls = activation_class(items[0].source);
  for (int i = 1; i < n; ++i)
    if (activation_class(items[i].source) != cls)
      fail(Status::Internal, "cast_transpose_many: item %d's activation source is of another class than item 0's", i);
  if (cls > 0) {
    switch (x.dtype) {
      case DType::F32: launch_activation<DType::F32>(p, cls, grid, stream); break;
      case DType::F16: launch_activation<DType::F16>(p, cls, grid, stream); break;
      default: launch_activation<DType::BF16>(p, cls, grid, stream); break;
    }
    return;
  }
  switch (x.dtype) {
    case DType::F32: dispatch_out<DType::F32>(p, out_fmt, out_t_fmt, grid, stream); break;
    case DType::F16: dispatch_out<DType::F16>(p, out_fmt, out_t_fmt, grid, stream); break;
    default: dispatch_out<DType::BF16>(p, out_fmt, out_t_fmt, grid, stream); break;
  }
}

void cast_transpose(Backend &, const TensorView &x, const float *scale, float *amax_accum, TensorView *out,
                    TensorView *out_t, cudaStream_t stream) {
  CastItem c;
  c.x = x;
  c.scale = scale;
  c.amax_accum = amax_accum;
  c.out = out;
  c.out_t = out_t;
  cast_transpose_many(&c, 1, stream);
}

}  // namespace te::cuda
