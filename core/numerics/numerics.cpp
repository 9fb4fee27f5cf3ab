// The definition of libte's scalar numerics (see numerics.h). Conversions work on the float's
// bits with integer arithmetic: rounding the exact binary value once, never through an
// intermediate type that could round twice. The CUDA kernels must reproduce these bit for bit.
#include "numerics/numerics.h"

#include <cfloat>
#include <cmath>
#include <cstring>

namespace te {

namespace {

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

constexpr uint32_t kSignMask = 0x80000000u;
constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInf = 0x7F800000u;
constexpr int kFloatMantBits = 23;
constexpr int kFloatBias = 127;

// Right shift of `v` by `shift` (1..31) rounding to nearest, ties to even.
uint32_t shift_right_rne(uint32_t v, int shift) {
  const uint32_t half_minus_one = (1u << (shift - 1)) - 1u;
  const uint32_t lsb = (v >> shift) & 1u;
  return (v + half_minus_one + lsb) >> shift;
}

// Rounds a finite, non-negative float (given as its bits) to a binary format with `M` stored
// mantissa bits and exponent bias `B`, ignoring the format's upper range limit. Returns the
// magnitude code (exponent field << M | mantissa); it may exceed the format's largest finite
// code, and the caller decides between saturation and infinity. Subnormal results, and the
// carry from the largest subnormal into the smallest normal, fall out of the same arithmetic.
template <int M, int B>
uint32_t round_magnitude(uint32_t abs_bits) {
  const int float_exp = static_cast<int>(abs_bits >> kFloatMantBits);
  constexpr int kMinNormalFloatExp = kFloatBias + 1 - B;  // biased float exponent of 2^(1-B)
  if (float_exp >= kMinNormalFloatExp) {
    // Dropping 23-M mantissa bits rounds; a carry out of the mantissa bumps the exponent, as it
    // must. Re-biasing the exponent is a subtraction on the packed code.
    const uint32_t rounded = shift_right_rne(abs_bits, kFloatMantBits - M);
    return rounded - (static_cast<uint32_t>(kFloatBias - B) << M);
  }
  // Float subnormals are below 2^-126, far under half the smallest subnormal of any target.
  if (float_exp == 0) return 0;
  // Subnormal target: code = value / 2^(1-B-M) = significand >> shift.
  const uint32_t significand = (abs_bits & 0x7FFFFFu) | 0x800000u;
  const int shift = (kFloatMantBits - M) + (kMinNormalFloatExp - float_exp);
  if (shift > 24) return 0;  // below half the smallest subnormal (significand < 2^24)
  return shift_right_rne(significand, shift);
}

template <int M, int B>
uint8_t float_to_fp8_saturating(float x, uint8_t max_code, uint8_t nan_code) {
  const uint32_t bits = bits_of(x);
  const uint32_t abs_bits = bits & kAbsMask;
  if (abs_bits > kFloatInf) return nan_code;
  const uint8_t sign = static_cast<uint8_t>((bits & kSignMask) >> 24);
  // Infinity saturates too (__NV_SATFINITE): a scaled tensor must never carry inf into a GEMM.
  if (abs_bits == kFloatInf) return sign | max_code;
  const uint32_t magnitude = round_magnitude<M, B>(abs_bits);
  return sign | static_cast<uint8_t>(magnitude > max_code ? max_code : magnitude);
}

constexpr uint8_t kE4M3MaxCode = 0x7E;  // 448
constexpr uint8_t kE4M3NaN = 0x7F;
constexpr uint8_t kE5M2MaxCode = 0x7B;  // 57344
constexpr uint8_t kE5M2NaN = 0x7E;

constexpr uint16_t kF16MaxCode = 0x7BFF;
constexpr uint16_t kF16Inf = 0x7C00;
constexpr uint16_t kF16QuietBit = 0x0200;

}  // namespace

uint8_t float_to_e4m3(float x) { return float_to_fp8_saturating<3, 7>(x, kE4M3MaxCode, kE4M3NaN); }

uint8_t float_to_e5m2(float x) { return float_to_fp8_saturating<2, 15>(x, kE5M2MaxCode, kE5M2NaN); }

float e4m3_to_float(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t exp = (code >> 3) & 0xF;
  const uint32_t mant = code & 0x7;
  if (exp == 0xF && mant == 0x7) return float_of(sign | 0x7FC00000u);  // e4m3fn's only NaN
  if (exp == 0) {
    // Subnormal: mant * 2^-9, exact in float.
    const float magnitude = static_cast<float>(mant) * 0x1p-9f;
    return sign ? -magnitude : magnitude;
  }
  return float_of(sign | ((exp - 7 + kFloatBias) << kFloatMantBits) | (mant << 20));
}

// E5M2 is the upper byte of an IEEE binary16, so binary16 decoding covers every code exactly.
float e5m2_to_float(uint8_t code) { return f16_to_float(static_cast<uint16_t>(code << 8)); }

uint16_t float_to_f16(float x) {
  const uint32_t bits = bits_of(x);
  const uint32_t abs_bits = bits & kAbsMask;
  const uint16_t sign = static_cast<uint16_t>((bits & kSignMask) >> 16);
  if (abs_bits > kFloatInf) {
    // Keep the payload's top bits and force the quiet bit so a NaN never becomes infinity.
    return sign | kF16Inf | kF16QuietBit | static_cast<uint16_t>((abs_bits & 0x7FFFFFu) >> 13);
  }
  if (abs_bits == kFloatInf) return sign | kF16Inf;
  const uint32_t magnitude = round_magnitude<10, 15>(abs_bits);
  return sign | static_cast<uint16_t>(magnitude > kF16MaxCode ? kF16Inf : magnitude);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return float_of(sign | kFloatInf | (mant << 13));  // inf, NaN keeps payload
  if (exp == 0) {
    const float magnitude = static_cast<float>(mant) * 0x1p-24f;  // exact: mant < 2^11
    return sign ? -magnitude : magnitude;
  }
  return float_of(sign | ((exp - 15 + kFloatBias) << kFloatMantBits) | (mant << 13));
}

uint16_t float_to_bf16(float x) {
  const uint32_t bits = bits_of(x);
  if ((bits & kAbsMask) > kFloatInf) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  // bfloat16 shares float's exponent range: rounding the low 16 bits is the whole conversion,
  // and a carry into the exponent (up to infinity) is IEEE overflow.
  return static_cast<uint16_t>(shift_right_rne(bits, 16));
}

float bf16_to_float(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

float load_as_float(const void *data, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float *>(data)[i];
    case DType::F16: return f16_to_float(static_cast<const uint16_t *>(data)[i]);
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t *>(data)[i]);
    case DType::E4M3: return e4m3_to_float(static_cast<const uint8_t *>(data)[i]);
    case DType::E5M2: return e5m2_to_float(static_cast<const uint8_t *>(data)[i]);
    case DType::I32: return static_cast<float>(static_cast<const int32_t *>(data)[i]);
  }
  return 0.0f;
}

