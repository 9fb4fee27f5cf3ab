/*
 * gpt_model: a decoder-only GPT built only from libte calls (te/te.h), for train_gpt.c and its
 * tests. Plain C99.
 *
 * The model (pre-norm, as nanoGPT / llm.c, with byte-level tokens):
 *
 *   x = embedding(tokens)                                  te_embedding_forward, table [vocab, d]
 *   per block (n_layers):
 *     qkv = LayerNorm(x) Wqkv^T + bqkv                     te_layernorm_linear, d -> 3d
 *     q, k, v = split(qkv)  [batch, seq, heads, d/heads]   te_split_columns (BSHD views)
 *     q, k = rope(q), rope(k)                              te_rope_forward (GPT-NeoX pairs, base 10000)
 *     a = causal_attention(q, k, v)                        te_attention (CAUSAL)
 *     x = x + a Wproj^T + bproj                            te_linear d -> d, te_add
 *     x = x + fc2(gelu(fc1(LayerNorm(x))))                 te_layernorm_mlp d -> d_ff -> d, te_add
 *   h = LayerNorm(x)                                       te_norm_forward
 *   logits = h Whead^T                                     te_linear d -> vocab (no bias)
 *   loss = mean cross-entropy(logits, targets)             te_cross_entropy (dlogits in place)
 *
 * The LM head is NOT tied to the embedding: an untied head keeps the embedding's table out of
 * the head's GEMM (the table is a gather source in the activation dtype, the head a GEMM weight
 * with an FP8 cache of its own if it ever ran in FP8), and lets each have its own decay rule.
 *
 * FP8 (cfg.fp8 = 1): the blocks run inside an FP8 autocast scope (delayed scaling, HYBRID:
 * E4M3 forward, E5M2 gradients). The final norm and the LM head run in a nested scope with
 * enabled = 0, the usual practice (TE's and others': the logits feed a softmax over the
 * vocabulary, where FP8's few mantissa bits cost the most, and the head is a small share of the
 * FLOPs). Attention itself runs in the activation dtype (te_attention_options.fp8 = 0, TE's
 * fp8_dpa = False default); its q/k/v come from an FP8 GEMM and its output feeds one.
 * cfg.fp8 = 0 runs the very same code with the scope disabled: the baseline.
 *
 * Parameters: fp32 master weights and AdamW moments (te_adamw_step), and the weights the
 * modules are given in the activation dtype. With act_dtype F32 the modules are given the
 * masters themselves; otherwise AdamW writes a BF16/F16 model copy in the same pass
 * (model_weight). Every module weight names its module (owner / owner_kind), so AdamW
 * refreshes the module's FP8 weight cache and the first forward after a step passes
 * weight_unchanged = 1 (nothing is re-cast). Weight decay applies to the matrices (QKV, proj,
 * fc1, fc2, head); not to norms, biases, nor the embedding table (a lookup table: decaying rows
 * of bytes that rarely occur only shrinks them). Gradients are written in the dtype the module
 * writes them: the activation dtype, except the embedding's (te_embedding_backward: F32).
 *
 * Init (GPT-2): weights normal(0, 0.02), the residual projections (proj, fc2) normal(0,
 * 0.02 / sqrt(2 n_layers)), biases 0, norm gammas 1 and betas 0, drawn on the host from
 * splitmix64 + Box-Muller seeded by cfg.seed, in parameter order: the same seed gives the same
 * weights in FP8 and baseline runs, on every backend.
 *
 * Memory: every activation, gradient and parameter buffer is allocated once by gpt_create
 * (te_context_malloc), and so is every module's residual memory: the modules run through the
 * caller-memory calls (te_*_residuals_size at create, te_*_forward_compute_into,
 * te_*_backward_from), so a step allocates nothing, in the library either. A training step
 * talks to the host twice: the batch goes up in one copy (tokens and targets together) and the
 * loss comes back (4 bytes); te_context_copy completes both before returning. Nothing else in
 * the forward, backward or AdamW waits for the device.
 *
 * FP8 weight caches: a forward passes weight_unchanged = 1 only when it is the first forward
 * after gpt_step (whose te_adamw_step re-quantized every module weight); any forward's scope end
 * may move the weight scales, so the next one re-quantizes. A resumed run (which re-quantizes on
 * its first forward) therefore sees exactly what the uninterrupted run saw.
 *
 * Checkpoints (gpt_save / gpt_load, te_checkpoint_*): the config, the master weights, both
 * moments, the step count, every module's FP8 state (te_*_state_save) and the caller's extra
 * bytes. Model-dtype copies are not stored (they are rewritten from the masters). A resumed
 * model continues bit for bit like the uninterrupted one.
 *
 * Every function returns 0 on success; on failure it prints why to stderr (the libte call,
 * te_status_string and te_last_error()) and returns nonzero.
 */
