/*
 * gpt_params.c: the GPT model's parameters: the list (names, shapes, init, decay, owning
 * modules), their device memory, the initial weights (GPT-2 init from a deterministic host RNG),
 * the model-dtype copies written from the masters, and the accessors for tests. See gpt_model.h.
 */
#include "gpt_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t add_param(gpt *m, const char *name, int64_t rows, int64_t cols, init_kind init,
                        float std, int decay, te_module_kind owner_kind, const void *owner,
                        int owner_gemm) {
  if (m->n_params == m->cap_params) {
    size_t cap = m->cap_params ? 2 * m->cap_params : 32;
    gpt_param_t *p = realloc(m->params, cap * sizeof *p);
    if (p == NULL) {
      fprintf(stderr, "gpt: out of host memory\n");
      exit(2);
    }
    m->params = p;
    m->cap_params = cap;
  }
  gpt_param_t *p = &m->params[m->n_params];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = cols > 0 ? 2 : 1;
  p->shape[0] = rows;
  p->shape[1] = cols;
  p->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
  p->init = init;
  p->init_std = std;
  p->decay = decay;
  p->owner_kind = owner_kind;
  p->owner = owner;
  p->owner_gemm = owner_gemm;
  p->grad_dtype = m->cfg.act_dtype;
  return m->n_params++;
}

