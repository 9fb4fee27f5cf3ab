// Device blocks kept on the host for reuse on the backend's stream, so that a training step's
// allocations and frees make no CUDA call once its sizes repeat.
//
// Why it is safe: every kernel, copy and GEMM of a backend runs in order on its one stream. A block
// freed on the host may still be read by work already enqueued; whoever takes it next enqueues its
// own work on the same stream, after that work, so the reuse is ordered exactly as
// cudaFreeAsync + cudaMallocAsync on one stream would order it. What would break that order is
// the backend's to handle: a stream change (drain first) and stream capture (a block used by a
// captured graph must not be handed to eager work, so capture bypasses the cache).
//
// Blocks are handed out in size classes: a freed block serves any later request of its class.
// Callers free with the byte count they allocated (Buffer does), which names the class again.
#pragma once

#include <cstddef>
#include <unordered_map>
#include <vector>

namespace te::cuda {

class BlockCache {
 public:
  // The bytes a request of `bytes` is allocated with: 512-byte steps up to 1 MiB, above that steps
  // of 1/8 of the power of two below (at most 12.5% slack), so that sizes which vary a little
  // (a ragged last batch) still share blocks.
  static size_t size_class(size_t bytes);

  // A cached block of `bytes`' class, or nullptr.
  void *take(size_t bytes);
  // Caches a freed block of `bytes`' class; false (nothing cached) past kMaxCachedBytes.
  bool put(void *ptr, size_t bytes);
  // Empties the cache, calling free_block(ptr) for each cached block.
  template <class F>
  void drain(F &&free_block) {
    for (auto &kv : free_) {
      for (void *p : kv.second) free_block(p);
      kv.second.clear();
    }
    cached_bytes_ = 0;
  }
  size_t cached_bytes() const { return cached_bytes_; }

  // Freed blocks beyond this many cached bytes go back to the stream-ordered pool, which still
  // keeps them for the device (cudaMallocAsync's own cache, one CUDA call away).
  static constexpr size_t kMaxCachedBytes = size_t(4) << 30;

 private:
  std::unordered_map<size_t, std::vector<void *>> free_;  // by size class; the vectors keep their room
  size_t cached_bytes_ = 0;
};

}  // namespace te::cuda
