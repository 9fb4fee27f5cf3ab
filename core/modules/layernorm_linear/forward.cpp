#include "modules/common/validate.h"
#include "modules/layernorm_linear/layernorm_linear.h"

namespace te {

void layernorm_linear_validate(Context &ctx, const LayerNormLinearOptions &o, const LayerNormLinearForwardArgs &a,
                               const TensorView &y, const char *p) {
  const Device &dev = ctx.device();
  const DType dt = o.activation_dtype;
  check_tensor(a.input, ArgName(p, "input"), dt, dev);
  if (a.input.cols() != o.in_features)
    fail(Status::InvalidArgument, "argument '%s->input': expected last dimension in_features=%lld, got %lld", p,
         (long long)o.in_features, (long long)a.input.cols());
  check_norm_params(o.norm, NormInputs{a.input, a.ln_weight, a.ln_bias}, a.ln_out, o.in_features, dt, dev, a.input,
                    ArgName(p, "ln_weight"), ArgName(p, "ln_bias"), ArgName(p, "ln_out"));
  check_weight(a.weight, ArgName(p, "weight"), o.out_features, o.in_features, dt, dev);
  check_presence(a.bias, ArgName(p, "bias"), o.bias,
                 o.bias ? "the layer was created with bias" : "the layer was created without bias");
  if (a.bias.data) check_vector(a.bias, ArgName(p, "bias"), o.out_features, dt, dev);
  if (y.data) check_output_like(y, "y", a.input, o.out_features, "out_features", dt, dev);
}

LayerNormLinearSaved *layernorm_linear_forward_compute(Context &ctx, LayerNormLinear &m,
                                                       const LayerNormLinearForwardArgs &args, const TensorView &y) {
  LayerNormLinearCore &L = *m.core();
  const LayerNormLinearOptions &o = L.opts;
  if (!y.data) fail(Status::InvalidArgument, "argument 'y->data': expected a non-NULL pointer, got NULL");
  layernorm_linear_validate(ctx, o, args, y, "args");
  Backend &be = ctx.backend();
  Autocast &ac = ctx.autocast();
  const ForwardMode mode = ForwardMode::of(ac);
  const ProjectionDims dims{args.input.rows(), o.in_features, o.out_features};
  if (mode.fp8) check_module_fp8_dims("args->input", "m", dims.tokens, o.out_features, o.in_features);
  const Device dev = ctx.device();
  const DType dt = o.activation_dtype;
  const NormInputs norm_in{make_view(args.input.data, dt, dev, dims.tokens, o.in_features), args.ln_weight,
                           args.ln_bias};
  const TensorView ln_out =
      args.ln_out.data ? make_view(args.ln_out.data, dt, dev, dims.tokens, o.in_features) : TensorView();
  const TensorView y2d = make_view(y.data, dt, dev, dims.tokens, o.out_features);

  // Allocate, stage and reserve everything first (nothing changes if memory runs out); then run.
  LayerNormLinearPools &pools = layernorm_linear_pools(ctx);
  LayerNormLinearSaved *saved = pools.saved.acquire(ctx);
  try {
    const bool fused = mode.fp8 && mode.delayed();
    ScratchPlan plan;
    NormForwardStep norm(be, o.norm, norm_in, fused, !mode.fp8, ln_out, &plan);
    ProjectionForward gemm(ctx, L.proj, mode, dims, norm.hp_output(), fused, args.weight, args.bias, y2d,
                           args.weight_unchanged, &plan);
    be.reserve(plan);
    ac.reserve_forward(gemm.states_to_register());

    gemm.commit();
    if (mode.fp8) saved->ticket = ac.enter_module();
    norm.run(&gemm);
    gemm.run();
    norm.save(&saved->norm);
    gemm.save(&saved->proj);
  } catch (...) {
    pools.saved.release(saved);
    throw;
  }
  saved->layer = m.core();
  if (mode.fp8) {
    saved->recipe = RecipeRef(mode.recipe);
    saved->group = GroupRef(mode.group);
  }
  return saved;
}

}  // namespace te
