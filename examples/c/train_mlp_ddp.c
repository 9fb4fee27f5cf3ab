/*
 * train_mlp_ddp: the train_mlp demo trained data-parallel in FP8 over N GPUs.
 *
 *   model   Linear(64 -> 256) -> GELU -> Linear(256 -> 16), MSE loss (as train_mlp)
 *   ranks   one process per GPU, forked from main; each sees only its GPU
 *           (CUDA_VISIBLE_DEVICES) and has its own libte context
 *   data    every step one global batch of N x BATCH rows, generated identically on every
 *           rank from the same seed; rank r trains on rows [r*BATCH, (r+1)*BATCH)
 *   NCCL    the program's own communicator (ncclCommInitRank, the id shared through a file):
 *             - it all-reduces the gradients (sum, then / N: the mean over the global batch),
 *             - libte borrows it (te_group_create_nccl) and, through the autocast scope's
 *               group, reduces the FP8 amaxes so every rank computes the same scales.
 *
 * After training every rank dumps its fp32 master weights and its FP8 scaling states; the
 * parent checks they are bit-identical across ranks. Rank 0 prints the loss.
 *
 * Then the reference: one process on one GPU trains the same model on the same global batches
 * (all N x BATCH rows in each GEMM, a single-rank group, no reduction). Data parallelism only
 * splits the sums over rows, and the FP8 scales come from the same global amaxes, so the two
 * loss curves must agree to within FP8 rounding (REFERENCE_TOLERANCE).
 *
 * Usage:   train_mlp_ddp [N]          (default: every visible GPU)
 * Exit:    0   converged (final loss <= 0.1 x initial), identical on every rank, and the loss
 *              within REFERENCE_TOLERANCE of the single-GPU run's
 *          1   it did not converge, the ranks differ, or the loss departs from the reference
 *          2   a libte, CUDA or NCCL call (or a file, or malloc) failed
 *          77  fewer than 2 GPUs (nothing to test)
 *
 * Plain C99 + POSIX (fork, mkdtemp).
 */
#define _GNU_SOURCE /* mkdtemp, setenv */
#include <te/te.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The model and the per-rank batch (BATCH rows) are mlp_task.h's. */
enum { STEPS = 600, LOG_EVERY = 50, FINAL_WINDOW = 20 };
enum { HISTORY_LEN = 16, MAX_RANKS = 64 };

static const float LEARNING_RATE = 0.5f;
static const float MOMENTUM = 0.9f;
static const double CONVERGED_FRACTION = 0.1;
/* Largest relative difference allowed between the DDP and single-GPU losses (the final loss,
 * and each logged step's). */
static const double REFERENCE_TOLERANCE = 0.05;


static int g_rank = -1; /* -1 in the parent */

/* ---- error checking: every te_*, CUDA and NCCL call ends the rank on failure -------------- */

