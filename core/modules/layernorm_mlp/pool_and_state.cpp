// LayerNormMLP's pooled objects, and its FP8 state in the format of modules/common/state_io.h:
// magic "TEMP", shape [hidden, ffn, fc1 rows], then fc1's input, weight, grad_output and fc2's.
// fc1's rows (ffn, or 2 ffn for the gated activations) are part of the shape: a gated module's
// fc1 weight is another tensor than a non-gated one's of the same ffn, so its states must not
// load into it (te.h: a buffer "for another layer shape" is INVALID_ARGUMENT).
#include <cstdio>

#include "modules/common/state_io.h"
#include "modules/layernorm_mlp/layernorm_mlp.h"

namespace te {

LayerNormMlpPools &layernorm_mlp_pools(Context &ctx) {
  return module_pools<LayerNormMlpPools>(ctx, ModuleSlot::LayerNormMlp);
}

void LayerNormMlpSaved::clear() {
  layer.reset();
  recipe.reset();
  group.reset();
  ticket = PassTicket();
  norm.clear();
  fc1.clear();
  fc2.clear();
  fc1_out.reset();
  act_out.reset();
}

void LayerNormMlpBackwardCtx::clear() {
  if (saved) layernorm_mlp_pools(*saved->ctx).saved.release(saved);
  saved = nullptr;
}

namespace {

struct MlpFormat {
  int64_t shape[3];
  StateFormat f;
  explicit MlpFormat(const LayerNormMlpOptions &o)
      : shape{o.hidden, o.ffn, o.fc1_out()},
        f{{'T', 'E', 'M', 'P'}, "layernorm_mlp", "m", shape, 3, "[hidden, ffn, fc1 rows]"} {}
};

void state_name(int i, char *buf, size_t cap) {
  static const char *const roles[3] = {"input", "weight", "grad_output"};
  std::snprintf(buf, cap, "fc%d %s", i / 3 + 1, roles[i % 3]);
}

}  // namespace

size_t layernorm_mlp_state_size(Context &ctx, const LayerNormMlp &m) {
  const LayerNormMlpCore &L = *m.core();
  const ScalingState *states[6] = {&L.fc1.input, &L.fc1.weight, &L.fc1.grad_output,
                                   &L.fc2.input, &L.fc2.weight, &L.fc2.grad_output};
  return states_size(MlpFormat(L.opts).f, states, 6);
}

void layernorm_mlp_state_save(Context &ctx, const LayerNormMlp &m, void *buf, size_t capacity) {
  const LayerNormMlpCore &L = *m.core();
  const ScalingState *states[6] = {&L.fc1.input, &L.fc1.weight, &L.fc1.grad_output,
                                   &L.fc2.input, &L.fc2.weight, &L.fc2.grad_output};
  states_save(ctx, MlpFormat(L.opts).f, states, 6, buf, capacity);
}

void layernorm_mlp_state_load(Context &ctx, LayerNormMlp &m, const void *buf, size_t size) {
  LayerNormMlpCore &L = *m.core();
  ScalingState *states[6] = {&L.fc1.input, &L.fc1.weight, &L.fc1.grad_output,
                             &L.fc2.input, &L.fc2.weight, &L.fc2.grad_output};
  states_load(ctx, MlpFormat(L.opts).f, states, 6, state_name, buf, size);
  L.fc1.weight_cache.reset();  // quantized with the old scales
  L.fc2.weight_cache.reset();
}

}  // namespace te
