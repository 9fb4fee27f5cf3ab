// The CPU backend: libte's bit-faithful reference. Casts, quantization, amaxes and scale updates
// call te/core/numerics.h element by element; GEMMs run on exactly decoded FP8 values in fp32
// through OpenBLAS. Its member functions are defined in one file per job:
//   cpu_backend.cpp     stream, memory, copies, scaling-state maintenance, the factory
//   cpu_quantize.cpp    amax, scales, casts with transpose, block quantization, dequantization
//   cpu_gemm.cpp        GEMM with the bias/GELU/accumulate epilogue
//   cpu_activation.cpp  ReLU/GELU/SwiGLU forward and backward, bias gradient
//   cpu_norm.cpp        LayerNorm/RMSNorm forward (with the fused FP8 cast) and backward
//   cpu_attention.cpp   scaled dot-product attention forward and backward, RoPE
#pragma once

#include "backends/cpu/cpu_allocator.h"
#include "backends/backend.h"

namespace te {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device{DeviceType::CPU, 0}; }

  void set_stream(void *stream) override;
  void *stream() const override { return nullptr; }
  void synchronize() override {}
  void *alloc(size_t bytes) override { return allocator_.alloc(bytes); }
  void free(void *ptr, size_t bytes) override { allocator_.free(ptr, bytes); }
  void copy(void *dst, const void *src, size_t bytes) override;
  void copy_to_host(void *dst, const void *src, size_t bytes) override;
  void copy_from_host(void *dst, const void *src, size_t bytes) override;
  void fill_floats(float *dst, float value, size_t count) override;
  void zero_many(const ByteRange *ranges, int n) override;

  void amax(const TensorView &x, float *amax, bool accumulate) override;
  void scale_from_amax(const float *amax, float *scale, float *scale_inv, float fp8_max,
                       bool power_of_2, float epsilon) override;
  void cast_transpose(const TensorView &x, const float *scale, float *amax_accum, TensorView *out,
                      TensorView *out_t) override;
  void block_quantize(const TensorView &x, ScalingMode mode, bool power_of_2, float epsilon,
                      TensorView *out, TensorView *out_t) override;
  void dequantize(const TensorView &x, const TensorView &out) override;

  void gemm(const GemmArgs &args) override;
  void activation_forward(Activation act, const TensorView &x, const TensorView &y) override;
  void activation_backward(Activation act, const TensorView &x, const TensorView &dy,
                           const TensorView &dx) override;
  void bias_grad(const TensorView &dy, const TensorView &db) override;
  void norm_forward(const NormForwardArgs &args) override;
  void norm_backward(const NormBackwardArgs &args) override;
  void attention_forward(const AttentionForwardArgs &args) override;
  void attention_backward(const AttentionBackwardArgs &args) override;
  void rope(const RopeArgs &args) override;
  void add(const TensorView &a, const TensorView &b, const TensorView &y) override;
  void copy_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
               size_t rows) override;
  void embedding_forward(const EmbeddingForwardArgs &args) override;
  void embedding_backward(const EmbeddingBackwardArgs &args) override;
  void cross_entropy(const CrossEntropyArgs &args) override;
  void adamw(const AdamwArgs &args) override;

  void plan_gemm(const GemmArgs &args, ScratchPlan *plan) const override;
  void plan_cast_transpose(const TensorView &x, const TensorView *out, const TensorView *out_t,
                           ScratchPlan *plan) const override;
  void plan_block_quantize(const TensorView &x, ScratchPlan *plan) const override;
  void plan_bias_grad(const TensorView &dy, ScratchPlan *plan) const override;
  void plan_activation(Activation act, const TensorView &x, bool backward, ScratchPlan *plan) const override;
  void plan_norm_forward(const NormForwardArgs &args, ScratchPlan *plan) const override;
  void plan_norm_backward(const NormBackwardArgs &args, ScratchPlan *plan) const override;
  void reserve(const ScratchPlan &plan) override;
  void plan_dequantize(const TensorView &x, ScratchPlan *plan) const;

  void gather_amax(const ScaleUpdateItem *items, int n, float *packed) override;
  void scale_update(const ScaleUpdateItem *items, int n, const float *reduced_amax) override;

  const CpuCachingAllocator &allocator() const { return allocator_; }

 private:
  CpuCachingAllocator allocator_;
};

}  // namespace te
