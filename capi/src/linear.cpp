#include <memory>

#include "module_common.h"
#include "modules/common/validate.h"

using namespace te;
using namespace te::capi;

static_assert(TE_ROLE_GRAD_OUTPUT == static_cast<int>(TensorRole::GradOutput), "roles must match the core");

namespace {

LinearForwardArgs to_core(const te_linear_forward_args *a) {
  check_options(a, "args");
  check_bool(a->weight_unchanged, "args->weight_unchanged");
  LinearForwardArgs r;
  r.input = to_view(a->input, "args->input");
  r.weight = to_view(a->weight, "args->weight");
  r.bias = to_optional_view(a->bias, "args->bias");
  r.weight_unchanged = a->weight_unchanged;
  return r;
}

void check_same_context(const Context *c, const Linear *lin) {
  if (&lin->core()->ctx != c)
    fail(Status::InvalidArgument, "argument 'lin': created with another te_context than 'ctx'");
}

// The residuals a struct names. `internal` is a handle, so a struct whose residuals were saved or
// released — or a by-value copy of one — names nothing any more.
LinearSaved *saved_of(te_linear_residuals *r, const char *name) {
  check_options(r, name);
  return static_cast<LinearSaved *>(
      residuals_of(r->internal, HandleKind::Residuals, name, "te_linear_residuals", "te_linear_forward_compute"));
}

// The body of forward_compute; on success *residuals owns a new LinearSaved.
void forward_compute(te_context *ctx, te_linear *lin, const te_linear_forward_args *args, te_tensor *y,
                     SavedPtr &saved, TensorView *input_t, TensorView *weight_t) {
  Context *c = to_context(ctx);
  Linear *l = to_linear(lin);
  check_same_context(c, l);
  LinearForwardArgs a = to_core(args);
  TensorView yv = to_view(y, "y");
  linear_forward_compute(*c, *l, a, yv, saved, input_t, weight_t);
}

}  // namespace

extern "C" {

TE_API te_status te_linear_options_init(te_linear_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_linear_options{};
    opts->struct_size = sizeof *opts;
    opts->bias = 1;
    opts->activation_dtype = TE_DTYPE_BF16;
  });
}

TE_API te_status te_linear_create(te_linear **out, te_context *ctx, const te_linear_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    Context *c = to_context(ctx);
    check_options(opts, "opts");
    if (opts->in_features < 1) fail(Status::InvalidArgument, "argument 'opts->in_features': expected > 0, got %lld", (long long)opts->in_features);
    if (opts->out_features < 1) fail(Status::InvalidArgument, "argument 'opts->out_features': expected > 0, got %lld", (long long)opts->out_features);
    const int64_t weight_shape[2] = {opts->out_features, opts->in_features};
    if (shape_numel(weight_shape, 2) < 0)
      fail(Status::InvalidArgument, "argument 'opts': in_features * out_features = %lld * %lld exceeds 2^60 elements",
           (long long)opts->in_features, (long long)opts->out_features);
    check_bool(opts->bias, "opts->bias");
    check_bool(opts->fuse_wgrad_accumulation, "opts->fuse_wgrad_accumulation");
    const int act = enum_int(opts->activation_dtype);
    if (act != TE_DTYPE_F32 && act != TE_DTYPE_F16 && act != TE_DTYPE_BF16)
      fail(Status::InvalidArgument, "argument 'opts->activation_dtype': expected F32, F16 or BF16, got %d", act);
    LinearOptions o;
    o.in_features = opts->in_features;
    o.out_features = opts->out_features;
    o.bias = opts->bias;
    o.activation_dtype = static_cast<DType>(act);
    o.fuse_wgrad_accumulation = opts->fuse_wgrad_accumulation;
    *out = (new Linear(*c, o))->as_public<te_linear>();
  });
}

TE_API void te_linear_destroy(te_linear *lin) {
  delete live_or_null<Linear>(lin, HandleKind::Linear);
}

TE_API te_status te_linear_forward_args_init(te_linear_forward_args *args) {
  return guarded(__func__, [&] {
    check_not_null(args, "args");
    *args = te_linear_forward_args{};
    args->struct_size = sizeof *args;
  });
}

TE_API te_status te_linear_forward_compute(te_context *ctx, te_linear *lin, const te_linear_forward_args *args,
                                           te_tensor *y, te_linear_residuals *residuals) {
  return guarded(__func__, [&] {
    check_options(residuals, "residuals");
    SavedPtr saved;
    TensorView in_t, w_t;
    forward_compute(ctx, lin, args, y, saved, &in_t, &w_t);
    residuals->input_t = to_c_tensor(in_t);
    residuals->weight_t = to_c_tensor(w_t);
    residuals->fp8 = saved->proj.fp8;
    residuals->internal = saved.release()->as_public<void>();
  });
}

TE_API void te_linear_residuals_release(te_linear_residuals *residuals) {
  if (!residuals) return;
  // A struct whose residuals are gone (saved, released, or owned by the struct it was copied
  // from and released there) is left as it is.
  if (auto *s = live_or_null<LinearSaved>(residuals->internal, HandleKind::Residuals)) {
    s->pool->release(s);
    residuals->internal = nullptr;
  }
}

TE_API te_status te_linear_forward_save(te_context *ctx, te_linear *lin, te_linear_residuals *residuals,
                                        te_linear_backward_ctx **out) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Linear *l = to_linear(lin);
    check_same_context(c, l);
    check_not_null(out, "out");
    LinearSaved *s = saved_of(residuals, "residuals");
    if (s->layer != l->core()) fail(Status::InvalidArgument, "argument 'residuals': made by another te_linear than 'lin'");
    LinearBackwardCtx *b = linear_pool(*c).acquire_backward_ctx(*c);  // may throw: nothing moved yet
    s->retire();  // the struct (and every copy of it) no longer names the residuals
    b->saved = SavedPtr(s);
    residuals->internal = nullptr;
    *out = b->as_public<te_linear_backward_ctx>();
  });
}

