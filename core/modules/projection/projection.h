// A projection is one y = x W^T (+ b) inside a module: the GEMM every FP8 module is built from.
// Linear is one projection; LayerNormLinear is a norm feeding one; LayerNormMLP is two around an
// activation; GroupedLinear is one per expert. A projection owns the three scaling states of its
// GEMMs (input, weight, grad_output) and its FP8 weight cache; its forward and backward steps
// are split in phases so that a module running several of them keeps the strong guarantee:
//   1. construct the step: it allocates, stages its scaling states and adds its scratch to the
//      module's ScratchPlan (nothing changes; may throw);
//   2. the module reserves the plan and the autocast buckets' room (may throw);
//   3. commit() and run(): they change state and enqueue kernels, and cannot fail for lack of
//      memory.
#pragma once

#include <cstdint>
#include <memory>

#include "context/context.h"
#include "scaling/quantize.h"

namespace te {

enum class TensorRole : int { Input = 0, Weight = 1, GradOutput = 2 };

// The FP8 weight and its transpose as one forward quantized them. Shared with the residuals of
// every forward that used it; a refresh while it is shared makes a new one (copy on write).
struct WeightCache {
  QuantizedMatrix q;
  uint64_t recipe_key = 0;
  // What te_adamw_step needs to re-quantize the cache after an update exactly as the next
  // forward would: the recipe it was made under (retained: the caller may release it), and
  // whether its scale came from an amax all-reduced over a multi-rank group (current scaling),
  // which one rank cannot redo alone (such a cache is dropped instead; the forward recasts).
  RecipeRef recipe;
  bool group_reduced = false;
};

// What a projection keeps between calls; lives in its module's core.
struct ProjectionState {
  ScalingState input, weight, grad_output;
  std::shared_ptr<WeightCache> weight_cache;
  ScalingState &state(TensorRole r) { return r == TensorRole::Input ? input : r == TensorRole::Weight ? weight : grad_output; }
  const ScalingState &state(TensorRole r) const {
    return r == TensorRole::Input ? input : r == TensorRole::Weight ? weight : grad_output;
  }
  // Takes the states out of every autocast bucket (the module is going away).
  void forget(Autocast &ac);
};

// How a module's forward runs, decided once per call from the innermost autocast scope.
struct ForwardMode {
  bool fp8 = false;
  bool calibrating = false;  // high precision, amaxes recorded (delayed recipes)
  const Recipe *recipe = nullptr;
  const Group *group = nullptr;
  static ForwardMode of(const Autocast &ac);
  bool delayed() const { return recipe && recipe->kind() == RecipeKind::Delayed; }
};

// What one projection forward leaves for its backward.
struct ProjectionSaved {
  bool fp8 = false;
  QuantizedMatrix x;               // FP8: x^T in x.col
  std::shared_ptr<WeightCache> w;  // FP8: W^T in w->q.col
  TensorView x_hp, w_hp;           // high precision: x and W, referenced
  int64_t tokens = 0;
  // Delayed scaling: the dy scale of the first backward, so that a repeated backward quantizes
  // dy identically after the pass's update has moved the state's scale.
  Buffer grad_scale;
  bool grad_scale_taken = false;
  void clear();
};

// GEMMs per gemm_many call of run_all (GroupedLinear's experts): the CUDA backend runs up to 32
// small ones in one launch.
constexpr int kProjectionGemmBatch = 32;

struct ProjectionDims {
  int64_t tokens = 0, in = 0, out = 0;
  bool tokens_vary = false;  // from call to call (an expert's share): GemmArgs::shape_varies
};

// One forward: y[tokens, out] = x[tokens, in] W^T (+ bias).
class ProjectionForward {
 public:
  // x: the high-precision input. In FP8 mode with `external_input`, x may be empty: the module
  // writes the FP8 input itself between commit() and run() (a norm fused with the cast), into
  // input() with input_state()'s scale and amax. `padded_tokens` >= dims.tokens rows of the FP8
  // input are allocated (GroupedLinear pads each expert's tokens to 16; the pad rows must be
  // written as zeros by the quantization). `x_source` (FP8 only): x is an activation's output,
  // made in the cast of x where the backend fuses it (x: its shape and dtype; ActivationSource).
  ProjectionForward(Context &ctx, ProjectionState &st, const ForwardMode &mode, const ProjectionDims &dims,
                    const TensorView &x, bool external_input, const TensorView &w, const TensorView &bias,
                    const TensorView &y, bool weight_unchanged, ScratchPlan *plan,
                    const ActivationSource &x_source = ActivationSource());
  // Scaling states the step registers into the forward bucket (reserve_forward's n).
  int states_to_register() const { return mode_.delayed() && (mode_.fp8 || mode_.calibrating) ? 2 : 0; }
  void commit();
  QuantizedMatrix &input() { return xq_; }
  ScalingState &input_state() { return st_.input; }
  // Has this step's run() also quantize `later`'s weight, in the same backend call as its own
  // input and weight (a module's projections under one autocast scope: LayerNormMLP casts fc2's
  // weight with fc1's; at small shapes each launch is the cost). later.run() then skips it.
  // Nothing to do outside FP8. Before either step runs.
  void quantize_weight_of(ProjectionForward &later);
  // Quantizes what it must, runs the GEMM, registers the states (the module has entered the
  // pass with Autocast::enter_module).
  void run();
  // run() on each of n independent steps of one module (their inputs written, no step's output
  // read by another), in order: the same results, with the quantizations sharing backend calls
  // and the GEMMs going through gemm_many (GroupedLinear's experts: at small shapes each launch is
  // the cost).
  static void run_all(ProjectionForward *const *steps, int n);
  // Moves the residuals into *out.
  void save(ProjectionSaved *out);

