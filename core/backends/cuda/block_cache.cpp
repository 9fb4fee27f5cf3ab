#include "backends/cuda/block_cache.h"

namespace te::cuda {

size_t BlockCache::size_class(size_t bytes) {
  if (bytes <= (size_t(1) << 20)) return bytes <= 512 ? 512 : (bytes + 511) / 512 * 512;
  size_t p = size_t(1) << 20;
  while (p <= bytes / 2) p *= 2;
  const size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

void *BlockCache::take(size_t bytes) {
  const size_t c = size_class(bytes);
  auto it = free_.find(c);
  if (it == free_.end() || it->second.empty()) return nullptr;
  void *p = it->second.back();
  it->second.pop_back();
  cached_bytes_ -= c;
  return p;
}

bool BlockCache::put(void *ptr, size_t bytes) {
  const size_t c = size_class(bytes);
  if (cached_bytes_ + c > kMaxCachedBytes) return false;
  free_[c].push_back(ptr);
  cached_bytes_ += c;
  return true;
}

}  // namespace te::cuda