#define CHECK(call)                                                                                \
  do {                                                                                             \
    te_status check_status_ = (call);                                                              \
    if (check_status_ != TE_SUCCESS) {                                                             \
      fprintf(stderr, "[rank %d] %s:%d: %s\n  failed: %s: %s\n", g_rank, __FILE__, __LINE__,       \
              #call, te_status_string(check_status_), te_last_error());                            \
      exit(2);                                                                                     \
    }                                                                                              \
  } while (0)

#define CHECK_CUDA(call)                                                                           \
  do {                                                                                             \
    cudaError_t check_cuda_ = (call);                                                              \
    if (check_cuda_ != cudaSuccess) {                                                              \
      fprintf(stderr, "[rank %d] %s:%d: %s\n  failed: %s\n", g_rank, __FILE__, __LINE__, #call,    \
              cudaGetErrorString(check_cuda_));                                                    \
      exit(2);                                                                                     \
    }                                                                                              \
  } while (0)

#define CHECK_NCCL(call)                                                                           \
  do {                                                                                             \
    ncclResult_t check_nccl_ = (call);                                                             \
    if (check_nccl_ != ncclSuccess) {                                                              \
      fprintf(stderr, "[rank %d] %s:%d: %s\n  failed: %s\n", g_rank, __FILE__, __LINE__, #call,    \
              ncclGetErrorString(check_nccl_));                                                    \
      exit(2);                                                                                     \
    }                                                                                              \
  } while (0)

static void *xcalloc(size_t count, size_t size) {
  void *p = calloc(count, size);
  if (p == NULL) {
    fprintf(stderr, "[rank %d] out of memory\n", g_rank);
    exit(2);
  }
  return p;
}

#include "mlp_task.h" /* sizes, RNG, parameters, teacher, loss, libte helpers (as train_mlp) */

/* Draws the whole global batch of `shards` x BATCH rows (so every rank's RNG stays in step) and
 * keeps this rank's `mine` shards of it, from shard rank x mine: x_mine [mine x BATCH, IN] and
 * their targets. */
static void next_shards(rng *data, const teacher_mlp *teacher, int rank, int mine, int shards,
                        float *x_global, float *x_mine, float *target) {
  fill_normal(data, x_global, (size_t)shards * BATCH * IN, 1.0f);
  memcpy(x_mine, x_global + (size_t)rank * mine * BATCH * IN, (size_t)mine * BATCH * IN * sizeof(float));
  teacher_forward(teacher, x_mine, target, mine * BATCH);
}

static void to_device(te_context *ctx, void *dst, const void *src, size_t bytes) {
  CHECK(te_context_copy(ctx, dst, src, bytes, TE_COPY_HOST_TO_DEVICE));
}

static void to_host(te_context *ctx, void *dst, const void *src, size_t bytes) {
  CHECK(te_context_copy(ctx, dst, src, bytes, TE_COPY_DEVICE_TO_HOST));
}

/* ---- what the ranks compare: the weights and every FP8 scaling state ------------------------ */

typedef struct state_dump {
  float scale, scale_inv;
  int32_t history_len, fp8_dtype;
  float history[HISTORY_LEN];
} state_dump;

enum { N_STATES = 6 }; /* 2 layers x (input, weight, grad_output) */

typedef struct rank_dump {
  float master[N_PARAMS];
  state_dump states[N_STATES];
} rank_dump;

static const char *const STATE_NAMES[N_STATES] = {"fc1.input", "fc1.weight", "fc1.grad_output",
                                                   "fc2.input", "fc2.weight", "fc2.grad_output"};

static void dump_states(te_context *ctx, te_linear *const lins[2], state_dump *out) {
  const te_tensor_role roles[3] = {TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT};
  for (int l = 0; l < 2; ++l)
    for (int k = 0; k < 3; ++k) {
      state_dump *d = &out[3 * l + k];
      te_scaling_state_info info;
      memset(d, 0, sizeof *d);
      memset(&info, 0, sizeof info);
      info.struct_size = sizeof info;
      CHECK(te_linear_get_scaling_state(ctx, lins[l], roles[k], &info, d->history, HISTORY_LEN));
      d->scale = info.scale;
      d->scale_inv = info.scale_inv;
      d->history_len = info.amax_history_len;
      d->fp8_dtype = (int32_t)info.fp8_dtype;
    }
}

static void rank_file(char *path, size_t cap, const char *dir, int rank) {
  snprintf(path, cap, "%s/rank%d.bin", dir, rank);
}

/* Rank 0's loss per step, one file per run (nranks 1: the single-GPU reference). */
static void losses_file(char *path, size_t cap, const char *dir, int nranks) {
  snprintf(path, cap, "%s/losses_%dranks.bin", dir, nranks);
}

/* ---- the NCCL id: rank 0 makes it and publishes it atomically (write, then rename) -------- */

static void share_nccl_id(const char *dir, int rank, ncclUniqueId *id) {
  char path[512], tmp[520];
  snprintf(path, sizeof path, "%s/nccl_id", dir);
  if (rank == 0) {
    CHECK_NCCL(ncclGetUniqueId(id));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      fprintf(stderr, "[rank 0] cannot write %s\n", path);
      exit(2);
    }
    return;
  }
  FILE *f = NULL;
  for (int i = 0; i < 6000 && (f = fopen(path, "rb")) == NULL; ++i) usleep(10000); /* 60 s */
  if (f == NULL || fread(id, sizeof *id, 1, f) != 1) {
    fprintf(stderr, "[rank %d] no NCCL id from rank 0 in %s\n", rank, path);
    exit(2);
  }
  fclose(f);
}

