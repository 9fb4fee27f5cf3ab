// Argument validation for the core. Messages name the argument and say what was expected and
// what was received; the C shims prefix the public function's name. Formatting happens only on
// the error path.
#pragma once

#include <cstdarg>

#include "base/types.h"

namespace te {

[[noreturn]] void fail(Status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// An argument's name for messages: a plain string ("x"), "prefix->field" (a module's forward
// checks its arguments as "args", the caller-memory backward the same struct given again as
// "inputs"), an array's element ("args->weights[3]", "dw[3]") or an element's field
// ("params[3].grad"), formatted only when a message asks for it (c_str): checks that pass
// format nothing.
class ArgName {
 public:
  ArgName(const char *name) : field_(name) {}  // implicit: every check takes a plain string too
  ArgName(const char *prefix, const char *field) : prefix_(prefix), field_(field) {}
  // "prefix->array[index]" ("array[index]" when prefix is null).
  static ArgName element(const char *prefix, const char *array, int64_t index);
  // "array[index].field".
  static ArgName field_of(const char *array, int64_t index, const char *field);
  const char *c_str() const;

 private:
  enum class Form : unsigned char { Field, Element, FieldOfElement };
  const char *prefix_ = nullptr, *field_ = nullptr;  // FieldOfElement: prefix_ is the array
  int64_t index_ = 0;
  Form form_ = Form::Field;
  mutable char buf_[80];
};

inline void check_not_null(const void *p, const ArgName &name) {
  if (!p) fail(Status::InvalidArgument, "argument '%s': expected a non-NULL pointer, got NULL", name.c_str());
}

// A shape of `ndim` dimensions (1..kMaxDims) each >= 1, with at most kMaxElements elements;
// returns the element count. `name` names the tensor ("x" -> "x->shape[1]").
int64_t check_shape(const int64_t *shape, int ndim, const ArgName &name);

void check_dtype(const TensorView &t, const ArgName &name, DType expected);
void check_high_precision(const TensorView &t, const ArgName &name);
void check_fp8(const TensorView &t, const ArgName &name);
void check_device(const TensorView &t, const ArgName &name, const Device &expected);
// t is [rows, cols] when seen as a matrix (leading dims folded), exactly 2-D when `exact_2d`.
void check_matrix(const TensorView &t, const ArgName &name, int64_t rows, int64_t cols);
void check_same_shape(const TensorView &t, const ArgName &name, const TensorView &ref, const ArgName &ref_name);
// Whether two tensors' bytes overlap (on one device), and the check that an output does not
// overlap an input it is computed from.
bool memory_overlaps(const TensorView &a, const TensorView &b);
void check_separate(const TensorView &out, const ArgName &out_name, const TensorView &in, const ArgName &in_name);
// FP8 GEMM operands and outputs: every dimension a multiple of 16 (cuBLASLt's rule, kept on
// every backend so that programs behave the same everywhere).
void check_fp8_dims(const char *what, int64_t m, int64_t n, int64_t k);

}  // namespace te
