// Attention's pooled objects, and its FP8 state in the format of modules/common/state_io.h:
// magic "TEAT", shape [heads, kv_heads, head_dim], then the Q, K, V, S, dO and dP states.
#include <cstdio>

#include "modules/attention/attention.h"
#include "modules/common/state_io.h"

namespace te {

const float *AttentionCore::p_scale(Backend &be, const RecipeOptions &ro) {
  for (const PScale &p : p_scales_)
    if (p.power_of_2 == ro.power_of_2_scales && p.epsilon == ro.amax_epsilon) return p.floats.floats() + 1;
  p_scales_.reserve(p_scales_.size() + 1);  // the push_back below cannot throw
  PScale p;
  p.power_of_2 = ro.power_of_2_scales;
  p.epsilon = ro.amax_epsilon;
  p.floats = Buffer(&be, 3 * sizeof(float));
  float *f = p.floats.floats();
  be.fill_floats(f, 1.0f, 1);
  be.scale_from_amax(f, f + 1, f + 2, kE4M3Max, ro.power_of_2_scales, ro.amax_epsilon);
  p_scales_.push_back(std::move(p));
  return f + 1;
}

AttentionPools &attention_pools(Context &ctx) { return module_pools<AttentionPools>(ctx, ModuleSlot::Attention); }

void AttentionSaved::clear() {
  layer.reset();
  recipe.reset();
  group.reset();
  ticket = PassTicket();
  fp8 = false;
  dims = AttentionDims();
  q = k = v = o = TensorView();
  q8 = QuantizedMatrix();
  k8 = QuantizedMatrix();
  v8 = QuantizedMatrix();
  lse.reset();
  s_scale = nullptr;
  grad_scales.reset();
  grad_scales_taken = false;
}

void AttentionBackwardCtx::clear() {
  if (saved) attention_pools(*saved->ctx).saved.release(saved);
  saved = nullptr;
}

namespace {

struct AttentionFormat {
  int64_t shape[3];
  StateFormat f;
  explicit AttentionFormat(const AttentionOptions &o)
      : shape{o.heads, o.kv_heads, o.head_dim},
        f{{'T', 'E', 'A', 'T'}, "attention", "m", shape, 3, "[num_heads, num_kv_heads, head_dim]"} {}
};

void state_name(int i, char *buf, size_t cap) {
  static const char *const names[kAttnStates] = {"Q", "K", "V", "S", "dO", "dP"};
  std::snprintf(buf, cap, "%s", names[i]);
}

}  // namespace

size_t attention_state_size(Context &ctx, const Attention &m) {
  const ScalingState *states[kAttnStates];
  for (int i = 0; i < kAttnStates; ++i) states[i] = &m.core()->states[i];
  return states_size(AttentionFormat(m.core()->opts).f, states, kAttnStates);
}

void attention_state_save(Context &ctx, const Attention &m, void *buf, size_t capacity) {
  const ScalingState *states[kAttnStates];
  for (int i = 0; i < kAttnStates; ++i) states[i] = &m.core()->states[i];
  states_save(ctx, AttentionFormat(m.core()->opts).f, states, kAttnStates, buf, capacity);
}

void attention_state_load(Context &ctx, Attention &m, const void *buf, size_t size) {
  ScalingState *states[kAttnStates];
  for (int i = 0; i < kAttnStates; ++i) states[i] = &m.core()->states[i];
  states_load(ctx, AttentionFormat(m.core()->opts).f, states, kAttnStates, state_name, buf, size);
}

}  // namespace te
