// Argument checks every module shares. Each throws InvalidArgument with a message naming the
// argument and saying what was expected and what was received.
#pragma once

#include "base/check.h"

namespace te {

// A module tensor argument: `dtype` on `device`.
void check_tensor(const TensorView &t, const ArgName &name, DType dtype, const Device &device);
// Exactly [rows, cols].
void check_weight(const TensorView &t, const ArgName &name, int64_t rows, int64_t cols, DType dtype,
                  const Device &device);
// Exactly [n].
void check_vector(const TensorView &t, const ArgName &name, int64_t n, DType dtype, const Device &device);
// Present iff the module has it ("the layer was created with bias, got NULL").
void check_presence(const TensorView &t, const ArgName &name, bool expected, const char *why);
// An activation output [..., cols] with the leading dimensions of `input`; `cols_name` names the
// module option that sets cols ("out_features").
void check_output_like(const TensorView &t, const ArgName &name, const TensorView &input, int64_t cols,
                       const char *cols_name, DType dtype, const Device &device);
// The FP8 dimension rule for a module's GEMM, naming the input when the tokens are the culprit.
void check_module_fp8_dims(const ArgName &input_name, const ArgName &module_name, int64_t tokens, int64_t n,
                           int64_t k);

}  // namespace te
