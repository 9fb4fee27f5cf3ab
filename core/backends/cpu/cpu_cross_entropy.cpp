// Softmax cross-entropy on the CPU, fused with its gradient: the reference the CUDA kernels match
// bit for bit. The arithmetic and the orders are training/cross_entropy_math.h's: this file
// replays the CUDA block layout lane by lane (per row kRowLanes online (max, sum-exp) pairs,
// combined as a tree of 32-lane groups then of the groups; the loss as kLossLanes strided sums
// then a tree), so that the two backends round identically.
//   count = number of targets != ignore_index (an integer);
//   counted row: loss_t = log(s) + (m - x[target]); dlogits = (e^(x - m) / s - onehot) * factor,
//     factor = grad_scale / count; a NaN anywhere in the row makes s (so loss_t and dlogits) NaN;
//   ignored row: loss_t = 0, dlogits 0;
//   loss = (tree of the strided sums of loss_t) / count, 0 when count is 0.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_convert.h"
#include "backends/training_args.h"
#include "training/cross_entropy_math.h"

namespace te {

namespace {

// The (max, sum-exp) pair of one row of `vocab` floats, in the CUDA row block's order.
ce::MaxSum row_max_sum(const float *x, int64_t vocab) {
  ce::MaxSum lane[ce::kRowLanes];
  bool saw_nan = false;
  for (int u = 0; u < ce::kRowLanes; ++u)
    for (int64_t j = u; j < vocab; j += ce::kRowLanes) {
      if (x[j] != x[j]) saw_nan = true;
      else ce::push(lane[u], x[j]);
    }
  constexpr int kGroups = ce::kRowLanes / ce::kWarp;
  ce::MaxSum group[kGroups];
  for (int g = 0; g < kGroups; ++g) {
    ce::MaxSum *v = lane + g * ce::kWarp;
    for (int off = ce::kWarp / 2; off > 0; off /= 2)
      for (int i = 0; i < off; ++i) v[i] = ce::combine(v[i], v[i + off]);
    group[g] = v[0];
  }
  for (int off = kGroups / 2; off > 0; off /= 2)
    for (int i = 0; i < off; ++i) group[i] = ce::combine(group[i], group[i + off]);
  ce::MaxSum r = group[0];
  if (saw_nan) r.s = NAN;
  return r;
}

// The mean of the row losses in the CUDA loss block's order.
float mean_loss(const std::vector<float> &row_loss, int64_t count) {
  std::vector<float> part(ce::kLossLanes, 0.0f);
  const int64_t n = static_cast<int64_t>(row_loss.size());
  for (int u = 0; u < ce::kLossLanes; ++u)
    for (int64_t t = u; t < n; t += ce::kLossLanes) part[u] = part[u] + row_loss[static_cast<size_t>(t)];
  for (int w = ce::kLossLanes / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) part[i] = part[i] + part[i + w];
  return count ? part[0] / static_cast<float>(count) : 0.0f;
}

}  // namespace

void CpuBackend::cross_entropy(const CrossEntropyArgs &a) {
  const int64_t vocab = a.logits.cols(), n = a.logits.rows();
  const int32_t *targets = static_cast<const int32_t *>(a.targets.data);
  int64_t count = 0;
  for (int64_t t = 0; t < n; ++t) count += targets[t] != a.ignore_index;
  const float factor = count ? ce::grad_factor(a.grad_scale, count) : 0.0f;
  const bool want_grad = a.dlogits.data != nullptr;
  std::vector<float> x(static_cast<size_t>(vocab)), d(static_cast<size_t>(vocab));
  std::vector<float> row_loss(static_cast<size_t>(n), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t target = targets[t];
    if (target == a.ignore_index) {
      if (want_grad) {
        std::fill(d.begin(), d.end(), 0.0f);
        cpu::store_floats(d.data(), vocab, a.dlogits.data, a.dlogits.dtype, t * vocab);
      }
      continue;
    }
    // The whole row is read before anything is written: dlogits may be logits itself.
    cpu::load_floats(a.logits.data, a.logits.dtype, t * vocab, vocab, x.data());
    const ce::MaxSum v = row_max_sum(x.data(), vocab);
    const bool valid = target >= 0 && target < vocab;  // the core refuses others on the CPU
    row_loss[static_cast<size_t>(t)] = valid ? ce::row_loss(v, x[static_cast<size_t>(target)]) : NAN;
    if (want_grad) {
      for (int64_t j = 0; j < vocab; ++j) d[static_cast<size_t>(j)] = valid ? ce::grad(x[static_cast<size_t>(j)], v, j == target, factor) : NAN;
      cpu::store_floats(d.data(), vocab, a.dlogits.data, a.dlogits.dtype, t * vocab);
    }
  }
  *a.loss = mean_loss(row_loss, count);
}

}  // namespace te
