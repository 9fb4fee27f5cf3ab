// Embedding gather and its scatter-add on the CPU: the reference the CUDA kernels match bit for
// bit. Forward copies rows (no arithmetic). Backward defines the order of the sums: each row of
// dtable starts from 0 (or its own value when accumulating) and adds dy[t, :] for the tokens t
// that name it in increasing t, one fp32 rounding per add. Ids outside [0, vocab) are skipped
// (the core refuses them on the CPU before calling; CUDA gets them and skips them the same way).
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_convert.h"
#include "backends/training_args.h"

namespace te {

void CpuBackend::embedding_forward(const EmbeddingForwardArgs &a) {
  const int64_t vocab = a.table.shape[0], dim = a.table.cols(), n = a.ids.numel();
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(a.table.dtype);
  const int32_t *ids = static_cast<const int32_t *>(a.ids.data);
  const unsigned char *table = static_cast<const unsigned char *>(a.table.data);
  unsigned char *y = static_cast<unsigned char *>(a.y.data);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = ids[t];
    unsigned char *dst = y + static_cast<size_t>(t) * row_bytes;
    if (id >= 0 && id < vocab) std::memcpy(dst, table + static_cast<size_t>(id) * row_bytes, row_bytes);
    else std::memset(dst, 0, row_bytes);  // all-zero bits are +0 in every float dtype
  }
}

void CpuBackend::embedding_backward(const EmbeddingBackwardArgs &a) {
  const int64_t vocab = a.dtable.shape[0], dim = a.dtable.cols(), n = a.ids.numel();
  const int32_t *ids = static_cast<const int32_t *>(a.ids.data);
  float *dtable = static_cast<float *>(a.dtable.data);
  // Zeroing first then adding in increasing t is the order the definition fixes: a row's
  // value after token t is the fp32 sum of its tokens up to t (0 + x == x exactly, -0 too:
  // +0 + -0 = +0 on both backends).
  if (!a.accumulate) std::memset(dtable, 0, static_cast<size_t>(vocab * dim) * sizeof(float));
  std::vector<float> row(static_cast<size_t>(dim));
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = ids[t];
    if (id < 0 || id >= vocab) continue;
    cpu::load_floats(a.dy.data, a.dy.dtype, t * dim, dim, row.data());
    float *dst = dtable + static_cast<int64_t>(id) * dim;
    for (int64_t c = 0; c < dim; ++c) dst[c] = dst[c] + row[static_cast<size_t>(c)];
  }
}

}  // namespace te
