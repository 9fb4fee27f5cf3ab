#include "module_shims.h"
#include "modules/common/validate.h"
#include "modules/layernorm_linear/layernorm_linear.h"

using namespace te;
using namespace te::capi;

namespace {

struct M {
  using Module = LayerNormLinear;
  using Saved = LayerNormLinearSaved;
  using BackwardCtx = LayerNormLinearBackwardCtx;
  static constexpr HandleKind kModule = HandleKind::LayerNormLinear, kSaved = HandleKind::LayerNormLinearResiduals,
                             kBackward = HandleKind::LayerNormLinearBackwardCtx;
  static constexpr const char *kArg = "m";
  static constexpr const char *kModuleType = "te_layernorm_linear", *kResidualsType = "te_layernorm_linear_residuals",
                              *kComputeFn = "te_layernorm_linear_forward_compute";
  static auto &pools(Context &c) { return layernorm_linear_pools(c); }
  static size_t state_size(Context &c, const LayerNormLinear &m) { return layernorm_linear_state_size(c, m); }
  static void state_save(Context &c, const LayerNormLinear &m, void *buf, size_t cap) { layernorm_linear_state_save(c, m, buf, cap); }
  static void state_load(Context &c, LayerNormLinear &m, const void *buf, size_t size) { layernorm_linear_state_load(c, m, buf, size); }
};

// prefix: "args" (a forward) or "inputs" (backward_from: the forward's arguments again).
LayerNormLinearForwardArgs to_core(const te_layernorm_linear_forward_args *a, const char *p = "args") {
  check_options(a, p);
  check_bool(a->weight_unchanged, ArgName(p, "weight_unchanged"));
  LayerNormLinearForwardArgs r;
  r.input = to_view(a->input, ArgName(p, "input"));
  r.ln_weight = to_view(a->ln_weight, ArgName(p, "ln_weight"));
  r.ln_bias = to_optional_view(a->ln_bias, ArgName(p, "ln_bias"));
  r.weight = to_view(a->weight, ArgName(p, "weight"));
  r.bias = to_optional_view(a->bias, ArgName(p, "bias"));
  r.ln_out = to_optional_view(a->ln_out, ArgName(p, "ln_out"));
  r.weight_unchanged = a->weight_unchanged;
  return r;
}

LayerNormLinearGrads to_core(const te_layernorm_linear_grads *grads) {
  LayerNormLinearGrads g;
  if (grads) {
    check_options(grads, "grads");
    g.dx = to_optional_view(grads->dx, "grads->dx");
    g.dgamma = to_optional_view(grads->dln_weight, "grads->dln_weight");
    g.dbeta = to_optional_view(grads->dln_bias, "grads->dln_bias");
    g.dw = to_optional_view(grads->dw, "grads->dw");
    g.db = to_optional_view(grads->db, "grads->db");
  }
  return g;
}

LayerNormLinearSaved *forward_compute(te_context *ctx, te_layernorm_linear *m,
                                      const te_layernorm_linear_forward_args *args, te_tensor *y) {
  Context *c = to_context(ctx);
  LayerNormLinear *l = module_of<M>(c, m);
  LayerNormLinearForwardArgs a = to_core(args);
  TensorView yv = to_view(y, "y");
  return layernorm_linear_forward_compute(*c, *l, a, yv);
}

}  // namespace

extern "C" {

TE_API te_status te_layernorm_linear_options_init(te_layernorm_linear_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_layernorm_linear_options{};
    opts->struct_size = sizeof *opts;
    opts->bias = 1;
    opts->activation_dtype = TE_DTYPE_BF16;
    opts->normalization = TE_NORM_LAYERNORM;
    opts->eps = 1e-5f;
  });
}

TE_API te_status te_layernorm_linear_create(te_layernorm_linear **out, te_context *ctx,
                                            const te_layernorm_linear_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    Context *c = to_context(ctx);
    check_options(opts, "opts");
    LayerNormLinearOptions o;
    o.in_features = opts->in_features;
    o.out_features = opts->out_features;
    check_features(o.in_features, o.out_features, "opts->in_features", "opts->out_features");
    check_bool(opts->bias, "opts->bias");
    check_bool(opts->fuse_wgrad_accumulation, "opts->fuse_wgrad_accumulation");
    o.bias = opts->bias;
    o.activation_dtype = to_activation_dtype(opts->activation_dtype, "opts->activation_dtype");
    o.fuse_wgrad_accumulation = opts->fuse_wgrad_accumulation;
    o.norm = to_norm_options(opts->normalization, opts->eps, opts->zero_centered_gamma, "opts", "normalization");
    *out = (new LayerNormLinear(*c, o))->as_public<te_layernorm_linear>();
  });
}

TE_API void te_layernorm_linear_destroy(te_layernorm_linear *m) {
  delete live_or_null<LayerNormLinear>(m, HandleKind::LayerNormLinear);
}

TE_API te_status te_layernorm_linear_forward_args_init(te_layernorm_linear_forward_args *args) {
  return guarded(__func__, [&] {
    check_not_null(args, "args");
    *args = te_layernorm_linear_forward_args{};
    args->struct_size = sizeof *args;
  });
}

TE_API te_status te_layernorm_linear_forward_compute(te_context *ctx, te_layernorm_linear *m,
                                                     const te_layernorm_linear_forward_args *args, te_tensor *y,
                                                     te_layernorm_linear_residuals *residuals) {
  return guarded(__func__, [&] {
    check_options(residuals, "residuals");
    LayerNormLinearSaved *s = forward_compute(ctx, m, args, y);
    const ProjectionSaved &p = s->proj;
    const Device dev = s->ctx->device();
    residuals->ln_out_t = to_c_tensor(p.fp8 ? p.x.col : p.x_hp);
    residuals->weight_t = to_c_tensor(p.fp8 ? p.w->q.col : p.w_hp);
    residuals->mu = to_c_tensor(stats_view(s->norm.mu, dev, p.tokens));
    residuals->rsigma = to_c_tensor(stats_view(s->norm.rsigma, dev, p.tokens));
    residuals->fp8 = p.fp8;
    residuals->internal = s->as_public<void>();
  });
}

