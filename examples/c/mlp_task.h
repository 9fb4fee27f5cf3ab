/*
 * mlp_task.h: what the MLP demos (train_mlp.c, train_mlp_ddp.c) share: the model's sizes, a
 * fixed-seed RNG, the flat parameter layout, the teacher network that makes the targets, the MSE
 * loss, and small libte helpers. Included by exactly one file of each program; the includer
 * defines CHECK(call) (exit on a failed te_* call) before including it. Plain C99.
 */
#ifndef TE_EXAMPLES_MLP_TASK_H
#define TE_EXAMPLES_MLP_TASK_H

#include <te/te.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* FP8 GEMMs need every dimension, the token count included, to be a multiple of 16. */
enum { IN = 64, HIDDEN = 256, OUT = 16, BATCH = 128 };

static const uint64_t TEACHER_SEED = 1;
static const uint64_t INIT_SEED = 2;
static const uint64_t DATA_SEED = 3;

/* ---- a small fixed-seed RNG of our own, so every training (and every rank) sees the same data */

typedef struct rng {
  uint64_t state;
} rng;

static uint64_t splitmix64(rng *r) {
  uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in (0, 1]: never 0, so log() below is finite. */
static double uniform01(rng *r) { return ((double)(splitmix64(r) >> 11) + 1.0) * 0x1.0p-53; }

/* Box-Muller; the second variate is dropped to keep the state a single integer. */
static float normal(rng *r, float stddev) {
  double u1 = uniform01(r), u2 = uniform01(r);
  return (float)(stddev * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static void fill_normal(rng *r, float *x, size_t n, float stddev) {
  for (size_t i = 0; i < n; ++i) x[i] = normal(r, stddev);
}

/* ---- parameters: one flat fp32 array, so that copying and the SGD step are one loop ------- */

enum {
  W1_SIZE = HIDDEN * IN,
  B1_SIZE = HIDDEN,
  W2_SIZE = OUT * HIDDEN,
  B2_SIZE = OUT,
  N_PARAMS = W1_SIZE + B1_SIZE + W2_SIZE + B2_SIZE
};

typedef struct mlp_params {
  float *w1; /* [HIDDEN, IN]: libte's weight layout is [out_features, in_features] */
  float *b1; /* [HIDDEN] */
  float *w2; /* [OUT, HIDDEN] */
  float *b2; /* [OUT] */
} mlp_params;

static mlp_params params_view(float *flat) {
  mlp_params p;
  p.w1 = flat;
  p.b1 = p.w1 + W1_SIZE;
  p.w2 = p.b1 + B1_SIZE;
  p.b2 = p.w2 + W2_SIZE;
  return p;
}

/* Variance 1/fan_in keeps activations near unit scale through both layers. */
static void init_params(float *flat, uint64_t seed) {
  rng r = {seed};
  mlp_params p = params_view(flat);
  memset(flat, 0, N_PARAMS * sizeof(float));
  fill_normal(&r, p.w1, W1_SIZE, 1.0f / sqrtf((float)IN));
  fill_normal(&r, p.w2, W2_SIZE, 1.0f / sqrtf((float)HIDDEN));
}

/* ---- the task ------------------------------------------------------------------------------ */

/* Same tanh approximation as TE_ACTIVATION_GELU. */
static float gelu(float x) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* The teacher: a fixed random MLP of the same shape, evaluated here in plain fp32, never
 * through libte, so the targets do not depend on the precision the student trains in. Its
 * weights are stored input-major ([in][out]) so the inner loops run over contiguous memory. */
typedef struct teacher_mlp {
  float w1[IN][HIDDEN];
  float w2[HIDDEN][OUT];
} teacher_mlp;

static void init_teacher(teacher_mlp *t, uint64_t seed) {
  rng r = {seed};
  fill_normal(&r, &t->w1[0][0], (size_t)IN * HIDDEN, 1.0f / sqrtf((float)IN));
  fill_normal(&r, &t->w2[0][0], (size_t)HIDDEN * OUT, 1.0f / sqrtf((float)HIDDEN));
}

static void teacher_forward(const teacher_mlp *t, const float *x, float *target, int rows) {
  for (int n = 0; n < rows; ++n) {
    const float *xn = x + (size_t)n * IN;
    float *yn = target + (size_t)n * OUT;
    float hidden[HIDDEN] = {0};
    for (int i = 0; i < IN; ++i)
      for (int j = 0; j < HIDDEN; ++j) hidden[j] += xn[i] * t->w1[i][j];
    for (int o = 0; o < OUT; ++o) yn[o] = 0.0f;
    for (int j = 0; j < HIDDEN; ++j) {
      const float a = gelu(hidden[j]);
      for (int o = 0; o < OUT; ++o) yn[o] += a * t->w2[j][o];
    }
  }
}

/* Mean squared error over one batch of BATCH rows, and its gradient with respect to y. */
static double mse_loss(const float *y, const float *target, float *dy) {
  const size_t n = (size_t)BATCH * OUT;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    float diff = y[i] - target[i];
    sum += (double)diff * diff;
    dy[i] = 2.0f * diff / (float)n;
  }
  return sum / (double)n;
}

/* ---- libte glue ------------------------------------------------------------------------------ */

/* A te_tensor only describes memory the caller owns (and, here, frees): no allocation. */
static te_tensor matrix(te_device device, float *data, int64_t rows, int64_t cols) {
  te_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = TE_DTYPE_F32;
  t.device = device;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  return t;
}

static te_tensor vector(te_device device, float *data, int64_t n) {
  te_tensor t = matrix(device, data, n, 0);
  t.ndim = 1;
  return t;
}

/* Tensors live on the context's device (the GPU when one is usable, else the CPU), in memory
 * from te_context_malloc; the loss and the SGD step run here on the host, so each step copies
 * the batch and the weights in and the output and the gradients out. */
static float *device_floats(te_context *ctx, size_t n) {
  void *p = NULL;
  CHECK(te_context_malloc(ctx, n * sizeof(float), &p));
  return (float *)p;
}

static te_linear *create_linear(te_context *ctx, int64_t in, int64_t out) {
  te_linear_options opts;
  CHECK(te_linear_options_init(&opts));
  opts.in_features = in;
  opts.out_features = out;
  /* The default is BF16. F32 in both runs keeps FP8 the only difference between them. */
  opts.activation_dtype = TE_DTYPE_F32;
  te_linear *lin = NULL;
  CHECK(te_linear_create(&lin, ctx, &opts));
  return lin;
}

#endif /* TE_EXAMPLES_MLP_TASK_H */
