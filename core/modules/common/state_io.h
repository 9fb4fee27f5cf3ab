// A module's FP8 state as bytes: a 4-byte magic naming the module, a format version, the module's
// shape (a few int64), then per scaling state: history length, FP8 dtype, scale, scale_inv,
// history. Host byte order (little-endian on every platform libte targets). Floats are copied
// bit for bit, so a save/load round trip resumes training identically.
//
// Loading trusts nothing: it accepts exactly what saving can produce, and refuses the rest
// before anything changes. A used state has scale in [kMinScale, FLT_MAX] (every scale formula
// keeps it there), scale_inv == 1 / scale as the update computes it, and history entries that are
// amaxes: +0, positive finite or +inf. A NaN amax (a tensor that held NaN) is saved as +0, which
// every scale update treats alike (the window's MAX ignores NaN, and MOST_RECENT keeps the scale
// for both). A never-used state is length 0, E4M3, scale = scale_inv = 1.
#pragma once

#include <cstddef>
#include <cstdint>

#include "context/context.h"

namespace te {

struct StateFormat {
  char magic[4];
  const char *module;       // "linear", for messages
  const char *handle_name;  // the C argument naming the module, for messages
  const int64_t *shape;     // the module's shape, saved and checked on load
  int shape_len;
  const char *shape_names;  // e.g. "[in, out]", for messages
};

// `name(i)` names scaling state i in messages ("input", "fc2 weight", "expert 3 grad_output").
using StateName = void (*)(int i, char *buf, size_t cap);

size_t states_size(const StateFormat &f, const ScalingState *const *states, int n);
void states_save(Context &ctx, const StateFormat &f, const ScalingState *const *states, int n, void *buf,
                 size_t capacity);
// Refuses (INVALID_STATE) while an autocast pass holds any of the states.
void states_load(Context &ctx, const StateFormat &f, ScalingState *const *states, int n, StateName name,
                 const void *buf, size_t size);

}  // namespace te
