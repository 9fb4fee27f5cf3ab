#include "backends/backend.h"

#include <cstdint>

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

void Backend::bias_grad_many(const TensorView *dys, const TensorView *dbs, int n) {
  for (int i = 0; i < n; ++i) bias_grad(dys[i], dbs[i]);
}

void Backend::copy_row_segments(void *dst, const void *src, size_t row_bytes, const RowSegment *segs, int n) {
  auto *d = static_cast<unsigned char *>(dst);
  const auto *s = static_cast<const unsigned char *>(src);
  for (int i = 0; i < n; ++i) {
    const RowSegment &g = segs[i];
    if (g.rows > 0) copy(d + g.dst_row * row_bytes, s + g.src_row * row_bytes, static_cast<size_t>(g.rows) * row_bytes);
    if (g.zero_rows > 0) {
      unsigned char *z = d + (g.dst_row + g.rows) * row_bytes;
      if (row_bytes % 4 || reinterpret_cast<uintptr_t>(z) % 4)
        fail(Status::Internal, "copy_row_segments: zero rows need 4-byte aligned rows of a multiple of 4 bytes");
      fill_floats(reinterpret_cast<float *>(z), 0.0f, static_cast<size_t>(g.zero_rows) * row_bytes / 4);
    }
  }
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
