#include "backends/cpu/cpu_backend.h"

#include <cstdio>
#include <cstring>
#include <string>

namespace te {

void CpuBackend::reserve(const ScratchPlan &plan) {
  // Take every block at once (so that blocks of one size class are counted, not reused), then
  // give them back to the cache, whose free lists keep them for the planned calls.
  Buffer held[ScratchPlan::kMax];
  for (int i = 0; i < plan.n; ++i) held[i] = Buffer(this, plan.bytes[i]);
}

void CpuBackend::set_stream(void *stream) {
  if (stream == nullptr) return;
  char text[32];
  std::snprintf(text, sizeof text, "%p", stream);
  throw Error(Status::InvalidArgument,
              std::string("argument 'stream': a CPU context takes no stream (NULL), got ") + text);
}

void CpuBackend::copy(void *dst, const void *src, size_t bytes) {
  if (bytes != 0) std::memmove(dst, src, bytes);
}

void CpuBackend::copy_to_host(void *dst, const void *src, size_t bytes) { copy(dst, src, bytes); }

void CpuBackend::copy_from_host(void *dst, const void *src, size_t bytes) { copy(dst, src, bytes); }

void CpuBackend::fill_floats(float *dst, float value, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = value;
}

void CpuBackend::zero_many(const ByteRange *ranges, int n) {
  for (int i = 0; i < n; ++i)
    if (ranges[i].bytes) std::memset(ranges[i].data, 0, ranges[i].bytes);
}

void CpuBackend::gather_amax(const ScaleUpdateItem *items, int n, float *packed) {
  for (int i = 0; i < n; ++i) packed[i] = *items[i].amax;
}

void CpuBackend::scale_update(const ScaleUpdateItem *items, int n, const float *reduced_amax) {
  for (int i = 0; i < n; ++i) {
    const ScaleUpdateItem &it = items[i];
    delayed_scale_update(it.history, it.len, it.scale, it.scale_inv, it.fp8_max, it.margin, it.algo,
                         reduced_amax != nullptr ? &reduced_amax[i] : it.amax);
    *it.amax = 0.0f;
  }
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

// The gated activations (cpu_activation.cpp) convert one row at a time through a float buffer:
// [a | b] forward, [a | b | dy] backward.
void CpuBackend::plan_activation(Activation act, const TensorView &x, bool backward, ScratchPlan *plan) const {
  if (!is_gated(act)) return;
  const int64_t half = x.cols() / 2;
  plan->add(static_cast<size_t>((backward ? 3 : 2) * half) * sizeof(float));
}

}  // namespace te
