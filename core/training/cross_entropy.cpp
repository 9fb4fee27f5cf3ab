// te_cross_entropy: every check happens before the backend is called, so a refused call writes
// nothing (neither the loss nor dlogits).
#include "training/cross_entropy.h"

#include <cmath>
#include <cstdint>

#include "backends/training_args.h"
#include "modules/common/validate.h"

namespace te {


void cross_entropy(Context &ctx, const CrossEntropyCall &c) {
  const Device &dev = ctx.device();
  const TensorView &logits = c.logits;
  check_high_precision(logits, "logits");
  check_device(logits, "logits", dev);
  const int64_t vocab = logits.cols(), n = logits.rows();
  check_tensor(c.targets, "targets", DType::I32, dev);
  if (c.targets.numel() != n)
    fail(Status::InvalidArgument, "argument 'targets': expected %lld elements (one per row of 'logits'), got %lld",
         (long long)n, (long long)c.targets.numel());
  check_tensor(c.loss, "loss", DType::F32, dev);
  if (c.loss.numel() != 1)
    fail(Status::InvalidArgument, "argument 'loss': expected one element, got %lld", (long long)c.loss.numel());
  if (c.dlogits.data) {
    check_tensor(c.dlogits, "dlogits", logits.dtype, dev);
    check_same_shape(c.dlogits, "dlogits", logits, "logits");
  }
  // dlogits may be logits itself (in place) but must not overlap it otherwise; the loss and
  // dlogits must not overlap anything they are computed from.
  check_separate(c.loss, "loss", logits, "logits");
  check_separate(c.loss, "loss", c.targets, "targets");
  if (c.dlogits.data) {
    if (c.dlogits.data != logits.data) check_separate(c.dlogits, "dlogits", logits, "logits");
    check_separate(c.dlogits, "dlogits", c.targets, "targets");
    check_separate(c.loss, "loss", c.dlogits, "dlogits");
  }
  if (!std::isfinite(c.grad_scale))
    fail(Status::InvalidArgument, "argument 'opts->grad_scale': expected a finite value, got %g", (double)c.grad_scale);
  // The CPU core reads host memory: a target outside [0, vocab) that is not ignore_index is
  // refused, naming the first one (CUDA makes that row's loss NaN instead: no host sync).
  if (dev.type == DeviceType::CPU) {
    const int32_t *t = static_cast<const int32_t *>(c.targets.data);
    for (int64_t i = 0; i < n; ++i)
      if (t[i] != c.ignore_index && (t[i] < 0 || t[i] >= vocab))
        fail(Status::InvalidArgument,
             "argument 'targets': target %d at token %lld is outside [0, vocab = %lld) and is not ignore_index = %d",
             t[i], (long long)i, (long long)vocab, c.ignore_index);
  }
  CrossEntropyArgs a;
  a.logits = logits;
  a.targets = c.targets;
  a.loss = static_cast<float *>(c.loss.data);
  a.dlogits = c.dlogits;
  a.ignore_index = c.ignore_index;
  a.grad_scale = c.grad_scale;
  // The scratch (CUDA: the per-row losses and the count) is reserved before anything is written.
  Backend &be = ctx.backend();
  ScratchPlan plan;
  be.plan_cross_entropy(a, &plan);
  be.reserve(plan);
  be.cross_entropy(a);
}

}  // namespace te
