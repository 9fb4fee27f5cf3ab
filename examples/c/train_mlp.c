/*
 * train_mlp: train a small MLP in FP8 with libte, and check it against FP32.
 *
 *   model   Linear(64 -> 256) -> GELU -> Linear(256 -> 16), MSE loss
 *   task    regress the outputs of a fixed random "teacher" MLP on Gaussian inputs
 *   optim   SGD with momentum on fp32 master weights kept in this file
 *
 * The model is trained twice from the same initial weights on the same batches:
 * once with every forward inside an FP8 autocast scope (delayed scaling, HYBRID
 * format: E4M3 forward, E5M2 gradients), once with the scope disabled, so the
 * only difference between the two loss curves is FP8.
 *
 * Usage:   train_mlp [loss.csv]          (default train_mlp_loss.csv; --help: usage)
 * Exit:    0  FP8 converged: final loss far below the initial loss and within
 *             10% of the FP32 final loss
 *          1  it did not
 *          2  a libte call (or the CSV file, or malloc) failed
 *
 * Only the public header is used. Plain C99.
 */
#include <te/te.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The model's sizes, the seeds and the batch are mlp_task.h's (shared with train_mlp_ddp.c). */
enum {
  STEPS = 600,
  LOG_EVERY = 50,
  FINAL_WINDOW = 20 /* "final loss" = mean over the last this-many steps: one batch is noisy */
};

static const float LEARNING_RATE = 0.5f;
static const float MOMENTUM = 0.9f;
/* Converged = the final loss is at most this fraction of the initial loss... */
static const double CONVERGED_FRACTION = 0.1;
/* ...and FP8's final loss is within this relative distance of FP32's. */
static const double FP8_TOLERANCE = 0.10;


/* Any libte failure ends the demo: the message names the call and the argument. */
#define CHECK(call)                                                                                \
  do {                                                                                             \
    te_status check_status_ = (call);                                                              \
    if (check_status_ != TE_SUCCESS) {                                                             \
      fprintf(stderr, "%s:%d: %s\n  failed: %s: %s\n", __FILE__, __LINE__, #call,                  \
              te_status_string(check_status_), te_last_error());                                   \
      exit(2);                                                                                     \
    }                                                                                              \
  } while (0)

