#include "modules/common/validate.h"
#include "modules/layernorm_linear/layernorm_linear.h"

namespace te {

namespace {

void validate_backward(const Context &ctx, const LayerNormLinearSaved &s, const TensorView &dy,
                       const LayerNormLinearGrads &g) {
  const LayerNormLinearOptions &o = s.layer->opts;
  const Device &dev = ctx.device();
  const DType dt = o.activation_dtype;
  const int64_t tokens = s.proj.tokens;
  check_tensor(dy, "dy", dt, dev);
  check_matrix(dy, "dy", tokens, o.out_features);
  if (g.dx.data) {
    check_tensor(g.dx, "grads->dx", dt, dev);
    check_matrix(g.dx, "grads->dx", tokens, o.in_features);
  }
  if (g.dgamma.data) check_vector(g.dgamma, "grads->dln_weight", o.in_features, dt, dev);
  if (g.dbeta.data) {
    if (o.norm.kind != NormKind::LayerNorm)
      fail(Status::InvalidArgument, "argument 'grads->dln_bias': RMSNorm has no beta, expected NULL");
    check_vector(g.dbeta, "grads->dln_bias", o.in_features, dt, dev);
  }
  if (g.dw.data)
    check_weight(g.dw, "grads->dw", o.out_features, o.in_features, o.fuse_wgrad_accumulation ? DType::F32 : dt, dev);
  if (g.db.data) {
    if (!o.bias) fail(Status::InvalidArgument, "argument 'grads->db': the layer has no bias, expected NULL");
    check_vector(g.db, "grads->db", o.out_features, dt, dev);
  }
}

}  // namespace

void layernorm_linear_backward(Context &ctx, LayerNormLinearBackwardCtx &bwd, const TensorView &dy,
                               const LayerNormLinearGrads &g, bool once) {
  if (!bwd.saved)
    fail(Status::InvalidState, "argument 'bwd': its residuals were freed by an earlier TE_BACKWARD_ONCE backward");
  LayerNormLinearSaved &s = *bwd.saved;
  validate_backward(ctx, s, dy, g);
  LayerNormLinearCore &L = *s.layer;
  const LayerNormLinearOptions &o = L.opts;
  Backend &be = ctx.backend();
  const Device dev = ctx.device();
  const DType dt = o.activation_dtype;
  const ProjectionDims dims{s.proj.tokens, o.in_features, o.out_features};
  // The norm's backward runs when any of its gradients is wanted; it needs d(norm output).
  const bool through_norm = g.dx.data || g.dgamma.data || g.dbeta.data;

  Buffer dln;
  if (through_norm) dln = Buffer(&be, static_cast<size_t>(dims.tokens * dims.in) * dtype_size(dt));
  ProjectionGrads pg;
  pg.dx = through_norm ? make_view(dln.get(), dt, dev, dims.tokens, dims.in) : TensorView();
  pg.dw = g.dw;
  pg.db = g.db;
  ScratchPlan plan;
  ProjectionBackward gemm(ctx, L.proj, s.proj, s.recipe.get(), s.group.get(), dims,
                          make_view(dy.data, dt, dev, dims.tokens, dims.out), pg, o.fuse_wgrad_accumulation, &plan);
  const TensorView dx = g.dx.data ? make_view(g.dx.data, dt, dev, dims.tokens, dims.in) : TensorView();
  const NormBackwardArgs nb = norm_backward_args(o.norm, s.norm, pg.dx, dx, g.dgamma, g.dbeta);
  if (through_norm) be.plan_norm_backward(nb, &plan);
  be.reserve(plan);
  // The first FP8 module's backward ends its pass (te.h), also when it quantizes no dy itself
  // (grads NULL, or db only) and so registers nothing: other modules' GRAD_OUTPUT states wait in
  // the pass's bucket. Reserving first keeps the update from allocating after the outputs.
  const int registering = gemm.states_to_register();
  const bool ends_pass = s.ticket.first && s.ticket.pass != 0;
  if (registering || ends_pass) ctx.autocast().reserve_backward(s.ticket.pass, registering);

  gemm.commit();
  gemm.run();
  if (registering) gemm.register_state(s.ticket.pass);
  norm_backward_and_end_pass(be, ctx.autocast(), nb, through_norm, ends_pass, s.ticket.pass);
  if (once) {
    layernorm_linear_pools(ctx).saved.release(bwd.saved);
    bwd.saved = nullptr;
  }
}

}  // namespace te
