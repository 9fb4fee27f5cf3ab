/*
 * libte: FP8 training behind a stable C ABI.
 *
 * This is THE public header. It is plain C99 and compiles alone with
 * -std=c99 -Wall -Wextra -pedantic -Werror, and as C++.
 *
 * Conventions (they hold for every function unless its comment says otherwise):
 *  - Functions return te_status; 0 is TE_SUCCESS. Getters that cannot fail and
 *    destructors return a value or void; destroying NULL is a no-op.
 *  - Output parameters come first. On failure, outputs are left untouched and
 *    no library state changes (strong guarantee).
 *  - After a failure, te_last_error() returns the calling thread's message,
 *    naming the function, the argument, and what was expected vs. received.
 *  - Errors any function may return, not repeated below: INVALID_ARGUMENT for
 *    a NULL or wrong-type handle, a NULL required pointer, a struct_size
 *    smaller than this header's struct, an out-of-range enum or boolean
 *    (booleans are 0 or 1), or a malformed tensor (NULL data, ndim outside
 *    1..TE_MAX_DIMS, a dimension < 1, FP8 without scale_inv, a device other
 *    than the context's); OUT_OF_MEMORY; CUDA and CUBLAS on a GPU context whose
 *    device fails. Each function lists the errors particular to it.
 *  - Options structs begin with `size_t struct_size` and have an _init
 *    function filling defaults; fields are only ever appended.
 *  - Enumerations are append-only with explicit values.
 *  - Thread-safety: a te_context and everything used through it (linears,
 *    backward contexts) belong to one thread at a time. Recipes are immutable
 *    and may be shared across threads. Groups are read-only after creation.
 *    The library keeps no hidden global training state.
 *  - Memory: the caller owns every te_tensor's memory. Handles are created by
 *    te_*_create and freed by the matching destroy/release.
 *  - Handles are identities, not addresses: a destroyed (or released) handle
 *    stays dead even when its memory or its pooled object is reused, and a
 *    value that is not a live handle of the expected type - NULL, destroyed,
 *    of another type, or not a libte handle at all - is never dereferenced:
 *    it gives INVALID_ARGUMENT saying which (destroy functions and getters
 *    that cannot fail ignore it and return their NULL value).
 *  - Lifetimes: whatever a scope, a pending backward or a layer still needs
 *    is kept alive by it. Destroying a group or context, or releasing a
 *    recipe, kills the caller's handle at once; the object itself is freed
 *    when the last scope, bucket, layer or backward context using it is done.
 *  - Sizes: a tensor has at most 2^60 elements; a shape whose element count
 *    exceeds that (or overflows) is INVALID_ARGUMENT, never arithmetic that
 *    wraps.
 *  - OUT_OF_MEMORY keeps the strong guarantee: the call allocates before it
 *    changes anything, so it can be retried (a training step interrupted by
 *    an allocation failure and retried gives the same result).
 */
#ifndef TE_TE_H
#define TE_TE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define TE_API __declspec(dllimport)
#elif defined(__GNUC__)
#define TE_API __attribute__((visibility("default")))
#else
#define TE_API
#endif

/* ------------------------------------------------------------------------- */
/* Versions                                                                  */
/* ------------------------------------------------------------------------- */

#define TE_VERSION_MAJOR 0
#define TE_VERSION_MINOR 1
#define TE_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, as te_version() returns it. */
#define TE_VERSION_NUMBER (TE_VERSION_MAJOR * 10000 + TE_VERSION_MINOR * 100 + TE_VERSION_PATCH)

/* The version of the library actually loaded, encoded as TE_VERSION_NUMBER. */
TE_API unsigned te_version(void);
/* "MAJOR.MINOR.PATCH", static storage. */
TE_API const char *te_version_string(void);

/* ------------------------------------------------------------------------- */
/* Errors                                                                    */
/* ------------------------------------------------------------------------- */

typedef enum te_status {
  TE_SUCCESS = 0,
  TE_ERROR_INVALID_ARGUMENT = 1, /* a NULL, out-of-range or inconsistent argument */
  TE_ERROR_INVALID_STATE = 2,    /* the call is not allowed now (e.g. out-of-order autocast end) */
  TE_ERROR_UNSUPPORTED = 3,      /* valid request this build/device/shape cannot do */
  TE_ERROR_OUT_OF_MEMORY = 4,
  TE_ERROR_CUDA = 5,
  TE_ERROR_CUBLAS = 6,
  TE_ERROR_NCCL = 7,
  TE_ERROR_INTERNAL = 8 /* a bug in libte: please report the te_last_error() text */
} te_status;

/* Static text for a status ("TE_ERROR_INVALID_ARGUMENT", ...); unknown values
 * give "TE_ERROR_UNKNOWN". Never NULL. Thread-safe. */
TE_API const char *te_status_string(te_status status);

/* The calling thread's message for its last failed call, e.g.
 * "te_linear_forward: argument 'args->input': expected dtype BF16, got F32".
 * "" when no call on this thread has failed yet. Successful calls do not
 * clear it. The pointer stays valid until the thread's next libte call. */
TE_API const char *te_last_error(void);

/* ------------------------------------------------------------------------- */
/* Devices, dtypes, tensors                                                  */
/* ------------------------------------------------------------------------- */

typedef enum te_device_type { TE_DEVICE_CPU = 0, TE_DEVICE_CUDA = 1 } te_device_type;

typedef struct te_device {
  te_device_type type;
  int32_t index; /* CUDA ordinal; 0 for the CPU */
} te_device;

typedef enum te_dtype {
  TE_DTYPE_F32 = 0,
  TE_DTYPE_F16 = 1,
  TE_DTYPE_BF16 = 2,
  TE_DTYPE_E4M3 = 3, /* FP8 e4m3fn: max 448, no infinities, one NaN code per sign */
  TE_DTYPE_E5M2 = 4, /* FP8 e5m2: max 57344, IEEE-style inf and NaN */
  TE_DTYPE_I32 = 5   /* int32: sequence offsets (attention's cu_seqlens) */
} te_dtype;

/* How an FP8 tensor's scale_inv is laid out. */
typedef enum te_scaling_mode {
  TE_SCALING_PER_TENSOR = 0,   /* scale_inv points to one float */
  TE_SCALING_BLOCK_1X128 = 1,  /* one float per 1x128 block of each row:
                                  [rows][ceil(cols/128)], row-major */
  TE_SCALING_BLOCK_128X128 = 2 /* one float per 128x128 tile:
                                  [ceil(rows/128)][ceil(cols/128)], row-major */
} te_scaling_mode;

#define TE_MAX_DIMS 8

/* A view of caller-owned memory: row-major and contiguous. For block
 * scaling a tensor of ndim > 2 is seen as a matrix [prod(shape[:-1]), shape[-1]].
 * A zero-initialised struct is an F32 CPU tensor with per-tensor scaling. */
typedef struct te_tensor {
  void *data;
  te_dtype dtype;
  int32_t ndim; /* 1..TE_MAX_DIMS */
  int64_t shape[TE_MAX_DIMS];
  te_device device;
  float *scale_inv;        /* FP8 only: dequantized value = code * scale_inv (per block) */
  te_scaling_mode scaling; /* FP8 only */
} te_tensor;

/* Number of elements of t (product of its shape); 0 for NULL, a bad ndim, a
 * dimension < 1, or a count above 2^60 (so it never overflows). */
TE_API int64_t te_tensor_numel(const te_tensor *t);

/* Number of floats t->scale_inv must hold for t's shape and scaling mode.
 * Errors: INVALID_ARGUMENT for NULL, a non-FP8 dtype or a bad shape. */
TE_API te_status te_tensor_scale_inv_count(int64_t *count, const te_tensor *t);

/* Fills *out from a DLPack DLManagedTensor (or DLManagedTensorVersioned
 * when `versioned` is non-zero) without copying. Ownership stays with the
 * DLPack producer: the caller calls its deleter when done. Accepts
 * float32/float16/bfloat16 (and uint8 viewed as `fp8_dtype`, which must then
 * be TE_DTYPE_E4M3 or TE_DTYPE_E5M2, and int32 as TE_DTYPE_I32) on kDLCPU,
 * kDLCUDA or kDLCUDAHost.
 * For FP8 the caller sets out->scale_inv (and out->scaling) afterwards.
 * The producer's tensor must be writable: a DLManagedTensorVersioned flagged
 * DLPACK_FLAG_BITMASK_READ_ONLY is refused (libte may write to any te_tensor).
 * Errors: INVALID_ARGUMENT for NULL (including a NULL shape), `versioned`
 * other than 0 or 1, non-contiguous strides, a byte_offset that misaligns or
 * wraps the data pointer, an unknown dtype or device, a CUDA device_id < 0,
 * ndim outside 1..TE_MAX_DIMS, more than 2^60 elements, a read-only tensor;
 * UNSUPPORTED for a DLManagedTensorVersioned of a major version other than 1. */
TE_API te_status te_tensor_from_dlpack(te_tensor *out, const void *dl_managed_tensor,
                                       int versioned, te_dtype fp8_dtype);

/* ------------------------------------------------------------------------- */
/* Context                                                                   */
/* ------------------------------------------------------------------------- */

/* One execution context = one device, one stream, one BLAS handle and
 * workspace, one autocast stack. Not thread-safe: use one per thread. */
typedef struct te_context te_context;

typedef struct te_context_options {
  size_t struct_size;
  int32_t use_default_device; /* 1 (default): CUDA 0 when usable, else the CPU */
  te_device device;           /* used when use_default_device == 0 */
} te_context_options;

TE_API te_status te_context_options_init(te_context_options *opts);

/* Creates a context. opts may be NULL (defaults). Errors: INVALID_ARGUMENT
 * (bad struct_size or device), UNSUPPORTED (CUDA asked for, but this build has
 * no CUDA backend or no such GPU), OUT_OF_MEMORY. */
TE_API te_status te_context_create(te_context **out, const te_context_options *opts);
/* Destroys the caller's handle at once; no later call can name the context.
 * Linears, residuals and backward contexts made with it keep it alive until
 * they are destroyed too (in any order); open autocast scopes are dropped
 * with it. NULL (or a dead handle) is a no-op. */
TE_API void te_context_destroy(te_context *ctx);
/* The context's device. Errors: INVALID_ARGUMENT for NULLs. */
TE_API te_status te_context_get_device(const te_context *ctx, te_device *out);
/* Sets the stream work is enqueued on (a cudaStream_t; NULL = the legacy
 * default stream). Errors: INVALID_ARGUMENT for a non-NULL stream on a CPU
 * context. */
TE_API te_status te_context_set_stream(te_context *ctx, void *stream);
/* Waits until all work enqueued by ctx has finished (a no-op on the CPU,
 * where work runs when enqueued). */
TE_API te_status te_context_synchronize(te_context *ctx);

/* Memory on the context's device, for programs without an allocator of their
 * own (plain C, the demos): the GPU's stream-ordered pool, or 64-byte aligned
 * host memory on the CPU. Blocks still allocated when the context is freed
 * are freed with it. Errors: INVALID_ARGUMENT (bytes == 0 or above
 * PTRDIFF_MAX), OUT_OF_MEMORY (including a size above the machine's memory). */
TE_API te_status te_context_malloc(te_context *ctx, size_t bytes, void **out);
/* Frees a block from te_context_malloc (stream-ordered on the GPU). NULL is a
 * no-op. Errors: INVALID_ARGUMENT for a pointer this context did not allocate. */
TE_API te_status te_context_free(te_context *ctx, void *ptr);

