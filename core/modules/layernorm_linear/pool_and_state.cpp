// LayerNormLinear's pooled objects, and its FP8 state in the format of modules/common/state_io.h:
// magic "TELN", shape [in, out], then the input, weight and grad_output states.
#include <cstdio>

#include "modules/common/state_io.h"
#include "modules/layernorm_linear/layernorm_linear.h"

namespace te {

LayerNormLinearPools &layernorm_linear_pools(Context &ctx) {
  return module_pools<LayerNormLinearPools>(ctx, ModuleSlot::LayerNormLinear);
}

void LayerNormLinearSaved::clear() {
  layer.reset();
  recipe.reset();
  group.reset();
  ticket = PassTicket();
  norm.clear();
  proj.clear();
}

void LayerNormLinearBackwardCtx::clear() {
  // ctx was moved out by the pool; the residuals' own context reference keeps their pool alive.
  if (saved) layernorm_linear_pools(*saved->ctx).saved.release(saved);
  saved = nullptr;
}

namespace {

struct LnLinearFormat {
  int64_t shape[2];
  StateFormat f;
  explicit LnLinearFormat(const LayerNormLinearOptions &o)
      : shape{o.in_features, o.out_features}, f{{'T', 'E', 'L', 'N'}, "layernorm_linear", "m", shape, 2, "[in, out]"} {}
};

void role_name(int i, char *buf, size_t cap) {
  static const char *const names[3] = {"input", "weight", "grad_output"};
  std::snprintf(buf, cap, "%s", names[i]);
}

}  // namespace

size_t layernorm_linear_state_size(Context &ctx, const LayerNormLinear &m) {
  const ProjectionState &p = m.core()->proj;
  const ScalingState *states[3] = {&p.input, &p.weight, &p.grad_output};
  return states_size(LnLinearFormat(m.core()->opts).f, states, 3);
}

void layernorm_linear_state_save(Context &ctx, const LayerNormLinear &m, void *buf, size_t capacity) {
  const ProjectionState &p = m.core()->proj;
  const ScalingState *states[3] = {&p.input, &p.weight, &p.grad_output};
  states_save(ctx, LnLinearFormat(m.core()->opts).f, states, 3, buf, capacity);
}

void layernorm_linear_state_load(Context &ctx, LayerNormLinear &m, const void *buf, size_t size) {
  ProjectionState &p = m.core()->proj;
  ScalingState *states[3] = {&p.input, &p.weight, &p.grad_output};
  states_load(ctx, LnLinearFormat(m.core()->opts).f, states, 3, role_name, buf, size);
  p.weight_cache.reset();  // quantized with the old scale
}

}  // namespace te
