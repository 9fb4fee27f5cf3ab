/*
 * train_gpt: train a byte-level GPT in FP8 with libte, beside a high-precision baseline.
 *
 *   model   pre-norm GPT from libte modules (gpt/gpt_model.h): embedding, per block
 *           LayerNormLinear (QKV) -> RoPE -> causal attention -> Linear (proj) + residual,
 *           LayerNormMLP (GELU) + residual; final LayerNorm; untied LM head; cross-entropy
 *   data    real text, bytes as tokens (gpt/gpt_data.h: the Python standard library's sources
 *           by default, or --data PATH); the last 10% held out for validation
 *   optim   AdamW (te_adamw_step) on fp32 master weights, warmup then cosine decay
 *
 * Two runs from the same initial weights over the same batches: "fp8" (the blocks inside an FP8
 * autocast scope: delayed scaling; HYBRID on the CPU preset, E4M3 on the GPU one) and "baseline" (the same code with the scope
 * disabled: FP32 activations on the CPU, BF16 on the GPU). Progress lines, a CSV of both
 * curves, a PNG plot (scripts/plot_loss.py), and a last line comparing the final validation
 * losses: exit 0 when FP8 is within 2% of the baseline, 1 when not, 2 on an error.
 *
 * Only the public header te/te.h is used. Plain C99 (+ POSIX clock_gettime).
 */
#define _POSIX_C_SOURCE 200809L
#include <te/te.h>

#include "gpt_data.h"
#include "gpt_model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#ifndef GPT_PLOT_SCRIPT
#define GPT_PLOT_SCRIPT "scripts/plot_loss.py"
#endif

/* FP8's final validation loss must be within this relative distance of the baseline's. */
static const double FP8_TOLERANCE = 0.02;

typedef struct options {
  const char *preset;  /* "cpu" | "gpu" | NULL (the device's) */
  const char *device;  /* "cpu" | "cuda" | "auto" */
  const char *dtype;   /* "f32" | "bf16" | NULL (the device's: F32 on the CPU, BF16 on the GPU) */
  gpt_config cfg;      /* act_dtype and fp8 set per run */
  int steps, eval_every, eval_batches, warmup, save_every;
  int stop_after; /* 0: train to `steps`; else stop (and save) after this step */
  float lr, min_lr_ratio;
  uint64_t seed;
  size_t max_bytes;
  const char *csv, *plot, *data, *only, *save, *resume;
  int no_plot;
  /* which fields the command line set (they override the preset) */
  int set_seq, set_d, set_layers, set_heads, set_dff, set_batch, set_kind, set_format, set_split, set_hist, set_steps, set_lr, set_eval,
      set_eval_batches, set_warmup, set_max_bytes, set_save_every, set_stop_after;
} options;

