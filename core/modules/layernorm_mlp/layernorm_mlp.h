// LayerNormMLP: y = fc2(act(fc1(norm(x)))) (TE's LayerNormMLP, a transformer's feed-forward
// block): a norm stage, two projections and the activation between them, with the compute /
// save / backward split of Linear. fc1's output (the activation's input) is kept for the
// backward in the activation dtype.
#pragma once

#include <cstdint>
#include <memory>

#include "modules/common/object_pool.h"
#include "modules/common/residual_memory.h"
#include "modules/norm/norm_stage.h"
#include "modules/projection/projection.h"

namespace te {

struct LayerNormMlpOptions {
  int64_t hidden = 0;
  int64_t ffn = 0;
  bool bias = true;
  Activation activation = Activation::GELU;
  DType activation_dtype = DType::BF16;
  bool fuse_wgrad_accumulation = false;
  NormOptions norm;
  // fc1's output width: 2 * ffn for the gated activations.
  int64_t fc1_out() const { return is_gated(activation) ? 2 * ffn : ffn; }
};

struct LayerNormMlpCore {
  LayerNormMlpCore(Context &ctx, const LayerNormMlpOptions &o) : ctx_ref(&ctx), ctx(ctx), opts(o) {}
  ~LayerNormMlpCore() {
    fc1.forget(ctx.autocast());
    fc2.forget(ctx.autocast());
  }
  ContextRef ctx_ref;  // first member, so released last: the states below free into ctx
  Context &ctx;
  LayerNormMlpOptions opts;
  ProjectionState fc1, fc2;
};

// Frees a record of LayerNormMlp::records() (a LayerNormMlpBackwardCtx).
void layernorm_mlp_record_destroy(void *record);

class LayerNormMlp : public Handle {
 public:
  LayerNormMlp(Context &ctx, const LayerNormMlpOptions &o)
      : Handle(HandleKind::LayerNormMlp),
        core_(std::make_shared<LayerNormMlpCore>(ctx, o)),
        records_(&layernorm_mlp_record_destroy) {}
  const std::shared_ptr<LayerNormMlpCore> &core() const { return core_; }
  // Backward contexts of forwards whose residuals live in the caller's memory.
  ResidualRecords &records() { return records_; }

 private:
  std::shared_ptr<LayerNormMlpCore> core_;
  ResidualRecords records_;  // destroyed first: its contexts share core_
};

struct LayerNormMlpForwardArgs {
  TensorView input, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
  TensorView ln_out;  // optional output
  bool weight_unchanged = false;
};

struct LayerNormMlpSaved : Handle {
  LayerNormMlpSaved() : Handle(HandleKind::LayerNormMlpResiduals) {}
  ContextRef ctx;
  std::shared_ptr<LayerNormMlpCore> layer;
  RecipeRef recipe;
  GroupRef group;
  PassTicket ticket;
  NormSaved norm;
  ProjectionSaved fc1, fc2;
  Buffer fc1_out;  // [tokens, fc1_out], the activation's input
  Buffer act_out;  // [tokens, ffn] high precision: fc2's residual outside FP8
  void clear();
};

struct LayerNormMlpBackwardCtx : Handle {
  LayerNormMlpBackwardCtx() : Handle(HandleKind::LayerNormMlpBackwardCtx) {}
  ContextRef ctx;
  LayerNormMlpSaved *saved = nullptr;  // owned; null once released (TE_BACKWARD_ONCE)
  void clear();
};

struct LayerNormMlpPools : ModuleState {
  ObjectPool<LayerNormMlpSaved> saved;  // before backward: a backward context returns its residuals here
  ObjectPool<LayerNormMlpBackwardCtx> backward;
};
LayerNormMlpPools &layernorm_mlp_pools(Context &ctx);

// The forward's argument checks, naming the arguments "<prefix>->input" etc. ("args" in the
// forward, "inputs" in backward_from, which passes an empty y: not checked).
void layernorm_mlp_validate(Context &ctx, const LayerNormMlpOptions &o, const LayerNormMlpForwardArgs &a,
                            const TensorView &y, const char *prefix);

LayerNormMlpSaved *layernorm_mlp_forward_compute(Context &ctx, LayerNormMlp &m, const LayerNormMlpForwardArgs &args,
                                                 const TensorView &y);

struct LayerNormMlpGrads {
  TensorView dx, dgamma, dbeta, dfc1_w, dfc1_b, dfc2_w, dfc2_b;  // data == nullptr: not requested
};

void layernorm_mlp_backward(Context &ctx, LayerNormMlpBackwardCtx &bwd, const TensorView &dy,
                            const LayerNormMlpGrads &g, bool once);

// Residuals in the caller's memory (as linear.h's): the block holds mu (LayerNorm), rsigma and
// fc1's output; FP8: fc1's and fc2's x^T with their scale_invs; high precision: the normalised
// x and the activation's output. The backward re-points x, gamma (and both weights in high
// precision) to `inputs`, which it requires.
size_t layernorm_mlp_residual_bytes(Context &ctx, const LayerNormMlp &m, int64_t tokens);
void layernorm_mlp_forward_compute_into(Context &ctx, LayerNormMlp &m, const LayerNormMlpForwardArgs &args,
                                        const TensorView &y, void *block, size_t bytes);
void layernorm_mlp_backward_from(Context &ctx, LayerNormMlp &m, const LayerNormMlpForwardArgs *inputs,
                                 const void *block, size_t bytes, const TensorView &dy, const LayerNormMlpGrads &g,
                                 bool once);

size_t layernorm_mlp_state_size(Context &ctx, const LayerNormMlp &m);
void layernorm_mlp_state_save(Context &ctx, const LayerNormMlp &m, void *buf, size_t capacity);
void layernorm_mlp_state_load(Context &ctx, LayerNormMlp &m, const void *buf, size_t size);

}  // namespace te