static void *xcalloc(size_t count, size_t size) {
  void *p = calloc(count, size);
  if (p == NULL) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

#include "mlp_task.h" /* sizes, RNG, parameters, teacher, loss, libte helpers */

/* A fresh batch every step, so the loss measures generalisation, not memorisation. */
static void next_batch(rng *data, const teacher_mlp *teacher, float *x, float *target) {
  fill_normal(data, x, (size_t)BATCH * IN, 1.0f);
  teacher_forward(teacher, x, target, BATCH);
}

static void to_device(te_context *ctx, float *dst, const float *src, size_t n) {
  CHECK(te_context_copy(ctx, dst, src, n * sizeof(float), TE_COPY_HOST_TO_DEVICE));
}

static void to_host(te_context *ctx, float *dst, const float *src, size_t n) {
  CHECK(te_context_copy(ctx, dst, src, n * sizeof(float), TE_COPY_DEVICE_TO_HOST));
}

/* ---- training ---------------------------------------------------------------------------- */

/* Trains from `init` for STEPS steps and writes each step's loss (before its update) into
 * losses[STEPS]. With use_fp8 == 0 the very same code runs with the autocast scope disabled. */
static void train(te_context *ctx, te_device device, const te_recipe *recipe, int use_fp8,
                  const float *init, const teacher_mlp *teacher, double *losses) {
  /* Fresh layers per run: a te_linear carries its FP8 scaling history. */
  te_linear *fc1 = create_linear(ctx, IN, HIDDEN);
  te_linear *fc2 = create_linear(ctx, HIDDEN, OUT);

  /* Host: the fp32 master weights, their gradients, the optimizer state, the data. */
  float *master = xcalloc(N_PARAMS, sizeof(float));
  float *grad = xcalloc(N_PARAMS, sizeof(float));
  float *velocity = xcalloc(N_PARAMS, sizeof(float));
  memcpy(master, init, N_PARAMS * sizeof(float));
  float *x_host = xcalloc((size_t)BATCH * IN, sizeof(float));
  float *target = xcalloc((size_t)BATCH * OUT, sizeof(float));
  float *y_host = xcalloc((size_t)BATCH * OUT, sizeof(float));
  float *dy_host = xcalloc((size_t)BATCH * OUT, sizeof(float));

  /* Device: what libte reads and writes. */
  float *params = device_floats(ctx, N_PARAMS), *grads = device_floats(ctx, N_PARAMS);
  mlp_params w = params_view(params), g = params_view(grads);
  float *x = device_floats(ctx, (size_t)BATCH * IN);
  float *h = device_floats(ctx, (size_t)BATCH * HIDDEN); /* fc1 output, GELU input */
  float *a = device_floats(ctx, (size_t)BATCH * HIDDEN); /* GELU output, fc2 input */
  float *y = device_floats(ctx, (size_t)BATCH * OUT);
  float *dy = device_floats(ctx, (size_t)BATCH * OUT);
  float *da = device_floats(ctx, (size_t)BATCH * HIDDEN);
  float *dh = device_floats(ctx, (size_t)BATCH * HIDDEN);

  te_tensor x_t = matrix(device, x, BATCH, IN), h_t = matrix(device, h, BATCH, HIDDEN);
  te_tensor a_t = matrix(device, a, BATCH, HIDDEN), y_t = matrix(device, y, BATCH, OUT);
  te_tensor dy_t = matrix(device, dy, BATCH, OUT), da_t = matrix(device, da, BATCH, HIDDEN);
  te_tensor dh_t = matrix(device, dh, BATCH, HIDDEN);
  te_tensor w1_t = matrix(device, w.w1, HIDDEN, IN), b1_t = vector(device, w.b1, HIDDEN);
  te_tensor w2_t = matrix(device, w.w2, OUT, HIDDEN), b2_t = vector(device, w.b2, OUT);
  te_tensor dw1_t = matrix(device, g.w1, HIDDEN, IN), db1_t = vector(device, g.b1, HIDDEN);
  te_tensor dw2_t = matrix(device, g.w2, OUT, HIDDEN), db2_t = vector(device, g.b2, OUT);

  te_autocast_options autocast;
  CHECK(te_autocast_options_init(&autocast));
  autocast.enabled = use_fp8;
  autocast.recipe = recipe;

  te_linear_forward_args fwd1, fwd2;
  CHECK(te_linear_forward_args_init(&fwd1));
  CHECK(te_linear_forward_args_init(&fwd2));
  fwd1.input = &x_t;
  fwd1.weight = &w1_t;
  fwd1.bias = &b1_t;
  fwd2.input = &a_t;
  fwd2.weight = &w2_t;
  fwd2.bias = &b2_t;
  /* weight_unchanged stays 0: SGD changes the weights every step, so the cached FP8 weights
   * must be re-quantized. (Gradient accumulation over micro-batches would set it.) */

  te_linear_backward_args once;
  CHECK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE; /* each backward runs once: free its FP8 copies right away */

  rng data = {DATA_SEED}; /* both runs replay the same batches */
  for (int step = 0; step < STEPS; ++step) {
    next_batch(&data, teacher, x_host, target);
    to_device(ctx, x, x_host, (size_t)BATCH * IN);
    to_device(ctx, params, master, N_PARAMS);

    /* Forward inside the scope: when it ends, libte updates the forward scales (inputs and
     * weights) from this step's amaxes, for the next step to use. */
    te_autocast_token token;
    te_linear_backward_ctx *bwd1 = NULL, *bwd2 = NULL;
    CHECK(te_autocast_begin(ctx, &autocast, &token));
    CHECK(te_linear_forward(ctx, fc1, &fwd1, &h_t, &bwd1));
    CHECK(te_activation_forward(ctx, TE_ACTIVATION_GELU, &h_t, &a_t));
    CHECK(te_linear_forward(ctx, fc2, &fwd2, &y_t, &bwd2));
    CHECK(te_autocast_end(ctx, token));

    to_host(ctx, y_host, y, (size_t)BATCH * OUT);
    losses[step] = mse_loss(y_host, target, dy_host);
    to_device(ctx, dy, dy_host, (size_t)BATCH * OUT);

    /* Backward runs after the scope, as in TE; the saved contexts remember it was FP8.
     * fc1 needs no dx: x is data. fc1 is the pass's first FP8 module, so its backward is what
     * makes libte update the gradient scales. */
    CHECK(te_linear_backward(ctx, bwd2, &dy_t, &da_t, &dw2_t, &db2_t, &once));
    CHECK(te_activation_backward(ctx, TE_ACTIVATION_GELU, &h_t, &da_t, &dh_t));
    CHECK(te_linear_backward(ctx, bwd1, &dh_t, NULL, &dw1_t, &db1_t, &once));
    te_linear_backward_ctx_destroy(bwd2);
    te_linear_backward_ctx_destroy(bwd1);
    to_host(ctx, grad, grads, N_PARAMS);

    /* The master weights stay fp32; FP8 is only ever a per-step copy inside libte. */
    for (size_t i = 0; i < N_PARAMS; ++i) {
      velocity[i] = MOMENTUM * velocity[i] + grad[i];
      master[i] -= LEARNING_RATE * velocity[i];
    }
  }

  float *device_blocks[] = {params, grads, x, h, a, y, dy, da, dh};
  for (size_t i = 0; i < sizeof device_blocks / sizeof device_blocks[0]; ++i)
    CHECK(te_context_free(ctx, device_blocks[i]));
  free(dy_host);
  free(y_host);
  free(target);
  free(x_host);
  free(velocity);
  free(grad);
  free(master);
  te_linear_destroy(fc2);
  te_linear_destroy(fc1);
}

static double mean(const double *v, int n) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += v[i];
  return sum / n;
}

