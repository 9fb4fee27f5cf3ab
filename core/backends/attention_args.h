// The arguments of the backends' attention and rotary-embedding calls (backend.h). The numbers
// they must produce are defined by numerics/attention.h; the core validates every shape, offset
// and dtype before a backend sees them.
#pragma once

#include <cstdint>

#include "base/types.h"

namespace te {

// Which keys a query sees inside its sequence (query i, key j, lengths sq and skv):
//   None:              every key;
//   Causal:            j <= i (top-left aligned, TE's "causal");
//   CausalBottomRight: j <= i + (skv - sq) (TE's "causal_bottom_right", flash-attention's).
// A query that sees no key (a bottom-right mask with sq > skv, or skv = 0) gets O = 0,
// LSE = -inf, and gives no gradient.
enum class AttnMask : int { None = 0, Causal = 1, CausalBottomRight = 2 };

// The sequences of one call. q is [tokens_q, heads, head_dim], k and v are
// [tokens_kv, kv_heads, head_dim], row-major; a sequence's tokens are consecutive rows.
//  - Fixed lengths (BSHD, cu_seqlens_q == nullptr): sequence b is rows [b*max_seq_q, (b+1)*max_seq_q)
//    of q and [b*max_seq_kv, (b+1)*max_seq_kv) of k and v; tokens = batch * max_seq.
//  - Variable lengths (THD): int32 offsets on the backend's device, [batch + 1] each;
//    sequence b is rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q (the same for kv); every
//    length is at most max_seq_q (max_seq_kv). The core validates offsets that it can read on
//    the host (CPU); a GPU kernel clamps every offset into [0, tokens] and every length into
//    [0, max_seq], so wrong offsets give wrong numbers, never an access out of bounds.
// Query head h reads key/value head h / (heads / kv_heads) (GQA; heads % kv_heads == 0).
struct AttentionDims {
  int64_t batch = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int64_t tokens_q = 0, tokens_kv = 0;
  int64_t max_seq_q = 0, max_seq_kv = 0;
  const int32_t *cu_seqlens_q = nullptr, *cu_seqlens_kv = nullptr;
  AttnMask mask = AttnMask::None;
  float softmax_scale = 1.0f;
  bool varlen() const { return cu_seqlens_q != nullptr; }
};

// O = softmax(scale * Q K^T + mask) V per sequence and head, and the row log-sum-exp
// LSE = max + log(sum exp(...)) in fp32 [tokens_q, heads] for the backward.
// High precision: q, k, v, o share one dtype (F16/BF16; F32 on the CPU and the CUDA kernel).
// FP8 (q, k, v E4M3 with per-tensor scale_inv[0]): S = (q8 k8^T) * q.scale_inv * k.scale_inv
// * softmax_scale; P (normalised, in [0, 1]) is quantized to E4M3 with *s_scale before P V,
// which is multiplied by *s_scale_inv * v.scale_inv; max P max-accumulates into *s_amax when it
// is set. o is high precision.
struct AttentionForwardArgs {
  AttentionDims dims;
  TensorView q, k, v, o;
  float *lse = nullptr;
  const float *s_scale = nullptr, *s_scale_inv = nullptr;  // FP8 only
  float *s_amax = nullptr;                                 // FP8 only, optional
};

// dQ, dK, dV from dO [tokens_q, heads, head_dim] (numerics/attention.h). q, k, v, lse are the
// forward's; o and d_o are high precision (D = rowsum(dO * O) is taken from them). dq, dk, dv
// have q's, k's and v's shapes in o's dtype and are written, not accumulated (dK and dV sum
// the heads of a GQA group). FP8 adds: d_o8 (dO quantized, E4M3 or E5M2, scale_inv[0]), the
// forward's s_scale/s_scale_inv, and dS = P * (dP - D) quantized with *dp_scale (max |dS|
// max-accumulates into *dp_amax when set). dp_amax_only: compute max |dS| into *dp_amax and
// write no gradient (current scaling takes dS's scale from it first).
struct AttentionBackwardArgs {
  AttentionDims dims;
  TensorView q, k, v, o, d_o;
  const float *lse = nullptr;
  TensorView d_o8;                                           // FP8 only
  const float *s_scale = nullptr, *s_scale_inv = nullptr;    // FP8 only
  const float *dp_scale = nullptr, *dp_scale_inv = nullptr;  // FP8 only
  float *dp_amax = nullptr;                                  // FP8 only, optional
  bool dp_amax_only = false;
  TensorView dq, dk, dv;
};

// Rotary position embedding over x [tokens, heads, head_dim] (y may be x itself): the first
// rot_dim features of every head rotate by the angle freqs[p, k] (F32 [positions, rot_dim / 2])
// of the token's position p in its sequence, pair k being (k, k + rot_dim/2) or, interleaved,
// (2k, 2k+1): y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin (inverse: the angle negated, which is
// the backward). The other features are copied. Positions: BSHD (cu_seqlens == nullptr) row r
// is position r % seq_len; THD: row t of sequence b is position t - cu_seqlens[b] (device int32
// [batch + 1], clamped on the GPU as attention's are; positions >= freqs rows clamp to the last).
struct RopeArgs {
  TensorView x, y, freqs;
  int64_t tokens = 0, heads = 0, head_dim = 0, rot_dim = 0;
  int64_t seq_len = 0;  // BSHD
  int64_t batch = 0;    // THD
  const int32_t *cu_seqlens = nullptr;
  bool interleaved = false;
  bool inverse = false;
};

}  // namespace te
