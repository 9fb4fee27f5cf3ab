// Embedding gather and its deterministic scatter-add on CUDA, bit-identical to the CPU reference
// (cpu_embedding.cpp).
// Forward: one block per token copies its table row (16-, 4- or 2-byte units, whichever the row
// size and alignment allow); an id outside [0, vocab) writes a zero row (no host sync to refuse).
// Backward, without float atomics:
//   1. keys[t] = ids[t] (an out-of-range id becomes the key vocab: it sorts after every row and
//      no row reads it, i.e. the token is skipped), vals[t] = t;
//   2. cub::DeviceRadixSort::SortPairs on the bits that hold 0..vocab; the sort is stable, so
//      each id's tokens stay in increasing t;
//   3. offsets[r] = first position of key r in the sorted keys (one binary search per row);
//   4. one block per (row, chunk of kChunkCols columns): each thread sums its columns over the
//      row's segment in sorted order, i.e. increasing t, from 0 (or from dtable's value when
//      accumulating), one __fadd_rn per token: the CPU's order exactly. Rows that no token
//      names get 0 (or stay as they are).
// Scratch (planned by plan_embedding_backward, one block): keys and values in and out, the
// offsets and CUB's temporary storage.
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fp8_convert.cuh"
#include "backends/cuda/kernel_launch.cuh"
#include "backends/training_args.h"
#include "base/check.h"

namespace te::cuda {

namespace {

constexpr int kGatherThreads = 128;
constexpr int kSumThreads = 256;
constexpr int kColsPerThread = 4;
constexpr int kChunkCols = kSumThreads * kColsPerThread;  // columns one block of the sum covers
constexpr size_t kAlign = 256;

size_t align_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// Bits needed to hold 0..vocab (the sentinel key vocab included).
int key_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= vocab) ++bits;
  return bits;
}

template <class Unit>
__global__ void __launch_bounds__(kGatherThreads)
    gather_kernel(const Unit *__restrict__ table, const int32_t *__restrict__ ids, int64_t vocab,
                  int64_t units_per_row, Unit *__restrict__ y) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  Unit *dst = y + t * units_per_row;
  if (id >= 0 && id < vocab) {
    const Unit *src = table + static_cast<int64_t>(id) * units_per_row;
    for (int64_t u = threadIdx.x; u < units_per_row; u += kGatherThreads) dst[u] = src[u];
  } else {
    for (int64_t u = threadIdx.x; u < units_per_row; u += kGatherThreads) dst[u] = Unit{};  // +0 bits
  }
}

template <class Unit>
void launch_gather(const EmbeddingForwardArgs &a, int64_t row_bytes, cudaStream_t stream) {
  const int64_t n = a.ids.numel();
  launch_kernel<gather_kernel<Unit>>(static_cast<unsigned>(n), kGatherThreads, 0, stream,
      static_cast<const Unit *>(a.table.data), static_cast<const int32_t *>(a.ids.data), a.table.shape[0],
      row_bytes / static_cast<int64_t>(sizeof(Unit)), static_cast<Unit *>(a.y.data));
}

bool aligned(const void *p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

__global__ void make_keys_kernel(const int32_t *__restrict__ ids, int64_t n, int64_t vocab, uint32_t *__restrict__ keys,
                                 uint32_t *__restrict__ vals) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int32_t id = ids[t];
  keys[t] = (id >= 0 && id < vocab) ? static_cast<uint32_t>(id) : static_cast<uint32_t>(vocab);
  vals[t] = static_cast<uint32_t>(t);
}

// offsets[r] = the first position whose key is >= r, for r in 0..vocab (keys sorted ascending).
__global__ void row_offsets_kernel(const uint32_t *__restrict__ keys, int64_t n, int64_t vocab,
                                   uint32_t *__restrict__ offsets) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r > vocab) return;
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int64_t>(keys[mid]) < r) lo = mid + 1;
    else hi = mid;
  }
  offsets[r] = static_cast<uint32_t>(lo);
}

