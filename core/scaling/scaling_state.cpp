#include "scaling/scaling_state.h"

#include <algorithm>
#include <vector>

namespace te {

ScalingState::Staged ScalingState::stage(Backend &be, AmaxSlots &slots, const Recipe &recipe, DType fp8_dtype) const {
  const RecipeOptions &o = recipe.options();
  Staged s;
  // Current and block scaling keep no history: one slot serves as the scale's home.
  s.len = o.kind == RecipeKind::Delayed ? o.amax_history_len : 1;
  s.dtype = fp8_dtype;
  s.margin = o.margin;
  s.algo = o.amax_algo;
  s.reinit = s.len != len_ || fp8_dtype != dtype_;
  if (s.reinit) {
    s.mem = Buffer(&be, sizeof(float) * (static_cast<size_t>(s.len) + 3));
    if (!amax_.get()) s.slot.acquire(slots);  // zeroed
    be.fill_floats(s.mem.floats(), 0.0f, static_cast<size_t>(s.len) + 3);
    be.fill_floats(s.mem.floats() + s.len, 1.0f, 2);  // scale = scale_inv = 1
  }
  return s;
}

void ScalingState::commit(Backend &be, Staged &&s) {
  if (s.reinit) {
    if (s.slot.get()) amax_ = std::move(s.slot);
    if (amax_.get()) be.fill_floats(amax_.get(), s.amax_value, 1);
    mem_ = std::move(s.mem);
    len_ = s.len;
    dtype_ = s.dtype;
  }
  margin_ = s.margin;
  algo_ = s.algo;
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

ScalingState::Staged ScalingState::stage_assign(Backend &be, AmaxSlots &slots, int len, DType dtype, float scale,
                                                float scale_inv, const float *history) const {
  Staged s;
  s.reinit = true;
  s.len = len > 0 ? len : 0;
  s.dtype = dtype;
  s.margin = margin_;
  s.algo = algo_;
  if (s.len == 0) return s;
  std::vector<float> host(static_cast<size_t>(len) + 3, 0.0f);
  std::copy_n(history + 1, static_cast<size_t>(len - 1), host.begin() + 1);  // [0] lives in the slot
  host[len] = scale;
  host[len + 1] = scale_inv;
  s.mem = Buffer(&be, host.size() * sizeof(float));
  if (!amax_.get()) s.slot.acquire(slots);
  be.copy_from_host(s.mem.get(), host.data(), host.size() * sizeof(float));
  s.amax_value = history[0];
  return s;
}

void ScalingState::assign(Backend &be, AmaxSlots &slots, int len, DType dtype, float scale, float scale_inv,
                          const float *history) {
  commit(be, stage_assign(be, slots, len, dtype, scale, scale_inv, history));
}

}  // namespace te
