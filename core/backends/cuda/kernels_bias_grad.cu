// bias_grad: db[n] = sum over rows of dy[rows, n] in fp32, deterministic (no atomics): the rows
// are split into `splits` bands, each band's column sums go to scratch, and a second kernel adds
// the bands in order and stores db in its dtype. One band: the first kernel stores db itself.
// F16/BF16 rows of whole 16-byte vectors take the vector kernel: a thread sums 8 columns, with
// 4 rows' loads in flight (the element-wise kernel read at ~1 TB/s on an H100). bias_grad_many
// sums tensors of one band each (GroupedLinear's experts at small token counts) in one launch.
#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernel_launch.cuh"

namespace te::cuda {

namespace {

constexpr int kCols = 64;    // columns per block (one per thread in x)
constexpr int kRowLanes = 4;  // threads per column (y), each summing every 4th row of the band
constexpr int kMaxSplits = 256;

__global__ void __launch_bounds__(kCols * kRowLanes)
    column_sum_kernel(const void *dy, DType t, int64_t rows, int64_t cols, int64_t rows_per_split, float *partial,
                      void *db, DType db_t) {
  __shared__ float sums[kRowLanes][kCols];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCols + threadIdx.x;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t r_end = min(rows, r_begin + rows_per_split);
  float s = 0.0f;
  if (c < cols)
    for (int64_t r = r_begin + threadIdx.y; r < r_end; r += kRowLanes) s = __fadd_rn(s, dev_load_as_float(dy, t, r * cols + c));
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = sums[0][threadIdx.x];
    for (int k = 1; k < kRowLanes; ++k) total = __fadd_rn(total, sums[k][threadIdx.x]);
    if (partial != nullptr) partial[blockIdx.y * cols + c] = total;
    else dev_store_from_float(db, db_t, c, total);
  }
}

// As column_sum_kernel, 8 columns per thread from 16-byte loads (F16 / BF16, cols % 8 == 0,
// 16-byte aligned dy); each column's rows are added in the same order. One block's work: column
// block `bx`, band `band` (its rows [r_begin, r_end)).
template <DType T>
__device__ __forceinline__ void column_sum_vec_block(const void *dy, int64_t cols, int64_t r_begin, int64_t r_end,
                                                     float *partial, void *db, DType db_t, unsigned bx, unsigned band) {
  constexpr int kPer = 8;  // 2-byte values per 16-byte vector
  __shared__ float sums[kRowLanes][32 * kPer];
  const int64_t c = (static_cast<int64_t>(bx) * 32 + threadIdx.x) * kPer;
  const uint4 *base = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(dy) + c);
  const int64_t row_vecs = cols / kPer;  // a row's stride in vectors
  float s[kPer] = {};
  if (c < cols) {
    int64_t r = r_begin + threadIdx.y;
    constexpr int kInFlight = 4;
    for (; r + (kInFlight - 1) * kRowLanes < r_end; r += kInFlight * kRowLanes) {
      uint4 v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) v[u] = __ldg(base + (r + u * kRowLanes) * row_vecs);
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        float f[kPer];
        unpack16<T>(v[u], f);
#pragma unroll
        for (int j = 0; j < kPer; ++j) s[j] = __fadd_rn(s[j], f[j]);
      }
    }
    for (; r < r_end; r += kRowLanes) {
      float f[kPer];
      unpack16<T>(__ldg(base + r * row_vecs), f);
#pragma unroll
      for (int j = 0; j < kPer; ++j) s[j] = __fadd_rn(s[j], f[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) sums[threadIdx.y][threadIdx.x * kPer + j] = s[j];
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      float total = sums[0][threadIdx.x * kPer + j];
      for (int k = 1; k < kRowLanes; ++k) total = __fadd_rn(total, sums[k][threadIdx.x * kPer + j]);
      if (partial != nullptr) partial[band * cols + c + j] = total;
      else dev_store_from_float(db, db_t, c + j, total);
    }
  }
}

template <DType T>
__global__ void __launch_bounds__(32 * kRowLanes)
    column_sum_vec_kernel(const void *dy, int64_t rows, int64_t cols, int64_t rows_per_split, float *partial, void *db,
                          DType db_t) {
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  column_sum_vec_block<T>(dy, cols, r_begin, min(rows, r_begin + rows_per_split), partial, db, db_t, blockIdx.x,
                          blockIdx.y);
}

// Several tensors of one band each (blockIdx.y picks the tensor): at small shapes each launch,
// not the sum, is the cost, and GroupedLinear has one bias gradient per expert.
struct ColumnSumItem {
  const void *dy;
  int64_t rows, cols;
  void *db;
  DType db_t;
};
constexpr int kMaxColumnSumItems = 32;
struct ColumnSumBatch {
  ColumnSumItem item[kMaxColumnSumItems];
};

template <DType T>
__global__ void __launch_bounds__(32 * kRowLanes) column_sum_vec_many_kernel(const __grid_constant__ ColumnSumBatch b) {
  const ColumnSumItem &it = b.item[blockIdx.y];
  if (static_cast<int64_t>(blockIdx.x) * 32 * 8 >= it.cols) return;  // the whole block: a narrower tensor
  column_sum_vec_block<T>(it.dy, it.cols, 0, it.rows, nullptr, it.db, it.db_t, blockIdx.x, 0);
}

