// te_attention_* and te_rope_*: translation of the C structs, then the core (modules/attention).
#include <cmath>

#include "module_shims.h"
#include "modules/attention/attention.h"
#include "modules/common/validate.h"

using namespace te;
using namespace te::capi;

static_assert(TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT == static_cast<int>(AttnMask::CausalBottomRight),
              "masks must match the core");
static_assert(TE_ATTN_DP == static_cast<int>(AttnTensor::DP), "attention tensors must match the core");

namespace {

struct M {
  using Module = Attention;
  using Saved = AttentionSaved;
  using BackwardCtx = AttentionBackwardCtx;
  static constexpr HandleKind kModule = HandleKind::Attention, kSaved = HandleKind::AttentionResiduals,
                             kBackward = HandleKind::AttentionBackwardCtx;
  static constexpr const char *kArg = "m";
  static constexpr const char *kModuleType = "te_attention", *kResidualsType = "te_attention_residuals",
                              *kComputeFn = "te_attention_forward_compute";
  static auto &pools(Context &c) { return attention_pools(c); }
  static size_t state_size(Context &c, const Attention &m) { return attention_state_size(c, m); }
  static void state_save(Context &c, const Attention &m, void *buf, size_t cap) { attention_state_save(c, m, buf, cap); }
  static void state_load(Context &c, Attention &m, const void *buf, size_t size) { attention_state_load(c, m, buf, size); }
};

// prefix: "args" (a forward) or "inputs" (backward_from). shapes_only: data may be NULL
// (te_attention_residuals_size).
AttentionInputs to_core(const te_attention_forward_args *a, const char *p, bool shapes_only = false) {
  check_options(a, p);
  AttentionInputs r;
  auto view = [&](const te_tensor *t, const char *f) { return shapes_only ? to_shape_view(t, ArgName(p, f)) : to_view(t, ArgName(p, f)); };
  r.q = view(a->q, "q");
  r.k = view(a->k, "k");
  r.v = view(a->v, "v");
  auto offsets = [&](const te_tensor *t, const char *f) { return t ? view(t, f) : TensorView(); };
  r.cu_seqlens_q = offsets(a->cu_seqlens_q, "cu_seqlens_q");
  r.cu_seqlens_kv = offsets(a->cu_seqlens_kv, "cu_seqlens_kv");
  r.max_seqlen_q = a->max_seqlen_q;
  r.max_seqlen_kv = a->max_seqlen_kv;
  return r;
}

AttentionGrads to_core(const te_attention_grads *grads) {
  AttentionGrads g;
  if (grads) {
    check_options(grads, "grads");
    g.dq = to_optional_view(grads->dq, "grads->dq");
    g.dk = to_optional_view(grads->dk, "grads->dk");
    g.dv = to_optional_view(grads->dv, "grads->dv");
  }
  return g;
}

AttentionSaved *forward_compute(te_context *ctx, te_attention *m, const te_attention_forward_args *args, te_tensor *o) {
  Context *c = to_context(ctx);
  Attention *a = module_of<M>(c, m);
  const AttentionInputs in = to_core(args, "args");
  const TensorView ov = to_view(o, "o");
  return attention_forward_compute(*c, *a, in, ov);
}

AttentionOptions to_core(const te_attention_options *opts) {
  check_options(opts, "opts");
  AttentionOptions o;
  if (opts->num_heads < 1)
    fail(Status::InvalidArgument, "argument 'opts->num_heads': expected > 0, got %d", opts->num_heads);
  const int32_t kv = opts->num_kv_heads ? opts->num_kv_heads : opts->num_heads;
  if (kv < 1 || kv > opts->num_heads || opts->num_heads % kv)
    fail(Status::InvalidArgument, "argument 'opts->num_kv_heads': expected a divisor of num_heads=%d (0: num_heads), got %d",
         opts->num_heads, opts->num_kv_heads);
  if (opts->head_dim < 8 || opts->head_dim > 256 || opts->head_dim % 8)
    fail(Status::InvalidArgument, "argument 'opts->head_dim': expected a multiple of 8 in 8..256, got %d", opts->head_dim);
  const float scale = opts->softmax_scale;
  if (!(scale >= 0.0f) || std::isinf(scale))
    fail(Status::InvalidArgument, "argument 'opts->softmax_scale': expected a finite value > 0 (0: 1/sqrt(head_dim)), got %g",
         (double)scale);
  const int mask = enum_int(opts->mask);
  if (mask < TE_ATTN_MASK_NONE || mask > TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT)
    fail(Status::InvalidArgument, "argument 'opts->mask': expected a te_attn_mask value, got %d", mask);
  check_bool(opts->fp8, "opts->fp8");
  o.heads = opts->num_heads;
  o.kv_heads = kv;
  o.head_dim = opts->head_dim;
  o.softmax_scale = scale > 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(opts->head_dim)));
  o.mask = static_cast<AttnMask>(mask);
  o.activation_dtype = to_activation_dtype(opts->activation_dtype, "opts->activation_dtype");
  o.fp8 = opts->fp8;
  return o;
}

