#include "modules/grouped_linear/expert_rows.h"

#include <cstdint>

namespace te {

namespace {

unsigned char *row_ptr(const TensorView &m, int64_t row) {
  return static_cast<unsigned char *>(m.data) + static_cast<size_t>(row * m.cols()) * dtype_size(m.dtype);
}

size_t row_bytes(const TensorView &m, int64_t rows) { return static_cast<size_t>(rows * m.cols()) * dtype_size(m.dtype); }

}  // namespace

int64_t layout_expert_rows(const int64_t *splits, int n, bool fp8, ExpertRows *rows) {
  int64_t row = 0, pad = 0;
  for (int i = 0; i < n; ++i) {
    ExpertRows &e = rows[i];
    e.row0 = row;
    e.tokens = splits[i];
    e.padded = fp8 ? (e.tokens + 15) / 16 * 16 : e.tokens;
    e.pad_row0 = e.padded != e.tokens ? pad : -1;
    if (e.is_padded()) pad += e.padded;
    row += e.tokens;
  }
  return pad;
}

TensorView row_block(const TensorView &m, int64_t row0, int64_t rows) {
  if (!m.data) return TensorView();
  return make_view(row_ptr(m, row0), m.dtype, m.device, rows, m.cols());
}

TensorView expert_matrix(const ExpertRows &e, const TensorView &m, const TensorView &pad) {
  if (!m.data) return TensorView();
  return e.is_padded() ? row_block(pad, e.pad_row0, e.padded) : row_block(m, e.row0, e.tokens);
}

namespace {

// The padded experts' segments, in calls of up to kChunk (no allocation on the hot path).
template <class MakeSegment>
void copy_padded_experts(Backend &be, const ExpertRows *rows, int n, void *dst, const void *src, size_t row_bytes,
                         MakeSegment make) {
  constexpr int kChunk = 32;
  RowSegment segs[kChunk];
  int k = 0;
  for (int i = 0; i < n; ++i) {
    if (!rows[i].is_padded()) continue;
    segs[k++] = make(rows[i]);
    if (k == kChunk) be.copy_row_segments(dst, src, row_bytes, segs, k), k = 0;
  }
  if (k) be.copy_row_segments(dst, src, row_bytes, segs, k);
}

}  // namespace

void pad_experts(Backend &be, const ExpertRows *rows, int n, const TensorView &m, const TensorView &pad) {
  copy_padded_experts(be, rows, n, pad.data, m.data, row_bytes(m, 1), [](const ExpertRows &e) {
    RowSegment s;
    s.src_row = e.row0, s.dst_row = e.pad_row0, s.rows = e.tokens, s.zero_rows = e.padded - e.tokens;
    return s;
  });
}

void unpad_experts(Backend &be, const ExpertRows *rows, int n, const TensorView &pad, const TensorView &m) {
  copy_padded_experts(be, rows, n, m.data, pad.data, row_bytes(m, 1), [](const ExpertRows &e) {
    RowSegment s;
    s.src_row = e.pad_row0, s.dst_row = e.row0, s.rows = e.tokens;
    return s;
  });
}

}  // namespace te
