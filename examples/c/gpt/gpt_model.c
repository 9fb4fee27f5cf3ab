/*
 * gpt_model.c: the GPT of gpt_model.h, made only of libte calls: its config defaults and
 * gpt_create / gpt_destroy. See the header for the architecture and the rules (memory, syncs,
 * FP8 scopes, checkpoints), and gpt_internal.h for the other files.
 */
#include "gpt_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gpt_config_default(gpt_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->vocab = 256;
  cfg->seq_len = 64;
  cfg->d_model = 64;
  cfg->n_layers = 2;
  cfg->n_heads = 4;
  cfg->d_ff = 256;
  cfg->batch = 8;
  cfg->act_dtype = TE_DTYPE_F32;
  cfg->fp8 = 0;
  cfg->amax_history_len = 0;
  cfg->fp8_recipe = TE_RECIPE_DELAYED_SCALING;
  cfg->fp8_format = TE_FORMAT_HYBRID;
  cfg->fprop_split = -1;
  cfg->lr = 3e-3f;
  cfg->weight_decay = 0.1f;
  cfg->max_grad_norm = 1.0f;
  cfg->beta1 = 0.9f;
  cfg->beta2 = 0.95f;
  cfg->seed = 1234;
}

const gpt_config *gpt_get_config(const gpt *m) { return &m->cfg; }

/* ---- create / destroy ----------------------------------------------------------------------- */

static int check_config(const gpt_config *c) {
  const char *why = NULL;
  if (c->vocab < 2) why = "vocab must be >= 2";
  else if (c->seq_len < 1 || c->d_model < 1 || c->n_layers < 1 || c->n_heads < 1 || c->d_ff < 1 ||
           c->batch < 1)
    why = "every size must be >= 1";
  else if (c->d_model % c->n_heads != 0) why = "d_model must be a multiple of n_heads";
  else if ((c->d_model / c->n_heads) % 8 != 0 || c->d_model / c->n_heads > 256)
    why = "d_model / n_heads (the head size) must be a multiple of 8, at most 256";
  else if (c->act_dtype != TE_DTYPE_F32 && c->act_dtype != TE_DTYPE_BF16 &&
           c->act_dtype != TE_DTYPE_F16)
    why = "act_dtype must be F32, BF16 or F16";
  else if (c->fp8 && (((int64_t)c->batch * c->seq_len) % 16 != 0 || c->d_model % 16 != 0 ||
                      c->d_ff % 16 != 0))
    why = "FP8 needs batch * seq_len, d_model and d_ff to be multiples of 16";
  if (why != NULL) {
    fprintf(stderr, "gpt_create: bad config: %s\n", why);
    return 1;
  }
  return 0;
}

static int create_modules(gpt *m) {
  const gpt_config *c = &m->cfg;
  const int64_t d = c->d_model;
  for (int l = 0; l < c->n_layers; ++l) {
    gpt_block *b = &m->blocks[l];
    te_layernorm_linear_options lo;
    TRY(te_layernorm_linear_options_init(&lo));
    lo.in_features = d;
    lo.out_features = 3 * d;
    lo.bias = 1;
    lo.activation_dtype = c->act_dtype;
    lo.normalization = TE_NORM_LAYERNORM;
    TRY(te_layernorm_linear_create(&b->qkv, m->ctx, &lo));

    te_attention_options ao;
    TRY(te_attention_options_init(&ao));
    ao.num_heads = c->n_heads;
    ao.head_dim = m->head_dim;
    ao.mask = TE_ATTN_MASK_CAUSAL;
    ao.activation_dtype = c->act_dtype;
    ao.fp8 = 0; /* attention in the activation dtype (TE's fp8_dpa = False) */
    TRY(te_attention_create(&b->attn, m->ctx, &ao));

    te_linear_options po;
    TRY(te_linear_options_init(&po));
    po.in_features = d;
    po.out_features = d;
    po.bias = 1;
    po.activation_dtype = c->act_dtype;
    TRY(te_linear_create(&b->proj, m->ctx, &po));

    te_layernorm_mlp_options mo;
    TRY(te_layernorm_mlp_options_init(&mo));
    mo.hidden_size = d;
    mo.ffn_hidden_size = c->d_ff;
    mo.bias = 1;
    mo.activation = TE_ACTIVATION_GELU;
    mo.activation_dtype = c->act_dtype;
    mo.normalization = TE_NORM_LAYERNORM;
    TRY(te_layernorm_mlp_create(&b->mlp, m->ctx, &mo));
  }
  te_linear_options ho;
  TRY(te_linear_options_init(&ho));
  ho.in_features = d;
  ho.out_features = c->vocab;
  ho.bias = 0;
  ho.activation_dtype = c->act_dtype;
  TRY(te_linear_create(&m->head, m->ctx, &ho));
  return 0;
}

