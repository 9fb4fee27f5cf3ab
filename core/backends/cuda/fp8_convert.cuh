// Device-side conversions, bit-identical to te/core/numerics.h (the CPU's definition):
//  - float -> FP8 through the hardware cvt.rn.satfinite (round to nearest even, finite values and
//    infinities saturate to +-max), with NaN mapped to the CPU's canonical codes (E4M3 0x7F,
//    E5M2 0x7E) whatever NaN code the hardware emits;
//  - FP8 / F16 / BF16 -> float exactly, F16 / BF16 stores with the CPU's NaN encoding (the
//    hardware would write its own canonical NaN 0x7FFF);
//  - the scale formulas with correctly rounded division (no fast-math intrinsics anywhere);
//  - amax as the unsigned bits of |x|: non-negative floats order like their bits, and every NaN's
//    |bits| exceed infinity's, so an integer max propagates NaN; canonicalise once at the end.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "base/types.h"

namespace te::cuda {

// Output format of an FP8 encode; None: that output is not written. Used as a template argument;
// Runtime: a kernel that reads the format(s) from its parameters (fewer instantiations where the
// encode is not the cost).
enum Fp8Fmt : int { kFmtNone = 0, kFmtE4M3 = 1, kFmtE5M2 = 2, kFmtRuntime = 3 };

inline Fp8Fmt fmt_of(const TensorView *t) {
  if (t == nullptr) return kFmtNone;
  return t->dtype == DType::E4M3 ? kFmtE4M3 : kFmtE5M2;
}

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInfBits = 0x7F800000u;
constexpr uint32_t kCanonicalNaN = 0x7FC00000u;  // what the CPU's NAN and nan_max produce

// ---- amax as bits --------------------------------------------------------------------------
__device__ __forceinline__ uint32_t abs_bits(float x) { return __float_as_uint(x) & kAbsMask; }
// The float an amax bit pattern stands for, with any NaN made the CPU's canonical NaN.
__device__ __forceinline__ uint32_t canonical_amax_bits(uint32_t m) { return m > kFloatInfBits ? kCanonicalNaN : m; }

// Warp max of unsigned values (redux.sync on sm_80+).
__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) { return __reduce_max_sync(0xFFFFFFFFu, v); }

// Block-wide max of `v` (any block size that is a multiple of 32, up to 1024); the result is
// valid in every thread. `scratch` holds 32 words of shared memory.
__device__ __forceinline__ uint32_t block_max_u32(uint32_t v, uint32_t *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x * blockDim.y * blockDim.z) >> 5;
  v = warp_max_u32(v);
  __syncthreads();  // scratch may still be read from an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0u;
  return warp_max_u32(v);
}

// Max-accumulates a canonical amax (bits) into *dst. Signed compare: a libte amax is +0..inf or
// the canonical NaN, all positive as ints, and any negative leftover loses as on the CPU.
__device__ __forceinline__ void atomic_amax(float *dst, uint32_t canonical_bits) {
  atomicMax(reinterpret_cast<int *>(dst), static_cast<int>(canonical_bits));
}

// ---- float -> FP8 ----------------------------------------------------------------------------
// Two floats -> two codes (lo in the low byte), hardware rounding and saturation.
template <int Fmt>
__device__ __forceinline__ uint32_t cvt_fp8x2_raw(float lo, float hi) {
  uint16_t r;
  if constexpr (Fmt == kFmtE4M3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(r) : "f"(lo), "f"(hi));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;" : "=h"(r) : "f"(lo), "f"(hi));
  }
  return r;
}

