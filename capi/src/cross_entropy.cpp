// te_cross_entropy_options_init / te_cross_entropy: the C structs become core types, then the
// core (training/cross_entropy) checks everything and runs the backend.
#include "capi_common.h"
#include "training/cross_entropy.h"

using namespace te;
using namespace te::capi;

extern "C" {

TE_API te_status te_cross_entropy_options_init(te_cross_entropy_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_cross_entropy_options{};
    opts->struct_size = sizeof *opts;
    opts->ignore_index = -100;
    opts->grad_scale = 1.0f;
  });
}

TE_API te_status te_cross_entropy(te_context *ctx, const te_cross_entropy_options *opts, const te_tensor *logits,
                                  const te_tensor *targets, te_tensor *loss, te_tensor *dlogits) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    CrossEntropyCall call;
    if (opts) {
      check_options(opts, "opts");
      call.ignore_index = opts->ignore_index;  // any int: a value no target takes ignores nothing
      call.grad_scale = opts->grad_scale;      // finiteness is checked by the core
    }
    call.logits = to_view(logits, "logits");
    call.targets = to_view(targets, "targets");
    call.loss = to_view(loss, "loss");
    call.dlogits = to_optional_view(dlogits, "dlogits");
    cross_entropy(*c, call);
  });
}

}  // extern "C"
