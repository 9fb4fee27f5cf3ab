#include "module_shims.h"
#include "modules/common/validate.h"
#include "modules/grouped_linear/grouped_linear.h"

using namespace te;
using namespace te::capi;

static_assert(TE_GROUPED_LINEAR_MAX_GEMMS == kGroupedLinearMaxGemms, "the expert limit must match the core");

namespace {

struct Grouped {
  using Module = GroupedLinear;
  using Saved = GroupedLinearSaved;
  using BackwardCtx = GroupedLinearBackwardCtx;
  static constexpr HandleKind kModule = HandleKind::GroupedLinear;
  static constexpr HandleKind kSaved = HandleKind::GroupedLinearResiduals;
  static constexpr HandleKind kBackward = HandleKind::GroupedLinearBackwardCtx;
  static constexpr const char *kArg = "g";
  static constexpr const char *kModuleType = "te_grouped_linear";
  static constexpr const char *kResidualsType = "te_grouped_linear_residuals";
  static constexpr const char *kComputeFn = "te_grouped_linear_forward_compute";
  static GroupedLinearPools &pools(Context &c) { return grouped_linear_pools(c); }
  static size_t state_size(Context &, const GroupedLinear &g) { return grouped_linear_state_size(g); }
  static void state_save(Context &c, const GroupedLinear &g, void *buf, size_t cap) {
    grouped_linear_state_save(c, g, buf, cap);
  }
  static void state_load(Context &c, GroupedLinear &g, const void *buf, size_t size) {
    grouped_linear_state_load(c, g, buf, size);
  }
};


// The caller's array of n tensor pointers as views in `out` (the layer's call storage), named
// "prefix->array[i]" ("array[i]" without a prefix). Each element must be a tensor; a NULL array
// is for the caller to allow or refuse.
void to_views(const te_tensor *const *array, int n, const char *prefix, const char *name, TensorView *out) {
  for (int i = 0; i < n; ++i) out[i] = to_view(array[i], ArgName::element(prefix, name, i));
}

// prefix: "args" (a forward) or "inputs" (backward_from: the forward's arguments again).
GroupedLinearForwardArgs to_core(const te_grouped_linear_forward_args *a, GroupedLinearCore &core,
                                 const char *p = "args") {
  check_options(a, p);
  check_bool(a->weight_unchanged, ArgName(p, "weight_unchanged"));
  const int n = core.opts.num_gemms;
  GroupedLinearForwardArgs r;
  r.input = to_view(a->input, ArgName(p, "input"));
  r.m_splits = a->m_splits;  // read (and checked) by the core
  check_not_null(a->weights, ArgName(p, "weights"));
  to_views(a->weights, n, p, "weights", core.call.weights.data());
  r.weights = core.call.weights.data();
  if (a->biases) {
    to_views(a->biases, n, p, "biases", core.call.biases.data());
    r.biases = core.call.biases.data();
  }
  r.weight_unchanged = a->weight_unchanged;
  return r;
}

// dw and db arrays as views in the layer's call storage.
void to_core_grads(GroupedLinearCore &core, te_tensor *const *dw, te_tensor *const *db, GroupedLinearBackwardArgs *a) {
  const int n = core.opts.num_gemms;
  if (dw) {
    to_views(dw, n, nullptr, "dw", core.call.dw.data());
    a->dw = core.call.dw.data();
  }
  if (db) {
    to_views(db, n, nullptr, "db", core.call.db.data());
    a->db = core.call.db.data();
  }
}

GroupedLinearSaved *forward_compute(te_context *ctx, te_grouped_linear *g, const te_grouped_linear_forward_args *args,
                                    te_tensor *y) {
  Context *c = to_context(ctx);
  GroupedLinear *m = module_of<Grouped>(c, g);
  GroupedLinearForwardArgs a = to_core(args, *m->core());
  TensorView yv = to_view(y, "y");
  return grouped_linear_forward_compute(*c, *m, a, yv);
}

}  // namespace

extern "C" {

TE_API te_status te_grouped_linear_options_init(te_grouped_linear_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_grouped_linear_options{};
    opts->struct_size = sizeof *opts;
    opts->bias = 1;
    opts->activation_dtype = TE_DTYPE_BF16;
  });
}