AttnTensor to_attn_tensor(const te_attention_tensor &which) {
  const int w = enum_int(which);
  if (w < TE_ATTN_Q || w > TE_ATTN_DP)
    fail(Status::InvalidArgument, "argument 'which': expected a te_attention_tensor value, got %d", w);
  return static_cast<AttnTensor>(w);
}

}  // namespace

extern "C" {

TE_API te_status te_attention_options_init(te_attention_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_attention_options{};
    opts->struct_size = sizeof *opts;
    opts->mask = TE_ATTN_MASK_NONE;
    opts->activation_dtype = TE_DTYPE_BF16;
  });
}

TE_API te_status te_attention_create(te_attention **out, te_context *ctx, const te_attention_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    Context *c = to_context(ctx);
    const AttentionOptions o = to_core(opts);
    *out = (new Attention(*c, o))->as_public<te_attention>();
  });
}

TE_API void te_attention_destroy(te_attention *m) { delete live_or_null<Attention>(m, HandleKind::Attention); }

TE_API te_status te_attention_forward_args_init(te_attention_forward_args *args) {
  return guarded(__func__, [&] {
    check_not_null(args, "args");
    *args = te_attention_forward_args{};
    args->struct_size = sizeof *args;
  });
}

TE_API te_status te_attention_forward_compute(te_context *ctx, te_attention *m, const te_attention_forward_args *args,
                                              te_tensor *o, te_attention_residuals *residuals) {
  return guarded(__func__, [&] {
    check_options(residuals, "residuals");
    AttentionSaved *s = forward_compute(ctx, m, args, o);
    residuals->q = to_c_tensor(s->q);
    residuals->k = to_c_tensor(s->k);
    residuals->v = to_c_tensor(s->v);
    residuals->o = to_c_tensor(s->o);
    residuals->lse = to_c_tensor(make_view(s->lse.get(), DType::F32, s->ctx->device(), s->dims.tokens_q, s->dims.heads));
    residuals->fp8 = s->fp8;
    residuals->internal = s->as_public<void>();
  });
}

TE_API void te_attention_residuals_release(te_attention_residuals *residuals) {
  if (residuals) release_residuals<M>(&residuals->internal);
}

TE_API te_status te_attention_forward_save(te_context *ctx, te_attention *m, te_attention_residuals *residuals,
                                           te_attention_backward_ctx **out) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Attention *a = module_of<M>(c, m);
    check_not_null(out, "out");
    check_options(residuals, "residuals");
    AttentionBackwardCtx *b = save_residuals<M>(*c, *a, &residuals->internal, "residuals");
    *out = b->as_public<te_attention_backward_ctx>();
  });
}

TE_API te_status te_attention_forward(te_context *ctx, te_attention *m, const te_attention_forward_args *args,
                                      te_tensor *o, te_attention_backward_ctx **out) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    Context *c = to_context(ctx);
    AttentionBackwardCtx *b = forward_into_backward<M>(*c, [&] { return forward_compute(ctx, m, args, o); });
    *out = b->as_public<te_attention_backward_ctx>();
  });
}

TE_API te_status te_attention_grads_init(te_attention_grads *grads) {
  return guarded(__func__, [&] {
    check_not_null(grads, "grads");
    *grads = te_attention_grads{};
    grads->struct_size = sizeof *grads;
  });
}

TE_API te_status te_attention_backward(te_context *ctx, te_attention_backward_ctx *bwd, const te_tensor *d_o,
                                       const te_attention_grads *grads, const te_linear_backward_args *args) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    AttentionBackwardCtx *b = to_backward<M>(c, bwd);
    const bool once = backward_once(args);
    const TensorView dov = to_view(d_o, "d_o");
    const AttentionGrads g = to_core(grads);
    attention_backward(*c, *b, dov, g, once);
  });
}

TE_API void te_attention_backward_ctx_destroy(te_attention_backward_ctx *bwd) { destroy_backward<M>(bwd); }

