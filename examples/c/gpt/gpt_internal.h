/*
 * gpt_internal.h: what the files of the GPT example's model share and nothing else uses: the
 * model's private structs (struct gpt, its blocks and parameters), the error and profiling
 * macros, and the internal functions one file defines for another. The public API is
 * gpt_model.h; the files:
 *   gpt_model.c       config defaults, gpt_create / gpt_destroy (modules, buffers, views,
 *                     residual memory, RoPE angles)
 *   gpt_tensors.c     tensor views of the model's buffers, device allocation
 *   gpt_params.c      the parameter list, the initial weights, the model-dtype copies, the
 *                     parameter accessors for tests
 *   gpt_step.c        a training step: forward, loss, backward, AdamW
 *   gpt_checkpoint.c  gpt_save / gpt_load
 *   gpt_profile.c     GPT_PROFILE=1: per-call timing and its table
 */
#ifndef GPT_INTERNAL_H
#define GPT_INTERNAL_H

#include "gpt_model.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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

/* ---- profiling (GPT_PROFILE=1, gpt_profile.c) ------------------------------------------------ */

/* With GPT_PROFILE=1 the stream is synchronised around every libte call of a step, so each
 * call's time (GPU work plus host overhead, alone) adds up per function: where a step's time
 * goes. The steps themselves then run slower than without it. */
double gpt_prof_start(gpt *m);
void gpt_prof_add(gpt *m, const char *call_text, double t0);

#define PROFILED(m, call, status)                                                                  \
  do {                                                                                             \
    const double prof_t0_ = gpt_prof_start(m);                                                     \
    status = (call);                                                                               \
    if (prof_t0_ > 0) gpt_prof_add((m), #call, prof_t0_);                                          \
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

/* Parameter idx's tensor as the modules read it (its model-dtype copy); needs a `gpt *m`. */
#define W(idx) (&m->params[(idx)].model)

/* ---- gpt_tensors.c --------------------------------------------------------------------------- */

size_t gpt_dtype_size(te_dtype dt);
te_tensor gpt_tensor_nd(const gpt *m, void *data, te_dtype dt, int ndim, const int64_t *shape);
te_tensor gpt_mat(const gpt *m, void *data, te_dtype dt, int64_t rows, int64_t cols);
te_tensor gpt_vec(const gpt *m, void *data, te_dtype dt, int64_t n);
/* An activation [N, cols] in the activation dtype. */
te_tensor gpt_act(const gpt *m, void *data, int64_t cols);
/* q, k, v and their gradients as attention and RoPE see them: BSHD. */
te_tensor gpt_bshd(const gpt *m, void *data);
int gpt_dev_alloc(gpt *m, size_t bytes, void **out);

/* ---- gpt_params.c ---------------------------------------------------------------------------- */

/* Declares every parameter (name, shape, init, decay, owning module), in parameter order. */
void gpt_declare_params(gpt *m);
/* Allocates each parameter's master, moments, gradient and model copy. */
int gpt_alloc_params(gpt *m);
/* Fills the masters from cfg.seed (one RNG stream in parameter order), zeroes the moments. */
int gpt_init_params(gpt *m);

/* ---- gpt_step.c ------------------------------------------------------------------------------ */

/* te_adamw_step's parameter list, built once at create. */
int gpt_build_adamw_list(gpt *m);

#endif /* GPT_INTERNAL_H */