TE_API te_status te_grouped_linear_create(te_grouped_linear **out, te_context *ctx,
                                          const te_grouped_linear_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    Context *c = to_context(ctx);
    check_options(opts, "opts");
    if (opts->num_gemms < 1 || opts->num_gemms > TE_GROUPED_LINEAR_MAX_GEMMS)
      fail(Status::InvalidArgument, "argument 'opts->num_gemms': expected 1..%d (TE_GROUPED_LINEAR_MAX_GEMMS), got %d",
           TE_GROUPED_LINEAR_MAX_GEMMS, opts->num_gemms);
    GroupedLinearOptions o;
    o.num_gemms = opts->num_gemms;
    o.in_features = opts->in_features;
    o.out_features = opts->out_features;
    check_features(o.in_features, o.out_features, "opts->in_features", "opts->out_features");
    check_bool(opts->bias, "opts->bias");
    check_bool(opts->fuse_wgrad_accumulation, "opts->fuse_wgrad_accumulation");
    o.bias = opts->bias;
    o.activation_dtype = to_activation_dtype(opts->activation_dtype, "opts->activation_dtype");
    o.fuse_wgrad_accumulation = opts->fuse_wgrad_accumulation;
    *out = (new GroupedLinear(*c, o))->as_public<te_grouped_linear>();
  });
}

TE_API void te_grouped_linear_destroy(te_grouped_linear *g) {
  delete live_or_null<GroupedLinear>(g, HandleKind::GroupedLinear);
}

TE_API te_status te_grouped_linear_forward_args_init(te_grouped_linear_forward_args *args) {
  return guarded(__func__, [&] {
    check_not_null(args, "args");
    *args = te_grouped_linear_forward_args{};
    args->struct_size = sizeof *args;
  });
}

TE_API te_status te_grouped_linear_forward_compute(te_context *ctx, te_grouped_linear *g,
                                                   const te_grouped_linear_forward_args *args, te_tensor *y,
                                                   te_grouped_linear_residuals *residuals) {
  return guarded(__func__, [&] {
    check_options(residuals, "residuals");
    GroupedLinearSaved *s = forward_compute(ctx, g, args, y);
    residuals->fp8 = s->fp8;
    residuals->internal = s->as_public<void>();
  });
}

TE_API void te_grouped_linear_residuals_release(te_grouped_linear_residuals *residuals) {
  if (residuals) release_residuals<Grouped>(&residuals->internal);
}

TE_API te_status te_grouped_linear_forward_save(te_context *ctx, te_grouped_linear *g,
                                                te_grouped_linear_residuals *residuals,
                                                te_grouped_linear_backward_ctx **out) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    GroupedLinear *m = module_of<Grouped>(c, g);
    check_not_null(out, "out");
    check_options(residuals, "residuals");
    // Checked here too, so that the message names te.h's 'g'.
    auto *s = static_cast<GroupedLinearSaved *>(residuals_of(residuals->internal, Grouped::kSaved, "residuals",
                                                             Grouped::kResidualsType, Grouped::kComputeFn));
    if (s->layer != m->core())
      fail(Status::InvalidArgument, "argument 'residuals': made by another te_grouped_linear than 'g'");
    *out = save_residuals<Grouped>(*c, *m, &residuals->internal, "residuals")->as_public<te_grouped_linear_backward_ctx>();
  });
}

TE_API te_status te_grouped_linear_forward(te_context *ctx, te_grouped_linear *g,
                                           const te_grouped_linear_forward_args *args, te_tensor *y,
                                           te_grouped_linear_backward_ctx **out) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    Context *c = to_context(ctx);
    *out = forward_into_backward<Grouped>(*c, [&] { return forward_compute(ctx, g, args, y); })
               ->as_public<te_grouped_linear_backward_ctx>();
  });
}

TE_API te_status te_grouped_linear_backward(te_context *ctx, te_grouped_linear_backward_ctx *bwd, const te_tensor *dy,
                                            te_tensor *dx, te_tensor *const *dw, te_tensor *const *db,
                                            const te_linear_backward_args *args) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    GroupedLinearBackwardCtx *b = to_backward<Grouped>(c, bwd);
    GroupedLinearBackwardArgs a;
    a.once = backward_once(args);
    a.dy = to_view(dy, "dy");
    a.dx = to_optional_view(dx, "dx");
    if (b->saved) to_core_grads(*b->saved->layer, dw, db, &a);  // else the core reports the freed residuals
    grouped_linear_backward(*c, *b, a);
  });
}

