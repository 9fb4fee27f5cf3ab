// The internal backend interface: everything device-specific that libte does goes through it.
// The CPU backend (backends/cpu) is the reference implementation; the CUDA backend (backends/cuda)
// implements the same interface with kernels and cuBLASLt.
//
// Contract for every implementation:
//  - All tensor and float pointers passed in live on this backend's device. Scalars that the
//    numerics need (scales, amaxes, scale_inv) are passed by device pointer, never read back to
//    the host: a training step never synchronises the host.
//  - Work is enqueued in call order on the backend's stream (the CPU runs it immediately).
//  - Results are bit-identical across backends for every cast, quantization, amax, scale
//    formula and scale update (te/core/numerics.h is the definition). GEMMs and reductions of
//    sums may differ by accumulation order only.
//  - Inputs have been validated by the core; a backend throws te::Error only for device
//    failures (Cuda, Cublas, OutOfMemory) or an operation it cannot do (Unsupported).
//  - alloc()/free() serve the hot path from a cache: after warm-up a training step makes no
//    system allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backends/attention_args.h"
#include "backends/training_args.h"
#include "numerics/norm.h"
#include "numerics/numerics.h"
#include "base/types.h"

namespace te {

enum class Activation : int { ReLU = 0, GELU = 1, SwiGLU = 2, GeGLU = 3, SReLU = 4 };
inline bool is_gated(Activation a) { return a == Activation::SwiGLU || a == Activation::GeGLU; }
enum class Epilogue : int { None = 0, Bias = 1, Gelu = 2, BiasGelu = 3 };

// D[m, n] = op(A)[m, k] op(B)[k, n] (row-major), then the epilogue, then D's dtype.
// FP8 operands: per-tensor scaled ones are multiplied by A.scale_inv[0] * B.scale_inv[0] after
// the fp32 accumulation; block-scaled ones are dequantized per block first.
struct GemmArgs {
  TensorView a, b, d;
  bool transa = false, transb = false;
  Epilogue epilogue = Epilogue::None;
  TensorView bias;                    // used by the Bias epilogues
  TensorView gelu_input;              // optional pre-GELU output (data == nullptr: none)
  bool accumulate = false;            // D += result
  bool split_accumulator = false;     // FP8 fast-accumulation off (CUDA); exact on the CPU
  // m or k is a token count that changes from call to call (a GroupedLinear expert's share): a
  // shape the backend may never see again, so CUDA makes no synchronising algorithm search for it.
  bool shape_varies = false;
};

// LayerNorm / RMSNorm forward over the last dimension of x [rows, hidden], in the order and
// formulas of numerics/norm.h. Outputs (each optional: data/pointer null = not wanted):
//  - y: the normalised values in a high-precision dtype ([rows, hidden]);
//  - mu, rsigma: fp32 [rows] statistics for the backward (mu unused by RMSNorm);
//  - out / out_t: FP8 [rows, hidden] / its transpose [hidden, rows], cast from the fp32 values
//    with the per-tensor *scale (delayed scaling); 1/scale is written to each one's scale_inv[0];
//  - amax_accum: max-accumulates max |v| over the fp32 normalised values v (NaN if one is NaN),
//    so a current-scaling cast of y needs no separate amax pass.
// On CUDA this is one fused kernel: the FP8 input of the next GEMM, its transpose and its amax
// come out of the pass that normalises.
struct NormForwardArgs {
  NormKind kind = NormKind::LayerNorm;
  float eps = 1e-5f;
  bool zero_centered_gamma = false;
  TensorView x;            // [rows, hidden], F32/F16/BF16
  TensorView gamma, beta;  // [hidden], x's dtype; beta.data null: none (RMSNorm never has one)
  TensorView y;            // optional
  float *mu = nullptr, *rsigma = nullptr;
  const float *scale = nullptr;  // required with out/out_t
  float *amax_accum = nullptr;
  TensorView *out = nullptr, *out_t = nullptr;
};

struct ScaleUpdateItem;

// The most scale-update items a norm backward carries (NormBackwardArgs::then_update).
constexpr int kCarriedUpdateItems = 16;

// Norm backward from the forward's x, gamma and statistics: dx [rows, hidden] (x's dtype),
// dgamma and dbeta [hidden] (gamma's dtype; each optional; dbeta LayerNorm only). dgamma/dbeta
// are written, not accumulated, and are deterministic (fixed reduction order on every backend).
struct NormBackwardArgs {
  NormKind kind = NormKind::LayerNorm;
  bool zero_centered_gamma = false;
  TensorView dy, x, gamma;
  const float *mu = nullptr, *rsigma = nullptr;
  TensorView dx, dgamma, dbeta;
  // A scale update (as scale_update(then_update, then_update_count, nullptr)) enqueued with the
  // backward: at most kCarriedUpdateItems states, none of whose memory the backward touches. CUDA
  // runs it in extra blocks of the backward's launch, which saves the update a launch of its own
  // (a module step's last launch is its norm backward); the CPU runs it after the backward.
  const ScaleUpdateItem *then_update = nullptr;
  int then_update_count = 0;
};

// One scaling state as the fused update sees it: history[len], then scale, then scale_inv; the
// current amax (history slot 0) is read from *amax, which the update then zeroes (amax may point
// at history[0] itself, or at the state's slot in the context's AmaxSlots).
struct ScaleUpdateItem {
  float *history;
  float *amax;
  float *scale;
  float *scale_inv;
  int len;
  int margin;
  AmaxAlgo algo;
  float fp8_max;
};

// The scratch memory a sequence of backend calls will take from the backend's cache. A core
// operation collects it first and reserves it, so that running out of memory happens before the
// operation changes any state, never halfway through (the strong guarantee of the C API).
// One tensor of Backend::quantize_many, with the arguments of the per-tensor calls it stands for:
//  - Delayed: cast_transpose(x, scale, amax_accum, out, out_t);
//  - Current: amax(x, amax_out, false); scale_from_amax(amax_out, scale_out, scale_inv_out,
//    fp8_max, power_of_2, epsilon); cast_transpose(x, scale_out, nullptr, out, out_t);
//  - Block: block_quantize(x, block_mode, power_of_2, epsilon, out, out_t);
// each followed by bias_grad(x, dbias) when dbias is given (CUDA takes it in the same pass).
// A tensor to quantize that is an activation's output (or its gradient), never stored:
//  - forward: x = act(pre), pre [rows, cols] ([rows, 2 cols] gated: [a | b], x = gate(a) * b);
//  - backward: x = the gradient into pre given grad = dL/d(act's output), as activation_backward
//    writes it (x has pre's shape);
// each element rounded to x's dtype (pre's and grad's too) before the cast, so the codes are
// those of activation_forward / activation_backward into a buffer followed by the cast.
struct ActivationSource {
  bool backward = false;
  Activation act = Activation::GELU;
  TensorView pre, grad;  // pre.data null: no source (x is read)
  bool active() const { return pre.data != nullptr; }
};

struct QuantizeItem {
  enum class Kind { Delayed, Current, Block };
  Kind kind = Kind::Delayed;
  TensorView x;  // with an activation source: its shape and dtype only (data may be null)
  ActivationSource source;
  TensorView *out = nullptr, *out_t = nullptr;
  const float *scale = nullptr;
  float *amax_accum = nullptr;
  float *scale_copy = nullptr;  // Delayed: then copy(scale_copy, scale, sizeof(float))
  float *amax_out = nullptr, *scale_out = nullptr, *scale_inv_out = nullptr;
  float fp8_max = 0.0f;
  ScalingMode block_mode = ScalingMode::Block1x128;
  bool power_of_2 = false;
  float epsilon = 0.0f;
  TensorView dbias;  // optional (data null: none): then also bias_grad(x, dbias), x being a dy
};

// One block of rows for Backend::copy_row_segments: dst rows [dst_row, dst_row + rows) get src
// rows [src_row, src_row + rows), then the next zero_rows rows of dst get zero bytes.
struct RowSegment {
  int64_t src_row = 0, dst_row = 0, rows = 0, zero_rows = 0;
};

// Bytes of device memory for Backend::zero_many: any address, any size.
struct ByteRange {
  void *data = nullptr;
  size_t bytes = 0;
};

struct ScratchPlan {
  static constexpr int kMax = 64;  // a LayerNormMLP backward under block scaling plans about 30
  size_t bytes[kMax];
  int n = 0;
  void add(size_t b);  // throws Internal beyond kMax
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // ---- stream and memory ----
  virtual void set_stream(void *stream) = 0;
  virtual void *stream() const = 0;
  virtual void synchronize() = 0;
  // Whether work enqueued now is being captured into a graph rather than run (CUDA stream
  // capture; true when it cannot be asked). Autocast defers no update across a capture boundary.
  virtual bool stream_capturing() const { return false; }
  virtual void *alloc(size_t bytes) = 0;          // cached; throws OutOfMemory
  virtual void free(void *ptr, size_t bytes) = 0;  // back to the cache; nullptr ok
  virtual void copy(void *dst, const void *src, size_t bytes) = 0;          // device -> device
  virtual void copy_to_host(void *dst, const void *src, size_t bytes) = 0;  // synchronises
  virtual void copy_from_host(void *dst, const void *src, size_t bytes) = 0;
  virtual void fill_floats(float *dst, float value, size_t count) = 0;
  // Zero bytes over every range, whatever its alignment (a caller's BF16 tensor may start 2 bytes
  // off a float). CUDA zeroes up to 32 ranges in one launch (a GroupedLinear's experts without
  // tokens get dW = 0 and db = 0: at small shapes each launch is the cost).
  virtual void zero_many(const ByteRange *ranges, int n) = 0;