static void usage(FILE *f, const char *argv0) {
  fprintf(f,
          "Usage: %s [options]\n"
          "\n"
          "Trains a byte-level GPT (libte modules, plain C) twice from the same initial weights\n"
          "over the same batches: in FP8 (delayed scaling by default) and as a high-precision\n"
          "baseline (FP32 on the CPU, BF16 on the GPU); prints progress, writes a CSV and a PNG\n"
          "of both loss curves, and compares the final validation losses.\n"
          "\n"
          "  --preset cpu|gpu     sizes (default: the device's). cpu: d_model 64, 3 layers,\n"
          "                       4 heads, seq 64, batch 16, 300 steps (the README demo: both\n"
          "                       runs within 2 minutes on 2 idle cores); gpu: d_model 2048,\n"
          "                       8 layers, 16 heads, seq 1024, batch 8, 300 steps, lr 2e-4\n"
          "  --device cpu|cuda|auto  where to run (default auto: CUDA when usable)\n"
          "  --dtype f32|bf16     activation dtype of both runs (default: f32 on the CPU, bf16\n"
          "                       on the GPU); the master weights are fp32 either way\n"
          "  --seq-len N  --d-model N  --layers N  --heads N  --d-ff N  --batch N\n"
          "                       override the preset's shape (d_ff default 4 d_model)\n"
          "  --steps N            training steps per run\n"
          "  --lr X               peak learning rate (warmup, then cosine decay to 10%%)\n"
          "  --warmup N           warmup steps\n"
          "  --seed N             initial weights and data order (default 1)\n"
          "  --eval-every N       a validation pass and a progress line every N steps\n"
          "  --eval-batches N     held-out batches per validation pass\n"
          "  --data PATH          a text file or a directory of files instead of the Python\n"
          "                       standard library's sources\n"
          "  --max-bytes N        read at most N bytes of text (0: all)\n"
          "  --recipe delayed|current|block  the FP8 recipe (default delayed)\n"
          "  --format hybrid|e4m3 FP8 formats: E4M3 forward + E5M2 gradients (the cpu preset's),\n"
          "                       or E4M3 everywhere (the gpu preset's; block scaling: always)\n"
          "  --amax-history N     delayed scaling's amax window (default 16)\n"
          "  --fprop-split 0|1    split accumulation in the forward GEMMs (default 0: the\n"
          "                       recipe's fast accumulation)\n"
          "  --only fp8|baseline  run one of the two\n"
          "  --csv PATH           loss curves (default train_gpt_loss.csv)\n"
          "  --plot PATH          PNG of the curves (default train_gpt_loss.png)\n"
          "  --no-plot            skip the PNG\n"
          "  --save PATH          write each run's training state to PATH.fp8 / PATH.baseline at\n"
          "                       its end\n"
          "  --save-every N       ...and every N steps (after that step's evaluation, if any)\n"
          "  --stop-after N       stop each run after step N of the --steps schedule (saving it\n"
          "                       with --save): a job cut in pieces, continued with --resume\n"
          "  --resume PATH        continue each run from PATH.fp8 / PATH.baseline\n"
          "  -h, --help           this text\n"
          "\n"
          "GPT_PROFILE=1 in the environment times every libte call of a step alone (the stream\n"
          "synchronised around each) and prints where a step's time goes.\n"
          "\n"
          "Exit status: 0 when FP8's final validation loss is within 2%% of the baseline's (or one\n"
          "run was asked for and it finished), 1 when not, 2 on an error.\n",
          argv0);
}

static void set_preset(options *o, const char *preset) {
  gpt_config *c = &o->cfg;
  if (strcmp(preset, "gpu") == 0) {
    c->seq_len = 1024;
    c->d_model = 2048;
    c->n_layers = 8;
    c->n_heads = 16;
    c->batch = 8;
    o->steps = 300;
    /* Measured on an H100 (bench/RESULTS.md): lr 4e-4 with 30 warmup steps spiked early and
     * ended ~0.2 higher for both runs, and the FP8-baseline gap then swung by +-3% from seed to
     * seed; 2e-4 with 100 warmup steps is calmer. E4M3 everywhere stayed within 2% on both
     * seeds measured, HYBRID (E5M2 gradients) ended 0.9% and 2.2% below the baseline. */
    o->lr = 2e-4f;
    o->warmup = 100;
    c->fp8_format = TE_FORMAT_E4M3;
    o->eval_every = 25;
    o->eval_batches = 4;
    o->max_bytes = 0;
  } else {
    /* Sized so that both runs, evaluations included, finish in about two minutes on 2 cores. */
    c->seq_len = 64;
    c->d_model = 64;
    c->n_layers = 3;
    c->n_heads = 4;
    c->batch = 16;
    o->steps = 300;
    o->lr = 3e-3f;
    o->warmup = 20;
    c->fp8_format = TE_FORMAT_HYBRID;
    o->eval_every = 25;
    o->eval_batches = 6;
    o->max_bytes = 0;
  }
  c->d_ff = 4 * c->d_model;
}

/* ---- argument parsing ---------------------------------------------------------------------- */

static int parse_long(const char *s, long lo, long hi, long *out) {
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return 1;
  *out = v;
  return 0;
}

