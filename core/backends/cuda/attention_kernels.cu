// Placeholder until the kernels land: every call is Unsupported.
#include "backends/cuda/attention_kernels.h"
#include "base/check.h"

namespace te::cuda {

size_t attention_forward_scratch_bytes(const AttentionForwardArgs &) { return 0; }
size_t attention_backward_scratch_bytes(const AttentionBackwardArgs &) { return 0; }
void attention_forward_kernels(Backend &, const AttentionForwardArgs &, cudaStream_t) {
  fail(Status::Unsupported, "attention on CUDA: not built yet");
}
void attention_backward_kernels(Backend &, const AttentionBackwardArgs &, cudaStream_t) {
  fail(Status::Unsupported, "attention on CUDA: not built yet");
}
void rope_kernel(const RopeArgs &, cudaStream_t) { fail(Status::Unsupported, "RoPE on CUDA: not built yet"); }

}  // namespace te::cuda
