// Argument validation for the core. Messages name the argument and say what was expected and
// what was received; the C shims prefix the public function's name. Formatting happens only on
// the error path.
#pragma once

#include <cstdarg>

#include "base/types.h"

namespace te {

[[noreturn]] void fail(Status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

inline void check_not_null(const void *p, const char *name) {
  if (!p) fail(Status::InvalidArgument, "argument '%s': expected a non-NULL pointer, got NULL", name);
}

// A shape of `ndim` dimensions (1..kMaxDims) each >= 1, with at most kMaxElements elements;
// returns the element count. `name` names the tensor ("x" -> "x->shape[1]").
int64_t check_shape(const int64_t *shape, int ndim, const char *name);

void check_dtype(const TensorView &t, const char *name, DType expected);
void check_high_precision(const TensorView &t, const char *name);
void check_fp8(const TensorView &t, const char *name);
void check_device(const TensorView &t, const char *name, const Device &expected);
// t is [rows, cols] when seen as a matrix (leading dims folded), exactly 2-D when `exact_2d`.
void check_matrix(const TensorView &t, const char *name, int64_t rows, int64_t cols);
void check_same_shape(const TensorView &t, const char *name, const TensorView &ref, const char *ref_name);
// Whether two tensors' bytes overlap (on one device), and the check that an output does not
// overlap an input it is computed from.
bool memory_overlaps(const TensorView &a, const TensorView &b);
void check_separate(const TensorView &out, const char *out_name, const TensorView &in, const char *in_name);
// FP8 GEMM operands and outputs: every dimension a multiple of 16 (cuBLASLt's rule, kept on
// every backend so that programs behave the same everywhere).
void check_fp8_dims(const char *what, int64_t m, int64_t n, int64_t k);

}  // namespace te
