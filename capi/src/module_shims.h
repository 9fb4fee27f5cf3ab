// The shims every module with residuals and backward contexts shares (LayerNormLinear,
// LayerNormMLP, GroupedLinear): resolving its handles, releasing and saving residuals, running a
// forward into a fresh backward context, destroying one. A module describes itself with a traits
// struct M:
//   using Module, Saved, BackwardCtx;            core types (Saved::layer is the module's core)
//   static constexpr HandleKind kModule, kSaved, kBackward;
//   static constexpr const char *kModuleType, *kResidualsType, *kComputeFn;  for messages
//   static auto &pools(Context &);               the context's ObjectPools (.saved, .backward)
#pragma once

#include "module_common.h"

namespace te::capi {

template <class M>
typename M::Module *to_module(const void *h, const char *name = "m") {
  return from_handle<typename M::Module>(h, M::kModule, name);
}

template <class M>
void check_same_context(const Context *c, const typename M::Module *m) {
  if (&m->core()->ctx != c) fail(Status::InvalidArgument, "argument 'm': created with another te_context than 'ctx'");
}

template <class M>
typename M::BackwardCtx *to_backward(const Context *c, const void *h) {
  auto *b = from_handle<typename M::BackwardCtx>(h, M::kBackward, "bwd");
  if (b->ctx.get() != c) fail(Status::InvalidArgument, "argument 'bwd': made with another te_context than 'ctx'");
  return b;
}

// te_*_residuals_release: a struct whose residuals are gone (saved, released, or owned by the
// struct it was copied from) is left as it is.
template <class M>
void release_residuals(void **internal) {
  if (auto *s = live_or_null<typename M::Saved>(*internal, M::kSaved)) {
    M::pools(*s->ctx).saved.release(s);
    *internal = nullptr;
  }
}

// te_*_forward_save: packs the residuals a struct names into a new backward context.
template <class M>
typename M::BackwardCtx *save_residuals(Context &c, const typename M::Module &m, void **internal, const char *name) {
  auto *s = static_cast<typename M::Saved *>(residuals_of(*internal, M::kSaved, name, M::kResidualsType, M::kComputeFn));
  if (s->layer != m.core())
    fail(Status::InvalidArgument, "argument '%s': made by another %s than 'm'", name, M::kModuleType);
  typename M::BackwardCtx *b = M::pools(c).backward.acquire(c);  // may throw: nothing moved yet
  s->retire();  // the struct (and every copy of it) no longer names the residuals
  b->saved = s;
  *internal = nullptr;
  return b;
}

// te_*_forward: `compute()` returns the residuals; the backward context is taken first, so that
// once the forward ran nothing can fail.
template <class M, class F>
typename M::BackwardCtx *forward_into_backward(Context &c, F &&compute) {
  typename M::BackwardCtx *b = M::pools(c).backward.acquire(c);
  try {
    b->saved = compute();
    b->saved->retire();  // owned by the backward context: no residuals handle names it
  } catch (...) {
    M::pools(c).backward.release(b);
    throw;
  }
  return b;
}

template <class M>
void destroy_backward(const void *h) {
  if (auto *b = live_or_null<typename M::BackwardCtx>(h, M::kBackward)) M::pools(*b->ctx).backward.release(b);
}

}  // namespace te::capi
