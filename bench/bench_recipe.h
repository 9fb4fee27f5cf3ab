// One recipe case of the GPU benchmarks, by name: an FP8 recipe with its defaults ("delayed",
// "current", "block") or "bf16", the modules' high-precision path (autocast disabled). Shared by
// te_bench_gpu, te_bench_modules and te_bench_gpu_host.
#pragma once

#include <te/te.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

namespace bench {

// Fills *ao (and *recipe, a new reference the caller releases; NULL for "bf16"). Returns
// TE_ERROR_INVALID_ARGUMENT with *why set for an unknown name, or the failing call's status.
inline te_status recipe_case(const std::string &name, te_autocast_options *ao, te_recipe **recipe, std::string *why) {
  *recipe = nullptr;
  te_status s = te_autocast_options_init(ao);
  if (s != TE_SUCCESS) return *why = "te_autocast_options_init", s;
  if (name == "bf16") {
    ao->enabled = 0;
    return TE_SUCCESS;
  }
  if (name != "delayed" && name != "current" && name != "block") {
    *why = "unknown recipe '" + name + "' (delayed, current, block, bf16)";
    return TE_ERROR_INVALID_ARGUMENT;
  }
  const te_recipe_kind kind = name == "delayed"   ? TE_RECIPE_DELAYED_SCALING
                              : name == "current" ? TE_RECIPE_CURRENT_SCALING
                                                  : TE_RECIPE_BLOCK_SCALING;
  te_recipe_options ro;
  if ((s = te_recipe_options_init(&ro, kind)) != TE_SUCCESS) return *why = "te_recipe_options_init", s;
  if ((s = te_recipe_create(recipe, &ro)) != TE_SUCCESS) return *why = "te_recipe_create", s;
  ao->recipe = *recipe;
  return TE_SUCCESS;
}

// The autocast options of one case and the recipe they hold. Throws std::runtime_error
// ("<what failed>: <status>[: libte's message]") when the case cannot be made.
class RecipeCase {
 public:
  explicit RecipeCase(const std::string &name) {
    std::string why;
    const te_status st = recipe_case(name, &ao_, &recipe_, &why);
    if (st != TE_SUCCESS)  // an unknown name is the benchmark's own refusal: no libte message
      throw std::runtime_error(why + ": " + te_status_string(st) +
                               (st == TE_ERROR_INVALID_ARGUMENT ? "" : std::string(": ") + te_last_error()));
  }
  ~RecipeCase() { te_recipe_release(recipe_); }
  RecipeCase(const RecipeCase &) = delete;
  RecipeCase &operator=(const RecipeCase &) = delete;
  const te_autocast_options *autocast() const { return &ao_; }
  std::string describe() const { return recipe_ ? te_recipe_describe(recipe_) : "autocast disabled (BF16 GEMMs)"; }

 private:
  te_recipe *recipe_ = nullptr;
  te_autocast_options ao_;
};

// For the programs that end at their first error: the case, or "<program>: <message>" on stderr
// and exit status 2.
inline std::unique_ptr<RecipeCase> recipe_case_or_exit(const std::string &name, const char *program) {
  try {
    return std::make_unique<RecipeCase>(name);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    std::exit(2);
  }
}

}  // namespace bench