typedef enum te_copy_kind {
  TE_COPY_HOST_TO_DEVICE = 0,
  TE_COPY_DEVICE_TO_HOST = 1,
  TE_COPY_DEVICE_TO_DEVICE = 2
} te_copy_kind;

/* Copies bytes between host memory and the context's device (or within the
 * device), in stream order. Copies that touch host memory complete before the
 * call returns (the host buffer is then free to change); device-to-device
 * copies are only enqueued. On a CPU context every kind is a memcpy.
 * Errors: INVALID_ARGUMENT (NULL dst or src, bytes above PTRDIFF_MAX, an
 * unknown kind). */
TE_API te_status te_context_copy(te_context *ctx, void *dst, const void *src, size_t bytes, te_copy_kind kind);

/* Counters of the work autocast did on this context since its creation:
 * what a profiler, or a test of "one reduction per bucket", needs. */
typedef struct te_context_stats {
  size_t struct_size;
  uint64_t scopes_closed;        /* te_autocast_end calls that succeeded */
  uint64_t bucket_updates;       /* fused scale-update launches (one per bucket and pass) */
  uint64_t amax_reductions;      /* group all-reduces issued (one per bucket of a multi-rank
                                    group with reduce_amax) */
  uint64_t states_updated;       /* scaling states updated, summed over the launches */
} te_context_stats;

/* Copies the counters. out->struct_size must be set. */
TE_API te_status te_context_get_stats(const te_context *ctx, te_context_stats *out);

/* ------------------------------------------------------------------------- */
/* Recipes                                                                   */
/* ------------------------------------------------------------------------- */

typedef enum te_recipe_kind {
  TE_RECIPE_DELAYED_SCALING = 0, /* per-tensor scales from an amax history */
  TE_RECIPE_CURRENT_SCALING = 1, /* per-tensor scales from each tensor's own amax */
  TE_RECIPE_BLOCK_SCALING = 2    /* 1x128 activations/gradients, 128x128 weights */
} te_recipe_kind;

typedef enum te_format {
  TE_FORMAT_HYBRID = 0, /* E4M3 forward (activations, weights), E5M2 backward (gradients) */
  TE_FORMAT_E4M3 = 1    /* E4M3 everywhere */
} te_format;

typedef enum te_amax_algo { TE_AMAX_MAX = 0, TE_AMAX_MOST_RECENT = 1 } te_amax_algo;

typedef struct te_recipe_options {
  size_t struct_size;
  te_recipe_kind kind;
  te_format format;               /* delayed, current: HYBRID; block: E4M3 */
  int32_t margin;                 /* delayed: scale = (fp8_max / amax) / 2^margin; 0..127 */
  int32_t amax_history_len;       /* delayed: 1..65536, default 1024 */
  te_amax_algo amax_algo;         /* delayed: default MAX */
  int32_t reduce_amax;            /* all-reduce amaxes over the autocast group; default 1 */
  int32_t power_of_2_scales;      /* current, block: keep only the scale's exponent.
                                     Default 0; block scaling defaults to 1 (as TE) */
  float amax_epsilon;             /* current, block: amax clamped up to this; >= 0, default 0 */
  int32_t fprop_split_accumulator; /* default 0: fast accumulation in fprop */
  int32_t dgrad_split_accumulator; /* default 1 */
  int32_t wgrad_split_accumulator; /* default 1 */
} te_recipe_options;

/* Fills TE's defaults for `kind`. Errors: INVALID_ARGUMENT for NULL or an
 * unknown kind. */
TE_API te_status te_recipe_options_init(te_recipe_options *opts, te_recipe_kind kind);

/* Immutable, reference-counted, thread-safe. */
typedef struct te_recipe te_recipe;

/* Creates a recipe with refcount 1. opts NULL = default delayed scaling.
 * Errors: INVALID_ARGUMENT for an out-of-range field (named in the message). */
TE_API te_status te_recipe_create(te_recipe **out, const te_recipe_options *opts);
/* Adds a reference; returns r, or NULL (and does nothing) when r is not a live
 * recipe. Thread-safe. */
TE_API te_recipe *te_recipe_retain(te_recipe *r);
/* Drops a reference, freeing at zero (scopes and saved forwards that use the
 * recipe hold references of their own). Thread-safe; NULL or a dead handle is
 * a no-op. */
TE_API void te_recipe_release(te_recipe *r);
/* A 64-bit key computed once at creation from every field that affects
 * numerics: the canonical encoding of the options itself, packed into 63 bits
 * (not a hash, and no table that grows with every recipe ever created), so
 * equal options <=> equal keys, in every process and run. Never 0 for a valid
 * recipe; 0 for NULL or a dead handle. */
TE_API uint64_t te_recipe_key(const te_recipe *r);
/* A canonical description built at creation, e.g.
 * "delayed_scaling(format=HYBRID,margin=0,...)". Valid while r lives. "" for NULL. */
TE_API const char *te_recipe_describe(const te_recipe *r);
/* Copies the recipe's options (struct_size taken from *out, which must be
 * set). Errors: INVALID_ARGUMENT for NULLs or a bad struct_size. */
TE_API te_status te_recipe_get_options(const te_recipe *r, te_recipe_options *out);

/* ------------------------------------------------------------------------- */
/* Process groups (amax reduction)                                           */
/* ------------------------------------------------------------------------- */

typedef struct te_group te_group;

/* An opaque NCCL unique id (as ncclUniqueId: 128 bytes), shared out of band. */
typedef struct te_nccl_id {
  char internal[128];
} te_nccl_id;

/* A single-rank group: reductions are no-ops. */
TE_API te_status te_group_create_single(te_group **out);
/* Borrows a communicator the caller owns (an ncclComm_t); it must outlive
 * the group. Amaxes are reduced on the context's stream. UNSUPPORTED in
 * builds without NCCL or without a usable GPU. */
TE_API te_status te_group_create_nccl(te_group **out, void *nccl_comm);
/* Makes a new NCCL id on one rank, to share with the others. */
TE_API te_status te_nccl_get_unique_id(te_nccl_id *out);
/* Options of te_group_init_nccl_with_options. */
typedef struct te_group_nccl_options {
  size_t struct_size;
  int32_t timeout_ms; /* how long to wait for every rank to join; 0: no limit;
                         default 600000 (10 minutes) */
} te_group_nccl_options;

/* Fills the defaults (and struct_size). Errors: INVALID_ARGUMENT for NULL. */
TE_API te_status te_group_nccl_options_init(te_group_nccl_options *opts);
/* Joins `nranks` ranks into a new communicator the group owns, on the calling
 * thread's current CUDA device (cudaSetDevice first). Collective: every rank
 * calls it with the same id. The communicator is non-blocking: when not all
 * ranks have joined within opts->timeout_ms, it is aborted and the call fails
 * with TE_ERROR_NCCL, rather than hanging. NCCL's own failures are
 * TE_ERROR_NCCL with NCCL's message. UNSUPPORTED in builds without NCCL or
 * without a usable GPU. opts NULL: the defaults. */
TE_API te_status te_group_init_nccl_with_options(te_group **out, int32_t rank, int32_t nranks,
                                                 const te_nccl_id *id,
                                                 const te_group_nccl_options *opts);
/* te_group_init_nccl_with_options with the default options. */
TE_API te_status te_group_init_nccl(te_group **out, int32_t rank, int32_t nranks,
                                    const te_nccl_id *id);
/* The abort path for a rank that failed: aborts the communicator the group
 * owns (ncclCommAbort), which ends any of its reductions still running or
 * waiting on the GPU for a peer that will never come, so that a
 * te_context_synchronize blocked on them returns. Meant for a watchdog
 * thread: it may run while another thread is blocked in
 * te_context_synchronize, but not while one is inside a te_* call that
 * reduces over this group (te_autocast_end, a backward, a current-scaling
 * forward). Afterwards every reduction over the group fails with
 * TE_ERROR_NCCL; destroy the group and rebuild. INVALID_STATE for a group
 * that borrows its communicator (te_group_create_nccl: the owner aborts it
 * with ncclCommAbort) or has no communicator (single-rank). Aborting twice is
 * a no-op. */
TE_API te_status te_group_abort(te_group *g);
/* Destroys the caller's handle at once. Scopes, autocast buckets and saved
 * forwards that used the group keep it (and its communicator) alive until
 * their reductions are done, so a backward may run after its group was
 * destroyed. NULL (or a dead handle) is a no-op. */
TE_API void te_group_destroy(te_group *g);
/* A process-unique id, never reused, never 0 (0 names the implicit
 * single-rank group used when an autocast scope has none). */
TE_API uint64_t te_group_id(const te_group *g);
TE_API int32_t te_group_rank(const te_group *g); /* 0 for NULL */
TE_API int32_t te_group_size(const te_group *g); /* 1 for NULL */

/* ------------------------------------------------------------------------- */
/* Autocast                                                                  */
/* ------------------------------------------------------------------------- */

typedef struct te_autocast_options {
  size_t struct_size;
  int32_t enabled;          /* default 1: FP8 compute inside the scope */
  int32_t calibrating;      /* default 0: high-precision compute, amaxes recorded */
  const te_recipe *recipe;  /* NULL = the default delayed-scaling recipe; retained
                               by the scope while it is open */
  const te_group *group;    /* NULL = single-rank */
} te_autocast_options;

TE_API te_status te_autocast_options_init(te_autocast_options *opts);

/* Identifies one open scope; pass it to te_autocast_end. Unique in the
 * process: a token of another context never names a scope of this one. */
typedef uint64_t te_autocast_token;

/* Opens a scope on ctx's stack. Options are plain data: one value may be
 * reused for nested scopes. Never allocates. Touches the device only to
 * enqueue the last pass's deferred scale update (see te_autocast_end) when
 * this scope starts a new pass.
 * Errors: INVALID_ARGUMENT (NULLs, bad struct_size), INVALID_STATE (depth
 * would exceed TE_AUTOCAST_MAX_DEPTH, or a deferred update is pending and
 * ctx's stream is being captured). */
#define TE_AUTOCAST_MAX_DEPTH 64
TE_API te_status te_autocast_begin(te_context *ctx, const te_autocast_options *opts,
                                   te_autocast_token *token);
/* Closes the innermost scope, which `token` must name (INVALID_STATE
 * otherwise, with the stack unchanged). When no enclosing scope is enabled,
 * each forward bucket of scaling states used inside, keyed by (recipe key,
 * group id), gets one amax all-reduce (MAX) over its group when the recipe's
 * reduce_amax is set, and one fused scale update.
 *
 * When no bucket needs an all-reduce and ctx's stream is not being captured,
 * the update is deferred rather than launched: it joins the launch of the
 * next backward update (one scale-update launch per training step). Nothing
 * can observe the difference: te_autocast_begin of the next pass, the state
 * get/save/load functions, te_context_get_stats, te_adamw_step,
 * te_context_set_stream, te_context_synchronize and
 * te_autocast_flush_backward enqueue it first. It is never enqueued into a
 * stream capture (a graph would repeat it at every replay): those calls fail
 * with INVALID_STATE under capture while it is pending, changing nothing, so
 * end a forward-only pass with one of them before a capture begins. */
TE_API te_status te_autocast_end(te_context *ctx, te_autocast_token token);

typedef struct te_autocast_state {
  size_t struct_size;
  int32_t enabled;          /* of the innermost scope; 0 outside any scope */
  int32_t calibrating;
  const te_recipe *recipe;  /* innermost scope's recipe (the default one if it
                               gave NULL); NULL outside any scope */
  int32_t depth;            /* open scopes */
} te_autocast_state;

