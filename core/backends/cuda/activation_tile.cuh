// Tiles of a tensor that is an activation's output or gradient (ActivationSource, backend.h),
// computed where a cast reads its tile instead of read from memory: for_tile_activation_rows
// stands in for fp8_tile.cuh's for_tile_rows, and for_tile_gated_grad_pairs gives a gated
// backward's d a and d b tiles together (one read of their common inputs). The values are those
// activation_forward / activation_backward store (the formulas of activation_math.cuh, rounded to
// the dtype).
#pragma once

#include <type_traits>

#include "backends/cuda/activation_math.cuh"
#include "backends/cuda/fp8_tile.cuh"
#include "backends/cuda/kernels.h"

namespace te::cuda {

// The kernel's view of an ActivationSource.
struct ActivationTile {
  bool active;
  bool backward, gated;
  bool vec;  // a full tile may load pre / grad as 16-byte vectors (alignment and halves checked)
  Activation kind;
  const void *pre, *grad;
};

// For x of `cols` columns (its shape; pre and grad follow ActivationSource's layout).
inline ActivationTile activation_tile(const ActivationSource &src, int64_t cols) {
  ActivationTile t{};
  t.active = src.active();
  if (!t.active) return t;
  t.backward = src.backward;
  t.gated = is_gated(src.act);
  t.kind = src.act;
  t.pre = src.pre.data;
  t.grad = src.backward ? src.grad.data : nullptr;
  const int64_t half = t.gated && src.backward ? cols / 2 : cols;
  t.vec = aligned16(t.pre) && (t.grad == nullptr || aligned16(t.grad)) && half % kUnit == 0;
  return t;
}

// fn(std::integral_constant<int, Cls>{}) for the source class cls (1 .. kActivationClasses - 1,
// kernels.h's activation_class): the launchers' one step from a run-time class to the kernel
// compiled for it.
template <class Fn>
void dispatch_activation_class(int cls, Fn &&fn) {
  switch (cls) {
    case 1: fn(std::integral_constant<int, 1>{}); return;
    case 2: fn(std::integral_constant<int, 2>{}); return;
    case 3: fn(std::integral_constant<int, 3>{}); return;
    default: fn(std::integral_constant<int, 4>{}); return;
  }
}

// at with class Cls's flags (kernels.h's activation_class) as compile-time constants (Cls >= 1).
template <int Cls>
__device__ __forceinline__ ActivationTile with_class(ActivationTile at) {
  static_assert(Cls >= 1 && Cls < kActivationClasses, "a class of activation source");
  at.active = true;
  at.backward = ((Cls - 1) & 1) != 0;
  at.gated = ((Cls - 1) & 2) != 0;
  return at;
}

// Class Cls is a gated activation's backward (x = [d a | d b]).
template <int Cls>
constexpr bool kGatedGrad = Cls >= 1 && ((Cls - 1) & 1) != 0 && ((Cls - 1) & 2) != 0;

// v rounded to T, as activation_forward / activation_backward store their results.
template <DType T>
__device__ __forceinline__ float round_to(float v) {
  if constexpr (T == DType::BF16) return bf16_bits_to_float(float_to_bf16_bits(v));
  else if constexpr (T == DType::F16) return f16_bits_to_float(float_to_f16_bits(v));
  else return v;
}

// One element of an activation-sourced x from the sources' values there: forward a (and b,
// gated); backward also g, and `second` (gated: the element lies in x's b half). The ragged-tile
// path, whose units may straddle the halves; full tiles take activation_unit (the same formulas,
// chosen once per unit), and the GPU test checks both against the unfused kernels bit for bit.
template <DType T>
__device__ __forceinline__ float activation_element(const ActivationTile &at, float a, float b, float g, bool second) {
  using namespace act_math;
  const Activation act = at.kind;
  if (!at.backward) return round_to<T>(at.gated ? mul(gate(act, a), b) : apply(act, a));
  if (!at.gated) return round_to<T>(mul(g, apply_grad(act, a)));
  return round_to<T>(second ? mul(g, gate(act, a)) : mul(mul(g, dgate(act, a)), b));
}

// f[k] = round_to<T>(f[k]) for a unit: the hardware rounds two elements per instruction, which
// is round_to for every value but NaN (the CPU's NaN keeps the sign and payload, the hardware's is
// canonical), so a unit that holds a NaN takes round_to itself.
template <DType T>
__device__ __forceinline__ void round_unit(float (&f)[kUnit]) {
  if constexpr (T == DType::BF16 || T == DType::F16) {
    bool nan = false;
#pragma unroll
    for (int k = 0; k < kUnit; ++k) nan |= isnan(f[k]);
    if (nan) {
#pragma unroll
      for (int k = 0; k < kUnit; ++k) f[k] = round_to<T>(f[k]);
      return;
    }
#pragma unroll
    for (int k = 0; k < kUnit; k += 2) {
      if constexpr (T == DType::BF16) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(f[k], f[k + 1]);
        const uint32_t w = *reinterpret_cast<const uint32_t *>(&h);
        f[k] = __uint_as_float(w << 16);
        f[k + 1] = __uint_as_float(w & 0xFFFF0000u);
      } else {
        const float2 p = __half22float2(__floats2half2_rn(f[k], f[k + 1]));
        f[k] = p.x;
        f[k + 1] = p.y;
      }
    }
  }
}

