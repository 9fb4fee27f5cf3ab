#include "module_shims.h"
#include "modules/common/validate.h"
#include "modules/layernorm_mlp/layernorm_mlp.h"

using namespace te;
using namespace te::capi;

namespace {

struct M {
  using Module = LayerNormMlp;
  using Saved = LayerNormMlpSaved;
  using BackwardCtx = LayerNormMlpBackwardCtx;
  static constexpr HandleKind kModule = HandleKind::LayerNormMlp, kSaved = HandleKind::LayerNormMlpResiduals,
                             kBackward = HandleKind::LayerNormMlpBackwardCtx;
  static constexpr const char *kArg = "m";
  static constexpr const char *kModuleType = "te_layernorm_mlp", *kResidualsType = "te_layernorm_mlp_residuals",
                              *kComputeFn = "te_layernorm_mlp_forward_compute";
  static auto &pools(Context &c) { return layernorm_mlp_pools(c); }
  static size_t state_size(Context &c, const LayerNormMlp &m) { return layernorm_mlp_state_size(c, m); }
  static void state_save(Context &c, const LayerNormMlp &m, void *buf, size_t cap) { layernorm_mlp_state_save(c, m, buf, cap); }
  static void state_load(Context &c, LayerNormMlp &m, const void *buf, size_t size) { layernorm_mlp_state_load(c, m, buf, size); }
};

// prefix: "args" (a forward) or "inputs" (backward_from: the forward's arguments again).
LayerNormMlpForwardArgs to_core(const te_layernorm_mlp_forward_args *a, const char *p = "args") {
  check_options(a, p);
  check_bool(a->weight_unchanged, ArgName(p, "weight_unchanged"));
  LayerNormMlpForwardArgs r;
  r.input = to_view(a->input, ArgName(p, "input"));
  r.ln_weight = to_view(a->ln_weight, ArgName(p, "ln_weight"));
  r.ln_bias = to_optional_view(a->ln_bias, ArgName(p, "ln_bias"));
  r.fc1_weight = to_view(a->fc1_weight, ArgName(p, "fc1_weight"));
  r.fc1_bias = to_optional_view(a->fc1_bias, ArgName(p, "fc1_bias"));
  r.fc2_weight = to_view(a->fc2_weight, ArgName(p, "fc2_weight"));
  r.fc2_bias = to_optional_view(a->fc2_bias, ArgName(p, "fc2_bias"));
  r.ln_out = to_optional_view(a->ln_out, ArgName(p, "ln_out"));
  r.weight_unchanged = a->weight_unchanged;
  return r;
}

LayerNormMlpGrads to_core(const te_layernorm_mlp_grads *grads) {
  LayerNormMlpGrads g;
  if (grads) {
    check_options(grads, "grads");
    g.dx = to_optional_view(grads->dx, "grads->dx");
    g.dgamma = to_optional_view(grads->dln_weight, "grads->dln_weight");
    g.dbeta = to_optional_view(grads->dln_bias, "grads->dln_bias");
    g.dfc1_w = to_optional_view(grads->dfc1_weight, "grads->dfc1_weight");
    g.dfc1_b = to_optional_view(grads->dfc1_bias, "grads->dfc1_bias");
    g.dfc2_w = to_optional_view(grads->dfc2_weight, "grads->dfc2_weight");
    g.dfc2_b = to_optional_view(grads->dfc2_bias, "grads->dfc2_bias");
  }
  return g;
}

LayerNormMlpSaved *forward_compute(te_context *ctx, te_layernorm_mlp *m,
                                      const te_layernorm_mlp_forward_args *args, te_tensor *y) {
  Context *c = to_context(ctx);
  LayerNormMlp *l = module_of<M>(c, m);
  LayerNormMlpForwardArgs a = to_core(args);
  TensorView yv = to_view(y, "y");
  return layernorm_mlp_forward_compute(*c, *l, a, yv);
}

}  // namespace

extern "C" {

TE_API te_status te_layernorm_mlp_options_init(te_layernorm_mlp_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_layernorm_mlp_options{};
    opts->struct_size = sizeof *opts;
    opts->bias = 1;
    opts->activation = TE_ACTIVATION_GELU;
    opts->activation_dtype = TE_DTYPE_BF16;
    opts->normalization = TE_NORM_LAYERNORM;
    opts->eps = 1e-5f;
  });
}

