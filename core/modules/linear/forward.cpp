#include <cstring>

#include "base/check.h"
#include "modules/linear/linear.h"

namespace te {

Linear::Linear(Context &ctx, const LinearOptions &o)
    : Handle(HandleKind::Linear), core_(std::make_shared<LinearCore>(ctx, o)) {}

namespace {

void validate_forward(Context &ctx, const LinearOptions &o, const LinearForwardArgs &a, const TensorView &y) {
  const Device &dev = ctx.device();
  check_dtype(a.input, "args->input", o.activation_dtype);
  check_device(a.input, "args->input", dev);
  if (a.input.cols() != o.in_features)
    fail(Status::InvalidArgument, "argument 'args->input': expected last dimension in_features=%lld, got %lld",
         (long long)o.in_features, (long long)a.input.cols());
  check_dtype(a.weight, "args->weight", o.activation_dtype);
  check_device(a.weight, "args->weight", dev);
  if (a.weight.ndim != 2) fail(Status::InvalidArgument, "argument 'args->weight': expected 2 dimensions, got %d", a.weight.ndim);
  check_matrix(a.weight, "args->weight", o.out_features, o.in_features);
  if (o.bias && !a.bias.data)
    fail(Status::InvalidArgument, "argument 'args->bias': the layer was created with bias, got NULL");
  if (!o.bias && a.bias.data)
    fail(Status::InvalidArgument, "argument 'args->bias': the layer was created without bias, expected NULL");
  if (a.bias.data) {
    check_dtype(a.bias, "args->bias", o.activation_dtype);
    check_device(a.bias, "args->bias", dev);
    if (a.bias.ndim != 1 || a.bias.shape[0] != o.out_features)
      fail(Status::InvalidArgument, "argument 'args->bias': expected shape [%lld], got %d dims, %lld elements",
           (long long)o.out_features, a.bias.ndim, (long long)a.bias.numel());
  }
  check_dtype(y, "y", o.activation_dtype);
  check_device(y, "y", dev);
  bool same_lead = y.ndim == a.input.ndim;
  for (int i = 0; same_lead && i + 1 < y.ndim; ++i) same_lead = y.shape[i] == a.input.shape[i];
  if (!same_lead || y.cols() != o.out_features)
    fail(Status::InvalidArgument, "argument 'y': expected the input's leading dimensions and last dimension "
         "out_features=%lld, got %d dims with last dimension %lld", (long long)o.out_features, y.ndim, (long long)y.cols());
}

}  // namespace

void linear_forward_compute(Context &ctx, Linear &lin, const LinearForwardArgs &args, const TensorView &y,
                            SavedPtr &saved_out, TensorView *input_t, TensorView *weight_t) {
  LinearCore &L = *lin.core();
  const LinearOptions &o = L.opts;
  validate_forward(ctx, o, args, y);
  Backend &be = ctx.backend();
  Autocast &ac = ctx.autocast();
  const ForwardMode mode = ForwardMode::of(ac);
  const ProjectionDims dims{args.input.rows(), o.in_features, o.out_features};
  if (mode.fp8) {
    // Name the culprit: the tokens come from the input, the features from the layer.
    const char *culprit = dims.tokens % 16 ? "argument 'args->input'" : "argument 'lin'";
    check_fp8_dims(culprit, dims.tokens, o.out_features, o.in_features);
  }
  const TensorView x2d = make_view(args.input.data, args.input.dtype, args.input.device, dims.tokens, o.in_features);
  const TensorView y2d = make_view(y.data, y.dtype, y.device, dims.tokens, o.out_features);

  // Everything that can fail for lack of memory happens before any state changes: objects and
  // buffers are allocated, scaling states staged, the kernels' scratch and the autocast buckets'
  // room reserved; only then are states committed and the kernels run.
  SavedPtr saved = linear_pool(ctx).acquire_saved(ctx);
  ScratchPlan plan;
  ProjectionForward step(ctx, L.proj, mode, dims, x2d, false, args.weight, args.bias, y2d, args.weight_unchanged,
                         &plan);
  be.reserve(plan);
  ac.reserve_forward(step.states_to_register());
  step.commit();
  if (mode.fp8) saved->ticket = ac.enter_module();
  step.run();
  step.save(&saved->proj);
  saved->layer = lin.core();
  if (mode.fp8) {
    saved->recipe = RecipeRef(mode.recipe);
    saved->group = GroupRef(mode.group);
  }
  const ProjectionSaved &p = saved->proj;
  if (input_t) *input_t = p.fp8 ? p.x.col : p.x_hp;
  if (weight_t) *weight_t = p.fp8 ? p.w->q.col : p.w_hp;
  saved_out = std::move(saved);
}

}  // namespace te