TE_API void te_layernorm_linear_residuals_release(te_layernorm_linear_residuals *residuals) {
  if (residuals) release_residuals<M>(&residuals->internal);
}

TE_API te_status te_layernorm_linear_forward_save(te_context *ctx, te_layernorm_linear *m,
                                                  te_layernorm_linear_residuals *residuals,
                                                  te_layernorm_linear_backward_ctx **out) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    LayerNormLinear *l = module_of<M>(c, m);
    check_not_null(out, "out");
    check_options(residuals, "residuals");
    LayerNormLinearBackwardCtx *b = save_residuals<M>(*c, *l, &residuals->internal, "residuals");
    *out = b->as_public<te_layernorm_linear_backward_ctx>();
  });
}

TE_API te_status te_layernorm_linear_forward(te_context *ctx, te_layernorm_linear *m,
                                             const te_layernorm_linear_forward_args *args, te_tensor *y,
                                             te_layernorm_linear_backward_ctx **out) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    Context *c = to_context(ctx);
    LayerNormLinearBackwardCtx *b = forward_into_backward<M>(*c, [&] { return forward_compute(ctx, m, args, y); });
    *out = b->as_public<te_layernorm_linear_backward_ctx>();
  });
}

TE_API te_status te_layernorm_linear_grads_init(te_layernorm_linear_grads *grads) {
  return guarded(__func__, [&] {
    check_not_null(grads, "grads");
    *grads = te_layernorm_linear_grads{};
    grads->struct_size = sizeof *grads;
  });
}

TE_API te_status te_layernorm_linear_backward(te_context *ctx, te_layernorm_linear_backward_ctx *bwd,
                                              const te_tensor *dy, const te_layernorm_linear_grads *grads,
                                              const te_linear_backward_args *args) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    LayerNormLinearBackwardCtx *b = to_backward<M>(c, bwd);
    const bool once = backward_once(args);
    const TensorView dyv = to_view(dy, "dy");
    const LayerNormLinearGrads g = to_core(grads);
    layernorm_linear_backward(*c, *b, dyv, g, once);
  });
}

TE_API void te_layernorm_linear_backward_ctx_destroy(te_layernorm_linear_backward_ctx *bwd) { destroy_backward<M>(bwd); }

TE_API te_status te_layernorm_linear_residuals_size(te_context *ctx, const te_layernorm_linear *m,
                                                    const te_layernorm_linear_forward_args *args, size_t *bytes) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    const LayerNormLinear *l = module_of<M>(c, m);
    check_not_null(bytes, "bytes");
    check_options(args, "args");
    check_bool(args->weight_unchanged, "args->weight_unchanged");
    const TensorView x = to_shape_view(args->input, "args->input");
    check_tensor(x, "args->input", l->core()->opts.activation_dtype, c->device());
    const int64_t in = l->core()->opts.in_features;
    if (x.cols() != in)
      fail(Status::InvalidArgument, "argument 'args->input': expected last dimension in_features=%lld, got %lld",
           (long long)in, (long long)x.cols());
    *bytes = layernorm_linear_residual_bytes(*c, *l, x.rows());
  });
}

TE_API te_status te_layernorm_linear_forward_compute_into(te_context *ctx, te_layernorm_linear *m,
                                                          const te_layernorm_linear_forward_args *args, te_tensor *y,
                                                          void *residuals, size_t residuals_bytes) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    LayerNormLinear *l = module_of<M>(c, m);
    const LayerNormLinearForwardArgs a = to_core(args);
    const TensorView yv = to_view(y, "y");
    layernorm_linear_forward_compute_into(*c, *l, a, yv, residuals, residuals_bytes);
  });
}

TE_API te_status te_layernorm_linear_backward_from(te_context *ctx, te_layernorm_linear *m,
                                                   const te_layernorm_linear_forward_args *inputs,
                                                   const void *residuals, size_t residuals_bytes, const te_tensor *dy,
                                                   const te_layernorm_linear_grads *grads,
                                                   const te_linear_backward_args *args) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    LayerNormLinear *l = module_of<M>(c, m);
    LayerNormLinearForwardArgs in;
    if (inputs) in = to_core(inputs, "inputs");
    const bool once = backward_once(args);
    const TensorView dyv = to_view(dy, "dy");
    const LayerNormLinearGrads g = to_core(grads);
    layernorm_linear_backward_from(*c, *l, inputs ? &in : nullptr, residuals, residuals_bytes, dyv, g, once);
  });
}

TE_API te_status te_layernorm_linear_get_scaling_state(te_context *ctx, const te_layernorm_linear *m,
                                                       te_tensor_role role, te_scaling_state_info *info,
                                                       float *history, size_t history_cap) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    LayerNormLinear *l = module_of<M>(c, m);
    read_scaling_state(*c, l->core()->proj.state(to_role(role)), info, history, history_cap);
  });
}

TE_API te_status te_layernorm_linear_state_save(te_context *ctx, const te_layernorm_linear *m, void *buf,
                                                size_t capacity, size_t *size) {
  return guarded(__func__, [&] { save_state<M>(ctx, m, buf, capacity, size); });
}

TE_API te_status te_layernorm_linear_state_load(te_context *ctx, te_layernorm_linear *m, const void *buf,
                                                size_t size) {
  return guarded(__func__, [&] { load_state<M>(ctx, m, buf, size); });
}

}  // extern "C"