TE_API te_status te_attention_residuals_size(te_context *ctx, const te_attention *m,
                                             const te_attention_forward_args *args, size_t *bytes) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    const Attention *a = module_of<M>(c, m);
    check_not_null(bytes, "bytes");
    const AttentionInputs in = to_core(args, "args", true);
    const AttentionDims d = attention_validate(*c, a->core()->opts, in, TensorView(), "args");
    *bytes = attention_residual_bytes(*c, *a, d);
  });
}

TE_API te_status te_attention_forward_compute_into(te_context *ctx, te_attention *m,
                                                   const te_attention_forward_args *args, te_tensor *o,
                                                   void *residuals, size_t residuals_bytes) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Attention *a = module_of<M>(c, m);
    const AttentionInputs in = to_core(args, "args");
    const TensorView ov = to_view(o, "o");
    attention_forward_compute_into(*c, *a, in, ov, residuals, residuals_bytes);
  });
}

TE_API te_status te_attention_backward_from(te_context *ctx, te_attention *m, const te_attention_forward_args *inputs,
                                            const te_tensor *o, const void *residuals, size_t residuals_bytes,
                                            const te_tensor *d_o, const te_attention_grads *grads,
                                            const te_linear_backward_args *args) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Attention *a = module_of<M>(c, m);
    check_not_null(inputs, "inputs");
    const AttentionInputs in = to_core(inputs, "inputs");
    const TensorView ov = to_view(o, "o");
    const bool once = backward_once(args);
    const TensorView dov = to_view(d_o, "d_o");
    const AttentionGrads g = to_core(grads);
    attention_backward_from(*c, *a, in, ov, residuals, residuals_bytes, dov, g, once);
  });
}

TE_API te_status te_attention_get_scaling_state(te_context *ctx, const te_attention *m, te_attention_tensor which,
                                                te_scaling_state_info *info, float *history, size_t history_cap) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Attention *a = module_of<M>(c, m);
    read_scaling_state(*c, a->core()->state(to_attn_tensor(which)), info, history, history_cap);
  });
}

TE_API te_status te_attention_state_save(te_context *ctx, const te_attention *m, void *buf, size_t capacity,
                                         size_t *size) {
  return guarded(__func__, [&] { save_state<M>(ctx, m, buf, capacity, size); });
}

TE_API te_status te_attention_state_load(te_context *ctx, te_attention *m, const void *buf, size_t size) {
  return guarded(__func__, [&] { load_state<M>(ctx, m, buf, size); });
}

TE_API te_status te_rope_options_init(te_rope_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_rope_options{};
    opts->struct_size = sizeof *opts;
  });
}

}  // extern "C"

namespace {

te_status rope(const char *fn, te_context *ctx, const te_rope_options *opts, const te_tensor *x, const te_tensor *freqs,
               const te_tensor *cu_seqlens, te_tensor *y, bool inverse) {
  return guarded(fn, [&] {
    Context *c = to_context(ctx);
    RopeCall call;
    if (opts) {
      check_options(opts, "opts");
      check_bool(opts->interleaved, "opts->interleaved");
      if (opts->rot_dim < 0)
        fail(Status::InvalidArgument, "argument 'opts->rot_dim': expected >= 0 (0: head_dim), got %d", opts->rot_dim);
      call.rot_dim = opts->rot_dim;
      call.interleaved = opts->interleaved;
    }
    call.x_name = inverse ? "dy" : "x";
    call.y_name = inverse ? "dx" : "y";
    call.x = to_view(x, call.x_name);
    call.freqs = to_view(freqs, "freqs");
    call.cu_seqlens = to_optional_view(cu_seqlens, "cu_seqlens");
    call.y = to_view(y, call.y_name);
    call.inverse = inverse;
    rope_run(*c, call);
  });
}

}  // namespace

extern "C" {

TE_API te_status te_rope_forward(te_context *ctx, const te_rope_options *opts, const te_tensor *x,
                                 const te_tensor *freqs, const te_tensor *cu_seqlens, te_tensor *y) {
  return rope(__func__, ctx, opts, x, freqs, cu_seqlens, y, false);
}

TE_API te_status te_rope_backward(te_context *ctx, const te_rope_options *opts, const te_tensor *dy,
                                  const te_tensor *freqs, const te_tensor *cu_seqlens, te_tensor *dx) {
  return rope(__func__, ctx, opts, dy, freqs, cu_seqlens, dx, true);
}

}  // extern "C"
