#include "backends/cpu/cpu_convert.h"

#include <cstring>

namespace te {
namespace cpu {

const Fp8DecodeTable &decode_table(DType t) {
  static const Fp8DecodeTable e4m3(DType::E4M3), e5m2(DType::E5M2);
  return t == DType::E4M3 ? e4m3 : e5m2;
}

void load_floats(const void *src, DType t, int64_t offset, int64_t n, float *dst) {
  if (n <= 0) return;
  switch (t) {
    case DType::F32:
      std::memcpy(dst, static_cast<const float *>(src) + offset, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      const uint16_t *s = static_cast<const uint16_t *>(src) + offset;
      for (int64_t j = 0; j < n; ++j) dst[j] = f16_to_float(s[j]);
      return;
    }
    case DType::BF16: {
      const uint16_t *s = static_cast<const uint16_t *>(src) + offset;
      for (int64_t j = 0; j < n; ++j) dst[j] = bf16_to_float(s[j]);
      return;
    }
    case DType::E4M3:
    case DType::E5M2: {
      const Fp8DecodeTable &table = decode_table(t);
      const uint8_t *s = static_cast<const uint8_t *>(src) + offset;
      for (int64_t j = 0; j < n; ++j) dst[j] = table.value[s[j]];
      return;
    }
    case DType::I32: {
      const int32_t *s = static_cast<const int32_t *>(src) + offset;
      for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<float>(s[j]);
      return;
    }
  }
}

void store_floats(const float *src, int64_t n, void *dst, DType t, int64_t offset) {
  if (n <= 0) return;
  switch (t) {
    case DType::F32:
      std::memcpy(static_cast<float *>(dst) + offset, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      uint16_t *d = static_cast<uint16_t *>(dst) + offset;
      for (int64_t j = 0; j < n; ++j) d[j] = float_to_f16(src[j]);
      return;
    }
    case DType::BF16: {
      uint16_t *d = static_cast<uint16_t *>(dst) + offset;
      for (int64_t j = 0; j < n; ++j) d[j] = float_to_bf16(src[j]);
      return;
    }
    case DType::E4M3:
    case DType::E5M2: {
      // Unscaled FP8 stores are not a backend operation, but keep the function total.
      uint8_t *d = static_cast<uint8_t *>(dst) + offset;
      for (int64_t j = 0; j < n; ++j) d[j] = float_to_fp8(src[j], t);
      return;
    }
    case DType::I32: {  // not a backend operation either; total, saturating, NaN as 0
      int32_t *d = static_cast<int32_t *>(dst) + offset;
      for (int64_t j = 0; j < n; ++j) {
        const float v = src[j];
        d[j] = v != v ? 0 : v >= 2147483520.0f ? INT32_MAX : v <= -2147483648.0f ? INT32_MIN : static_cast<int32_t>(v);
      }
      return;
    }
  }
}

}  // namespace cpu
}  // namespace te
