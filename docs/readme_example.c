#include <stdio.h>
#include <te/te.h>

#define CHECK(call)                                                        \
  do {                                                                     \
    te_status s_ = (call);                                                 \
    if (s_ != TE_SUCCESS) {                                                \
      fprintf(stderr, "%s: %s\n", te_status_string(s_), te_last_error()); \
      return 1;                                                            \
    }                                                                      \
  } while (0)

enum { TOKENS = 32, IN = 64, OUT = 32 }; /* FP8 GEMMs want multiples of 16 */

static te_tensor matrix(float *data, int64_t rows, int64_t cols) {
  te_tensor t = {0}; /* zero-initialised: F32, CPU, per-tensor scaling */
  t.data = data;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  return t;
}

int main(void) {
  static float x[TOKENS * IN], w[OUT * IN], b[OUT], y[TOKENS * OUT];
  static float dy[TOKENS * OUT], dx[TOKENS * IN], dw[OUT * IN], db[OUT];
  te_tensor tx = matrix(x, TOKENS, IN), tw = matrix(w, OUT, IN), tb = matrix(b, 1, OUT);
  te_tensor ty = matrix(y, TOKENS, OUT), tdy = matrix(dy, TOKENS, OUT);
  te_tensor tdx = matrix(dx, TOKENS, IN), tdw = matrix(dw, OUT, IN), tdb = matrix(db, 1, OUT);
  int i;
  for (i = 0; i < TOKENS * IN; ++i) x[i] = (float)(i % 13) / 13.0f - 0.5f;
  for (i = 0; i < OUT * IN; ++i) w[i] = (float)(i % 7) / 70.0f - 0.05f;
  for (i = 0; i < TOKENS * OUT; ++i) dy[i] = 1.0f / (TOKENS * OUT);
  tb.ndim = 1; /* the bias is a vector [OUT] */
  tb.shape[0] = OUT;
  tdb.ndim = 1;
  tdb.shape[0] = OUT;

  /* A context owns a device, a stream and an autocast stack. Ask for the CPU explicitly. */
  te_context_options copts;
  CHECK(te_context_options_init(&copts));
  copts.use_default_device = 0;
  copts.device.type = TE_DEVICE_CPU;
  te_context *ctx = NULL;
  CHECK(te_context_create(&ctx, &copts));

  /* An immutable recipe: TE's delayed scaling, HYBRID format (E4M3 forward, E5M2 backward). */
  te_recipe_options ropts;
  CHECK(te_recipe_options_init(&ropts, TE_RECIPE_DELAYED_SCALING));
  ropts.amax_history_len = 16;
  te_recipe *recipe = NULL;
  CHECK(te_recipe_create(&recipe, &ropts));
  printf("recipe %s\n", te_recipe_describe(recipe));

  /* A linear layer's FP8 state; the weight and bias stay the caller's. */
  te_linear_options lopts;
  CHECK(te_linear_options_init(&lopts));
  lopts.in_features = IN;
  lopts.out_features = OUT;
  lopts.activation_dtype = TE_DTYPE_F32;
  te_linear *lin = NULL;
  CHECK(te_linear_create(&lin, ctx, &lopts));

  for (int step = 0; step < 3; ++step) {
    /* Everything between begin and end runs in FP8 with this recipe. */
    te_autocast_options aopts;
    CHECK(te_autocast_options_init(&aopts));
    aopts.recipe = recipe;
    te_autocast_token token;
    CHECK(te_autocast_begin(ctx, &aopts, &token));

    te_linear_forward_args fwd;
    CHECK(te_linear_forward_args_init(&fwd));
    fwd.input = &tx;
    fwd.weight = &tw;
    fwd.bias = &tb;
    te_linear_backward_ctx *saved = NULL;
    CHECK(te_linear_forward(ctx, lin, &fwd, &ty, &saved)); /* y = x W^T + b */

    /* ... a loss would produce dy from y here ... */
    CHECK(te_linear_backward(ctx, saved, &tdy, &tdx, &tdw, &tdb, NULL));
    te_linear_backward_ctx_destroy(saved);

    CHECK(te_autocast_end(ctx, token)); /* ends the pass: its amax reduction + scale update */
    CHECK(te_context_synchronize(ctx));
    printf("step %d: y[0] = %f, dW[0] = %f\n", step, y[0], dw[0]);
  }

  te_linear_destroy(lin);
  te_recipe_release(recipe);
  te_context_destroy(ctx);
  return 0;
}
