#include "modules/common/validate.h"
#include "modules/grouped_linear/grouped_linear.h"
#include "modules/grouped_linear/sequential_scratch.h"

namespace te {

namespace {

void validate_backward(const Context &ctx, const GroupedLinearSaved &s, const GroupedLinearBackwardArgs &a) {
  const GroupedLinearOptions &o = s.layer->opts;
  const Device &dev = ctx.device();
  const DType dt = o.activation_dtype;
  check_tensor(a.dy, "dy", dt, dev);
  check_matrix(a.dy, "dy", s.tokens, o.out_features);
  if (a.dx.data) {
    check_tensor(a.dx, "dx", dt, dev);
    check_matrix(a.dx, "dx", s.tokens, o.in_features);
  }
  const DType dw_dt = o.fuse_wgrad_accumulation ? DType::F32 : dt;
  if (a.dw)
    for (int i = 0; i < o.num_gemms; ++i)
      check_weight(a.dw[i], ArgName::element(nullptr, "dw", i), o.out_features, o.in_features, dw_dt, dev);
  if (a.db) {
    if (!o.bias) fail(Status::InvalidArgument, "argument 'db': the layer has no bias, expected NULL");
    for (int i = 0; i < o.num_gemms; ++i)
      check_vector(a.db[i], ArgName::element(nullptr, "db", i), o.out_features, dt, dev);
  }
}

struct BackwardSteps {
  std::vector<std::optional<ProjectionBackward>> &steps;
  ~BackwardSteps() {
    for (auto &s : steps) s.reset();
  }
};

// The backward of every expert. Its steps live in the layer's call storage and are gone when it
// returns (before a TE_BACKWARD_ONCE release, which may drop the last reference to the layer).
void run_backward(Context &ctx, GroupedLinearSaved &s, const GroupedLinearBackwardArgs &args) {
  GroupedLinearCore &L = *s.layer;
  const GroupedLinearOptions &o = L.opts;
  const int n = o.num_gemms;
  Backend &be = ctx.backend();
  Autocast &ac = ctx.autocast();
  const Device dev = ctx.device();
  const DType dt = o.activation_dtype;
  const size_t es = dtype_size(dt);
  const TensorView dy2d = make_view(args.dy.data, dt, dev, s.tokens, o.out_features);
  const TensorView dx2d = args.dx.data ? make_view(args.dx.data, dt, dev, s.tokens, o.in_features) : TensorView();
  ExpertRows *rows = L.call.rows.data();
  const int64_t pad_rows_total = layout_expert_rows(s.splits.data(), n, s.fp8, rows);
  const bool want_dx = dx2d.data != nullptr, want_dw = args.dw != nullptr;

  // As in the forward: every expert's step is allocated, staged and reserved first (nothing
  // changes, not even an output, if memory runs out), then they run one after another.
  Buffer dy_pad(&be, static_cast<size_t>(pad_rows_total * o.out_features) * es);
  Buffer dx_pad(&be, want_dx ? static_cast<size_t>(pad_rows_total * o.in_features) * es : 0);
  const TensorView dy_pad2d = make_view(dy_pad.get(), dt, dev, pad_rows_total, o.out_features);
  const TensorView dx_pad2d = make_view(dx_pad.get(), dt, dev, pad_rows_total, o.in_features);
  BackwardSteps steps{L.call.backward};
  SequentialScratch scratch(be);
  int states = 0;
  for (int i = 0; i < n; ++i) {
    const ExpertRows &e = rows[i];
    if (e.tokens == 0) continue;
    ProjectionGrads g;
    g.dx = expert_matrix(e, dx2d, dx_pad2d);
    if (want_dw) g.dw = args.dw[i];
    if (args.db) g.db = args.db[i];
    ScratchPlan plan;
    steps.steps[i].emplace(ctx, L.experts[i], s.experts[static_cast<size_t>(i)], s.recipe.get(), s.group.get(),
                           ProjectionDims{e.padded, o.in_features, o.out_features, true},
                           expert_matrix(e, dy2d, dy_pad2d), g, o.fuse_wgrad_accumulation, &plan);
    scratch.add_step(plan);
    states += steps.steps[i]->states_to_register();
  }
  scratch.reserve();
  // The first FP8 module's backward ends its pass (te.h), also when it quantizes no dy itself
  // (no dx and no dW asked for, or no expert with tokens) and so registers nothing: the other
  // modules' GRAD_OUTPUT states wait in the pass's bucket. Reserving first keeps the update from
  // allocating after the outputs were written.
  const bool ends_pass = s.ticket.first && s.ticket.pass != 0;
  if (states || ends_pass) ac.reserve_backward(s.ticket.pass, states);

  for (auto &step : steps.steps)
    if (step) step->commit();
  pad_experts(be, rows, n, dy2d, dy_pad2d);
  // An expert that got no tokens has dW = 0 (nothing added into a main_grad) and db = 0: all
  // such gradients in one backend call.
  int running = 0, zeros = 0;
  ByteRange *zero = L.call.zero_ranges.data();
  for (int i = 0; i < n; ++i) {
    if (rows[i].tokens == 0) {
      if (want_dw && !o.fuse_wgrad_accumulation) zero[zeros++] = ByteRange{args.dw[i].data, args.dw[i].bytes()};
      if (args.db) zero[zeros++] = ByteRange{args.db[i].data, args.db[i].bytes()};
      continue;
    }
    L.call.backward_running[static_cast<size_t>(running++)] = &*steps.steps[i];
  }
  if (zeros) be.zero_many(zero, zeros);
  ProjectionBackward::run_all(L.call.backward_running.data(), running);
  if (want_dx) unpad_experts(be, rows, n, dx_pad2d, dx2d);
  if (states)
    for (auto &step : steps.steps)
      if (step) step->register_state(s.ticket.pass);
  if (ends_pass) ac.finish_backward_pass(s.ticket.pass);
}

}  // namespace

void grouped_linear_backward(Context &ctx, GroupedLinearBackwardCtx &bwd, const GroupedLinearBackwardArgs &args) {
  if (!bwd.saved)
    fail(Status::InvalidState, "argument 'bwd': its residuals were freed by an earlier TE_BACKWARD_ONCE backward");
  validate_backward(ctx, *bwd.saved, args);
  run_backward(ctx, *bwd.saved, args);
  if (args.once) {
    grouped_linear_pools(ctx).saved.release(bwd.saved);
    bwd.saved = nullptr;
  }
}

}  // namespace te
