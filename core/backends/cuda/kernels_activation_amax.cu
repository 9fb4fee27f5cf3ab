// Current scaling's amax pass for tensors that are an activation's output or gradient
// (ActivationSource): the per-block maxima of |x| that cast_transpose_many derives the scale
// from, as amax_partials writes them, with x computed tile by tile exactly as the cast that
// follows computes it (activation_tile.cuh). x is never stored: the activation is read twice
// (here and in the cast) instead of written once and read twice.
#include <algorithm>

#include "backends/cuda/activation_tile.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernel_launch.cuh"
#include "base/check.h"

namespace te::cuda {

namespace {

struct ActivationAmaxItem {
  ActivationTile act;
  int64_t rows, cols, tiles_c, tiles;  // paired: tiles of d a's half only
  bool paired;                         // a gated backward by pairs of tiles (gated_grad_paired)
  uint32_t *partials;
  unsigned first_block, blocks;  // the item's blocks in the grid; block b takes tiles b, b + blocks, ..
};

struct ActivationAmaxParams {
  ActivationAmaxItem item[kMaxCastItems];
  int n;
};

// Two blocks per SM, as the cast with an activation (the activation's math takes the registers).
// Cls: every item's class of source (kernels.h's activation_class).
template <DType T, int Cls>
__global__ void __launch_bounds__(kTileThreads, 2) activation_amax_kernel(const ActivationAmaxParams p) {
  __shared__ uint32_t scratch[32];
  // The block's item, selected with constant indices (see cast_transpose_kernel).
  ActivationAmaxItem it = p.item[0];
#pragma unroll
  for (int i = 1; i < kMaxCastItems; ++i)
    if (i < p.n && blockIdx.x >= p.item[i].first_block) it = p.item[i];
  const ActivationTile at = with_class<Cls>(it.act);
  const unsigned b = blockIdx.x - it.first_block;
  uint32_t m = 0;
#pragma unroll 1
  for (int64_t t = b; t < it.tiles; t += it.blocks) {
    const TileCoords tc = tile_coords(it.tiles_c, t);
    const bool full = tile_is_full(tc, it.rows, it.cols, true);
    auto row_max = [&](int, const float (&f)[kUnit]) { m = max(m, row_abs_max(f)); };
    if constexpr (kGatedGrad<Cls>) {
      if (it.paired) {
        // The tile at tc and the one in d b's half beside it, as the cast takes them.
        if (full) {
          for_tile_gated_grad_pairs<T>(at, it.cols, tc, [&](int i, bool, const float (&f)[kUnit]) { row_max(i, f); });
        } else {
          TileCoords tb = tc;
          tb.c0 += it.cols / 2;
          for_tile_activation_rows<T>(at, it.rows, it.cols, tc, false, row_max);
          for_tile_activation_rows<T>(at, it.rows, it.cols, tb, false, row_max);
        }
        continue;
      }
    }
    // Zeros outside x never change the amax.
    for_tile_activation_rows<T>(at, it.rows, it.cols, tc, full, row_max);
  }
  m = block_max_u32(m, scratch);
  if (threadIdx.x == 0) it.partials[b] = m;
}

template <DType T>
void launch(const ActivationAmaxParams &p, int cls, unsigned grid, cudaStream_t stream) {
  dispatch_activation_class(cls, [&](auto c) {
    launch_kernel<activation_amax_kernel<T, decltype(c)::value>>(grid, kTileThreads, 0, stream, p);
  });
}

}  // namespace

void activation_amax_partials(const TensorView *xs, const ActivationSource *sources, int n, uint32_t *partials,
                              int *npartials, cudaStream_t stream) {
  if (n < 1 || n > kMaxCastItems)
    fail(Status::Internal, "activation_amax_partials: %d tensors (1..%d)", n, kMaxCastItems);
  for (int i = 0; i < n; ++i)
    if (!sources[i].active()) fail(Status::Internal, "activation_amax_partials: tensor %d has no source", i);
  // One launch per class of source among the tensors (a kernel is compiled for one).
  for (int cls = 1; cls < kActivationClasses; ++cls) {
    ActivationAmaxParams p{};
    unsigned grid = 0;
    for (int i = 0; i < n; ++i) {
      if (activation_class(sources[i]) != cls) continue;
      ActivationAmaxItem &q = p.item[p.n++];
      q.rows = xs[i].numel() == 0 ? 0 : xs[i].rows();
      q.cols = xs[i].numel() == 0 ? 0 : xs[i].cols();
      q.act = activation_tile(sources[i], q.cols);
      q.paired = gated_grad_paired(q.act, q.cols);
      q.tiles_c = q.cols == 0 ? 1 : q.paired ? q.cols / 2 / kTile : (q.cols + kTile - 1) / kTile;
      q.tiles = q.rows == 0 ? 0 : q.tiles_c * ((q.rows + kTile - 1) / kTile);
      q.partials = partials + static_cast<size_t>(i) * kAmaxPartialBlocks;
      // At least one block: it writes the partial (0) of an empty tensor.
      q.blocks = static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(q.tiles, 1), kAmaxPartialBlocks));
      q.first_block = grid;
      grid += q.blocks;
      npartials[i] = static_cast<int>(q.blocks);
    }
    if (p.n == 0) continue;
    switch (xs[0].dtype) {
      case DType::F32: launch<DType::F32>(p, cls, grid, stream); break;
      case DType::F16: launch<DType::F16>(p, cls, grid, stream); break;
      default: launch<DType::BF16>(p, cls, grid, stream); break;
    }
  }
}

}  // namespace te::cuda
