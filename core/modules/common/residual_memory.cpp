#include "modules/common/residual_memory.h"

#include <cstdint>

#include "base/check.h"

namespace te {

size_t col_residual_bytes(ScalingMode mode, int64_t rows, int64_t cols) {
  const size_t codes = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  const size_t scales = sizeof(float) * static_cast<size_t>(scale_inv_count(mode, cols, rows));
  return residual_aligned(codes) + residual_aligned(scales);
}

void check_residual_block(const void *block, size_t bytes, size_t need, const char *name) {
  if (need == 0) return;
  if (!block)
    fail(Status::InvalidArgument, "argument '%s': NULL, but this forward leaves %zu bytes of residuals", name, need);
  if (reinterpret_cast<uintptr_t>(block) % kResidualBaseAlign != 0)
    fail(Status::InvalidArgument, "argument '%s': expected %zu-byte aligned memory, got %p", name, kResidualBaseAlign,
         block);
  if (bytes < need)
    fail(Status::InvalidArgument,
         "argument '%s_bytes': this forward leaves %zu bytes of residuals (te_*_residuals_size), got room for %zu",
         name, need, bytes);
}

void *ResidualBlock::take(size_t bytes) {
  const size_t n = residual_aligned(bytes);
  if (n > bytes_ - used_) fail(Status::Internal, "residual block overflow: %zu + %zu > %zu bytes", used_, n, bytes_);
  void *p = base_ + used_;
  used_ += n;
  return p;
}

void ResidualBlock::adopt_col(Backend &be, QuantizedMatrix &q) {
  TensorView col = q.col;
  const size_t codes = col.bytes();
  const size_t scales = sizeof(float) * static_cast<size_t>(scale_inv_count(col.scaling, col.rows(), col.cols()));
  void *data = take(codes);
  float *scale_inv = static_cast<float *>(take(scales));
  be.copy(data, col.data, codes);
  be.copy(scale_inv, col.scale_inv, scales);
  q = QuantizedMatrix();  // the copies are ordered before any later use of the freed storage
  col.data = data;
  col.scale_inv = scale_inv;
  q.col = col;
}

void *ResidualBlock::adopt(Backend &be, Buffer &b) {
  const size_t n = b.bytes();
  if (!n) return nullptr;
  void *p = take(n);
  be.copy(p, b.get(), n);
  b = Buffer::borrowed(p, n);  // frees the library's copy, ordered after the copy
  return p;
}

void check_residual_count(const ResidualBlock &rb, size_t need, const char *module) {
  if (rb.used() != need)
    fail(Status::Internal, "%s: the residuals took %zu bytes, residuals_size says %zu", module, rb.used(), need);
}

void ResidualRecords::put(const void *key, void *record, size_t bytes) {
  Entry *slot = nullptr;
  for (Entry &e : entries_)
    if (e.record && e.key == key) slot = &e;
  if (!slot)
    for (Entry &e : entries_)
      if (!e.record) {
        slot = &e;
        break;
      }
  if (!slot) {
    slot = &entries_[0];
    for (Entry &e : entries_)
      if (e.stamp < slot->stamp) slot = &e;
  }
  if (slot->record) destroy_(slot->record);
  slot->key = key;
  slot->record = record;
  slot->bytes = bytes;
  slot->stamp = next_stamp_++;
}

void *ResidualRecords::find(const void *key, size_t *bytes) const {
  for (const Entry &e : entries_)
    if (e.record && e.key == key) {
      if (bytes) *bytes = e.bytes;
      return e.record;
    }
  return nullptr;
}

void *ResidualRecords::lookup(const void *block, size_t bytes) const {
  size_t need = 0;
  void *r = find(block, &need);
  if (!r)
    fail(Status::InvalidArgument,
         "argument 'residuals': no forward_compute_into of this module left residuals at %p (or its record was "
         "dropped: by a TE_BACKWARD_ONCE backward, or by %d later forwards into other memory)",
         block, kResidualRecords);
  if (bytes < need)
    fail(Status::InvalidArgument, "argument 'residuals_bytes': the forward left %zu bytes there, got %zu", need, bytes);
  return r;
}

void ResidualRecords::erase(const void *key) {
  for (Entry &e : entries_)
    if (e.record && e.key == key) {
      void *r = e.record;
      e = Entry();
      destroy_(r);
    }
}

void ResidualRecords::clear() {
  for (Entry &e : entries_)
    if (e.record) {
      void *r = e.record;
      e = Entry();
      destroy_(r);
    }
}

}  // namespace te
