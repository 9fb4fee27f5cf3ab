#include "capi_common.h"

using namespace te;
using namespace te::capi;

extern "C" {

TE_API te_status te_autocast_options_init(te_autocast_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_autocast_options{};
    opts->struct_size = sizeof *opts;
    opts->enabled = 1;
  });
}

TE_API te_status te_autocast_begin(te_context *ctx, const te_autocast_options *opts, te_autocast_token *token) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    check_options(opts, "opts");
    check_not_null(token, "token");
    check_bool(opts->enabled, "opts->enabled");
    check_bool(opts->calibrating, "opts->calibrating");
    const Recipe *recipe = opts->recipe ? to_recipe(opts->recipe, "opts->recipe") : &c->default_recipe();
    const Group *group = opts->group ? to_group(opts->group, "opts->group") : nullptr;
    *token = c->autocast().begin(opts->enabled, opts->calibrating, recipe, group);
  });
}

TE_API te_status te_autocast_end(te_context *ctx, te_autocast_token token) {
  return guarded(__func__, [&] { to_context(ctx)->autocast().end(token); });
}

TE_API te_status te_autocast_get_state(const te_context *ctx, te_autocast_state *out) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    check_options(out, "out");
    const AutocastScope *s = c->autocast().innermost();
    out->enabled = s ? s->enabled : 0;
    out->calibrating = s ? s->calibrating : 0;
    out->recipe = s ? s->recipe->as_public<const te_recipe>() : nullptr;
    out->depth = c->autocast().depth();
  });
}

TE_API te_status te_autocast_flush_backward(te_context *ctx) {
  return guarded(__func__, [&] { to_context(ctx)->autocast().flush_backward(); });
}

}  // extern "C"