/* Reports the innermost scope. out->struct_size must be set. Never allocates. */
TE_API te_status te_autocast_get_state(const te_context *ctx, te_autocast_state *out);

/* Reduces and updates every pending backward bucket now, oldest pass first,
 * instead of when the backward of each pass's first FP8 module completes,
 * and enqueues a deferred forward update (te_autocast_end). Succeeds and does
 * nothing when none is pending. INVALID_STATE, changing nothing, when a
 * deferred forward update is pending and ctx's stream is being captured. */
TE_API te_status te_autocast_flush_backward(te_context *ctx);

/* ------------------------------------------------------------------------- */
/* Linear                                                                    */
/* ------------------------------------------------------------------------- */

typedef struct te_linear te_linear;

typedef struct te_linear_options {
  size_t struct_size;
  int64_t in_features;              /* required, > 0 */
  int64_t out_features;             /* required, > 0 */
  int32_t bias;                     /* default 1: forward takes a bias [out] */
  te_dtype activation_dtype;        /* F32, F16 or BF16 (default BF16): x, W, b, y, dy, dx */
  int32_t fuse_wgrad_accumulation;  /* default 0; 1: backward adds dW into the caller's
                                       F32 main_grad passed as `dw` */
} te_linear_options;

TE_API te_status te_linear_options_init(te_linear_options *opts);

/* Creates a linear layer's FP8 state (scaling states for input and weight
 * forward and grad_output backward, FP8 weight cache) on ctx's device.
 * Parameters stay the caller's. Errors: INVALID_ARGUMENT. */
TE_API te_status te_linear_create(te_linear **out, te_context *ctx, const te_linear_options *opts);
/* NULL is a no-op. Backward contexts keep what they need alive. */
TE_API void te_linear_destroy(te_linear *lin);

typedef struct te_linear_forward_args {
  size_t struct_size;
  const te_tensor *input;   /* x [..., in_features] */
  const te_tensor *weight;  /* W [out_features, in_features] */
  const te_tensor *bias;    /* b [out_features]; NULL iff the layer has no bias */
  int32_t weight_unchanged; /* 1: W is the same as in the last FP8 forward, so the
                               cached FP8 weight may be reused (TE's
                               is_first_microbatch=False); default 0 */
} te_linear_forward_args;

TE_API te_status te_linear_forward_args_init(te_linear_forward_args *args);

/* What backward needs, filled by forward_compute. The tensors are views of
 * storage the library owns (or of the caller's x and W when the forward ran
 * in high precision: those are referenced, not copied, and must stay alive
 * until the backward context is destroyed). Hand it to forward_save, or
 * free it with te_linear_residuals_release. The caller sets struct_size =
 * sizeof(te_linear_residuals) before the call, as for every struct the
 * library fills (te_autocast_state, te_scaling_state_info, te_context_stats). */
typedef struct te_linear_residuals {
  size_t struct_size;
  te_tensor input_t;   /* FP8: x^T [in, tokens] with its scale_inv; else x */
  te_tensor weight_t;  /* FP8: W^T [in, out] with its scale_inv; else W */
  int32_t fp8;         /* 1 when the forward ran in FP8 */
  void *internal;      /* owned storage and flags: do not touch */
} te_linear_residuals;

/* Pure compute: quantizes x and W with the innermost autocast scope's recipe
 * (reusing the cached FP8 W when allowed), runs y = x W^T (+ b), records the
 * amaxes into the layer's scaling states and puts them in the scope's bucket,
 * and fills *residuals. Outside an enabled scope it computes in high precision
 * (and records amaxes when calibrating). y: [..., out_features], activation
 * dtype. Errors: INVALID_ARGUMENT (NULLs, dtype/shape/device mismatch),
 * UNSUPPORTED (FP8 with tokens, in or out not a multiple of 16),
 * OUT_OF_MEMORY. On failure y, *residuals and all state are unchanged. */
TE_API te_status te_linear_forward_compute(te_context *ctx, te_linear *lin,
                                           const te_linear_forward_args *args, te_tensor *y,
                                           te_linear_residuals *residuals);

/* Frees residuals that were not handed to forward_save. Idempotent; NULL ok.
 * `internal` is a handle owned by one struct: after forward_save or a release,
 * every copy of the struct names nothing (saving or releasing a copy is then
 * INVALID_ARGUMENT or a no-op, never a double free). */
TE_API void te_linear_residuals_release(te_linear_residuals *residuals);

typedef struct te_linear_backward_ctx te_linear_backward_ctx;

/* The context-saving step: packs *residuals (taking ownership: residuals->
 * internal becomes NULL) into a backward context. Errors: INVALID_ARGUMENT
 * (NULLs, residuals not from forward_compute or already saved). */
TE_API te_status te_linear_forward_save(te_context *ctx, te_linear *lin,
                                        te_linear_residuals *residuals,
                                        te_linear_backward_ctx **out);

/* forward_compute followed by forward_save. */
TE_API te_status te_linear_forward(te_context *ctx, te_linear *lin,
                                   const te_linear_forward_args *args, te_tensor *y,
                                   te_linear_backward_ctx **out);

#define TE_BACKWARD_ONCE 1u /* free the residuals when backward returns */

typedef struct te_linear_backward_args {
  size_t struct_size;
  uint32_t flags; /* TE_BACKWARD_ONCE */
} te_linear_backward_args;

TE_API te_status te_linear_backward_args_init(te_linear_backward_args *args);

/* Quantizes dy (E5M2 under HYBRID, E4M3 otherwise) with its transpose and
 * computes dx = dy W, dW = dy^T x (added into dw when the layer fuses wgrad
 * accumulation), db = sum over tokens of dy. Any of dx, dw, db may be NULL to
 * skip it (db must be NULL without bias). args may be NULL. Callable again
 * with identical results until the context is destroyed, unless
 * TE_BACKWARD_ONCE was given (later calls: INVALID_STATE). When this is the
 * backward of the first FP8 module of its autocast pass, the pass's backward
 * buckets are reduced and updated after it. Errors: INVALID_ARGUMENT (dy not
 * [tokens, out] of the activation dtype, dx not [tokens, in], dw not
 * [out, in] of the activation dtype or F32 with fused accumulation, db given
 * to a layer without bias, unknown flags), INVALID_STATE. On failure the
 * outputs, the layer's state and a TE_BACKWARD_ONCE context are unchanged. */
TE_API te_status te_linear_backward(te_context *ctx, te_linear_backward_ctx *bwd,
                                    const te_tensor *dy, te_tensor *dx, te_tensor *dw,
                                    te_tensor *db, const te_linear_backward_args *args);

/* Frees the backward context and the residuals it owns. NULL is a no-op. */
TE_API void te_linear_backward_ctx_destroy(te_linear_backward_ctx *bwd);

/* Residuals in the caller's memory. forward_compute keeps what backward needs in
 * library-owned storage behind an opaque handle. A framework that must own every tensor
 * saved between forward and backward (torch.compile, CUDA-graph capture, activation
 * offloading) uses these three calls instead; the opaque path stays as it is:
 *   1. te_linear_residuals_size: the bytes of residual memory a forward with these
 *      arguments leaves under the innermost autocast scope as it is now. It reads only the
 *      shapes of args' tensors (their data may be NULL). 0 when the forward will run in high
 *      precision: the backward then reads x and W themselves.
 *   2. te_linear_forward_compute_into: forward_compute, writing the activation residuals
 *      (FP8: x^T and its scale_inv) into `residuals`, memory on ctx's device, 16-byte
 *      aligned, at least residuals_size bytes (NULL when that is 0).
 *   3. te_linear_backward_from: te_linear_backward given that memory and the forward's
 *      arguments again (`inputs`: the same tensors, which may have moved).
 * The layer keeps the small host-side rest of each FP8 forward (its recipe, its autocast
 * pass, a reference to the FP8 weight it used) keyed by the residual memory's address, for
 * its last TE_RESIDUAL_RECORDS such forwards: a forward into the same address replaces the
 * record, the oldest is dropped past that many, and a TE_BACKWARD_ONCE backward_from or
 * te_linear_destroy drops them. So each forward whose backward is pending needs memory of
 * its own. Repeated backward_from calls give identical results until a TE_BACKWARD_ONCE one.
 * Errors of forward_compute_into: those of forward_compute, and INVALID_ARGUMENT for
 * residual memory that is too small, misaligned or NULL; nothing changes on failure. */
#define TE_RESIDUAL_RECORDS 64
TE_API te_status te_linear_residuals_size(te_context *ctx, const te_linear *lin,
                                          const te_linear_forward_args *args, size_t *bytes);
TE_API te_status te_linear_forward_compute_into(te_context *ctx, te_linear *lin,
                                                const te_linear_forward_args *args, te_tensor *y,
                                                void *residuals, size_t residuals_bytes);
/* Errors: as te_linear_backward, and INVALID_ARGUMENT for residual memory that no FP8
 * forward_compute_into of this layer filled (or whose record was dropped), or inputs whose
 * shapes differ from the forward's. With residuals NULL and residuals_bytes 0 the backward
 * is the high-precision one over inputs->input and inputs->weight. inputs->bias is never
 * read and may be NULL; one that is given is checked as the forward checks it. */
TE_API te_status te_linear_backward_from(te_context *ctx, te_linear *lin,
                                         const te_linear_forward_args *inputs,
                                         const void *residuals, size_t residuals_bytes,
                                         const te_tensor *dy, te_tensor *dx, te_tensor *dw,
                                         te_tensor *db, const te_linear_backward_args *args);

/* Which scaling state of a linear. */
typedef enum te_tensor_role {
  TE_ROLE_INPUT = 0,      /* forward: x */
  TE_ROLE_WEIGHT = 1,     /* forward: W */
  TE_ROLE_GRAD_OUTPUT = 2 /* backward: dy */
} te_tensor_role;

typedef struct te_scaling_state_info {
  size_t struct_size;
  float scale;
  float scale_inv;
  int32_t amax_history_len; /* 0 until the state is first used in FP8 */
  te_dtype fp8_dtype;       /* of the last use; E4M3 before the first */
} te_scaling_state_info;

/* Copies one scaling state to the host (synchronises ctx). `history` may be
 * NULL; otherwise min(history_cap, amax_history_len) floats are written,
 * slot 0 (the current amax) first. */
TE_API te_status te_linear_get_scaling_state(te_context *ctx, const te_linear *lin,
                                             te_tensor_role role, te_scaling_state_info *info,
                                             float *history, size_t history_cap);

/* Serialises the layer's FP8 state (histories, scales) into buf, a versioned
 * byte format; round trips are bit-exact. With buf NULL, only *size is set to
 * the bytes needed. Errors: INVALID_ARGUMENT when capacity is too small. */
TE_API te_status te_linear_state_save(te_context *ctx, const te_linear *lin, void *buf,
                                      size_t capacity, size_t *size);
/* Restores what state_save wrote. Accepts exactly what state_save can write:
 * a used state has a scale in [2^-63, FLT_MAX], scale_inv == 1/scale, and
 * history entries that are amaxes (+0, positive or +inf; state_save writes a
 * NaN amax as 0, which scale updates treat alike); a never-used one has length
 * 0, E4M3 and scale = scale_inv = 1. Errors: INVALID_ARGUMENT for a buffer
 * that is truncated, of another version, for another layer shape, or holds
 * any other value; INVALID_STATE while an open autocast scope or a pending
 * backward pass holds the layer's scaling states (load after
 * te_autocast_end and the backward, or te_autocast_flush_backward). */
