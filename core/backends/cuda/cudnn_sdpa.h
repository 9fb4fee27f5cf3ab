// cuDNN's fused scaled-dot-product attention (flash attention in cuDNN's runtime-fusion
// engines), driven through cuDNN's backend (graph) API with libcudnn loaded at run time, so that
// libte.so loads without cuDNN. Execution plans are built once per shape and kept; a call then
// only fills a variant pack and executes on the stream (no host sync, capturable in a graph).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "backends/backend.h"

namespace te::cuda {

class CudnnSdpa {
 public:
  // nullptr when libcudnn cannot be loaded or has no usable handle for `device`, with the reason
  // in *why_unavailable (the caller's: each backend keeps its own).
  static std::unique_ptr<CudnnSdpa> create(int device, std::string *why_unavailable);
  virtual ~CudnnSdpa() = default;

  // Whether cuDNN runs this call (builds and caches the plan on first sight of a shape; false
  // for a shape, mask, dtype or device it cannot do). *workspace_bytes: what the call needs.
  virtual bool supports_forward(const AttentionForwardArgs &args, size_t *workspace_bytes) = 0;
  virtual bool supports_backward(const AttentionBackwardArgs &args, size_t *workspace_bytes) = 0;
  // Run a supported call with `workspace` of at least *workspace_bytes bytes.
  virtual void forward(const AttentionForwardArgs &args, void *workspace, cudaStream_t stream) = 0;
  virtual void backward(const AttentionBackwardArgs &args, void *workspace, cudaStream_t stream) = 0;
};

}  // namespace te::cuda
