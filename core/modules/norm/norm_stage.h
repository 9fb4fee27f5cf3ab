// The LayerNorm/RMSNorm in front of a module's first GEMM (LayerNormLinear, LayerNormMLP): its
// options, the arguments and residuals it keeps, and the backend calls it makes. Under FP8
// delayed scaling the norm writes the GEMM's FP8 input (and transpose, and amax) itself; in
// every other mode it writes the normalised values in high precision, which the GEMM quantizes
// or uses as they are.
#pragma once

#include "autocast/autocast.h"
#include "backends/backend.h"
#include "base/check.h"
#include "modules/projection/projection.h"

namespace te {

struct NormOptions {
  NormKind kind = NormKind::LayerNorm;
  float eps = 1e-5f;
  bool zero_centered_gamma = false;
};

// The norm's inputs as the caller passed them (validated by the module).
struct NormInputs {
  TensorView x;      // [tokens, hidden]
  TensorView gamma;  // [hidden]
  TensorView beta;   // [hidden] or empty (RMSNorm)
};

// What the norm's backward needs: the caller's x and gamma (referenced) and the statistics.
struct NormSaved {
  TensorView x, gamma;
  Buffer mu, rsigma;  // fp32 [tokens]; mu empty for RMSNorm
  Buffer ln_hp;       // the high-precision normalised x, when a GEMM keeps it as its residual
  void clear();
};

// Validates gamma/beta (and an optional ln_out) for a module whose norm runs over `hidden`.
void check_norm_params(const NormOptions &o, const NormInputs &in, const TensorView &ln_out, int64_t hidden,
                       DType dtype, const Device &device, const TensorView &input, const ArgName &gamma_name,
                       const ArgName &beta_name, const ArgName &ln_out_name);

// One norm forward of a module. Construction allocates (statistics, the high-precision output
// when one is needed) and plans; run() normalises.
class NormForwardStep {
 public:
  // `fused`: the FP8 input of the next GEMM is written by this norm (delayed scaling).
  // `keep_hp`: the high-precision output is the next GEMM's residual (high-precision mode):
  //            it goes to a library buffer kept with the residuals.
  // `ln_out`: the caller's optional copy of the normalised x (2-D view, or empty).
  NormForwardStep(Backend &be, const NormOptions &o, const NormInputs &in, bool fused, bool keep_hp,
                  const TensorView &ln_out, ScratchPlan *plan);
  // The high-precision output the next GEMM reads (empty when fused).
  const TensorView &hp_output() const { return hp_; }
  // Runs the norm; `fused_into` is the GEMM step whose FP8 input it writes (when fused).
  void run(ProjectionForward *fused_into);
  void save(NormSaved *out);

 private:
  Backend &be_;
  NormOptions o_;
  NormInputs in_;
  bool fused_, keep_hp_;
  TensorView ln_out_, hp_;
  Buffer mu_, rsigma_, hp_buf_;
};

// Views of saved statistics, as the residual structs expose them (empty when absent).
TensorView stats_view(const Buffer &b, const Device &device, int64_t tokens);

// The norm's backward: dln [tokens, hidden] -> dx, dgamma, dbeta (each optional).
NormBackwardArgs norm_backward_args(const NormOptions &o, const NormSaved &s, const TensorView &dln,
                                    const TensorView &dx, const TensorView &dgamma, const TensorView &dbeta);

// The end of a module's backward: the norm's backward (when `through_norm`), then the end of the
// module's autocast pass (when `ends_pass`). The norm backward is the backward's last launch and
// reads no scaling state, so it carries the pass's scale update where Autocast can hand it over
// (one launch fewer per training step); otherwise the update is launched after it.
void norm_backward_and_end_pass(Backend &be, Autocast &ac, NormBackwardArgs nb, bool through_norm, bool ends_pass,
                                uint64_t pass);

}  // namespace te