TE_API te_status te_linear_state_load(te_context *ctx, te_linear *lin, const void *buf,
                                      size_t size);

/* ------------------------------------------------------------------------- */
/* Activations                                                               */
/* ------------------------------------------------------------------------- */

typedef enum te_activation {
  TE_ACTIVATION_RELU = 0,
  TE_ACTIVATION_GELU = 1,   /* tanh approximation, as TE */
  TE_ACTIVATION_SWIGLU = 2, /* x [..., 2n] -> silu(x[..., :n]) * x[..., n:] : [..., n] */
  TE_ACTIVATION_GEGLU = 3,  /* x [..., 2n] -> gelu(x[..., :n]) * x[..., n:] : [..., n] */
  TE_ACTIVATION_SRELU = 4   /* squared ReLU: max(x, 0)^2 */
} te_activation;

/* y = act(x). x, y: F32, F16 or BF16, same dtype and device; y's shape is x's
 * (last dim halved for the gated SwiGLU and GEGLU). Computed in fp32.
 * Errors: INVALID_ARGUMENT for a dtype or shape mismatch or an odd last
 * dimension under a gated activation. */
TE_API te_status te_activation_forward(te_context *ctx, te_activation act, const te_tensor *x,
                                       te_tensor *y);
/* dx = dy * act'(x): dy has y's shape, dx has x's. Errors as forward. */
TE_API te_status te_activation_backward(te_context *ctx, te_activation act, const te_tensor *x,
                                        const te_tensor *dy, te_tensor *dx);

/* ------------------------------------------------------------------------- */
/* Primitives                                                                */
/* ------------------------------------------------------------------------- */

typedef struct te_quantize_options {
  size_t struct_size;
  /* Per-tensor scaling: the scale to use (one float on the tensor's device,
   * delayed scaling). NULL: compute it from x's amax (current scaling). */
  const float *scale;
  /* Optional: x's amax is max-accumulated into this float (same device). */
  float *amax;
  float amax_epsilon;        /* computed scales: amax clamped up to this */
  int32_t power_of_2_scales; /* computed scales: keep only the exponent */
} te_quantize_options;

TE_API te_status te_quantize_options_init(te_quantize_options *opts);

/* out = saturate_rne(x * scale) in out->dtype (E4M3 or E5M2), with
 * out->scale_inv written (1/scale, or one per block by out->scaling). x: F32,
 * F16 or BF16 of out's shape. opts may be NULL (current scaling, epsilon 0).
 * Any shape. Errors: INVALID_ARGUMENT (x not F32/F16/BF16, out not FP8, shapes
 * differ, opts->scale given with block scaling, a negative or infinite
 * epsilon). */
TE_API te_status te_quantize(te_context *ctx, const te_tensor *x, te_tensor *out,
                             const te_quantize_options *opts);

/* Quantizes x [rows, cols] into out [rows, cols] and out_t [cols, rows] (its
 * transpose: the K-major operand FP8 GEMMs need) in one pass. Per-tensor:
 * out_t is exactly the transpose of out with the same scale. 1x128 blocks:
 * out_t is x^T quantized with its own 1x128 blocks. 128x128: the transposed
 * tile grid. Either output may be NULL. opts may be NULL, as for te_quantize. */
TE_API te_status te_cast_transpose(te_context *ctx, const te_tensor *x, te_tensor *out,
                                   te_tensor *out_t, const te_quantize_options *opts);

/* out = code * scale_inv, into F32, F16 or BF16 of x's shape. Errors:
 * INVALID_ARGUMENT (x not FP8, out not high precision, shapes differ). */
TE_API te_status te_dequantize(te_context *ctx, const te_tensor *x, te_tensor *out);

/* *amax = max |x| over x (NaN if x holds a NaN), written to one float on x's
 * device. Errors: INVALID_ARGUMENT (x not F32/F16/BF16). */
TE_API te_status te_amax(te_context *ctx, const te_tensor *x, float *amax);

typedef enum te_epilogue {
  TE_EPILOGUE_NONE = 0,
  TE_EPILOGUE_BIAS = 1,     /* result + bias[n] */
  TE_EPILOGUE_GELU = 2,     /* gelu(result) */
  TE_EPILOGUE_BIAS_GELU = 3 /* gelu(result + bias[n]) */
} te_epilogue;

typedef struct te_gemm_options {
  size_t struct_size;
  int32_t transa;               /* op(A) = A^T */
  int32_t transb;               /* op(B) = B^T */
  te_epilogue epilogue;
  const te_tensor *bias;        /* [n], F32/F16/BF16, for BIAS epilogues */
  te_tensor *gelu_input;        /* optional: pre-GELU values [m, n] for GELU epilogues */
  int32_t accumulate;           /* the result includes the old D (before the epilogue) */
  int32_t use_split_accumulator;/* FP8: promote partial sums to fp32 often (exact here) */
} te_gemm_options;

TE_API te_status te_gemm_options_init(te_gemm_options *opts);

/* D[m, n] = epilogue(op(A)[m, k] op(B)[k, n] (+ D when accumulating)), row-major
 * 2-D tensors, computed in fp32 in cuBLASLt's order (product, + old D, + bias,
 * GELU), then stored in D's dtype (F32, F16, BF16). A and B are both FP8 or both
 * of one high-precision dtype. FP8 follows cuBLASLt's rules on every backend:
 * transa = 0 and transb = 1 (both operands K-major), m, n, k multiples of 16,
 * not both E5M2; per-tensor scaling multiplies by both scale_inv; block
 * scaled operands (A 1x128, B 1x128 or 128x128) are dequantized per block.
 * opts may be NULL: te_gemm_options_init's defaults (no transposes, no
 * epilogue). Errors: INVALID_ARGUMENT, UNSUPPORTED. */
TE_API te_status te_gemm(te_context *ctx, const te_tensor *a, const te_tensor *b, te_tensor *d,
                         const te_gemm_options *opts);

/* ------------------------------------------------------------------------- */
/* Normalization                                                             */
/* ------------------------------------------------------------------------- */

typedef enum te_norm_kind {
  TE_NORM_LAYERNORM = 0, /* (x - mean) / sqrt(var + eps) * gamma + beta */
  TE_NORM_RMSNORM = 1    /* x / sqrt(mean(x^2) + eps) * gamma */
} te_norm_kind;

typedef struct te_norm_options {
  size_t struct_size;
  te_norm_kind kind;           /* default LAYERNORM */
  float eps;                   /* default 1e-5; finite and > 0 */
  int32_t zero_centered_gamma; /* default 0; 1: the scale applied is (1 + gamma),
                                  so gamma = 0 is the identity (TE's option) */
} te_norm_options;

TE_API te_status te_norm_options_init(te_norm_options *opts);

/* Arguments of te_norm_forward. The norm runs over the last dimension of the
 * input; `rows` below is the product of its other dimensions. */
typedef struct te_norm_forward_args {
  size_t struct_size;
  const te_tensor *input;  /* x [..., hidden]: F32, F16 or BF16 */
  const te_tensor *weight; /* gamma [hidden], x's dtype */
  const te_tensor *bias;   /* beta [hidden], x's dtype: required by LayerNorm,
                              NULL for RMSNorm */
  te_tensor *output;       /* y [..., hidden] (or [rows, hidden]): F32/F16/BF16,
                              or E4M3/E5M2 with per-tensor scaling; may be
                              NULL when output_t is given */
  te_tensor *output_t;     /* optional FP8 [hidden, rows]: y transposed (the
                              K-major operand an FP8 wgrad GEMM needs) */
  te_tensor *mu;           /* optional F32 [rows]: the means (LayerNorm only) */
  te_tensor *rsigma;       /* optional F32 [rows]: 1 / sqrt(var + eps) */
  /* FP8 outputs: quantize->scale is the scale to use (delayed scaling); NULL
   * (or quantize NULL): current scaling from y's own amax, with
   * quantize->amax_epsilon and power_of_2_scales. quantize->amax, when set,
   * max-accumulates the amax of the normalised values in any mode. */
  const te_quantize_options *quantize;
} te_norm_forward_args;

TE_API te_status te_norm_forward_args_init(te_norm_forward_args *args);

/* LayerNorm or RMSNorm forward, statistics in fp32 (the order of the sums is
 * fixed, so every backend gives bit-identical statistics, outputs and FP8
 * codes). With an FP8 output and a given scale the GPU normalises, casts,
 * transposes and records the amax in one pass. opts may be NULL (defaults).
 * The output may be F32, F16 or BF16 whatever x's dtype, and a
 * high-precision output may come with an FP8 output_t; mu and rsigma may
 * also be shaped as x's leading dimensions. No size rule: any rows and hidden.
 * Errors: INVALID_ARGUMENT (dtype/shape/device mismatch, a beta given to
 * RMSNorm or missing for LayerNorm, mu with RMSNorm, no output at all,
 * output_t not FP8, FP8 outputs of two dtypes, block scaling, a scale with no
 * FP8 output). */
TE_API te_status te_norm_forward(te_context *ctx, const te_norm_options *opts,
                                 const te_norm_forward_args *args);

/* Norm backward: from dy (x's shape, or [rows, hidden]; x's dtype), the
 * forward's x, gamma (x's dtype) and saved statistics (mu: LayerNorm only,
 * NULL for RMSNorm), computes dx (dy's shape, x's dtype), dgamma [hidden] and
 * dbeta [hidden] (LayerNorm only), gamma's dtype; each output may be NULL.
 * dgamma and dbeta are written (not accumulated) and deterministic. opts may
 * be NULL (defaults; it must be the forward's). Errors: INVALID_ARGUMENT. */
TE_API te_status te_norm_backward(te_context *ctx, const te_norm_options *opts, const te_tensor *dy,
                                  const te_tensor *x, const te_tensor *gamma, const te_tensor *mu,
                                  const te_tensor *rsigma, te_tensor *dx, te_tensor *dgamma,
                                  te_tensor *dbeta);

/* ------------------------------------------------------------------------- */
/* Transformer modules: LayerNormLinear, LayerNormMLP, GroupedLinear          */
/* ------------------------------------------------------------------------- */
/*
 * They follow te_linear's contract point for point: options with an _init,
 * create/destroy, forward split into a pure forward_compute that fills a
 * residuals struct (released with ..._residuals_release or handed to
 * ..._forward_save, which packs it into a backward context), ..._forward
 * doing both, a backward callable again with identical results until the
 * backward context is destroyed (TE_BACKWARD_ONCE frees it at the first),
 * the FP8 weight cache (weight_unchanged), main_grad accumulation
 * (fuse_wgrad_accumulation: dW added into F32 tensors), scaling-state
 * inspection and versioned, bit-exact state save/load. Backward takes a
 * te_linear_backward_args (its flags) for every module. Every GEMM's three
 * scaling states (input, weight, grad_output) join the innermost autocast
 * scope's buckets exactly as a te_linear's do.
 *
 * What the caller passes in stays the caller's and is referenced, not
 * copied: the input x and the norm's gamma (always, for the norm's backward)
 * and the weights (when the forward ran in high precision) must stay alive
 * and unchanged until the backward context is destroyed.
 */

/* LayerNormLinear: y = norm(x) W^T + b, TE's LayerNormLinear (a QKV
 * projection). Under FP8 with delayed scaling the norm writes the GEMM's FP8
 * input, its transpose and its amax in one pass. */
typedef struct te_layernorm_linear te_layernorm_linear;