__global__ void sum_splits_kernel(const float *partial, int splits, int64_t cols, void *db, DType db_t) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int k = 0; k < splits; ++k) s = __fadd_rn(s, partial[k * cols + c]);
  dev_store_from_float(db, db_t, c, s);
}

}  // namespace

namespace {

// How bias_grad splits dy: 16-byte vectors or not, column blocks, bands of rows.
struct ColumnSumPlan {
  bool vec;
  int64_t rows, cols, col_blocks, splits, rows_per_split;
};

ColumnSumPlan plan_column_sum(const TensorView &dy) {
  ColumnSumPlan p;
  p.cols = dy.cols();
  p.rows = dy.numel() == 0 ? 0 : dy.rows();
  p.vec = (dy.dtype == DType::BF16 || dy.dtype == DType::F16) && p.cols % 8 == 0 && aligned16(dy.data);
  const int64_t cols_per_block = p.vec ? 32 * 8 : kCols;
  p.col_blocks = (p.cols + cols_per_block - 1) / cols_per_block;
  // Enough bands to give the GPU ~1024 blocks, each of at least 64 rows.
  int64_t splits = p.col_blocks > 0 ? 1024 / p.col_blocks : 1;
  splits = splits < 1 ? 1 : splits;
  splits = splits > kMaxSplits ? kMaxSplits : splits;
  const int64_t max_by_rows = (p.rows + 63) / 64;
  splits = splits > max_by_rows ? max_by_rows : splits;
  p.splits = splits < 1 ? 1 : splits;
  p.rows_per_split = (p.rows + p.splits - 1) / p.splits;
  return p;
}

template <DType T>
void launch_column_sum_many(const ColumnSumBatch &b, int n, int64_t col_blocks, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(n));
  launch_kernel<column_sum_vec_many_kernel<T>>(grid, dim3(32, kRowLanes), 0, stream, b);
}

// Tensors of one dtype gathered for column_sum_vec_many_kernel.
struct ColumnSumGather {
  DType t;
  ColumnSumBatch b{};
  int n = 0;
  int64_t col_blocks = 0;
  void flush(cudaStream_t stream) {
    if (n == 0) return;
    if (t == DType::BF16) launch_column_sum_many<DType::BF16>(b, n, col_blocks, stream);
    else launch_column_sum_many<DType::F16>(b, n, col_blocks, stream);
    n = 0, col_blocks = 0;
  }
  void add(const TensorView &dy, const TensorView &db, const ColumnSumPlan &p, cudaStream_t stream) {
    b.item[n++] = ColumnSumItem{dy.data, p.rows, p.cols, db.data, db.dtype};
    col_blocks = std::max(col_blocks, p.col_blocks);
    if (n == kMaxColumnSumItems) flush(stream);
  }
};

}  // namespace

void bias_grad(Backend &be, const TensorView &dy, const TensorView &db, cudaStream_t stream) {
  const ColumnSumPlan p = plan_column_sum(dy);
  if (p.cols == 0) return;
  Buffer partial;
  if (p.splits > 1) partial = Buffer(&be, static_cast<size_t>(p.splits * p.cols) * sizeof(float));
  const dim3 grid(static_cast<unsigned>(p.col_blocks), static_cast<unsigned>(p.splits));
  if (!p.vec) {
    launch_kernel<column_sum_kernel>(grid, dim3(kCols, kRowLanes), 0, stream, dy.data, dy.dtype, p.rows, p.cols,
        p.rows_per_split, partial.floats(), db.data, db.dtype);
  } else if (dy.dtype == DType::BF16) {
    launch_kernel<column_sum_vec_kernel<DType::BF16>>(grid, dim3(32, kRowLanes), 0, stream, dy.data, p.rows, p.cols,
        p.rows_per_split, partial.floats(), db.data, db.dtype);
  } else {
    launch_kernel<column_sum_vec_kernel<DType::F16>>(grid, dim3(32, kRowLanes), 0, stream, dy.data, p.rows, p.cols,
        p.rows_per_split, partial.floats(), db.data, db.dtype);
  }
  if (p.splits > 1) {
    launch_kernel<sum_splits_kernel>(static_cast<unsigned>((p.cols + 255) / 256), 256, 0, stream, partial.floats(),
        static_cast<int>(p.splits), p.cols, db.data, db.dtype);
  }
}

void bias_grad_many(Backend &be, const TensorView *dys, const TensorView *dbs, int n, cudaStream_t stream) {
  // One band of rows (a few rows, or columns enough to fill the GPU) and 16-byte vectors: the
  // same block's sums as bias_grad, so the same bits. Anything else goes alone.
  ColumnSumGather bf16{DType::BF16}, f16{DType::F16};
  for (int i = 0; i < n; ++i) {
    const ColumnSumPlan p = plan_column_sum(dys[i]);
    if (p.cols == 0) continue;
    if (p.vec && p.splits == 1) (dys[i].dtype == DType::BF16 ? bf16 : f16).add(dys[i], dbs[i], p, stream);
    else bias_grad(be, dys[i], dbs[i], stream);
  }
  bf16.flush(stream);
  f16.flush(stream);
}

void sum_bias_partials(const float *partial, int64_t parts, int64_t cols, const TensorView &db, cudaStream_t stream) {
  if (cols == 0) return;
  launch_kernel<sum_splits_kernel>(static_cast<unsigned>((cols + 255) / 256), 256, 0, stream, partial,
      static_cast<int>(parts), cols, db.data, db.dtype);
}

}  // namespace te::cuda
