#include "scaling/quantize.h"

#include "base/check.h"

namespace te {

ScalingMode scaling_mode_for(const Recipe &recipe, TensorKind kind) {
  if (recipe.kind() != RecipeKind::Block) return ScalingMode::PerTensor;
  return kind == TensorKind::Weight ? ScalingMode::Block128x128 : ScalingMode::Block1x128;
}

void QuantizedMatrix::allocate(Backend &be, ScalingMode mode, DType dtype, int64_t rows, int64_t cols,
                               bool want_row, bool want_col) {
  QuantizedMatrix q;
  size_t bytes = static_cast<size_t>(rows * cols);
  if (want_row) {
    q.data = Buffer(&be, bytes);
    q.scale_inv = Buffer(&be, sizeof(float) * static_cast<size_t>(scale_inv_count(mode, rows, cols)));
    q.row = make_view(q.data.get(), dtype, be.device(), rows, cols);
    q.row.scale_inv = q.scale_inv.floats();
    q.row.scaling = mode;
  }
  if (want_col) {
    q.data_t = Buffer(&be, bytes);
    q.col = make_view(q.data_t.get(), dtype, be.device(), cols, rows);
    if (mode == ScalingMode::PerTensor && want_row) {
      q.col.scale_inv = q.scale_inv.floats();  // one scale serves both copies
    } else {
      q.scale_inv_t = Buffer(&be, sizeof(float) * static_cast<size_t>(scale_inv_count(mode, cols, rows)));
      q.col.scale_inv = q.scale_inv_t.floats();
    }
    q.col.scaling = mode;
  }
  *this = std::move(q);
}

namespace {

// The backend's kind of quantization for a recipe (Backend::fuses_activation_cast asks by it).
QuantizeItem::Kind quantize_kind(const Recipe &r) {
  switch (r.kind()) {
    case RecipeKind::Delayed: return QuantizeItem::Kind::Delayed;
    case RecipeKind::Current: return QuantizeItem::Kind::Current;
    case RecipeKind::Block: break;
  }
  return QuantizeItem::Kind::Block;
}

}  // namespace

bool activation_in_cast(const Backend &be, const Recipe &recipe, const Group *group) {
  if (recipe.kind() == RecipeKind::Current && group && recipe.options().reduce_amax) return false;
  return be.fuses_activation_cast(quantize_kind(recipe));
}

void plan_quantize(const Backend &be, const QuantizeRequest &req, const TensorView &x, const QuantizedMatrix &out,
                   ScratchPlan *plan) {
  const TensorView *row = out.row.data ? &out.row : nullptr;
  const TensorView *col = out.col.data ? &out.col : nullptr;
  if (req.source.active()) be.plan_quantize_source(quantize_kind(*req.recipe), x, plan);
  if (req.recipe->kind() == RecipeKind::Block) be.plan_block_quantize(x, plan);
  else be.plan_cast_transpose(x, row, col, plan);
}

namespace {

// The backend item for one request; false when it must run alone (a group reduction between
// its amax and its cast).
bool to_item(const QuantizeRequest &req, const TensorView &x, QuantizedMatrix &out, QuantizeItem *item) {
  const RecipeOptions &o = req.recipe->options();
  ScalingState &st = *req.state;
  QuantizeItem q;
  q.x = x;
  q.out = out.row.data ? &out.row : nullptr;
  q.out_t = out.col.data ? &out.col : nullptr;
  q.power_of_2 = o.power_of_2_scales;
  q.epsilon = o.amax_epsilon;
  q.dbias = req.dbias;
  q.source = req.source;
  switch (o.kind) {
    case RecipeKind::Delayed:
      q.kind = QuantizeItem::Kind::Delayed;
      q.scale = req.scale ? req.scale : st.scale();
      q.amax_accum = req.record_amax ? st.amax() : nullptr;
      q.scale_copy = req.scale_copy;
      break;
    case RecipeKind::Current:
      if (req.group && o.reduce_amax) return false;
      q.kind = QuantizeItem::Kind::Current;
      q.amax_out = st.amax_scratch();
      q.scale_out = st.scale();
      q.scale_inv_out = st.scale_inv();
      q.fp8_max = fp8_max(st.fp8_dtype());
      break;
    case RecipeKind::Block:
      q.kind = QuantizeItem::Kind::Block;
      q.block_mode = q.out ? q.out->scaling : q.out_t->scaling;
      break;
  }
  *item = q;
  return true;
}

}  // namespace

void quantize_many(Backend &be, const QuantizeRequest *reqs, const TensorView *xs, QuantizedMatrix *const *outs,
                   int n) {
  constexpr int kMax = 8;
  QuantizeItem items[kMax];
  bool together = n <= kMax;
  for (int i = 0; together && i < n; ++i) together = to_item(reqs[i], xs[i], *outs[i], &items[i]);
  if (together) {
    be.quantize_many(items, n);
    return;
  }
  for (int i = 0; i < n; ++i) quantize(be, reqs[i], xs[i], *outs[i]);
}

void quantize(Backend &be, const QuantizeRequest &req, const TensorView &x, QuantizedMatrix &out) {
  QuantizeItem item;
  if (to_item(req, x, out, &item)) {
    be.quantize_many(&item, 1);
    return;
  }
  // Current scaling with its amax all-reduced over a group between the amax and the cast.
  if (req.source.active())
    fail(Status::Internal, "quantize: an activation source with a group-reduced current scaling");
  const RecipeOptions &o = req.recipe->options();
  ScalingState &st = *req.state;
  be.amax(x, st.amax_scratch(), false);
  req.group->allreduce_max(st.amax_scratch(), 1, be);
  be.scale_from_amax(st.amax_scratch(), st.scale(), st.scale_inv(), fp8_max(st.fp8_dtype()), o.power_of_2_scales,
                     o.amax_epsilon);
  be.cast_transpose(x, st.scale(), nullptr, out.row.data ? &out.row : nullptr, out.col.data ? &out.col : nullptr);
  if (req.dbias.data) be.bias_grad(x, req.dbias);
}

}  // namespace te
