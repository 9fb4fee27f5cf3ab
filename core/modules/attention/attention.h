// Attention: O = softmax(scale * Q K^T + mask) V (TE's DotProductAttention) with Linear's
// compute / save / backward split. Parameters-free: the module holds its options and, for FP8
// attention, the scaling states of Q, K, V, the softmax output S, and in backward dO and dS.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "modules/common/object_pool.h"
#include "modules/common/residual_memory.h"
#include "modules/projection/projection.h"

namespace te {

struct AttentionOptions {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  float softmax_scale = 1.0f;
  AttnMask mask = AttnMask::None;
  DType activation_dtype = DType::BF16;
  bool fp8 = false;
};

enum class AttnTensor : int { Q = 0, K = 1, V = 2, S = 3, DO = 4, DP = 5 };
constexpr int kAttnStates = 6;

struct AttentionCore {
  AttentionCore(Context &ctx, const AttentionOptions &o) : ctx_ref(&ctx), ctx(ctx), opts(o) {}
  ~AttentionCore() {
    for (ScalingState &s : states) ctx.autocast().forget(&s);
  }
  ContextRef ctx_ref;  // first member, so released last: the states below free into ctx
  Context &ctx;
  AttentionOptions opts;
  ScalingState states[kAttnStates];
  ScalingState &state(AttnTensor t) { return states[static_cast<int>(t)]; }
  // P's scale and scale_inv on the device (from its bound amax 1) for these recipe options:
  // computed at their first sight and never rewritten, so a forward launches nothing for it and
  // a pending backward reads its forward's pair through a plain pointer. May throw (allocation,
  // launch) with nothing changed.
  const float *p_scale(Backend &be, const RecipeOptions &ro);

 private:
  struct PScale {
    bool power_of_2 = false;
    float epsilon = 0.0f;
    Buffer floats;  // [1 (the bound amax), scale, scale_inv]
  };
  std::vector<PScale> p_scales_;  // one per option pair seen: a handful at most
};

void attention_record_destroy(void *record);

class Attention : public Handle {
 public:
  Attention(Context &ctx, const AttentionOptions &o)
      : Handle(HandleKind::Attention), core_(std::make_shared<AttentionCore>(ctx, o)),
        records_(&attention_record_destroy) {}
  const std::shared_ptr<AttentionCore> &core() const { return core_; }
  ResidualRecords &records() { return records_; }

 private:
  std::shared_ptr<AttentionCore> core_;
  ResidualRecords records_;  // destroyed first: its contexts share core_
};

// What the forward takes (te_attention_forward_args): q, k, v and, for THD, the offsets.
struct AttentionInputs {
  TensorView q, k, v;
  TensorView cu_seqlens_q, cu_seqlens_kv;  // ndim == 0: BSHD (data == nullptr with ndim > 0: shapes only)
  int64_t max_seqlen_q = 0, max_seqlen_kv = 0;
};

// The residuals of one forward.
struct AttentionSaved : Handle {
  AttentionSaved() : Handle(HandleKind::AttentionResiduals) {}
  ContextRef ctx;
  std::shared_ptr<AttentionCore> layer;
  RecipeRef recipe;
  GroupRef group;
  PassTicket ticket;
  bool fp8 = false;
  AttentionDims dims;               // its offsets point at the caller's cu_seqlens
  TensorView q, k, v, o;            // FP8: q, k, v view q8/k8/v8; else the caller's
  QuantizedMatrix q8, k8, v8;       // FP8 only
  Buffer lse;                       // F32 [tokens_q, heads]
  const float *s_scale = nullptr;   // FP8: the forward's S scale and scale_inv (layer->p_scale)
  // Delayed scaling: dO's and dS's scale and scale_inv at the first backward, so that a repeated
  // backward quantizes identically after the pass's update has moved the states.
  Buffer grad_scales;
  bool grad_scales_taken = false;
  void clear();
};

struct AttentionBackwardCtx : Handle {
  AttentionBackwardCtx() : Handle(HandleKind::AttentionBackwardCtx) {}
  ContextRef ctx;
  AttentionSaved *saved = nullptr;  // owned; null once released (TE_BACKWARD_ONCE)
  void clear();
};

struct AttentionPools : ModuleState {
  ObjectPool<AttentionSaved> saved;
  ObjectPool<AttentionBackwardCtx> backward;
};
AttentionPools &attention_pools(Context &ctx);

// The forward's checks (arguments named "<prefix>->q" etc.); returns the call's dims. o may be
// empty (not checked). Reads CPU offsets to validate them.
AttentionDims attention_validate(Context &ctx, const AttentionOptions &o, const AttentionInputs &in,
                                 const TensorView &out, const char *prefix);

AttentionSaved *attention_forward_compute(Context &ctx, Attention &m, const AttentionInputs &in, const TensorView &o);

struct AttentionGrads {
  TensorView dq, dk, dv;  // data == nullptr: not wanted
};

void attention_backward(Context &ctx, AttentionBackwardCtx &bwd, const TensorView &d_o, const AttentionGrads &g,
                        bool once);

size_t attention_residual_bytes(Context &ctx, const Attention &m, const AttentionDims &dims);
void attention_forward_compute_into(Context &ctx, Attention &m, const AttentionInputs &in, const TensorView &o,
                                    void *block, size_t bytes);
void attention_backward_from(Context &ctx, Attention &m, const AttentionInputs &in, const TensorView &o,
                             const void *block, size_t bytes, const TensorView &d_o, const AttentionGrads &g,
                             bool once);

size_t attention_state_size(Context &ctx, const Attention &m);
void attention_state_save(Context &ctx, const Attention &m, void *buf, size_t capacity);
void attention_state_load(Context &ctx, Attention &m, const void *buf, size_t size);

// RoPE (te_rope_forward/backward): validates and runs; inverse = backward.
struct RopeCall {
  TensorView x, y, freqs, cu_seqlens;
  int64_t rot_dim = 0;  // 0: head_dim
  bool interleaved = false;
  bool inverse = false;
  const char *x_name = "x", *y_name = "y";
};
void rope_run(Context &ctx, const RopeCall &call);

}  // namespace te
