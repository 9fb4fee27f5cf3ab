// GroupedLinear's core and pooled objects, and its FP8 state in the format of
// modules/common/state_io.h: magic "TEGL", shape [num_gemms, in, out], then every expert's input,
// weight and grad_output states, expert by expert.
#include <cstdio>

#include "modules/common/state_io.h"
#include "modules/grouped_linear/grouped_linear.h"

namespace te {

GroupedLinearCallStorage::GroupedLinearCallStorage(int n)
    : weights(static_cast<size_t>(n)),
      biases(static_cast<size_t>(n)),
      dw(static_cast<size_t>(n)),
      db(static_cast<size_t>(n)),
      rows(static_cast<size_t>(n)),
      forward(static_cast<size_t>(n)),
      backward(static_cast<size_t>(n)),
      forward_running(static_cast<size_t>(n)),
      backward_running(static_cast<size_t>(n)),
      zero_ranges(2 * static_cast<size_t>(n)) {}

GroupedLinearCore::GroupedLinearCore(Context &ctx, const GroupedLinearOptions &o)
    : ctx_ref(&ctx), ctx(ctx), opts(o), experts(static_cast<size_t>(o.num_gemms)), call(o.num_gemms) {}

GroupedLinearCore::~GroupedLinearCore() {
  for (ProjectionState &p : experts) p.forget(ctx.autocast());
}

GroupedLinearPools &grouped_linear_pools(Context &ctx) {
  return module_pools<GroupedLinearPools>(ctx, ModuleSlot::GroupedLinear);
}

void GroupedLinearSaved::clear() {
  layer.reset();
  recipe.reset();
  group.reset();
  ticket = PassTicket();
  fp8 = false;
  tokens = 0;
  splits.clear();   // keeps its capacity for the next forward
  experts.clear();  // frees every expert's residuals; keeps the capacity
}

void GroupedLinearBackwardCtx::clear() {
  // ctx was moved out by the pool; the residuals' own context reference keeps their pool alive.
  if (saved) grouped_linear_pools(*saved->ctx).saved.release(saved);
  saved = nullptr;
}

namespace {

struct GroupedFormat {
  int64_t shape[3];
  StateFormat f;
  explicit GroupedFormat(const GroupedLinearOptions &o)
      : shape{o.num_gemms, o.in_features, o.out_features},
        f{{'T', 'E', 'G', 'L'}, "grouped_linear", "g", shape, 3, "[num_gemms, in, out]"} {}
};

void state_name(int i, char *buf, size_t cap) {
  static const char *const roles[3] = {"input", "weight", "grad_output"};
  std::snprintf(buf, cap, "expert %d %s", i / 3, roles[i % 3]);
}

template <class State, class Core>
std::vector<State *> all_states(Core &core) {
  std::vector<State *> states;
  states.reserve(core.experts.size() * 3);
  for (auto &p : core.experts) {
    states.push_back(&p.input);
    states.push_back(&p.weight);
    states.push_back(&p.grad_output);
  }
  return states;
}

}  // namespace

size_t grouped_linear_state_size(const GroupedLinear &g) {
  const std::vector<const ScalingState *> states = all_states<const ScalingState>(*g.core());
  return states_size(GroupedFormat(g.options()).f, states.data(), static_cast<int>(states.size()));
}

void grouped_linear_state_save(Context &ctx, const GroupedLinear &g, void *buf, size_t capacity) {
  const std::vector<const ScalingState *> states = all_states<const ScalingState>(*g.core());
  states_save(ctx, GroupedFormat(g.options()).f, states.data(), static_cast<int>(states.size()), buf, capacity);
}

void grouped_linear_state_load(Context &ctx, GroupedLinear &g, const void *buf, size_t size) {
  GroupedLinearCore &core = *g.core();
  const std::vector<ScalingState *> states = all_states<ScalingState>(core);
  states_load(ctx, GroupedFormat(core.opts).f, states.data(), static_cast<int>(states.size()), state_name, buf, size);
  for (ProjectionState &p : core.experts) p.weight_cache.reset();  // quantized with the old scales
}

}  // namespace te
