#include "backends/backend.h"

#include "base/check.h"

namespace te {

void ScratchPlan::add(size_t b) {
  if (b == 0) return;
  if (n == kMax) fail(Status::Internal, "scratch plan of more than %d blocks", kMax);
  bytes[n++] = b;
}

}  // namespace te

namespace te {

void Backend::gemm_many(const GemmArgs *args, int n) {
  for (int i = 0; i < n; ++i) gemm(args[i]);
}

void Backend::plan_quantize_source(QuantizeItem::Kind kind, const TensorView &x, ScratchPlan *plan) const {
  if (fuses_activation_cast(kind)) return;
  plan->add(x.bytes());
}

void Backend::quantize_many(const QuantizeItem *items, int n) {
  for (int i = 0; i < n; ++i) {
    QuantizeItem q = items[i];
    Buffer made;  // an activation source's output, made here and cast below
    if (q.source.active()) {
      made = Buffer(this, q.x.bytes());
      q.x.data = made.get();
      const ActivationSource &src = q.source;
      if (src.backward) activation_backward(src.act, src.pre, src.grad, q.x);
      else activation_forward(src.act, src.pre, q.x);
    }
    switch (q.kind) {
      case QuantizeItem::Kind::Delayed:
        cast_transpose(q.x, q.scale, q.amax_accum, q.out, q.out_t);
        if (q.scale_copy) copy(q.scale_copy, q.scale, sizeof(float));
        break;
      case QuantizeItem::Kind::Current:
        amax(q.x, q.amax_out, false);
        scale_from_amax(q.amax_out, q.scale_out, q.scale_inv_out, q.fp8_max, q.power_of_2, q.epsilon);
        cast_transpose(q.x, q.scale_out, nullptr, q.out, q.out_t);
        break;
      case QuantizeItem::Kind::Block:
        block_quantize(q.x, q.block_mode, q.power_of_2, q.epsilon, q.out, q.out_t);
        break;
    }
    if (q.dbias.data) bias_grad(q.x, q.dbias);
  }
}

}  // namespace te
