#include <cstdint>
#include "base/check.h"

#include <cstdio>

namespace te {

ArgName ArgName::element(const char *prefix, const char *array, int64_t index) {
  ArgName n(prefix, array);
  n.form_ = Form::Element;
  n.index_ = index;
  return n;
}

ArgName ArgName::field_of(const char *array, int64_t index, const char *field) {
  ArgName n(array, field);
  n.form_ = Form::FieldOfElement;
  n.index_ = index;
  return n;
}

const char *ArgName::c_str() const {
  const long long i = index_;
  switch (form_) {
    case Form::Field:
      if (!prefix_) return field_;
      std::snprintf(buf_, sizeof buf_, "%s->%s", prefix_, field_);
      break;
    case Form::Element:
      if (prefix_) std::snprintf(buf_, sizeof buf_, "%s->%s[%lld]", prefix_, field_, i);
      else std::snprintf(buf_, sizeof buf_, "%s[%lld]", field_, i);
      break;
    case Form::FieldOfElement: std::snprintf(buf_, sizeof buf_, "%s[%lld].%s", prefix_, i, field_); break;
  }
  return buf_;
}

void fail(Status status, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  throw Error(status, buf);
}

int64_t check_shape(const int64_t *shape, int ndim, const ArgName &name) {
  if (ndim < 1 || ndim > kMaxDims)
    fail(Status::InvalidArgument, "argument '%s->ndim': expected 1..%d, got %d", name.c_str(), kMaxDims, ndim);
  for (int i = 0; i < ndim; ++i)
    if (shape[i] < 1)
      fail(Status::InvalidArgument, "argument '%s->shape[%d]': expected a positive size, got %lld", name.c_str(), i,
           (long long)shape[i]);
  const int64_t n = shape_numel(shape, ndim);
  if (n < 0)
    fail(Status::InvalidArgument, "argument '%s->shape': expected at most 2^60 elements, got a product of %d "
         "dimensions that exceeds it", name.c_str(), ndim);
  return n;
}

void check_dtype(const TensorView &t, const ArgName &name, DType expected) {
  if (t.dtype != expected)
    fail(Status::InvalidArgument, "argument '%s': expected dtype %s, got %s", name.c_str(), dtype_name(expected),
         dtype_name(t.dtype));
}

void check_high_precision(const TensorView &t, const ArgName &name) {
  if (!is_high_precision(t.dtype))
    fail(Status::InvalidArgument, "argument '%s': expected dtype F32, F16 or BF16, got %s", name.c_str(),
         dtype_name(t.dtype));
}

void check_fp8(const TensorView &t, const ArgName &name) {
  if (!is_fp8(t.dtype))
    fail(Status::InvalidArgument, "argument '%s': expected dtype E4M3 or E5M2, got %s",
         name.c_str(), dtype_name(t.dtype));
}

void check_device(const TensorView &t, const ArgName &name, const Device &expected) {
  if (t.device != expected)
    fail(Status::InvalidArgument, "argument '%s': expected a tensor on the context's device %s:%d, got %s:%d",
         name.c_str(),
         device_name(expected.type), expected.index, device_name(t.device.type), t.device.index);
}

void check_matrix(const TensorView &t, const ArgName &name, int64_t rows, int64_t cols) {
  if (t.rows() != rows || t.cols() != cols)
    fail(Status::InvalidArgument, "argument '%s': expected shape [%lld, %lld] (leading dims folded), got [%lld, %lld]",
         name.c_str(), (long long)rows, (long long)cols, (long long)t.rows(), (long long)t.cols());
}

void check_same_shape(const TensorView &t, const ArgName &name, const TensorView &ref, const ArgName &ref_name) {
  bool same = t.ndim == ref.ndim;
  for (int i = 0; same && i < t.ndim; ++i) same = t.shape[i] == ref.shape[i];
  if (!same)
    fail(Status::InvalidArgument, "argument '%s': expected the shape of '%s' (%d dims, %lld elements), got %d dims, %lld elements",
         name.c_str(), ref_name.c_str(), ref.ndim, (long long)ref.numel(), t.ndim, (long long)t.numel());
}

bool memory_overlaps(const TensorView &a, const TensorView &b) {
  const auto pa = reinterpret_cast<uintptr_t>(a.data), pb = reinterpret_cast<uintptr_t>(b.data);
  return a.device == b.device && pa < pb + b.bytes() && pb < pa + a.bytes();
}

void check_separate(const TensorView &out, const ArgName &out_name, const TensorView &in, const ArgName &in_name) {
  if (memory_overlaps(out, in))
    fail(Status::InvalidArgument, "argument '%s': its memory overlaps that of '%s' (expected separate memory)",
         out_name.c_str(),
         in_name.c_str());
}

void check_fp8_dims(const char *what, int64_t m, int64_t n, int64_t k) {
  if (m % 16 || n % 16 || k % 16)
    fail(Status::Unsupported,
         "%s: FP8 GEMMs need every dimension to be a multiple of 16, got m=%lld n=%lld k=%lld", what,
         (long long)m, (long long)n, (long long)k);
}

}  // namespace te