TE_API te_status te_linear_forward(te_context *ctx, te_linear *lin, const te_linear_forward_args *args, te_tensor *y,
                                   te_linear_backward_ctx **out) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    Context *c = to_context(ctx);
    // The backward context first: once the forward ran, nothing may fail.
    LinearBackwardCtx *b = linear_pool(*c).acquire_backward_ctx(*c);
    try {
      forward_compute(ctx, lin, args, y, b->saved, nullptr, nullptr);
      b->saved->retire();  // owned by the backward context: no residuals handle names it
    } catch (...) {
      linear_pool(*c).release(b);
      throw;
    }
    *out = b->as_public<te_linear_backward_ctx>();
  });
}

TE_API te_status te_linear_backward_args_init(te_linear_backward_args *args) {
  return guarded(__func__, [&] {
    check_not_null(args, "args");
    *args = te_linear_backward_args{};
    args->struct_size = sizeof *args;
  });
}

TE_API te_status te_linear_backward(te_context *ctx, te_linear_backward_ctx *bwd, const te_tensor *dy, te_tensor *dx,
                                    te_tensor *dw, te_tensor *db, const te_linear_backward_args *args) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    LinearBackwardCtx *b = to_backward_ctx(bwd);
    if (b->ctx.get() != c)
      fail(Status::InvalidArgument, "argument 'bwd': made with another te_context than 'ctx'");
    LinearBackwardArgs a;
    a.once = backward_once(args);
    a.dy = to_view(dy, "dy");
    a.dx = to_optional_view(dx, "dx");
    a.dw = to_optional_view(dw, "dw");
    a.db = to_optional_view(db, "db");
    linear_backward(*c, *b, a);
  });
}

TE_API void te_linear_backward_ctx_destroy(te_linear_backward_ctx *bwd) {
  if (auto *b = live_or_null<LinearBackwardCtx>(bwd, HandleKind::BackwardCtx)) linear_pool(*b->ctx).release(b);
}

TE_API te_status te_linear_residuals_size(te_context *ctx, const te_linear *lin, const te_linear_forward_args *args,
                                          size_t *bytes) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Linear *l = to_linear(lin);
    check_same_context(c, l);
    check_not_null(bytes, "bytes");
    check_options(args, "args");
    check_bool(args->weight_unchanged, "args->weight_unchanged");
    const TensorView x = to_shape_view(args->input, "args->input");
    check_tensor(x, "args->input", l->options().activation_dtype, c->device());
    if (x.cols() != l->options().in_features)
      fail(Status::InvalidArgument, "argument 'args->input': expected last dimension in_features=%lld, got %lld",
           (long long)l->options().in_features, (long long)x.cols());
    *bytes = linear_residual_bytes(*c, *l, x.rows());
  });
}

TE_API te_status te_linear_forward_compute_into(te_context *ctx, te_linear *lin, const te_linear_forward_args *args,
                                                te_tensor *y, void *residuals, size_t residuals_bytes) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Linear *l = to_linear(lin);
    check_same_context(c, l);
    LinearForwardArgs a = to_core(args);
    TensorView yv = to_view(y, "y");
    linear_forward_compute_into(*c, *l, a, yv, residuals, residuals_bytes);
  });
}

TE_API te_status te_linear_backward_from(te_context *ctx, te_linear *lin, const te_linear_forward_args *inputs,
                                         const void *residuals, size_t residuals_bytes, const te_tensor *dy,
                                         te_tensor *dx, te_tensor *dw, te_tensor *db,
                                         const te_linear_backward_args *args) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Linear *l = to_linear(lin);
    check_same_context(c, l);
    LinearForwardArgs in;
    if (inputs) {
      check_options(inputs, "inputs");
      in.input = to_view(inputs->input, "inputs->input");
      in.weight = to_view(inputs->weight, "inputs->weight");
      in.bias = to_optional_view(inputs->bias, "inputs->bias");
      check_bool(inputs->weight_unchanged, "inputs->weight_unchanged");
    }
    LinearBackwardArgs a;
    a.once = backward_once(args);
    a.dy = to_view(dy, "dy");
    a.dx = to_optional_view(dx, "dx");
    a.dw = to_optional_view(dw, "dw");
    a.db = to_optional_view(db, "db");
    linear_backward_from(*c, *l, inputs ? &in : nullptr, residuals, residuals_bytes, a);
  });
}

TE_API te_status te_linear_get_scaling_state(te_context *ctx, const te_linear *lin, te_tensor_role role,
                                             te_scaling_state_info *info, float *history, size_t history_cap) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Linear *l = to_linear(lin);
    check_same_context(c, l);
    read_scaling_state(*c, l->core()->state(to_role(role)), info, history, history_cap);
  });
}

TE_API te_status te_linear_state_save(te_context *ctx, const te_linear *lin, void *buf, size_t capacity, size_t *size) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Linear *l = to_linear(lin);
    check_same_context(c, l);
    check_not_null(size, "size");
    size_t need = linear_state_size(*c, *l);
    if (buf) linear_state_save(*c, *l, buf, capacity);
    *size = need;
  });
}

TE_API te_status te_linear_state_load(te_context *ctx, te_linear *lin, const void *buf, size_t size) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Linear *l = to_linear(lin);
    check_same_context(c, l);
    check_not_null(buf, "buf");
    linear_state_load(*c, *l, buf, size);
  });
}

}  // extern "C"