// Replaces, in four packed codes, every NaN code the hardware may have produced by the CPU's.
// Satfinite never produces an infinity code, so every magnitude above the largest finite one
// is a NaN.
template <int Fmt>
__device__ __forceinline__ uint32_t fix_nan_codes4(uint32_t w) {
  constexpr uint32_t kMaxFinite = Fmt == kFmtE4M3 ? 0x7E7E7E7Eu : 0x7B7B7B7Bu;
  constexpr uint32_t kNaN = Fmt == kFmtE4M3 ? 0x7F7F7F7Fu : 0x7E7E7E7Eu;
  const uint32_t nan_mask = __vcmpgtu4(w & 0x7F7F7F7Fu, kMaxFinite);  // 0xFF per NaN byte
  return (w & ~nan_mask) | (kNaN & nan_mask);
}

// Four floats (already scaled) -> four codes packed little-endian.
template <int Fmt>
__device__ __forceinline__ uint32_t encode4(float a, float b, float c, float d) {
  const uint32_t w = cvt_fp8x2_raw<Fmt>(a, b) | (cvt_fp8x2_raw<Fmt>(c, d) << 16);
  return fix_nan_codes4<Fmt>(w);
}

template <int Fmt>
__device__ __forceinline__ uint8_t encode1(float x) {
  const uint32_t w = cvt_fp8x2_raw<Fmt>(x, 0.0f);
  return static_cast<uint8_t>(fix_nan_codes4<Fmt>(w) & 0xFFu);
}

// Runtime-format variants for the less hot kernels.
__device__ __forceinline__ uint32_t encode4_rt(int fmt, float a, float b, float c, float d) {
  return fmt == kFmtE4M3 ? encode4<kFmtE4M3>(a, b, c, d) : encode4<kFmtE5M2>(a, b, c, d);
}
__device__ __forceinline__ uint8_t encode1_rt(int fmt, float x) {
  return fmt == kFmtE4M3 ? encode1<kFmtE4M3>(x) : encode1<kFmtE5M2>(x);
}

// ---- FP8 / F16 / BF16 -> float (exact, the CPU's NaN bits) -----------------------------------
__device__ __forceinline__ float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return __uint_as_float(sign | kFloatInfBits | (mant << 13));  // payload kept
  return __half2float(__ushort_as_half(h));  // exact for every finite value
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

__device__ __forceinline__ float dev_e4m3_to_float(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t exp = (code >> 3) & 0xF;
  const uint32_t mant = code & 0x7;
  if (exp == 0xF && mant == 0x7) return __uint_as_float(sign | 0x7FC00000u);
  if (exp == 0) {
    const float magnitude = static_cast<float>(mant) * 0x1p-9f;
    return sign ? -magnitude : magnitude;
  }
  return __uint_as_float(sign | ((exp - 7 + 127) << 23) | (mant << 20));
}

__device__ __forceinline__ float dev_e5m2_to_float(uint8_t code) { return f16_bits_to_float(static_cast<uint16_t>(code << 8)); }

__device__ __forceinline__ float dev_fp8_to_float(uint8_t code, DType t) {
  return t == DType::E4M3 ? dev_e4m3_to_float(code) : dev_e5m2_to_float(code);
}

// ---- float -> F16 / BF16 (round to nearest even; the CPU's NaN bits) --------------------------
__device__ __forceinline__ uint16_t float_to_f16_bits(float x) {
  const uint32_t bits = __float_as_uint(x);
  const uint32_t a = bits & kAbsMask;
  if (a > kFloatInfBits) {
    return static_cast<uint16_t>(((bits & 0x80000000u) >> 16) | 0x7C00u | 0x0200u | ((a & 0x7FFFFFu) >> 13));
  }
  return __half_as_ushort(__float2half_rn(x));
}

