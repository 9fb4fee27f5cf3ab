// One recipe case of the GPU benchmarks, by name: an FP8 recipe with its defaults ("delayed",
// "current", "block") or "bf16", the modules' high-precision path (autocast disabled). Shared by
// te_bench_gpu, te_bench_modules and te_bench_gpu_host, each of which reports errors its own way.
#pragma once

#include <te/te.h>

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

}  // namespace bench
