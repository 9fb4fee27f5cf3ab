// The FP8 linear layer: y = x W^T + b with the forward split into a pure compute step and a
// context-saving step (as TE's PRs 2811/2967 split _Linear), and a backward that can run again
// until its context is destroyed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "context/context.h"
#include "base/handle.h"
#include "modules/common/object_pool.h"
#include "modules/common/residual_memory.h"
#include "modules/projection/projection.h"

namespace te {

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  DType activation_dtype = DType::BF16;
  bool fuse_wgrad_accumulation = false;
};

// Everything of a layer that outlives one call. Backward contexts share it, so destroying the
// layer's handle while a backward is pending is safe.
struct LinearCore {
  LinearCore(Context &ctx, const LinearOptions &o) : ctx_ref(&ctx), ctx(ctx), opts(o) {}
  ~LinearCore() { proj.forget(ctx.autocast()); }
  ContextRef ctx_ref;  // first member, so released last: the states below free into ctx
  Context &ctx;
  LinearOptions opts;
  ProjectionState proj;
  ScalingState &state(TensorRole r) { return proj.state(r); }
  const ScalingState &state(TensorRole r) const { return proj.state(r); }
};

// Frees a record of Linear::records() (a LinearBackwardCtx).
void linear_record_destroy(void *record);

class Linear : public Handle {
 public:
  Linear(Context &ctx, const LinearOptions &o);
  const std::shared_ptr<LinearCore> &core() const { return core_; }
  const LinearOptions &options() const { return core_->opts; }
  // Backward contexts of FP8 forwards whose residuals live in the caller's memory.
  ResidualRecords &records() { return records_; }

 private:
  std::shared_ptr<LinearCore> core_;
  ResidualRecords records_;  // destroyed first: its contexts share core_
};

struct LinearForwardArgs {
  TensorView input, weight, bias;  // bias.data == nullptr: none
  bool weight_unchanged = false;
};

class LinearObjectPool;

// What forward_compute leaves for backward. Owned by the caller's residuals struct until saved;
// the struct's `internal` is this object's handle (kind Residuals), retired when the residuals
// are saved or released, so a copy of the struct cannot save or free them a second time.
// Objects come from the context's LinearObjectPool and go back to it, so a training step makes
// no heap allocation.
struct LinearSaved : Handle {
  LinearSaved() : Handle(HandleKind::Residuals) {}
  LinearObjectPool *pool = nullptr;
  ContextRef ctx;  // while handed out: the pool lives in the context
  std::shared_ptr<LinearCore> layer;
  RecipeRef recipe;
  GroupRef group;
  PassTicket ticket;
  ProjectionSaved proj;
  void clear();
};

// Returns a LinearSaved to its pool.
struct SavedRecycler {
  void operator()(LinearSaved *s) const;
};
using SavedPtr = std::unique_ptr<LinearSaved, SavedRecycler>;

// The forward's argument checks (INVALID_ARGUMENT naming the argument).
void linear_validate_forward(Context &ctx, const LinearOptions &o, const LinearForwardArgs &a, const TensorView &y);

// Fills y and *saved (a LinearSaved the caller owns); on failure nothing changed.
void linear_forward_compute(Context &ctx, Linear &lin, const LinearForwardArgs &args, const TensorView &y,
                            SavedPtr &saved, TensorView *input_t, TensorView *weight_t);

class LinearBackwardCtx : public Handle {
 public:
  LinearBackwardCtx() : Handle(HandleKind::BackwardCtx) {}
  ContextRef ctx;  // while handed out: the pool lives in the context
  SavedPtr saved;  // null once released (TE_BACKWARD_ONCE)
  void clear() { saved.reset(); }
};

// The context's pools of residuals and backward contexts.
class LinearObjectPool : public ModuleState {
 public:
  SavedPtr acquire_saved(Context &ctx);
  LinearBackwardCtx *acquire_backward_ctx(Context &ctx) { return backward_.acquire(ctx); }
  void release(LinearSaved *s) { saved_.release(s); }
  void release(LinearBackwardCtx *b) { backward_.release(b); }

 private:
  ObjectPool<LinearSaved> saved_;  // before backward_: a backward context returns its residuals here
  ObjectPool<LinearBackwardCtx> backward_;
};

// The context's pool, made on first use (which may throw OutOfMemory, before anything changed).
LinearObjectPool &linear_pool(Context &ctx);

struct LinearBackwardArgs {
  TensorView dy, dx, dw, db;  // data == nullptr: not requested
  bool once = false;
};

void linear_backward(Context &ctx, LinearBackwardCtx &bwd, const LinearBackwardArgs &args);

// Residuals in the caller's memory (te_linear_residuals_size / _forward_compute_into /
// _backward_from): the bytes a forward of `tokens` rows leaves under the innermost scope now (0
// in high precision), the forward that moves them into `block`, and the backward that finds
// them there. `inputs` of the backward: x and W again (needed in high precision only).
size_t linear_residual_bytes(Context &ctx, const Linear &lin, int64_t tokens);
void linear_forward_compute_into(Context &ctx, Linear &lin, const LinearForwardArgs &args, const TensorView &y,
                                 void *block, size_t bytes);
void linear_backward_from(Context &ctx, Linear &lin, const LinearForwardArgs *inputs, const void *block,
                          size_t bytes, const LinearBackwardArgs &args);

// Versioned, bit-exact serialisation of the layer's scaling states.
size_t linear_state_size(Context &ctx, const Linear &lin);
void linear_state_save(Context &ctx, const Linear &lin, void *buf, size_t capacity);
void linear_state_load(Context &ctx, Linear &lin, const void *buf, size_t size);

}  // namespace te
