// LayerNormLinear's residuals in the caller's memory (see modules/common/residual_memory.h): the
// norm's statistics and the GEMM's activation residual (FP8: the normalised x^T; high precision:
// the normalised x) move into the caller's block; the backward context stays in the layer's
// records, keyed by the block's address.
#include "modules/common/validate.h"
#include "modules/layernorm_linear/layernorm_linear.h"

namespace te {

void layernorm_linear_record_destroy(void *record) {
  auto *b = static_cast<LayerNormLinearBackwardCtx *>(record);
  layernorm_linear_pools(*b->ctx).backward.release(b);
}

namespace {

size_t stats_bytes(const NormOptions &o, int64_t tokens) {
  const size_t one = buffer_residual_bytes(sizeof(float) * static_cast<size_t>(tokens));
  return o.kind == NormKind::LayerNorm ? 2 * one : one;
}

}  // namespace

size_t layernorm_linear_residual_bytes(Context &ctx, const LayerNormLinear &m, int64_t tokens) {
  const LayerNormLinearOptions &o = m.core()->opts;
  const ForwardMode mode = ForwardMode::of(ctx.autocast());
  const size_t act = mode.fp8 ? col_residual_bytes(scaling_mode_for(*mode.recipe, TensorKind::Activation), tokens,
                                                   o.in_features)
                              : buffer_residual_bytes(static_cast<size_t>(tokens * o.in_features) *
                                                      dtype_size(o.activation_dtype));
  return stats_bytes(o.norm, tokens) + act;
}

void layernorm_linear_forward_compute_into(Context &ctx, LayerNormLinear &m, const LayerNormLinearForwardArgs &args,
                                           const TensorView &y, void *block, size_t bytes) {
  layernorm_linear_validate(ctx, m.core()->opts, args, y, "args");
  const size_t need = layernorm_linear_residual_bytes(ctx, m, args.input.rows());
  check_residual_block(block, bytes, need, "residuals");
  LayerNormLinearPools &pools = layernorm_linear_pools(ctx);
  LayerNormLinearBackwardCtx *b = pools.backward.acquire(ctx);  // may throw: nothing changed yet
  try {
    b->saved = layernorm_linear_forward_compute(ctx, m, args, y);
  } catch (...) {
    pools.backward.release(b);
    throw;
  }
  LayerNormLinearSaved &s = *b->saved;
  Backend &be = ctx.backend();
  try {
    ResidualBlock rb(block, bytes);
    rb.adopt(be, s.norm.mu);
    rb.adopt(be, s.norm.rsigma);
    if (s.proj.fp8) {
      rb.adopt_col(be, s.proj.x);
    } else {
      s.proj.x_hp.data = rb.adopt(be, s.norm.ln_hp);  // the GEMM's residual is the norm's output
    }
    check_residual_count(rb, need, "layernorm_linear");
  } catch (...) {
    pools.backward.release(b);
    throw;
  }
  s.retire();  // no public handle names the residuals or the context kept for them
  b->retire();
  m.records().put(block, b, need);
}

void layernorm_linear_backward_from(Context &ctx, LayerNormLinear &m, const LayerNormLinearForwardArgs *inputs,
                                    const void *block, size_t bytes, const TensorView &dy,
                                    const LayerNormLinearGrads &g, bool once) {
  const LayerNormLinearOptions &o = m.core()->opts;
  if (!block)
    fail(Status::InvalidArgument,
         "argument 'residuals': NULL, but every forward_compute_into of a layernorm_linear leaves residuals");
  auto *b = static_cast<LayerNormLinearBackwardCtx *>(m.records().lookup(block, bytes));
  if (!inputs)
    fail(Status::InvalidArgument, "argument 'inputs': NULL, but the backward reads x and ln_weight (and W) again");
  LayerNormLinearSaved &s = *b->saved;
  const int64_t tokens = s.proj.tokens;
  LayerNormLinearForwardArgs in = *inputs;
  layernorm_linear_validate(ctx, o, in, TensorView(), "inputs");
  if (inputs->input.rows() != tokens)
    fail(Status::InvalidArgument, "argument 'inputs->input': the forward had %lld rows, got %lld", (long long)tokens,
         (long long)inputs->input.rows());
  s.norm.x = make_view(inputs->input.data, o.activation_dtype, ctx.device(), tokens, o.in_features);
  s.norm.gamma = inputs->ln_weight;
  if (!s.proj.fp8) s.proj.w_hp = inputs->weight;
  layernorm_linear_backward(ctx, *b, dy, g, once);
  if (once) m.records().erase(block);
}

}  // namespace te
