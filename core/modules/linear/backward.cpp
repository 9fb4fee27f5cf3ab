#include "base/check.h"
#include "modules/linear/linear.h"

namespace te {

namespace {

void validate_backward(const Context &ctx, const LinearSaved &s, const LinearBackwardArgs &a) {
  const LinearOptions &o = s.layer->opts;
  const Device &dev = ctx.device();
  check_dtype(a.dy, "dy", o.activation_dtype);
  check_device(a.dy, "dy", dev);
  check_matrix(a.dy, "dy", s.tokens, o.out_features);
  if (a.dx.data) {
    check_dtype(a.dx, "dx", o.activation_dtype);
    check_device(a.dx, "dx", dev);
    check_matrix(a.dx, "dx", s.tokens, o.in_features);
  }
  if (a.dw.data) {
    check_dtype(a.dw, "dw", o.fuse_wgrad_accumulation ? DType::F32 : o.activation_dtype);
    check_device(a.dw, "dw", dev);
    if (a.dw.ndim != 2) fail(Status::InvalidArgument, "argument 'dw': expected 2 dimensions, got %d", a.dw.ndim);
    check_matrix(a.dw, "dw", o.out_features, o.in_features);
  }
  if (a.db.data) {
    if (!o.bias) fail(Status::InvalidArgument, "argument 'db': the layer has no bias, expected NULL");
    check_dtype(a.db, "db", o.activation_dtype);
    check_device(a.db, "db", dev);
    if (a.db.ndim != 1 || a.db.shape[0] != o.out_features)
      fail(Status::InvalidArgument, "argument 'db': expected shape [%lld], got %d dims, %lld elements",
           (long long)o.out_features, a.db.ndim, (long long)a.db.numel());
  }
}

GemmArgs gemm_tn(const TensorView &a, const TensorView &b, const TensorView &d, bool accumulate, bool split) {
  GemmArgs g;
  g.a = a;
  g.b = b;
  g.transb = true;
  g.d = d;
  g.accumulate = accumulate;
  g.split_accumulator = split;
  return g;
}

}  // namespace

void linear_backward(Context &ctx, LinearBackwardCtx &bwd, const LinearBackwardArgs &args) {
  if (!bwd.saved)
    fail(Status::InvalidState, "argument 'bwd': its residuals were freed by an earlier TE_BACKWARD_ONCE backward");
  LinearSaved &s = *bwd.saved;
  validate_backward(ctx, s, args);
  LinearCore &L = *s.layer;
  const LinearOptions &o = L.opts;
  Backend &be = ctx.backend();
  const TensorView dy = make_view(args.dy.data, args.dy.dtype, args.dy.device, s.tokens, o.out_features);
  const TensorView dx = make_view(args.dx.data, args.dx.dtype, args.dx.device, s.tokens, o.in_features);
  const bool want_dx = args.dx.data != nullptr, want_dw = args.dw.data != nullptr;

  // As in the forward: allocate, stage and reserve everything first, so that running out of
  // memory changes nothing (not even an output), then compute. main_grad is accumulated into
  // last of all.
  ScratchPlan plan;
  if (args.db.data) be.plan_bias_grad(dy, &plan);
  if (!s.fp8) {
    GemmArgs dgrad;  // dx = dy W
    dgrad.a = dy;
    dgrad.b = s.w_hp;
    dgrad.d = dx;
    GemmArgs wgrad;  // dW = dy^T x
    wgrad.a = dy;
    wgrad.transa = true;
    wgrad.b = s.x_hp;
    wgrad.d = args.dw;
    wgrad.accumulate = o.fuse_wgrad_accumulation;
    if (want_dx) be.plan_gemm(dgrad, &plan);
    if (want_dw) be.plan_gemm(wgrad, &plan);
    be.reserve(plan);
    if (want_dx) be.gemm(dgrad);
    if (args.db.data) be.bias_grad(dy, args.db);
    if (want_dw) be.gemm(wgrad);
  } else {
    const Recipe &recipe = *s.recipe;
    const RecipeOptions &ro = recipe.options();
    const DType f8 = recipe.backward_dtype();
    const bool delayed = recipe.kind() == RecipeKind::Delayed;
    QuantizedMatrix dyq;
    dyq.allocate(be, scaling_mode_for(recipe, TensorKind::Gradient), f8, s.tokens, o.out_features, want_dx, want_dw);
    Buffer grad_scale;
    if (delayed && !bwd.grad_scale_taken) grad_scale = Buffer(&be, sizeof(float));
    ScalingState::Staged staged = L.grad_output.stage(be, ctx.amax_slots(), recipe, f8);
    QuantizeRequest req;
    req.recipe = &recipe;
    req.group = s.group.get();
    const GemmArgs dgrad = gemm_tn(dyq.row, s.w->q.col, dx, false, ro.dgrad_split_accumulator);
    const GemmArgs wgrad = gemm_tn(dyq.col, s.x.col, args.dw, o.fuse_wgrad_accumulation, ro.wgrad_split_accumulator);
    if (want_dx || want_dw) plan_quantize(be, req, dy, dyq, &plan);
    if (want_dx) be.plan_gemm(dgrad, &plan);
    if (want_dw) be.plan_gemm(wgrad, &plan);
    be.reserve(plan);
    if (delayed && (want_dx || want_dw)) ctx.autocast().reserve_backward(s.ticket.pass, 1);

    L.grad_output.commit(be, std::move(staged));
    if (delayed && !bwd.grad_scale_taken) bwd.grad_scale = std::move(grad_scale);
    // A repeated backward must give identical gradients, so dy is always quantized with the scale
    // the first call used, even after the pass's backward update has moved the state's scale.
    if (delayed && !bwd.grad_scale_taken) {
      be.copy(bwd.grad_scale.get(), L.grad_output.scale(), sizeof(float));
      bwd.grad_scale_taken = true;
    }
    req.state = &L.grad_output;
    req.scale = delayed ? bwd.grad_scale.floats() : nullptr;
    if (want_dx || want_dw) quantize(be, req, dy, dyq);
    if (want_dx) be.gemm(dgrad);
    if (args.db.data) be.bias_grad(dy, args.db);
    if (want_dw) be.gemm(wgrad);
  }

  if (s.fp8 && s.recipe->kind() == RecipeKind::Delayed && (want_dx || want_dw)) {
    Autocast &ac = ctx.autocast();
    ac.register_backward(s.ticket.pass, s.recipe.get(), s.group.get(), &L.grad_output);
    if (s.ticket.first) ac.finish_backward_pass(s.ticket.pass);
  }
  if (args.once) bwd.saved.reset();
}

}  // namespace te
