// LayerNormLinear: y = norm(x) W^T + b (TE's LayerNormLinear, a transformer's QKV projection):
// a norm stage feeding one projection, with the compute / save / backward split of Linear.
#pragma once

#include <cstdint>
#include <memory>

#include "modules/common/object_pool.h"
#include "modules/common/residual_memory.h"
#include "modules/norm/norm_stage.h"
#include "modules/projection/projection.h"

namespace te {

struct LayerNormLinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  DType activation_dtype = DType::BF16;
  bool fuse_wgrad_accumulation = false;
  NormOptions norm;
};

struct LayerNormLinearCore {
  LayerNormLinearCore(Context &ctx, const LayerNormLinearOptions &o) : ctx_ref(&ctx), ctx(ctx), opts(o) {}
  ~LayerNormLinearCore() { proj.forget(ctx.autocast()); }
  ContextRef ctx_ref;  // first member, so released last: the states below free into ctx
  Context &ctx;
  LayerNormLinearOptions opts;
  ProjectionState proj;
};

// Frees a record of LayerNormLinear::records() (a LayerNormLinearBackwardCtx).
void layernorm_linear_record_destroy(void *record);

class LayerNormLinear : public Handle {
 public:
  LayerNormLinear(Context &ctx, const LayerNormLinearOptions &o)
      : Handle(HandleKind::LayerNormLinear),
        core_(std::make_shared<LayerNormLinearCore>(ctx, o)),
        records_(&layernorm_linear_record_destroy) {}
  const std::shared_ptr<LayerNormLinearCore> &core() const { return core_; }
  // Backward contexts of forwards whose residuals live in the caller's memory.
  ResidualRecords &records() { return records_; }

 private:
  std::shared_ptr<LayerNormLinearCore> core_;
  ResidualRecords records_;  // destroyed first: its contexts share core_
};

struct LayerNormLinearForwardArgs {
  TensorView input, ln_weight, ln_bias, weight, bias;  // ln_bias, bias: data == nullptr when absent
  TensorView ln_out;                                   // optional output
  bool weight_unchanged = false;
};

// The residuals of one forward; pooled like LinearSaved (see linear.h).
struct LayerNormLinearSaved : Handle {
  LayerNormLinearSaved() : Handle(HandleKind::LayerNormLinearResiduals) {}
  ContextRef ctx;
  std::shared_ptr<LayerNormLinearCore> layer;
  RecipeRef recipe;
  GroupRef group;
  PassTicket ticket;
  NormSaved norm;
  ProjectionSaved proj;
  void clear();
};

struct LayerNormLinearBackwardCtx : Handle {
  LayerNormLinearBackwardCtx() : Handle(HandleKind::LayerNormLinearBackwardCtx) {}
  ContextRef ctx;
  LayerNormLinearSaved *saved = nullptr;  // owned; null once released (TE_BACKWARD_ONCE)
  void clear();
};

struct LayerNormLinearPools : ModuleState {
  ObjectPool<LayerNormLinearSaved> saved;  // before backward: a backward context returns its residuals here
  ObjectPool<LayerNormLinearBackwardCtx> backward;
};
LayerNormLinearPools &layernorm_linear_pools(Context &ctx);

// The forward's argument checks, naming the arguments "<prefix>->input" etc. ("args" in the
// forward, "inputs" in backward_from, which passes an empty y: not checked).
void layernorm_linear_validate(Context &ctx, const LayerNormLinearOptions &o, const LayerNormLinearForwardArgs &a,
                               const TensorView &y, const char *prefix);

// Fills y (and ln_out) and returns the residuals (owned by the caller); nothing changes on failure.
LayerNormLinearSaved *layernorm_linear_forward_compute(Context &ctx, LayerNormLinear &m,
                                                       const LayerNormLinearForwardArgs &args, const TensorView &y);

struct LayerNormLinearGrads {
  TensorView dx, dgamma, dbeta, dw, db;  // data == nullptr: not requested
};

void layernorm_linear_backward(Context &ctx, LayerNormLinearBackwardCtx &bwd, const TensorView &dy,
                               const LayerNormLinearGrads &g, bool once);

// Residuals in the caller's memory (te_layernorm_linear_residuals_size / _forward_compute_into /
// _backward_from, as linear.h's): the block holds mu (LayerNorm) and rsigma, and FP8: the
// normalised x^T and its scale_inv; high precision: the normalised x. The backward re-points the
// saved views of x, gamma (and W in high precision) to `inputs`, which it requires.
size_t layernorm_linear_residual_bytes(Context &ctx, const LayerNormLinear &m, int64_t tokens);
void layernorm_linear_forward_compute_into(Context &ctx, LayerNormLinear &m, const LayerNormLinearForwardArgs &args,
                                           const TensorView &y, void *block, size_t bytes);
void layernorm_linear_backward_from(Context &ctx, LayerNormLinear &m, const LayerNormLinearForwardArgs *inputs,
                                    const void *block, size_t bytes, const TensorView &dy,
                                    const LayerNormLinearGrads &g, bool once);

size_t layernorm_linear_state_size(Context &ctx, const LayerNormLinear &m);
void layernorm_linear_state_save(Context &ctx, const LayerNormLinear &m, void *buf, size_t capacity);
void layernorm_linear_state_load(Context &ctx, LayerNormLinear &m, const void *buf, size_t size);

}  // namespace te
