// Shared ownership for library objects that something may still need after the caller lets go
// of its handle: a recipe or group a scope or pending backward still uses, a context whose
// layers are still alive. The object counts its references (RefCounted); Ref<T> holds one.
#pragma once

#include <atomic>

namespace te {

// Starts with one reference, the creator's. release() deletes the object (as Derived) at zero.
template <class Derived>
class RefCounted {
 public:
  void retain() const { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() const {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete static_cast<const Derived *>(this);
  }

 private:
  mutable std::atomic<int> refs_{1};
};

// One counted reference; copying is an atomic increment, never an allocation.
template <class T>
class Ref {
 public:
  Ref() = default;
  explicit Ref(T *p) : p_(p) { if (p_) p_->retain(); }
  Ref(const Ref &o) : Ref(o.p_) {}
  Ref(Ref &&o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  Ref &operator=(const Ref &o) {
    if (o.p_) o.p_->retain();
    reset();
    p_ = o.p_;
    return *this;
  }
  Ref &operator=(Ref &&o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      o.p_ = nullptr;
    }
    return *this;
  }
  ~Ref() { reset(); }
  // Takes over a reference the caller already holds.
  static Ref adopt(T *p) {
    Ref r;
    r.p_ = p;
    return r;
  }
  void reset() {
    T *p = p_;
    p_ = nullptr;
    if (p) p->release();
  }
  T *get() const { return p_; }
  T *operator->() const { return p_; }
  T &operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  T *p_ = nullptr;
};

}  // namespace te
