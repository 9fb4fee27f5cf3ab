/*
 * gpt_step.c: the GPT model's training step and evaluation: the forward up to the logits, the
 * loss, the backward, and AdamW (gpt_step). A step allocates nothing and talks to the host
 * twice (the batch up, the loss back); see gpt_model.h.
 */
#include "gpt_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- forward --------------------------------------------------------------------------------- */

/* The whole forward up to the logits, every module writing its residuals into the model's
 * residual memory (what a following backward reads; an evaluation just overwrites them). The
 * FP8 scope (enabled = cfg.fp8) covers the blocks; the final norm and the head run in a
 * nested scope with enabled = 0. */
static int forward_logits(gpt *m) {
  const gpt_config *c = &m->cfg;
  /* 1 only on the first forward after gpt_step: AdamW has just refreshed the FP8 caches. */
  const int unchanged = c->fp8 && m->weight_cache_ok;
  te_tensor tokens = gpt_vec(m, m->tokens, TE_DTYPE_I32, m->n_tokens);
  te_tensor freqs = gpt_mat(m, m->freqs, TE_DTYPE_F32, c->seq_len, m->head_dim / 2);

  te_autocast_options fp8_scope, hp_scope;
  TRY(te_autocast_options_init(&fp8_scope));
  fp8_scope.enabled = c->fp8;
  fp8_scope.recipe = m->recipe;
  TRY(te_autocast_options_init(&hp_scope));
  hp_scope.enabled = 0;
  te_autocast_token outer, inner;
  TRY(te_autocast_begin(m->ctx, &fp8_scope, &outer));

  /* From here on a failure must still close the scope: collect the status, do not return. */
  int rc = 0;
#define STEP(call)                                                                                 \
  do {                                                                                             \
    if (rc == 0) {                                                                                 \
      te_status step_status_;                                                                      \
      PROFILED(m, call, step_status_);                                                             \
      if (step_status_ != TE_SUCCESS) {                                                            \
        fprintf(stderr, "gpt: %s failed: %s: %s\n", #call, te_status_string(step_status_),        \
                te_last_error());                                                                  \
        rc = 1;                                                                                    \
      }                                                                                            \
    }                                                                                              \
  } while (0)

  STEP(te_embedding_forward(m->ctx, W(m->wte), &tokens, &m->blocks[0].t_x));
  for (int l = 0; l < c->n_layers && rc == 0; ++l) {
    gpt_block *b = &m->blocks[l];
    b->la.weight_unchanged = unchanged;
    b->pa.weight_unchanged = unchanged;
    b->ma.weight_unchanged = unchanged;
    STEP(te_layernorm_linear_forward_compute_into(m->ctx, b->qkv, &b->la, &b->t_qkv, b->r_qkv,
                                                  b->n_qkv));
    te_tensor *parts[3] = {&b->t_q2, &b->t_k2, &b->t_v2};
    STEP(te_split_columns(m->ctx, &b->t_qkv, parts, 3));
    STEP(te_rope_forward(m->ctx, NULL, &b->t_q, &freqs, NULL, &b->t_q)); /* in place */
    STEP(te_rope_forward(m->ctx, NULL, &b->t_k, &freqs, NULL, &b->t_k));
    STEP(te_attention_forward_compute_into(m->ctx, b->attn, &b->aa, &b->t_o, b->r_attn,
                                           b->n_attn));
    STEP(te_linear_forward_compute_into(m->ctx, b->proj, &b->pa, &m->t_tmp, b->r_proj, b->n_proj));
    STEP(te_add(m->ctx, &b->t_x, &m->t_tmp, &b->t_mid));
    STEP(te_layernorm_mlp_forward_compute_into(m->ctx, b->mlp, &b->ma, &m->t_tmp, b->r_mlp,
                                               b->n_mlp));
    STEP(te_add(m->ctx, &b->t_mid, &m->t_tmp, &b->t_next));
  }

  /* The final norm and the LM head in high precision: a nested scope with enabled = 0. */
  int inner_open = 0;
  if (rc == 0) {
    STEP(te_autocast_begin(m->ctx, &hp_scope, &inner));
    inner_open = rc == 0;
  }
  te_tensor xf = gpt_act(m, m->x_final, c->d_model);
  te_tensor mu = gpt_vec(m, m->mu, TE_DTYPE_F32, m->n_tokens);
  te_tensor rs = gpt_vec(m, m->rsigma, TE_DTYPE_F32, m->n_tokens);
  te_norm_forward_args na;
  STEP(te_norm_forward_args_init(&na));
  na.input = &xf;
  na.weight = W(m->lnf_g);
  na.bias = W(m->lnf_b);
  na.output = &m->t_h;
  na.mu = &mu;
  na.rsigma = &rs;
  STEP(te_norm_forward(m->ctx, NULL, &na));
  STEP(te_linear_forward_compute_into(m->ctx, m->head, &m->ha, &m->t_logits, m->r_head,
                                      m->n_head));
  if (inner_open) STEP(te_autocast_end(m->ctx, inner));
  /* Closing the outer scope updates the forward scales (one fused update per bucket). */
  te_status end = te_autocast_end(m->ctx, outer);
  if (end != TE_SUCCESS && rc == 0) {
    fprintf(stderr, "gpt: te_autocast_end failed: %s: %s\n", te_status_string(end),
            te_last_error());
    rc = 1;
  }
#undef STEP
  /* Any forward ends the "caches hold the current weights" guarantee: its scope end may have
   * moved the weight scales, and a resumed run (which re-quantizes) must see the same. */
  m->weight_cache_ok = 0;
  return rc;
}

