// Several tensors in one launch: each item's blocks lie one after the other in the grid, the
// item recording its first block (`first_block`), the batch its items (`item[]`) and their count
// (`n`). block_item finds the calling block's item.
//
// By value, the item is selected with constant indices (a dynamic index into an ordinary
// parameter copies the whole batch to local memory) and its fields live in registers. In place,
// the kernel's parameter must be __grid_constant__: the item is read where the launch put it,
// nothing copied, which leaves registers to kernels that run out of them (an activation's math);
// ptxas decides which is better per kernel (`nvcc -Xptxas -v`).
#pragma once

#include <cuda_runtime.h>

namespace te::cuda {

template <class Batch>
__device__ __forceinline__ int block_item_index(const Batch &b) {
  constexpr int kMax = static_cast<int>(sizeof(b.item) / sizeof(b.item[0]));
  int item = 0;
#pragma unroll
  for (int i = 1; i < kMax; ++i)
    if (i < b.n && blockIdx.x >= b.item[i].first_block) item = i;
  return item;
}

template <bool kInPlace, class Batch>
__device__ __forceinline__ decltype(auto) block_item(const Batch &b) {
  if constexpr (kInPlace) {
    return (b.item[block_item_index(b)]);  // a reference into the parameter space
  } else {
    constexpr int kMax = static_cast<int>(sizeof(b.item) / sizeof(b.item[0]));
    auto it = b.item[0];
#pragma unroll
    for (int i = 1; i < kMax; ++i)
      if (i < b.n && blockIdx.x >= b.item[i].first_block) it = b.item[i];
    return it;
  }
}

}  // namespace te::cuda