TE_API void te_grouped_linear_backward_ctx_destroy(te_grouped_linear_backward_ctx *bwd) {
  destroy_backward<Grouped>(bwd);
}

TE_API te_status te_grouped_linear_residuals_size(te_context *ctx, const te_grouped_linear *g,
                                                  const te_grouped_linear_forward_args *args, size_t *bytes) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    const GroupedLinear *m = module_of<Grouped>(c, g);
    check_not_null(bytes, "bytes");
    check_options(args, "args");
    check_bool(args->weight_unchanged, "args->weight_unchanged");
    const TensorView x = to_shape_view(args->input, "args->input");
    check_tensor(x, "args->input", m->options().activation_dtype, c->device());
    const GroupedLinearOptions &o = m->options();
    if (x.cols() != o.in_features)
      fail(Status::InvalidArgument, "argument 'args->input': expected last dimension in_features=%lld, got %lld",
           (long long)o.in_features, (long long)x.cols());
    grouped_linear_validate_splits(args->m_splits, o.num_gemms, x.rows(), "args");
    *bytes = grouped_linear_residual_bytes(*c, *m, args->m_splits);
  });
}

TE_API te_status te_grouped_linear_forward_compute_into(te_context *ctx, te_grouped_linear *g,
                                                        const te_grouped_linear_forward_args *args, te_tensor *y,
                                                        void *residuals, size_t residuals_bytes) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    GroupedLinear *m = module_of<Grouped>(c, g);
    const GroupedLinearForwardArgs a = to_core(args, *m->core());
    const TensorView yv = to_view(y, "y");
    grouped_linear_forward_compute_into(*c, *m, a, yv, residuals, residuals_bytes);
  });
}

TE_API te_status te_grouped_linear_backward_from(te_context *ctx, te_grouped_linear *g,
                                                 const te_grouped_linear_forward_args *inputs, const void *residuals,
                                                 size_t residuals_bytes, const te_tensor *dy, te_tensor *dx,
                                                 te_tensor *const *dw, te_tensor *const *db,
                                                 const te_linear_backward_args *args) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    GroupedLinear *m = module_of<Grouped>(c, g);
    GroupedLinearForwardArgs in;
    if (inputs) in = to_core(inputs, *m->core(), "inputs");
    GroupedLinearBackwardArgs a;
    a.once = backward_once(args);
    a.dy = to_view(dy, "dy");
    a.dx = to_optional_view(dx, "dx");
    to_core_grads(*m->core(), dw, db, &a);
    grouped_linear_backward_from(*c, *m, inputs ? &in : nullptr, residuals, residuals_bytes, a);
  });
}

TE_API te_status te_grouped_linear_get_scaling_state(te_context *ctx, const te_grouped_linear *g, int32_t expert,
                                                     te_tensor_role role, te_scaling_state_info *info, float *history,
                                                     size_t history_cap) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    GroupedLinear *m = module_of<Grouped>(c, g);
    const int n = m->options().num_gemms;
    if (expert < 0 || expert >= n)
      fail(Status::InvalidArgument, "argument 'expert': expected 0..%d (num_gemms - 1), got %d", n - 1, expert);
    const TensorRole r = to_role(role);
    read_scaling_state(*c, m->core()->experts[static_cast<size_t>(expert)].state(r), info, history, history_cap);
  });
}

TE_API te_status te_grouped_linear_state_save(te_context *ctx, const te_grouped_linear *g, void *buf, size_t capacity,
                                              size_t *size) {
  return guarded(__func__, [&] { save_state<Grouped>(ctx, g, buf, capacity, size); });
}

TE_API te_status te_grouped_linear_state_load(te_context *ctx, te_grouped_linear *g, const void *buf, size_t size) {
  return guarded(__func__, [&] { load_state<Grouped>(ctx, g, buf, size); });
}

}  // extern "C"