typedef struct te_layernorm_linear_options {
  size_t struct_size;
  int64_t in_features;              /* required, > 0 */
  int64_t out_features;             /* required, > 0 */
  int32_t bias;                     /* default 1 */
  te_dtype activation_dtype;        /* F32, F16 or BF16 (default BF16) */
  int32_t fuse_wgrad_accumulation;  /* default 0 */
  te_norm_kind normalization;       /* default LAYERNORM */
  float eps;                        /* default 1e-5 */
  int32_t zero_centered_gamma;      /* default 0 */
} te_layernorm_linear_options;

TE_API te_status te_layernorm_linear_options_init(te_layernorm_linear_options *opts);
/* Errors: INVALID_ARGUMENT (a field out of range, named). */
TE_API te_status te_layernorm_linear_create(te_layernorm_linear **out, te_context *ctx,
                                            const te_layernorm_linear_options *opts);
TE_API void te_layernorm_linear_destroy(te_layernorm_linear *m);

typedef struct te_layernorm_linear_forward_args {
  size_t struct_size;
  const te_tensor *input;     /* x [..., in_features] */
  const te_tensor *ln_weight; /* gamma [in_features] */
  const te_tensor *ln_bias;   /* beta [in_features]: LayerNorm only (NULL for RMSNorm) */
  const te_tensor *weight;    /* W [out_features, in_features] */
  const te_tensor *bias;      /* b [out_features]; NULL iff the layer has no bias */
  int32_t weight_unchanged;   /* as te_linear_forward_args */
  te_tensor *ln_out;          /* optional output: norm(x) [..., in_features] in the
                                 activation dtype (TE's return_layernorm_output) */
} te_layernorm_linear_forward_args;

TE_API te_status te_layernorm_linear_forward_args_init(te_layernorm_linear_forward_args *args);

/* Views of library-owned storage; set struct_size before the call. */
typedef struct te_layernorm_linear_residuals {
  size_t struct_size;
  te_tensor ln_out_t; /* FP8: norm(x)^T [in, tokens] with its scale_inv; else norm(x) */
  te_tensor weight_t; /* FP8: W^T [in, out]; else the caller's W */
  te_tensor mu;       /* F32 [tokens] (LayerNorm; data NULL for RMSNorm) */
  te_tensor rsigma;   /* F32 [tokens] */
  int32_t fp8;
  void *internal;     /* a handle owned by one struct: do not touch */
} te_layernorm_linear_residuals;

/* Errors: as te_linear_forward_compute, and INVALID_ARGUMENT for gamma/beta
 * not [in_features] of the activation dtype, a beta given to RMSNorm or
 * missing for LayerNorm, ln_out not like x. */
TE_API te_status te_layernorm_linear_forward_compute(te_context *ctx, te_layernorm_linear *m,
                                                     const te_layernorm_linear_forward_args *args,
                                                     te_tensor *y,
                                                     te_layernorm_linear_residuals *residuals);
TE_API void te_layernorm_linear_residuals_release(te_layernorm_linear_residuals *residuals);

typedef struct te_layernorm_linear_backward_ctx te_layernorm_linear_backward_ctx;

TE_API te_status te_layernorm_linear_forward_save(te_context *ctx, te_layernorm_linear *m,
                                                  te_layernorm_linear_residuals *residuals,
                                                  te_layernorm_linear_backward_ctx **out);
TE_API te_status te_layernorm_linear_forward(te_context *ctx, te_layernorm_linear *m,
                                             const te_layernorm_linear_forward_args *args,
                                             te_tensor *y, te_layernorm_linear_backward_ctx **out);

/* The gradients backward writes; every pointer may be NULL to skip it. */
typedef struct te_layernorm_linear_grads {
  size_t struct_size;
  te_tensor *dx;         /* [..., in] (dx through the norm), activation dtype */
  te_tensor *dln_weight; /* dgamma [in] */
  te_tensor *dln_bias;   /* dbeta [in]: LayerNorm only */
  te_tensor *dw;         /* [out, in]; F32 and added into with fuse_wgrad_accumulation */
  te_tensor *db;         /* [out]: layers with bias only */
} te_layernorm_linear_grads;

TE_API te_status te_layernorm_linear_grads_init(te_layernorm_linear_grads *grads);

/* dy [tokens, out] (any leading shape with tokens rows) -> the requested
 * gradients. grads and args may be NULL (nothing requested / no flags).
 * Errors: as te_linear_backward. */
TE_API te_status te_layernorm_linear_backward(te_context *ctx,
                                              te_layernorm_linear_backward_ctx *bwd,
                                              const te_tensor *dy,
                                              const te_layernorm_linear_grads *grads,
                                              const te_linear_backward_args *args);
TE_API void te_layernorm_linear_backward_ctx_destroy(te_layernorm_linear_backward_ctx *bwd);

/* Residuals in the caller's memory: as te_linear's caller-memory calls (records, alignment,
 * errors). The block holds the norm's statistics (mu for LayerNorm, rsigma: fp32 [tokens])
 * and the GEMM's activation residual: under FP8 the normalised x^T with its scale_inv, in
 * high precision the normalised x itself, so the size is never 0 and residuals is never
 * NULL. inputs must give x, ln_weight (ln_bias), weight (bias) again, as the forward got them
 * (they may have moved), checked as the forward checks them (ln_out is not written). */
TE_API te_status te_layernorm_linear_residuals_size(te_context *ctx, const te_layernorm_linear *m,
                                                    const te_layernorm_linear_forward_args *args,
                                                    size_t *bytes);
TE_API te_status te_layernorm_linear_forward_compute_into(te_context *ctx, te_layernorm_linear *m,
                                                          const te_layernorm_linear_forward_args *args,
                                                          te_tensor *y, void *residuals,
                                                          size_t residuals_bytes);
TE_API te_status te_layernorm_linear_backward_from(te_context *ctx, te_layernorm_linear *m,
                                                   const te_layernorm_linear_forward_args *inputs,
                                                   const void *residuals, size_t residuals_bytes,
                                                   const te_tensor *dy,
                                                   const te_layernorm_linear_grads *grads,
                                                   const te_linear_backward_args *args);

TE_API te_status te_layernorm_linear_get_scaling_state(te_context *ctx,
                                                       const te_layernorm_linear *m,
                                                       te_tensor_role role,
                                                       te_scaling_state_info *info,
                                                       float *history, size_t history_cap);
TE_API te_status te_layernorm_linear_state_save(te_context *ctx, const te_layernorm_linear *m,
                                                void *buf, size_t capacity, size_t *size);
TE_API te_status te_layernorm_linear_state_load(te_context *ctx, te_layernorm_linear *m,
                                                const void *buf, size_t size);

/* LayerNormMLP: y = fc2(act(fc1(norm(x)))), TE's LayerNormMLP (the
 * feed-forward block). Under FP8 with delayed scaling the norm writes fc1's
 * FP8 input (with its amax); the activation's output is quantized for fc2 by
 * a separate cast (not yet fused into the activation); fc1's output (the
 * activation's input) is kept in the activation dtype for the backward.
 * fc1's weight is [ffn_hidden_size, hidden_size], or [2 * ffn_hidden_size,
 * hidden_size] for the gated SwiGLU and GEGLU (gate rows first); fc2's is
 * [hidden_size, ffn_hidden_size]. */
typedef struct te_layernorm_mlp te_layernorm_mlp;

typedef struct te_layernorm_mlp_options {
  size_t struct_size;
  int64_t hidden_size;              /* required, > 0 */
  int64_t ffn_hidden_size;          /* required, > 0 */
  int32_t bias;                     /* default 1: fc1 and fc2 have biases */
  te_activation activation;         /* default GELU */
  te_dtype activation_dtype;        /* F32, F16 or BF16 (default BF16) */
  int32_t fuse_wgrad_accumulation;  /* default 0 */
  te_norm_kind normalization;       /* default LAYERNORM */
  float eps;                        /* default 1e-5 */
  int32_t zero_centered_gamma;      /* default 0 */
} te_layernorm_mlp_options;

TE_API te_status te_layernorm_mlp_options_init(te_layernorm_mlp_options *opts);
TE_API te_status te_layernorm_mlp_create(te_layernorm_mlp **out, te_context *ctx,
                                         const te_layernorm_mlp_options *opts);
TE_API void te_layernorm_mlp_destroy(te_layernorm_mlp *m);

typedef struct te_layernorm_mlp_forward_args {
  size_t struct_size;
  const te_tensor *input;      /* x [..., hidden] */
  const te_tensor *ln_weight;  /* gamma [hidden] */
  const te_tensor *ln_bias;    /* beta [hidden]: LayerNorm only */
  const te_tensor *fc1_weight; /* [ffn (x2 gated), hidden] */
  const te_tensor *fc1_bias;   /* [ffn (x2 gated)]; NULL iff no bias */
  const te_tensor *fc2_weight; /* [hidden, ffn] */
  const te_tensor *fc2_bias;   /* [hidden]; NULL iff no bias */
  int32_t weight_unchanged;    /* both FP8 weights may be reused */
  te_tensor *ln_out;           /* optional output: norm(x) [..., hidden] */
} te_layernorm_mlp_forward_args;

TE_API te_status te_layernorm_mlp_forward_args_init(te_layernorm_mlp_forward_args *args);

typedef struct te_layernorm_mlp_residuals {
  size_t struct_size;
  te_tensor ln_out_t;     /* FP8: norm(x)^T; else norm(x) */
  te_tensor fc1_weight_t; /* FP8: fc1 W^T; else the caller's */
  te_tensor fc1_out;      /* fc1's output (activation input) [tokens, ffn (x2)] */
  te_tensor act_out_t;    /* FP8: act(fc1_out)^T [ffn, tokens]; else act(fc1_out) */
  te_tensor fc2_weight_t; /* FP8: fc2 W^T; else the caller's */
  te_tensor mu;           /* F32 [tokens] (LayerNorm) */
  te_tensor rsigma;       /* F32 [tokens] */
  int32_t fp8;
  void *internal;
} te_layernorm_mlp_residuals;

/* Errors: as te_layernorm_linear_forward_compute (UNSUPPORTED under FP8 when
 * tokens, hidden or ffn (x2 gated) is not a multiple of 16). */
TE_API te_status te_layernorm_mlp_forward_compute(te_context *ctx, te_layernorm_mlp *m,
                                                  const te_layernorm_mlp_forward_args *args,
                                                  te_tensor *y, te_layernorm_mlp_residuals *residuals);
TE_API void te_layernorm_mlp_residuals_release(te_layernorm_mlp_residuals *residuals);

typedef struct te_layernorm_mlp_backward_ctx te_layernorm_mlp_backward_ctx;

TE_API te_status te_layernorm_mlp_forward_save(te_context *ctx, te_layernorm_mlp *m,
                                               te_layernorm_mlp_residuals *residuals,
                                               te_layernorm_mlp_backward_ctx **out);
TE_API te_status te_layernorm_mlp_forward(te_context *ctx, te_layernorm_mlp *m,
                                          const te_layernorm_mlp_forward_args *args, te_tensor *y,
                                          te_layernorm_mlp_backward_ctx **out);

typedef struct te_layernorm_mlp_grads {
  size_t struct_size;
  te_tensor *dx;          /* [..., hidden] */
  te_tensor *dln_weight;  /* [hidden] */
  te_tensor *dln_bias;    /* [hidden]: LayerNorm only */
  te_tensor *dfc1_weight; /* fc1 W's shape; F32 added into with fuse_wgrad_accumulation */
  te_tensor *dfc1_bias;
  te_tensor *dfc2_weight;
  te_tensor *dfc2_bias;
} te_layernorm_mlp_grads;

