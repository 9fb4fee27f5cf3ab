// Per-context free lists of a module's residuals and backward-context objects, so that a training
// step makes no heap allocation: the lists grow only when more objects are alive at once than
// ever before. T is a Handle with a `ContextRef ctx` member and a `clear()` that drops what it
// references.
#pragma once

#include <vector>

#include "context/context.h"

namespace te {

template <class T>
class ObjectPool {
 public:
  ObjectPool() = default;
  ObjectPool(const ObjectPool &) = delete;
  ObjectPool &operator=(const ObjectPool &) = delete;
  ~ObjectPool() {
    for (T *t : free_) delete t;
  }

  // The object holds a reference to `ctx` and carries a fresh handle.
  T *acquire(Context &ctx) {
    free_.reserve(free_.size() + 1);  // so that release() never allocates
    T *t;
    if (free_.empty()) {
      t = new T();
    } else {
      t = free_.back();
      free_.pop_back();
      t->reissue();
    }
    t->ctx = ContextRef(&ctx);
    return t;
  }

  // Every earlier handle to it dies and what it references goes back; the context reference goes
  // last: it may be the one keeping this pool alive.
  void release(T *t) {
    t->retire();
    ContextRef keep = std::move(t->ctx);
    t->clear();
    free_.push_back(t);  // capacity reserved when it was handed out
  }

 private:
  std::vector<T *> free_;
};

// The pool object of module slot `slot` in ctx, made on first use (which may throw OutOfMemory,
// before anything changed).
template <class Pools>
Pools &module_pools(Context &ctx, ModuleSlot slot) {
  if (auto *p = static_cast<Pools *>(ctx.module_state(slot))) return *p;
  auto made = std::make_unique<Pools>();
  Pools &pools = *made;
  ctx.set_module_state(slot, std::move(made));
  return pools;
}

}  // namespace te
