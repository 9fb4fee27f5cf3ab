// A caching host allocator: 64-byte aligned blocks kept on free lists by size class, so that
// once a training step has run, later steps get every scratch buffer from the cache and never
// call the system allocator. Not thread-safe: a backend belongs to one context, used by one
// thread at a time.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

namespace te {

class CpuCachingAllocator {
 public:
  static constexpr size_t kAlignment = 64;

  CpuCachingAllocator();
  ~CpuCachingAllocator();
  CpuCachingAllocator(const CpuCachingAllocator &) = delete;
  CpuCachingAllocator &operator=(const CpuCachingAllocator &) = delete;

  // nullptr for 0 bytes; throws te::Error(OutOfMemory) when the system has no memory left.
  void *alloc(size_t bytes);
  // `bytes` must be what alloc was asked for (it names the size class). nullptr is a no-op.
  void free(void *ptr, size_t bytes);

  // Rounds a request up to its size class: a multiple of 64 bytes, with four classes per
  // power of two above 256 bytes, so a cached block wastes at most a quarter of itself.
  static size_t size_class(size_t bytes);

  // Observability for tests and stats: blocks obtained from the system so far, and their total.
  size_t system_allocations() const { return system_allocations_; }
  size_t reserved_bytes() const { return reserved_bytes_; }

 private:
  struct SizeClass {
    std::vector<void *> free_blocks;  // capacity >= blocks_total: free() never allocates
    size_t blocks_total = 0;          // blocks of this class ever taken from the system
  };
  std::map<size_t, SizeClass> classes_;  // by class size in bytes
  std::vector<void *> owned_;                          // every system block, freed at the end
  size_t max_block_bytes_;  // physical memory: no single request above it can succeed
  size_t system_allocations_ = 0;
  size_t reserved_bytes_ = 0;
};

}  // namespace te
