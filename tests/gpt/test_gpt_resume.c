/*
 * gpt.resume: checkpoint and resume of the whole training state, FP8 and high precision, with
 * F32 and with BF16 activations (CPU).
 *   1. Model A trains N steps (with an evaluation between steps, as train_gpt does: an FP8
 *      evaluation moves the scaling states too), saves (gpt_save, the data sampler as the
 *      caller's bytes), trains M more steps.
 *   2. Model B, created fresh from another seed, loads the checkpoint and trains M steps with
 *      the sampler it got back. Its M losses and every master weight afterwards must be
 *      bit-identical to A's.
 *   3. Refusals, each with B's masters unchanged afterwards: the checkpoint with one byte
 *      flipped (the CRC), the checkpoint truncated, a missing file, a checkpoint of another
 *      shape (d_model 48), and the other precision's checkpoint (fp8 flag differs).
 */
#define _POSIX_C_SOURCE 200809L
#include "gpt_data.h"
#include "gpt_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { N_FIRST = 6, M_MORE = 5 };

static int failures = 0;
static void check(int cond, const char *what) {
  printf("%s %s\n", cond ? "ok  " : "FAIL", what);
  if (!cond) ++failures;
}

static te_dtype act_dtype = TE_DTYPE_F32;

static gpt_config tiny(int fp8, uint64_t seed) {
  gpt_config c;
  gpt_config_default(&c);
  c.seq_len = 16;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_ff = 128;
  c.batch = 2;
  c.act_dtype = act_dtype;
  c.fp8 = fp8;
  c.seed = seed;
  return c;
}

static int train_steps(gpt *m, gpt_sampler *s, const gpt_text *text, int count, float *losses) {
  const gpt_config *c = gpt_get_config(m);
  int32_t tokens[64], targets[64];
  for (int i = 0; i < count; ++i) {
    gpt_sample_batch(s, text, 0, c->batch, c->seq_len, tokens, targets);
    const int64_t step = gpt_steps_done(m) + 1;
    if (gpt_forward_backward(m, tokens, targets, &losses[i]) || gpt_step(m, 2e-3f, step))
      return 1;
    if (step % 3 == 0) { /* an evaluation between steps, as the driver does */
      float val;
      gpt_sample_batch(s, text, 1, c->batch, c->seq_len, tokens, targets);
      if (gpt_eval_loss(m, tokens, targets, &val)) return 1;
    }
  }
  return 0;
}

/* All master weights, concatenated (host copies). */
static float *snapshot(gpt *m, te_context *ctx) {
  float *out = malloc(gpt_num_params(m) * sizeof(float));
  size_t off = 0;
  for (size_t i = 0; out && i < gpt_param_count(m); ++i) {
    te_tensor w;
    gpt_param(m, i, NULL, &w, NULL);
    const size_t n = (size_t)te_tensor_numel(&w);
    te_context_copy(ctx, out + off, w.data, n * sizeof(float), TE_COPY_DEVICE_TO_HOST);
    off += n;
  }
  return out;
}

static int write_file(const char *path, const unsigned char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return 1;
  const size_t w = fwrite(data, 1, n, f);
  return (fclose(f) != 0 || w != n);
}

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)size);
  if (buf && fread(buf, 1, (size_t)size, f) != (size_t)size) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *n = (size_t)size;
  return buf;
}

