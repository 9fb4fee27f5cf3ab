// CudaBackend's attention and RoPE: cuDNN's fused SDPA when it can run the call, libte's own
// kernels otherwise (or always, with TE_ATTENTION_IMPL=kernel).
#include <cstdlib>
#include <cstring>

#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_sdpa.h"
#include "base/check.h"

namespace te::cuda {

CudnnSdpa *CudaBackend::sdpa() const {
  if (!sdpa_tried_) {
    sdpa_tried_ = true;
    sdpa_ = CudnnSdpa::create(device_, &sdpa_why_);
  }
  return sdpa_.get();
}

void CudaBackend::attention_forward(const AttentionForwardArgs &args) {
  DeviceGuard g(device_);
  size_t ws = 0;
  CudnnSdpa *s = attention_impl_ != AttentionImpl::Kernel ? sdpa() : nullptr;
  if (s && s->supports_forward(args, &ws)) {
    Buffer workspace(this, ws);
    s->forward(args, workspace.get(), stream_);
    return;
  }
  if (attention_impl_ == AttentionImpl::Cudnn)
    fail(Status::Unsupported, "cuDNN's fused attention cannot run this call (TE_ATTENTION_IMPL=cudnn): %s",
         s ? "shape, mask or dtype not supported" : (sdpa_why_.empty() ? "cuDNN unavailable" : sdpa_why_.c_str()));
  attention_forward_kernels(*this, args, stream_);
}

void CudaBackend::attention_backward(const AttentionBackwardArgs &args) {
  DeviceGuard g(device_);
  size_t ws = 0;
  CudnnSdpa *s = attention_impl_ != AttentionImpl::Kernel ? sdpa() : nullptr;
  if (s && s->supports_backward(args, &ws)) {
    Buffer workspace(this, ws);
    s->backward(args, workspace.get(), stream_);
    return;
  }
  if (attention_impl_ == AttentionImpl::Cudnn)
    fail(Status::Unsupported, "cuDNN's fused attention cannot run this call (TE_ATTENTION_IMPL=cudnn): %s",
         s ? "shape, mask or dtype not supported" : (sdpa_why_.empty() ? "cuDNN unavailable" : sdpa_why_.c_str()));
  attention_backward_kernels(*this, args, stream_);
}

void CudaBackend::plan_attention_forward(const AttentionForwardArgs &args, ScratchPlan *plan) const {
  DeviceGuard g(device_);
  size_t ws = 0;
  CudnnSdpa *s = attention_impl_ != AttentionImpl::Kernel ? sdpa() : nullptr;
  if (!(s && s->supports_forward(args, &ws))) ws = attention_forward_scratch_bytes(args);
  if (ws) plan->add(ws);
}

void CudaBackend::plan_attention_backward(const AttentionBackwardArgs &args, ScratchPlan *plan) const {
  DeviceGuard g(device_);
  size_t ws = 0;
  CudnnSdpa *s = attention_impl_ != AttentionImpl::Kernel ? sdpa() : nullptr;
  if (!(s && s->supports_backward(args, &ws))) ws = attention_backward_scratch_bytes(args);
  if (ws) plan->add(ws);
}

void CudaBackend::rope(const RopeArgs &args) {
  DeviceGuard g(device_);
  // Taken before anything is written: running out of memory leaves y as it was.
  Buffer table(this, rope_table_bytes(args));
  rope_kernel(args, stream_, table.floats());
}

CudaBackend::AttentionImpl CudaBackend::attention_impl_from_env() {
  const char *e = std::getenv("TE_ATTENTION_IMPL");
  if (e && std::strcmp(e, "kernel") == 0) return AttentionImpl::Kernel;
  if (e && std::strcmp(e, "cudnn") == 0) return AttentionImpl::Cudnn;
  return AttentionImpl::Auto;
}

}  // namespace te::cuda
