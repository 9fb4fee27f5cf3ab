// CudaBackend::quantize_many: several quantizations in as few launches as their kinds allow,
// with the bias gradient of a dy taken in the pass that casts it (cuda_backend.h).
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"

namespace te::cuda {

void CudaBackend::quantize_many(const QuantizeItem *items, int n) {
  DeviceGuard g(device_);
  // Runs of items of one kind, input dtype, output formats and class of activation source go in
  // one launch each (current scaling: an amax pass, then the casts that derive their scales from
  // it; small tensors need no amax pass); block-scaled items of one input dtype and class of
  // source share a launch whatever their modes.
  CastItem group[kMaxCastItems];
  TensorView xs[kMaxCastItems];
  int npartials[kMaxCastItems];
  int m = 0;
  // Bias gradients taken in the casts: per-row-of-tiles partials, summed once the casts ran.
  struct PendingDbias {
    Buffer partial;
    int64_t parts, cols;
    TensorView db;
  };
  // One list per kind of launch: a list is summed right after its own launch.
  struct PendingList {
    PendingDbias items[kMaxCastItems];
    int n = 0;
  } cast_dbias, block_dbias;
  auto dbias_target = [&](PendingList &list, const QuantizeItem &q, void **out, DType *dtype) {
    *out = nullptr;
    if (!q.dbias.data) return;
    const int64_t rows = q.x.numel() == 0 ? 0 : q.x.rows(), cols = q.x.cols(), parts = (rows + 127) / 128;
    if (rows == 0) {  // no tiles to sum in: bias_grad writes the zeros
      cuda::bias_grad(*this, q.x, q.dbias, stream_);
      return;
    }
    if (parts == 1) {
      *out = q.dbias.data, *dtype = q.dbias.dtype;
      return;
    }
    PendingDbias &p = list.items[list.n++];
    p.partial = Buffer(this, static_cast<size_t>(parts * cols) * sizeof(float));
    p.parts = parts, p.cols = cols, p.db = q.dbias;
    *out = p.partial.get(), *dtype = DType::F32;
  };
  auto finish_dbias = [&](PendingList &list) {
    for (int i = 0; i < list.n; ++i) {
      PendingDbias &p = list.items[i];
      sum_bias_partials(p.partial.floats(), p.parts, p.cols, p.db, stream_);
      p.partial.reset();
    }
    list.n = 0;
  };
  const QuantizeItem *first = nullptr;
  auto flush = [&] {
    if (m == 0) return;
    if (first->kind == QuantizeItem::Kind::Current) {
      // Small tensors take their amax inside the cast; the others' comes from one amax pass.
      // Activation-sourced ones (a group holds one class of source) all take theirs from one pass
      // that computes the activation: the cast cannot read x, whatever its size.
      const bool sourced = group[0].source.active();
      TensorView big[kMaxCastItems];
      ActivationSource sources[kMaxCastItems];
      int owner[kMaxCastItems], nb = 0;
      for (int i = 0; i < m; ++i) {
        if (!sourced && xs[i].numel() <= kSelfAmaxElements) continue;
        big[nb] = xs[i], sources[nb] = group[i].source, owner[nb++] = i;
      }
      if (nb && sourced) activation_amax_partials(big, sources, nb, amax_partials_, npartials, stream_);
      else if (nb) amax_partials(big, nb, amax_partials_, npartials, stream_);
      for (int j = 0; j < nb; ++j) {
        group[owner[j]].partials = amax_partials_ + static_cast<size_t>(j) * kAmaxPartialBlocks;
        group[owner[j]].npartials = npartials[j];
      }
    }
    cast_transpose_many(group, m, stream_);
    m = 0;
    finish_dbias(cast_dbias);
  };
  auto format = [](const TensorView *t) { return t ? static_cast<int>(t->dtype) : -1; };
  auto same_group = [&](const QuantizeItem &a, const QuantizeItem &b) {
    return a.kind == b.kind && a.x.dtype == b.x.dtype && format(a.out) == format(b.out) &&
           format(a.out_t) == format(b.out_t) && activation_class(a.source) == activation_class(b.source);
  };
  BlockQuantizeItem blocks[kMaxCastItems];
  int nb = 0;
  auto flush_blocks = [&] {
    if (nb) block_quantize_many(blocks, nb, stream_);
    nb = 0;
    finish_dbias(block_dbias);
  };
  for (int i = 0; i < n; ++i) {
    const QuantizeItem &q = items[i];
    if (q.source.active() && !fuses_activation_cast(q.kind)) {
      // Made into scratch, then cast, after the items before it (the order of the per-item calls).
      flush();
      flush_blocks();
      Backend::quantize_many(&q, 1);
      continue;
    }
    if (q.kind == QuantizeItem::Kind::Block) {
      const bool joins = nb > 0 && blocks[0].x.dtype == q.x.dtype &&
                         activation_class(blocks[0].source) == activation_class(q.source);
      if (nb == kMaxCastItems || (nb > 0 && !joins)) flush_blocks();
      BlockQuantizeItem &b = blocks[nb++];
      b.x = q.x, b.mode = q.block_mode, b.power_of_2 = q.power_of_2, b.epsilon = q.epsilon;
      b.out = q.out, b.out_t = q.out_t;
      b.source = q.source;
      dbias_target(block_dbias, q, &b.dbias, &b.dbias_dtype);
      continue;
    }
    if (m == kMaxCastItems || (m > 0 && !same_group(*first, q))) flush();
    if (m == 0) first = &q;
    CastItem &c = group[m];
    c = CastItem();
    c.x = q.x;
    c.out = q.out;
    c.out_t = q.out_t;
    c.source = q.source;
    dbias_target(cast_dbias, q, &c.dbias, &c.dbias_dtype);
    if (q.kind == QuantizeItem::Kind::Delayed) {
      c.scale = q.scale;
      c.amax_accum = q.amax_accum;
      c.scale_copy = q.scale_copy;
    } else {
      c.amax_out = q.amax_out, c.scale_out = q.scale_out, c.scale_inv_out = q.scale_inv_out;
      c.fp8_max = q.fp8_max, c.epsilon = q.epsilon, c.power_of_2 = q.power_of_2;
    }
    xs[m++] = q.x;
  }
  flush();
  flush_blocks();
}

}  // namespace te::cuda