TE_API te_status te_layernorm_mlp_grads_init(te_layernorm_mlp_grads *grads);
TE_API te_status te_layernorm_mlp_backward(te_context *ctx, te_layernorm_mlp_backward_ctx *bwd,
                                           const te_tensor *dy, const te_layernorm_mlp_grads *grads,
                                           const te_linear_backward_args *args);
TE_API void te_layernorm_mlp_backward_ctx_destroy(te_layernorm_mlp_backward_ctx *bwd);

/* Residuals in the caller's memory: as te_linear's caller-memory calls (records, alignment,
 * errors). The block holds the norm's statistics (mu for LayerNorm, rsigma: fp32 [tokens]),
 * fc1's output [tokens, fc1 rows] in the activation dtype, and the GEMMs' activation
 * residuals: under FP8 fc1's and fc2's x^T with their scale_invs, in high precision the
 * normalised x and the activation's output [tokens, ffn]; so the size is never 0 and
 * residuals is never NULL. inputs must give x, ln_weight (ln_bias) and both weights (biases)
 * again, as the forward got them (they may have moved), checked as the forward checks them
 * (ln_out is not written). */
TE_API te_status te_layernorm_mlp_residuals_size(te_context *ctx, const te_layernorm_mlp *m,
                                                 const te_layernorm_mlp_forward_args *args,
                                                 size_t *bytes);
TE_API te_status te_layernorm_mlp_forward_compute_into(te_context *ctx, te_layernorm_mlp *m,
                                                       const te_layernorm_mlp_forward_args *args,
                                                       te_tensor *y, void *residuals,
                                                       size_t residuals_bytes);
TE_API te_status te_layernorm_mlp_backward_from(te_context *ctx, te_layernorm_mlp *m,
                                                const te_layernorm_mlp_forward_args *inputs,
                                                const void *residuals, size_t residuals_bytes,
                                                const te_tensor *dy,
                                                const te_layernorm_mlp_grads *grads,
                                                const te_linear_backward_args *args);

/* Which GEMM of a LayerNormMLP. Its saved state records hidden, ffn and fc1's
 * rows (so a gated block's state does not load into an ungated one). */
typedef enum te_mlp_gemm { TE_MLP_FC1 = 0, TE_MLP_FC2 = 1 } te_mlp_gemm;

TE_API te_status te_layernorm_mlp_get_scaling_state(te_context *ctx, const te_layernorm_mlp *m,
                                                    te_mlp_gemm gemm, te_tensor_role role,
                                                    te_scaling_state_info *info, float *history,
                                                    size_t history_cap);
TE_API te_status te_layernorm_mlp_state_save(te_context *ctx, const te_layernorm_mlp *m, void *buf,
                                             size_t capacity, size_t *size);
TE_API te_status te_layernorm_mlp_state_load(te_context *ctx, te_layernorm_mlp *m, const void *buf,
                                             size_t size);

/* GroupedLinear: num_gemms experts sharing in/out features, TE's
 * GroupedLinear (mixture of experts). A call splits the input's rows into
 * consecutive groups of m_splits[i] tokens (a host array; counts may be 0 and
 * need not be multiples of 16: under FP8 each group is padded to 16 rows
 * inside the library, never by the caller); group i goes through expert i:
 * y_i = x_i W_i^T + b_i. Each expert has its own three scaling states; all of
 * them join the scope's bucket for (recipe, group) together, so a pass still
 * makes one amax reduction and one scale update per bucket. An expert that
 * gets no tokens runs no GEMM: its scaling states take no part in that pass
 * (nothing recorded, no history roll), and unless weight_unchanged is set its
 * cached FP8 weight is dropped, so that a later weight_unchanged forward
 * quantizes the current weight. The arrays below are read for num_gemms
 * entries: pass arrays of exactly that length. */
typedef struct te_grouped_linear te_grouped_linear;

#define TE_GROUPED_LINEAR_MAX_GEMMS 1024

typedef struct te_grouped_linear_options {
  size_t struct_size;
  int32_t num_gemms;                /* required, 1..TE_GROUPED_LINEAR_MAX_GEMMS */
  int64_t in_features;              /* required, > 0 */
  int64_t out_features;             /* required, > 0 */
  int32_t bias;                     /* default 1 */
  te_dtype activation_dtype;        /* F32, F16 or BF16 (default BF16) */
  int32_t fuse_wgrad_accumulation;  /* default 0 */
} te_grouped_linear_options;

TE_API te_status te_grouped_linear_options_init(te_grouped_linear_options *opts);
TE_API te_status te_grouped_linear_create(te_grouped_linear **out, te_context *ctx,
                                          const te_grouped_linear_options *opts);
TE_API void te_grouped_linear_destroy(te_grouped_linear *g);

typedef struct te_grouped_linear_forward_args {
  size_t struct_size;
  const te_tensor *input;           /* x [..., in] with sum(m_splits) rows */
  const int64_t *m_splits;          /* host array [num_gemms], each >= 0 */
  const te_tensor *const *weights;  /* [num_gemms] pointers, each W_i [out, in] */
  const te_tensor *const *biases;   /* [num_gemms] pointers, each b_i [out];
                                       NULL iff the layer has no bias */
  int32_t weight_unchanged;         /* every expert's FP8 weight may be reused */
} te_grouped_linear_forward_args;

TE_API te_status te_grouped_linear_forward_args_init(te_grouped_linear_forward_args *args);

typedef struct te_grouped_linear_residuals {
  size_t struct_size;
  int32_t fp8;
  void *internal;
} te_grouped_linear_residuals;

/* y [..., out] with x's rows. Errors: INVALID_ARGUMENT (m_splits NULL, a
 * negative count, counts not summing to x's rows, a weight or bias NULL or
 * of the wrong shape/dtype/device), UNSUPPORTED (FP8 with in or out not a
 * multiple of 16). */
TE_API te_status te_grouped_linear_forward_compute(te_context *ctx, te_grouped_linear *g,
                                                   const te_grouped_linear_forward_args *args,
                                                   te_tensor *y,
                                                   te_grouped_linear_residuals *residuals);
TE_API void te_grouped_linear_residuals_release(te_grouped_linear_residuals *residuals);

typedef struct te_grouped_linear_backward_ctx te_grouped_linear_backward_ctx;

TE_API te_status te_grouped_linear_forward_save(te_context *ctx, te_grouped_linear *g,
                                                te_grouped_linear_residuals *residuals,
                                                te_grouped_linear_backward_ctx **out);
TE_API te_status te_grouped_linear_forward(te_context *ctx, te_grouped_linear *g,
                                           const te_grouped_linear_forward_args *args,
                                           te_tensor *y, te_grouped_linear_backward_ctx **out);

/* dy [tokens, out] -> dx [tokens, in], dw[i] [out, in] and db[i] [out] for
 * every expert (dw and db are arrays of num_gemms pointers; each array, and
 * dx, may be NULL to skip it, but a given array's every entry must be a
 * tensor; an expert that got no tokens gets dW = 0, or nothing added with
 * fuse_wgrad_accumulation, and db = 0). args may be NULL. Errors: as
 * te_linear_backward, and INVALID_ARGUMENT for a NULL or misshapen dw[i] or
 * db[i]. */
TE_API te_status te_grouped_linear_backward(te_context *ctx, te_grouped_linear_backward_ctx *bwd,
                                            const te_tensor *dy, te_tensor *dx,
                                            te_tensor *const *dw, te_tensor *const *db,
                                            const te_linear_backward_args *args);
TE_API void te_grouped_linear_backward_ctx_destroy(te_grouped_linear_backward_ctx *bwd);

/* Residuals in the caller's memory: as te_linear's caller-memory calls (records, alignment,
 * errors, the high-precision path). Under FP8 the block holds every expert's x^T, of its rows
 * zero-padded to a multiple of 16, with its scale_inv (an expert without tokens: nothing);
 * residuals_size reads args->m_splits (host ints) and the input's shape. In high precision
 * the size is 0: residuals NULL, and backward_from needs inputs (x, m_splits, the weights).
 * Under FP8 inputs may be NULL; when given, its shapes and m_splits must be the forward's. */
TE_API te_status te_grouped_linear_residuals_size(te_context *ctx, const te_grouped_linear *g,
                                                  const te_grouped_linear_forward_args *args,
                                                  size_t *bytes);
TE_API te_status te_grouped_linear_forward_compute_into(te_context *ctx, te_grouped_linear *g,
                                                        const te_grouped_linear_forward_args *args,
                                                        te_tensor *y, void *residuals,
                                                        size_t residuals_bytes);
TE_API te_status te_grouped_linear_backward_from(te_context *ctx, te_grouped_linear *g,
                                                 const te_grouped_linear_forward_args *inputs,
                                                 const void *residuals, size_t residuals_bytes,
                                                 const te_tensor *dy, te_tensor *dx,
                                                 te_tensor *const *dw, te_tensor *const *db,
                                                 const te_linear_backward_args *args);

/* `expert` in 0..num_gemms-1 (INVALID_ARGUMENT otherwise). State save/load
 * as te_linear's (load: INVALID_STATE while a pass holds the states). */
TE_API te_status te_grouped_linear_get_scaling_state(te_context *ctx, const te_grouped_linear *g,
                                                     int32_t expert, te_tensor_role role,
                                                     te_scaling_state_info *info, float *history,
                                                     size_t history_cap);
TE_API te_status te_grouped_linear_state_save(te_context *ctx, const te_grouped_linear *g,
                                              void *buf, size_t capacity, size_t *size);
TE_API te_status te_grouped_linear_state_load(te_context *ctx, te_grouped_linear *g,
                                              const void *buf, size_t size);


/* ------------------------------------------------------------------------- */
/* Attention                                                                 */
/* ------------------------------------------------------------------------- */

