/*
 * gpt.gradients: a tiny GPT (2 layers, d_model 32, 2 heads, seq 16, batch 2, vocab 256, F32, no
 * FP8, CPU): the gradient of EVERY parameter tensor, from gpt_forward_backward (libte's module
 * backwards, te_add / te_concat_columns, RoPE, embedding scatter-add), against central finite
 * differences of the loss (gpt_eval_loss, the forward alone), at 8 sampled entries per tensor.
 *
 * The weights are first moved off GPT-2's init (matrices x5, random biases, gammas 1 +- 0.2,
 * betas random), so that no parameter sits at a special point (zero biases, unit gammas) and the
 * gradients are large enough to measure.
 *
 * Tolerance. The loss is an fp32 mean over 32 tokens of ~5.5; its rounding noise between two
 * nearby evaluations is a few ulps of 5.5 (ulp 4.8e-7), so with a step h the finite difference
 * carries noise ~ 4 * 4.8e-7 / (2h) ~ 1e-4 at h = 1e-2, and truncation error h^2 f''' / 6, a few
 * 1e-5 for these smooth functions at h = 1e-2 (the scale of the weights is 0.1..1). So an entry
 * passes when |fd - analytic| <= 3e-4 + 3e-2 |analytic|: 3e-4 is a few times the fp32 noise,
 * and 3% covers the truncation error of the largest gradients. A wrong gradient (a missing
 * term, a wrong sign, a transposed weight) is off by O(|g|) and fails; the test also checks
 * that every tensor has at least one sampled entry with |g| > 1e-3, so it cannot pass on zeros.
 */
#include "gpt_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double ABS_TOL = 3e-4;
static const double REL_TOL = 3e-2;
static const float STEP = 1e-2f;
enum { SAMPLES = 8 };

static uint64_t rng_state = 42;
static uint64_t next_u64(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double uniform(void) { return (double)(next_u64() >> 11) / 9007199254740992.0; }

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep stdout and stderr lines in order */
  te_context_options co;
  te_context *ctx = NULL;
  te_context_options_init(&co);
  co.use_default_device = 0;
  co.device.type = TE_DEVICE_CPU;
  if (te_context_create(&ctx, &co) != TE_SUCCESS) {
    fprintf(stderr, "te_context_create: %s\n", te_last_error());
    return 2;
  }
  gpt_config cfg;
  gpt_config_default(&cfg);
  cfg.vocab = 256;
  cfg.seq_len = 16;
  cfg.d_model = 32;
  cfg.n_layers = 2;
  cfg.n_heads = 2;
  cfg.d_ff = 128;
  cfg.batch = 2;
  cfg.act_dtype = TE_DTYPE_F32;
  cfg.fp8 = 0;
  cfg.seed = 7;
  gpt *m = NULL;
  if (gpt_create(&m, ctx, &cfg)) return 2;

  /* Off the init: see the header comment. The CPU context's tensors are host memory. */
  for (size_t i = 0; i < gpt_param_count(m); ++i) {
    const char *name;
    te_tensor w;
    gpt_param(m, i, &name, &w, NULL);
    float *p = w.data;
    const int64_t n = te_tensor_numel(&w);
    for (int64_t j = 0; j < n; ++j) {
      const double u = uniform() * 2.0 - 1.0;
      if (w.ndim == 2) p[j] *= 5.0f;
      else if (strstr(name, "ln") != NULL || strstr(name, "norm") != NULL)
        p[j] = ends_with(name, ".weight") ? (float)(1.0 + 0.2 * u) : (float)(0.2 * u);
      else p[j] = (float)(0.1 * u);
    }
  }
  if (gpt_refresh_model_weights(m)) return 2;

  const int n = cfg.batch * cfg.seq_len;
  int32_t tokens[32], targets[32];
  for (int t = 0; t < n; ++t) {
    tokens[t] = (int32_t)(next_u64() % 256);
    targets[t] = (int32_t)(next_u64() % 256);
  }
  float loss0;
  if (gpt_forward_backward(m, tokens, targets, &loss0)) return 2;
  printf("tiny GPT: %zu tensors, %zu parameters, loss %.5f\n", gpt_param_count(m),
         gpt_num_params(m), loss0);

  int failures = 0;
  double worst_excess = 0.0;
  for (size_t i = 0; i < gpt_param_count(m); ++i) {
    const char *name;
    te_tensor w, g;
    gpt_param(m, i, &name, &w, &g);
    float *p = w.data;
    const float *grad = g.data; /* F32 model: every gradient is F32 */
    const int64_t count = te_tensor_numel(&w);
    double max_g = 0.0, max_err = 0.0;
    int tensor_fail = 0;
    for (int s = 0; s < SAMPLES; ++s) {
      int64_t j = (int64_t)(next_u64() % (uint64_t)count);
      if (strcmp(name, "embedding.weight") == 0 && s % 2 == 0) /* a row that the batch uses */
        j = (int64_t)tokens[next_u64() % (uint64_t)n] * cfg.d_model + (j % cfg.d_model);
      const float orig = p[j];
      float lp, lm;
      p[j] = orig + STEP;
      if (gpt_refresh_model_weights(m) || gpt_eval_loss(m, tokens, targets, &lp)) return 2;
      p[j] = orig - STEP;
      if (gpt_refresh_model_weights(m) || gpt_eval_loss(m, tokens, targets, &lm)) return 2;
      p[j] = orig;
      if (gpt_refresh_model_weights(m)) return 2;
      /* the step actually taken, in fp32 */
      const double h2 = (double)(orig + STEP) - (double)(orig - STEP);
      const double fd = ((double)lp - (double)lm) / h2;
      const double an = grad[j];
      const double err = fabs(fd - an), bound = ABS_TOL + REL_TOL * fabs(an);
      if (fabs(an) > max_g) max_g = fabs(an);
      if (err > max_err) max_err = err;
      if (err - bound > worst_excess) worst_excess = err - bound;
      if (!(err <= bound)) {
        printf("  FAIL %s[%lld]: analytic %.6g, finite difference %.6g (|diff| %.3g > %.3g)\n",
               name, (long long)j, an, fd, err, bound);
        tensor_fail = 1;
      }
    }
    if (!(max_g > 1e-3)) {
      printf("  FAIL %s: every sampled gradient is below 1e-3 (max %.3g): nothing measured\n",
             name, max_g);
      tensor_fail = 1;
    }
    printf("%-4s %-22s max |grad| %.3e  max |fd - grad| %.3e\n", tensor_fail ? "FAIL" : "ok",
           name, max_g, max_err);
    failures += tensor_fail;
  }
  gpt_destroy(m);
  te_context_destroy(ctx);
  if (failures) {
    printf("gpt.gradients: %d tensors FAILED\n", failures);
    return 1;
  }
  printf("gpt.gradients: every parameter tensor's gradient matches central differences "
         "(%d samples each, |diff| <= %.0e + %.0e |g|)\n",
         SAMPLES, ABS_TOL, REL_TOL);
  return 0;
}
