/*
 * gpt_model.c: the GPT of gpt_model.h, made only of libte calls. See the header for the
 * architecture and the rules (memory, syncs, FP8 scopes, checkpoints).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime (GPT_PROFILE) */
#include "gpt_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- errors -------------------------------------------------------------------------------- */

/* Every libte failure is printed where it happens and turned into a nonzero return. */
#define TRY(call)                                                                                  \
  do {                                                                                             \
    te_status try_status_ = (call);                                                                \
    if (try_status_ != TE_SUCCESS) {                                                               \
      fprintf(stderr, "gpt: %s failed: %s: %s\n", #call, te_status_string(try_status_),            \
              te_last_error());                                                                    \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

#define TRY_OK(expr)                                                                               \
  do {                                                                                             \
    if ((expr) != 0) return 1;                                                                     \
  } while (0)

/* ---- profiling (GPT_PROFILE=1) -------------------------------------------------------------- */

/* With GPT_PROFILE=1 the stream is synchronised around every libte call of a step, so each
 * call's time (GPU work plus host overhead, alone) adds up per function: where a step's time
 * goes. The steps themselves then run slower than without it. */
static double prof_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct gpt;
static void prof_add(struct gpt *m, const char *call_text, double t0);
static double prof_start(struct gpt *m);

#define PROFILED(m, call, status)                                                                  \
  do {                                                                                             \
    const double prof_t0_ = prof_start(m);                                                         \
    status = (call);                                                                               \
    if (prof_t0_ > 0) prof_add((m), #call, prof_t0_);                                              \
  } while (0)

/* TRY for the calls of a training step: timed under GPT_PROFILE. */
#define STEP_TRY(m, call)                                                                          \
  do {                                                                                             \
    te_status step_try_status_;                                                                    \
    PROFILED(m, call, step_try_status_);                                                           \
    if (step_try_status_ != TE_SUCCESS) {                                                          \
      fprintf(stderr, "gpt: %s failed: %s: %s\n", #call, te_status_string(step_try_status_),      \
              te_last_error());                                                                    \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

/* ---- parameters ---------------------------------------------------------------------------- */

enum { MAX_NAME = 64 };

typedef enum init_kind { INIT_NORMAL, INIT_ZEROS, INIT_ONES } init_kind;

/* One parameter tensor: the fp32 master and moments, the model copy the modules read (the
 * master itself when the activation dtype is F32), the gradient the modules write. */
typedef struct gpt_param_t {
  char name[MAX_NAME];
  int ndim;
  int64_t shape[2];
  size_t numel;
  init_kind init;
  float init_std;
  int decay;
  te_module_kind owner_kind;
  const void *owner;
  int owner_gemm;
  te_dtype grad_dtype;
  te_tensor master, model, grad, exp_avg, exp_avg_sq;
} gpt_param_t;

/* A block's modules and the indices of its parameters. */
typedef struct gpt_block {
  te_layernorm_linear *qkv;
  te_attention *attn;
  te_linear *proj;
  te_layernorm_mlp *mlp;
  size_t ln1_g, ln1_b, w_qkv, b_qkv, w_proj, b_proj, ln2_g, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  /* activations kept for the backward (each block its own: the modules reference them) */
  void *x_in;   /* [N, d] the block's input (residual stream) */
  void *qkv_out; /* [N, 3d] */
  void *q, *k, *v; /* [N, d] each, viewed as [B, T, H, Dh]; q and k rotated in place */
  void *att;     /* [N, d] attention output (proj's input) */
  void *x_mid;   /* [N, d] after the attention residual (the MLP's input) */
  /* views of the buffers above and the modules' forward arguments (built once) */
  te_tensor t_x, t_qkv, t_q2, t_k2, t_v2, t_q, t_k, t_v, t_o, t_att, t_mid, t_next;
  te_layernorm_linear_forward_args la;
  te_attention_forward_args aa;
  te_linear_forward_args pa;
  te_layernorm_mlp_forward_args ma;
  /* each module's residual memory (caller-owned: te_*_forward_compute_into) and its size */
  void *r_qkv, *r_attn, *r_proj, *r_mlp;
  size_t n_qkv, n_attn, n_proj, n_mlp;
} gpt_block;

struct gpt {
  gpt_config cfg;
  te_context *ctx;
  te_device device;
  te_recipe *recipe;
  int64_t n_tokens; /* N = batch * seq_len */
  int head_dim;
  size_t act_size; /* bytes per activation element */

  gpt_param_t *params;
  size_t n_params, cap_params;
  size_t wte, lnf_g, lnf_b, w_head;

  gpt_block *blocks;
  te_linear *head;

  /* buffers */
  void *freqs;     /* F32 [seq_len, head_dim / 2] RoPE angles */
  void *tokens, *targets; /* I32 [N] each, one block: targets = tokens + N */
  int32_t *host_batch;     /* [2N] host staging for the single upload */
  void *x_final;   /* [N, d] residual stream after the last block */
  void *h;         /* [N, d] final norm output (head input) */
  void *mu, *rsigma; /* F32 [N] final norm statistics */
  void *logits;    /* [N, vocab], dlogits in place */
  void *loss;      /* F32 [1] */
  void *tmp;       /* [N, d] scratch: the proj and MLP outputs before their residual adds */
  void *dres;      /* [N, d] gradient of the residual stream */
  void *dmid;      /* [N, d] gradient at x_mid */
  void *dtmp;      /* [N, d] scratch gradient (module dx) */
  void *dq, *dk, *dv; /* [N, d] */
  void *dqkv;      /* [N, 3d] */

  te_adamw_param *adamw; /* [n_params], filled once: te_adamw_step's list */

  te_tensor t_tmp, t_h, t_logits;
  te_linear_forward_args ha;
  void *r_head; /* NULL: the head runs in high precision and keeps no residuals */
  size_t n_head;
  int weight_cache_ok; /* the FP8 weight caches hold the current weights (set by gpt_step) */
  int64_t steps_done;
  /* GPT_PROFILE=1 in the environment: each libte call of a step timed alone (gpt_profile) */
  int profile;
  int n_prof;
  int64_t prof_from; /* the profile covers the steps after this one */
  struct {
    char name[48];
    double seconds;
    long calls;
  } prof[48];
};

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

static size_t dtype_size(te_dtype dt) {
  switch (dt) {
  case TE_DTYPE_F32:
  case TE_DTYPE_I32: return 4;
  case TE_DTYPE_F16:
  case TE_DTYPE_BF16: return 2;
  default: return 1;
  }
}

static te_tensor tensor_nd(const gpt *m, void *data, te_dtype dt, int ndim, const int64_t *shape) {
  te_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dt;
  t.ndim = ndim;
  for (int i = 0; i < ndim; ++i) t.shape[i] = shape[i];
  t.device = m->device;
  return t;
}

static te_tensor mat(const gpt *m, void *data, te_dtype dt, int64_t rows, int64_t cols) {
  int64_t s[2] = {rows, cols};
  return tensor_nd(m, data, dt, 2, s);
}

static te_tensor vec(const gpt *m, void *data, te_dtype dt, int64_t n) {
  return tensor_nd(m, data, dt, 1, &n);
}

/* An activation [N, cols] in the activation dtype. */
static te_tensor act(const gpt *m, void *data, int64_t cols) {
  return mat(m, data, m->cfg.act_dtype, m->n_tokens, cols);
}

/* q, k, v and their gradients as attention and RoPE see them: BSHD. */
static te_tensor bshd(const gpt *m, void *data) {
  int64_t s[4] = {m->cfg.batch, m->cfg.seq_len, m->cfg.n_heads, m->head_dim};
  return tensor_nd(m, data, m->cfg.act_dtype, 4, s);
}

static int dev_alloc(gpt *m, size_t bytes, void **out) {
  TRY(te_context_malloc(m->ctx, bytes, out));
  return 0;
}

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
static int init_params(gpt *m) {
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

static void declare_params(gpt *m) {
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

static int alloc_params(gpt *m) {
  for (size_t i = 0; i < m->n_params; ++i) {
    gpt_param_t *p = &m->params[i];
    const int64_t *s = p->shape;
    void *master, *ea, *eas, *grad, *model;
    TRY_OK(dev_alloc(m, p->numel * 4, &master));
    TRY_OK(dev_alloc(m, p->numel * 4, &ea));
    TRY_OK(dev_alloc(m, p->numel * 4, &eas));
    TRY_OK(dev_alloc(m, p->numel * dtype_size(p->grad_dtype), &grad));
    if (m->cfg.act_dtype == TE_DTYPE_F32)
      model = master; /* the modules read the masters themselves */
    else
      TRY_OK(dev_alloc(m, p->numel * m->act_size, &model));
    p->master = tensor_nd(m, master, TE_DTYPE_F32, p->ndim, s);
    p->exp_avg = tensor_nd(m, ea, TE_DTYPE_F32, p->ndim, s);
    p->exp_avg_sq = tensor_nd(m, eas, TE_DTYPE_F32, p->ndim, s);
    p->grad = tensor_nd(m, grad, p->grad_dtype, p->ndim, s);
    p->model = tensor_nd(m, model, m->cfg.act_dtype, p->ndim, s);
  }
  return 0;
}

static int alloc_buffers(gpt *m) {
  const gpt_config *c = &m->cfg;
  const size_t n = (size_t)m->n_tokens, d = (size_t)c->d_model, a = m->act_size;
  for (int l = 0; l < c->n_layers; ++l) {
    gpt_block *b = &m->blocks[l];
    TRY_OK(dev_alloc(m, n * d * a, &b->x_in));
    TRY_OK(dev_alloc(m, n * 3 * d * a, &b->qkv_out));
    TRY_OK(dev_alloc(m, n * d * a, &b->q));
    TRY_OK(dev_alloc(m, n * d * a, &b->k));
    TRY_OK(dev_alloc(m, n * d * a, &b->v));
    TRY_OK(dev_alloc(m, n * d * a, &b->att));
    TRY_OK(dev_alloc(m, n * d * a, &b->x_mid));
  }
  TRY_OK(dev_alloc(m, (size_t)c->seq_len * (size_t)(m->head_dim / 2) * 4, &m->freqs));
  /* tokens and targets side by side, so that a batch goes up in one copy */
  TRY_OK(dev_alloc(m, 2 * n * 4, &m->tokens));
  m->targets = (int32_t *)m->tokens + n;
  m->host_batch = malloc(2 * n * sizeof(int32_t));
  if (m->host_batch == NULL) {
    fprintf(stderr, "gpt_create: out of host memory\n");
    return 1;
  }
  TRY_OK(dev_alloc(m, n * d * a, &m->x_final));
  TRY_OK(dev_alloc(m, n * d * a, &m->h));
  TRY_OK(dev_alloc(m, n * 4, &m->mu));
  TRY_OK(dev_alloc(m, n * 4, &m->rsigma));
  TRY_OK(dev_alloc(m, n * (size_t)c->vocab * a, &m->logits));
  TRY_OK(dev_alloc(m, 4, &m->loss));
  TRY_OK(dev_alloc(m, n * d * a, &m->tmp));
  TRY_OK(dev_alloc(m, n * d * a, &m->dres));
  TRY_OK(dev_alloc(m, n * d * a, &m->dmid));
  TRY_OK(dev_alloc(m, n * d * a, &m->dtmp));
  TRY_OK(dev_alloc(m, n * d * a, &m->dq));
  TRY_OK(dev_alloc(m, n * d * a, &m->dk));
  TRY_OK(dev_alloc(m, n * d * a, &m->dv));
  TRY_OK(dev_alloc(m, n * 3 * d * a, &m->dqkv));
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

static int build_adamw_list(gpt *m);
static int build_views(gpt *m);
static int alloc_residuals(gpt *m);

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
  m->act_size = dtype_size(cfg->act_dtype);
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
    declare_params(m);
    rc = alloc_params(m);
  }
  if (rc == 0) rc = alloc_buffers(m);
  if (rc == 0) rc = build_views(m);
  if (rc == 0) rc = alloc_residuals(m);
  if (rc == 0) rc = write_freqs(m);
  if (rc == 0) rc = init_params(m);
  if (rc == 0) rc = build_adamw_list(m);
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

/* ---- forward --------------------------------------------------------------------------------- */

#define W(idx) (&m->params[(idx)].model)

/* The tensor views and forward arguments of every module, built once at create (the buffers
 * and the parameter array never move), so that a step only flips weight_unchanged. The same
 * arguments are given again to the backward_from calls. */
static int build_views(gpt *m) {
  const gpt_config *c = &m->cfg;
  const int64_t d = c->d_model;
  for (int l = 0; l < c->n_layers; ++l) {
    gpt_block *b = &m->blocks[l];
    b->t_x = act(m, b->x_in, d);
    b->t_qkv = act(m, b->qkv_out, 3 * d);
    b->t_q2 = act(m, b->q, d);
    b->t_k2 = act(m, b->k, d);
    b->t_v2 = act(m, b->v, d);
    b->t_q = bshd(m, b->q);
    b->t_k = bshd(m, b->k);
    b->t_v = bshd(m, b->v);
    b->t_o = bshd(m, b->att);
    b->t_att = act(m, b->att, d);
    b->t_mid = act(m, b->x_mid, d);
    b->t_next = act(m, l + 1 < c->n_layers ? m->blocks[l + 1].x_in : m->x_final, d);

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
  m->t_tmp = act(m, m->tmp, d);
  m->t_h = act(m, m->h, d);
  m->t_logits = act(m, m->logits, c->vocab);
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
    if (b->n_qkv) TRY_OK(dev_alloc(m, b->n_qkv, &b->r_qkv));
    if (b->n_attn) TRY_OK(dev_alloc(m, b->n_attn, &b->r_attn));
    if (b->n_proj) TRY_OK(dev_alloc(m, b->n_proj, &b->r_proj));
    if (b->n_mlp) TRY_OK(dev_alloc(m, b->n_mlp, &b->r_mlp));
  }
  if (m->n_head) TRY_OK(dev_alloc(m, m->n_head, &m->r_head));
  return 0;
}

/* The whole forward up to the logits, every module writing its residuals into the model's
 * residual memory (what a following backward reads; an evaluation just overwrites them). The
 * FP8 scope (enabled = cfg.fp8) covers the blocks; the final norm and the head run in a
 * nested scope with enabled = 0. */
static int forward_logits(gpt *m) {
  const gpt_config *c = &m->cfg;
  /* 1 only on the first forward after gpt_step: AdamW has just refreshed the FP8 caches. */
  const int unchanged = c->fp8 && m->weight_cache_ok;
  te_tensor tokens = vec(m, m->tokens, TE_DTYPE_I32, m->n_tokens);
  te_tensor freqs = mat(m, m->freqs, TE_DTYPE_F32, c->seq_len, m->head_dim / 2);

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
  te_tensor xf = act(m, m->x_final, c->d_model);
  te_tensor mu = vec(m, m->mu, TE_DTYPE_F32, m->n_tokens);
  te_tensor rs = vec(m, m->rsigma, TE_DTYPE_F32, m->n_tokens);
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

  te_tensor dh = act(m, m->dtmp, d), dres = act(m, m->dres, d), dmid = act(m, m->dmid, d);
  te_tensor dtmp = act(m, m->dtmp, d);
  te_tensor xf = act(m, m->x_final, d);
  te_tensor mu = vec(m, m->mu, TE_DTYPE_F32, m->n_tokens);
  te_tensor rs = vec(m, m->rsigma, TE_DTYPE_F32, m->n_tokens);

  /* head (dlogits are in the logits' buffer): dW, and dh the gradient of the final norm's output */
  STEP_TRY(m, te_linear_backward_from(m->ctx, m->head, &m->ha, m->r_head, m->n_head, &m->t_logits, &dh,
                              &m->params[m->w_head].grad, NULL, &once));
  STEP_TRY(m, te_norm_backward(m->ctx, NULL, &dh, &xf, W(m->lnf_g), &mu, &rs, &dres,
                       &m->params[m->lnf_g].grad, &m->params[m->lnf_b].grad));

  te_tensor freqs = mat(m, m->freqs, TE_DTYPE_F32, c->seq_len, m->head_dim / 2);
  te_tensor dob = bshd(m, m->dtmp), dq = bshd(m, m->dq), dk = bshd(m, m->dk), dv = bshd(m, m->dv);
  te_tensor dq2 = act(m, m->dq, d), dk2 = act(m, m->dk, d), dv2 = act(m, m->dv, d);
  te_tensor dqkv = act(m, m->dqkv, 3 * d);
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

  te_tensor tokens = vec(m, m->tokens, TE_DTYPE_I32, m->n_tokens);
  STEP_TRY(m, te_embedding_backward(m->ctx, &tokens, &dres, &m->params[m->wte].grad, 0));
  return 0;
}

static int loss_and_grad(gpt *m, int with_grad) {
  te_tensor targets = vec(m, m->targets, TE_DTYPE_I32, m->n_tokens);
  te_tensor loss = vec(m, m->loss, TE_DTYPE_F32, 1);
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
static int build_adamw_list(gpt *m) {
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

/* ---- checkpoints ------------------------------------------------------------------------------ */

/* The shape a checkpoint must match: int64 fields in this machine's byte order (a byte record;
 * the checkpoint's own framing is little-endian). */
enum { SHAPE_FIELDS = 8 };
static void shape_record(const gpt_config *c, int64_t out[SHAPE_FIELDS]) {
  out[0] = c->vocab;
  out[1] = c->seq_len;
  out[2] = c->d_model;
  out[3] = c->n_layers;
  out[4] = c->n_heads;
  out[5] = c->d_ff;
  out[6] = c->act_dtype;
  out[7] = c->fp8;
}
static const char *const SHAPE_NAMES[SHAPE_FIELDS] = {"vocab",  "seq_len", "d_model",
                                                      "n_layers", "n_heads", "d_ff",
                                                      "act_dtype", "fp8"};

/* The modules whose FP8 state is saved, by name. */
typedef enum module_kind { MOD_QKV, MOD_ATTN, MOD_PROJ, MOD_MLP, MOD_HEAD } module_kind;
typedef struct module_ref {
  char name[MAX_NAME];
  module_kind kind;
  void *handle;
} module_ref;

static size_t list_modules(gpt *m, module_ref *out) {
  size_t n = 0;
  for (int l = 0; l < m->cfg.n_layers; ++l) {
    const char *names[4] = {"qkv", "attn", "proj", "mlp"};
    void *handles[4] = {m->blocks[l].qkv, m->blocks[l].attn, m->blocks[l].proj, m->blocks[l].mlp};
    for (int j = 0; j < 4; ++j) {
      snprintf(out[n].name, MAX_NAME, "fp8state.block%d.%s", l, names[j]);
      out[n].kind = (module_kind)j;
      out[n].handle = handles[j];
      ++n;
    }
  }
  snprintf(out[n].name, MAX_NAME, "fp8state.head");
  out[n].kind = MOD_HEAD;
  out[n].handle = m->head;
  return n + 1;
}

static te_status module_state_save(gpt *m, const module_ref *r, void *buf, size_t cap,
                                   size_t *size) {
  switch (r->kind) {
  case MOD_QKV: return te_layernorm_linear_state_save(m->ctx, r->handle, buf, cap, size);
  case MOD_ATTN: return te_attention_state_save(m->ctx, r->handle, buf, cap, size);
  case MOD_MLP: return te_layernorm_mlp_state_save(m->ctx, r->handle, buf, cap, size);
  default: return te_linear_state_save(m->ctx, r->handle, buf, cap, size);
  }
}

static te_status module_state_load(gpt *m, const module_ref *r, const void *buf, size_t size) {
  switch (r->kind) {
  case MOD_QKV: return te_layernorm_linear_state_load(m->ctx, r->handle, buf, size);
  case MOD_ATTN: return te_attention_state_load(m->ctx, r->handle, buf, size);
  case MOD_MLP: return te_layernorm_mlp_state_load(m->ctx, r->handle, buf, size);
  default: return te_linear_state_load(m->ctx, r->handle, buf, size);
  }
}

static int put_bytes(te_checkpoint *ck, const char *name, const void *data, size_t size) {
  TRY(te_checkpoint_put_bytes(ck, name, data, size));
  return 0;
}

static int save_into(gpt *m, te_checkpoint *ck, const void *extra, size_t extra_size) {
  int64_t shape[SHAPE_FIELDS];
  shape_record(&m->cfg, shape);
  TRY_OK(put_bytes(ck, "gpt.shape", shape, sizeof shape));
  TRY_OK(put_bytes(ck, "gpt.step", &m->steps_done, sizeof m->steps_done));
  /* extra may be empty: store a marker byte so that the record exists and its size says 0 */
  const unsigned char none = 0;
  TRY_OK(put_bytes(ck, "gpt.extra", extra_size ? extra : &none, extra_size ? extra_size : 1));
  uint64_t extra_len = extra_size;
  TRY_OK(put_bytes(ck, "gpt.extra_size", &extra_len, sizeof extra_len));
  char name[MAX_NAME + 16];
  for (size_t i = 0; i < m->n_params; ++i) {
    gpt_param_t *p = &m->params[i];
    snprintf(name, sizeof name, "param.%s", p->name);
    TRY(te_checkpoint_put_tensor(ck, m->ctx, name, &p->master));
    snprintf(name, sizeof name, "adam_m.%s", p->name);
    TRY(te_checkpoint_put_tensor(ck, m->ctx, name, &p->exp_avg));
    snprintf(name, sizeof name, "adam_v.%s", p->name);
    TRY(te_checkpoint_put_tensor(ck, m->ctx, name, &p->exp_avg_sq));
  }
  module_ref *mods = calloc((size_t)m->cfg.n_layers * 4 + 1, sizeof *mods);
  if (mods == NULL) return 1;
  const size_t n_mods = list_modules(m, mods);
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < n_mods; ++i) {
    size_t size = 0;
    te_status s = module_state_save(m, &mods[i], NULL, 0, &size);
    void *buf = s == TE_SUCCESS ? malloc(size ? size : 1) : NULL;
    if (s == TE_SUCCESS && buf != NULL) s = module_state_save(m, &mods[i], buf, size, &size);
    if (s == TE_SUCCESS && buf != NULL) s = te_checkpoint_put_bytes(ck, mods[i].name, buf, size);
    if (s != TE_SUCCESS || buf == NULL) {
      fprintf(stderr, "gpt_save: %s: %s: %s\n", mods[i].name, te_status_string(s),
              te_last_error());
      rc = 1;
    }
    free(buf);
  }
  free(mods);
  return rc;
}

int gpt_save(const gpt *mc, const char *path, const void *extra, size_t extra_size) {
  gpt *m = (gpt *)mc; /* state_save and put_tensor take non-const handles; nothing changes */
  if (m == NULL || path == NULL || (extra == NULL && extra_size != 0)) {
    fprintf(stderr, "gpt_save: NULL argument\n");
    return 1;
  }
  te_checkpoint *ck = NULL;
  TRY(te_checkpoint_create(&ck));
  int rc = save_into(m, ck, extra, extra_size);
  if (rc == 0) {
    te_status s = te_checkpoint_write(ck, path);
    if (s != TE_SUCCESS) {
      fprintf(stderr, "gpt_save: writing %s: %s: %s\n", path, te_status_string(s),
              te_last_error());
      rc = 1;
    }
  }
  te_checkpoint_destroy(ck);
  return rc;
}

/* Reads byte record `name` of exactly `size` bytes into buf. */
static int get_exact(const te_checkpoint *ck, const char *path, const char *name, void *buf,
                     size_t size) {
  size_t have = 0;
  te_status s = te_checkpoint_get_bytes(ck, name, NULL, 0, &have);
  if (s != TE_SUCCESS) {
    fprintf(stderr, "gpt_load: %s: record %s: %s\n", path, name, te_last_error());
    return 1;
  }
  if (have != size) {
    fprintf(stderr, "gpt_load: %s: record %s has %zu bytes, expected %zu\n", path, name, have,
            size);
    return 1;
  }
  if (buf != NULL) TRY(te_checkpoint_get_bytes(ck, name, buf, size, &have));
  return 0;
}

static int has_record(const te_checkpoint *ck, const char *name) {
  size_t n = 0;
  if (te_checkpoint_count(ck, &n) != TE_SUCCESS) return 0;
  for (size_t i = 0; i < n; ++i) {
    const char *ni = NULL;
    if (te_checkpoint_name(ck, i, &ni) == TE_SUCCESS && strcmp(ni, name) == 0) return 1;
  }
  return 0;
}

/* Everything is checked before anything is written, so a refused checkpoint leaves the model
 * as it was: the file (te_checkpoint_read: magic, version, lengths, CRC), the shape, every
 * record's presence and size, the module states' sizes. */
static int verify(gpt *m, const te_checkpoint *ck, const char *path, size_t extra_size,
                  const module_ref *mods, size_t n_mods) {
  int64_t want[SHAPE_FIELDS], have[SHAPE_FIELDS];
  shape_record(&m->cfg, want);
  TRY_OK(get_exact(ck, path, "gpt.shape", have, sizeof have));
  int bad = 0;
  for (int i = 0; i < SHAPE_FIELDS; ++i)
    if (want[i] != have[i]) {
      if (!bad)
        fprintf(stderr, "gpt_load: %s is a checkpoint of another model shape:\n", path);
      fprintf(stderr, "  %s: checkpoint %lld, this model %lld\n", SHAPE_NAMES[i],
              (long long)have[i], (long long)want[i]);
      bad = 1;
    }
  if (bad) return 1;
  TRY_OK(get_exact(ck, path, "gpt.step", NULL, sizeof(int64_t)));
  uint64_t saved_extra = 0;
  TRY_OK(get_exact(ck, path, "gpt.extra_size", &saved_extra, sizeof saved_extra));
  if (extra_size != 0 && saved_extra != extra_size) {
    fprintf(stderr, "gpt_load: %s holds %llu caller bytes, expected %zu\n", path,
            (unsigned long long)saved_extra, extra_size);
    return 1;
  }
  char name[MAX_NAME + 16];
  const char *prefixes[3] = {"param.", "adam_m.", "adam_v."};
  for (size_t i = 0; i < m->n_params; ++i)
    for (int j = 0; j < 3; ++j) {
      snprintf(name, sizeof name, "%s%s", prefixes[j], m->params[i].name);
      if (!has_record(ck, name)) {
        fprintf(stderr, "gpt_load: %s has no record %s\n", path, name);
        return 1;
      }
    }
  for (size_t i = 0; i < n_mods; ++i)
    if (!has_record(ck, mods[i].name)) {
      fprintf(stderr, "gpt_load: %s has no record %s\n", path, mods[i].name);
      return 1;
    }
  return 0;
}

int gpt_load(gpt *m, const char *path, void *extra, size_t extra_size) {
  if (m == NULL || path == NULL || (extra == NULL && extra_size != 0)) {
    fprintf(stderr, "gpt_load: NULL argument\n");
    return 1;
  }
  te_checkpoint *ck = NULL;
  te_status s = te_checkpoint_read(&ck, path);
  if (s != TE_SUCCESS) {
    fprintf(stderr, "gpt_load: cannot use %s: %s: %s\n", path, te_status_string(s),
            te_last_error());
    return 1;
  }
  module_ref *mods = calloc((size_t)m->cfg.n_layers * 4 + 1, sizeof *mods);
  if (mods == NULL) {
    te_checkpoint_destroy(ck);
    return 1;
  }
  const size_t n_mods = list_modules(m, mods);
  int rc = verify(m, ck, path, extra_size, mods, n_mods);

  /* Apply. The shape matched, so every tensor has this model's dtype and shape. */
  char name[MAX_NAME + 16];
  for (size_t i = 0; rc == 0 && i < m->n_params; ++i) {
    gpt_param_t *p = &m->params[i];
    te_tensor *dst[3] = {&p->master, &p->exp_avg, &p->exp_avg_sq};
    const char *prefixes[3] = {"param.", "adam_m.", "adam_v."};
    for (int j = 0; rc == 0 && j < 3; ++j) {
      snprintf(name, sizeof name, "%s%s", prefixes[j], p->name);
      s = te_checkpoint_get_tensor(ck, m->ctx, name, dst[j]);
      if (s != TE_SUCCESS) {
        fprintf(stderr, "gpt_load: %s: %s: %s\n", path, name, te_last_error());
        rc = 1;
      }
    }
  }
  for (size_t i = 0; rc == 0 && i < n_mods; ++i) {
    size_t size = 0;
    s = te_checkpoint_get_bytes(ck, mods[i].name, NULL, 0, &size);
    void *buf = s == TE_SUCCESS ? malloc(size ? size : 1) : NULL;
    if (buf != NULL) s = te_checkpoint_get_bytes(ck, mods[i].name, buf, size, &size);
    if (buf != NULL && s == TE_SUCCESS) s = module_state_load(m, &mods[i], buf, size);
    if (buf == NULL || s != TE_SUCCESS) {
      fprintf(stderr, "gpt_load: %s: %s: %s\n", path, mods[i].name, te_last_error());
      rc = 1;
    }
    free(buf);
  }
  if (rc == 0) rc = get_exact(ck, path, "gpt.step", &m->steps_done, sizeof m->steps_done);
  if (rc == 0 && extra_size != 0) rc = get_exact(ck, path, "gpt.extra", extra, extra_size);
  if (rc == 0) rc = gpt_refresh_model_weights(m); /* model copies from the masters; re-cast FP8 */
  free(mods);
  te_checkpoint_destroy(ck);
  return rc;
}

/* ---- profiling ------------------------------------------------------------------------------- */

static double prof_start(gpt *m) {
  if (!m->profile) return 0;
  te_context_synchronize(m->ctx); /* what earlier calls queued is not this call's time */
  return prof_now();
}

static void prof_add(gpt *m, const char *call_text, double t0) {
  te_context_synchronize(m->ctx); /* the call's queued work is its time */
  const double seconds = prof_now() - t0;
  size_t len = strcspn(call_text, "(");
  if (len >= sizeof m->prof[0].name) len = sizeof m->prof[0].name - 1;
  int i = 0;
  while (i < m->n_prof && (strncmp(m->prof[i].name, call_text, len) != 0 || m->prof[i].name[len] != '\0'))
    ++i;
  if (i == m->n_prof) {
    if (m->n_prof == (int)(sizeof m->prof / sizeof m->prof[0])) return;
    memcpy(m->prof[i].name, call_text, len);
    m->prof[i].name[len] = '\0';
    m->prof[i].seconds = 0;
    m->prof[i].calls = 0;
    m->n_prof++;
  }
  m->prof[i].seconds += seconds;
  m->prof[i].calls += 1;
}

void gpt_profile(const gpt *m, FILE *out) {
  if (m == NULL || !m->profile || m->n_prof == 0) return;
  double total = 0;
  for (int i = 0; i < m->n_prof; ++i) total += m->prof[i].seconds;
  int order[48];
  for (int i = 0; i < m->n_prof; ++i) order[i] = i;
  for (int i = 1; i < m->n_prof; ++i) /* by time, largest first */
    for (int k = i; k > 0 && m->prof[order[k]].seconds > m->prof[order[k - 1]].seconds; --k) {
      const int t = order[k];
      order[k] = order[k - 1];
      order[k - 1] = t;
    }
  fprintf(out,
          "profile (GPT_PROFILE=1: the stream synchronised around each call; steps %lld..%lld, "
          "evaluation forwards included):\n",
          (long long)m->prof_from + 1, (long long)m->steps_done);
  fprintf(out, "  %-40s %8s %10s %10s %6s\n", "call", "calls", "total ms", "per call", "share");
  for (int r = 0; r < m->n_prof; ++r) {
    const int i = order[r];
    fprintf(out, "  %-40s %8ld %10.2f %10.4f %5.1f%%\n", m->prof[i].name, m->prof[i].calls,
            1e3 * m->prof[i].seconds, 1e3 * m->prof[i].seconds / (double)m->prof[i].calls,
            100.0 * m->prof[i].seconds / total);
  }
}