/* Scaled dot-product attention, TE's DotProductAttention: O = softmax(scale *
 * Q K^T + mask) V for every sequence and query head, with te_linear's module
 * contract (options, create/destroy, a pure forward_compute that fills a
 * residuals struct, forward_save, forward, a backward callable again until its
 * context is destroyed or TE_BACKWARD_ONCE (bitwise identical: see below),
 * scaling-state inspection, state save/load, residuals in the caller's memory).
 *
 * Layouts (row-major, contiguous), `heads` query heads and `kv_heads` key/value
 * heads (GQA/MQA: query head h reads kv head h / (heads / kv_heads)):
 *  - BSHD, fixed lengths: q [batch, seq_q, heads, head_dim], k and v
 *    [batch, seq_kv, kv_heads, head_dim]; cu_seqlens NULL.
 *  - THD, variable lengths (padded batches waste nothing): q [tokens_q, heads,
 *    head_dim], k and v [tokens_kv, kv_heads, head_dim], and cu_seqlens_q /
 *    cu_seqlens_kv: TE_DTYPE_I32 [batch + 1] on the context's device, sequence b
 *    being rows [cu[b], cu[b+1]) (TE's cu_seqlens); max_seqlen_q / _kv bound
 *    every length. On a CPU context the offsets are validated (start at 0, never
 *    decrease, end at the token count, lengths within max_seqlen: INVALID_ARGUMENT
 *    otherwise). On a CUDA context they are device memory that libte does not
 *    read back (no synchronisation): bad offsets there give wrong numbers, never
 *    an access out of bounds (kernels clamp them).
 * Masks: NONE; CAUSAL, key j visible to query i iff j <= i (top-left, TE's
 * "causal"); CAUSAL_BOTTOM_RIGHT, iff j <= i + seq_kv - seq_q. A query that sees
 * no key gets O = 0 and no gradient. head_dim: a multiple of 8, at most 256.
 * Dropout is not offered. Packed QKV is not accepted: pass three views.
 *
 * FP8 (options.fp8 = 1, TE's recipe.fp8_dpa): inside an FP8 autocast scope of a
 * DELAYED or CURRENT recipe the attention quantizes Q, K and V to E4M3 (their
 * scaling states TE_ATTN_Q/K/V), runs both GEMMs on FP8 operands, quantizes the
 * softmax output P to E4M3 (state TE_ATTN_S) and in backward dO (TE_ATTN_DO,
 * E5M2 under HYBRID) and dS = P * (dP - D) (TE_ATTN_DP, the backward format).
 * Delayed scaling registers Q, K, V, S into the scope's forward bucket and DO,
 * DP into its backward bucket, like any module's states. Current scaling
 * quantizes Q, K, V, dO and dS with their own amaxes (dS in a first pass over
 * the scores). P is quantized with the scale of its bound amax 1 (P <= 1)
 * under both recipes; delayed scaling records max P in TE_ATTN_S all the same
 * (TE scales P by S's amax history, which starts at scale 1 and flushes the P
 * of long sequences, about 1/seq, to zero in the first steps). Where libte differs
 * from TE: O leaves (and dQ, dK, dV leave) in the activation dtype, never FP8, so
 * there is no O state (TE's fp8_mha=False); block-scaling recipes are refused
 * (UNSUPPORTED: TE's FP8 attention is per-tensor too). Outside FP8 scopes, and
 * with fp8 = 0 (the default, as TE's fp8_dpa=False), attention runs in the
 * activation dtype. Calibration (autocast calibrating) records nothing here.
 *
 * CUDA runs cuDNN's fused attention where cuDNN is loadable (libcudnn.so.9 on
 * the library path) and supports the call, libte's own kernels otherwise;
 * TE_ATTENTION_IMPL=kernel|cudnn forces one. */
typedef enum te_attn_mask {
  TE_ATTN_MASK_NONE = 0,
  TE_ATTN_MASK_CAUSAL = 1,
  TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT = 2
} te_attn_mask;

typedef struct te_attention te_attention;

typedef struct te_attention_options {
  size_t struct_size;
  int32_t num_heads;          /* required, > 0 */
  int32_t num_kv_heads;       /* default 0: num_heads; must divide num_heads */
  int32_t head_dim;           /* required, a multiple of 8 in 8..256 */
  float softmax_scale;        /* default 0: 1 / sqrt(head_dim); else finite, > 0 */
  te_attn_mask mask;          /* default NONE */
  te_dtype activation_dtype;  /* F32, F16 or BF16 (default BF16) */
  int32_t fp8;                /* default 0: see above */
} te_attention_options;

TE_API te_status te_attention_options_init(te_attention_options *opts);
/* Errors: INVALID_ARGUMENT (a field out of range, named). */
TE_API te_status te_attention_create(te_attention **out, te_context *ctx,
                                     const te_attention_options *opts);
TE_API void te_attention_destroy(te_attention *m);

typedef struct te_attention_forward_args {
  size_t struct_size;
  const te_tensor *q;
  const te_tensor *k;
  const te_tensor *v;
  const te_tensor *cu_seqlens_q;  /* THD; both NULL for BSHD */
  const te_tensor *cu_seqlens_kv;
  int64_t max_seqlen_q;           /* THD: required, in 1..tokens_q (kv: 1..tokens_kv) */
  int64_t max_seqlen_kv;
} te_attention_forward_args;

TE_API te_status te_attention_forward_args_init(te_attention_forward_args *args);

/* Views of library-owned storage (or of the caller's tensors); set
 * struct_size before the call. */
typedef struct te_attention_residuals {
  size_t struct_size;
  te_tensor q;       /* FP8: the E4M3 copies with scale_inv; else the caller's */
  te_tensor k;
  te_tensor v;
  te_tensor o;       /* the forward's output (the caller's) */
  te_tensor lse;     /* F32 [tokens_q, heads]: the rows' log-sum-exp */
  int32_t fp8;
  void *internal;    /* a handle owned by one struct: do not touch */
} te_attention_residuals;

/* o: like q (shape and dtype). q, k, v (and the offsets) are referenced by
 * the residuals in high precision, and o always: keep them alive and unchanged
 * until the backward context is destroyed. Errors: INVALID_ARGUMENT (a tensor
 * of the wrong dtype, device or shape, naming it; head counts or head_dim not
 * the layer's; batch of q and k differing; one cu_seqlens without the other,
 * offsets not I32 [batch + 1], offsets that do not increase (CPU)), UNSUPPORTED
 * (FP8 attention under a block-scaling recipe; a shape the device cannot do). */
TE_API te_status te_attention_forward_compute(te_context *ctx, te_attention *m,
                                              const te_attention_forward_args *args,
                                              te_tensor *o, te_attention_residuals *residuals);
TE_API void te_attention_residuals_release(te_attention_residuals *residuals);

typedef struct te_attention_backward_ctx te_attention_backward_ctx;

TE_API te_status te_attention_forward_save(te_context *ctx, te_attention *m,
                                           te_attention_residuals *residuals,
                                           te_attention_backward_ctx **out);
TE_API te_status te_attention_forward(te_context *ctx, te_attention *m,
                                      const te_attention_forward_args *args, te_tensor *o,
                                      te_attention_backward_ctx **out);

/* The gradients backward writes, each like its input; any may be NULL. */
typedef struct te_attention_grads {
  size_t struct_size;
  te_tensor *dq;
  te_tensor *dk;
  te_tensor *dv;
} te_attention_grads;

TE_API te_status te_attention_grads_init(te_attention_grads *grads);

/* d_o like q -> dq, dk, dv (written, not accumulated; dk and dv sum the query
 * heads of each GQA group). grads and args may be NULL. Errors: as
 * te_linear_backward. */
TE_API te_status te_attention_backward(te_context *ctx, te_attention_backward_ctx *bwd,
                                       const te_tensor *d_o, const te_attention_grads *grads,
                                       const te_linear_backward_args *args);
TE_API void te_attention_backward_ctx_destroy(te_attention_backward_ctx *bwd);

/* Residuals in the caller's memory: as te_linear's caller-memory calls (records,
 * 16-byte alignment, errors). The block holds the LSE (F32 [tokens_q, heads]) and
 * under FP8 the E4M3 Q, K, V with their scale_inv, so it is never empty.
 * residuals_size reads shapes only (every data pointer, the offsets' too, may be
 * NULL). backward_from takes the forward's inputs again (they may have moved; in
 * high precision q, k, v are read from them) and its output o.
 *
 * Repeated backwards: on the CPU and with libte's CUDA kernels a repeated backward
 * is bit-identical; cuDNN's fused backward (the CUDA default where it applies)
 * accumulates dQ with atomics, so a repeat may differ in dQ's last bits: set
 * TE_ATTENTION_IMPL=kernel where bitwise reproducibility matters more than speed. */
TE_API te_status te_attention_residuals_size(te_context *ctx, const te_attention *m,
                                             const te_attention_forward_args *args, size_t *bytes);
TE_API te_status te_attention_forward_compute_into(te_context *ctx, te_attention *m,
                                                   const te_attention_forward_args *args,
                                                   te_tensor *o, void *residuals,
                                                   size_t residuals_bytes);
TE_API te_status te_attention_backward_from(te_context *ctx, te_attention *m,
                                            const te_attention_forward_args *inputs,
                                            const te_tensor *o, const void *residuals,
                                            size_t residuals_bytes, const te_tensor *d_o,
                                            const te_attention_grads *grads,
                                            const te_linear_backward_args *args);

/* The scaling states of FP8 attention. */
typedef enum te_attention_tensor {
  TE_ATTN_Q = 0,
  TE_ATTN_K = 1,
  TE_ATTN_V = 2,
  TE_ATTN_S = 3,  /* the softmax output P */
  TE_ATTN_DO = 4, /* backward: dO */
  TE_ATTN_DP = 5  /* backward: dS = P * (dP - D) */
} te_attention_tensor;

TE_API te_status te_attention_get_scaling_state(te_context *ctx, const te_attention *m,
                                                te_attention_tensor which,
                                                te_scaling_state_info *info, float *history,
                                                size_t history_cap);
TE_API te_status te_attention_state_save(te_context *ctx, const te_attention *m, void *buf,
                                         size_t capacity, size_t *size);
TE_API te_status te_attention_state_load(te_context *ctx, te_attention *m, const void *buf,
                                         size_t size);

/* Rotary position embedding (RoPE), TE's fused rope, as an op the attention's
 * inputs pass through: the first rot_dim features of every head of x
 * (BSHD [batch, seq, heads, head_dim], or THD [tokens, heads, head_dim] with
 * cu_seqlens I32 [batch + 1]) rotate by the angle freqs[p, k] of the token's
 * position p in its sequence (freqs: F32 [positions, rot_dim / 2], positions >=
 * every sequence's length; TE's freqs hold each angle twice, libte once), pair k
 * being features (k, k + rot_dim/2) (GPT-NeoX, TE's default) or (2k, 2k+1)
 * with interleaved = 1 (GPT-J): y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin. The
 * other features are copied. y is like x and may be x itself (in place).
 * Bit-identical on the CPU and the GPU. Backward is the inverse rotation:
 * te_rope_backward(dy -> dx). Errors: INVALID_ARGUMENT (shapes, dtypes, rot_dim
 * odd or above head_dim, positions beyond freqs (CPU), offsets as attention's).
 * opts may be NULL (defaults: rot_dim = head_dim, not interleaved). */
typedef struct te_rope_options {
  size_t struct_size;
  int32_t rot_dim;     /* default 0: head_dim; else even, in 2..head_dim */
  int32_t interleaved; /* default 0 */
} te_rope_options;

TE_API te_status te_rope_options_init(te_rope_options *opts);
TE_API te_status te_rope_forward(te_context *ctx, const te_rope_options *opts, const te_tensor *x,
                                 const te_tensor *freqs, const te_tensor *cu_seqlens, te_tensor *y);
TE_API te_status te_rope_backward(te_context *ctx, const te_rope_options *opts,
                                  const te_tensor *dy, const te_tensor *freqs,
                                  const te_tensor *cu_seqlens, te_tensor *dx);

/* ------------------------------------------------------------------------- */
/* Training-step ops: embedding, cross-entropy, AdamW                         */
/* ------------------------------------------------------------------------- */

/* Token embedding, a gather: y[t, :] = table[ids[t], :] for every token t.
 * table: F32/F16/BF16 [vocab, dim]; ids: I32 of any shape (n tokens, e.g.
 * [batch, seq]); y: the table's dtype, ids' shape followed by dim (or any
 * shape of n * dim elements whose last dimension is dim).
 * An id outside [0, vocab): the CPU refuses the call (INVALID_ARGUMENT naming
 * the position, nothing written); CUDA cannot look without a host sync and
 * writes that token's row as zeros instead. */
TE_API te_status te_embedding_forward(te_context *ctx, const te_tensor *table,
                                      const te_tensor *ids, te_tensor *y);