static int write_csv(const char *path, const double *fp8, const double *fp32) {
  FILE *f = fopen(path, "w");
  if (f == NULL) return 0;
  fprintf(f, "step,loss_fp8,loss_fp32\n");
  for (int i = 0; i < STEPS; ++i) fprintf(f, "%d,%.9g,%.9g\n", i, fp8[i], fp32[i]);
  return fclose(f) == 0;
}

static void usage(FILE *f, const char *argv0) {
  fprintf(f,
          "Usage: %s [loss.csv]\n\n"
          "Trains a small MLP in FP8 (libte's delayed scaling) and in FP32 from the same start,\n"
          "prints both losses, and writes the curves to loss.csv (default train_mlp_loss.csv;\n"
          "columns step,loss_fp8,loss_fp32). Runs on the GPU when libte can use one, else the CPU.\n"
          "Exit status: 0 when FP8 converged within 10%% of FP32, 1 when not, 2 on an error.\n",
          argv0);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout, argv[0]);
      return 0;
    }
  }
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    fprintf(stderr, "%s: unexpected arguments\n\n", argv[0]);
    usage(stderr, argv[0]);
    return 2;
  }
  const char *csv_path = argc > 1 ? argv[1] : "train_mlp_loss.csv";

  te_device device;
  te_context *ctx = NULL;
  CHECK(te_context_create(&ctx, NULL)); /* the GPU when one is usable, else the CPU */
  CHECK(te_context_get_device(ctx, &device));

  /* Delayed scaling quantizes each tensor with a scale computed from the amaxes of the previous
   * amax_history_len steps. TE's default, 1024, is longer than this whole run: every scale would
   * be the max since step 0 and never come down as training shrinks the errors (and with them
   * the gradients). 16 steps still smooths batch-to-batch noise but lets the scales follow, as
   * the default does over a long run. In a run this short E5M2's range is wide enough that
   * 1024 trains just as well; 16 is what the window is for. */
  te_recipe_options recipe_opts;
  CHECK(te_recipe_options_init(&recipe_opts, TE_RECIPE_DELAYED_SCALING));
  recipe_opts.format = TE_FORMAT_HYBRID;
  recipe_opts.amax_history_len = 16;
  te_recipe *recipe = NULL;
  CHECK(te_recipe_create(&recipe, &recipe_opts));

  teacher_mlp *teacher = xcalloc(1, sizeof *teacher);
  float *init = xcalloc(N_PARAMS, sizeof(float));
  init_teacher(teacher, TEACHER_SEED);
  init_params(init, INIT_SEED);
  double *loss_fp8 = xcalloc(STEPS, sizeof(double));
  double *loss_fp32 = xcalloc(STEPS, sizeof(double));

  if (device.type == TE_DEVICE_CUDA)
    printf("libte %s, CUDA context (device %d)\n", te_version_string(), (int)device.index);
  else
    printf("libte %s, CPU context\n", te_version_string());
  printf("MLP %d -> %d -> GELU -> %d, batch %d, %d steps, SGD lr %g momentum %g\n", IN, HIDDEN, OUT,
         BATCH, STEPS, LEARNING_RATE, MOMENTUM);
  printf("fp8 recipe: %s\n", te_recipe_describe(recipe));

  train(ctx, device, recipe, 1, init, teacher, loss_fp8);
  train(ctx, device, recipe, 0, init, teacher, loss_fp32);

  for (int step = 0; step < STEPS; ++step)
    if (step % LOG_EVERY == 0 || step == STEPS - 1)
      printf("step %4d  fp8 %.5f  fp32 %.5f\n", step, loss_fp8[step], loss_fp32[step]);

  /* Same weights, same batch: FP8's step-0 loss differs only by FP8 itself. */
  const double initial = loss_fp32[0];
  const double final_fp8 = mean(loss_fp8 + STEPS - FINAL_WINDOW, FINAL_WINDOW);
  const double final_fp32 = mean(loss_fp32 + STEPS - FINAL_WINDOW, FINAL_WINDOW);
  const double ratio = final_fp8 / final_fp32;
  /* Written as "x <= limit" so that a NaN loss fails every test. */
  const int converged = final_fp8 <= CONVERGED_FRACTION * initial;
  const int within_tolerance = fabs(ratio - 1.0) <= FP8_TOLERANCE;
  if (!converged)
    printf("fp8 did not converge: final loss %.5f is not below %g x the initial %.5f\n", final_fp8,
           CONVERGED_FRACTION, initial);
  printf("final loss: fp8 %.5f fp32 %.5f (fp8/fp32 = %.3f, within %.0f%%: %s; initial %.5f)\n",
         final_fp8, final_fp32, ratio, 100.0 * FP8_TOLERANCE, within_tolerance ? "yes" : "no",
         initial);

  const int csv_ok = write_csv(csv_path, loss_fp8, loss_fp32);
  if (csv_ok)
    printf("loss curves written to %s\n", csv_path);
  else
    fprintf(stderr, "could not write %s\n", csv_path);

  free(loss_fp32);
  free(loss_fp8);
  free(init);
  free(teacher);
  te_recipe_release(recipe);
  te_context_destroy(ctx);

  if (!csv_ok) return 2;
  return converged && within_tolerance ? 0 : 1;
}
