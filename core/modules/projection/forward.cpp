#include "modules/projection/projection.h"

#include "base/check.h"

namespace te {

void ProjectionState::forget(Autocast &ac) {
  ac.forget(&input);
  ac.forget(&weight);
  ac.forget(&grad_output);
}

ForwardMode ForwardMode::of(const Autocast &ac) {
  ForwardMode m;
  const AutocastScope *scope = ac.innermost();
  if (!scope) return m;
  m.fp8 = scope->enabled;
  m.calibrating = !scope->enabled && scope->calibrating;
  m.recipe = scope->recipe;
  m.group = scope->group;
  return m;
}

void ProjectionSaved::clear() {
  fp8 = false;
  x = QuantizedMatrix();
  w.reset();
  x_hp = TensorView();
  w_hp = TensorView();
  tokens = 0;
  grad_scale.reset();
  grad_scale_taken = false;
}

namespace {

GemmArgs fprop_gemm(const TensorView &x, const TensorView &w, const TensorView &bias, const TensorView &y,
                    bool split) {
  GemmArgs g;
  g.a = x;
  g.b = w;
  g.transb = true;  // y = x W^T
  g.d = y;
  if (bias.data) {
    g.epilogue = Epilogue::Bias;
    g.bias = bias;
  }
  g.split_accumulator = split;
  return g;
}

}  // namespace

ProjectionForward::ProjectionForward(Context &ctx, ProjectionState &st, const ForwardMode &mode,
                                     const ProjectionDims &dims, const TensorView &x, bool external_input,
                                     const TensorView &w, const TensorView &bias, const TensorView &y,
                                     bool weight_unchanged, ScratchPlan *plan, const ActivationSource &x_source)
    : ctx_(ctx), st_(st), mode_(mode), dims_(dims), x_(x), w_(w), bias_(bias), y_(y), external_(external_input),
      x_source_(x_source) {
  Backend &be = ctx.backend();
  if (x_source.active() && (!mode.fp8 || external_input))
    fail(Status::Internal, "ProjectionForward: an activation source needs an FP8 forward that quantizes x itself");
  if (!mode.fp8) {
    fprop_ = fprop_gemm(x, w, bias, y, false);
    be.plan_gemm(fprop_, plan);
    if (states_to_register()) {
      staged_in_ = st.input.stage(be, ctx.amax_slots(), *mode.recipe, mode.recipe->forward_dtype());
      staged_w_ = st.weight.stage(be, ctx.amax_slots(), *mode.recipe, mode.recipe->forward_dtype());
    }
    return;
  }
  const Recipe &recipe = *mode.recipe;
  const DType f8 = recipe.forward_dtype();
  xq_.allocate(be, scaling_mode_for(recipe, TensorKind::Activation), f8, dims.tokens, dims.in, true, true);
  reuse_weight_ = weight_unchanged && st.weight_cache && st.weight_cache->recipe_key == recipe.key();
  // Residuals of earlier forwards may still hold the cached weight: then refresh into a new one.
  const bool cache_shared = st.weight_cache.use_count() > 1;
  wc_ = st.weight_cache;
  if (!reuse_weight_ && (!wc_ || cache_shared || wc_->recipe_key != recipe.key())) {
    wc_ = std::make_shared<WeightCache>();
    wc_->q.allocate(be, scaling_mode_for(recipe, TensorKind::Weight), f8, dims.out, dims.in, true, true);
  }
  staged_in_ = st.input.stage(be, ctx.amax_slots(), recipe, f8);
  staged_w_ = st.weight.stage(be, ctx.amax_slots(), recipe, f8);
  QuantizeRequest req;
  req.recipe = &recipe;
  req.group = mode.group;
  req.source = x_source;
  if (!external_) plan_quantize(be, req, x, xq_, plan);
  req.source = ActivationSource();
  if (!reuse_weight_) plan_quantize(be, req, w, wc_->q, plan);
  fprop_ = fprop_gemm(xq_.row, wc_->q.row, bias, y, recipe.options().fprop_split_accumulator);
  be.plan_gemm(fprop_, plan);
}

void ProjectionForward::commit() {
  if (!mode_.fp8 && !states_to_register()) return;
  Backend &be = ctx_.backend();
  st_.input.commit(be, std::move(staged_in_));
  st_.weight.commit(be, std::move(staged_w_));
}

void ProjectionForward::quantize_weight_of(ProjectionForward &later) {
  if (!mode_.fp8) return;
  if (&later == this || later.mode_.recipe != mode_.recipe || later.mode_.group != mode_.group || weight_of_ ||
      later.weight_quantized_elsewhere_)
    fail(Status::Internal,
         "ProjectionForward::quantize_weight_of: expected another step of the same recipe and group, not yet linked");
  weight_of_ = &later;
  later.weight_quantized_elsewhere_ = true;
}

void ProjectionForward::adopt_weight() {
  wc_->recipe_key = mode_.recipe->key();
  wc_->recipe = RecipeRef(mode_.recipe);
  wc_->group_reduced = mode_.group && mode_.group->needs_reduction() && mode_.recipe->kind() == RecipeKind::Current &&
                       mode_.recipe->options().reduce_amax;
  st_.weight_cache = wc_;
}

void ProjectionForward::run() {
  Backend &be = ctx_.backend();
  Autocast &ac = ctx_.autocast();
  if (!mode_.fp8) {
    if (states_to_register()) {
      be.amax(x_, st_.input.amax(), true);
      be.amax(w_, st_.weight.amax(), true);
      ac.register_forward(&st_.input);
      ac.register_forward(&st_.weight);
    }
    be.gemm(fprop_);
    return;
  }
  // The input and the weight(s) in one backend call: at small shapes each launch is the cost.
  QuantizeRequest reqs[3];
  TensorView xs[3];
  QuantizedMatrix *outs[3];
  int n = 0;
  const bool own_weight = !reuse_weight_ && !weight_quantized_elsewhere_;
  ProjectionForward *later = weight_of_ && !weight_of_->reuse_weight_ ? weight_of_ : nullptr;
  if (!external_) reqs[n].state = &st_.input, reqs[n].source = x_source_, xs[n] = x_, outs[n++] = &xq_;
  if (own_weight) reqs[n].state = &st_.weight, xs[n] = w_, outs[n++] = &wc_->q;
  if (later) reqs[n].state = &later->st_.weight, xs[n] = later->w_, outs[n++] = &later->wc_->q;
  for (int i = 0; i < n; ++i) reqs[i].recipe = mode_.recipe, reqs[i].group = mode_.group;
  quantize_many(be, reqs, xs, outs, n);
  if (own_weight) adopt_weight();
  if (later) later->adopt_weight();
  be.gemm(fprop_);
  if (mode_.delayed()) {
    ac.register_forward(&st_.input);
    ac.register_forward(&st_.weight);
  }
}

void ProjectionForward::save(ProjectionSaved *out) {
  out->fp8 = mode_.fp8;
  out->tokens = dims_.tokens;
  if (!mode_.fp8) {
    out->x_hp = x_;
    out->w_hp = w_;
    return;
  }
  // The row-wise x served only the fprop GEMM; backward needs x^T alone (whose per-tensor
  // scale_inv may live in the row-wise scale_inv buffer, which therefore stays).
  xq_.data.reset();
  xq_.row = TensorView();
  out->x = std::move(xq_);
  out->w = std::move(wc_);
}

}  // namespace te
