#include <algorithm>

#include "modules/linear/linear.h"

namespace te {

LinearObjectPool &linear_pool(Context &ctx) {
  if (auto *pool = static_cast<LinearObjectPool *>(ctx.module_state(ModuleSlot::Linear))) return *pool;
  auto made = std::make_unique<LinearObjectPool>();
  LinearObjectPool &pool = *made;
  ctx.set_module_state(ModuleSlot::Linear, std::move(made));
  return pool;
}

void SavedRecycler::operator()(LinearSaved *s) const { s->pool->release(s); }

LinearObjectPool::~LinearObjectPool() {
  for (LinearSaved *s : saved_) delete s;
  for (LinearBackwardCtx *b : backward_) delete b;
}

SavedPtr LinearObjectPool::acquire_saved(Context &ctx) {
  saved_.reserve(saved_.size() + 1);  // so that release() never allocates
  LinearSaved *s;
  if (saved_.empty()) {
    s = new LinearSaved();
  } else {
    s = saved_.back();
    saved_.pop_back();
    s->reissue();
  }
  s->pool = this;
  s->ctx = ContextRef(&ctx);
  return SavedPtr(s);
}

void LinearObjectPool::release(LinearSaved *s) {
  // Every earlier handle to it dies; what the residuals reference goes back (buffers to the
  // backend's cache). The context reference goes last: it may be the one keeping this pool alive.
  s->retire();
  ContextRef keep = std::move(s->ctx);
  s->layer.reset();
  s->fp8 = false;
  s->recipe.reset();
  s->group.reset();
  s->ticket = PassTicket();
  s->x = QuantizedMatrix();
  s->w.reset();
  s->x_hp = TensorView();
  s->w_hp = TensorView();
  s->tokens = 0;
  saved_.push_back(s);  // capacity reserved when it was handed out
}

LinearBackwardCtx *LinearObjectPool::acquire_backward_ctx(Context &ctx) {
  backward_.reserve(backward_.size() + 1);
  LinearBackwardCtx *b;
  if (backward_.empty()) {
    b = new LinearBackwardCtx();
  } else {
    b = backward_.back();
    backward_.pop_back();
    b->reissue();
  }
  b->ctx = ContextRef(&ctx);
  return b;
}

void LinearObjectPool::release(LinearBackwardCtx *b) {
  b->retire();
  ContextRef keep = std::move(b->ctx);
  b->saved.reset();
  b->grad_scale.reset();
  b->grad_scale_taken = false;
  backward_.push_back(b);
}

}  // namespace te