__device__ __forceinline__ uint16_t float_to_bf16_bits(float x) {
  const uint32_t bits = __float_as_uint(x);
  if ((bits & kAbsMask) > kFloatInfBits) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// x * y with x86's NaN rules, as the CPU reference computes it: the first NaN operand,
// quietened; an invalid product (0 * inf) gives x86's default NaN 0xFFC00000.
__device__ __forceinline__ float mul_x86(float x, float y) {
  const uint32_t bx = __float_as_uint(x), by = __float_as_uint(y);
  if ((bx & kAbsMask) > kFloatInfBits) return __uint_as_float(bx | 0x00400000u);
  if ((by & kAbsMask) > kFloatInfBits) return __uint_as_float(by | 0x00400000u);
  const float r = __fmul_rn(x, y);
  return isnan(r) ? __uint_as_float(0xFFC00000u) : r;  // 0 * inf: x86's default NaN
}

// Element i of a tensor of dtype t as float (any dtype; FP8 codes unscaled).
__device__ __forceinline__ float dev_load_as_float(const void *p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float *>(p)[i];
    case DType::F16: return f16_bits_to_float(static_cast<const uint16_t *>(p)[i]);
    case DType::BF16: return bf16_bits_to_float(static_cast<const uint16_t *>(p)[i]);
    case DType::E4M3: return dev_e4m3_to_float(static_cast<const uint8_t *>(p)[i]);
    case DType::E5M2: return dev_e5m2_to_float(static_cast<const uint8_t *>(p)[i]);
  }
  return 0.0f;
}

// Stores v as element i of an F32 / F16 / BF16 tensor.
__device__ __forceinline__ void dev_store_from_float(void *p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float *>(p)[i] = v; return;
    case DType::F16: static_cast<uint16_t *>(p)[i] = float_to_f16_bits(v); return;
    case DType::BF16: static_cast<uint16_t *>(p)[i] = float_to_bf16_bits(v); return;
    default: return;  // FP8 is never an unscaled store target of a kernel
  }
}

// ---- scales (numerics.cpp, line for line) ------------------------------------------------------
__device__ __forceinline__ float dev_compute_scale_from_amax(float amax, float fp8_max, bool power_of_2, float epsilon) {
  if (amax < epsilon) amax = epsilon;
  if (isnan(amax) || isinf(amax) || amax == 0.0f) return 1.0f;
  float scale = __fdiv_rn(fp8_max, amax);
  if (isinf(scale)) scale = FLT_MAX;
  if (scale < kMinScale) scale = kMinScale;
  if (power_of_2) scale = __uint_as_float(__float_as_uint(scale) & 0xFF800000u);
  return scale;
}

__device__ __forceinline__ float reciprocal_rn(float s) { return __fdiv_rn(1.0f, s); }

// ---- typed loads of 16-byte vectors as floats --------------------------------------------------
template <DType T>
struct InType;
template <>
struct InType<DType::F32> {
  using Storage = float;
  static constexpr int kPerVec = 4;  // elements per 16 bytes
};
template <>
struct InType<DType::F16> {
  using Storage = uint16_t;
  static constexpr int kPerVec = 8;
};
template <>
struct InType<DType::BF16> {
  using Storage = uint16_t;
  static constexpr int kPerVec = 8;
};

// Unpacks one 16-byte vector into kPerVec floats.
template <DType T>
__device__ __forceinline__ void unpack16(const uint4 v, float *f) {
  if constexpr (T == DType::F32) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  } else {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (T == DType::BF16) {
        f[2 * j] = __uint_as_float(w[j] << 16);
        f[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
      } else {
        // F16: the hardware conversion is exact for finite values; where these loads are used
        // (casts, block quantization, amax) codes and amaxes only test for NaN, and a bias
        // gradient summed from them is NaN there, though not with the CPU's payload.
        const float2 p = __half22float2(*reinterpret_cast<const __half2 *>(&w[j]));
        f[2 * j] = p.x;
        f[2 * j + 1] = p.y;
      }
    }
  }
}

template <DType T>
__device__ __forceinline__ float load_scalar(const void *p, int64_t i) {
  if constexpr (T == DType::F32) return static_cast<const float *>(p)[i];
  else if constexpr (T == DType::F16) return f16_bits_to_float(static_cast<const uint16_t *>(p)[i]);
  else return bf16_bits_to_float(static_cast<const uint16_t *>(p)[i]);
}

inline bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace te::cuda
