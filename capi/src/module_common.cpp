// Translations every module's shims share: roles, scaling-state reports, norm options, backward
// flags, residual views.
#include <cmath>

#include "module_common.h"

namespace te::capi {

te_tensor to_c_tensor(const TensorView &v) {
  te_tensor t{};
  t.data = v.data;
  t.dtype = static_cast<te_dtype>(v.dtype);
  t.ndim = v.ndim;
  for (int i = 0; i < v.ndim; ++i) t.shape[i] = v.shape[i];
  t.device.type = static_cast<te_device_type>(v.device.type);
  t.device.index = v.device.index;
  t.scale_inv = v.scale_inv;
  t.scaling = static_cast<te_scaling_mode>(v.scaling);
  return t;
}

TensorRole to_role(const te_tensor_role &role) {
  const int r = enum_int(role);
  if (r < TE_ROLE_INPUT || r > TE_ROLE_GRAD_OUTPUT)
    fail(Status::InvalidArgument, "argument 'role': expected a te_tensor_role value, got %d", r);
  return static_cast<TensorRole>(r);
}

void read_scaling_state(Context &ctx, const ScalingState &st, te_scaling_state_info *info, float *history,
                        size_t history_cap) {
  check_options(info, "info");
  float scale = 1.0f, scale_inv = 1.0f;
  const int cap = history_cap > 65536 ? 65536 : static_cast<int>(history_cap);
  ctx.autocast().settle();  // a deferred scale update is part of the pass that ended
  st.read(ctx.backend(), &scale, &scale_inv, history, history ? cap : 0);
  info->scale = scale;
  info->scale_inv = scale_inv;
  info->amax_history_len = st.history_len();
  info->fp8_dtype = static_cast<te_dtype>(st.fp8_dtype());
}

NormOptions to_norm_options(const te_norm_kind &kind, float eps, int32_t zero_centered_gamma, const char *opts,
                            const char *kind_field) {
  const int k = enum_int(kind);
  if (k != TE_NORM_LAYERNORM && k != TE_NORM_RMSNORM)
    fail(Status::InvalidArgument, "argument '%s->%s': expected TE_NORM_LAYERNORM or TE_NORM_RMSNORM, got %d", opts,
         kind_field, k);
  if (!(eps > 0.0f) || !std::isfinite(eps))
    fail(Status::InvalidArgument, "argument '%s->eps': expected a finite value > 0, got %g", opts, (double)eps);
  if (zero_centered_gamma != 0 && zero_centered_gamma != 1)
    fail(Status::InvalidArgument, "argument '%s->zero_centered_gamma': expected 0 or 1, got %d", opts,
         zero_centered_gamma);
  NormOptions o;
  o.kind = static_cast<NormKind>(k);
  o.eps = eps;
  o.zero_centered_gamma = zero_centered_gamma;
  return o;
}

void check_features(int64_t in, int64_t out, const char *in_name, const char *out_name) {
  if (in < 1) fail(Status::InvalidArgument, "argument '%s': expected > 0, got %lld", in_name, (long long)in);
  if (out < 1) fail(Status::InvalidArgument, "argument '%s': expected > 0, got %lld", out_name, (long long)out);
  const int64_t shape[2] = {out, in};
  if (shape_numel(shape, 2) < 0)
    fail(Status::InvalidArgument, "argument '%s': %s * %s = %lld * %lld exceeds 2^60 elements", in_name, in_name,
         out_name, (long long)in, (long long)out);
}

DType to_activation_dtype(const te_dtype &d, const char *name) {
  const int act = enum_int(d);
  if (act != TE_DTYPE_F32 && act != TE_DTYPE_F16 && act != TE_DTYPE_BF16)
    fail(Status::InvalidArgument, "argument '%s': expected F32, F16 or BF16, got %d", name, act);
  return static_cast<DType>(act);
}

bool backward_once(const te_linear_backward_args *args) {
  if (!args) return false;
  check_options(args, "args");
  if (args->flags & ~TE_BACKWARD_ONCE)
    fail(Status::InvalidArgument, "argument 'args->flags': unknown flags 0x%x", args->flags & ~TE_BACKWARD_ONCE);
  return args->flags & TE_BACKWARD_ONCE;
}

}  // namespace te::capi