TE_API te_status te_layernorm_mlp_create(te_layernorm_mlp **out, te_context *ctx,
                                            const te_layernorm_mlp_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    Context *c = to_context(ctx);
    check_options(opts, "opts");
    LayerNormMlpOptions o;
    const int act = enum_int(opts->activation);
    if (act < TE_ACTIVATION_RELU || act > TE_ACTIVATION_SRELU)
      fail(Status::InvalidArgument, "argument 'opts->activation': expected a te_activation value, got %d", act);
    o.activation = static_cast<Activation>(act);
    o.hidden = opts->hidden_size;
    o.ffn = opts->ffn_hidden_size;
    check_features(o.hidden, o.ffn, "opts->hidden_size", "opts->ffn_hidden_size");
    if (is_gated(o.activation)) check_features(o.hidden, 2 * o.ffn, "opts->hidden_size", "opts->ffn_hidden_size");
    check_bool(opts->bias, "opts->bias");
    check_bool(opts->fuse_wgrad_accumulation, "opts->fuse_wgrad_accumulation");
    o.bias = opts->bias;
    o.activation_dtype = to_activation_dtype(opts->activation_dtype, "opts->activation_dtype");
    o.fuse_wgrad_accumulation = opts->fuse_wgrad_accumulation;
    o.norm = to_norm_options(opts->normalization, opts->eps, opts->zero_centered_gamma, "opts", "normalization");
    *out = (new LayerNormMlp(*c, o))->as_public<te_layernorm_mlp>();
  });
}

TE_API void te_layernorm_mlp_destroy(te_layernorm_mlp *m) {
  delete live_or_null<LayerNormMlp>(m, HandleKind::LayerNormMlp);
}

TE_API te_status te_layernorm_mlp_forward_args_init(te_layernorm_mlp_forward_args *args) {
  return guarded(__func__, [&] {
    check_not_null(args, "args");
    *args = te_layernorm_mlp_forward_args{};
    args->struct_size = sizeof *args;
  });
}

TE_API te_status te_layernorm_mlp_forward_compute(te_context *ctx, te_layernorm_mlp *m,
                                                     const te_layernorm_mlp_forward_args *args, te_tensor *y,
                                                     te_layernorm_mlp_residuals *residuals) {
  return guarded(__func__, [&] {
    check_options(residuals, "residuals");
    LayerNormMlpSaved *s = forward_compute(ctx, m, args, y);
    const ProjectionSaved &p1 = s->fc1, &p2 = s->fc2;
    const Device dev = s->ctx->device();
    const LayerNormMlpOptions &o = s->layer->opts;
    residuals->ln_out_t = to_c_tensor(p1.fp8 ? p1.x.col : p1.x_hp);
    residuals->fc1_weight_t = to_c_tensor(p1.fp8 ? p1.w->q.col : p1.w_hp);
    residuals->fc1_out = to_c_tensor(make_view(s->fc1_out.get(), o.activation_dtype, dev, p1.tokens, o.fc1_out()));
    residuals->act_out_t = to_c_tensor(p2.fp8 ? p2.x.col : p2.x_hp);
    residuals->fc2_weight_t = to_c_tensor(p2.fp8 ? p2.w->q.col : p2.w_hp);
    residuals->mu = to_c_tensor(stats_view(s->norm.mu, dev, p1.tokens));
    residuals->rsigma = to_c_tensor(stats_view(s->norm.rsigma, dev, p1.tokens));
    residuals->fp8 = p1.fp8;
    residuals->internal = s->as_public<void>();
  });
}

TE_API void te_layernorm_mlp_residuals_release(te_layernorm_mlp_residuals *residuals) {
  if (residuals) release_residuals<M>(&residuals->internal);
}

TE_API te_status te_layernorm_mlp_forward_save(te_context *ctx, te_layernorm_mlp *m,
                                                  te_layernorm_mlp_residuals *residuals,
                                                  te_layernorm_mlp_backward_ctx **out) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    LayerNormMlp *l = module_of<M>(c, m);
    check_not_null(out, "out");
    check_options(residuals, "residuals");
    LayerNormMlpBackwardCtx *b = save_residuals<M>(*c, *l, &residuals->internal, "residuals");
    *out = b->as_public<te_layernorm_mlp_backward_ctx>();
  });
}

TE_API te_status te_layernorm_mlp_forward(te_context *ctx, te_layernorm_mlp *m,
                                             const te_layernorm_mlp_forward_args *args, te_tensor *y,
                                             te_layernorm_mlp_backward_ctx **out) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    Context *c = to_context(ctx);
    LayerNormMlpBackwardCtx *b = forward_into_backward<M>(*c, [&] { return forward_compute(ctx, m, args, y); });
    *out = b->as_public<te_layernorm_mlp_backward_ctx>();
  });
}