// Each block sums its row's tokens (in increasing t, the order the stable sort kept) over its
// columns. The tokens' values are loaded kBatch at a time before they are added in order: the
// adds stay one dependent chain per column (the definition), but the loads overlap, so a row
// holding many tokens (a frequent byte) waits for memory once per batch, not once per token.
template <DType kDy>
__global__ void __launch_bounds__(kSumThreads)
    row_sum_kernel(const uint32_t *__restrict__ offsets, const uint32_t *__restrict__ tokens, const void *__restrict__ dy,
                   int64_t dim, bool accumulate, float *__restrict__ dtable) {
  constexpr uint32_t kBatch = 8;
  __shared__ uint32_t tile[kSumThreads];
  const int64_t row = blockIdx.x;
  const uint32_t begin = offsets[row], end = offsets[row + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kChunkCols + threadIdx.x;
  float *out = dtable + row * dim;
  if (begin == end) {  // no token: zero, or unchanged when accumulating
    if (!accumulate)
      for (int i = 0; i < kColsPerThread; ++i) {
        const int64_t c = c0 + i * kSumThreads;
        if (c < dim) out[c] = 0.0f;
      }
    return;
  }
  float s[kColsPerThread];
  for (int i = 0; i < kColsPerThread; ++i) {
    const int64_t c = c0 + i * kSumThreads;
    s[i] = (accumulate && c < dim) ? out[c] : 0.0f;
  }
  for (uint32_t k0 = begin; k0 < end; k0 += kSumThreads) {
    const uint32_t count = min(static_cast<uint32_t>(kSumThreads), end - k0);
    __syncthreads();  // the previous tile is no longer read
    if (threadIdx.x < count) tile[threadIdx.x] = tokens[k0 + threadIdx.x];
    __syncthreads();
    uint32_t k = 0;
    for (; k + kBatch <= count; k += kBatch) {
      float v[kBatch][kColsPerThread];
#pragma unroll
      for (uint32_t j = 0; j < kBatch; ++j) {
        const int64_t base = static_cast<int64_t>(tile[k + j]) * dim;
#pragma unroll
        for (int i = 0; i < kColsPerThread; ++i) {
          const int64_t c = c0 + i * kSumThreads;
          v[j][i] = c < dim ? dev_load_as_float(dy, kDy, base + c) : 0.0f;
        }
      }
#pragma unroll
      for (uint32_t j = 0; j < kBatch; ++j)
#pragma unroll
        for (int i = 0; i < kColsPerThread; ++i) s[i] = __fadd_rn(s[i], v[j][i]);
    }
    for (; k < count; ++k) {
      const int64_t base = static_cast<int64_t>(tile[k]) * dim;
#pragma unroll
      for (int i = 0; i < kColsPerThread; ++i) {
        const int64_t c = c0 + i * kSumThreads;
        if (c < dim) s[i] = __fadd_rn(s[i], dev_load_as_float(dy, kDy, base + c));
      }
    }
  }
  for (int i = 0; i < kColsPerThread; ++i) {
    const int64_t c = c0 + i * kSumThreads;
    if (c < dim) out[c] = s[i];
  }
}

// The scratch of one backward: where each piece lies in the one block.
struct SortScratch {
  size_t keys_in = 0, keys_out = 0, vals_in = 0, vals_out = 0, offsets = 0, cub = 0, cub_bytes = 0, total = 0;
};

SortScratch sort_scratch(int64_t n, int64_t vocab) {
  SortScratch s;
  const size_t words = align_up(static_cast<size_t>(n) * sizeof(uint32_t));
  s.keys_in = 0;
  s.keys_out = s.keys_in + words;
  s.vals_in = s.keys_out + words;
  s.vals_out = s.vals_in + words;
  s.offsets = s.vals_out + words;
  s.cub = s.offsets + align_up(static_cast<size_t>(vocab + 1) * sizeof(uint32_t));
  // A size query: CUB computes it on the host without touching the (null) arrays.
  TE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, s.cub_bytes, static_cast<const uint32_t *>(nullptr),
                                                static_cast<uint32_t *>(nullptr), static_cast<const uint32_t *>(nullptr),
                                                static_cast<uint32_t *>(nullptr), static_cast<int>(n), 0,
                                                key_bits(vocab)));
  s.total = s.cub + align_up(s.cub_bytes ? s.cub_bytes : 1);
  return s;
}

