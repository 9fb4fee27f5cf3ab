// Quantizing a high-precision matrix the way a recipe says, into the row-wise copy and/or the
// column-wise (transposed) copy that FP8 GEMMs consume. Storage is allocated first
// (QuantizedMatrix::allocate) and filled second (quantize), so a failed allocation changes nothing.
#pragma once

#include "backends/backend.h"
#include "dist/group.h"
#include "scaling/recipe.h"
#include "scaling/scaling_state.h"

namespace te {

// What a tensor is to a GEMM decides its block shape: weights use 128x128 tiles, activations
// and gradients 1x128 rows.
enum class TensorKind : int { Activation = 0, Weight = 1, Gradient = 2 };

ScalingMode scaling_mode_for(const Recipe &recipe, TensorKind kind);

struct QuantizedMatrix {
  Buffer data, data_t, scale_inv, scale_inv_t;
  TensorView row;  // [rows, cols]; data == nullptr when not requested
  TensorView col;  // [cols, rows]; data == nullptr when not requested

  void allocate(Backend &be, ScalingMode mode, DType dtype, int64_t rows, int64_t cols, bool want_row, bool want_col);
};

struct QuantizeRequest {
  const Recipe *recipe = nullptr;
  const Group *group = nullptr;       // current scaling reduces the amax over it
  ScalingState *state = nullptr;      // prepared for recipe and dtype
  const float *scale = nullptr;       // delayed: overrides state->scale() (backward snapshots)
  bool record_amax = true;            // delayed: max-accumulate amax into state->amax()
  float *scale_copy = nullptr;        // delayed: the scale used is also copied here (a snapshot)
  TensorView dbias;                   // optional: x's column sums too (x is a dy, this its bias grad)
  // Optional: x is an activation's output or gradient (backend.h), made inside the cast where the
  // backend fuses it; x then gives the shape and dtype only. Not with a group-reduced current
  // scaling (its amax is all-reduced between two passes over x).
  ActivationSource source;
};

// Whether a module should hand `be` an activation's output to quantize as an ActivationSource (the
// activation made inside the cast, never stored): where the backend fuses the recipe's kind, and
// not under a current scaling whose amax is all-reduced over `group` (that cast runs alone).
bool activation_in_cast(const Backend &be, const Recipe &recipe, const Group *group);

// x: high precision [rows, cols]; out allocated by QuantizedMatrix::allocate.
void quantize(Backend &be, const QuantizeRequest &req, const TensorView &x, QuantizedMatrix &out);
// quantize for n (request, x, out) triples at once: the same results, in fewer launches
// (Backend::quantize_many). Current scaling that reduces its amax over a group runs alone.
void quantize_many(Backend &be, const QuantizeRequest *reqs, const TensorView *xs, QuantizedMatrix *const *outs,
                   int n);
// Requests gathered for quantize_many, up to N per call: add() appends what fill(reqs, xs, outs)
// writes (at most `most` entries, which stay in one call), flush() sends what is left.
template <int N>
class QuantizeBatch {
 public:
  explicit QuantizeBatch(Backend &be) : be_(be) {}
  template <class Fill>
  void add(int most, Fill fill) {
    if (n_ + most > N) flush();
    n_ += fill(reqs_ + n_, xs_ + n_, outs_ + n_);
  }
  void flush() {
    if (n_) quantize_many(be_, reqs_, xs_, outs_, n_);
    n_ = 0;
  }

 private:
  Backend &be_;
  QuantizeRequest reqs_[N];
  TensorView xs_[N];
  QuantizedMatrix *outs_[N];
  int n_ = 0;
};

// Adds the scratch that quantize(be, req, x, out) takes to *plan.
void plan_quantize(const Backend &be, const QuantizeRequest &req, const TensorView &x, const QuantizedMatrix &out,
                   ScratchPlan *plan);

}  // namespace te
