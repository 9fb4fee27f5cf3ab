// Translations the module shims share (Linear and the transformer modules).
#pragma once

#include "capi_common.h"
#include "modules/norm/norm_stage.h"

namespace te::capi {

// A core view as a C tensor (residual structs expose library storage this way).
te_tensor to_c_tensor(const TensorView &v);

// The module-side enums and structs every module shares. Enums are taken by reference: a C enum
// may hold any int, and copying it as the enum type is undefined for values outside its range.
TensorRole to_role(const te_tensor_role &role);  // validates
void read_scaling_state(Context &ctx, const ScalingState &st, te_scaling_state_info *info, float *history,
                        size_t history_cap);
// The te_norm_kind / eps / zero_centered_gamma fields of options struct `opts` (its argument
// name), the kind being field `kind_field`.
NormOptions to_norm_options(const te_norm_kind &kind, float eps, int32_t zero_centered_gamma, const char *opts,
                            const char *kind_field);
// Module shapes: both > 0 and their product within 2^60 elements.
void check_features(int64_t in, int64_t out, const char *in_name, const char *out_name);
// F32, F16 or BF16.
DType to_activation_dtype(const te_dtype &d, const char *name);
// Backward flags (args may be NULL): whether TE_BACKWARD_ONCE was given.
bool backward_once(const te_linear_backward_args *args);

}  // namespace te::capi
