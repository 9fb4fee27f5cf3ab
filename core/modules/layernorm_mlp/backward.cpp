#include "modules/common/validate.h"
#include "modules/layernorm_mlp/layernorm_mlp.h"

namespace te {

namespace {

void validate_backward(const Context &ctx, const LayerNormMlpSaved &s, const TensorView &dy,
                       const LayerNormMlpGrads &g) {
  const LayerNormMlpOptions &o = s.layer->opts;
  const Device &dev = ctx.device();
  const DType dt = o.activation_dtype;
  const DType wgrad_dt = o.fuse_wgrad_accumulation ? DType::F32 : dt;
  const int64_t tokens = s.fc1.tokens;
  check_tensor(dy, "dy", dt, dev);
  check_matrix(dy, "dy", tokens, o.hidden);
  if (g.dx.data) {
    check_tensor(g.dx, "grads->dx", dt, dev);
    check_matrix(g.dx, "grads->dx", tokens, o.hidden);
  }
  if (g.dgamma.data) check_vector(g.dgamma, "grads->dln_weight", o.hidden, dt, dev);
  if (g.dbeta.data) {
    if (o.norm.kind != NormKind::LayerNorm)
      fail(Status::InvalidArgument, "argument 'grads->dln_bias': RMSNorm has no beta, expected NULL");
    check_vector(g.dbeta, "grads->dln_bias", o.hidden, dt, dev);
  }
  if (g.dfc1_w.data) check_weight(g.dfc1_w, "grads->dfc1_weight", o.fc1_out(), o.hidden, wgrad_dt, dev);
  if (g.dfc2_w.data) check_weight(g.dfc2_w, "grads->dfc2_weight", o.hidden, o.ffn, wgrad_dt, dev);
  const bool any_db = g.dfc1_b.data || g.dfc2_b.data;
  if (any_db && !o.bias)
    fail(Status::InvalidArgument, "argument '%s': the module has no bias, expected NULL",
         g.dfc1_b.data ? "grads->dfc1_bias" : "grads->dfc2_bias");
  if (g.dfc1_b.data) check_vector(g.dfc1_b, "grads->dfc1_bias", o.fc1_out(), dt, dev);
  if (g.dfc2_b.data) check_vector(g.dfc2_b, "grads->dfc2_bias", o.hidden, dt, dev);
}

}  // namespace

void layernorm_mlp_backward(Context &ctx, LayerNormMlpBackwardCtx &bwd, const TensorView &dy,
                            const LayerNormMlpGrads &g, bool once) {
  if (!bwd.saved)
    fail(Status::InvalidState, "argument 'bwd': its residuals were freed by an earlier TE_BACKWARD_ONCE backward");
  LayerNormMlpSaved &s = *bwd.saved;
  validate_backward(ctx, s, dy, g);
  LayerNormMlpCore &L = *s.layer;
  const LayerNormMlpOptions &o = L.opts;
  Backend &be = ctx.backend();
  const Device dev = ctx.device();
  const DType dt = o.activation_dtype;
  const int64_t tokens = s.fc1.tokens;
  const ProjectionDims fc1_dims{tokens, o.hidden, o.fc1_out()};
  const ProjectionDims fc2_dims{tokens, o.ffn, o.hidden};
  // Which stages run: the norm's backward for dx/dgamma/dbeta; fc1's for those or its own
  // gradients; fc2's dgrad whenever fc1's backward runs.
  const bool through_norm = g.dx.data || g.dgamma.data || g.dbeta.data;
  const bool through_fc1 = through_norm || g.dfc1_w.data || g.dfc1_b.data;

  // FP8 on a backend that fuses the recipe's cast with it (forward.cpp), with fc1's dy quantized
  // (for dx, dgamma, dbeta or dW1): the activation's gradient is made inside that cast and never
  // stored.
  const bool fc1_quantizes = through_norm || g.dfc1_w.data;
  const bool act_in_cast = through_fc1 && fc1_quantizes && s.fc1.fp8 && s.recipe.get() &&
                           activation_in_cast(be, *s.recipe.get(), s.group.get());

  Buffer d_act, d_fc1, d_ln;
  if (through_fc1) {
    d_act = Buffer(&be, static_cast<size_t>(tokens * o.ffn) * dtype_size(dt));
    if (!act_in_cast) d_fc1 = Buffer(&be, static_cast<size_t>(tokens * o.fc1_out()) * dtype_size(dt));
  }
  if (through_norm) d_ln = Buffer(&be, static_cast<size_t>(tokens * o.hidden) * dtype_size(dt));
  const TensorView d_act_view = d_act.get() ? make_view(d_act.get(), dt, dev, tokens, o.ffn) : TensorView();
  const TensorView d_fc1_view = d_fc1.get() || act_in_cast ? make_view(d_fc1.get(), dt, dev, tokens, o.fc1_out())
                                                           : TensorView();
  const TensorView d_ln_view = d_ln.get() ? make_view(d_ln.get(), dt, dev, tokens, o.hidden) : TensorView();
  const TensorView fc1_out = make_view(s.fc1_out.get(), dt, dev, tokens, o.fc1_out());
  ActivationSource act_source;
  if (act_in_cast) act_source.backward = true, act_source.act = o.activation, act_source.pre = fc1_out,
                   act_source.grad = d_act_view;

  ScratchPlan plan;
  ProjectionGrads g2{d_act_view, g.dfc2_w, g.dfc2_b};
  ProjectionBackward fc2(ctx, L.fc2, s.fc2, s.recipe.get(), s.group.get(), fc2_dims,
                         make_view(dy.data, dt, dev, tokens, o.hidden), g2, o.fuse_wgrad_accumulation, &plan);
  if (through_fc1 && !act_in_cast) be.plan_activation(o.activation, fc1_out, true, &plan);
  ProjectionGrads g1{d_ln_view, g.dfc1_w, g.dfc1_b};
  ProjectionBackward fc1(ctx, L.fc1, s.fc1, s.recipe.get(), s.group.get(), fc1_dims, d_fc1_view, g1,
                         o.fuse_wgrad_accumulation, &plan, act_source);
  const TensorView dx = g.dx.data ? make_view(g.dx.data, dt, dev, tokens, o.hidden) : TensorView();
  const NormBackwardArgs nb = norm_backward_args(o.norm, s.norm, d_ln_view, dx, g.dgamma, g.dbeta);
  if (through_norm) be.plan_norm_backward(nb, &plan);
  be.reserve(plan);
  const int registering = fc2.states_to_register() + (through_fc1 ? fc1.states_to_register() : 0);
  // The first FP8 module's backward ends its pass (te.h), also when it quantizes no dy itself
  // (only biases requested, or nothing) and so registers nothing: other modules' GRAD_OUTPUT
  // states wait in the pass's bucket. Reserving first keeps the update from allocating late.
  const bool ends_pass = s.ticket.first && s.ticket.pass != 0;
  if (registering || ends_pass) ctx.autocast().reserve_backward(s.ticket.pass, registering);

  fc2.commit();
  if (through_fc1) fc1.commit();
  fc2.run();
  if (through_fc1) {
    if (!act_in_cast) be.activation_backward(o.activation, fc1_out, d_act_view, d_fc1_view);
    fc1.run();
  }
  if (registering) {
    fc2.register_state(s.ticket.pass);
    if (through_fc1) fc1.register_state(s.ticket.pass);
  }
  norm_backward_and_end_pass(be, ctx.autocast(), nb, through_norm, ends_pass, s.ticket.pass);
  if (once) {
    layernorm_mlp_pools(ctx).saved.release(bwd.saved);
    bwd.saved = nullptr;
  }
}

}  // namespace te
