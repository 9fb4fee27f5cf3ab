#include <cstring>

#include "base/check.h"
#include "modules/linear/linear.h"

namespace te {

LinearCore::~LinearCore() {
  ctx.autocast().forget(&input);
  ctx.autocast().forget(&weight);
  ctx.autocast().forget(&grad_output);
}

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

GemmArgs fprop_gemm(const TensorView &x, const TensorView &w, const TensorView &bias, const TensorView &y2d,
                    bool split) {
  GemmArgs g;
  g.a = x;
  g.b = w;
  g.transb = true;  // y = x W^T
  g.d = y2d;
  if (bias.data) {
    g.epilogue = Epilogue::Bias;
    g.bias = bias;
  }
  g.split_accumulator = split;
  return g;
}

}  // namespace

void linear_forward_compute(Context &ctx, Linear &lin, const LinearForwardArgs &args, const TensorView &y,
                            SavedPtr &saved_out, TensorView *input_t, TensorView *weight_t) {
  LinearCore &L = *lin.core();
  const LinearOptions &o = L.opts;
  validate_forward(ctx, o, args, y);
  Backend &be = ctx.backend();
  Autocast &ac = ctx.autocast();
  const AutocastScope *scope = ac.innermost();
  const bool fp8 = scope && scope->enabled;
  const bool calibrating = scope && !scope->enabled && scope->calibrating;
  const Recipe *recipe = scope ? scope->recipe : nullptr;
  const int64_t tokens = args.input.rows();
  if (fp8) {
    // Name the culprit: the tokens come from the input, the features from the layer.
    const char *culprit = tokens % 16 ? "argument 'args->input'" : "argument 'lin'";
    check_fp8_dims(culprit, tokens, o.out_features, o.in_features);
  }

  TensorView x2d = make_view(args.input.data, args.input.dtype, args.input.device, tokens, o.in_features);
  TensorView y2d = make_view(y.data, y.dtype, y.device, tokens, o.out_features);

  // Everything that can fail for lack of memory happens before any state changes: objects and
  // buffers are allocated, scaling states staged, the kernels' scratch and the autocast buckets'
  // room reserved; only then are states committed and the kernels run.
  SavedPtr saved = linear_pool(ctx).acquire_saved(ctx);
  saved->layer = lin.core();
  saved->tokens = tokens;
  saved->fp8 = fp8;
  ScratchPlan plan;
  if (!fp8) {
    saved->x_hp = x2d;
    saved->w_hp = args.weight;
    const GemmArgs fprop = fprop_gemm(x2d, args.weight, args.bias, y2d, false);
    be.plan_gemm(fprop, &plan);
    if (calibrating && recipe->kind() == RecipeKind::Delayed) {
      ScalingState::Staged in = L.input.stage(be, ctx.amax_slots(), *recipe, recipe->forward_dtype());
      ScalingState::Staged w = L.weight.stage(be, ctx.amax_slots(), *recipe, recipe->forward_dtype());
      be.reserve(plan);
      ac.reserve_forward(2);
      L.input.commit(be, std::move(in));
      L.weight.commit(be, std::move(w));
      be.amax(x2d, L.input.amax(), true);
      be.amax(args.weight, L.weight.amax(), true);
      ac.register_forward(&L.input);
      ac.register_forward(&L.weight);
    } else {
      be.reserve(plan);
    }
    be.gemm(fprop);
    if (input_t) *input_t = saved->x_hp;
    if (weight_t) *weight_t = saved->w_hp;
    saved_out = std::move(saved);
    return;
  }

  const DType f8 = recipe->forward_dtype();
  QuantizedMatrix xq;
  xq.allocate(be, scaling_mode_for(*recipe, TensorKind::Activation), f8, tokens, o.in_features, true, true);
  const bool reuse = args.weight_unchanged && L.weight_cache && L.weight_cache->recipe_key == recipe->key();
  // Residuals of earlier forwards may still hold the cached weight: then refresh into a new one.
  const bool cache_shared = L.weight_cache.use_count() > 1;
  std::shared_ptr<WeightCache> wc = L.weight_cache;
  if (!reuse) {
    if (!wc || cache_shared || wc->recipe_key != recipe->key()) {
      wc = std::make_shared<WeightCache>();
      wc->q.allocate(be, scaling_mode_for(*recipe, TensorKind::Weight), f8, o.out_features, o.in_features, true, true);
    }
  }
  ScalingState::Staged in = L.input.stage(be, ctx.amax_slots(), *recipe, f8);
  ScalingState::Staged w = L.weight.stage(be, ctx.amax_slots(), *recipe, f8);
  QuantizeRequest req;
  req.recipe = recipe;
  req.group = scope->group;
  plan_quantize(be, req, x2d, xq, &plan);
  if (!reuse) plan_quantize(be, req, args.weight, wc->q, &plan);
  const GemmArgs fprop = fprop_gemm(xq.row, wc->q.row, args.bias, y2d, recipe->options().fprop_split_accumulator);
  be.plan_gemm(fprop, &plan);
  be.reserve(plan);
  const bool delayed = recipe->kind() == RecipeKind::Delayed;
  if (delayed) ac.reserve_forward(2);

  L.input.commit(be, std::move(in));
  L.weight.commit(be, std::move(w));
  req.state = &L.input;
  quantize(be, req, x2d, xq);
  if (!reuse) {
    req.state = &L.weight;
    quantize(be, req, args.weight, wc->q);
    wc->recipe_key = recipe->key();
    L.weight_cache = wc;
  }
  be.gemm(fprop);

  if (delayed) {
    ac.register_forward(&L.input);
    ac.register_forward(&L.weight);
  }
  saved->ticket = ac.enter_module();
  saved->recipe = RecipeRef(recipe);
  saved->group = GroupRef(scope->group);
  // The row-wise x served only the fprop GEMM; backward needs x^T alone (whose per-tensor
  // scale_inv may live in the row-wise scale_inv buffer, which therefore stays).
  xq.data.reset();
  xq.row = TensorView();
  saved->x = std::move(xq);
  saved->w = wc;
  if (input_t) *input_t = saved->x.col;
  if (weight_t) *weight_t = saved->w->q.col;
  saved_out = std::move(saved);
}

}  // namespace te
