#include <algorithm>

#include "te/core/linear.h"

namespace te {

void SavedRecycler::operator()(LinearSaved *s) const { s->pool->release(s); }

LinearObjectPool::~LinearObjectPool() {
  for (LinearSaved *s : saved_) delete s;
  for (LinearBackwardCtx *b : backward_) delete b;
}

SavedPtr LinearObjectPool::acquire_saved() {
  LinearSaved *s;
  if (saved_.empty()) {
    s = new LinearSaved();
  } else {
    s = saved_.back();
    saved_.pop_back();
  }
  s->magic = LinearSaved::kMagic;
  s->pool = this;
  return SavedPtr(s);
}

void LinearObjectPool::release(LinearSaved *s) {
  // Drop everything the residuals reference (buffers go back to the backend's cache) and keep
  // the object itself. A stale pointer to it no longer passes the magic check.
  *s = LinearSaved();
  s->magic = 0;
  s->pool = this;
  saved_.push_back(s);
}

LinearBackwardCtx *LinearObjectPool::acquire_backward_ctx(Context &ctx) {
  LinearBackwardCtx *b;
  if (backward_.empty()) {
    b = new LinearBackwardCtx(ctx);
  } else {
    b = backward_.back();
    backward_.pop_back();
    b->handle_kind = HandleKind::BackwardCtx;
    b->ctx = &ctx;
  }
  return b;
}

void LinearObjectPool::release(LinearBackwardCtx *b) {
  b->saved.reset();
  b->grad_scale.reset();
  b->grad_scale_taken = false;
  b->handle_kind = HandleKind::Dead;
  backward_.push_back(b);
}

}  // namespace te