static int parse_args(options *o, int argc, char **argv, int *help) {
  memset(o, 0, sizeof *o);
  gpt_config_default(&o->cfg);
  o->device = "auto";
  o->seed = 1;
  o->csv = "train_gpt_loss.csv";
  o->plot = "train_gpt_loss.png";
  o->min_lr_ratio = 0.1f;
  long v;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      *help = 1;
      return 0;
    }
    if (strcmp(a, "--no-plot") == 0) {
      o->no_plot = 1;
      continue;
    }
    if (strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], a);
      return 1;
    }
    static const char *const value_flags[] = {
        "--preset", "--device", "--dtype", "--seq-len", "--d-model", "--layers", "--heads", "--d-ff",
        "--batch", "--steps", "--warmup", "--eval-every", "--eval-batches", "--save-every",
        "--stop-after", "--max-bytes", "--lr", "--seed", "--csv", "--plot", "--data", "--only", "--save",
        "--resume", "--recipe", "--format", "--fprop-split", "--amax-history"};
    int known = 0;
    for (size_t k = 0; k < sizeof value_flags / sizeof value_flags[0]; ++k)
      known |= strcmp(a, value_flags[k]) == 0;
    if (!known) {
      fprintf(stderr, "%s: unknown option '%s'\n", argv[0], a);
      return 1;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "%s: %s needs a value\n", argv[0], a);
      return 1;
    }
    const char *val = argv[++i];
    int bad = 0;
#define INT_FLAG(flag, lo, hi, dst, setflag)                                                       \
  else if (strcmp(a, flag) == 0) {                                                                 \
    bad = parse_long(val, lo, hi, &v);                                                             \
    if (!bad) {                                                                                    \
      dst = (int)v;                                                                                \
      o->setflag = 1;                                                                              \
    }                                                                                              \
  }
    if (strcmp(a, "--preset") == 0) {
      bad = strcmp(val, "cpu") != 0 && strcmp(val, "gpu") != 0;
      o->preset = val;
    } else if (strcmp(a, "--dtype") == 0) {
      bad = strcmp(val, "f32") != 0 && strcmp(val, "bf16") != 0;
      o->dtype = val;
    } else if (strcmp(a, "--device") == 0) {
      bad = strcmp(val, "cpu") != 0 && strcmp(val, "cuda") != 0 && strcmp(val, "auto") != 0;
      o->device = val;
    }
    else if (strcmp(a, "--recipe") == 0) {
      bad = strcmp(val, "delayed") != 0 && strcmp(val, "current") != 0 && strcmp(val, "block") != 0;
      o->cfg.fp8_recipe = val[0] == 'd' ? TE_RECIPE_DELAYED_SCALING
                          : val[0] == 'c' ? TE_RECIPE_CURRENT_SCALING
                                          : TE_RECIPE_BLOCK_SCALING;
      o->set_kind = 1;
    } else if (strcmp(a, "--format") == 0) {
      bad = strcmp(val, "hybrid") != 0 && strcmp(val, "e4m3") != 0;
      o->cfg.fp8_format = strcmp(val, "e4m3") == 0 ? TE_FORMAT_E4M3 : TE_FORMAT_HYBRID;
      o->set_format = 1;
    }
    INT_FLAG("--fprop-split", 0, 1, o->cfg.fprop_split, set_split)
    INT_FLAG("--amax-history", 1, 65536, o->cfg.amax_history_len, set_hist)
    INT_FLAG("--seq-len", 1, 1 << 20, o->cfg.seq_len, set_seq)
    INT_FLAG("--d-model", 8, 1 << 16, o->cfg.d_model, set_d)
    INT_FLAG("--layers", 1, 1024, o->cfg.n_layers, set_layers)
    INT_FLAG("--heads", 1, 1024, o->cfg.n_heads, set_heads)
    INT_FLAG("--d-ff", 1, 1 << 20, o->cfg.d_ff, set_dff)
    INT_FLAG("--batch", 1, 1 << 20, o->cfg.batch, set_batch)
    INT_FLAG("--steps", 1, 1 << 30, o->steps, set_steps)
    INT_FLAG("--warmup", 0, 1 << 30, o->warmup, set_warmup)
    INT_FLAG("--eval-every", 1, 1 << 30, o->eval_every, set_eval)
    INT_FLAG("--eval-batches", 1, 1 << 20, o->eval_batches, set_eval_batches)
    INT_FLAG("--save-every", 0, 1 << 30, o->save_every, set_save_every)
    INT_FLAG("--stop-after", 1, 1 << 30, o->stop_after, set_stop_after)
    else if (strcmp(a, "--max-bytes") == 0) {
      char *end = NULL;
      unsigned long long mb = strtoull(val, &end, 10);
      bad = end == val || *end != '\0';
      o->max_bytes = (size_t)mb;
      o->set_max_bytes = 1;
    } else if (strcmp(a, "--lr") == 0) {
      char *end = NULL;
      double x = strtod(val, &end);
      bad = end == val || *end != '\0' || !(x > 0 && x < 10);
      o->lr = (float)x;
      o->set_lr = 1;
    } else if (strcmp(a, "--seed") == 0) {
      char *end = NULL;
      unsigned long long s = strtoull(val, &end, 10);
      bad = end == val || *end != '\0';
      o->seed = s;
    } else if (strcmp(a, "--csv") == 0) {
      o->csv = val;
    } else if (strcmp(a, "--plot") == 0) {
      o->plot = val;
    } else if (strcmp(a, "--data") == 0) {
      o->data = val;
    } else if (strcmp(a, "--only") == 0) {
      bad = strcmp(val, "fp8") != 0 && strcmp(val, "baseline") != 0;
      o->only = val;
    } else if (strcmp(a, "--save") == 0) {
      o->save = val;
    } else if (strcmp(a, "--resume") == 0) {
      o->resume = val;
    } else {
      fprintf(stderr, "%s: unknown option '%s'\n", argv[0], a);
      return 1;
    }
