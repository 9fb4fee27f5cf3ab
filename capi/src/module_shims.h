// The shims every module with residuals and backward contexts shares (LayerNormLinear,
// LayerNormMLP, GroupedLinear): resolving its handles, releasing and saving residuals, running a
// forward into a fresh backward context, destroying one. A module describes itself with a traits
// struct M:
//   using Module, Saved, BackwardCtx;            core types (Saved::layer is the module's core)
//   static constexpr HandleKind kModule, kSaved, kBackward;
//   static constexpr const char *kArg, *kModuleType, *kResidualsType, *kComputeFn;  for messages
//                                                (kArg: the module argument's name in te.h)
//   static auto &pools(Context &);               the context's ObjectPools (.saved, .backward)
//   static size_t state_size(Context &, const Module &); state_save(...); state_load(...)
#pragma once

#include "module_common.h"

namespace te::capi {

template <class M>
typename M::Module *to_module(const void *h) {
  return from_handle<typename M::Module>(h, M::kModule, M::kArg);
}

template <class M>
void check_same_context(const Context *c, const typename M::Module *m) {
  if (&m->core()->ctx != c)
    fail(Status::InvalidArgument, "argument '%s': created with another te_context than 'ctx'", M::kArg);
}

// The module of `h`, made with `ctx`'s context.
template <class M>
typename M::Module *module_of(Context *c, const void *h) {
  typename M::Module *m = to_module<M>(h);
  check_same_context<M>(c, m);
  return m;
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
    fail(Status::InvalidArgument, "argument '%s': made by another %s than '%s'", name, M::kModuleType, M::kArg);
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

// te_*_state_save: with buf NULL only *size is set.
template <class M>
void save_state(te_context *ctx, const void *h, void *buf, size_t capacity, size_t *size) {
  Context *c = to_context(ctx);
  const typename M::Module *m = module_of<M>(c, h);
  check_not_null(size, "size");
  const size_t need = M::state_size(*c, *m);
  if (buf) M::state_save(*c, *m, buf, capacity);
  *size = need;
}

template <class M>
void load_state(te_context *ctx, void *h, const void *buf, size_t size) {
  Context *c = to_context(ctx);
  typename M::Module *m = module_of<M>(c, h);
  check_not_null(buf, "buf");
  M::state_load(*c, *m, buf, size);
}

}  // namespace te::capi