// f[k] = round_to<T>(fn(k)) for the 16 elements of a unit.
template <DType T, class Fn>
__device__ __forceinline__ void map_unit(float (&f)[kUnit], Fn &&fn) {
#pragma unroll
  for (int k = 0; k < kUnit; ++k) f[k] = fn(k);
  round_unit<T>(f);
}

// activation_element for a unit of 16 elements, with every choice (direction, activation, half)
// made once for the unit: one formula per loop, not each element evaluating (or predicating)
// all of them.
template <DType T>
__device__ __forceinline__ void activation_unit(const ActivationTile &at, bool second, const float (&a)[kUnit],
                                                const float (&b)[kUnit], const float (&g)[kUnit], float (&f)[kUnit]) {
  using namespace act_math;
  const Activation act = at.kind;
  if (act == Activation::SwiGLU) {  // without a division's call per element (map_sigmoid)
    if (!at.backward) map_sigmoid(a, f, [&](int k, float s) { return mul(silu_of(a[k], s), b[k]); });
    else if (second) map_sigmoid(a, f, [&](int k, float s) { return mul(g[k], silu_of(a[k], s)); });
    else map_sigmoid(a, f, [&](int k, float s) { return mul(mul(g[k], dsilu_of(a[k], s)), b[k]); });
    round_unit<T>(f);
  } else if (!at.backward) {
    if (act == Activation::GeGLU) map_unit<T>(f, [&](int k) { return mul(gelu(a[k]), b[k]); });
    else if (act == Activation::ReLU) map_unit<T>(f, [&](int k) { return relu(a[k]); });
    else if (act == Activation::SReLU) map_unit<T>(f, [&](int k) { return srelu(a[k]); });
    else map_unit<T>(f, [&](int k) { return gelu(a[k]); });
  } else if (act == Activation::GeGLU) {
    if (second) map_unit<T>(f, [&](int k) { return mul(g[k], gelu(a[k])); });
    else map_unit<T>(f, [&](int k) { return mul(mul(g[k], dgelu(a[k])), b[k]); });
  } else if (act == Activation::ReLU) {
    map_unit<T>(f, [&](int k) { return mul(g[k], drelu(a[k])); });
  } else if (act == Activation::SReLU) {
    map_unit<T>(f, [&](int k) { return mul(g[k], dsrelu(a[k])); });
  } else {
    map_unit<T>(f, [&](int k) { return mul(g[k], dgelu(a[k])); });
  }
}

// A gated backward's two elements from one (a, b, g) unit: fn(true, d b) then fn(false, d a), each
// the bits activation_unit gives for its half; SwiGLU's sigmoid is taken once for both.
template <DType T, class Fn>
__device__ __forceinline__ void gated_grad_units(const ActivationTile &at, const float (&a)[kUnit],
                                                 const float (&b)[kUnit], const float (&g)[kUnit], Fn &&fn) {
  using namespace act_math;
  float f[kUnit];
  if (at.kind == Activation::SwiGLU) {
    float s[kUnit];
    map_sigmoid(a, s, [](int, float sig) { return sig; });
#pragma unroll
    for (int k = 0; k < kUnit; ++k) f[k] = mul(g[k], silu_of(a[k], s[k]));
    round_unit<T>(f);
    fn(true, f);
#pragma unroll
    for (int k = 0; k < kUnit; ++k) f[k] = mul(mul(g[k], dsilu_of(a[k], s[k])), b[k]);
    round_unit<T>(f);
    fn(false, f);
    return;
  }
  activation_unit<T>(at, true, a, b, g, f);
  fn(true, f);
  activation_unit<T>(at, false, a, b, g, f);
  fn(false, f);
}

// Whether a gated backward's x of `cols` columns is cast by pairs of tiles
// (for_tile_gated_grad_pairs): each half a whole number of tiles (cols itself, so that no column
// of an odd width is left out), vector loads.
inline bool gated_grad_paired(const ActivationTile &at, int64_t cols) {
  return at.active && at.backward && at.gated && at.vec && cols > 0 && cols % (2 * kTile) == 0;
}

