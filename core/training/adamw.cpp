// te_adamw_step: AdamwArgs for the backend, then the owners' FP8 weight-cache refresh.
#include "training/adamw.h"

#include <climits>
#include <cmath>
#include <memory>
#include <vector>

#include "base/check.h"
#include "scaling/quantize.h"

namespace te {

float adamw_bias_correction(float beta, int64_t step) {
  return static_cast<float>(1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step)));
}

namespace {

// What happens to one owner's cache after the update.
enum class CacheAction {
  Keep,     // no cache: the next FP8 forward casts anyway
  Drop,     // cannot be refreshed exactly here: forget it, the next forward recasts
  InPlace,  // re-quantize into the cache itself (nobody else holds it)
  Replace,  // residuals of earlier forwards hold it: quantize into a new one (copy on write)
};

struct CacheRefresh {
  ProjectionState *state = nullptr;
  CacheAction action = CacheAction::Keep;
  std::shared_ptr<WeightCache> cache;  // the one quantized into
  TensorView w;                        // the new weight as the module sees it, [rows, cols]
  QuantizeRequest req;
};

// Decides the action and, for a refresh, allocates what it needs (the new cache, its scratch
// reserved): nothing changes here.
CacheRefresh plan_refresh(Context &ctx, const AdamwParam &p) {
  CacheRefresh r;
  r.state = p.owner;
  ProjectionState &st = *p.owner;
  if (!st.weight_cache) return r;
  const WeightCache &old = *st.weight_cache;
  const Recipe *recipe = old.recipe.get();
  r.action = CacheAction::Drop;
  // Inside an open autocast scope the refresh's amax would join that scope's pass (and a scale
  // update may come before the next forward): recasting in the forward is the exact behaviour.
  if (ctx.autocast().innermost()) return r;
  if (!recipe || old.group_reduced || old.recipe_key != recipe->key()) return r;
  const DType f8 = recipe->forward_dtype();
  if (recipe->kind() != RecipeKind::Block && (!st.weight.initialized() || st.weight.fp8_dtype() != f8)) return r;
  if (old.q.row.ndim != 2 || old.q.row.shape[0] != p.rows || old.q.row.shape[1] != p.cols || !old.q.col.data) return r;

  Backend &be = ctx.backend();
  const TensorView &src = p.model_weight.data ? p.model_weight : p.param;
  r.w = make_view(src.data, src.dtype, src.device, p.rows, p.cols);
  r.req.recipe = recipe;
  r.req.group = nullptr;  // a single-rank group reduces nothing; multi-rank ones were dropped above
  r.req.state = &st.weight;
  if (st.weight_cache.use_count() > 1) {
    r.action = CacheAction::Replace;
    r.cache = std::make_shared<WeightCache>();
    r.cache->q.allocate(be, scaling_mode_for(*recipe, TensorKind::Weight), f8, p.rows, p.cols, true, true);
    r.cache->recipe = old.recipe;
  } else {
    r.action = CacheAction::InPlace;
    r.cache = st.weight_cache;
  }
  ScratchPlan plan;
  plan_quantize(be, r.req, r.w, r.cache->q, &plan);
  be.reserve(plan);  // the refreshes run one after another: each one's scratch, not their sum
  return r;
}

// The forward's weight quantization (ProjectionForward::run) on the new weight.
void run_refresh(Backend &be, CacheRefresh &r) {
  switch (r.action) {
    case CacheAction::Keep: return;
    case CacheAction::Drop: r.state->weight_cache.reset(); return;
    case CacheAction::InPlace:
    case CacheAction::Replace:
      quantize(be, r.req, r.w, r.cache->q);
      r.cache->recipe_key = r.req.recipe->key();
      r.cache->group_reduced = false;
      r.state->weight_cache = std::move(r.cache);
      return;
  }
}

}  // namespace

void adamw_step(Context &ctx, const AdamwHyper &h, const AdamwParam *params, size_t count) {
  if (count == 0) return;
  if (count > static_cast<size_t>(INT_MAX)) fail(Status::InvalidArgument, "argument 'count': too many parameters (%zu)", count);
  // The weight refresh below casts with the weights' scales, as the next forward would: after
  // the last pass's update, which may still be deferred.
  ctx.autocast().settle();
  Backend &be = ctx.backend();
  std::vector<AdamwTensor> tensors(count);
  AdamwArgs a;
  a.count = static_cast<int>(count);
  for (size_t i = 0; i < count; ++i) {
    const AdamwParam &p = params[i];
    AdamwTensor &t = tensors[i];
    t.param = static_cast<float *>(p.param.data);
    t.grad = p.grad.data;
    t.grad_dtype = p.grad.dtype;
    t.exp_avg = static_cast<float *>(p.exp_avg.data);
    t.exp_avg_sq = static_cast<float *>(p.exp_avg_sq.data);
    t.model_weight = p.model_weight.data;
    t.model_dtype = p.model_weight.data ? p.model_weight.dtype : DType::F32;
    t.numel = p.param.numel();
    t.decay = p.decay;
    const int64_t chunks = adamw_chunks(t.numel);
    if (chunks > INT32_MAX)
      fail(Status::Unsupported, "argument 'params[%zu].param': %lld elements, more than one launch can cover", i,
           (long long)t.numel);
    a.total_chunks += chunks;
  }
  a.tensors = tensors.data();
  a.lr = h.lr;
  a.beta1 = h.beta1;
  a.beta2 = h.beta2;
  a.eps = h.eps;
  a.weight_decay = h.weight_decay;
  a.bias_correction1 = adamw_bias_correction(h.beta1, h.step);
  a.bias_correction2 = adamw_bias_correction(h.beta2, h.step);
  a.lr_wd = h.lr * h.weight_decay;
  a.one_minus_beta1 = 1.0f - h.beta1;
  a.one_minus_beta2 = 1.0f - h.beta2;
  a.max_grad_norm = h.max_grad_norm;
  a.grad_norm = h.grad_norm;

  // Everything that can fail first: the update's scratch, then each owner's refresh.
  ScratchPlan plan;
  be.plan_adamw(a, &plan);
  be.reserve(plan);
  std::vector<CacheRefresh> refreshes;
  for (size_t i = 0; i < count; ++i)
    if (params[i].owner) refreshes.push_back(plan_refresh(ctx, params[i]));

  be.adamw(a);
  for (CacheRefresh &r : refreshes) run_refresh(be, r);
}

}  // namespace te