 private:
  Context &ctx_;
  ProjectionState &st_;
  ForwardMode mode_;
  ProjectionDims dims_;
  TensorView x_, w_, bias_, y_;
  bool external_;
  ActivationSource x_source_;
  bool reuse_weight_ = false;
  ProjectionForward *weight_of_ = nullptr;  // quantize_weight_of's step
  bool weight_quantized_elsewhere_ = false;
  // Makes the freshly quantized weight the projection's cache.
  void adopt_weight();
  // run()'s parts. FP8: what to quantize (up to kMaxQuantizeItems entries; returns how many) and,
  // once that is enqueued, the weight-cache bookkeeping. High precision: the calibration amaxes
  // (delayed recipes). Then the states into the forward bucket.
  static constexpr int kMaxQuantizeItems = 3;
  int quantize_items(QuantizeRequest *reqs, TensorView *xs, QuantizedMatrix **outs);
  void after_quantize();
  void calibrate();
  void register_states();
  QuantizedMatrix xq_;
  std::shared_ptr<WeightCache> wc_;
  ScalingState::Staged staged_in_, staged_w_;
  GemmArgs fprop_;
};

struct ProjectionGrads {
  TensorView dx, dw, db;  // data == nullptr: not requested; dx [tokens, in], dw [out, in], db [out]
};

// One backward from dy [tokens, out]. `dy_source` (FP8, dx or dW requested): dy is an
// activation's gradient, made in the cast of dy (dy: its shape and dtype; ActivationSource).
class ProjectionBackward {
 public:
  ProjectionBackward(Context &ctx, ProjectionState &st, ProjectionSaved &saved, const Recipe *recipe,
                     const Group *group, const ProjectionDims &dims, const TensorView &dy, const ProjectionGrads &g,
                     bool accumulate_dw, ScratchPlan *plan, const ActivationSource &dy_source = ActivationSource());
  // Backward-bucket states this step registers (reserve_backward's n).
  int states_to_register() const { return registers_ ? 1 : 0; }
  void commit();
  void run();
  // run() on each of n independent steps, in order: the same results, the dy quantizations
  // sharing backend calls and the GEMMs going through gemm_many (as ProjectionForward::run_all).
  static void run_all(ProjectionBackward *const *steps, int n);
  // Puts grad_output into the backward bucket of `pass` (after run).
  void register_state(uint64_t pass);

 private:
  Context &ctx_;
  ProjectionState &st_;
  ProjectionSaved &saved_;
  const Recipe *recipe_;
  const Group *group_;
  TensorView dy_;
  ActivationSource dy_source_;
  ProjectionGrads g_;
  bool registers_ = false, delayed_ = false;
  bool snapshot_pending_ = false;  // commit() took the gradient-scale snapshot's buffer; run() fills it
  bool quantizes() const;  // FP8 with dx or dW asked for: dy is quantized
  // run()'s parts: dy's quantization (quantizes() only) or the snapshot copy; the GEMMs (up to 2,
  // returns how many); the bias gradient when no cast took it.
  QuantizeRequest dy_request() const;
  void snapshot_without_cast();
  int gemms(GemmArgs *out) const;
  bool bias_grad_unfused() const { return g_.db.data && !quantizes(); }  // no cast computes db
  void unfused_bias_grad();
  QuantizedMatrix dyq_;
  Buffer grad_scale_;
  ScalingState::Staged staged_;
  GemmArgs dgrad_, wgrad_;
};

}  // namespace te
