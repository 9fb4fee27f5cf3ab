// Attention's residuals in the caller's memory (modules/common/residual_memory.h): the rows'
// log-sum-exp and, under FP8, the E4M3 Q, K and V with their scale_inv move into the caller's
// block; the backward context stays in the module's records, keyed by the block's address.
#include "modules/attention/attention.h"
#include "modules/common/validate.h"

namespace te {

void attention_record_destroy(void *record) {
  auto *b = static_cast<AttentionBackwardCtx *>(record);
  attention_pools(*b->ctx).backward.release(b);
}

namespace {

size_t row_bytes(int64_t rows, int64_t cols) {
  return buffer_residual_bytes(static_cast<size_t>(rows * cols)) + buffer_residual_bytes(sizeof(float));
}

// Moves q's row-wise codes and scale_inv into the block.
void adopt_row(ResidualBlock &rb, Backend &be, QuantizedMatrix &q, TensorView *view) {
  q.row.data = rb.adopt(be, q.data);
  q.row.scale_inv = static_cast<float *>(rb.adopt(be, q.scale_inv));
  *view = q.row;
}

}  // namespace

size_t attention_residual_bytes(Context &ctx, const Attention &m, const AttentionDims &d) {
  const ForwardMode mode = ForwardMode::of(ctx.autocast());
  size_t bytes = buffer_residual_bytes(sizeof(float) * static_cast<size_t>(d.tokens_q * d.heads));
  if (m.core()->opts.fp8 && mode.fp8) {
    bytes += row_bytes(d.tokens_q * d.heads, d.head_dim);
    bytes += 2 * row_bytes(d.tokens_kv * d.kv_heads, d.head_dim);
  }
  return bytes;
}

void attention_forward_compute_into(Context &ctx, Attention &m, const AttentionInputs &in, const TensorView &o,
                                    void *block, size_t bytes) {
  const AttentionDims dims = attention_validate(ctx, m.core()->opts, in, o, "args");
  const size_t need = attention_residual_bytes(ctx, m, dims);
  check_residual_block(block, bytes, need, "residuals");
  AttentionPools &pools = attention_pools(ctx);
  AttentionBackwardCtx *b = pools.backward.acquire(ctx);  // may throw: nothing changed yet
  try {
    b->saved = attention_forward_compute(ctx, m, in, o);
  } catch (...) {
    pools.backward.release(b);
    throw;
  }
  AttentionSaved &s = *b->saved;
  Backend &be = ctx.backend();
  try {
    ResidualBlock rb(block, bytes);
    rb.adopt(be, s.lse);
    if (s.fp8) {
      adopt_row(rb, be, s.q8, &s.q);
      adopt_row(rb, be, s.k8, &s.k);
      adopt_row(rb, be, s.v8, &s.v);
    }
    check_residual_count(rb, need, "attention");
  } catch (...) {
    pools.backward.release(b);
    throw;
  }
  s.retire();
  b->retire();
  m.records().put(block, b, need);
}

void attention_backward_from(Context &ctx, Attention &m, const AttentionInputs &in, const TensorView &o,
                             const void *block, size_t bytes, const TensorView &d_o, const AttentionGrads &g,
                             bool once) {
  if (!block)
    fail(Status::InvalidArgument,
         "argument 'residuals': NULL, but every forward_compute_into of an attention leaves residuals");
  auto *b = static_cast<AttentionBackwardCtx *>(m.records().lookup(block, bytes));
  AttentionSaved &s = *b->saved;
  if (!o.data) fail(Status::InvalidArgument, "argument 'o': expected the forward's output, got NULL");
  const AttentionDims d = attention_validate(ctx, m.core()->opts, in, o, "inputs");
  if (d.batch != s.dims.batch || d.tokens_q != s.dims.tokens_q || d.tokens_kv != s.dims.tokens_kv ||
      d.max_seq_q != s.dims.max_seq_q || d.max_seq_kv != s.dims.max_seq_kv || d.varlen() != s.dims.varlen())
    fail(Status::InvalidArgument, "argument 'inputs': shapes or sequence bounds differ from the forward's");
  s.dims.cu_seqlens_q = d.cu_seqlens_q;
  s.dims.cu_seqlens_kv = d.cu_seqlens_kv;
  s.o = o;
  if (!s.fp8) {
    s.q = in.q;
    s.k = in.k;
    s.v = in.v;
  }
  attention_backward(ctx, *b, d_o, g, once);
  if (once) m.records().erase(block);
}

}  // namespace te