static int alloc_buffers(gpt *m) {
  const gpt_config *c = &m->cfg;
  const size_t n = (size_t)m->n_tokens, d = (size_t)c->d_model, a = m->act_size;
  for (int l = 0; l < c->n_layers; ++l) {
    gpt_block *b = &m->blocks[l];
    TRY_OK(gpt_dev_alloc(m, n * d * a, &b->x_in));
    TRY_OK(gpt_dev_alloc(m, n * 3 * d * a, &b->qkv_out));
    TRY_OK(gpt_dev_alloc(m, n * d * a, &b->q));
    TRY_OK(gpt_dev_alloc(m, n * d * a, &b->k));
    TRY_OK(gpt_dev_alloc(m, n * d * a, &b->v));
    TRY_OK(gpt_dev_alloc(m, n * d * a, &b->att));
    TRY_OK(gpt_dev_alloc(m, n * d * a, &b->x_mid));
  }
  TRY_OK(gpt_dev_alloc(m, (size_t)c->seq_len * (size_t)(m->head_dim / 2) * 4, &m->freqs));
  /* tokens and targets side by side, so that a batch goes up in one copy */
  TRY_OK(gpt_dev_alloc(m, 2 * n * 4, &m->tokens));
  m->targets = (int32_t *)m->tokens + n;
  m->host_batch = malloc(2 * n * sizeof(int32_t));
  if (m->host_batch == NULL) {
    fprintf(stderr, "gpt_create: out of host memory\n");
    return 1;
  }
  TRY_OK(gpt_dev_alloc(m, n * d * a, &m->x_final));
  TRY_OK(gpt_dev_alloc(m, n * d * a, &m->h));
  TRY_OK(gpt_dev_alloc(m, n * 4, &m->mu));
  TRY_OK(gpt_dev_alloc(m, n * 4, &m->rsigma));
  TRY_OK(gpt_dev_alloc(m, n * (size_t)c->vocab * a, &m->logits));
  TRY_OK(gpt_dev_alloc(m, 4, &m->loss));
  TRY_OK(gpt_dev_alloc(m, n * d * a, &m->tmp));
  TRY_OK(gpt_dev_alloc(m, n * d * a, &m->dres));
  TRY_OK(gpt_dev_alloc(m, n * d * a, &m->dmid));
  TRY_OK(gpt_dev_alloc(m, n * d * a, &m->dtmp));
  TRY_OK(gpt_dev_alloc(m, n * d * a, &m->dq));
  TRY_OK(gpt_dev_alloc(m, n * d * a, &m->dk));
  TRY_OK(gpt_dev_alloc(m, n * d * a, &m->dv));
  TRY_OK(gpt_dev_alloc(m, n * 3 * d * a, &m->dqkv));
  return 0;
}

/* RoPE angles freqs[p, k] = p * 10000^(-2k / head_dim), computed in double on the host once. */
static int write_freqs(gpt *m) {
  const int half = m->head_dim / 2, T = m->cfg.seq_len;
  float *f = malloc((size_t)T * (size_t)half * sizeof(float));
  if (f == NULL) {
    fprintf(stderr, "gpt: out of host memory\n");
    return 1;
  }
  for (int p = 0; p < T; ++p)
    for (int k = 0; k < half; ++k)
      f[(size_t)p * half + k] = (float)(p * pow(10000.0, -2.0 * k / m->head_dim));
  te_status s = te_context_copy(m->ctx, m->freqs, f, (size_t)T * half * sizeof(float),
                                TE_COPY_HOST_TO_DEVICE);
  free(f);
  TRY(s);
  return 0;
}

/* The tensor views and forward arguments of every module, built once at create (the buffers
 * and the parameter array never move), so that a step only flips weight_unchanged. The same
 * arguments are given again to the backward_from calls. */
