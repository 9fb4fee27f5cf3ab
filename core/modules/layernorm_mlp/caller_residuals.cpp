// LayerNormMLP's residuals in the caller's memory (see modules/common/residual_memory.h): the
// norm's statistics, fc1's output, and the GEMMs' activation residuals (FP8: fc1's and fc2's
// x^T; high precision: the normalised x and the activation's output) move into the caller's
// block; the backward context stays in the module's records, keyed by the block's address.
#include "modules/common/validate.h"
#include "modules/layernorm_mlp/layernorm_mlp.h"

namespace te {

void layernorm_mlp_record_destroy(void *record) {
  auto *b = static_cast<LayerNormMlpBackwardCtx *>(record);
  layernorm_mlp_pools(*b->ctx).backward.release(b);
}

size_t layernorm_mlp_residual_bytes(Context &ctx, const LayerNormMlp &m, int64_t tokens) {
  const LayerNormMlpOptions &o = m.core()->opts;
  const ForwardMode mode = ForwardMode::of(ctx.autocast());
  const size_t es = dtype_size(o.activation_dtype);
  const size_t t = static_cast<size_t>(tokens);
  const size_t stat = buffer_residual_bytes(sizeof(float) * t);
  size_t n = (o.norm.kind == NormKind::LayerNorm ? 2 * stat : stat) +
             buffer_residual_bytes(t * static_cast<size_t>(o.fc1_out()) * es);
  if (mode.fp8) {
    const ScalingMode sm = scaling_mode_for(*mode.recipe, TensorKind::Activation);
    n += col_residual_bytes(sm, tokens, o.hidden) + col_residual_bytes(sm, tokens, o.ffn);
  } else {
    n += buffer_residual_bytes(t * static_cast<size_t>(o.hidden) * es) +
         buffer_residual_bytes(t * static_cast<size_t>(o.ffn) * es);
  }
  return n;
}

void layernorm_mlp_forward_compute_into(Context &ctx, LayerNormMlp &m, const LayerNormMlpForwardArgs &args,
                                        const TensorView &y, void *block, size_t bytes) {
  layernorm_mlp_validate(ctx, m.core()->opts, args, y, "args");
  const size_t need = layernorm_mlp_residual_bytes(ctx, m, args.input.rows());
  check_residual_block(block, bytes, need, "residuals");
  LayerNormMlpPools &pools = layernorm_mlp_pools(ctx);
  LayerNormMlpBackwardCtx *b = pools.backward.acquire(ctx);  // may throw: nothing changed yet
  try {
    b->saved = layernorm_mlp_forward_compute(ctx, m, args, y);
    LayerNormMlpSaved &s = *b->saved;
    Backend &be = ctx.backend();
    ResidualBlock rb(block, bytes);
    rb.adopt(be, s.norm.mu);
    rb.adopt(be, s.norm.rsigma);
    rb.adopt(be, s.fc1_out);
    if (s.fc1.fp8) {
      rb.adopt_col(be, s.fc1.x);
      rb.adopt_col(be, s.fc2.x);
    } else {
      s.fc1.x_hp.data = rb.adopt(be, s.norm.ln_hp);  // fc1's residual is the norm's output
      s.fc2.x_hp.data = rb.adopt(be, s.act_out);     // fc2's the activation's
    }
    check_residual_count(rb, need, "layernorm_mlp");
  } catch (...) {
    pools.backward.release(b);
    throw;
  }
  b->saved->retire();  // no public handle names the residuals or the context kept for them
  b->retire();
  m.records().put(block, b, need);
}

void layernorm_mlp_backward_from(Context &ctx, LayerNormMlp &m, const LayerNormMlpForwardArgs *inputs,
                                 const void *block, size_t bytes, const TensorView &dy, const LayerNormMlpGrads &g,
                                 bool once) {
  const LayerNormMlpOptions &o = m.core()->opts;
  if (!block)
    fail(Status::InvalidArgument,
         "argument 'residuals': NULL, but every forward_compute_into of a layernorm_mlp leaves residuals");
  auto *b = static_cast<LayerNormMlpBackwardCtx *>(m.records().lookup(block, bytes));
  if (!inputs)
    fail(Status::InvalidArgument, "argument 'inputs': NULL, but the backward reads x and ln_weight (and W) again");
  LayerNormMlpSaved &s = *b->saved;
  const int64_t tokens = s.fc1.tokens;
  LayerNormMlpForwardArgs in = *inputs;
  layernorm_mlp_validate(ctx, o, in, TensorView(), "inputs");
  if (in.input.rows() != tokens)
    fail(Status::InvalidArgument, "argument 'inputs->input': the forward had %lld rows, got %lld", (long long)tokens,
         (long long)in.input.rows());
  s.norm.x = make_view(in.input.data, o.activation_dtype, ctx.device(), tokens, o.hidden);
  s.norm.gamma = in.ln_weight;
  if (!s.fc1.fp8) {
    s.fc1.w_hp = in.fc1_weight;
    s.fc2.w_hp = in.fc2_weight;
  }
  layernorm_mlp_backward(ctx, *b, dy, g, once);
  if (once) m.records().erase(block);
}

}  // namespace te
