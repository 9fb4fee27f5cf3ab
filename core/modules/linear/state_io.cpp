// The layer's FP8 state in the format of modules/common/state_io.h: magic "TELS", shape
// [in, out], then the input, weight and grad_output states.
#include "modules/common/state_io.h"
#include "modules/linear/linear.h"

#include <cstdio>

namespace te {

namespace {

struct LinearFormat {
  int64_t shape[2];
  StateFormat f;
  explicit LinearFormat(const LinearOptions &o)
      : shape{o.in_features, o.out_features}, f{{'T', 'E', 'L', 'S'}, "linear", "lin", shape, 2, "[in, out]"} {}
};

void role_name(int i, char *buf, size_t cap) {
  static const char *const names[3] = {"input", "weight", "grad_output"};
  std::snprintf(buf, cap, "%s", names[i]);
}

}  // namespace

size_t linear_state_size(Context &ctx, const Linear &lin) {
  const ProjectionState &p = lin.core()->proj;
  const ScalingState *states[3] = {&p.input, &p.weight, &p.grad_output};
  return states_size(LinearFormat(lin.options()).f, states, 3);
}

void linear_state_save(Context &ctx, const Linear &lin, void *buf, size_t capacity) {
  const ProjectionState &p = lin.core()->proj;
  const ScalingState *states[3] = {&p.input, &p.weight, &p.grad_output};
  states_save(ctx, LinearFormat(lin.options()).f, states, 3, buf, capacity);
}

void linear_state_load(Context &ctx, Linear &lin, const void *buf, size_t size) {
  ProjectionState &p = lin.core()->proj;
  ScalingState *states[3] = {&p.input, &p.weight, &p.grad_output};
  states_load(ctx, LinearFormat(lin.options()).f, states, 3, role_name, buf, size);
  p.weight_cache.reset();  // quantized with the old scale
}

}  // namespace te