  // ---- quantization ----
  // *amax (= or max-accumulated) = max |x|; NaN if x holds a NaN.
  virtual void amax(const TensorView &x, float *amax, bool accumulate) = 0;
  // scale = compute_scale_from_amax(*amax, ...); scale_inv = 1 / scale.
  virtual void scale_from_amax(const float *amax, float *scale, float *scale_inv, float fp8_max,
                               bool power_of_2, float epsilon) = 0;
  // Per-tensor cast with *scale: out = fp8(x * scale), out_t = its transpose ([cols, rows]),
  // either may be null; writes 1/scale to each output's scale_inv[0]; when amax_accum is set,
  // max-accumulates max |x| into it in the same pass.
  virtual void cast_transpose(const TensorView &x, const float *scale, float *amax_accum,
                              TensorView *out, TensorView *out_t) = 0;
  // Block quantization (mode = out/out_t scaling): scales from each block's amax with
  // compute_scale_from_amax; 1x128: out_t is x^T quantized in its own 1x128 blocks;
  // 128x128: out_t uses the transposed tile grid (same scales, transposed).
  virtual void block_quantize(const TensorView &x, ScalingMode mode, bool power_of_2,
                              float epsilon, TensorView *out, TensorView *out_t) = 0;
  virtual void dequantize(const TensorView &x, const TensorView &out) = 0;
  // Several quantizations at once (a layer's input and weight): the results are exactly those of
  // the per-tensor calls in order, which is what this default makes; CUDA runs each kind of item
  // in one launch (current scaling: two), since at small shapes the launches are the cost.
  // An item with an activation source: this default makes the activation into scratch first
  // (plan_quantize_source plans it); a backend that fuses_activation_cast(kind) computes it
  // inside the cast instead.
  virtual void quantize_many(const QuantizeItem *items, int n);
  virtual bool fuses_activation_cast(QuantizeItem::Kind /*kind*/) const { return false; }

