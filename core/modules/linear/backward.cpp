#include "modules/common/validate.h"
#include "modules/linear/linear.h"

namespace te {

namespace {

void validate_backward(const Context &ctx, const LinearSaved &s, const LinearBackwardArgs &a) {
  const LinearOptions &o = s.layer->opts;
  const Device &dev = ctx.device();
  const DType dt = o.activation_dtype;
  const int64_t tokens = s.proj.tokens;
  check_tensor(a.dy, "dy", dt, dev);
  check_matrix(a.dy, "dy", tokens, o.out_features);
  if (a.dx.data) {
    check_tensor(a.dx, "dx", dt, dev);
    check_matrix(a.dx, "dx", tokens, o.in_features);
  }
  if (a.dw.data) check_weight(a.dw, "dw", o.out_features, o.in_features, o.fuse_wgrad_accumulation ? DType::F32 : dt, dev);
  if (a.db.data) {
    if (!o.bias) fail(Status::InvalidArgument, "argument 'db': the layer has no bias, expected NULL");
    check_vector(a.db, "db", o.out_features, dt, dev);
  }
}

}  // namespace

void linear_backward(Context &ctx, LinearBackwardCtx &bwd, const LinearBackwardArgs &args) {
  if (!bwd.saved)
    fail(Status::InvalidState, "argument 'bwd': its residuals were freed by an earlier TE_BACKWARD_ONCE backward");
  LinearSaved &s = *bwd.saved;
  validate_backward(ctx, s, args);
  LinearCore &L = *s.layer;
  const LinearOptions &o = L.opts;
  const ProjectionDims dims{s.proj.tokens, o.in_features, o.out_features};
  ProjectionGrads g;
  g.dx = make_view(args.dx.data, args.dx.dtype, args.dx.device, dims.tokens, o.in_features);
  g.dw = args.dw;
  g.db = args.db;
  const TensorView dy = make_view(args.dy.data, args.dy.dtype, args.dy.device, dims.tokens, o.out_features);

  // As in the forward: allocate, stage and reserve everything first, so that running out of
  // memory changes nothing (not even an output), then compute.
  ScratchPlan plan;
  ProjectionBackward step(ctx, L.proj, s.proj, s.recipe.get(), s.group.get(), dims, dy, g, o.fuse_wgrad_accumulation,
                          &plan);
  ctx.backend().reserve(plan);
  // The backward of the pass's first module ends the pass even when it quantized no dy (dx and
  // dW both skipped): the other modules' grad_output states are waiting for that update.
  const int registering = step.states_to_register();
  const bool ends_pass = s.ticket.first && s.ticket.pass != 0;
  if (registering || ends_pass) ctx.autocast().reserve_backward(s.ticket.pass, registering);
  step.commit();
  step.run();
  if (registering) step.register_state(s.ticket.pass);
  if (ends_pass) ctx.autocast().finish_backward_pass(s.ticket.pass);
  if (args.once) bwd.saved.reset();
}

}  // namespace te
