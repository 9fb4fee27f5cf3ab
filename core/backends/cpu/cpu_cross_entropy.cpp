// Softmax cross-entropy on the CPU, fused with its gradient. Orders (fp32 throughout, one
// rounding per operation, -ffp-contract=off):
//   count = number of targets != ignore_index (an integer);
//   per row: m = max_j x_j (increasing j); s = sum_j expf(x_j - m) (increasing j, from 0);
//     row loss = (logf(s) + m) - x[target]; ignored rows: 0;
//   dlogits[j] = (expf(x_j - m) / s - (j == target)) * (grad_scale / count), ignored rows 0;
//   loss = (sum of the row losses in increasing row, from 0) / count; count 0: loss 0.
// The CUDA kernels use the same formulas but another summation order for s (per-thread online
// max/sum over strided columns, then a fixed tree) and for the loss (strided per thread, then a
// fixed tree), and CUDA's expf/logf: results agree to a few ulps, not bit for bit.
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_convert.h"
#include "backends/training_args.h"

namespace te {

void CpuBackend::cross_entropy(const CrossEntropyArgs &a) {
  const int64_t vocab = a.logits.cols(), n = a.logits.rows();
  const int32_t *targets = static_cast<const int32_t *>(a.targets.data);
  int64_t count = 0;
  for (int64_t t = 0; t < n; ++t) count += targets[t] != a.ignore_index;
  const float grad_factor = count ? a.grad_scale / static_cast<float>(count) : 0.0f;
  const bool want_grad = a.dlogits.data != nullptr;
  std::vector<float> x(static_cast<size_t>(vocab)), d(static_cast<size_t>(vocab));
  float total = 0.0f;
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
    float m = -INFINITY;
    for (int64_t j = 0; j < vocab; ++j) m = x[j] > m ? x[j] : m;
    float s = 0.0f;
    for (int64_t j = 0; j < vocab; ++j) s = s + std::exp(x[j] - m);
    const bool valid = target >= 0 && target < vocab;  // the core refuses others on the CPU
    const float row_loss = valid ? (std::log(s) + m) - x[target] : NAN;
    total = total + row_loss;
    if (want_grad) {
      for (int64_t j = 0; j < vocab; ++j) {
        const float p = std::exp(x[j] - m) / s;
        d[j] = valid ? (p - (j == target ? 1.0f : 0.0f)) * grad_factor : NAN;
      }
      cpu::store_floats(d.data(), vocab, a.dlogits.data, a.dlogits.dtype, t * vocab);
    }
  }
  *a.loss = count ? total / static_cast<float>(count) : 0.0f;
}

}  // namespace te
