// GroupedLinear: num_gemms experts sharing in/out features (TE's GroupedLinear, a mixture of
// experts). A call splits the input's rows into consecutive groups of m_splits[i] tokens and
// runs group i through expert i's projection: y_i = x_i W_i^T + b_i. The module's forward is
// one module of its autocast pass (one ticket), so a pass still makes one amax reduction and one
// scale update per bucket however many experts there are.
//
// Every expert's step is constructed (allocating, staging, planning its scratch) before any is
// committed, so the strong guarantee holds for the whole call. Under FP8 an expert whose tokens
// are not a multiple of 16 runs on a zero-padded copy of its rows (expert_rows.h); zero rows
// change no amax and add nothing to dW or db.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "modules/common/object_pool.h"
#include "modules/common/residual_memory.h"
#include "modules/grouped_linear/expert_rows.h"
#include "modules/projection/projection.h"

namespace te {

constexpr int kGroupedLinearMaxGemms = 1024;

struct GroupedLinearOptions {
  int num_gemms = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  DType activation_dtype = DType::BF16;
  bool fuse_wgrad_accumulation = false;
};

// Host storage for one call, sized for num_gemms when the layer is made, so that a call makes
// no host allocation. A call is not reentrant (a context and its layers belong to one thread),
// and forward and backward have their own steps.
struct GroupedLinearCallStorage {
  explicit GroupedLinearCallStorage(int n);
  std::vector<TensorView> weights, biases;  // forward: the caller's W_i and b_i
  std::vector<TensorView> dw, db;           // backward: the caller's dW_i and db_i
  std::vector<ExpertRows> rows;
  std::vector<std::optional<ProjectionForward>> forward;
  std::vector<std::optional<ProjectionBackward>> backward;
  // The steps of the experts that got tokens, in order, for run_all.
  std::vector<ProjectionForward *> forward_running;
  std::vector<ProjectionBackward *> backward_running;
  std::vector<ByteRange> zero_ranges;  // backward: dW_i and db_i of the experts without tokens
};

// Everything of a layer that outlives one call; backward contexts share it.
struct GroupedLinearCore {
  GroupedLinearCore(Context &ctx, const GroupedLinearOptions &o);
  ~GroupedLinearCore();
  ContextRef ctx_ref;  // first member, so released last: the states below free into ctx
  Context &ctx;
  GroupedLinearOptions opts;
  // One per expert; never resized, so the autocast buckets' pointers to the states stay valid.
  std::vector<ProjectionState> experts;
  GroupedLinearCallStorage call;
};

// Frees a record of GroupedLinear::records() (a GroupedLinearBackwardCtx).
void grouped_linear_record_destroy(void *record);

class GroupedLinear : public Handle {
 public:
  GroupedLinear(Context &ctx, const GroupedLinearOptions &o)
      : Handle(HandleKind::GroupedLinear),
        core_(std::make_shared<GroupedLinearCore>(ctx, o)),
        records_(&grouped_linear_record_destroy) {}
  const std::shared_ptr<GroupedLinearCore> &core() const { return core_; }
  const GroupedLinearOptions &options() const { return core_->opts; }
  // Backward contexts of FP8 forwards whose residuals live in the caller's memory.
  ResidualRecords &records() { return records_; }

 private:
  std::shared_ptr<GroupedLinearCore> core_;
  ResidualRecords records_;  // destroyed first: its contexts share core_
};

// The per-expert tensors point into the layer's call storage (core().call.weights/biases),
// which the shim fills.
struct GroupedLinearForwardArgs {
  TensorView input;
  const int64_t *m_splits = nullptr;  // host array [num_gemms]
  const TensorView *weights = nullptr;
  const TensorView *biases = nullptr;  // nullptr: none
  bool weight_unchanged = false;
};

// The residuals of one forward; pooled like LinearSaved (linear.h). The vectors keep their
// capacity in the pool, so after warm-up a forward allocates no host memory for them.
struct GroupedLinearSaved : Handle {
  GroupedLinearSaved() : Handle(HandleKind::GroupedLinearResiduals) {}
  ContextRef ctx;
  std::shared_ptr<GroupedLinearCore> layer;
  RecipeRef recipe;
  GroupRef group;
  PassTicket ticket;
  bool fp8 = false;
  int64_t tokens = 0;                    // rows of x
  std::vector<int64_t> splits;           // m_splits as the forward got them
  std::vector<ProjectionSaved> experts;  // tokens 0 for an expert that got none
  void clear();
};

struct GroupedLinearBackwardCtx : Handle {
  GroupedLinearBackwardCtx() : Handle(HandleKind::GroupedLinearBackwardCtx) {}
  ContextRef ctx;
  GroupedLinearSaved *saved = nullptr;  // owned; null once released (TE_BACKWARD_ONCE)
  void clear();
};

struct GroupedLinearPools : ModuleState {
  ObjectPool<GroupedLinearSaved> saved;  // before backward: a backward context returns its residuals here
  ObjectPool<GroupedLinearBackwardCtx> backward;
};
GroupedLinearPools &grouped_linear_pools(Context &ctx);

// The forward's argument checks, naming the arguments "<prefix>->input" etc. ("args" in the
// forward, "inputs" in backward_from, which passes an empty y: not checked).
void grouped_linear_validate_splits(const int64_t *splits, int n, int64_t rows, const char *prefix);
void grouped_linear_validate(Context &ctx, const GroupedLinearOptions &o, const GroupedLinearForwardArgs &a,
                             const TensorView &y, const char *prefix);

// Fills y and returns the residuals (owned by the caller); nothing changes on failure.
GroupedLinearSaved *grouped_linear_forward_compute(Context &ctx, GroupedLinear &g, const GroupedLinearForwardArgs &args,
                                                   const TensorView &y);

// dw and db point into the layer's call storage (core().call.dw/db) or are nullptr (not
// requested); dx.data == nullptr: not requested.
struct GroupedLinearBackwardArgs {
  TensorView dy, dx;
  const TensorView *dw = nullptr;
  const TensorView *db = nullptr;
  bool once = false;
};

void grouped_linear_backward(Context &ctx, GroupedLinearBackwardCtx &bwd, const GroupedLinearBackwardArgs &args);

// Residuals in the caller's memory (as linear.h's): under FP8 the block holds every expert's
// x^T (of its rows zero-padded to a multiple of 16) with its scale_inv, experts without tokens
// nothing; high precision leaves nothing (0 bytes) and the backward reads x and the W_i again
// from `inputs`. `splits` were validated.
size_t grouped_linear_residual_bytes(Context &ctx, const GroupedLinear &g, const int64_t *splits);
void grouped_linear_forward_compute_into(Context &ctx, GroupedLinear &g, const GroupedLinearForwardArgs &args,
                                         const TensorView &y, void *block, size_t bytes);
void grouped_linear_backward_from(Context &ctx, GroupedLinear &g, const GroupedLinearForwardArgs *inputs,
                                  const void *block, size_t bytes, const GroupedLinearBackwardArgs &args);

// Versioned, bit-exact serialisation of every expert's scaling states (magic "TEGL", shape
// [num_gemms, in, out], expert-major: expert i's input, weight, grad_output).
size_t grouped_linear_state_size(const GroupedLinear &g);
void grouped_linear_state_save(Context &ctx, const GroupedLinear &g, void *buf, size_t capacity);
void grouped_linear_state_load(Context &ctx, GroupedLinear &g, const void *buf, size_t size);

}  // namespace te
