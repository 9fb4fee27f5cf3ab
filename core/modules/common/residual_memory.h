// Residuals in the caller's memory. A framework that owns every tensor saved between forward and
// backward (torch.compile, CUDA-graph capture) gives each forward a block of its own memory; the
// module moves its activation residuals (FP8 codes and their scale_inv) there and keeps only the
// host-side rest (recipe, autocast pass, the cached FP8 weight) in a record keyed by the block's
// address, which the backward looks up.
#pragma once

#include <cstddef>
#include <cstdint>

#include "scaling/quantize.h"

// The modules' caller-memory calls share this flow (linear/caller_residuals.cpp and the
// modules' caller_residuals.cpp): validate the arguments, compute the bytes from shapes and the
// innermost scope, check_residual_block, take a pooled backward context (allocations before
// anything changes), run the opaque forward_compute, move its library-owned activation
// residuals into a ResidualBlock piece by piece (the same pieces, in the same order, that the
// size counted) and file the backward context in the module's ResidualRecords. The backward
// looks the record up, re-points the saved views of caller tensors (x, gamma, W) to `inputs`
// and runs the opaque backward.

namespace te {

constexpr size_t kResidualAlign = 256;  // every piece starts on a 256-byte boundary of the block
constexpr size_t kResidualBaseAlign = 16;  // what the caller's block must be aligned to (FP8 GEMMs)
constexpr int kResidualRecords = 64;    // TE_RESIDUAL_RECORDS

inline size_t residual_aligned(size_t bytes) { return (bytes + kResidualAlign - 1) / kResidualAlign * kResidualAlign; }

// Bytes the column-wise (transposed) copy of an FP8 [rows, cols] matrix takes in the block: its
// codes [cols, rows] and its scale_inv.
size_t col_residual_bytes(ScalingMode mode, int64_t rows, int64_t cols);

// Bytes a plain buffer of `bytes` takes in the block.
inline size_t buffer_residual_bytes(size_t bytes) { return residual_aligned(bytes); }

// INVALID_ARGUMENT unless `block` can hold `need` bytes: non-NULL when need > 0, aligned, big enough.
void check_residual_block(const void *block, size_t bytes, size_t need, const char *name);

// Hands out consecutive aligned pieces of a checked block.
class ResidualBlock {
 public:
  ResidualBlock(void *base, size_t bytes) : base_(static_cast<unsigned char *>(base)), bytes_(bytes) {}
  void *take(size_t bytes);
  // Moves q's column-wise copy (codes and scale_inv) into the block and frees the library's
  // storage of q: afterwards q.col views the block and q owns nothing.
  void adopt_col(Backend &be, QuantizedMatrix &q);
  // Moves a library buffer into the block: afterwards b borrows the block (frees nothing) and
  // the library's storage is freed. Returns the new address (views of b must be re-pointed).
  void *adopt(Backend &be, Buffer &b);
  size_t used() const { return used_; }

 private:
  unsigned char *base_;
  size_t bytes_;
  size_t used_ = 0;
};

// INTERNAL unless the pieces moved into `rb` took exactly the `need` bytes residuals_size said.
void check_residual_count(const ResidualBlock &rb, size_t need, const char *module);

// The records of a module's pending forwards, keyed by their blocks' addresses. A fixed array:
// putting a record never allocates. Records are opaque to it; `destroy` frees one.
class ResidualRecords {
 public:
  using Destroy = void (*)(void *record);
  explicit ResidualRecords(Destroy destroy) : destroy_(destroy) {}
  ~ResidualRecords() { clear(); }
  ResidualRecords(const ResidualRecords &) = delete;
  ResidualRecords &operator=(const ResidualRecords &) = delete;

  // Takes `record` of a forward that left `bytes` in the block at `key`; replaces (frees) the
  // record of the same key, else frees the oldest when full.
  void put(const void *key, void *record, size_t bytes = 0);
  // The record of `key` (nullptr: none) and the bytes its forward left there.
  void *find(const void *key, size_t *bytes = nullptr) const;
  // The record a backward_from names: INVALID_ARGUMENT when `block` holds none (never filled, or
  // dropped by a TE_BACKWARD_ONCE backward or by kResidualRecords later forwards) or `bytes` is
  // less than the forward left there.
  void *lookup(const void *block, size_t bytes) const;
  void erase(const void *key);
  void clear();

 private:
  struct Entry {
    const void *key = nullptr;
    void *record = nullptr;
    size_t bytes = 0;
    uint64_t stamp = 0;
  };
  Entry entries_[kResidualRecords];
  uint64_t next_stamp_ = 1;
  Destroy destroy_;
};

}  // namespace te
