// te_add, te_split_columns, te_concat_columns: validation over the backend's add and copy_2d.
#include <cstdint>

#include "capi_common.h"

using namespace te;
using namespace te::capi;

namespace {

constexpr size_t kMaxColumnParts = 64;

// "outputs[0]".."outputs[63]" built at compile time: argument names without formatting a string
// on every call (split and concat run in every training step).
struct PartNames {
  char name[kMaxColumnParts][16] = {};
  constexpr explicit PartNames(const char *base) {
    for (size_t i = 0; i < kMaxColumnParts; ++i) {
      size_t k = 0;
      for (const char *p = base; *p; ++p) name[i][k++] = *p;
      name[i][k++] = '[';
      if (i >= 10) name[i][k++] = static_cast<char>('0' + i / 10);
      name[i][k++] = static_cast<char>('0' + i % 10);
      name[i][k++] = ']';
    }
  }
};
constexpr PartNames kOutputNames("outputs"), kInputNames("inputs");

// The shared checks of split and concat: `whole` [rows, C] against parts[i] [rows, c_i] with
// sum c_i = C, one dtype, the context's device, no part overlapping the whole or another part.
void check_column_parts(Context &c, const TensorView &whole, const char *whole_name, const TensorView *parts,
                        size_t n, const char *parts_name, const PartNames &names) {
  check_device(whole, whole_name, c.device());
  const int64_t rows = whole.rows();
  int64_t cols = 0;
  for (size_t i = 0; i < n; ++i) {
    const char *name = names.name[i];
    check_dtype(parts[i], name, whole.dtype);
    check_device(parts[i], name, c.device());
    if (parts[i].rows() != rows)
      fail(Status::InvalidArgument, "argument '%s': expected %lld rows (the leading dimensions of '%s'), got %lld",
           name, (long long)rows, whole_name, (long long)parts[i].rows());
    if (memory_overlaps(parts[i], whole))
      fail(Status::InvalidArgument, "argument '%s': overlaps '%s' (expected separate memory)", name, whole_name);
    for (size_t j = 0; j < i; ++j)
      if (memory_overlaps(parts[i], parts[j]))
        fail(Status::InvalidArgument, "argument '%s': overlaps %s[%zu]", name, parts_name, j);
    cols += parts[i].cols();
  }
  if (cols != whole.cols())
    fail(Status::InvalidArgument, "argument '%s': expected last dimensions summing to %lld (the last dimension of '%s'), "
         "got %lld", parts_name, (long long)whole.cols(), whole_name, (long long)cols);
}

size_t check_count(size_t n, const char *name) {
  if (n < 1 || n > kMaxColumnParts)
    fail(Status::InvalidArgument, "argument '%s': expected 1..%zu, got %zu", name, kMaxColumnParts, n);
  return n;
}

}  // namespace

extern "C" {

TE_API te_status te_add(te_context *ctx, const te_tensor *a, const te_tensor *b, te_tensor *y) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    TensorView av = to_view(a, "a"), bv = to_view(b, "b"), yv = to_view(y, "y");
    check_high_precision(av, "a");
    check_dtype(bv, "b", av.dtype);
    check_dtype(yv, "y", av.dtype);
    check_device(av, "a", c->device());
    check_device(bv, "b", c->device());
    check_device(yv, "y", c->device());
    check_same_shape(bv, "b", av, "a");
    check_same_shape(yv, "y", av, "a");
    c->backend().add(av, bv, yv);
  });
}

TE_API te_status te_split_columns(te_context *ctx, const te_tensor *x, te_tensor *const *outputs, size_t n) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    TensorView xv = to_view(x, "x");
    check_not_null(outputs, "outputs");
    check_count(n, "n");
    TensorView parts[kMaxColumnParts];
    for (size_t i = 0; i < n; ++i) parts[i] = to_view(outputs[i], kOutputNames.name[i]);
    check_column_parts(*c, xv, "x", parts, n, "outputs", kOutputNames);
    const size_t es = dtype_size(xv.dtype), pitch = static_cast<size_t>(xv.cols()) * es;
    size_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t width = static_cast<size_t>(parts[i].cols()) * es;
      c->backend().copy_2d(parts[i].data, width, static_cast<const char *>(xv.data) + offset, pitch, width,
                           static_cast<size_t>(xv.rows()));
      offset += width;
    }
  });
}

TE_API te_status te_concat_columns(te_context *ctx, const te_tensor *const *inputs, size_t n, te_tensor *y) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    check_not_null(inputs, "inputs");
    check_count(n, "n");
    TensorView parts[kMaxColumnParts];
    for (size_t i = 0; i < n; ++i) parts[i] = to_view(inputs[i], kInputNames.name[i]);
    TensorView yv = to_view(y, "y");
    check_column_parts(*c, yv, "y", parts, n, "inputs", kInputNames);
    const size_t es = dtype_size(yv.dtype), pitch = static_cast<size_t>(yv.cols()) * es;
    size_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t width = static_cast<size_t>(parts[i].cols()) * es;
      c->backend().copy_2d(static_cast<char *>(yv.data) + offset, pitch, parts[i].data, width, width,
                           static_cast<size_t>(yv.rows()));
      offset += width;
    }
  });
}

}  // extern "C"