#ifndef GPT_MODEL_H
#define GPT_MODEL_H

#include <te/te.h>

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpt_config {
  int vocab;   /* 256 (bytes) */
  int seq_len; /* tokens per sequence */
  int d_model;
  int n_layers;
  int n_heads; /* d_model / n_heads: a multiple of 8 (attention's head_dim) */
  int d_ff;    /* MLP hidden size (GELU) */
  int batch;   /* sequences per step */
  te_dtype act_dtype; /* F32 (CPU) or BF16 (GPU); F16 works too */
  int fp8;            /* 1: blocks under an FP8 autocast scope (DELAYED, HYBRID); 0: baseline */
  int amax_history_len; /* the FP8 recipe's amax window; 0: 16 (see gpt_model.c) */
  int fp8_recipe;       /* te_recipe_kind: DELAYED (default), CURRENT or BLOCK scaling */
  int fp8_format;       /* te_format: HYBRID (default; BLOCK always E4M3) or E4M3 */
  int fprop_split;      /* -1 (default): the recipe's (fast accumulation in fprop); 0/1 */
  float lr;           /* default learning rate (gpt_step takes one per step) */
  float weight_decay; /* AdamW's decoupled decay, matrices only */
  float max_grad_norm; /* global gradient-norm clip (0: off) */
  float beta1, beta2;
  uint64_t seed;      /* initial weights */
} gpt_config;

/* Fills a small CPU-sized default (every field set); callers override what they need. */
void gpt_config_default(gpt_config *cfg);

typedef struct gpt gpt;

/* Creates the model on ctx's device: modules, parameters (initialised from cfg->seed),
 * optimizer state and every buffer a step needs. cfg is copied. FP8 needs batch*seq_len,
 * d_model and d_ff to be multiples of 16. */
int gpt_create(gpt **out, te_context *ctx, const gpt_config *cfg);
void gpt_destroy(gpt *m); /* NULL: no-op */
const gpt_config *gpt_get_config(const gpt *m);

/* tokens, targets: host int32 [batch * seq_len], token ids in [0, vocab). One forward and
 * backward: the gradients of the mean loss are left in the gradient tensors; *loss = the mean
 * loss (read back to the host: the step's one sync). */
int gpt_forward_backward(gpt *m, const int32_t *tokens, const int32_t *targets, float *loss);
/* Forward only (FP8 under the same scope as training), *loss = the mean loss. */
int gpt_eval_loss(gpt *m, const int32_t *tokens, const int32_t *targets, float *loss);
/* One AdamW step over every parameter with the gradients of the last gpt_forward_backward:
 * `step` is 1-based (bias corrections); lr is this step's learning rate. Refreshes the
 * modules' FP8 weight caches and rewrites the model-dtype weights. */
int gpt_step(gpt *m, float lr, int64_t step);
/* The step number of the last gpt_step (0 after create; restored by gpt_load). */
int64_t gpt_steps_done(const gpt *m);

/* Saves the whole training state and extra_size caller bytes (e.g. a data sampler) to path,
 * atomically. Call it between steps (after gpt_step or an evaluation; gradients are not
 * saved, so not between gpt_forward_backward and gpt_step). */
int gpt_save(const gpt *m, const char *path, const void *extra, size_t extra_size);
/* Loads what gpt_save wrote into a model created with the same shape (vocab, seq_len,
 * d_model, n_layers, n_heads, d_ff, act_dtype, fp8; batch and optimizer settings may differ).
 * extra receives the caller bytes (extra_size must equal the saved size; 0/NULL: ignored).
 * A missing, truncated or corrupted file, or one of another shape, is refused with a message
 * and the model is left unchanged. */
int gpt_load(gpt *m, const char *path, void *extra, size_t extra_size);

/* Number of trainable scalars. */
size_t gpt_num_params(const gpt *m);
/* Number of parameter tensors, and tensor i's name (e.g. "block0.qkv.weight"), fp32 master
 * (on ctx's device) and gradient (activation dtype, F32 for "embedding.weight"). Any output
 * may be NULL. */
size_t gpt_param_count(const gpt *m);
int gpt_param(gpt *m, size_t i, const char **name, te_tensor *master, te_tensor *grad);
/* After the caller edits master weights (tests): rewrite the model-dtype copies and make the
 * next forward re-quantize the FP8 weights. */
int gpt_refresh_model_weights(gpt *m);

/* With GPT_PROFILE=1 in the environment at gpt_create, every libte call of a training step is
 * timed alone (the stream synchronised around it): prints the time per function, largest
 * first. Nothing otherwise. */
void gpt_profile(const gpt *m, FILE *out);

#ifdef __cplusplus
}
#endif

#endif /* GPT_MODEL_H */