/* ---- one rank ---------------------------------------------------------------------------- */

/* One rank of `nranks`, training on `mine` shards of BATCH rows each step (the global batch is
 * nranks x mine shards): DDP runs mine = 1 per rank, the reference nranks = 1, mine = N. */
static int run_rank(int rank, int nranks, int mine, const char *dir) {
  g_rank = rank;
  const int shards = nranks * mine, rows = mine * BATCH;

  /* The parent set CUDA_VISIBLE_DEVICES: this rank's GPU is device 0. */
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  ncclUniqueId id;
  share_nccl_id(dir, rank, &id);
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, nranks, id, rank)); /* blocks until every rank joined */

  /* libte works on our stream, so its kernels, its amax all-reduce and our gradient
   * all-reduce are all ordered on one stream. */
  te_context_options copts;
  CHECK(te_context_options_init(&copts));
  copts.use_default_device = 0;
  copts.device.type = TE_DEVICE_CUDA;
  copts.device.index = 0;
  te_context *ctx = NULL;
  CHECK(te_context_create(&ctx, &copts));
  CHECK(te_context_set_stream(ctx, stream));
  te_device device;
  CHECK(te_context_get_device(ctx, &device));

  /* libte borrows the communicator: we destroy the group before the communicator. */
  te_group *group = NULL;
  CHECK(te_group_create_nccl(&group, comm));
  if (te_group_rank(group) != rank || te_group_size(group) != nranks) {
    fprintf(stderr, "[rank %d] the group says rank %d of %d\n", rank, te_group_rank(group),
            te_group_size(group));
    return 2;
  }

  te_recipe_options recipe_opts;
  CHECK(te_recipe_options_init(&recipe_opts, TE_RECIPE_DELAYED_SCALING));
  recipe_opts.format = TE_FORMAT_HYBRID;
  recipe_opts.amax_history_len = HISTORY_LEN; /* see train_mlp.c */
  /* reduce_amax stays 1 (the default): amaxes are reduced over the scope's group. */
  te_recipe *recipe = NULL;
  CHECK(te_recipe_create(&recipe, &recipe_opts));

  teacher_mlp *teacher = xcalloc(1, sizeof *teacher);
  init_teacher(teacher, TEACHER_SEED);

  te_linear *fc1 = create_linear(ctx, IN, HIDDEN);
  te_linear *fc2 = create_linear(ctx, HIDDEN, OUT);

  /* Host: master weights, their (reduced) gradients, optimizer state, this rank's data. */
  float *master = xcalloc(N_PARAMS, sizeof(float));
  float *grad = xcalloc(N_PARAMS, sizeof(float));
  float *velocity = xcalloc(N_PARAMS, sizeof(float));
  init_params(master, INIT_SEED); /* same seed: the same initial weights on every rank */
  float *x_global = xcalloc((size_t)shards * BATCH * IN, sizeof(float));
  float *x_host = xcalloc((size_t)rows * IN, sizeof(float));
  float *target = xcalloc((size_t)rows * OUT, sizeof(float));
  float *y_host = xcalloc((size_t)rows * OUT, sizeof(float));
  float *dy_host = xcalloc((size_t)rows * OUT, sizeof(float));
  double *losses = xcalloc(STEPS, sizeof(double));

  /* Device. */
  float *params = device_floats(ctx, N_PARAMS), *grads = device_floats(ctx, N_PARAMS);
  mlp_params w = params_view(params), g = params_view(grads);
  float *x = device_floats(ctx, (size_t)rows * IN);
  float *h = device_floats(ctx, (size_t)rows * HIDDEN);
  float *a = device_floats(ctx, (size_t)rows * HIDDEN);
  float *y = device_floats(ctx, (size_t)rows * OUT);
  float *dy = device_floats(ctx, (size_t)rows * OUT);
  float *da = device_floats(ctx, (size_t)rows * HIDDEN);
  float *dh = device_floats(ctx, (size_t)rows * HIDDEN);
  void *loss_buf = NULL; /* one double: the local loss, summed over ranks */
  CHECK(te_context_malloc(ctx, sizeof(double), &loss_buf));

  te_tensor x_t = matrix(device, x, rows, IN), h_t = matrix(device, h, rows, HIDDEN);
  te_tensor a_t = matrix(device, a, rows, HIDDEN), y_t = matrix(device, y, rows, OUT);
  te_tensor dy_t = matrix(device, dy, rows, OUT), da_t = matrix(device, da, rows, HIDDEN);
  te_tensor dh_t = matrix(device, dh, rows, HIDDEN);
  te_tensor w1_t = matrix(device, w.w1, HIDDEN, IN), b1_t = vector(device, w.b1, HIDDEN);
  te_tensor w2_t = matrix(device, w.w2, OUT, HIDDEN), b2_t = vector(device, w.b2, OUT);
  te_tensor dw1_t = matrix(device, g.w1, HIDDEN, IN), db1_t = vector(device, g.b1, HIDDEN);
  te_tensor dw2_t = matrix(device, g.w2, OUT, HIDDEN), db2_t = vector(device, g.b2, OUT);

  te_autocast_options autocast;
  CHECK(te_autocast_options_init(&autocast));
  autocast.enabled = 1;
  autocast.recipe = recipe;
  autocast.group = group; /* what makes the FP8 scales identical on every rank */

  te_linear_forward_args fwd1, fwd2;
  CHECK(te_linear_forward_args_init(&fwd1));
  CHECK(te_linear_forward_args_init(&fwd2));
  fwd1.input = &x_t;
  fwd1.weight = &w1_t;
  fwd1.bias = &b1_t;
  fwd2.input = &a_t;
  fwd2.weight = &w2_t;
  fwd2.bias = &b2_t;

  te_linear_backward_args once;
  CHECK(te_linear_backward_args_init(&once));
  once.flags = TE_BACKWARD_ONCE;

  const float inv_shards = 1.0f / (float)shards;
  rng data = {DATA_SEED}; /* every rank replays the same global batches */
  for (int step = 0; step < STEPS; ++step) {
    next_shards(&data, teacher, rank, mine, shards, x_global, x_host, target);
    to_device(ctx, x, x_host, (size_t)rows * IN * sizeof(float));
    to_device(ctx, params, master, N_PARAMS * sizeof(float));

    /* Forward: at the end of the scope libte all-reduces (MAX) the forward amaxes over the
     * group, then updates the scales, on the context's stream. */
    te_autocast_token token;
    te_linear_backward_ctx *bwd1 = NULL, *bwd2 = NULL;
    CHECK(te_autocast_begin(ctx, &autocast, &token));
    CHECK(te_linear_forward(ctx, fc1, &fwd1, &h_t, &bwd1));
    CHECK(te_activation_forward(ctx, TE_ACTIVATION_GELU, &h_t, &a_t));
    CHECK(te_linear_forward(ctx, fc2, &fwd2, &y_t, &bwd2));
    CHECK(te_autocast_end(ctx, token));

    /* Each shard's MSE (mse_loss: BATCH rows) and its gradient. The global mean loss is the mean
     * over shards, its gradient the mean of the shards' gradients: the backward sums over rows
     * (and NCCL over ranks), the SGD step below divides by the number of shards. */
    to_host(ctx, y_host, y, (size_t)rows * OUT * sizeof(float));
    double local_loss = 0.0;
    for (int k = 0; k < mine; ++k) {
      const size_t off = (size_t)k * BATCH * OUT;
      local_loss += mse_loss(y_host + off, target + off, dy_host + off);
    }
    to_device(ctx, dy, dy_host, (size_t)rows * OUT * sizeof(float));

    /* Backward: after fc1's (the pass's first FP8 module) libte reduces the gradient amaxes
     * over the same group. */
    CHECK(te_linear_backward(ctx, bwd2, &dy_t, &da_t, &dw2_t, &db2_t, &once));
    CHECK(te_activation_backward(ctx, TE_ACTIVATION_GELU, &h_t, &da_t, &dh_t));
    CHECK(te_linear_backward(ctx, bwd1, &dh_t, NULL, &dw1_t, &db1_t, &once));
    te_linear_backward_ctx_destroy(bwd2);
    te_linear_backward_ctx_destroy(bwd1);

    /* Data parallelism: sum the gradients (and the losses) over the ranks, on the stream
     * libte wrote them on; the copies to the host below wait for it. NCCL hands every rank the
     * same sums, so every rank takes the same SGD step. */
    to_device(ctx, loss_buf, &local_loss, sizeof local_loss);
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclAllReduce(grads, grads, N_PARAMS, ncclFloat32, ncclSum, comm, stream));
    CHECK_NCCL(ncclAllReduce(loss_buf, loss_buf, 1, ncclFloat64, ncclSum, comm, stream));
    CHECK_NCCL(ncclGroupEnd());
    to_host(ctx, grad, grads, N_PARAMS * sizeof(float));
    double loss_sum = 0.0;
    to_host(ctx, &loss_sum, loss_buf, sizeof loss_sum);
    losses[step] = loss_sum / shards; /* the loss over the global batch */

    for (size_t i = 0; i < N_PARAMS; ++i) {
      velocity[i] = MOMENTUM * velocity[i] + grad[i] * inv_shards;
      master[i] -= LEARNING_RATE * velocity[i];
    }
    if (rank == 0 && (step % LOG_EVERY == 0 || step == STEPS - 1))
      printf("step %4d  loss %.5f\n", step, losses[step]);
  }

  /* What the parent compares: the weights and the six scaling states. */
  rank_dump *dump = xcalloc(1, sizeof *dump);
  memcpy(dump->master, master, sizeof dump->master);
  te_linear *const lins[2] = {fc1, fc2};
  dump_states(ctx, lins, dump->states);
  char path[512];
  rank_file(path, sizeof path, dir, rank);
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(dump, sizeof *dump, 1, f) != 1 || fclose(f) != 0) {
    fprintf(stderr, "[rank %d] cannot write %s\n", rank, path);
    return 2;
  }

  if (rank == 0) {
    losses_file(path, sizeof path, dir, nranks);
    f = fopen(path, "wb");
    if (f == NULL || fwrite(losses, sizeof *losses, STEPS, f) != STEPS || fclose(f) != 0) {
      fprintf(stderr, "[rank 0] cannot write %s\n", path);
      return 2;
    }
  }

  double initial = losses[0], final = 0.0;
  for (int i = STEPS - FINAL_WINDOW; i < STEPS; ++i) final += losses[i] / FINAL_WINDOW;
  const int converged = final <= CONVERGED_FRACTION * initial; /* false for NaN */
  if (rank == 0) {
    te_context_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    CHECK(te_context_get_stats(ctx, &stats));
    printf("[rank 0] fc1.input scale %.9g, fc2.grad_output scale %.9g; %llu amax all-reduces "
           "in %d steps\n",
           dump->states[0].scale, dump->states[5].scale,
           (unsigned long long)stats.amax_reductions, STEPS);
    printf("final loss %.5f (initial %.5f, mean of the last %d steps): %s\n", final, initial,
           FINAL_WINDOW, converged ? "converged" : "NOT converged");
  }

  float *device_blocks[] = {params, grads, x, h, a, y, dy, da, dh, (float *)loss_buf};
  for (size_t i = 0; i < sizeof device_blocks / sizeof device_blocks[0]; ++i)
    CHECK(te_context_free(ctx, device_blocks[i]));
  CHECK(te_context_synchronize(ctx));
  free(dump);
  free(losses);
  free(dy_host);
  free(y_host);
  free(target);
  free(x_host);
  free(x_global);
  free(velocity);
  free(grad);
  free(master);
  free(teacher);
  te_linear_destroy(fc2);
  te_linear_destroy(fc1);
  te_recipe_release(recipe);
  te_context_destroy(ctx);
  te_group_destroy(group); /* before the communicator it borrows */
  CHECK_NCCL(ncclCommDestroy(comm));
  CHECK_CUDA(cudaStreamDestroy(stream));
  fflush(stdout);
  return converged ? 0 : 1;
}

