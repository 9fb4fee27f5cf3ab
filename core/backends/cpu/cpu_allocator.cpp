#include "backends/cpu/cpu_allocator.h"

#include <cstdlib>
#include <new>
#include <string>
#include <unistd.h>

#include "base/types.h"

namespace te {

namespace {
// A request above the machine's physical memory can never be met; refusing it up front keeps
// absurd sizes (a corrupt shape, SIZE_MAX / 2) from reaching the system allocator, where
// sanitizer runtimes abort instead of returning NULL.
size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return static_cast<size_t>(PTRDIFF_MAX);
  return static_cast<size_t>(pages) * static_cast<size_t>(page);
}

// Blocks come from the aligned nothrow operator new (not aligned_alloc), so that a program that
// replaces operator new — the fault-injection tests do — sees every allocation libte makes.
void *system_alloc(size_t bytes) {
  return ::operator new(bytes, std::align_val_t{CpuCachingAllocator::kAlignment}, std::nothrow);
}
void system_free(void *p) { ::operator delete(p, std::align_val_t{CpuCachingAllocator::kAlignment}); }
}  // namespace

CpuCachingAllocator::CpuCachingAllocator() : max_block_bytes_(physical_memory_bytes()) {}

CpuCachingAllocator::~CpuCachingAllocator() {
  // Blocks still handed out at destruction are released too: the backend owns all its memory.
  for (void *p : owned_) system_free(p);
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
  if (bytes > max_block_bytes_)
    throw Error(Status::OutOfMemory, "the CPU backend cannot allocate " + std::to_string(bytes) +
                                         " bytes: more than this machine's memory (" +
                                         std::to_string(max_block_bytes_) + " bytes)");
  const size_t cls = size_class(bytes);
  SizeClass &sc = classes_[cls];  // inserts a node only the first time a class is seen
  if (!sc.free_blocks.empty()) {
    void *p = sc.free_blocks.back();
    sc.free_blocks.pop_back();  // keeps the vector's capacity
    return p;
  }
  owned_.reserve(owned_.size() + 1);  // nothing can fail once the block is taken
  sc.free_blocks.reserve(sc.blocks_total + 1);
  void *p = system_alloc(cls);
  if (p == nullptr) {
    throw Error(Status::OutOfMemory, "the CPU backend could not allocate " + std::to_string(cls) +
                                         " bytes (" + std::to_string(reserved_bytes_) +
                                         " bytes already reserved)");
  }
  owned_.push_back(p);
  ++sc.blocks_total;  // free_blocks has room for every block of the class: free() never allocates
  ++system_allocations_;
  reserved_bytes_ += cls;
  return p;
}

void CpuCachingAllocator::free(void *ptr, size_t bytes) {
  if (ptr == nullptr) return;
  classes_[size_class(bytes)].free_blocks.push_back(ptr);
}

}  // namespace te