// x = [d a | d b] of a gated backward (gated_grad_paired) by pairs of tiles: the tile at tc, in
// d a's half, and the one cols / 2 to its right, in d b's. The two elements of a pair come from
// the same a, b and g: each is read once, not once per tile, and SwiGLU's sigmoid taken once.
// row_fn(i, second, f) for the thread's 4 rows, d b's row (second) before d a's. Full tiles only
// (both in bounds: the same rows).
template <DType T, class RowFn>
__device__ __forceinline__ void for_tile_gated_grad_pairs(const ActivationTile &at, int64_t cols, const TileCoords &tc,
                                                          RowFn &&row_fn) {
  const int64_t half = cols / 2;
  const int64_t r0 = tc.r0 + kRowsPerThread * tc.g, j = tc.c0 + kUnit * tc.u;
#pragma unroll 1
  for (int i = 0; i < kRowsPerThread; ++i) {
    UnitVecs<T> va, vb, vg;
    va.load(at.pre, (r0 + i) * cols + j);
    vb.load(at.pre, (r0 + i) * cols + j + half);
    vg.load(at.grad, (r0 + i) * half + j);
    float a[kUnit], b[kUnit], g[kUnit];
    va.unpack(a);
    vb.unpack(b);
    vg.unpack(g);
    gated_grad_units<T>(at, a, b, g, [&](bool second, const float (&f)[kUnit]) { row_fn(i, second, f); });
  }
}

// for_tile_rows for an activation-sourced x: row_fn(i, f) for the thread's 4 rows, zeros outside
// x. Forward: pre is [rows, cols] or, gated, [rows, 2 cols]; backward: pre is [rows, cols] and grad
// [rows, cols] or, gated, [rows, cols / 2] (x = [d a | d b]).
// Batch: rows whose loads are issued together (2: the casts; 1: block quantization, which holds
// the thread's whole 4 x 16 tile besides).
template <DType T, int Batch = 2, class RowFn>
__device__ __forceinline__ void for_tile_activation_rows(const ActivationTile &at, int64_t rows, int64_t cols,
                                                         const TileCoords &tc, bool full, RowFn &&row_fn) {
  const int64_t r0 = tc.r0 + kRowsPerThread * tc.g, c = tc.c0 + kUnit * tc.u;
  const bool gated = at.gated, bwd = at.backward;
  const int64_t half = bwd ? cols / 2 : cols;              // gated: the width of a (and b) in pre
  const int64_t pre_w = gated && !bwd ? 2 * cols : cols;   // pre's row width
  const int64_t grad_w = gated ? half : cols;              // grad's row width (backward)
  if (full && at.vec) {
    // The thread's 16 columns lie in one half (half % 16 == 0): a, b and g are vectors. The
    // loads of Batch rows are issued before their first use (the memory latency is the cost); more
    // rows at once would take the registers that let two blocks share an SM.
    const bool second = gated && bwd && c >= half;
    const int64_t j = gated && bwd ? (second ? c - half : c) : c;  // a's column
    // The loop compiled twice, for d b's units (a gated backward's second half, which read no b)
    // and for the rest: each copy holds only its own inputs.
    auto unit_rows = [&](auto second_half) {
      constexpr bool kSecond = decltype(second_half)::value;
#pragma unroll 1
      for (int i0 = 0; i0 < kRowsPerThread; i0 += Batch) {
        UnitVecs<T> va[Batch], vb[Batch], vg[Batch];
#pragma unroll
        for (int i = 0; i < Batch; ++i) {
          const int64_t r = r0 + i0 + i;
          va[i].load(at.pre, r * pre_w + j);
          if (gated && !kSecond) vb[i].load(at.pre, r * pre_w + j + half);
          if (bwd) vg[i].load(at.grad, r * grad_w + (gated ? j : c));
        }
#pragma unroll
        for (int i = 0; i < Batch; ++i) {
          float a[kUnit], b[kUnit] = {}, g[kUnit] = {}, f[kUnit];
          va[i].unpack(a);
          if (gated && !kSecond) vb[i].unpack(b);
          if (bwd) vg[i].unpack(g);
          activation_unit<T>(at, kSecond, a, b, g, f);
          row_fn(i0 + i, f);
        }
      }
    };
    if (second) unit_rows(std::true_type{});
    else unit_rows(std::false_type{});
    return;
  }
#pragma unroll 1
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t r = r0 + i;
    float f[kUnit];
#pragma unroll
    for (int k = 0; k < kUnit; ++k) {
      const int64_t col = c + k;
      f[k] = 0.0f;
      if (r >= rows || col >= cols) continue;
      const bool second = gated && bwd && col >= half;
      const int64_t j = second ? col - half : col;
      const float a = load_scalar<T>(at.pre, r * pre_w + j);
      const float b = gated ? load_scalar<T>(at.pre, r * pre_w + j + half) : 0.0f;
      const float g = bwd ? load_scalar<T>(at.grad, r * grad_w + (gated ? j : col)) : 0.0f;
      f[k] = activation_element<T>(at, a, b, g, second);
    }
    row_fn(i, f);
  }
}

}  // namespace te::cuda