  // ---- math ----
  virtual void gemm(const GemmArgs &args) = 0;
  // Independent GEMMs (no output read by another, a layer's dgrad and wgrad): the results of
  // gemm on each, which is what this default makes; CUDA runs the small ones in one launch.
  virtual void gemm_many(const GemmArgs *args, int n);
  virtual void activation_forward(Activation act, const TensorView &x, const TensorView &y) = 0;
  virtual void activation_backward(Activation act, const TensorView &x, const TensorView &dy,
                                   const TensorView &dx) = 0;
  // db[n] = sum over rows of dy[rows, n], accumulated in fp32.
  virtual void bias_grad(const TensorView &dy, const TensorView &db) = 0;
  // bias_grad(dys[i], dbs[i]) for each i (independent outputs): what this default makes; CUDA
  // sums the small ones in one launch (GroupedLinear's experts without FP8 casts).
  virtual void bias_grad_many(const TensorView *dys, const TensorView *dbs, int n);
  virtual void norm_forward(const NormForwardArgs &args) = 0;
  virtual void norm_backward(const NormBackwardArgs &args) = 0;
  // Scaled dot-product attention and rotary embeddings (attention_args.h).
  virtual void attention_forward(const AttentionForwardArgs &args) = 0;
  virtual void attention_backward(const AttentionBackwardArgs &args) = 0;
  virtual void rope(const RopeArgs &args) = 0;
  // y = a + b elementwise in fp32, rounded once to y's dtype (one dtype, one numel; y may alias a
  // or b). NaN operands propagate with x86's rules (the first NaN, quietened), bit-identically.
  virtual void add(const TensorView &a, const TensorView &b, const TensorView &y) = 0;
  // A strided block copy: rows rows of width bytes, from src (row pitch src_pitch bytes) to dst
  // (row pitch dst_pitch bytes); the regions do not overlap.
  virtual void copy_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                       size_t rows) = 0;
  // Row blocks between two row-major matrices of row_bytes bytes per row (RowSegment); the
  // segments write disjoint rows of dst, which does not overlap src. The default makes a copy and
  // a fill per segment (so zero rows need dst 4-byte aligned and row_bytes a multiple of 4); CUDA
  // makes them all in one launch (GroupedLinear pads every expert's tokens: at small shapes each
  // launch is the cost).
  virtual void copy_row_segments(void *dst, const void *src, size_t row_bytes, const RowSegment *segs, int n);
  // Training-step ops (training_args.h).
  virtual void embedding_forward(const EmbeddingForwardArgs &args) = 0;
  virtual void embedding_backward(const EmbeddingBackwardArgs &args) = 0;
  virtual void cross_entropy(const CrossEntropyArgs &args) = 0;
  virtual void adamw(const AdamwArgs &args) = 0;