/* ---- deterministic host RNG (the initial weights) ------------------------------------------- */

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in (0, 1]: 53 random bits, never 0 (Box-Muller takes its log). */
static double uniform01(uint64_t *state) {
  return ((double)(splitmix64(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

/* Standard normal, Box-Muller (one value per pair of draws: simple and reproducible). */
static double normal01(uint64_t *state) {
  const double u1 = uniform01(state), u2 = uniform01(state);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* fp32 -> bf16 / f16 bits, round to nearest even (what AdamW's model_weight write does). */
static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (ax < 0x38800000u) { /* subnormal half (or zero) */
    float a;
    memcpy(&a, &ax, 4);
    const float scaled = a * 16777216.0f; /* 2^24: half subnormal ulp = 2^-24 */
    return (uint16_t)(sign | (uint16_t)lrintf(scaled));
  }
  uint32_t mant = ax & 0x7fffffu;
  uint32_t exp = (ax >> 23) - 112u;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return (uint16_t)(sign | h);
}

/* Writes every parameter's model-dtype copy from its master (host conversion: setup, load and
 * tests only; training steps write it inside te_adamw_step). */
static int write_model_weights(gpt *m) {
  if (m->cfg.act_dtype == TE_DTYPE_F32) return 0;
  size_t max_numel = 0;
  for (size_t i = 0; i < m->n_params; ++i)
    if (m->params[i].numel > max_numel) max_numel = m->params[i].numel;
  float *host = malloc(max_numel * sizeof(float));
  uint16_t *half = malloc(max_numel * sizeof(uint16_t));
  int rc = 0;
  if (host == NULL || half == NULL) {
    fprintf(stderr, "gpt: out of host memory\n");
    rc = 1;
  }
  for (size_t i = 0; rc == 0 && i < m->n_params; ++i) {
    gpt_param_t *p = &m->params[i];
    te_status s = te_context_copy(m->ctx, host, p->master.data, p->numel * sizeof(float),
                                  TE_COPY_DEVICE_TO_HOST);
    for (size_t j = 0; s == TE_SUCCESS && j < p->numel; ++j)
      half[j] = m->cfg.act_dtype == TE_DTYPE_BF16 ? f32_to_bf16(host[j]) : f32_to_f16(host[j]);
    if (s == TE_SUCCESS)
      s = te_context_copy(m->ctx, p->model.data, half, p->numel * 2, TE_COPY_HOST_TO_DEVICE);
    if (s != TE_SUCCESS) {
      fprintf(stderr, "gpt: copying %s: %s: %s\n", p->name, te_status_string(s), te_last_error());
      rc = 1;
    }
  }
  free(half);
  free(host);
  return rc;
}

/* Fills the masters from cfg.seed (one RNG stream in parameter order), zeroes the moments. */
int gpt_init_params(gpt *m) {
  size_t max_numel = 0;
  for (size_t i = 0; i < m->n_params; ++i)
    if (m->params[i].numel > max_numel) max_numel = m->params[i].numel;
  float *host = malloc(max_numel * sizeof(float));
  float *zeros = calloc(max_numel, sizeof(float));
  if (host == NULL || zeros == NULL) {
    free(host);
    free(zeros);
    fprintf(stderr, "gpt: out of host memory\n");
    return 1;
  }
  uint64_t rng = m->cfg.seed;
  te_status s = TE_SUCCESS;
  for (size_t i = 0; s == TE_SUCCESS && i < m->n_params; ++i) {
    gpt_param_t *p = &m->params[i];
    for (size_t j = 0; j < p->numel; ++j)
      host[j] = p->init == INIT_NORMAL ? (float)(p->init_std * normal01(&rng))
                : p->init == INIT_ONES ? 1.0f
                                       : 0.0f;
    s = te_context_copy(m->ctx, p->master.data, host, p->numel * 4, TE_COPY_HOST_TO_DEVICE);
    if (s == TE_SUCCESS)
      s = te_context_copy(m->ctx, p->exp_avg.data, zeros, p->numel * 4, TE_COPY_HOST_TO_DEVICE);
    if (s == TE_SUCCESS)
      s = te_context_copy(m->ctx, p->exp_avg_sq.data, zeros, p->numel * 4,
                          TE_COPY_HOST_TO_DEVICE);
  }
  free(zeros);
  free(host);
  TRY(s);
  return write_model_weights(m);
}

void gpt_declare_params(gpt *m) {
  const gpt_config *c = &m->cfg;
  const int64_t d = c->d_model, ff = c->d_ff;
  const float std = 0.02f;
  const float res_std = (float)(0.02 / sqrt(2.0 * c->n_layers)); /* GPT-2's residual scaling */
  char name[MAX_NAME];
  m->wte = add_param(m, "embedding.weight", c->vocab, d, INIT_NORMAL, std, 0, TE_MODULE_NONE,
                     NULL, 0);
  m->params[m->wte].grad_dtype = TE_DTYPE_F32; /* te_embedding_backward writes F32 */
  for (int l = 0; l < c->n_layers; ++l) {
    gpt_block *b = &m->blocks[l];
#define P(field, suffix, rows, cols, init, sd, decay, kind, owner, gemm)                           \
  snprintf(name, sizeof name, "block%d.%s", l, suffix);                                            \
  b->field = add_param(m, name, rows, cols, init, sd, decay, kind, owner, gemm)
    P(ln1_g, "ln1.weight", d, 0, INIT_ONES, 0, 0, TE_MODULE_NONE, NULL, 0);
    P(ln1_b, "ln1.bias", d, 0, INIT_ZEROS, 0, 0, TE_MODULE_NONE, NULL, 0);
    P(w_qkv, "qkv.weight", 3 * d, d, INIT_NORMAL, std, 1, TE_MODULE_LAYERNORM_LINEAR, b->qkv, 0);
    P(b_qkv, "qkv.bias", 3 * d, 0, INIT_ZEROS, 0, 0, TE_MODULE_NONE, NULL, 0);
    P(w_proj, "proj.weight", d, d, INIT_NORMAL, res_std, 1, TE_MODULE_LINEAR, b->proj, 0);
    P(b_proj, "proj.bias", d, 0, INIT_ZEROS, 0, 0, TE_MODULE_NONE, NULL, 0);
    P(ln2_g, "ln2.weight", d, 0, INIT_ONES, 0, 0, TE_MODULE_NONE, NULL, 0);
    P(ln2_b, "ln2.bias", d, 0, INIT_ZEROS, 0, 0, TE_MODULE_NONE, NULL, 0);
    P(fc1_w, "fc1.weight", ff, d, INIT_NORMAL, std, 1, TE_MODULE_LAYERNORM_MLP, b->mlp, TE_MLP_FC1);
    P(fc1_b, "fc1.bias", ff, 0, INIT_ZEROS, 0, 0, TE_MODULE_NONE, NULL, 0);
    P(fc2_w, "fc2.weight", d, ff, INIT_NORMAL, res_std, 1, TE_MODULE_LAYERNORM_MLP, b->mlp,
      TE_MLP_FC2);
    P(fc2_b, "fc2.bias", d, 0, INIT_ZEROS, 0, 0, TE_MODULE_NONE, NULL, 0);
#undef P
  }
  m->lnf_g = add_param(m, "final_norm.weight", d, 0, INIT_ONES, 0, 0, TE_MODULE_NONE, NULL, 0);
  m->lnf_b = add_param(m, "final_norm.bias", d, 0, INIT_ZEROS, 0, 0, TE_MODULE_NONE, NULL, 0);
  m->w_head = add_param(m, "head.weight", c->vocab, d, INIT_NORMAL, std, 1, TE_MODULE_LINEAR,
                        m->head, 0);
}

int gpt_alloc_params(gpt *m) {
  for (size_t i = 0; i < m->n_params; ++i) {
    gpt_param_t *p = &m->params[i];
    const int64_t *s = p->shape;
    void *master, *ea, *eas, *grad, *model;
    TRY_OK(gpt_dev_alloc(m, p->numel * 4, &master));
    TRY_OK(gpt_dev_alloc(m, p->numel * 4, &ea));
    TRY_OK(gpt_dev_alloc(m, p->numel * 4, &eas));
    TRY_OK(gpt_dev_alloc(m, p->numel * gpt_dtype_size(p->grad_dtype), &grad));
    if (m->cfg.act_dtype == TE_DTYPE_F32)
      model = master; /* the modules read the masters themselves */
    else
      TRY_OK(gpt_dev_alloc(m, p->numel * m->act_size, &model));
    p->master = gpt_tensor_nd(m, master, TE_DTYPE_F32, p->ndim, s);
    p->exp_avg = gpt_tensor_nd(m, ea, TE_DTYPE_F32, p->ndim, s);
    p->exp_avg_sq = gpt_tensor_nd(m, eas, TE_DTYPE_F32, p->ndim, s);
    p->grad = gpt_tensor_nd(m, grad, p->grad_dtype, p->ndim, s);
    p->model = gpt_tensor_nd(m, model, m->cfg.act_dtype, p->ndim, s);
  }
  return 0;
}

/* ---- parameters for tests --------------------------------------------------------------------- */

size_t gpt_num_params(const gpt *m) {
  size_t n = 0;
  for (size_t i = 0; m != NULL && i < m->n_params; ++i) n += m->params[i].numel;
  return n;
}

size_t gpt_param_count(const gpt *m) { return m ? m->n_params : 0; }

int gpt_param(gpt *m, size_t i, const char **name, te_tensor *master, te_tensor *grad) {
  if (m == NULL || i >= m->n_params) {
    fprintf(stderr, "gpt_param: index %zu out of range\n", i);
    return 1;
  }
  if (name) *name = m->params[i].name;
  if (master) *master = m->params[i].master;
  if (grad) *grad = m->params[i].grad;
  return 0;
}

int gpt_refresh_model_weights(gpt *m) {
  if (m == NULL) return 1;
  m->weight_cache_ok = 0;
  return write_model_weights(m);
}