/* ---- the parent: no CUDA here, it forks ---------------------------------------------------- */

static int wait_child(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return 2;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  fprintf(stderr, "child %d killed by signal %d\n", (int)pid,
          WIFSIGNALED(status) ? WTERMSIG(status) : -1);
  return 2;
}

/* Counts GPUs in a child, so that the parent never initialises CUDA before forking. */
static int count_gpus(void) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    _exit(count > 100 ? 100 : count);
  }
  return wait_child(pid);
}

static int compare_ranks(const char *dir, int nranks) {
  rank_dump *d0 = xcalloc(1, sizeof *d0), *dr = xcalloc(1, sizeof *dr);
  int differences = 0;
  for (int r = 0; r < nranks; ++r) {
    char path[512];
    rank_file(path, sizeof path, dir, r);
    FILE *f = fopen(path, "rb");
    if (f == NULL || fread(r == 0 ? d0 : dr, sizeof *d0, 1, f) != 1) {
      printf("no dump from rank %d (%s)\n", r, path);
      if (f) fclose(f);
      free(d0);
      free(dr);
      return -1;
    }
    fclose(f);
    remove(path);
    if (r == 0) continue;
    if (memcmp(d0->master, dr->master, sizeof d0->master) != 0) {
      size_t n = 0;
      for (size_t i = 0; i < N_PARAMS; ++i) n += memcmp(&d0->master[i], &dr->master[i], sizeof(float)) != 0;
      printf("weights differ between rank 0 and rank %d (%zu of %d values)\n", r, n, (int)N_PARAMS);
      ++differences;
    }
    for (int s = 0; s < N_STATES; ++s)
      if (memcmp(&d0->states[s], &dr->states[s], sizeof(state_dump)) != 0) {
        printf("%s differs: rank 0 scale %.9g, rank %d scale %.9g\n", STATE_NAMES[s],
               d0->states[s].scale, r, dr->states[s].scale);
        ++differences;
      }
  }
  int unused = 0;
  for (int s = 0; s < N_STATES; ++s) unused += d0->states[s].history_len == 0;
  if (unused) {
    printf("%d scaling states were never used in FP8\n", unused);
    ++differences;
  }
  free(d0);
  free(dr);
  return differences;
}

