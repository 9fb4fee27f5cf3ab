// Device-side checks over every float (tests/gpu/exhaustive_math.cu): the fast paths of the
// activation math against the definitions they replace, bit for bit.
#pragma once

#include <cstdint>
#include <string>

#include "base/types.h"

namespace te::gpu_test {

struct ExhaustiveResult {
  unsigned long long mismatches = 0;
  uint32_t first_bits = 0;  // the smallest input (as float bits) that differs, when any does
};

// act_math::map_sigmoid (in units of 16 consecutive inputs, as the casts call it) against
// 1 / (1 + expf(-x)) with __fdiv_rn, for all 2^32 float bit patterns x.
bool exhaustive_sigmoid(ExhaustiveResult *r, std::string *error);

// round_unit<t> (two elements per hardware conversion, a unit with a NaN element by round_to)
// against round_to<t> (float_to_bf16_bits / float_to_f16_bits and back), for all 2^32 floats;
// t is BF16 or F16.
bool exhaustive_round_unit(DType t, ExhaustiveResult *r, std::string *error);

}  // namespace te::gpu_test
