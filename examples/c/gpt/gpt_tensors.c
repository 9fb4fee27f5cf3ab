/* gpt_tensors.c: tensor views of the GPT model's buffers and its device allocation (see
 * gpt_internal.h). */
#include "gpt_internal.h"

#include <string.h>

size_t gpt_dtype_size(te_dtype dt) {
  switch (dt) {
  case TE_DTYPE_F32:
  case TE_DTYPE_I32: return 4;
  case TE_DTYPE_F16:
  case TE_DTYPE_BF16: return 2;
  default: return 1;
  }
}

te_tensor gpt_tensor_nd(const gpt *m, void *data, te_dtype dt, int ndim, const int64_t *shape) {
  te_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dt;
  t.ndim = ndim;
  for (int i = 0; i < ndim; ++i) t.shape[i] = shape[i];
  t.device = m->device;
  return t;
}

te_tensor gpt_mat(const gpt *m, void *data, te_dtype dt, int64_t rows, int64_t cols) {
  int64_t s[2] = {rows, cols};
  return gpt_tensor_nd(m, data, dt, 2, s);
}

te_tensor gpt_vec(const gpt *m, void *data, te_dtype dt, int64_t n) {
  return gpt_tensor_nd(m, data, dt, 1, &n);
}

/* An activation [N, cols] in the activation dtype. */
te_tensor gpt_act(const gpt *m, void *data, int64_t cols) {
  return gpt_mat(m, data, m->cfg.act_dtype, m->n_tokens, cols);
}

/* q, k, v and their gradients as attention and RoPE see them: BSHD. */
te_tensor gpt_bshd(const gpt *m, void *data) {
  int64_t s[4] = {m->cfg.batch, m->cfg.seq_len, m->cfg.n_heads, m->head_dim};
  return gpt_tensor_nd(m, data, m->cfg.act_dtype, 4, s);
}

int gpt_dev_alloc(gpt *m, size_t bytes, void **out) {
  TRY(te_context_malloc(m->ctx, bytes, out));
  return 0;
}