#undef INT_FLAG
    if (bad) {
      fprintf(stderr, "%s: bad value for %s: '%s'\n", argv[0], a, val);
      return 1;
    }
  }
  return 0;
}

/* The preset's values, then the command line's (parse_args stored both: re-apply the latter). */
static void resolve(options *o, const options *cl, te_device_type dev) {
  const char *preset = cl->preset ? cl->preset : (dev == TE_DEVICE_CUDA ? "gpu" : "cpu");
  *o = *cl;
  o->preset = preset;
  set_preset(o, preset);
  if (cl->set_seq) o->cfg.seq_len = cl->cfg.seq_len;
  if (cl->set_d) {
    o->cfg.d_model = cl->cfg.d_model;
    o->cfg.d_ff = 4 * cl->cfg.d_model;
  }
  if (cl->set_layers) o->cfg.n_layers = cl->cfg.n_layers;
  if (cl->set_heads) o->cfg.n_heads = cl->cfg.n_heads;
  if (cl->set_dff) o->cfg.d_ff = cl->cfg.d_ff;
  if (cl->set_batch) o->cfg.batch = cl->cfg.batch;
  if (cl->set_kind) o->cfg.fp8_recipe = cl->cfg.fp8_recipe;
  if (cl->set_format) o->cfg.fp8_format = cl->cfg.fp8_format;
  if (cl->set_split) o->cfg.fprop_split = cl->cfg.fprop_split;
  if (cl->set_hist) o->cfg.amax_history_len = cl->cfg.amax_history_len;
  if (cl->set_steps) o->steps = cl->steps;
  if (cl->set_lr) o->lr = cl->lr;
  if (cl->set_warmup) o->warmup = cl->warmup;
  if (cl->set_eval) o->eval_every = cl->eval_every;
  if (cl->set_eval_batches) o->eval_batches = cl->eval_batches;
  if (cl->set_max_bytes) o->max_bytes = cl->max_bytes;
  o->save_every = cl->save_every;
  o->stop_after = cl->stop_after;
  o->cfg.seed = o->seed;
  o->cfg.lr = o->lr;
}