static int read_losses(const char *dir, int nranks, double *out) {
  char path[512];
  losses_file(path, sizeof path, dir, nranks);
  FILE *f = fopen(path, "rb");
  int ok = f != NULL && fread(out, sizeof *out, STEPS, f) == STEPS;
  if (f) fclose(f);
  if (!ok) printf("no loss curve in %s\n", path);
  return ok;
}

static double relative_difference(double a, double reference) {
  return fabs(a - reference) / fabs(reference);
}

/* DDP over nranks vs the single-GPU reference: the final loss (mean of the last FINAL_WINDOW
 * steps) and every logged step's loss within REFERENCE_TOLERANCE. Returns 1 when they agree. */
static int compare_losses(const char *dir, int nranks) {
  double *ddp = xcalloc(STEPS, sizeof(double)), *ref = xcalloc(STEPS, sizeof(double));
  int ok = read_losses(dir, nranks, ddp) && read_losses(dir, 1, ref);
  if (ok) {
    double final_ddp = 0.0, final_ref = 0.0, worst = 0.0;
    int worst_step = 0;
    for (int i = STEPS - FINAL_WINDOW; i < STEPS; ++i) {
      final_ddp += ddp[i] / FINAL_WINDOW;
      final_ref += ref[i] / FINAL_WINDOW;
    }
    for (int i = 0; i < STEPS; ++i) {
      const double d = relative_difference(ddp[i], ref[i]);
      if (!(d <= worst)) worst = d, worst_step = i; /* NaN wins */
    }
    const double final_diff = relative_difference(final_ddp, final_ref);
    printf("loss vs one GPU: step 0 %.6f / %.6f, final %.5f / %.5f (relative difference %.2e); "
           "largest step difference %.2e at step %d\n",
           ddp[0], ref[0], final_ddp, final_ref, final_diff, worst, worst_step);
    ok = final_diff <= REFERENCE_TOLERANCE;
    for (int i = 0; i < STEPS && ok; i += LOG_EVERY) ok = relative_difference(ddp[i], ref[i]) <= REFERENCE_TOLERANCE;
    printf("the DDP loss %s the single-GPU loss within %.0f%%\n", ok ? "matches" : "does NOT match",
           100.0 * REFERENCE_TOLERANCE);
  }
  free(ddp);
  free(ref);
  return ok;
}