static int upload_batch(gpt *m, const int32_t *tokens, const int32_t *targets) {
  /* One host-to-device copy per batch. It completes before returning, so it waits for what is
   * still queued: at most the previous step's AdamW, the stream having drained at that step's
   * loss read-back; the GPU is never left without work it could have had. */
  const size_t n = (size_t)m->n_tokens;
  memcpy(m->host_batch, tokens, n * sizeof(int32_t));
  memcpy(m->host_batch + n, targets, n * sizeof(int32_t));
  TRY(te_context_copy(m->ctx, m->tokens, m->host_batch, 2 * n * sizeof(int32_t),
                      TE_COPY_HOST_TO_DEVICE));
  return 0;
}

static int read_loss(gpt *m, float *loss) {
  TRY(te_context_copy(m->ctx, loss, m->loss, sizeof(float), TE_COPY_DEVICE_TO_HOST));
  return 0;
}

/* ---- backward -------------------------------------------------------------------------------- */

static int backward(gpt *m) {
  const gpt_config *c = &m->cfg;
  const int64_t d = c->d_model;
  te_linear_backward_args once;
  TRY(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE; /* drops each module's record of the forward */

  te_tensor dh = gpt_act(m, m->dtmp, d), dres = gpt_act(m, m->dres, d), dmid = gpt_act(m, m->dmid, d);
  te_tensor dtmp = gpt_act(m, m->dtmp, d);
  te_tensor xf = gpt_act(m, m->x_final, d);
  te_tensor mu = gpt_vec(m, m->mu, TE_DTYPE_F32, m->n_tokens);
  te_tensor rs = gpt_vec(m, m->rsigma, TE_DTYPE_F32, m->n_tokens);

  /* head (dlogits are in the logits' buffer): dW, and dh the gradient of the final norm's output */
  STEP_TRY(m, te_linear_backward_from(m->ctx, m->head, &m->ha, m->r_head, m->n_head, &m->t_logits, &dh,
                              &m->params[m->w_head].grad, NULL, &once));
  STEP_TRY(m, te_norm_backward(m->ctx, NULL, &dh, &xf, W(m->lnf_g), &mu, &rs, &dres,
                       &m->params[m->lnf_g].grad, &m->params[m->lnf_b].grad));

  te_tensor freqs = gpt_mat(m, m->freqs, TE_DTYPE_F32, c->seq_len, m->head_dim / 2);
  te_tensor dob = gpt_bshd(m, m->dtmp), dq = gpt_bshd(m, m->dq), dk = gpt_bshd(m, m->dk), dv = gpt_bshd(m, m->dv);
  te_tensor dq2 = gpt_act(m, m->dq, d), dk2 = gpt_act(m, m->dk, d), dv2 = gpt_act(m, m->dv, d);
  te_tensor dqkv = gpt_act(m, m->dqkv, 3 * d);
  for (int l = c->n_layers - 1; l >= 0; --l) {
    gpt_block *b = &m->blocks[l];
    /* MLP: x_next = x_mid + mlp(x_mid) */
    te_layernorm_mlp_grads mg;
    TRY(te_layernorm_mlp_grads_init(&mg));
    mg.dx = &dtmp;
    mg.dln_weight = &m->params[b->ln2_g].grad;
    mg.dln_bias = &m->params[b->ln2_b].grad;
    mg.dfc1_weight = &m->params[b->fc1_w].grad;
    mg.dfc1_bias = &m->params[b->fc1_b].grad;
    mg.dfc2_weight = &m->params[b->fc2_w].grad;
    mg.dfc2_bias = &m->params[b->fc2_b].grad;
    STEP_TRY(m, te_layernorm_mlp_backward_from(m->ctx, b->mlp, &b->ma, b->r_mlp, b->n_mlp, &dres, &mg,
                                       &once));
    STEP_TRY(m, te_add(m->ctx, &dres, &dtmp, &dmid));

    /* attention: x_mid = x + proj(attn(rope(q), rope(k), v)); proj's dx lands in dtmp */
    STEP_TRY(m, te_linear_backward_from(m->ctx, b->proj, &b->pa, b->r_proj, b->n_proj, &dmid, &dtmp,
                                &m->params[b->w_proj].grad, &m->params[b->b_proj].grad, &once));
    te_attention_grads ag;
    TRY(te_attention_grads_init(&ag));
    ag.dq = &dq;
    ag.dk = &dk;
    ag.dv = &dv;
    STEP_TRY(m, te_attention_backward_from(m->ctx, b->attn, &b->aa, &b->t_o, b->r_attn, b->n_attn, &dob,
                                   &ag, &once));
    STEP_TRY(m, te_rope_backward(m->ctx, NULL, &dq, &freqs, NULL, &dq)); /* the inverse rotation */
    STEP_TRY(m, te_rope_backward(m->ctx, NULL, &dk, &freqs, NULL, &dk));
    const te_tensor *parts[3] = {&dq2, &dk2, &dv2};
    STEP_TRY(m, te_concat_columns(m->ctx, parts, 3, &dqkv));

    te_layernorm_linear_grads lg;
    TRY(te_layernorm_linear_grads_init(&lg));
    lg.dx = &dtmp;
    lg.dln_weight = &m->params[b->ln1_g].grad;
    lg.dln_bias = &m->params[b->ln1_b].grad;
    lg.dw = &m->params[b->w_qkv].grad;
    lg.db = &m->params[b->b_qkv].grad;
    /* Block 0's QKV is the pass's first FP8 module: its backward updates the gradient scales. */
    STEP_TRY(m, te_layernorm_linear_backward_from(m->ctx, b->qkv, &b->la, b->r_qkv, b->n_qkv, &dqkv, &lg,
                                          &once));
    STEP_TRY(m, te_add(m->ctx, &dmid, &dtmp, &dres));
  }

  te_tensor tokens = gpt_vec(m, m->tokens, TE_DTYPE_I32, m->n_tokens);
  STEP_TRY(m, te_embedding_backward(m->ctx, &tokens, &dres, &m->params[m->wte].grad, 0));
  return 0;
}

static int loss_and_grad(gpt *m, int with_grad) {
  te_tensor targets = gpt_vec(m, m->targets, TE_DTYPE_I32, m->n_tokens);
  te_tensor loss = gpt_vec(m, m->loss, TE_DTYPE_F32, 1);
  STEP_TRY(m, te_cross_entropy(m->ctx, NULL, &m->t_logits, &targets, &loss,
                       with_grad ? &m->t_logits : NULL)); /* dlogits in place */
  return 0;
}

int gpt_forward_backward(gpt *m, const int32_t *tokens, const int32_t *targets, float *loss) {
  if (m == NULL || tokens == NULL || targets == NULL || loss == NULL) {
    fprintf(stderr, "gpt_forward_backward: NULL argument\n");
    return 1;
  }
  int rc = upload_batch(m, tokens, targets);
  if (rc == 0) rc = forward_logits(m);
  if (rc == 0) rc = loss_and_grad(m, 1);
  if (rc == 0) rc = backward(m);
  if (rc == 0) rc = read_loss(m, loss);
  return rc;
}

int gpt_eval_loss(gpt *m, const int32_t *tokens, const int32_t *targets, float *loss) {
  if (m == NULL || tokens == NULL || targets == NULL || loss == NULL) {
    fprintf(stderr, "gpt_eval_loss: NULL argument\n");
    return 1;
  }
  int rc = upload_batch(m, tokens, targets);
  if (rc == 0) rc = forward_logits(m);
  if (rc == 0) rc = loss_and_grad(m, 0);
  if (rc == 0) rc = read_loss(m, loss);
  return rc;
}

/* ---- optimizer ------------------------------------------------------------------------------- */

/* te_adamw_step's parameter list, built once at create. */
int gpt_build_adamw_list(gpt *m) {
  te_adamw_param *ps = calloc(m->n_params, sizeof *ps);
  if (ps == NULL) {
    fprintf(stderr, "gpt_create: out of host memory\n");
    return 1;
  }
  m->adamw = ps;
  for (size_t i = 0; i < m->n_params; ++i) {
    gpt_param_t *p = &m->params[i];
    TRY(te_adamw_param_init(&ps[i]));
    ps[i].param = &p->master;
    ps[i].grad = &p->grad;
    ps[i].exp_avg = &p->exp_avg;
    ps[i].exp_avg_sq = &p->exp_avg_sq;
    ps[i].model_weight = m->cfg.act_dtype == TE_DTYPE_F32 ? NULL : &p->model;
    ps[i].weight_decay = p->decay;
    ps[i].owner_kind = p->owner_kind;
    ps[i].owner = p->owner;
    ps[i].owner_gemm = p->owner_gemm;
  }
  return 0;
}

int gpt_step(gpt *m, float lr, int64_t step) {
  if (m == NULL || step < 1) {
    fprintf(stderr, "gpt_step: %s\n", m == NULL ? "NULL model" : "step must be >= 1");
    return 1;
  }
  te_adamw_options o;
  te_status s = te_adamw_options_init(&o);
  if (s == TE_SUCCESS) {
    o.lr = lr;
    o.beta1 = m->cfg.beta1;
    o.beta2 = m->cfg.beta2;
    o.weight_decay = m->cfg.weight_decay;
    o.step = step;
    o.max_grad_norm = m->cfg.max_grad_norm;
    PROFILED(m, te_adamw_step(m->ctx, &o, m->adamw, m->n_params), s);
  }
  if (s != TE_SUCCESS) {
    fprintf(stderr, "gpt_step: te_adamw_step failed: %s: %s\n", te_status_string(s),
            te_last_error());
    return 1;
  }
  m->steps_done = step;
  /* The profile leaves out the first 3 steps: one-time work (cuBLASLt algorithm choice, cuDNN
   * plans and kernel compilation) would otherwise hide the steady state. */
  if (m->profile && step == 3) {
    m->n_prof = 0;
    m->prof_from = step;
  }
  /* AdamW re-quantized every module's FP8 weight from the new weights. */
  m->weight_cache_ok = 1;
  return 0;
}

int64_t gpt_steps_done(const gpt *m) { return m ? m->steps_done : 0; }

