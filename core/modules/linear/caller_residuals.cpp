// Residuals in the caller's memory: the forward moves x^T (FP8) into the caller's block and files
// its backward context in the layer's records under the block's address; the backward finds it
// there. High-precision forwards leave nothing: their backward gets x and W again.
#include "modules/common/validate.h"
#include "modules/linear/linear.h"

namespace te {

void linear_record_destroy(void *record) {
  auto *b = static_cast<LinearBackwardCtx *>(record);
  linear_pool(*b->ctx).release(b);
}

size_t linear_residual_bytes(Context &ctx, const Linear &lin, int64_t tokens) {
  const ForwardMode mode = ForwardMode::of(ctx.autocast());
  if (!mode.fp8) return 0;
  return col_residual_bytes(scaling_mode_for(*mode.recipe, TensorKind::Activation), tokens,
                            lin.options().in_features);
}

void linear_forward_compute_into(Context &ctx, Linear &lin, const LinearForwardArgs &args, const TensorView &y,
                                 void *block, size_t bytes) {
  linear_validate_forward(ctx, lin.options(), args, y);
  const size_t need = linear_residual_bytes(ctx, lin, args.input.rows());
  check_residual_block(block, bytes, need, "residuals");
  LinearObjectPool &pool = linear_pool(ctx);
  LinearBackwardCtx *b = need ? pool.acquire_backward_ctx(ctx) : nullptr;  // may throw: nothing changed yet
  SavedPtr saved;
  try {
    linear_forward_compute(ctx, lin, args, y, saved, nullptr, nullptr);
  } catch (...) {
    if (b) pool.release(b);
    throw;
  }
  if (!b) return;  // high precision: nothing to keep
  ResidualBlock(block, bytes).adopt_col(ctx.backend(), saved->proj.x);
  saved->retire();  // no public handle names the residuals or the context kept for them
  b->retire();
  b->saved = std::move(saved);
  lin.records().put(block, b, need);
}

namespace {

// Releases a pooled backward context on scope exit.
struct PooledBackward {
  LinearObjectPool &pool;
  LinearBackwardCtx *b;
  ~PooledBackward() { pool.release(b); }
};

void check_inputs(Context &ctx, const LinearOptions &o, const LinearForwardArgs &in, int64_t tokens) {
  check_tensor(in.input, "inputs->input", o.activation_dtype, ctx.device());
  if (in.input.cols() != o.in_features || in.input.rows() != tokens)
    fail(Status::InvalidArgument, "argument 'inputs->input': expected %lld rows of in_features=%lld, got %lld of %lld",
         (long long)tokens, (long long)o.in_features, (long long)in.input.rows(), (long long)in.input.cols());
  check_weight(in.weight, "inputs->weight", o.out_features, o.in_features, o.activation_dtype, ctx.device());
  // The backward never reads b, so inputs->bias may be NULL (a framework need not save it for
  // the backward); one that is given is checked as the forward checks it.
  if (in.bias.data && !o.bias)
    fail(Status::InvalidArgument, "argument 'inputs->bias': the layer was created without bias, expected NULL");
  if (in.bias.data) check_vector(in.bias, "inputs->bias", o.out_features, o.activation_dtype, ctx.device());
}

}  // namespace

void linear_backward_from(Context &ctx, Linear &lin, const LinearForwardArgs *inputs, const void *block, size_t bytes,
                          const LinearBackwardArgs &args) {
  const LinearOptions &o = lin.options();
  if (block) {
    auto *b = static_cast<LinearBackwardCtx *>(lin.records().lookup(block, bytes));
    const int64_t tokens = b->saved->proj.tokens;
    if (inputs) check_inputs(ctx, o, *inputs, tokens);  // not needed in FP8, but checked when given
    linear_backward(ctx, *b, args);
    if (args.once) lin.records().erase(block);
    return;
  }
  if (bytes) fail(Status::InvalidArgument, "argument 'residuals': NULL with residuals_bytes=%zu", bytes);
  if (!inputs)
    fail(Status::InvalidArgument, "argument 'inputs': NULL, but a high-precision backward (residuals NULL) needs x and W");
  check_inputs(ctx, o, *inputs, args.dy.rows());
  LinearObjectPool &pool = linear_pool(ctx);
  PooledBackward hold{pool, pool.acquire_backward_ctx(ctx)};
  hold.b->saved = pool.acquire_saved(ctx);
  LinearSaved &s = *hold.b->saved;
  s.layer = lin.core();
  s.proj.fp8 = false;
  s.proj.tokens = inputs->input.rows();
  s.proj.x_hp = make_view(inputs->input.data, inputs->input.dtype, inputs->input.device, s.proj.tokens, o.in_features);
  s.proj.w_hp = inputs->weight;
  linear_backward(ctx, *hold.b, args);
}

}  // namespace te
