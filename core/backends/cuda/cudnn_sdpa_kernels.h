// Small kernels around cuDNN's fused attention (cudnn_sdpa.cpp): they turn libte's cu_seqlens into
// the per-sequence lengths and ragged offsets cuDNN reads, move the softmax statistics between
// cuDNN's [batch, heads, seq] layout and libte's LSE [tokens, heads], and give rows that see no
// key libte's O = 0, LSE = -inf. All run on the stream, without host synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace te::cuda {

struct SdpaSeqInfo {
  const int32_t *cu_q = nullptr, *cu_kv = nullptr;  // nullptr: fixed lengths
  int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t tokens_q = 0, tokens_kv = 0, max_q = 0, max_kv = 0;
  int mask = 0;  // AttnMask
};

// seq_q / seq_kv [batch] (int32; max_q / max_kv for fixed lengths); off_q / off_kv / off_stats
// [batch + 1] (int64 element offsets: tokens * heads * head_dim, tokens * kv_heads * head_dim,
// tokens * heads), written only for variable lengths and when not null. Offsets and lengths
// are clamped as attention_args.h says.
void sdpa_prepare_lengths(const SdpaSeqInfo &s, int32_t *seq_q, int32_t *seq_kv, int64_t *off_q, int64_t *off_kv,
                          int64_t *off_stats, cudaStream_t stream);

// After the forward: lse[t, h] = stats_bhs[b, h, i] (fixed lengths, stats_bhs given) and, for every
// row i that sees no key, lse = -inf and o's row = 0 (o of element size o_elem_bytes).
void sdpa_finish_forward(const SdpaSeqInfo &s, const float *stats_bhs, float *lse, void *o, int o_elem_bytes,
                         cudaStream_t stream);

// Before the backward: stats = lse with -inf replaced by +inf (so that rows without keys give
// P = 0, no gradient), in [batch, heads, max_q] for fixed lengths, [tokens, heads] otherwise.
void sdpa_prepare_backward_stats(const SdpaSeqInfo &s, const float *lse, float *stats, cudaStream_t stream);

// *dst = max(*dst, *src) (NaN wins), one thread.
void sdpa_max_merge(const float *src, float *dst, cudaStream_t stream);

}  // namespace te::cuda
