// Scalar numerics shared by every backend: FP8/BF16/F16 conversions and the scale formulas.
// These functions are the definition of libte's numerics: the CPU backend calls them per
// element, and the CUDA kernels must be bit-identical to them (checked by the gpu tests).
#pragma once

#include <cstdint>

#include "base/types.h"

namespace te {

// ---- conversions --------------------------------------------------------------------------
// float -> FP8 code: round to nearest even, saturate finite and infinite values to +-fp8_max,
// NaN -> the canonical positive NaN code (E4M3 0x7F, E5M2 0x7E).
uint8_t float_to_e4m3(float x);
uint8_t float_to_e5m2(float x);
float e4m3_to_float(uint8_t code);  // exact
float e5m2_to_float(uint8_t code);  // exact
inline uint8_t float_to_fp8(float x, DType t) { return t == DType::E4M3 ? float_to_e4m3(x) : float_to_e5m2(x); }
inline float fp8_to_float(uint8_t c, DType t) { return t == DType::E4M3 ? e4m3_to_float(c) : e5m2_to_float(c); }

// IEEE binary16 and bfloat16, round to nearest even, NaN preserved (quietened).
uint16_t float_to_f16(float x);
float f16_to_float(uint16_t h);
uint16_t float_to_bf16(float x);
float bf16_to_float(uint16_t b);

// Read/write element i of a high-precision (F32/F16/BF16) buffer as float.
float load_as_float(const void *data, DType t, int64_t i);
void store_from_float(void *data, DType t, int64_t i, float v);

// ---- scales ---------------------------------------------------------------------------------
// Current / block scaling (TE's compute_scale_from_amax): amax is clamped up to epsilon;
// amax 0, inf or NaN -> 1; scale = fp8_max / amax correctly rounded; an infinite result ->
// FLT_MAX, one below kMinScale -> kMinScale; power-of-2 mode keeps only the sign and exponent bits.
float compute_scale_from_amax(float amax, float fp8_max, bool power_of_2, float epsilon);

enum class AmaxAlgo : int { Max = 0, MostRecent = 1 };

// Delayed scaling update of one state, exactly TE's: amax = max over the whole history (MAX) or
// history[0] (MOST_RECENT); scale = (fp8_max / amax) / 2^margin if amax is finite and > 0, else
// the previous scale; an infinite scale -> FLT_MAX, one below kMinScale (a huge margin) ->
// kMinScale; scale_inv = 1 / scale; then the history rolls
// (history[i] <- history[i+1], the last slot gets the old history[0]) and slot 0 is zeroed.
// `reduced_amax`, when given, replaces history[0] first (the group's all-reduced value).
void delayed_scale_update(float *history, int len, float *scale, float *scale_inv, float fp8_max,
                          int margin, AmaxAlgo algo, const float *reduced_amax);

}  // namespace te
