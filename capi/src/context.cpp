#include "capi_common.h"

using namespace te;
using namespace te::capi;

static_assert(TE_DEVICE_CUDA == static_cast<int>(DeviceType::CUDA), "device values must match the core");
static_assert(TE_DTYPE_E5M2 == static_cast<int>(DType::E5M2), "dtype values must match the core");
static_assert(TE_DTYPE_I32 == static_cast<int>(DType::I32), "dtype values must match the core");
static_assert(TE_SCALING_BLOCK_128X128 == static_cast<int>(ScalingMode::Block128x128), "scaling values must match");
static_assert(TE_ERROR_INTERNAL == static_cast<int>(Status::Internal), "status values must match the core");
static_assert(TE_AUTOCAST_MAX_DEPTH == kAutocastMaxDepth, "autocast depth must match the core");

extern "C" {

TE_API te_status te_context_options_init(te_context_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_context_options{};
    opts->struct_size = sizeof *opts;
    opts->use_default_device = 1;
  });
}

TE_API te_status te_context_create(te_context **out, const te_context_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    Device device = Context::default_device();
    if (opts) {
      check_options(opts, "opts");
      check_bool(opts->use_default_device, "opts->use_default_device");
      if (!opts->use_default_device) device = to_device(opts->device, "opts->device");
    }
    *out = (new Context(device))->as_public<te_context>();
  });
}

TE_API void te_context_destroy(te_context *ctx) {
  // The handle dies now; the context lives on while a layer, residuals or backward context made
  // with it is alive (those can still be destroyed, but no call can name the context again).
  Context *c = live_or_null<Context>(ctx, HandleKind::Context);
  if (!c) return;
  c->retire();
  c->release();
}

TE_API te_status te_context_get_device(const te_context *ctx, te_device *out) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    check_not_null(out, "out");
    out->type = static_cast<te_device_type>(c->device().type);
    out->index = c->device().index;
  });
}

TE_API te_status te_context_set_stream(te_context *ctx, void *stream) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    c->autocast().settle();  // a deferred scale update goes on the stream its pass ran on
    c->backend().set_stream(stream);
  });
}

TE_API te_status te_context_synchronize(te_context *ctx) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    c->autocast().settle();  // "everything enqueued has run" includes a deferred scale update
    c->backend().synchronize();
  });
}

TE_API te_status te_context_malloc(te_context *ctx, size_t bytes, void **out) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    check_not_null(out, "out");
    *out = c->user_alloc(bytes);
  });
}

TE_API te_status te_context_free(te_context *ctx, void *ptr) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    if (ptr) c->user_free(ptr);
  });
}

TE_API te_status te_context_copy(te_context *ctx, void *dst, const void *src, size_t bytes, te_copy_kind kind) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    check_not_null(dst, "dst");
    check_not_null(src, "src");
    if (bytes > static_cast<size_t>(PTRDIFF_MAX))
      fail(Status::InvalidArgument, "argument 'bytes': expected at most PTRDIFF_MAX (%td), got %zu", PTRDIFF_MAX, bytes);
    const int k = enum_int(kind);
    Backend &be = c->backend();
    switch (k) {
      case TE_COPY_HOST_TO_DEVICE: be.copy_from_host(dst, src, bytes); break;
      case TE_COPY_DEVICE_TO_HOST: be.copy_to_host(dst, src, bytes); break;
      case TE_COPY_DEVICE_TO_DEVICE: be.copy(dst, src, bytes); break;
      default:
        fail(Status::InvalidArgument, "argument 'kind': expected a te_copy_kind value, got %d", k);
    }
  });
}

TE_API te_status te_context_get_stats(const te_context *ctx, te_context_stats *out) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    check_options(out, "out");
    c->autocast().settle();  // the counts include a deferred update, as if it had run at te_autocast_end
    const AutocastStats &s = c->stats();
    out->scopes_closed = s.scopes_closed;
    out->bucket_updates = s.bucket_updates;
    out->amax_reductions = s.amax_reductions;
    out->states_updated = s.states_updated;
  });
}

}  // extern "C"
