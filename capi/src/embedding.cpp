// te_embedding_forward / te_embedding_backward: the C tensors become views, then the core
// (training/embedding) checks everything and runs the backend.
#include "capi_common.h"
#include "training/embedding.h"

using namespace te;
using namespace te::capi;

extern "C" {

TE_API te_status te_embedding_forward(te_context *ctx, const te_tensor *table, const te_tensor *ids, te_tensor *y) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    const TensorView vt = to_view(table, "table");
    const TensorView vi = to_view(ids, "ids");
    const TensorView vy = to_view(y, "y");
    embedding_forward(*c, vt, vi, vy);
  });
}

TE_API te_status te_embedding_backward(te_context *ctx, const te_tensor *ids, const te_tensor *dy, te_tensor *dtable,
                                       int32_t accumulate) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    const TensorView vi = to_view(ids, "ids");
    const TensorView vdy = to_view(dy, "dy");
    const TensorView vdt = to_view(dtable, "dtable");
    check_bool(accumulate, "accumulate");
    embedding_backward(*c, vi, vdy, vdt, accumulate != 0);
  });
}

}  // extern "C"