static int run(te_context *ctx, const gpt_text *text, int fp8, const char *dir) {
  const char *tag = act_dtype == TE_DTYPE_BF16 ? (fp8 ? "fp8_bf16" : "bf16") : (fp8 ? "fp8" : "fp32");
  char path[512], bad[512], other[512], prec[512];
  snprintf(path, sizeof path, "%s/resume_%s.ckpt", dir, tag);
  snprintf(bad, sizeof bad, "%s/resume_%s_bad.ckpt", dir, tag);
  snprintf(other, sizeof other, "%s/resume_%s_other.ckpt", dir, tag);
  snprintf(prec, sizeof prec, "%s/resume_%s_prec.ckpt", dir, tag);
  printf("-- %s --\n", tag);

  gpt_config ca = tiny(fp8, 5);
  gpt *a = NULL, *b = NULL;
  if (gpt_create(&a, ctx, &ca)) return 1;
  gpt_sampler sa;
  gpt_sampler_init(&sa, 99);
  float first[N_FIRST], la[M_MORE], lb[M_MORE];
  if (train_steps(a, &sa, text, N_FIRST, first)) return 1;
  if (gpt_save(a, path, &sa, sizeof sa)) return 1;
  if (train_steps(a, &sa, text, M_MORE, la)) return 1;
  float *wa = snapshot(a, ctx);

  gpt_config cb = tiny(fp8, 6); /* another seed: everything must come from the checkpoint */
  if (gpt_create(&b, ctx, &cb)) return 1;
  gpt_sampler sb;
  gpt_sampler_init(&sb, 1);
  if (gpt_load(b, path, &sb, sizeof sb)) return 1;
  check(gpt_steps_done(b) == N_FIRST, "the step count is restored");
  check(sb.state != 1, "the caller's bytes (the sampler) are restored");
  if (train_steps(b, &sb, text, M_MORE, lb)) return 1;
  float *wb = snapshot(b, ctx);
  const size_t np = gpt_num_params(a);
  check(memcmp(la, lb, sizeof la) == 0, "the resumed run's losses are bit-identical");
  check(memcmp(wa, wb, np * sizeof(float)) == 0,
        "every master weight after the resumed steps is bit-identical");
  printf("     losses after the checkpoint: ");
  for (int i = 0; i < M_MORE; ++i) printf("%.6f%s", la[i], i + 1 < M_MORE ? " " : "\n");

  /* Refusals: B must be unchanged by each. */
  size_t n = 0;
  unsigned char *bytes = read_file(path, &n);
  if (bytes == NULL || n < 64) return 1;
  bytes[n / 2] ^= 0x10;
  write_file(bad, bytes, n);
  printf("     (expect refusal messages below)\n");
  check(gpt_load(b, bad, &sb, sizeof sb) != 0, "a checkpoint with one byte flipped is refused");
  bytes[n / 2] ^= 0x10;
  write_file(bad, bytes, n - 7);
  check(gpt_load(b, bad, &sb, sizeof sb) != 0, "a truncated checkpoint is refused");
  check(gpt_load(b, "/nonexistent/gpt.ckpt", &sb, sizeof sb) != 0, "a missing file is refused");
  free(bytes);

  gpt_config cc = tiny(fp8, 5);
  cc.d_model = 48;
  cc.d_ff = 192;
  gpt *c = NULL;
  if (gpt_create(&c, ctx, &cc)) return 1;
  if (gpt_save(c, other, &sb, sizeof sb)) return 1;
  check(gpt_load(b, other, &sb, sizeof sb) != 0, "a checkpoint of another shape is refused");
  gpt_destroy(c);

  gpt_config cd = tiny(!fp8, 5);
  gpt *d = NULL;
  if (gpt_create(&d, ctx, &cd)) return 1;
  if (gpt_save(d, prec, &sb, sizeof sb)) return 1;
  check(gpt_load(b, prec, &sb, sizeof sb) != 0,
        "a checkpoint of the other precision (fp8 flag) is refused");
  gpt_destroy(d);

  float *wb2 = snapshot(b, ctx);
  check(memcmp(wb, wb2, np * sizeof(float)) == 0 && gpt_steps_done(b) == N_FIRST + M_MORE,
        "the refused loads left the model unchanged");
  remove(path);
  remove(bad);
  remove(other);
  remove(prec);
  free(wa);
  free(wb);
  free(wb2);
  gpt_destroy(a);
  gpt_destroy(b);
  return 0;
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
  /* A small fixed text: what matters here is determinism, not what is learnt. */
  static uint8_t buf[4096];
  for (size_t i = 0; i < sizeof buf; ++i)
    buf[i] = (uint8_t)("the quick brown fox jumps over the lazy dog; "[i % 45] + (i / 997) % 3);
  gpt_text text = {buf, sizeof buf, sizeof buf - 512};

  const char *tmp = getenv("TMPDIR");
  char dir[256];
  snprintf(dir, sizeof dir, "%s/gpt_resume_%ld", tmp ? tmp : "/tmp", (long)getpid());
  if (mkdir(dir, 0700) != 0) {
    perror(dir);
    return 2;
  }

  int err = run(ctx, &text, 1, dir) || run(ctx, &text, 0, dir);
  /* BF16 activations: AdamW writes the model copies; a load rewrites them from the masters. */
  act_dtype = TE_DTYPE_BF16;
  err = err || run(ctx, &text, 1, dir) || run(ctx, &text, 0, dir);
  rmdir(dir);
  te_context_destroy(ctx);
  if (err) {
    printf("gpt.resume: an unexpected failure (above)\n");
    return 2;
  }
  printf("gpt.resume: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
