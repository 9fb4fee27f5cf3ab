// Recipes: immutable, intrusively reference-counted descriptions of how to scale FP8 tensors.
// The key is the recipe's canonical encoding itself, packed into 63 bits (recipe.cpp says how),
// so equal options <=> equal keys with no collisions by construction, and no table that grows
// with every distinct recipe ever created.
#pragma once

#include <cstdint>
#include <string>

#include "base/handle.h"
#include "numerics/numerics.h"
#include "base/ref.h"
#include "base/types.h"

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

class Recipe : public Handle, public RefCounted<Recipe> {
 public:
  // Validates (throws InvalidArgument naming the field) and returns a recipe with refcount 1.
  static Recipe *create(const RecipeOptions &opts);

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
};

using RecipeRef = Ref<const Recipe>;

}  // namespace te