int main(int argc, char **argv) {
  /* NVLink multicast stays off (it can take a shared host's GPUs out of service). */
  setenv("NCCL_NVLS_ENABLE", "0", 0);

  if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf("Usage: %s [N]\n\n"
           "Data-parallel training of the demo MLP over N GPUs (default: every visible GPU, at\n"
           "least 2), one process per GPU, gradients all-reduced over NCCL; checks that weights\n"
           "and FP8 scales end bit-identical on every rank and that the loss matches a single-GPU\n"
           "run. Exit status: 0 on success, 1 on a mismatch, 2 on an error, 77 (skipped) with\n"
           "fewer than 2 GPUs.\n",
           argv[0]);
    return 0;
  }
  const int gpus = count_gpus();
  int nranks = argc > 1 ? atoi(argv[1]) : gpus;
  if (gpus < 2) {
    printf("SKIP: %d GPU(s): data parallelism needs at least 2\n", gpus < 0 ? 0 : gpus);
    return 77;
  }
  if (nranks < 2 || nranks > gpus || nranks > MAX_RANKS) {
    fprintf(stderr, "usage: %s [N], 2 <= N <= %d (the GPUs here)\n", argv[0], gpus);
    return 2;
  }

  char dir[] = "/tmp/te_ddp_XXXXXX"; /* the NCCL id and the ranks' dumps */
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 2;
  }
  printf("libte %s: FP8 MLP %d -> %d -> GELU -> %d, data-parallel over %d GPUs, "
         "global batch %d x %d, %d steps\n",
         te_version_string(), IN, HIDDEN, OUT, nranks, nranks, BATCH, STEPS);
  fflush(stdout);

  pid_t pids[MAX_RANKS];
  for (int r = 0; r < nranks; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      return 2;
    }
    if (pids[r] == 0) {
      char visible[16];
      snprintf(visible, sizeof visible, "%d", r);
      setenv("CUDA_VISIBLE_DEVICES", visible, 1);
      alarm(300); /* a hung collective ends the rank, not the machine's patience */
      _exit(run_rank(r, nranks, 1, dir));
    }
  }
  int worst = 0;
  for (int r = 0; r < nranks; ++r) {
    int rc = wait_child(pids[r]);
    if (rc != 0) printf("rank %d exited with %d\n", r, rc);
    if (rc > worst) worst = rc;
  }
  int differences = worst == 2 ? -1 : compare_ranks(dir, nranks);

  /* The single-GPU reference over the same global batches. */
  int reference_rc = 2, reference_ok = 0;
  if (worst != 2 && differences >= 0) {
    printf("reference: one GPU, the same %d x %d global batches\n", nranks, BATCH);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      setenv("CUDA_VISIBLE_DEVICES", "0", 1);
      alarm(300);
      _exit(run_rank(0, 1, nranks, dir));
    }
    reference_rc = pid < 0 ? 2 : wait_child(pid);
    if (reference_rc != 2) reference_ok = compare_losses(dir, nranks);
  }

  char path[512];
  const char *leftovers[] = {"nccl_id", "rank0.bin", "losses_1ranks.bin", NULL};
  for (int i = 0; leftovers[i] != NULL; ++i) {
    snprintf(path, sizeof path, "%s/%s", dir, leftovers[i]);
    remove(path);
  }
  losses_file(path, sizeof path, dir, nranks);
  remove(path);
  rmdir(dir);
  if (worst == 2 || differences < 0 || reference_rc == 2) {
    printf("FAIL: a rank failed\n");
    return 2;
  }
  if (differences == 0)
    printf("weights and FP8 scaling states bit-identical on all %d ranks\n", nranks);
  if (worst != 0 || differences != 0 || !reference_ok) {
    printf("FAIL: %s\n", worst != 0 ? "did not converge"
                        : differences != 0 ? "the ranks differ"
                                           : "the loss departs from the single-GPU run's");
    return 1;
  }
  printf("PASS\n");
  return 0;
}