  // ---- scratch ----
  // What gemm / cast_transpose / block_quantize with these arguments take from the cache, added
  // to *plan (nothing on backends whose kernels need no scratch).
  virtual void plan_gemm(const GemmArgs & /*args*/, ScratchPlan * /*plan*/) const {}
  virtual void plan_cast_transpose(const TensorView & /*x*/, const TensorView * /*out*/,
                                   const TensorView * /*out_t*/, ScratchPlan * /*plan*/) const {}
  virtual void plan_block_quantize(const TensorView & /*x*/, ScratchPlan * /*plan*/) const {}
  // The scratch an activation source of an item of `kind` takes (x: the item's x).
  void plan_quantize_source(QuantizeItem::Kind kind, const TensorView &x, ScratchPlan *plan) const;
  virtual void plan_bias_grad(const TensorView & /*dy*/, ScratchPlan * /*plan*/) const {}
  // What activation_forward (backward = false) or activation_backward of x takes from the cache.
  virtual void plan_activation(Activation /*act*/, const TensorView & /*x*/, bool /*backward*/,
                               ScratchPlan * /*plan*/) const {}
  virtual void plan_norm_forward(const NormForwardArgs & /*args*/, ScratchPlan * /*plan*/) const {}
  virtual void plan_embedding_backward(const EmbeddingBackwardArgs & /*args*/, ScratchPlan * /*plan*/) const {}
  virtual void plan_cross_entropy(const CrossEntropyArgs & /*args*/, ScratchPlan * /*plan*/) const {}
  virtual void plan_adamw(const AdamwArgs & /*args*/, ScratchPlan * /*plan*/) const {}
  virtual void plan_norm_backward(const NormBackwardArgs & /*args*/, ScratchPlan * /*plan*/) const {}
  virtual void plan_attention_forward(const AttentionForwardArgs & /*args*/, ScratchPlan * /*plan*/) const {}
  virtual void plan_attention_backward(const AttentionBackwardArgs & /*args*/, ScratchPlan * /*plan*/) const {}
  // Makes the cache hold every block of `plan` at once; afterwards the planned calls allocate
  // nothing. Throws OutOfMemory (and then nothing changed).
  virtual void reserve(const ScratchPlan & /*plan*/) {}

  // ---- scaling-state maintenance ----
  // packed[i] = items[i].history[0]: the one contiguous buffer a group all-reduces.
  virtual void gather_amax(const ScaleUpdateItem *items, int n, float *packed) = 0;
  // delayed_scale_update for every item in one pass (one launch on CUDA); reduced_amax, when
  // not null, holds the all-reduced amax of item i at [i].
  virtual void scale_update(const ScaleUpdateItem *items, int n, const float *reduced_amax) = 0;
};

std::unique_ptr<Backend> make_cpu_backend();
// Throws Unsupported when libte was built without CUDA or the device is unusable.
std::unique_ptr<Backend> make_cuda_backend(int device_index);
bool cuda_backend_available();

// RAII for one backend allocation.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend *be, size_t bytes) : be_(be), bytes_(bytes), ptr_(bytes ? be->alloc(bytes) : nullptr) {}
  // Memory someone else owns (a caller's residual block): reset() forgets it, frees nothing.
  static Buffer borrowed(void *ptr, size_t bytes) {
    Buffer b;
    b.bytes_ = bytes;
    b.ptr_ = ptr;
    return b;
  }
  ~Buffer() { reset(); }
  Buffer(Buffer &&o) noexcept : be_(o.be_), bytes_(o.bytes_), ptr_(o.ptr_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  Buffer &operator=(Buffer &&o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_; bytes_ = o.bytes_; ptr_ = o.ptr_;
      o.ptr_ = nullptr; o.bytes_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  void reset() {
    if (ptr_ && be_) be_->free(ptr_, bytes_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void *get() const { return ptr_; }
  float *floats() const { return static_cast<float *>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  Backend *be_ = nullptr;
  size_t bytes_ = 0;
  void *ptr_ = nullptr;
};

}  // namespace te