void check_sizes(int64_t n, int64_t vocab) {
  // Tokens and rows are indexed by 32-bit keys and values, and CUB takes an int count.
  if (n >= (int64_t{1} << 31) || vocab >= (int64_t{1} << 31) - 1)
    fail(Status::Unsupported, "embedding backward: more than 2^31 - 1 tokens or rows on CUDA");
}

}  // namespace

void CudaBackend::embedding_forward(const EmbeddingForwardArgs &a) {
  DeviceGuard g(device_);
  const int64_t n = a.ids.numel();
  if (n == 0) return;
  const int64_t row_bytes = a.table.cols() * static_cast<int64_t>(dtype_size(a.table.dtype));
  if (row_bytes % 16 == 0 && aligned(a.table.data, 16) && aligned(a.y.data, 16))
    launch_gather<uint4>(a, row_bytes, stream_);
  else if (row_bytes % 4 == 0 && aligned(a.table.data, 4) && aligned(a.y.data, 4))
    launch_gather<uint32_t>(a, row_bytes, stream_);
  else
    launch_gather<uint16_t>(a, row_bytes, stream_);
}

void CudaBackend::plan_embedding_backward(const EmbeddingBackwardArgs &a, ScratchPlan *plan) const {
  DeviceGuard g(device_);
  check_sizes(a.ids.numel(), a.dtable.shape[0]);
  plan->add(sort_scratch(a.ids.numel(), a.dtable.shape[0]).total);
}

void CudaBackend::embedding_backward(const EmbeddingBackwardArgs &a) {
  DeviceGuard g(device_);
  const int64_t n = a.ids.numel(), vocab = a.dtable.shape[0], dim = a.dtable.cols();
  check_sizes(n, vocab);
  const SortScratch layout = sort_scratch(n, vocab);
  Buffer scratch(this, layout.total);
  char *base = static_cast<char *>(scratch.get());
  auto *keys_in = reinterpret_cast<uint32_t *>(base + layout.keys_in);
  auto *keys_out = reinterpret_cast<uint32_t *>(base + layout.keys_out);
  auto *vals_in = reinterpret_cast<uint32_t *>(base + layout.vals_in);
  auto *vals_out = reinterpret_cast<uint32_t *>(base + layout.vals_out);
  auto *offsets = reinterpret_cast<uint32_t *>(base + layout.offsets);
  const unsigned threads = 256;
  launch_kernel<make_keys_kernel>(static_cast<unsigned>((n + threads - 1) / threads), threads, 0, stream_,
      static_cast<const int32_t *>(a.ids.data), n, vocab, keys_in, vals_in);
  size_t cub_bytes = layout.cub_bytes;
  TE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + layout.cub, cub_bytes, keys_in, keys_out, vals_in, vals_out,
                                                static_cast<int>(n), 0, key_bits(vocab), stream_));
  launch_kernel<row_offsets_kernel>(static_cast<unsigned>((vocab + 1 + threads - 1) / threads), threads, 0, stream_,
      keys_out, n, vocab, offsets);
  const dim3 grid(static_cast<unsigned>(vocab), static_cast<unsigned>((dim + kChunkCols - 1) / kChunkCols));
  float *dtable = static_cast<float *>(a.dtable.data);
  switch (a.dy.dtype) {
    case DType::BF16:
      launch_kernel<row_sum_kernel<DType::BF16>>(grid, kSumThreads, 0, stream_, offsets, vals_out, a.dy.data, dim,
          a.accumulate, dtable);
      break;
    case DType::F16:
      launch_kernel<row_sum_kernel<DType::F16>>(grid, kSumThreads, 0, stream_, offsets, vals_out, a.dy.data, dim,
          a.accumulate, dtable);
      break;
    default:
      launch_kernel<row_sum_kernel<DType::F32>>(grid, kSumThreads, 0, stream_, offsets, vals_out, a.dy.data, dim,
          a.accumulate, dtable);
      break;
  }
}

}  // namespace te::cuda