static int build_views(gpt *m) {
  const gpt_config *c = &m->cfg;
  const int64_t d = c->d_model;
  for (int l = 0; l < c->n_layers; ++l) {
    gpt_block *b = &m->blocks[l];
    b->t_x = gpt_act(m, b->x_in, d);
    b->t_qkv = gpt_act(m, b->qkv_out, 3 * d);
    b->t_q2 = gpt_act(m, b->q, d);
    b->t_k2 = gpt_act(m, b->k, d);
    b->t_v2 = gpt_act(m, b->v, d);
    b->t_q = gpt_bshd(m, b->q);
    b->t_k = gpt_bshd(m, b->k);
    b->t_v = gpt_bshd(m, b->v);
    b->t_o = gpt_bshd(m, b->att);
    b->t_att = gpt_act(m, b->att, d);
    b->t_mid = gpt_act(m, b->x_mid, d);
    b->t_next = gpt_act(m, l + 1 < c->n_layers ? m->blocks[l + 1].x_in : m->x_final, d);

    TRY(te_layernorm_linear_forward_args_init(&b->la));
    b->la.input = &b->t_x;
    b->la.ln_weight = W(b->ln1_g);
    b->la.ln_bias = W(b->ln1_b);
    b->la.weight = W(b->w_qkv);
    b->la.bias = W(b->b_qkv);

    TRY(te_attention_forward_args_init(&b->aa));
    b->aa.q = &b->t_q;
    b->aa.k = &b->t_k;
    b->aa.v = &b->t_v;

    TRY(te_linear_forward_args_init(&b->pa));
    b->pa.input = &b->t_att;
    b->pa.weight = W(b->w_proj);
    b->pa.bias = W(b->b_proj);

    TRY(te_layernorm_mlp_forward_args_init(&b->ma));
    b->ma.input = &b->t_mid;
    b->ma.ln_weight = W(b->ln2_g);
    b->ma.ln_bias = W(b->ln2_b);
    b->ma.fc1_weight = W(b->fc1_w);
    b->ma.fc1_bias = W(b->fc1_b);
    b->ma.fc2_weight = W(b->fc2_w);
    b->ma.fc2_bias = W(b->fc2_b);
  }
  m->t_tmp = gpt_act(m, m->tmp, d);
  m->t_h = gpt_act(m, m->h, d);
  m->t_logits = gpt_act(m, m->logits, c->vocab);
  TRY(te_linear_forward_args_init(&m->ha));
  m->ha.input = &m->t_h;
  m->ha.weight = W(m->w_head);
  return 0;
}

/* Residual memory of every module, in the caller's memory (te_*_residuals_size /
 * _forward_compute_into / _backward_from): allocated once here, so a step allocates nothing.
 * The sizes depend on whether the forward runs in FP8, so they are asked for under the very
 * scopes the forward opens (a scope in which nothing runs updates nothing). */
static int alloc_residuals(gpt *m) {
  te_autocast_options fp8_scope, hp_scope;
  TRY(te_autocast_options_init(&fp8_scope));
  fp8_scope.enabled = m->cfg.fp8;
  fp8_scope.recipe = m->recipe;
  TRY(te_autocast_options_init(&hp_scope));
  hp_scope.enabled = 0;
  te_autocast_token outer, inner;
  TRY(te_autocast_begin(m->ctx, &fp8_scope, &outer));
  te_status s = TE_SUCCESS;
  for (int l = 0; l < m->cfg.n_layers && s == TE_SUCCESS; ++l) {
    gpt_block *b = &m->blocks[l];
    s = te_layernorm_linear_residuals_size(m->ctx, b->qkv, &b->la, &b->n_qkv);
    if (s == TE_SUCCESS) s = te_attention_residuals_size(m->ctx, b->attn, &b->aa, &b->n_attn);
    if (s == TE_SUCCESS) s = te_linear_residuals_size(m->ctx, b->proj, &b->pa, &b->n_proj);
    if (s == TE_SUCCESS) s = te_layernorm_mlp_residuals_size(m->ctx, b->mlp, &b->ma, &b->n_mlp);
  }
  if (s == TE_SUCCESS) s = te_autocast_begin(m->ctx, &hp_scope, &inner);
  if (s == TE_SUCCESS) {
    s = te_linear_residuals_size(m->ctx, m->head, &m->ha, &m->n_head);
    te_autocast_end(m->ctx, inner);
  }
  te_autocast_end(m->ctx, outer);
  TRY(s);
  for (int l = 0; l < m->cfg.n_layers; ++l) {
    gpt_block *b = &m->blocks[l];
    if (b->n_qkv) TRY_OK(gpt_dev_alloc(m, b->n_qkv, &b->r_qkv));
    if (b->n_attn) TRY_OK(gpt_dev_alloc(m, b->n_attn, &b->r_attn));
    if (b->n_proj) TRY_OK(gpt_dev_alloc(m, b->n_proj, &b->r_proj));
    if (b->n_mlp) TRY_OK(gpt_dev_alloc(m, b->n_mlp, &b->r_mlp));
  }
  if (m->n_head) TRY_OK(gpt_dev_alloc(m, m->n_head, &m->r_head));
  return 0;
}

