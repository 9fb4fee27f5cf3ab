// Recipes: immutable, intrusively reference-counted descriptions of how to scale FP8 tensors.
// The key is the index of the recipe's canonical encoding in an append-only intern table, so
// equal options <=> equal keys with no collisions by construction.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "te/core/handle.h"
#include "te/core/numerics.h"
#include "te/core/types.h"

namespace te {

enum class RecipeKind : int { Delayed = 0, Current = 1, Block = 2 };
enum class Format : int { Hybrid = 0, E4M3 = 1 };

struct RecipeOptions {
  RecipeKind kind = RecipeKind::Delayed;
  Format format = Format::Hybrid;
  int margin = 0;
  int amax_history_len = 1024;
  AmaxAlgo amax_algo = AmaxAlgo::Max;
  bool reduce_amax = true;
  bool power_of_2_scales = false;
  float amax_epsilon = 0.0f;
  bool fprop_split_accumulator = false;
  bool dgrad_split_accumulator = true;
  bool wgrad_split_accumulator = true;

  static RecipeOptions defaults(RecipeKind kind);
};

class Recipe : public Handle {
 public:
  // Validates (throws InvalidArgument naming the field) and returns a recipe with refcount 1.
  static Recipe *create(const RecipeOptions &opts);
  void retain() const { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() const;

  const RecipeOptions &options() const { return opts_; }
  uint64_t key() const { return key_; }
  const std::string &describe() const { return describe_; }
  RecipeKind kind() const { return opts_.kind; }
  // The FP8 type of forward tensors (activations, weights) and of backward ones (gradients).
  DType forward_dtype() const { return DType::E4M3; }
  DType backward_dtype() const { return opts_.format == Format::Hybrid ? DType::E5M2 : DType::E4M3; }

 private:
  explicit Recipe(const RecipeOptions &opts);
  RecipeOptions opts_;
  uint64_t key_;
  std::string describe_;
  mutable std::atomic<int> refs_{1};
};

// A counted reference; copying is an atomic increment, never an allocation.
class RecipeRef {
 public:
  RecipeRef() = default;
  explicit RecipeRef(const Recipe *r) : r_(r) { if (r_) r_->retain(); }
  RecipeRef(const RecipeRef &o) : RecipeRef(o.r_) {}
  RecipeRef &operator=(const RecipeRef &o) {
    if (o.r_) o.r_->retain();
    if (r_) r_->release();
    r_ = o.r_;
    return *this;
  }
  ~RecipeRef() { if (r_) r_->release(); }
  // Takes over a reference the caller already holds.
  static RecipeRef adopt(const Recipe *r) { RecipeRef ref; ref.r_ = r; return ref; }
  const Recipe *get() const { return r_; }
  const Recipe *operator->() const { return r_; }
  const Recipe &operator*() const { return *r_; }
  explicit operator bool() const { return r_ != nullptr; }

 private:
  const Recipe *r_ = nullptr;
};

}  // namespace te
