// Bulk conversions between tensor storage and float working buffers. The dtype switch happens
// once per call, outside the element loops, so the loops stay tight.
#pragma once

#include <cmath>
#include <cstdint>

#include "numerics/numerics.h"
#include "base/types.h"

namespace te {
namespace cpu {

// dst[j] = element (offset + j) of `src` (F32/F16/BF16/E4M3/E5M2; FP8 as raw codes decoded,
// without any scale), for j < n.
void load_floats(const void *src, DType t, int64_t offset, int64_t n, float *dst);
// Element (offset + j) of `dst` (F32/F16/BF16) = src[j], rounded to nearest even.
void store_floats(const float *src, int64_t n, void *dst, DType t, int64_t offset);

// All 256 codes of an FP8 dtype decoded: decoding becomes a table lookup.
struct Fp8DecodeTable {
  float value[256];
  explicit Fp8DecodeTable(DType t) {
    for (int c = 0; c < 256; ++c) value[c] = fp8_to_float(static_cast<uint8_t>(c), t);
  }
};

// The table of t (E4M3 or E5M2), built once: immutable constant data, not state.
const Fp8DecodeTable &decode_table(DType t);

// max(a, b) that propagates NaN from either side: an amax must report a NaN it has seen.
inline float nan_max(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return NAN;
  return a > b ? a : b;
}

// Max |x_i| over n floats, NaN if any is NaN.
// Eight independent lanes, so the compiler vectorises without reordering anything.
inline float abs_max(const float *x, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int nan_lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const float a = std::fabs(x[i + j]);
      nan_lane[j] |= (a != a);
      lane[j] = a > lane[j] ? a : lane[j];
    }
  }
  for (; i < n; ++i) {
    const float a = std::fabs(x[i]);
    nan_lane[0] |= (a != a);
    lane[0] = a > lane[0] ? a : lane[0];
  }
  float m = 0.0f;
  int saw_nan = 0;
  for (int j = 0; j < 8; ++j) {
    m = lane[j] > m ? lane[j] : m;
    saw_nan |= nan_lane[j];
  }
  return saw_nan ? NAN : m;
}

}  // namespace cpu
}  // namespace te