int gpt_create(gpt **out, te_context *ctx, const gpt_config *cfg) {
  if (out == NULL || ctx == NULL || cfg == NULL) {
    fprintf(stderr, "gpt_create: NULL argument\n");
    return 1;
  }
  if (check_config(cfg) != 0) return 1;
  gpt *m = calloc(1, sizeof *m);
  if (m) {
    const char *p = getenv("GPT_PROFILE");
    m->profile = p != NULL && p[0] == '1';
  }
  if (m == NULL) {
    fprintf(stderr, "gpt_create: out of host memory\n");
    return 1;
  }
  m->cfg = *cfg;
  m->ctx = ctx;
  m->n_tokens = (int64_t)cfg->batch * cfg->seq_len;
  m->head_dim = cfg->d_model / cfg->n_heads;
  m->act_size = gpt_dtype_size(cfg->act_dtype);
  m->blocks = calloc((size_t)cfg->n_layers, sizeof *m->blocks);
  int rc = m->blocks == NULL;
  if (rc) fprintf(stderr, "gpt_create: out of host memory\n");
  if (rc == 0 && te_context_get_device(ctx, &m->device) != TE_SUCCESS) {
    fprintf(stderr, "gpt_create: te_context_get_device: %s\n", te_last_error());
    rc = 1;
  }
  if (rc == 0 && cfg->fp8) {
    /* Delayed scaling, HYBRID. The amax window: TE's default 1024 is longer than a demo run,
     * so every scale would be the max since step 0 and never follow the gradients as they
     * shrink; 16 steps still smooth batch-to-batch noise (as train_mlp.c). */
    te_recipe_options ro;
    te_status s = te_recipe_options_init(&ro, (te_recipe_kind)cfg->fp8_recipe);
    if (cfg->fp8_recipe != TE_RECIPE_BLOCK_SCALING) ro.format = (te_format)cfg->fp8_format;
    if (cfg->fp8_recipe == TE_RECIPE_DELAYED_SCALING)
      ro.amax_history_len = cfg->amax_history_len > 0 ? cfg->amax_history_len : 16;
    if (cfg->fprop_split >= 0) ro.fprop_split_accumulator = cfg->fprop_split;
    if (s == TE_SUCCESS) s = te_recipe_create(&m->recipe, &ro);
    if (s != TE_SUCCESS) {
      fprintf(stderr, "gpt_create: recipe: %s: %s\n", te_status_string(s), te_last_error());
      rc = 1;
    }
  }
  if (rc == 0) rc = create_modules(m);
  if (rc == 0) {
    gpt_declare_params(m);
    rc = gpt_alloc_params(m);
  }
  if (rc == 0) rc = alloc_buffers(m);
  if (rc == 0) rc = build_views(m);
  if (rc == 0) rc = alloc_residuals(m);
  if (rc == 0) rc = write_freqs(m);
  if (rc == 0) rc = gpt_init_params(m);
  if (rc == 0) rc = gpt_build_adamw_list(m);
  if (rc != 0) {
    gpt_destroy(m);
    return 1;
  }
  *out = m;
  return 0;
}

void gpt_destroy(gpt *m) {
  if (m == NULL) return;
  /* Device memory: freed one by one (the context would free it with itself, but the caller
   * may keep the context for another model). */
  void **blocks[] = {&m->freqs, &m->tokens, &m->x_final, &m->h, &m->mu,
                     &m->rsigma, &m->logits, &m->loss, &m->tmp, &m->dres, &m->dmid,
                     &m->dtmp, &m->dq, &m->dk, &m->dv, &m->dqkv, &m->r_head};
  for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; ++i)
    if (*blocks[i] != NULL) te_context_free(m->ctx, *blocks[i]);
  for (int l = 0; m->blocks != NULL && l < m->cfg.n_layers; ++l) {
    gpt_block *b = &m->blocks[l];
    void *bufs[] = {b->x_in, b->qkv_out, b->q, b->k, b->v, b->att, b->x_mid,
                    b->r_qkv, b->r_attn, b->r_proj, b->r_mlp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
      if (bufs[i] != NULL) te_context_free(m->ctx, bufs[i]);
    te_layernorm_linear_destroy(b->qkv);
    te_attention_destroy(b->attn);
    te_linear_destroy(b->proj);
    te_layernorm_mlp_destroy(b->mlp);
  }
  for (size_t i = 0; i < m->n_params; ++i) {
    gpt_param_t *p = &m->params[i];
    if (p->model.data != NULL && p->model.data != p->master.data)
      te_context_free(m->ctx, p->model.data);
    void *bufs[] = {p->master.data, p->exp_avg.data, p->exp_avg_sq.data, p->grad.data};
    for (size_t j = 0; j < 4; ++j)
      if (bufs[j] != NULL) te_context_free(m->ctx, bufs[j]);
  }
  te_linear_destroy(m->head);
  te_recipe_release(m->recipe);
  free(m->adamw);
  free(m->host_batch);
  free(m->params);
  free(m->blocks);
  free(m);
}

