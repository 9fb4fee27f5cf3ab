#include "te/core/scaling_state.h"

#include <algorithm>
#include <vector>

namespace te {

void ScalingState::prepare(Backend &be, AmaxSlots &slots, const Recipe &recipe, DType fp8_dtype) {
  const RecipeOptions &o = recipe.options();
  // Current and block scaling keep no history: one slot serves as the scale's home.
  int len = o.kind == RecipeKind::Delayed ? o.amax_history_len : 1;
  if (len != len_ || fp8_dtype != dtype_) {
    Buffer mem(&be, sizeof(float) * (static_cast<size_t>(len) + 3));
    if (!amax_.get()) amax_.acquire(slots);  // zeroed
    else be.fill_floats(amax_.get(), 0.0f, 1);
    be.fill_floats(mem.floats(), 0.0f, static_cast<size_t>(len) + 3);
    be.fill_floats(mem.floats() + len, 1.0f, 2);  // scale = scale_inv = 1
    mem_ = std::move(mem);
    len_ = len;
    dtype_ = fp8_dtype;
  }
  margin_ = o.margin;
  algo_ = o.amax_algo;
}

void ScalingState::read(Backend &be, float *scale_out, float *scale_inv_out, float *history_out,
                        int history_cap) const {
  if (!initialized()) {
    if (scale_out) *scale_out = 1.0f;
    if (scale_inv_out) *scale_inv_out = 1.0f;
    return;
  }
  std::vector<float> host(static_cast<size_t>(len_) + 2);
  be.copy_to_host(host.data(), mem_.get(), host.size() * sizeof(float));
  if (scale_out) *scale_out = host[len_];
  if (scale_inv_out) *scale_inv_out = host[len_ + 1];
  if (history_out && history_cap > 0) {
    std::copy(host.begin(), host.begin() + std::min(history_cap, len_), history_out);
    be.copy_to_host(history_out, amax(), sizeof(float));
  }
}

void ScalingState::assign(Backend &be, AmaxSlots &slots, int len, DType dtype, float scale, float scale_inv,
                          const float *history) {
  if (len <= 0) {
    mem_.reset();
    len_ = 0;
    dtype_ = dtype;
    return;
  }
  std::vector<float> host(static_cast<size_t>(len) + 3, 0.0f);
  std::copy_n(history + 1, static_cast<size_t>(len - 1), host.begin() + 1);  // [0] lives in the slot
  host[len] = scale;
  host[len + 1] = scale_inv;
  Buffer mem(&be, host.size() * sizeof(float));
  if (!amax_.get()) amax_.acquire(slots);
  be.copy_from_host(mem.get(), host.data(), host.size() * sizeof(float));
  be.copy_from_host(amax_.get(), history, sizeof(float));
  mem_ = std::move(mem);
  len_ = len;
  dtype_ = dtype;
}

}  // namespace te
