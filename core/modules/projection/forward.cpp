#include "modules/projection/projection.h"

#include <algorithm>

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
    fprop_.shape_varies = dims.tokens_vary;
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
  fprop_.shape_varies = dims.tokens_vary;
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

int ProjectionForward::quantize_items(QuantizeRequest *reqs, TensorView *xs, QuantizedMatrix **outs) {
  int n = 0;
  auto add = [&](ScalingState *state, const TensorView &x, QuantizedMatrix *out, const ActivationSource &source) {
    reqs[n] = QuantizeRequest();
    reqs[n].recipe = mode_.recipe;
    reqs[n].group = mode_.group;
    reqs[n].state = state;
    reqs[n].source = source;
    xs[n] = x;
    outs[n++] = out;
  };
  if (!external_) add(&st_.input, x_, &xq_, x_source_);
  if (!reuse_weight_ && !weight_quantized_elsewhere_) add(&st_.weight, w_, &wc_->q, ActivationSource());
  if (weight_of_ && !weight_of_->reuse_weight_)
    add(&weight_of_->st_.weight, weight_of_->w_, &weight_of_->wc_->q, ActivationSource());
  return n;
}

void ProjectionForward::after_quantize() {
  if (!reuse_weight_ && !weight_quantized_elsewhere_) adopt_weight();
  if (weight_of_ && !weight_of_->reuse_weight_) weight_of_->adopt_weight();
}

void ProjectionForward::calibrate() {
  if (!states_to_register()) return;
  Backend &be = ctx_.backend();
  be.amax(x_, st_.input.amax(), true);
  be.amax(w_, st_.weight.amax(), true);
}

void ProjectionForward::register_states() {
  if (!mode_.delayed() || !(mode_.fp8 || mode_.calibrating)) return;
  Autocast &ac = ctx_.autocast();
  ac.register_forward(&st_.input);
  ac.register_forward(&st_.weight);
}

void ProjectionForward::run() {
  Backend &be = ctx_.backend();
  if (mode_.fp8) {
    // The input and the weight(s) in one backend call: at small shapes each launch is the cost.
    QuantizeBatch<kMaxQuantizeItems> batch(be);
    batch.add(kMaxQuantizeItems, [&](auto *reqs, auto *xs, auto *outs) { return quantize_items(reqs, xs, outs); });
    batch.flush();
    after_quantize();
  } else {
    calibrate();
  }
  be.gemm(fprop_);
  register_states();
}

void ProjectionForward::run_all(ProjectionForward *const *steps, int n) {
  if (n < 1) return;
  Backend &be = steps[0]->ctx_.backend();
  // Quantizations, up to kBatch items per backend call (a step's items stay in one call).
  constexpr int kBatch = 8;
  static_assert(kBatch >= kMaxQuantizeItems, "a step's items fit one call");
  QuantizeBatch<kBatch> batch(be);
  for (int i = 0; i < n; ++i) {
    ProjectionForward &s = *steps[i];
    if (!s.mode_.fp8) {
      s.calibrate();
      continue;
    }
    batch.add(kMaxQuantizeItems, [&](auto *reqs, auto *xs, auto *outs) { return s.quantize_items(reqs, xs, outs); });
  }
  batch.flush();
  for (int i = 0; i < n; ++i)
    if (steps[i]->mode_.fp8) steps[i]->after_quantize();
  GemmArgs gemms[kProjectionGemmBatch];
  for (int first = 0; first < n; first += kProjectionGemmBatch) {
    const int m = std::min(kProjectionGemmBatch, n - first);
    for (int i = 0; i < m; ++i) gemms[i] = steps[first + i]->fprop_;
    be.gemm_many(gemms, m);
  }
  for (int i = 0; i < n; ++i) steps[i]->register_states();
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
