// Argument checks every module shares. Each throws InvalidArgument with a message naming the
// argument and saying what was expected and what was received.
#pragma once

#include <cstdio>

#include "base/check.h"

namespace te {

// "prefix->field" for messages, without allocating: the forward checks its arguments as "args",
// the caller-memory backward checks the same struct given again as "inputs".
struct ArgName {
  char s[64];
  ArgName(const char *prefix, const char *field) { std::snprintf(s, sizeof s, "%s->%s", prefix, field); }
  operator const char *() const { return s; }
};

// A module tensor argument: `dtype` on `device`.
void check_tensor(const TensorView &t, const char *name, DType dtype, const Device &device);
// Exactly [rows, cols].
void check_weight(const TensorView &t, const char *name, int64_t rows, int64_t cols, DType dtype, const Device &device);
// Exactly [n].
void check_vector(const TensorView &t, const char *name, int64_t n, DType dtype, const Device &device);
// Present iff the module has it ("the layer was created with bias, got NULL").
void check_presence(const TensorView &t, const char *name, bool expected, const char *why);
// An activation output [..., cols] with the leading dimensions of `input`; `cols_name` names the
// module option that sets cols ("out_features").
void check_output_like(const TensorView &t, const char *name, const TensorView &input, int64_t cols,
                       const char *cols_name, DType dtype, const Device &device);
// The FP8 dimension rule for a module's GEMM, naming the input when the tokens are the culprit.
void check_module_fp8_dims(const char *input_name, const char *module_name, int64_t tokens, int64_t n, int64_t k);

}  // namespace te
