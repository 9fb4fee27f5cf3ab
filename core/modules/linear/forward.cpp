#include <cstring>

#include "modules/common/validate.h"
#include "modules/linear/linear.h"

namespace te {

Linear::Linear(Context &ctx, const LinearOptions &o)
    : Handle(HandleKind::Linear), core_(std::make_shared<LinearCore>(ctx, o)), records_(&linear_record_destroy) {}

void linear_validate_forward(Context &ctx, const LinearOptions &o, const LinearForwardArgs &a, const TensorView &y) {
  const Device &dev = ctx.device();
  const DType dt = o.activation_dtype;
  check_tensor(a.input, "args->input", dt, dev);
  if (a.input.cols() != o.in_features)
    fail(Status::InvalidArgument, "argument 'args->input': expected last dimension in_features=%lld, got %lld",
         (long long)o.in_features, (long long)a.input.cols());
  check_weight(a.weight, "args->weight", o.out_features, o.in_features, dt, dev);
  check_presence(a.bias, "args->bias", o.bias,
                 o.bias ? "the layer was created with bias" : "the layer was created without bias");
  if (a.bias.data) check_vector(a.bias, "args->bias", o.out_features, dt, dev);
  check_output_like(y, "y", a.input, o.out_features, "out_features", dt, dev);
}

void linear_forward_compute(Context &ctx, Linear &lin, const LinearForwardArgs &args, const TensorView &y,
                            SavedPtr &saved_out, TensorView *input_t, TensorView *weight_t) {
  LinearCore &L = *lin.core();
  const LinearOptions &o = L.opts;
  linear_validate_forward(ctx, o, args, y);
  Backend &be = ctx.backend();
  Autocast &ac = ctx.autocast();
  const ForwardMode mode = ForwardMode::of(ac);
  const ProjectionDims dims{args.input.rows(), o.in_features, o.out_features};
  if (mode.fp8) check_module_fp8_dims("args->input", "lin", dims.tokens, o.out_features, o.in_features);
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