/* The embedding's gradient, a scatter-add: dtable[ids[t], :] += dy[t, :].
 * dtable: F32 [vocab, dim] (zeroed first unless accumulate = 1, so a tied LM
 * head's dW can be added to); dy: F32/F16/BF16, n * dim elements, last
 * dimension dim. Deterministic: each row sums its tokens in increasing t, in
 * fp32, on both backends (bit-identical CPU/GPU). Ids out of range: as the
 * forward (CPU: INVALID_ARGUMENT; CUDA: the token is skipped). */
TE_API te_status te_embedding_backward(te_context *ctx, const te_tensor *ids,
                                       const te_tensor *dy, te_tensor *dtable,
                                       int32_t accumulate);

/* Softmax cross-entropy fused over the vocabulary, mean over the tokens whose
 * target is not ignore_index: loss = mean_t (logsumexp(logits[t]) -
 * logits[t, target[t]]), and in the same pass
 * dlogits[t] = grad_scale * (softmax(logits[t]) - onehot(target[t])) / count
 * (zero rows for ignored tokens). Stable for any finite logits (the row max
 * is subtracted; fp32 accumulation). count = 0 gives loss 0 and zero
 * dlogits. */
typedef struct te_cross_entropy_options {
  size_t struct_size;
  int32_t ignore_index; /* default -100 */
  float grad_scale;     /* default 1: the gradient of the mean loss */
} te_cross_entropy_options;

TE_API te_status te_cross_entropy_options_init(te_cross_entropy_options *opts);

/* logits: F32/F16/BF16 [n, vocab] (or [..., vocab]); targets: I32, n elements;
 * loss: F32, one element, on the context's device (written without a host
 * sync); dlogits: NULL (loss only, e.g. validation), or logits' dtype and
 * shape, and may be logits itself (in place). opts may be NULL. A target
 * outside [0, vocab) other than ignore_index: CPU INVALID_ARGUMENT naming the
 * token; CUDA makes the loss and that token's dlogits row NaN (no host sync to
 * refuse it). On both backends the loss and dlogits are bit-identical: one
 * exp/log formula and one summation order (a 512-lane tree per row). */
TE_API te_status te_cross_entropy(te_context *ctx, const te_cross_entropy_options *opts,
                                  const te_tensor *logits, const te_tensor *targets,
                                  te_tensor *loss, te_tensor *dlogits);

/* Elementwise add and column split/concat: the glue a model written against
 * this API needs between modules (residual connections and their gradients,
 * a fused QKV projection's output split into attention's q, k, v).
 * y = a + b elementwise (fp32 arithmetic, rounded once to y's dtype); a, b, y
 * of one dtype (F32/F16/BF16) and one shape; y may be a or b (in place). */
TE_API te_status te_add(te_context *ctx, const te_tensor *a, const te_tensor *b, te_tensor *y);

/* Splits x [rows, c_0 + ... + c_{n-1}] (any leading shape; rows = product of
 * the leading dimensions) by columns into outputs[i] [rows, c_i] (the same
 * leading shape as x, or any shape of rows * c_i elements whose last
 * dimension is c_i), and concat_columns is its inverse. One dtype throughout
 * (any, FP8 included: bytes are moved, scale_inv is not touched); 1 <= n <= 64;
 * outputs must not overlap x. Exact copies on both backends. */
TE_API te_status te_split_columns(te_context *ctx, const te_tensor *x, te_tensor *const *outputs,
                                  size_t n);
TE_API te_status te_concat_columns(te_context *ctx, const te_tensor *const *inputs, size_t n,
                                   te_tensor *y);

/* Which module a parameter is the weight of, so that te_adamw_step refreshes
 * that module's FP8 weight cache (TE's primary FP8 weights: the next forward
 * with weight_unchanged = 1 then casts nothing). */
typedef enum te_module_kind {
  TE_MODULE_NONE = 0,
  TE_MODULE_LINEAR = 1,           /* owner: te_linear * */
  TE_MODULE_LAYERNORM_LINEAR = 2, /* owner: te_layernorm_linear * */
  TE_MODULE_LAYERNORM_MLP = 3     /* owner: te_layernorm_mlp *, owner_gemm: te_mlp_gemm */
} te_module_kind;

/* One parameter of an AdamW step. Every tensor lives on the context's device
 * and has the same number of elements. */
typedef struct te_adamw_param {
  size_t struct_size;
  te_tensor *param;         /* F32 master weights, updated in place */
  const te_tensor *grad;    /* F32, F16 or BF16 */
  te_tensor *exp_avg;       /* F32 first moment, updated in place */
  te_tensor *exp_avg_sq;    /* F32 second moment, updated in place */
  te_tensor *model_weight;  /* optional (NULL): F32/F16/BF16 copy of the new
                               param written in the same pass (the weight the
                               modules are given) */
  int32_t weight_decay;     /* 1 (default): apply the options' weight decay;
                               0: not (norms, biases, embeddings if wanted) */
  te_module_kind owner_kind; /* default TE_MODULE_NONE */
  const void *owner;        /* the module handle of owner_kind, or NULL */
  int32_t owner_gemm;       /* TE_MLP_FC1 / TE_MLP_FC2 for a te_layernorm_mlp */
} te_adamw_param;

TE_API te_status te_adamw_param_init(te_adamw_param *param);

typedef struct te_adamw_options {
  size_t struct_size;
  float lr;             /* default 1e-3 */
  float beta1;          /* default 0.9 */
  float beta2;          /* default 0.999 */
  float eps;            /* default 1e-8 */
  float weight_decay;   /* default 0.01 (decoupled: p -= lr * wd * p) */
  int64_t step;         /* this update's number, 1-based, for the bias
                           corrections; default 1 */
  float max_grad_norm;  /* > 0: scale every gradient by
                           min(1, max_grad_norm / (norm + 1e-6)), norm being
                           the global L2 norm of all the step's gradients,
                           computed on the device; a non-finite norm skips the
                           whole update (nothing changes). Default 0: off */
  float *grad_norm;     /* optional device float (the context's device):
                           receives the global gradient norm (computed even
                           without clipping when given). Default NULL */
} te_adamw_options;

TE_API te_status te_adamw_options_init(te_adamw_options *opts);

/* Fused multi-tensor AdamW (PyTorch's torch.optim.AdamW formulas, fp32):
 *   g  = grad * clip;  p -= lr * weight_decay * p  (when the param decays)
 *   m  = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   p -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
 * then model_weight = p rounded to its dtype, all in one pass over the
 * tensors (a few launches for the whole list, no host sync). Parameters with
 * an owner: after the update the owner's FP8 weight cache is re-quantized
 * from the new weight (model_weight when given, else param) exactly as its
 * next forward would (same recipe, scale and amax record), so that a
 * forward with weight_unchanged = 1 gives bit-identical results without a
 * cast. An owner that has run no FP8 forward yet has no cache: nothing to
 * refresh. params is an array of count entries laid out with stride
 * params[0].struct_size (all entries carry the same struct_size).
 * Without clipping a non-finite gradient propagates into the parameters (as
 * torch does). The refresh updates the owner's weight scaling state at once
 * (delayed: the new amax; current: the new scale), where the forward it
 * replaces would have done so at its call: after that forward the states are
 * identical. The cache is dropped instead (the next forward recasts, with
 * identical results) when an autocast scope is open during the step, or when
 * it was made under current scaling with a multi-rank group (one rank cannot
 * redo that collective alone). opts is required.
 * Bit-identical on the CPU and the GPU. Errors: INVALID_ARGUMENT (shapes,
 * dtypes, devices, a tensor given twice, options out of range: lr < 0,
 * betas outside [0, 1), eps <= 0, step < 1, weight_decay < 0, an owner of the
 * wrong kind or whose weight shape differs); on failure nothing changes. */
TE_API te_status te_adamw_step(te_context *ctx, const te_adamw_options *opts,
                               const te_adamw_param *params, size_t count);

/* ------------------------------------------------------------------------- */
/* Checkpoints                                                               */
/* ------------------------------------------------------------------------- */

/* A checkpoint is a set of named records — tensors (weights, optimizer
 * moments) and byte strings (the modules' te_*_state_save buffers, the step,
 * a data position) — written to one file: a versioned little-endian format
 * ("TECKPT" magic, format version, records, CRC-32 of everything before it),
 * replaced atomically (written beside, then renamed). Reading checks the
 * magic, the version, every length and the checksum: a truncated or
 * corrupted file is refused (INVALID_ARGUMENT naming what is wrong) and
 * nothing is returned. Names are 1..255 bytes, unique in a checkpoint.
 * Handles are not thread-safe; put copies the data in (a tensor on a CUDA
 * context is copied to the host: the context's stream is synchronised, so
 * checkpointing is off the training step's hot path). */
typedef struct te_checkpoint te_checkpoint;

TE_API te_status te_checkpoint_create(te_checkpoint **out);
TE_API void te_checkpoint_destroy(te_checkpoint *ck);

/* Adds (or replaces) record `name`: a copy of t's data with its dtype and
 * shape (FP8 tensors are refused: store their high-precision source). */
TE_API te_status te_checkpoint_put_tensor(te_checkpoint *ck, te_context *ctx, const char *name,
                                          const te_tensor *t);
TE_API te_status te_checkpoint_put_bytes(te_checkpoint *ck, const char *name, const void *data,
                                         size_t size);

/* Copies record `name` into t, which must have the stored dtype and shape.
 * Errors: INVALID_ARGUMENT (no such record, a byte record, dtype or shape
 * differs: named in the message); t is then unchanged. */
TE_API te_status te_checkpoint_get_tensor(const te_checkpoint *ck, te_context *ctx,
                                          const char *name, te_tensor *t);
/* Copies byte record `name` into buf (capacity bytes). *size receives its
 * length; buf may be NULL with capacity 0 to ask for it. A capacity below the
 * length: INVALID_ARGUMENT, *size set, buf untouched. */
TE_API te_status te_checkpoint_get_bytes(const te_checkpoint *ck, const char *name, void *buf,
                                         size_t capacity, size_t *size);

/* What record `name` holds, so a reader can allocate before get_tensor:
 * *is_tensor = 1 for a tensor record (then *shape receives its dtype, ndim and
 * shape, with data and scale_inv NULL and a CPU device), 0 for a byte record
 * (*shape untouched); *size = the payload's length in bytes. shape may be
 * NULL. Errors: INVALID_ARGUMENT (NULL ck/name/is_tensor/size, no such
 * record); the outputs are then untouched. */
TE_API te_status te_checkpoint_record_info(const te_checkpoint *ck, const char *name,
                                           int32_t *is_tensor, te_tensor *shape, size_t *size);

TE_API te_status te_checkpoint_count(const te_checkpoint *ck, size_t *count);
/* The name of record `index` (0..count-1), valid until the checkpoint changes
 * or is destroyed. */
TE_API te_status te_checkpoint_name(const te_checkpoint *ck, size_t index, const char **name);

/* Errors from the operating system (open, write, fsync, rename) are
 * INVALID_ARGUMENT naming the argument 'path', its value and the system's
 * reason; no temporary file
 * is left behind. */
TE_API te_status te_checkpoint_write(const te_checkpoint *ck, const char *path);
TE_API te_status te_checkpoint_read(te_checkpoint **out, const char *path);
/* The same format in memory: serialise into buf (NULL/0 asks for *size), or
 * parse a buffer (checked as a file is). */
TE_API te_status te_checkpoint_serialize(const te_checkpoint *ck, void *buf, size_t capacity,
                                         size_t *size);
TE_API te_status te_checkpoint_deserialize(te_checkpoint **out, const void *buf, size_t size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TE_TE_H */
