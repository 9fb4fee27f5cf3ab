// GroupedLinear's residuals in the caller's memory (see modules/common/residual_memory.h): under
// FP8 every expert's x^T (of its zero-padded rows) moves into the caller's block and the backward
// context stays in the layer's records, keyed by the block's address. High-precision forwards
// leave nothing: their backward gets x and the W_i again.
#include "modules/common/validate.h"
#include "modules/grouped_linear/grouped_linear.h"

namespace te {

void grouped_linear_record_destroy(void *record) {
  auto *b = static_cast<GroupedLinearBackwardCtx *>(record);
  grouped_linear_pools(*b->ctx).backward.release(b);
}

size_t grouped_linear_residual_bytes(Context &ctx, const GroupedLinear &g, const int64_t *splits) {
  const GroupedLinearOptions &o = g.options();
  const ForwardMode mode = ForwardMode::of(ctx.autocast());
  if (!mode.fp8) return 0;
  const ScalingMode sm = scaling_mode_for(*mode.recipe, TensorKind::Activation);
  size_t n = 0;
  for (int i = 0; i < o.num_gemms; ++i)
    if (splits[i] > 0) n += col_residual_bytes(sm, (splits[i] + 15) / 16 * 16, o.in_features);
  return n;
}

void grouped_linear_forward_compute_into(Context &ctx, GroupedLinear &g, const GroupedLinearForwardArgs &args,
                                         const TensorView &y, void *block, size_t bytes) {
  grouped_linear_validate(ctx, g.options(), args, y, "args");
  const size_t need = grouped_linear_residual_bytes(ctx, g, args.m_splits);
  check_residual_block(block, bytes, need, "residuals");
  GroupedLinearPools &pools = grouped_linear_pools(ctx);
  if (!need) {  // high precision: nothing to keep
    pools.saved.release(grouped_linear_forward_compute(ctx, g, args, y));
    return;
  }
  GroupedLinearBackwardCtx *b = pools.backward.acquire(ctx);  // may throw: nothing changed yet
  try {
    b->saved = grouped_linear_forward_compute(ctx, g, args, y);
    Backend &be = ctx.backend();
    ResidualBlock rb(block, bytes);
    for (ProjectionSaved &e : b->saved->experts)
      if (e.tokens > 0) rb.adopt_col(be, e.x);
    check_residual_count(rb, need, "grouped_linear");
  } catch (...) {
    pools.backward.release(b);
    throw;
  }
  b->saved->retire();  // no public handle names the residuals or the context kept for them
  b->retire();
  g.records().put(block, b, need);
}

namespace {

// Releases a pooled backward context on scope exit.
struct PooledBackward {
  GroupedLinearPools &pools;
  GroupedLinearBackwardCtx *b;
  ~PooledBackward() { pools.backward.release(b); }
};

void check_inputs(Context &ctx, const GroupedLinearOptions &o, const GroupedLinearForwardArgs &in,
                  const GroupedLinearSaved *s) {
  grouped_linear_validate(ctx, o, in, TensorView(), "inputs");
  if (!s) return;
  if (in.input.rows() != s->tokens)
    fail(Status::InvalidArgument, "argument 'inputs->input': the forward had %lld rows, got %lld",
         (long long)s->tokens, (long long)in.input.rows());
  for (int i = 0; i < o.num_gemms; ++i)
    if (in.m_splits[i] != s->splits[static_cast<size_t>(i)])
      fail(Status::InvalidArgument, "argument 'inputs->m_splits[%d]': the forward had %lld, got %lld", i,
           (long long)s->splits[static_cast<size_t>(i)], (long long)in.m_splits[i]);
}

}  // namespace

void grouped_linear_backward_from(Context &ctx, GroupedLinear &g, const GroupedLinearForwardArgs *inputs,
                                  const void *block, size_t bytes, const GroupedLinearBackwardArgs &args) {
  const GroupedLinearOptions &o = g.options();
  if (block) {
    auto *b = static_cast<GroupedLinearBackwardCtx *>(g.records().lookup(block, bytes));
    if (inputs) check_inputs(ctx, o, *inputs, b->saved);  // not needed in FP8, but checked when given
    grouped_linear_backward(ctx, *b, args);
    if (args.once) g.records().erase(block);
    return;
  }
  if (bytes) fail(Status::InvalidArgument, "argument 'residuals': NULL with residuals_bytes=%zu", bytes);
  if (!inputs)
    fail(Status::InvalidArgument,
         "argument 'inputs': NULL, but a high-precision backward (residuals NULL) needs x, m_splits and the weights");
  check_inputs(ctx, o, *inputs, nullptr);
  const int n = o.num_gemms;
  const int64_t tokens = inputs->input.rows();
  const TensorView x2d = make_view(inputs->input.data, o.activation_dtype, ctx.device(), tokens, o.in_features);
  GroupedLinearPools &pools = grouped_linear_pools(ctx);
  PooledBackward hold{pools, pools.backward.acquire(ctx)};
  GroupedLinearSaved *s = pools.saved.acquire(ctx);
  hold.b->saved = s;  // released with the context
  s->layer = g.core();
  s->fp8 = false;
  s->tokens = tokens;
  s->splits.assign(inputs->m_splits, inputs->m_splits + n);
  s->experts.resize(static_cast<size_t>(n));
  int64_t row0 = 0;
  for (int i = 0; i < n; ++i) {
    ProjectionSaved &e = s->experts[static_cast<size_t>(i)];
    e.tokens = inputs->m_splits[i];
    if (e.tokens > 0) {
      e.x_hp = row_block(x2d, row0, e.tokens);
      e.w_hp = inputs->weights[i];
    }
    row0 += e.tokens;
  }
  grouped_linear_backward(ctx, *hold.b, args);
}

}  // namespace te
