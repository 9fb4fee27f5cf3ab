// Shared machinery of the extern "C" shims: every public function validates its arguments,
// translates handles and tensors to core types, runs inside `guarded` (so no C++ exception ever
// crosses the boundary) and on failure stores "<function>: <message>" as the thread's last error.
#pragma once

#include <te/te.h>

#include <cstring>
#include <new>
#include <string>

#include "base/api_call.h"
#include "base/check.h"
#include "context/context.h"
#include "dist/group.h"
#include "modules/linear/linear.h"
#include "scaling/recipe.h"

namespace te::capi {

void set_last_error(const char *function, const char *message);
const char *last_error_text();

template <class F>
te_status guarded(const char *function, F &&body) noexcept {
  const ApiCallScope call;  // facts that hold for the whole call are asked once (base/api_call.h)
  try {
    body();
    return TE_SUCCESS;
  } catch (const Error &e) {
    set_last_error(function, e.what());
    return static_cast<te_status>(e.status());
  } catch (const std::bad_alloc &) {
    set_last_error(function, "out of memory");
    return TE_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception &e) {
    set_last_error(function, (std::string("internal error: ") + e.what()).c_str());
    return TE_ERROR_INTERNAL;
  } catch (...) {
    set_last_error(function, "internal error: unknown exception");
    return TE_ERROR_INTERNAL;
  }
}

const char *handle_kind_name(HandleKind k);

// The live object behind the public handle `h` when it is one of `kind`; otherwise throws
// InvalidArgument saying whether `h` was NULL, destroyed, of another type or no handle at all.
[[noreturn]] void bad_handle(HandleFault fault, HandleKind kind, HandleKind actual, const ArgName &name);
template <class T>
T *from_handle(const void *h, HandleKind kind, const ArgName &name) {
  HandleFault fault;
  HandleKind actual = HandleKind::Dead;
  Handle *obj = resolve_handle(h, kind, &fault, &actual);
  if (!obj) bad_handle(fault, kind, actual, name);
  return static_cast<T *>(obj);
}
// For destructors and getters that cannot fail: the object, or nullptr for anything else.
template <class T>
T *live_or_null(const void *h, HandleKind kind) {
  HandleFault fault;
  HandleKind actual;
  return static_cast<T *>(resolve_handle(h, kind, &fault, &actual));
}

inline Context *to_context(const te_context *h, const char *name = "ctx") {
  return from_handle<Context>(h, HandleKind::Context, name);
}
inline Recipe *to_recipe(const te_recipe *h, const char *name = "recipe") {
  return from_handle<Recipe>(h, HandleKind::Recipe, name);
}
inline Group *to_group(const te_group *h, const char *name = "group") {
  return from_handle<Group>(h, HandleKind::Group, name);
}
inline Linear *to_linear(const te_linear *h, const char *name = "lin") {
  return from_handle<Linear>(h, HandleKind::Linear, name);
}
inline LinearBackwardCtx *to_backward_ctx(const te_linear_backward_ctx *h, const char *name = "bwd") {
  return from_handle<LinearBackwardCtx>(h, HandleKind::BackwardCtx, name);
}

// The residuals object named by a residuals struct's `internal` (a handle of `kind`): a struct
// whose residuals were saved or released — or a by-value copy of one — names nothing any more.
// `struct_type` and `producer` name the C struct and the function that fills it, for messages.
Handle *residuals_of(void *internal, HandleKind kind, const char *name, const char *struct_type, const char *producer);

// A validated view of a caller's tensor: non-NULL data, 1..TE_MAX_DIMS positive dims, known
// dtype/device/scaling, a scale_inv pointer for FP8.
TensorView to_view(const te_tensor *t, const ArgName &name);
// As to_view for what only a tensor's shape, dtype and device say: data may be NULL, and FP8
// fields are not read (te_*_residuals_size).
TensorView to_shape_view(const te_tensor *t, const ArgName &name);
// As to_view, but NULL gives an empty view (an optional output).
TensorView to_optional_view(const te_tensor *t, const ArgName &name);

// Options structs: non-NULL, and at least as large as this version's struct.
void check_struct(const void *p, size_t struct_size, size_t expected, const ArgName &name);
template <class S>
void check_options(const S *s, const ArgName &name) {
  check_not_null(s, name);
  check_struct(s, s->struct_size, sizeof(S), name);
}

// A C enum field or parameter may hold any int the caller put there; loading it as the enum type
// is undefined for values outside the enum's range, so the shims read the bits as an int.
template <class E>
int enum_int(const E &e) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized on every supported ABI");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

inline bool known_dtype(int d) { return d >= TE_DTYPE_F32 && d <= TE_DTYPE_I32; }
void check_bool(int32_t v, const ArgName &name);

// `name` names the te_device argument; `owner`, when not NULL, the tensor holding it.
Device to_device(const te_device &d, const char *name, const ArgName *owner = nullptr);

}  // namespace te::capi
