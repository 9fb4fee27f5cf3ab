#include "cpu/cpu_allocator.h"

#include <cstdlib>
#include <string>

#include "te/core/types.h"

namespace te {

CpuCachingAllocator::~CpuCachingAllocator() {
  // Blocks still handed out at destruction are released too: the backend owns all its memory.
  for (void *p : owned_) std::free(p);
}

size_t CpuCachingAllocator::size_class(size_t bytes) {
  const size_t aligned = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (aligned <= 4 * kAlignment) return aligned;
  // Highest power of two <= aligned, then round up to the next quarter of it.
  size_t pow2 = 1;
  while (pow2 <= aligned / 2) pow2 *= 2;
  const size_t quarter = pow2 / 4;
  return (aligned + quarter - 1) / quarter * quarter;
}

void *CpuCachingAllocator::alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t cls = size_class(bytes);
  SizeClass &sc = classes_[cls];  // inserts a node only the first time a class is seen
  if (!sc.free_blocks.empty()) {
    void *p = sc.free_blocks.back();
    sc.free_blocks.pop_back();  // keeps the vector's capacity
    return p;
  }
  void *p = std::aligned_alloc(kAlignment, cls);
  if (p == nullptr) {
    throw Error(Status::OutOfMemory, "the CPU backend could not allocate " + std::to_string(cls) +
                                         " bytes (" + std::to_string(reserved_bytes_) +
                                         " bytes already reserved)");
  }
  owned_.push_back(p);
  // Room for every block of the class now, so that free() never allocates.
  sc.free_blocks.reserve(++sc.blocks_total);
  ++system_allocations_;
  reserved_bytes_ += cls;
  return p;
}

void CpuCachingAllocator::free(void *ptr, size_t bytes) {
  if (ptr == nullptr) return;
  classes_[size_class(bytes)].free_blocks.push_back(ptr);
}

}  // namespace te
