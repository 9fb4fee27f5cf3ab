// The CUDA backend: te::Backend on one GPU. Work is enqueued on the context's stream and never
// synchronised (except copy_to_host, which callers use only off the hot path); memory comes from
// the device's stream-ordered pool (cudaMallocAsync with a release threshold that keeps it
// cached) through a host-side cache of freed blocks (block_cache.h), so a training step makes no
// CUDA call to allocate once its sizes repeat, and can be captured in a graph.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "backends/backend.h"
#include "backends/cuda/block_cache.h"

#include <unordered_set>
#include <vector>

namespace te::cuda {

class LtGemm;
class CudnnSdpa;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  Device device() const override { return Device{DeviceType::CUDA, device_}; }
  void set_stream(void *stream) override;
  void *stream() const override { return stream_; }
  void synchronize() override;
  bool stream_capturing() const override { return capturing(); }
  void *alloc(size_t bytes) override;
  void free(void *ptr, size_t bytes) override;
  void copy(void *dst, const void *src, size_t bytes) override;
  void copy_to_host(void *dst, const void *src, size_t bytes) override;
  void copy_from_host(void *dst, const void *src, size_t bytes) override;
  void fill_floats(float *dst, float value, size_t count) override;
  void zero_many(const ByteRange *ranges, int n) override;

  void amax(const TensorView &x, float *amax, bool accumulate) override;
  void scale_from_amax(const float *amax, float *scale, float *scale_inv, float fp8_max, bool power_of_2,
                       float epsilon) override;
  void cast_transpose(const TensorView &x, const float *scale, float *amax_accum, TensorView *out,
                      TensorView *out_t) override;
  void block_quantize(const TensorView &x, ScalingMode mode, bool power_of_2, float epsilon, TensorView *out,
                      TensorView *out_t) override;
  void dequantize(const TensorView &x, const TensorView &out) override;
  void quantize_many(const QuantizeItem *items, int n) override;
  // Every kind takes an activation source in the pass that casts: delayed scaling's scale is known
  // before it, block scaling's comes from the tile the pass holds, and current scaling's from an
  // amax pass that computes the activation too (activation_amax_partials).
  bool fuses_activation_cast(QuantizeItem::Kind) const override { return true; }

  void gemm(const GemmArgs &args) override;
  void gemm_many(const GemmArgs *args, int n) override;
  void activation_forward(Activation act, const TensorView &x, const TensorView &y) override;
  void activation_backward(Activation act, const TensorView &x, const TensorView &dy,
                           const TensorView &dx) override;
  void bias_grad(const TensorView &dy, const TensorView &db) override;
  void bias_grad_many(const TensorView *dys, const TensorView *dbs, int n) override;
  void norm_forward(const NormForwardArgs &args) override;
  void norm_backward(const NormBackwardArgs &args) override;
  void plan_norm_backward(const NormBackwardArgs &args, ScratchPlan *plan) const override;
  void attention_forward(const AttentionForwardArgs &args) override;
  void attention_backward(const AttentionBackwardArgs &args) override;
  void rope(const RopeArgs &args) override;
  void add(const TensorView &a, const TensorView &b, const TensorView &y) override;
  void copy_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
               size_t rows) override;
  void copy_row_segments(void *dst, const void *src, size_t row_bytes, const RowSegment *segs, int n) override;
  void embedding_forward(const EmbeddingForwardArgs &args) override;
  void embedding_backward(const EmbeddingBackwardArgs &args) override;
  void cross_entropy(const CrossEntropyArgs &args) override;
  void adamw(const AdamwArgs &args) override;
  void plan_embedding_backward(const EmbeddingBackwardArgs &args, ScratchPlan *plan) const override;
  void plan_cross_entropy(const CrossEntropyArgs &args, ScratchPlan *plan) const override;
  void plan_adamw(const AdamwArgs &args, ScratchPlan *plan) const override;
  void plan_attention_forward(const AttentionForwardArgs &args, ScratchPlan *plan) const override;
  void plan_attention_backward(const AttentionBackwardArgs &args, ScratchPlan *plan) const override;

  void gather_amax(const ScaleUpdateItem *items, int n, float *packed) override;
  void scale_update(const ScaleUpdateItem *items, int n, const float *reduced_amax) override;

 private:
  int device_;
  cudaStream_t stream_ = nullptr;  // the legacy default stream until set_stream
  void *workspace_ = nullptr;      // cuBLASLt workspace, allocated once
  size_t workspace_bytes_ = 0;
  std::unique_ptr<LtGemm> gemm_;
  uint32_t *amax_partials_ = nullptr;  // quantize_many's current-scaling partials, reused in stream order
  BlockCache cache_;                         // freed blocks for reuse on stream_
  std::unordered_set<void *> captured_;      // live blocks allocated during stream capture
  // Blocks allocated outside a capture and freed during one: a captured free must be of a graph
  // allocation (cudaFreeAsync fails otherwise), so they wait for the next call that is not
  // capturing, as PyTorch's allocator defers such frees.
  struct HeldBlock {
    void *ptr;
    size_t bytes;
  };
  std::vector<HeldBlock> freed_during_capture_;
  void release_freed_during_capture();  // them to the cache (or the pool); not while capturing
  bool capturing() const;                    // stream_ is being captured (or cannot be asked)
  struct CaptureKnown {                      // capturing()'s answer during one C API call
    uint64_t call = 0;
    cudaStream_t stream = nullptr;
    bool capturing = false;
  };
  mutable CaptureKnown capture_known_;
  cudaStream_t cache_stream_ = nullptr;      // the stream the cached blocks were freed on
  void drain_cache();                        // every cached block back to the pool, on cache_stream_
  void follow_stream_in_cache();             // the cache made stream_'s (deferred while capturing)
  // Attention (attention_dispatch.cpp): cuDNN's fused SDPA where it applies, else libte's
  // kernels; TE_ATTENTION_IMPL=kernel|cudnn|auto (default auto) chooses, read once.
  enum class AttentionImpl { Auto, Kernel, Cudnn };
  static AttentionImpl attention_impl_from_env();
  AttentionImpl attention_impl_ = attention_impl_from_env();
  mutable bool sdpa_tried_ = false;
  mutable std::string sdpa_why_;  // why sdpa_ is null, once tried
  mutable std::unique_ptr<CudnnSdpa> sdpa_;
  CudnnSdpa *sdpa() const;  // loads cuDNN on first use; nullptr when unavailable
};

}  // namespace te::cuda