void store_from_float(void *data, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float *>(data)[i] = v; return;
    case DType::F16: static_cast<uint16_t *>(data)[i] = float_to_f16(v); return;
    case DType::BF16: static_cast<uint16_t *>(data)[i] = float_to_bf16(v); return;
    case DType::E4M3: static_cast<uint8_t *>(data)[i] = float_to_e4m3(v); return;
    case DType::E5M2: static_cast<uint8_t *>(data)[i] = float_to_e5m2(v); return;
    case DType::I32: break;  // offsets are never written as floats
  }
}

float compute_scale_from_amax(float amax, float fp8_max, bool power_of_2, float epsilon) {
  if (amax < epsilon) amax = epsilon;
  // TE returns 1 for 0 and inf; NaN would otherwise poison every later cast, so it joins them.
  if (std::isnan(amax) || std::isinf(amax) || amax == 0.0f) return 1.0f;
  float scale = fp8_max / amax;
  // amax so small that the scale is not representable: the largest float is the best we can do.
  if (std::isinf(scale)) scale = FLT_MAX;
  if (scale < kMinScale) scale = kMinScale;
  if (power_of_2) scale = float_of(bits_of(scale) & 0xFF800000u);
  return scale;
}

void delayed_scale_update(float *history, int len, float *scale, float *scale_inv, float fp8_max,
                          int margin, AmaxAlgo algo, const float *reduced_amax) {
  if (reduced_amax != nullptr) history[0] = *reduced_amax;
  const float last_amax = history[0];

  // TE reduces with fmaxf starting from 0, so NaN entries are ignored by MAX (an all-NaN window
  // gives 0, which keeps the previous scale); infinities win and also keep the previous scale.
  // `h > m ? h : m` is fmaxf here (m is never NaN); eight independent lanes let the compiler
  // vectorise the reduction without reordering anything.
  float amax = last_amax;
  if (algo == AmaxAlgo::Max) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= len; i += 8)
      for (int j = 0; j < 8; ++j) lane[j] = history[i + j] > lane[j] ? history[i + j] : lane[j];
    for (; i < len; ++i) lane[0] = history[i] > lane[0] ? history[i] : lane[0];
    amax = 0.0f;
    for (float m : lane) amax = m > amax ? m : amax;
  }

  float new_scale = *scale;
  if (std::isfinite(amax) && amax > 0.0f) {
    new_scale = (fp8_max / amax) / std::ldexp(1.0f, margin);
  }
  if (std::isinf(new_scale)) new_scale = FLT_MAX;
  if (new_scale < kMinScale) new_scale = kMinScale;
  *scale = new_scale;
  *scale_inv = 1.0f / new_scale;

  // Roll left by one: the oldest-but-one slides down, the old current amax goes to the end of
  // the window, and slot 0 is cleared to receive the next step's amax.
  if (len > 1) {
    std::memmove(history, history + 1, sizeof(float) * static_cast<size_t>(len - 1));
    history[len - 1] = last_amax;
  }
  history[0] = 0.0f;
}

}  // namespace te