/* ---- the runs -------------------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Linear warmup to the peak, then cosine decay to min_lr_ratio * peak at the last step. */
static float lr_at(const options *o, int64_t step) {
  if (o->warmup > 0 && step <= o->warmup) return o->lr * (float)step / (float)o->warmup;
  const double span = (double)(o->steps - o->warmup);
  const double t = span > 0 ? (double)(step - o->warmup) / span : 1.0;
  const double cosine = 0.5 * (1.0 + cos(3.141592653589793 * (t > 1 ? 1 : t)));
  return (float)(o->lr * (o->min_lr_ratio + (1.0 - o->min_lr_ratio) * cosine));
}

typedef struct val_set {
  int n;
  int32_t *tokens, *targets; /* [n][batch * seq] */
} val_set;

static int evaluate(gpt *m, const val_set *vs, size_t per, double *out) {
  double sum = 0.0;
  for (int i = 0; i < vs->n; ++i) {
    float loss;
    if (gpt_eval_loss(m, vs->tokens + (size_t)i * per, vs->targets + (size_t)i * per, &loss))
      return 1;
    sum += loss;
  }
  *out = sum / vs->n;
  return 0;
}

static void fmt_eta(char *buf, size_t n, double s) {
  if (!(s >= 0) || s > 360000) s = 0;
  const long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static char *ckpt_path(const char *base, const char *run) {
  size_t n = strlen(base) + strlen(run) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s.%s", base, run);
  return p;
}

/* One run; appends its rows to csv; *final_val = the validation loss after the last step. */
static int run_one(te_context *ctx, const options *o, const char *run, int fp8, te_dtype hp,
                   const gpt_text *text, const val_set *vs, FILE *csv, double *final_val,
                   double *tok_s_mean) {
  gpt_config cfg = o->cfg;
  cfg.fp8 = fp8;
  cfg.act_dtype = hp;
  gpt *m = NULL;
  if (gpt_create(&m, ctx, &cfg)) return 2;
  printf("[%s] %zu parameters\n", run, gpt_num_params(m));
  const size_t per = (size_t)cfg.batch * (size_t)cfg.seq_len;
  int32_t *tokens = malloc(per * sizeof(int32_t)), *targets = malloc(per * sizeof(int32_t));
  if (tokens == NULL || targets == NULL) {
    fprintf(stderr, "out of memory\n");
    free(tokens);
    free(targets);
    gpt_destroy(m);
    return 2;
  }
  gpt_sampler sampler;
  gpt_sampler_init(&sampler, o->seed * 0x9E3779B97F4A7C15ull + 17); /* same batches in both runs */
  int rc = 0;
  int64_t start = 0;
  if (o->resume) {
    char *path = ckpt_path(o->resume, run);
    if (path == NULL || gpt_load(m, path, &sampler, sizeof sampler)) rc = 2;
    else {
      start = gpt_steps_done(m);
      printf("[%s] resumed from %s at step %lld\n", run, path, (long long)start);
    }
    free(path);
  }

  double t_run = now_s(), train_time = 0.0, window_loss = 0.0, window_time = 0.0;
  int window_n = 0;
  int64_t tokens_done = 0;
  double val = NAN, last_val = NAN;
  const int64_t last = o->stop_after > 0 && o->stop_after < o->steps ? o->stop_after : o->steps;
  for (int64_t step = start + 1; rc == 0 && step <= last; ++step) {
    gpt_sample_batch(&sampler, text, 0, cfg.batch, cfg.seq_len, tokens, targets);
    const double t0 = now_s();
    float loss;
    if (gpt_forward_backward(m, tokens, targets, &loss) || gpt_step(m, lr_at(o, step), step)) {
      rc = 2;
      break;
    }
    const double dt = now_s() - t0;
    train_time += dt;
    window_time += dt;
    window_loss += loss;
    ++window_n;
    tokens_done += (int64_t)per;
    const double tps = dt > 0 ? (double)per / dt : 0.0;
    if (!isfinite(loss)) {
      fprintf(stderr, "[%s] step %lld: the loss is %g; stopping this run\n", run,
              (long long)step, loss);
      rc = 1;
      last_val = NAN;
      break;
    }
    const int eval_now = step % o->eval_every == 0 || step == o->steps;
    val = NAN;
    if (eval_now && evaluate(m, vs, per, &val)) {
      rc = 2;
      break;
    }
    /* Saved after the evaluation (an FP8 evaluation updates the scaling states too), so the
     * resumed run goes on exactly from here. */
    if (eval_now) last_val = val;
    if (o->save && ((o->save_every > 0 && step % o->save_every == 0) || step == last)) {
      char *path = ckpt_path(o->save, run);
      if (path == NULL || gpt_save(m, path, &sampler, sizeof sampler)) rc = 2;
      else if (step == last) printf("[%s] training state saved to %s\n", run, path);
      free(path);
      if (rc) break;
    }
    if (csv) {
      fprintf(csv, "%s,%lld,%.6f,", run, (long long)step, loss);
      if (eval_now) fprintf(csv, "%.6f", val);
      fprintf(csv, ",%.1f\n", tps);
    }
    if (eval_now) {
      const double elapsed = now_s() - t_run;
      const double per_step = elapsed / (double)(step - start);
      char eta[32];
      fmt_eta(eta, sizeof eta, per_step * (double)(o->steps - step));
      const double wtps = window_time > 0 ? (double)per * window_n / window_time : 0.0;
      printf("[%s] step %lld/%d  train %.3f  val %.3f  %.1fk tok/s  ETA %s\n", run,
             (long long)step, o->steps, window_loss / window_n, val, wtps / 1000.0, eta);
      fflush(stdout);
      window_loss = window_time = 0.0;
      window_n = 0;
    }
  }
  if (rc == 0 && start >= last) { /* nothing left to train: just evaluate */
    if (evaluate(m, vs, per, &last_val)) rc = 2;
    else printf("[%s] already at step %lld: val %.3f\n", run, (long long)start, last_val);
  } else if (rc == 0 && last < o->steps) {
    printf("[%s] stopped after step %lld of %d (--stop-after)\n", run, (long long)last,
           o->steps);
  }
  val = last_val;
  if (rc == 1) *final_val = NAN; /* diverged: the comparison fails */
  if (rc == 0) {
    *final_val = val;
    *tok_s_mean = train_time > 0 ? (double)tokens_done / train_time : 0.0;
    printf("[%s] done in %.1f s: final val loss %.4f, %.1fk tok/s (training steps only)\n", run,
           now_s() - t_run, val, *tok_s_mean / 1000.0);
  }
  gpt_profile(m, stdout); /* GPT_PROFILE=1 only */
  free(tokens);
  free(targets);
  gpt_destroy(m);
  return rc;
}

static int file_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Runs scripts/plot_loss.py CSV PNG if the script is there; a failure is reported, not fatal. */
static void plot(const char *csv, const char *png) {
  const char *script = file_exists("scripts/plot_loss.py") ? "scripts/plot_loss.py"
                       : file_exists(GPT_PLOT_SCRIPT)    ? GPT_PLOT_SCRIPT
                                                         : NULL;
  if (script == NULL) {
    printf("note: no plot (scripts/plot_loss.py not found); the CSV has the curves\n");
    return;
  }
  if (strchr(csv, '\'') || strchr(png, '\'') || strchr(script, '\'')) {
    printf("note: no plot (a path holds a quote)\n");
    return;
  }
  size_t n = strlen(script) + strlen(csv) + strlen(png) + 64;
  char *cmd = malloc(n);
  if (cmd == NULL) return;
  /* the script names the file it wrote: said once, below */
  snprintf(cmd, n, "python3 '%s' '%s' '%s' >/dev/null", script, csv, png);
  fflush(stdout);
  int st = system(cmd);
  free(cmd);
  if (st == 0)
    printf("loss plot: %s\n", png);
  else
    printf("note: plotting failed (python3 %s: %s %d); the CSV has the curves\n", script,
           st != -1 && WIFEXITED(st) ? "exit status" : "wait status",
           st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : st);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines appear as they come, through a pipe too */
  options cl, o;
  int help = 0;
  if (parse_args(&cl, argc, argv, &help)) {
    fprintf(stderr, "\n");
    usage(stderr, argv[0]);
    return 2;
  }
  if (help) {
    usage(stdout, argv[0]);
    return 0;
  }

  te_context_options co;
  te_context *ctx = NULL;
  te_status s = te_context_options_init(&co);
  if (s == TE_SUCCESS && strcmp(cl.device, "auto") != 0) {
    co.use_default_device = 0;
    co.device.type = strcmp(cl.device, "cuda") == 0 ? TE_DEVICE_CUDA : TE_DEVICE_CPU;
    co.device.index = 0;
  }
  if (s == TE_SUCCESS) s = te_context_create(&ctx, &co);
  te_device dev;
  if (s == TE_SUCCESS) s = te_context_get_device(ctx, &dev);
  if (s != TE_SUCCESS) {
    fprintf(stderr, "%s: no context on device '%s': %s: %s\n", argv[0], cl.device,
            te_status_string(s), te_last_error());
    te_context_destroy(ctx);
    return 2;
  }
  resolve(&o, &cl, dev.type);
  const te_dtype hp = o.dtype ? (strcmp(o.dtype, "bf16") == 0 ? TE_DTYPE_BF16 : TE_DTYPE_F32)
                   : dev.type == TE_DEVICE_CUDA ? TE_DTYPE_BF16
                                                : TE_DTYPE_F32;
  const char *hp_name = hp == TE_DTYPE_BF16 ? "bf16" : "fp32";

  gpt_text text;
  printf("libte %s, %s context; preset %s\n", te_version_string(),
         dev.type == TE_DEVICE_CUDA ? "CUDA" : "CPU", o.preset);
  if (gpt_text_load(&text, o.data, o.max_bytes, stdout) ||
      gpt_text_check(&text, o.cfg.seq_len, stdout)) {
    te_context_destroy(ctx);
    return 2;
  }

  const size_t per = (size_t)o.cfg.batch * (size_t)o.cfg.seq_len;
  val_set vs = {o.eval_batches, malloc((size_t)o.eval_batches * per * sizeof(int32_t)),
                malloc((size_t)o.eval_batches * per * sizeof(int32_t))};
  if (vs.tokens == NULL || vs.targets == NULL) {
    fprintf(stderr, "out of memory\n");
    return 2;
  }
  /* A fixed held-out set: the same batches for every evaluation of both runs. */
  gpt_sampler vsamp;
  gpt_sampler_init(&vsamp, 0x76616c5f73657421ull);
  for (int i = 0; i < vs.n; ++i)
    gpt_sample_batch(&vsamp, &text, 1, o.cfg.batch, o.cfg.seq_len, vs.tokens + (size_t)i * per,
                     vs.targets + (size_t)i * per);

  printf("GPT: vocab %d (bytes), seq %d, d_model %d, %d layers, %d heads, d_ff %d, batch %d; "
         "untied LM head\n",
         o.cfg.vocab, o.cfg.seq_len, o.cfg.d_model, o.cfg.n_layers, o.cfg.n_heads, o.cfg.d_ff,
         o.cfg.batch);
  printf("AdamW lr %g (warmup %d, cosine to %g), wd %g, clip %g; %d steps of %zu tokens; "
         "validation: %d batches every %d steps\n",
         o.lr, o.warmup, o.lr * o.min_lr_ratio, o.cfg.weight_decay, o.cfg.max_grad_norm,
         o.steps, per, o.eval_batches, o.eval_every);
  {
    const int rk = o.cfg.fp8_recipe;
    char recipe_text[96];
    if (rk == TE_RECIPE_DELAYED_SCALING)
      snprintf(recipe_text, sizeof recipe_text, "delayed scaling (amax window %d), %s",
               o.cfg.amax_history_len > 0 ? o.cfg.amax_history_len : 16,
               o.cfg.fp8_format == TE_FORMAT_E4M3 ? "E4M3" : "HYBRID");
    else if (rk == TE_RECIPE_CURRENT_SCALING)
      snprintf(recipe_text, sizeof recipe_text, "current scaling, %s",
               o.cfg.fp8_format == TE_FORMAT_E4M3 ? "E4M3" : "HYBRID");
    else
      snprintf(recipe_text, sizeof recipe_text, "block scaling 1x128/128x128, E4M3");
    printf("runs: fp8 (blocks in FP8: %s%s; head in %s) and baseline (%s)\n", recipe_text,
           o.cfg.fprop_split == 1 ? ", fprop split accumulation" : "", hp_name, hp_name);
  }

  FILE *csv = fopen(o.csv, "w");
  if (csv == NULL) {
    fprintf(stderr, "%s: cannot write %s\n", argv[0], o.csv);
    return 2;
  }
  fprintf(csv, "run,step,train_loss,val_loss,tokens_per_s\n");

  double val_fp8 = NAN, val_base = NAN, tps_fp8 = 0, tps_base = 0;
  /* rc: 0, 1 (a run diverged: its final loss is NaN and the comparison fails) or 2 (error) */
  int rc = 0;
  const double t0 = now_s();
  if (!o.only || strcmp(o.only, "fp8") == 0)
    rc = run_one(ctx, &o, "fp8", 1, hp, &text, &vs, csv, &val_fp8, &tps_fp8);
  if (rc != 2 && (!o.only || strcmp(o.only, "baseline") == 0)) {
    const int rc_base = run_one(ctx, &o, "baseline", 0, hp, &text, &vs, csv, &val_base, &tps_base);
    if (rc_base > rc) rc = rc_base;
  }
  const int csv_ok = fclose(csv) == 0;
  if (csv_ok) printf("loss curves (CSV): %s\n", o.csv);
  else fprintf(stderr, "%s: writing %s failed\n", argv[0], o.csv);
  if (csv_ok && rc != 2 && !o.no_plot) plot(o.csv, o.plot);
  printf("total time %.1f s\n", now_s() - t0);

  free(vs.tokens);
  free(vs.targets);
  gpt_text_free(&text);
  te_context_destroy(ctx);
  if (rc == 2) return 2;
  if (!csv_ok) return 2;

  if (o.stop_after > 0 && o.stop_after < o.steps) {
    printf("stopped after step %d of %d: continue with --resume\n", o.stop_after, o.steps);
    return rc;
  }
  if (o.only) {
    printf("final val loss: %s %.4f\n", o.only, strcmp(o.only, "fp8") == 0 ? val_fp8 : val_base);
    return rc;
  }
  if (tps_fp8 > 0 && tps_base > 0)
    printf("training tokens/s: fp8 %.0f  baseline %.0f  (fp8 / baseline %.2fx)\n", tps_fp8,
           tps_base, tps_fp8 / tps_base);
  const double diff = (val_fp8 - val_base) / val_base;
  const int ok = fabs(diff) <= FP8_TOLERANCE; /* NaN fails */
  if (ok)
    printf("final val loss: fp8 %.4f  baseline %.4f  (diff %+.2f%%, within %.0f%%: OK)\n", val_fp8,
           val_base, 100.0 * diff, 100.0 * FP8_TOLERANCE);
  else
    printf("final val loss: fp8 %.4f  baseline %.4f  (diff %+.2f%%, NOT within %.0f%%)\n",
           val_fp8, val_base, 100.0 * diff, 100.0 * FP8_TOLERANCE);
  return ok ? 0 : 1;
}