TE_API te_status te_layernorm_mlp_grads_init(te_layernorm_mlp_grads *grads) {
  return guarded(__func__, [&] {
    check_not_null(grads, "grads");
    *grads = te_layernorm_mlp_grads{};
    grads->struct_size = sizeof *grads;
  });
}

TE_API te_status te_layernorm_mlp_backward(te_context *ctx, te_layernorm_mlp_backward_ctx *bwd,
                                              const te_tensor *dy, const te_layernorm_mlp_grads *grads,
                                              const te_linear_backward_args *args) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    LayerNormMlpBackwardCtx *b = to_backward<M>(c, bwd);
    const bool once = backward_once(args);
    const TensorView dyv = to_view(dy, "dy");
    const LayerNormMlpGrads g = to_core(grads);
    layernorm_mlp_backward(*c, *b, dyv, g, once);
  });
}

TE_API void te_layernorm_mlp_backward_ctx_destroy(te_layernorm_mlp_backward_ctx *bwd) { destroy_backward<M>(bwd); }

TE_API te_status te_layernorm_mlp_residuals_size(te_context *ctx, const te_layernorm_mlp *m,
                                                 const te_layernorm_mlp_forward_args *args, size_t *bytes) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    const LayerNormMlp *l = module_of<M>(c, m);
    check_not_null(bytes, "bytes");
    check_options(args, "args");
    check_bool(args->weight_unchanged, "args->weight_unchanged");
    const TensorView x = to_shape_view(args->input, "args->input");
    check_tensor(x, "args->input", l->core()->opts.activation_dtype, c->device());
    const int64_t hidden = l->core()->opts.hidden;
    if (x.cols() != hidden)
      fail(Status::InvalidArgument, "argument 'args->input': expected last dimension hidden_size=%lld, got %lld",
           (long long)hidden, (long long)x.cols());
    *bytes = layernorm_mlp_residual_bytes(*c, *l, x.rows());
  });
}

TE_API te_status te_layernorm_mlp_forward_compute_into(te_context *ctx, te_layernorm_mlp *m,
                                                       const te_layernorm_mlp_forward_args *args, te_tensor *y,
                                                       void *residuals, size_t residuals_bytes) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    LayerNormMlp *l = module_of<M>(c, m);
    const LayerNormMlpForwardArgs a = to_core(args);
    const TensorView yv = to_view(y, "y");
    layernorm_mlp_forward_compute_into(*c, *l, a, yv, residuals, residuals_bytes);
  });
}

TE_API te_status te_layernorm_mlp_backward_from(te_context *ctx, te_layernorm_mlp *m,
                                                const te_layernorm_mlp_forward_args *inputs, const void *residuals,
                                                size_t residuals_bytes, const te_tensor *dy,
                                                const te_layernorm_mlp_grads *grads,
                                                const te_linear_backward_args *args) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    LayerNormMlp *l = module_of<M>(c, m);
    LayerNormMlpForwardArgs in;
    if (inputs) in = to_core(inputs, "inputs");
    const bool once = backward_once(args);
    const TensorView dyv = to_view(dy, "dy");
    const LayerNormMlpGrads g = to_core(grads);
    layernorm_mlp_backward_from(*c, *l, inputs ? &in : nullptr, residuals, residuals_bytes, dyv, g, once);
  });
}

TE_API te_status te_layernorm_mlp_get_scaling_state(te_context *ctx, const te_layernorm_mlp *m, te_mlp_gemm gemm,
                                                    te_tensor_role role, te_scaling_state_info *info,
                                                    float *history, size_t history_cap) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    LayerNormMlp *l = module_of<M>(c, m);
    const int which = enum_int(gemm);
    if (which != TE_MLP_FC1 && which != TE_MLP_FC2)
      fail(Status::InvalidArgument, "argument 'gemm': expected TE_MLP_FC1 or TE_MLP_FC2, got %d", which);
    const ProjectionState &p = which == TE_MLP_FC1 ? l->core()->fc1 : l->core()->fc2;
    read_scaling_state(*c, p.state(to_role(role)), info, history, history_cap);
  });
}

TE_API te_status te_layernorm_mlp_state_save(te_context *ctx, const te_layernorm_mlp *m, void *buf,
                                                size_t capacity, size_t *size) {
  return guarded(__func__, [&] { save_state<M>(ctx, m, buf, capacity, size); });
}

TE_API te_status te_layernorm_mlp_state_load(te_context *ctx, te_layernorm_mlp *m, const void *buf,
                                                size_t size) {
  return guarded(__func__, [&] { load_state<M>(ctx, m, buf, size); });
}

}  // extern "C"
