// Per-tensor cast_transpose: one read of x per element gives amax (optional), out = fp8(x * scale)
// row-major and out_t = its transpose, through the 128x128 tile machinery of fp8_tile.cuh.
// Templated on the input dtype and both output formats (kFmtNone: not written), so each
// instantiation's inner loop is straight-line code.
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_tile.cuh"
#include "backends/cuda/kernels.h"

namespace te::cuda {

namespace {

struct CastTransposeParams {
  const void *x;
  const float *scale;
  float *amax;  // nullable
  uint8_t *out, *out_t;
  float *out_scale_inv, *out_t_scale_inv;
  int64_t rows, cols, tiles_c;
  bool aligned;
};

template <DType T, int OutFmt, int OutTFmt>
__global__ void __launch_bounds__(kTileThreads) cast_transpose_kernel(const CastTransposeParams p) {
  __shared__ alignas(16) uint8_t smem_t[OutTFmt != kFmtNone ? kTile * kTile : 16];
  __shared__ uint32_t scratch[32];
  const TileCoords tc = tile_coords(p.tiles_c);
  const bool full = tile_is_full(tc, p.rows, p.cols, p.aligned);
  const float s = *p.scale;

  uint32_t m = 0;
  uint32_t wt[kRowsPerThread][4];
  for_tile_rows<T>(p.x, p.rows, p.cols, tc, full, [&](int i, const float (&f)[kUnit]) {
    m = max(m, row_abs_max(f));
    float v[kUnit];
#pragma unroll
    for (int j = 0; j < kUnit; ++j) v[j] = __fmul_rn(f[j], s);
    if constexpr (OutFmt != kFmtNone) {
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) w[q] = encode4<OutFmt>(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
      store_row_codes(p.out, p.rows, p.cols, tc.r0 + kRowsPerThread * tc.g + i, tc.c0 + kUnit * tc.u, full, w);
      if constexpr (OutTFmt == OutFmt) set_row_words(wt, i, w);
    }
    if constexpr (OutTFmt != kFmtNone && OutTFmt != OutFmt) {
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) w[q] = encode4<OutTFmt>(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
      set_row_words(wt, i, w);
    }
  });

  if constexpr (OutTFmt != kFmtNone) {
    stash_transposed(smem_t, tc, wt);
    __syncthreads();
    write_transposed(smem_t, p.out_t, p.rows, p.cols, tc, full);
  }

  if (p.amax != nullptr) {
    m = block_max_u32(m, scratch);
    if (threadIdx.x == 0) atomic_amax(p.amax, canonical_amax_bits(m));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const float scale_inv = reciprocal_rn(s);
    if (p.out_scale_inv != nullptr) *p.out_scale_inv = scale_inv;
    if (p.out_t_scale_inv != nullptr) *p.out_t_scale_inv = scale_inv;
  }
}

template <DType T, int OutFmt, int OutTFmt>
void launch(const CastTransposeParams &p, unsigned grid, cudaStream_t stream) {
  cast_transpose_kernel<T, OutFmt, OutTFmt><<<grid, kTileThreads, 0, stream>>>(p);
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

void cast_transpose(Backend &be, const TensorView &x, const float *scale, float *amax_accum, TensorView *out,
                    TensorView *out_t, cudaStream_t stream) {
  CastTransposeParams p;
  p.x = x.data;
  p.scale = scale;
  p.amax = amax_accum;
  p.out = out != nullptr ? static_cast<uint8_t *>(out->data) : nullptr;
  p.out_t = out_t != nullptr ? static_cast<uint8_t *>(out_t->data) : nullptr;
  p.out_scale_inv = out != nullptr ? out->scale_inv : nullptr;
  p.out_t_scale_inv = out_t != nullptr ? out_t->scale_inv : nullptr;
  p.rows = x.rows();
  p.cols = x.cols();
  if (x.numel() == 0) p.rows = p.cols = 0;
  p.tiles_c = p.cols == 0 ? 1 : (p.cols + kTile - 1) / kTile;
  p.aligned = tile_vectors_aligned(p.x, p.out, p.out_t, p.rows, p.cols);
  const int64_t tiles = p.tiles_c * ((p.rows + kTile - 1) / kTile);
  // At least one block: it writes scale_inv (and folds amax 0) for an empty tensor too.
  const unsigned grid = static_cast<unsigned>(tiles < 1 ? 1 : tiles);
  switch (x.dtype) {
    case DType::F32: dispatch_out<DType::F32>(p, fmt_of(out), fmt_of(out_t), grid, stream); break;
    case DType::F16: dispatch_out<DType::F16>(p, fmt_of(out), fmt_of(out_t), grid, stream); break;
    default: dispatch_out<DType::BF16>(p, fmt_of(out), fmt_of(out_t), grid, stream); break;
  }
  TE_CUDA_CHECK_LAUNCH();
}

}  // namespace te::cuda
