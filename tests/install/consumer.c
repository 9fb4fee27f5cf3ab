/*
 * A tiny program that uses libte the way an outside project does: only <te/te.h> and an
 * installed libte.so, found through pkg-config or find_package(te). It exercises a context, a
 * recipe, an FP8 quantize/dequantize round trip, a GEMM and the error model, and exits non-zero
 * on the first thing that is off.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <te/te.h>

static int failures = 0;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "consumer: FAILED %s: ", #cond);     \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      ++failures;                                          \
    }                                                      \
  } while (0)

/* A call that must succeed; on failure prints the status and te_last_error() and bails out. */
#define TRY(call)                                                                    \
  do {                                                                               \
    te_status s_ = (call);                                                           \
    if (s_ != TE_SUCCESS) {                                                          \
      fprintf(stderr, "consumer: %s -> %s: %s\n", #call, te_status_string(s_),       \
              te_last_error());                                                      \
      ++failures;                                                                    \
      goto done;                                                                     \
    }                                                                                \
  } while (0)

static te_tensor tensor2d(void *data, te_dtype dtype, int64_t rows, int64_t cols) {
  te_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.device.type = TE_DEVICE_CPU;
  t.device.index = 0;
  t.scaling = TE_SCALING_PER_TENSOR;
  return t;
}

enum { M = 16, N = 16, K = 32 };

int main(void) {
  te_context *ctx = NULL;
  te_recipe *recipe = NULL;
  te_context_options copts;
  te_recipe_options ropts;
  te_recipe_options bad;
  te_recipe *untouched = NULL;
  te_status st;
  static float x[M * K], xdq[M * K], a[M * K], b[N * K], d[M * N];
  static unsigned char codes[M * K];
  float scale_inv = 0.0f;
  te_tensor tx, tq, tdq, ta, tb, td;
  te_gemm_options gopts;
  int i, j, k;

  /* The header the program was compiled with and the library it loaded must agree. */
  printf("libte %s (header %d.%d.%d)\n", te_version_string(), TE_VERSION_MAJOR, TE_VERSION_MINOR,
         TE_VERSION_PATCH);
  CHECK(te_version() == TE_VERSION_NUMBER, "te_version() = %u, header says %d", te_version(),
        TE_VERSION_NUMBER);

  TRY(te_context_options_init(&copts));
  copts.use_default_device = 0;
  copts.device.type = TE_DEVICE_CPU;
  copts.device.index = 0;
  TRY(te_context_create(&ctx, &copts));
  CHECK(ctx != NULL, "te_context_create succeeded but gave NULL");

  TRY(te_recipe_options_init(&ropts, TE_RECIPE_DELAYED_SCALING));
  TRY(te_recipe_create(&recipe, &ropts));
  printf("recipe: %s\n", te_recipe_describe(recipe));
  CHECK(te_recipe_key(recipe) != 0, "te_recipe_key of a valid recipe is 0");
  CHECK(strlen(te_recipe_describe(recipe)) > 0, "te_recipe_describe is empty");

  /* The error model: a bad field fails with INVALID_ARGUMENT, a message, and *out untouched. */
  bad = ropts;
  bad.margin = -1;
  st = te_recipe_create(&untouched, &bad);
  CHECK(st == TE_ERROR_INVALID_ARGUMENT, "margin -1 gave %s", te_status_string(st));
  CHECK(untouched == NULL, "a failed te_recipe_create wrote its output");
  CHECK(strlen(te_last_error()) > 0, "te_last_error() is empty after a failure");
  printf("expected error: %s\n", te_last_error());

  /* FP8 E4M3 round trip with current scaling: every value within E4M3's half-ulp (2^-4). */
  for (i = 0; i < M * K; ++i) x[i] = (float)((i % 37) - 18) * 0.25f;
  tx = tensor2d(x, TE_DTYPE_F32, M, K);
  tq = tensor2d(codes, TE_DTYPE_E4M3, M, K);
  tq.scale_inv = &scale_inv;
  tdq = tensor2d(xdq, TE_DTYPE_F32, M, K);
  TRY(te_quantize(ctx, &tx, &tq, NULL));
  TRY(te_dequantize(ctx, &tq, &tdq));
  TRY(te_context_synchronize(ctx));
  CHECK(scale_inv > 0.0f, "scale_inv = %g", (double)scale_inv);
  for (i = 0; i < M * K; ++i) {
    if (fabsf(xdq[i] - x[i]) > fabsf(x[i]) * 0.0626f) {
      CHECK(0, "quantize round trip: x[%d] = %g came back as %g", i, (double)x[i],
            (double)xdq[i]);
      break;
    }
  }

  /* F32 GEMM D = A B^T against a naive loop. */
  for (i = 0; i < M * K; ++i) a[i] = (float)(i % 7) - 3.0f;
  for (i = 0; i < N * K; ++i) b[i] = (float)(i % 5) * 0.5f - 1.0f;
  ta = tensor2d(a, TE_DTYPE_F32, M, K);
  tb = tensor2d(b, TE_DTYPE_F32, N, K);
  td = tensor2d(d, TE_DTYPE_F32, M, N);
  TRY(te_gemm_options_init(&gopts));
  gopts.transa = 0;
  gopts.transb = 1;
  TRY(te_gemm(ctx, &ta, &tb, &td, &gopts));
  TRY(te_context_synchronize(ctx));
  for (i = 0; i < M; ++i) {
    for (j = 0; j < N; ++j) {
      double ref = 0.0;
      for (k = 0; k < K; ++k) ref += (double)a[i * K + k] * (double)b[j * K + k];
      if (fabs((double)d[i * N + j] - ref) > 1e-4 * (1.0 + fabs(ref))) {
        CHECK(0, "gemm: D[%d][%d] = %g, expected %g", i, j, (double)d[i * N + j], ref);
        i = M;
        break;
      }
    }
  }

done:
  te_recipe_release(recipe);
  te_context_destroy(ctx);
  if (failures) {
    fprintf(stderr, "consumer: %d failure(s)\n", failures);
    return 1;
  }
  printf("consumer: OK\n");
  return 0;
}
