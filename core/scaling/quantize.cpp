#include "scaling/quantize.h"

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

void plan_quantize(const Backend &be, const QuantizeRequest &req, const TensorView &x, const QuantizedMatrix &out,
                   ScratchPlan *plan) {
  const TensorView *row = out.row.data ? &out.row : nullptr;
  const TensorView *col = out.col.data ? &out.col : nullptr;
  if (req.recipe->kind() == RecipeKind::Block) be.plan_block_quantize(x, plan);
  else be.plan_cast_transpose(x, row, col, plan);
}

void quantize(Backend &be, const QuantizeRequest &req, const TensorView &x, QuantizedMatrix &out) {
  const RecipeOptions &o = req.recipe->options();
  TensorView *row = out.row.data ? &out.row : nullptr;
  TensorView *col = out.col.data ? &out.col : nullptr;
  ScalingState &st = *req.state;
  switch (o.kind) {
    case RecipeKind::Delayed:
      be.cast_transpose(x, req.scale ? req.scale : st.scale(), req.record_amax ? st.amax() : nullptr, row, col);
      break;
    case RecipeKind::Current: {
      be.amax(x, st.amax_scratch(), false);
      if (req.group && o.reduce_amax) req.group->allreduce_max(st.amax_scratch(), 1, be);
      be.scale_from_amax(st.amax_scratch(), st.scale(), st.scale_inv(), fp8_max(st.fp8_dtype()),
                         o.power_of_2_scales, o.amax_epsilon);
      be.cast_transpose(x, st.scale(), nullptr, row, col);
      break;
    }
    case RecipeKind::Block: {
      ScalingMode mode = row ? row->scaling : col->scaling;
      be.block_quantize(x, mode, o.power_of_2_scales, o.amax_epsilon, row, col);
      break;
    }
  }
}

}  // namespace te
