// Status strings, the thread-local last error, versions.
#include <cstdio>
#include <string>

#include "capi_common.h"

namespace te::capi {

namespace {
thread_local std::string last_error;
}

const char *last_error_text() { return last_error.c_str(); }

void set_last_error(const char *function, const char *message) {
  last_error.assign(function);
  last_error.append(": ");
  last_error.append(message);
}

const char *handle_kind_name(HandleKind k) {
  switch (k) {
    case HandleKind::Context: return "te_context";
    case HandleKind::Recipe: return "te_recipe";
    case HandleKind::Group: return "te_group";
    case HandleKind::Linear: return "te_linear";
    case HandleKind::BackwardCtx: return "te_linear_backward_ctx";
    case HandleKind::Residuals: return "te_linear_residuals";
    case HandleKind::LayerNormLinear: return "te_layernorm_linear";
    case HandleKind::LayerNormLinearBackwardCtx: return "te_layernorm_linear_backward_ctx";
    case HandleKind::LayerNormLinearResiduals: return "te_layernorm_linear_residuals";
    case HandleKind::LayerNormMlp: return "te_layernorm_mlp";
    case HandleKind::LayerNormMlpBackwardCtx: return "te_layernorm_mlp_backward_ctx";
    case HandleKind::LayerNormMlpResiduals: return "te_layernorm_mlp_residuals";
    case HandleKind::GroupedLinear: return "te_grouped_linear";
    case HandleKind::GroupedLinearBackwardCtx: return "te_grouped_linear_backward_ctx";
    case HandleKind::GroupedLinearResiduals: return "te_grouped_linear_residuals";
    case HandleKind::Attention: return "te_attention";
    case HandleKind::AttentionBackwardCtx: return "te_attention_backward_ctx";
    case HandleKind::AttentionResiduals: return "te_attention_residuals";
    case HandleKind::Checkpoint: return "te_checkpoint";
    case HandleKind::Dead: return "destroyed handle";
  }
  return "handle of unknown type";
}

void bad_handle(HandleFault fault, HandleKind kind, HandleKind actual, const ArgName &arg) {
  const char *want = handle_kind_name(kind), *name = arg.c_str();
  switch (fault) {
    case HandleFault::Null:
      fail(Status::InvalidArgument, "argument '%s': expected a %s handle, got NULL", name, want);
    case HandleFault::Destroyed:
      fail(Status::InvalidArgument, "argument '%s': expected a live %s handle, got one that was destroyed "
           "(or released)", name, want);
    case HandleFault::WrongKind:
      fail(Status::InvalidArgument, "argument '%s': expected a %s handle, got a %s", name, want,
           handle_kind_name(actual));
    default:
      fail(Status::InvalidArgument, "argument '%s': expected a %s handle, got a value that is not a libte handle",
           name, want);
  }
}

Handle *residuals_of(void *internal, HandleKind kind, const char *name, const char *struct_type, const char *producer) {
  if (!internal) fail(Status::InvalidArgument, "argument '%s': holds no residuals (already saved or released)", name);
  HandleFault fault;
  HandleKind actual;
  Handle *h = resolve_handle(internal, kind, &fault, &actual);
  if (!h && fault == HandleFault::Destroyed)
    fail(Status::InvalidArgument, "argument '%s': its residuals were already saved or released (a copy of a "
         "%s struct does not own them)", name, struct_type);
  if (!h) fail(Status::InvalidArgument, "argument '%s': 'internal' was not filled by %s", name, producer);
  return h;
}

void check_struct(const void *p, size_t struct_size, size_t expected, const ArgName &name) {
  (void)p;
  if (struct_size < expected)
    fail(Status::InvalidArgument, "argument '%s': expected struct_size >= %zu (set it with the _init function), got %zu",
         name.c_str(), expected, struct_size);
}

void check_bool(int32_t v, const ArgName &name) {
  if (v != 0 && v != 1) fail(Status::InvalidArgument, "argument '%s': expected 0 or 1, got %d", name.c_str(), v);
}

Device to_device(const te_device &d, const char *name, const ArgName *owner) {
  const int type = enum_int(d.type);
  const bool bad_type = type != TE_DEVICE_CPU && type != TE_DEVICE_CUDA;
  if (bad_type || d.index < 0) {
    const char *sep = owner ? "->" : "", *own = owner ? owner->c_str() : "";
    if (bad_type)
      fail(Status::InvalidArgument, "argument '%s%s%s.type': expected TE_DEVICE_CPU or TE_DEVICE_CUDA, got %d", own,
           sep, name, type);
    fail(Status::InvalidArgument, "argument '%s%s%s.index': expected >= 0, got %d", own, sep, name, d.index);
  }
  Device out;
  out.type = static_cast<DeviceType>(type);
  out.index = d.index;
  return out;
}

}  // namespace te::capi

using namespace te::capi;

extern "C" {

TE_API unsigned te_version(void) { return TE_VERSION_NUMBER; }

TE_API const char *te_version_string(void) {
#define TE_STR2(x) #x
#define TE_STR(x) TE_STR2(x)
  return TE_STR(TE_VERSION_MAJOR) "." TE_STR(TE_VERSION_MINOR) "." TE_STR(TE_VERSION_PATCH);
}

TE_API const char *te_status_string(te_status s) {
  // Any int may arrive here (a C caller's cast, a newer library's code): read the bits as an int,
  // since loading an out-of-range value as the enum is undefined in C++.
  switch (enum_int(s)) {
    case TE_SUCCESS: return "TE_SUCCESS";
    case TE_ERROR_INVALID_ARGUMENT: return "TE_ERROR_INVALID_ARGUMENT";
    case TE_ERROR_INVALID_STATE: return "TE_ERROR_INVALID_STATE";
    case TE_ERROR_UNSUPPORTED: return "TE_ERROR_UNSUPPORTED";
    case TE_ERROR_OUT_OF_MEMORY: return "TE_ERROR_OUT_OF_MEMORY";
    case TE_ERROR_CUDA: return "TE_ERROR_CUDA";
    case TE_ERROR_CUBLAS: return "TE_ERROR_CUBLAS";
    case TE_ERROR_NCCL: return "TE_ERROR_NCCL";
    case TE_ERROR_INTERNAL: return "TE_ERROR_INTERNAL";
  }
  return "TE_ERROR_UNKNOWN";
}

TE_API const char *te_last_error(void) { return last_error_text(); }

}  // extern "C"
