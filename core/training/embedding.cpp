// te_embedding_forward / te_embedding_backward: every check happens before the backend is
// called, so a refused call writes nothing.
#include "training/embedding.h"

#include <cstdint>

#include "backends/training_args.h"
#include "modules/common/validate.h"

namespace te {

namespace {

// [vocab, dim] with both positive (to_view already refuses zero dimensions).
void check_table(const TensorView &t, const char *name) {
  if (t.ndim != 2) fail(Status::InvalidArgument, "argument '%s': expected 2 dimensions [vocab, dim], got %d", name, t.ndim);
}

// n * dim elements whose last dimension is dim (ids' shape followed by dim, or any such shape).
void check_rows_of(const TensorView &t, const char *name, int64_t n, int64_t dim) {
  if (t.cols() != dim || t.numel() != n * dim)
    fail(Status::InvalidArgument,
         "argument '%s': expected %lld tokens x dim %lld (last dimension dim), got %lld elements, last dimension %lld",
         name, (long long)n, (long long)dim, (long long)t.numel(), (long long)t.cols());
}

// The CPU core reads host memory: an id outside [0, vocab) is refused, naming the first one.
// (CUDA cannot look without a host sync; its kernels treat such ids as absent.)
void check_ids_in_range(const TensorView &ids, int64_t vocab, const Device &dev) {
  if (dev.type != DeviceType::CPU) return;
  const int32_t *p = static_cast<const int32_t *>(ids.data);
  const int64_t n = ids.numel();
  for (int64_t t = 0; t < n; ++t)
    if (p[t] < 0 || p[t] >= vocab)
      fail(Status::InvalidArgument, "argument 'ids': id %d at position %lld is outside [0, vocab = %lld)", p[t],
           (long long)t, (long long)vocab);
}

}  // namespace

void embedding_forward(Context &ctx, const TensorView &table, const TensorView &ids, const TensorView &y) {
  const Device &dev = ctx.device();
  check_high_precision(table, "table");
  check_device(table, "table", dev);
  check_table(table, "table");
  check_tensor(ids, "ids", DType::I32, dev);
  check_tensor(y, "y", table.dtype, dev);
  const int64_t vocab = table.shape[0], dim = table.shape[1], n = ids.numel();
  check_rows_of(y, "y", n, dim);
  // Outputs must not share memory with inputs (the kernels read while they write).
  check_separate(y, "y", table, "table");
  check_separate(y, "y", ids, "ids");
  check_ids_in_range(ids, vocab, dev);
  EmbeddingForwardArgs a;
  a.table = table;
  a.ids = ids;
  a.y = y;
  ctx.backend().embedding_forward(a);
}

void embedding_backward(Context &ctx, const TensorView &ids, const TensorView &dy, const TensorView &dtable,
                        bool accumulate) {
  const Device &dev = ctx.device();
  check_tensor(ids, "ids", DType::I32, dev);
  check_high_precision(dy, "dy");
  check_device(dy, "dy", dev);
  check_tensor(dtable, "dtable", DType::F32, dev);
  check_table(dtable, "dtable");
  const int64_t vocab = dtable.shape[0], dim = dtable.shape[1], n = ids.numel();
  check_rows_of(dy, "dy", n, dim);
  check_separate(dtable, "dtable", dy, "dy");
  check_separate(dtable, "dtable", ids, "ids");
  check_ids_in_range(ids, vocab, dev);
  EmbeddingBackwardArgs a;
  a.ids = ids;
  a.dy = dy;
  a.dtable = dtable;
  a.accumulate = accumulate;
  // The scratch (CUDA: the sort of the ids) is reserved first: running out of memory then
  // happens before dtable is touched.
  Backend &be = ctx.backend();
  ScratchPlan plan;
  be.plan_embedding_backward(a, &plan);
  be.reserve(plan);
  be.embedding_backward(a);
}

}  // namespace te
