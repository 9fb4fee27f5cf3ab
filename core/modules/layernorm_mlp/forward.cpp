#include "modules/common/validate.h"
#include "modules/layernorm_mlp/layernorm_mlp.h"

namespace te {

void layernorm_mlp_validate(Context &ctx, const LayerNormMlpOptions &o, const LayerNormMlpForwardArgs &a,
                            const TensorView &y, const char *p) {
  const Device &dev = ctx.device();
  const DType dt = o.activation_dtype;
  check_tensor(a.input, ArgName(p, "input"), dt, dev);
  if (a.input.cols() != o.hidden)
    fail(Status::InvalidArgument, "argument '%s->input': expected last dimension hidden_size=%lld, got %lld", p,
         (long long)o.hidden, (long long)a.input.cols());
  check_norm_params(o.norm, NormInputs{a.input, a.ln_weight, a.ln_bias}, a.ln_out, o.hidden, dt, dev, a.input,
                    ArgName(p, "ln_weight"), ArgName(p, "ln_bias"), ArgName(p, "ln_out"));
  check_weight(a.fc1_weight, ArgName(p, "fc1_weight"), o.fc1_out(), o.hidden, dt, dev);
  check_weight(a.fc2_weight, ArgName(p, "fc2_weight"), o.hidden, o.ffn, dt, dev);
  const char *why = o.bias ? "the module was created with bias" : "the module was created without bias";
  check_presence(a.fc1_bias, ArgName(p, "fc1_bias"), o.bias, why);
  check_presence(a.fc2_bias, ArgName(p, "fc2_bias"), o.bias, why);
  if (a.fc1_bias.data) check_vector(a.fc1_bias, ArgName(p, "fc1_bias"), o.fc1_out(), dt, dev);
  if (a.fc2_bias.data) check_vector(a.fc2_bias, ArgName(p, "fc2_bias"), o.hidden, dt, dev);
  if (y.data) check_output_like(y, "y", a.input, o.hidden, "hidden_size", dt, dev);
}

LayerNormMlpSaved *layernorm_mlp_forward_compute(Context &ctx, LayerNormMlp &m, const LayerNormMlpForwardArgs &args,
                                                 const TensorView &y) {
  LayerNormMlpCore &L = *m.core();
  const LayerNormMlpOptions &o = L.opts;
  if (!y.data) fail(Status::InvalidArgument, "argument 'y->data': expected a non-NULL pointer, got NULL");
  layernorm_mlp_validate(ctx, o, args, y, "args");
  Backend &be = ctx.backend();
  Autocast &ac = ctx.autocast();
  const ForwardMode mode = ForwardMode::of(ac);
  const int64_t tokens = args.input.rows();
  const ProjectionDims fc1_dims{tokens, o.hidden, o.fc1_out()};
  const ProjectionDims fc2_dims{tokens, o.ffn, o.hidden};
  if (mode.fp8) {
    check_module_fp8_dims("args->input", "m", tokens, o.fc1_out(), o.hidden);
    check_module_fp8_dims("args->input", "m", tokens, o.hidden, o.ffn);
  }
  const Device dev = ctx.device();
  const DType dt = o.activation_dtype;
  const NormInputs norm_in{make_view(args.input.data, dt, dev, tokens, o.hidden), args.ln_weight, args.ln_bias};
  const TensorView ln_out = args.ln_out.data ? make_view(args.ln_out.data, dt, dev, tokens, o.hidden) : TensorView();
  const TensorView y2d = make_view(y.data, dt, dev, tokens, o.hidden);

  LayerNormMlpPools &pools = layernorm_mlp_pools(ctx);
  LayerNormMlpSaved *saved = pools.saved.acquire(ctx);
  try {
    const bool fused = mode.fp8 && mode.delayed();
    // FP8 on a backend that fuses the recipe's cast with it (CUDA: every recipe, current scaling
    // outside a group-reduced amax): the activation is made inside fc2's cast of its input and
    // never stored (one pass over fc1's output, two under current scaling, instead of a write and
    // reads back).
    const bool act_in_cast = mode.fp8 && activation_in_cast(be, *mode.recipe, mode.group);
    // fc1's output is the activation's residual; the activation's output is fc2's input (its
    // residual too outside FP8, where fc2 keeps it in high precision).
    Buffer fc1_out(&be, static_cast<size_t>(tokens * o.fc1_out()) * dtype_size(dt));
    Buffer act_out;
    if (!act_in_cast) act_out = Buffer(&be, static_cast<size_t>(tokens * o.ffn) * dtype_size(dt));
    const TensorView fc1_view = make_view(fc1_out.get(), dt, dev, tokens, o.fc1_out());
    const TensorView act_view = make_view(act_out.get(), dt, dev, tokens, o.ffn);
    ActivationSource act_source;
    if (act_in_cast) act_source.act = o.activation, act_source.pre = fc1_view;
    ScratchPlan plan;
    NormForwardStep norm(be, o.norm, norm_in, fused, !mode.fp8, ln_out, &plan);
    ProjectionForward fc1(ctx, L.fc1, mode, fc1_dims, norm.hp_output(), fused, args.fc1_weight, args.fc1_bias,
                          fc1_view, args.weight_unchanged, &plan);
    if (!act_in_cast) be.plan_activation(o.activation, fc1_view, false, &plan);
    ProjectionForward fc2(ctx, L.fc2, mode, fc2_dims, act_view, false, args.fc2_weight, args.fc2_bias, y2d,
                          args.weight_unchanged, &plan, act_source);
    fc1.quantize_weight_of(fc2);  // both weights in one launch, before fc1's GEMM
    be.reserve(plan);
    ac.reserve_forward(fc1.states_to_register() + fc2.states_to_register());

    fc1.commit();
    fc2.commit();
    if (mode.fp8) saved->ticket = ac.enter_module();
    norm.run(&fc1);
    fc1.run();
    if (!act_in_cast) be.activation_forward(o.activation, fc1_view, act_view);
    fc2.run();
    norm.save(&saved->norm);
    fc1.save(&saved->fc1);
    fc2.save(&saved->fc2);
    saved->fc1_out = std::move(fc1_out);
    if (!mode.fp8) saved->act_out = std::move(act_out);  // FP8: fc2 keeps its quantized x^T instead
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
