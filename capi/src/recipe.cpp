#include "capi_common.h"

using namespace te;
using namespace te::capi;

static_assert(TE_RECIPE_BLOCK_SCALING == static_cast<int>(RecipeKind::Block), "recipe kinds must match the core");
static_assert(TE_AMAX_MOST_RECENT == static_cast<int>(AmaxAlgo::MostRecent), "amax algos must match the core");

namespace {

void check_kind(int kind, const char *name) {
  if (kind < TE_RECIPE_DELAYED_SCALING || kind > TE_RECIPE_BLOCK_SCALING)
    fail(Status::InvalidArgument, "argument '%s': expected a te_recipe_kind value, got %d", name, kind);
}

RecipeOptions to_core(const te_recipe_options &o) {
  const int kind = enum_int(o.kind), format = enum_int(o.format), algo = enum_int(o.amax_algo);
  check_kind(kind, "opts->kind");
  if (format != TE_FORMAT_HYBRID && format != TE_FORMAT_E4M3)
    fail(Status::InvalidArgument, "argument 'opts->format': expected TE_FORMAT_HYBRID or TE_FORMAT_E4M3, got %d", format);
  if (algo != TE_AMAX_MAX && algo != TE_AMAX_MOST_RECENT)
    fail(Status::InvalidArgument, "argument 'opts->amax_algo': expected TE_AMAX_MAX or TE_AMAX_MOST_RECENT, got %d", algo);
  check_bool(o.reduce_amax, "opts->reduce_amax");
  check_bool(o.power_of_2_scales, "opts->power_of_2_scales");
  check_bool(o.fprop_split_accumulator, "opts->fprop_split_accumulator");
  check_bool(o.dgrad_split_accumulator, "opts->dgrad_split_accumulator");
  check_bool(o.wgrad_split_accumulator, "opts->wgrad_split_accumulator");
  RecipeOptions r;
  r.kind = static_cast<RecipeKind>(kind);
  r.format = static_cast<Format>(format);
  r.margin = o.margin;
  r.amax_history_len = o.amax_history_len;
  r.amax_algo = static_cast<AmaxAlgo>(algo);
  r.reduce_amax = o.reduce_amax;
  r.power_of_2_scales = o.power_of_2_scales;
  r.amax_epsilon = o.amax_epsilon;
  r.fprop_split_accumulator = o.fprop_split_accumulator;
  r.dgrad_split_accumulator = o.dgrad_split_accumulator;
  r.wgrad_split_accumulator = o.wgrad_split_accumulator;
  return r;
}

void to_c(const RecipeOptions &r, te_recipe_options *o) {
  o->kind = static_cast<te_recipe_kind>(r.kind);
  o->format = static_cast<te_format>(r.format);
  o->margin = r.margin;
  o->amax_history_len = r.amax_history_len;
  o->amax_algo = static_cast<te_amax_algo>(r.amax_algo);
  o->reduce_amax = r.reduce_amax;
  o->power_of_2_scales = r.power_of_2_scales;
  o->amax_epsilon = r.amax_epsilon;
  o->fprop_split_accumulator = r.fprop_split_accumulator;
  o->dgrad_split_accumulator = r.dgrad_split_accumulator;
  o->wgrad_split_accumulator = r.wgrad_split_accumulator;
}

}  // namespace

extern "C" {

TE_API te_status te_recipe_options_init(te_recipe_options *opts, te_recipe_kind kind) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    const int k = enum_int(kind);
    check_kind(k, "kind");
    te_recipe_options o{};
    o.struct_size = sizeof o;
    to_c(RecipeOptions::defaults(static_cast<RecipeKind>(k)), &o);
    *opts = o;
  });
}

TE_API te_status te_recipe_create(te_recipe **out, const te_recipe_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    RecipeOptions r = RecipeOptions::defaults(RecipeKind::Delayed);
    if (opts) {
      check_options(opts, "opts");
      r = to_core(*opts);
    }
    *out = Recipe::create(r)->as_public<te_recipe>();
  });
}

TE_API te_recipe *te_recipe_retain(te_recipe *r) {
  Recipe *rec = live_or_null<Recipe>(r, HandleKind::Recipe);
  if (!rec) return nullptr;
  rec->retain();
  return r;
}

TE_API void te_recipe_release(te_recipe *r) {
  if (Recipe *rec = live_or_null<Recipe>(r, HandleKind::Recipe)) rec->release();
}

TE_API uint64_t te_recipe_key(const te_recipe *r) {
  const Recipe *rec = live_or_null<Recipe>(r, HandleKind::Recipe);
  return rec ? rec->key() : 0;
}

TE_API const char *te_recipe_describe(const te_recipe *r) {
  const Recipe *rec = live_or_null<Recipe>(r, HandleKind::Recipe);
  return rec ? rec->describe().c_str() : "";
}

TE_API te_status te_recipe_get_options(const te_recipe *r, te_recipe_options *out) {
  return guarded(__func__, [&] {
    const Recipe *rec = to_recipe(r, "r");
    check_options(out, "out");
    to_c(rec->options(), out);
  });
}

}  // extern "C"
