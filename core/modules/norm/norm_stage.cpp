#include "modules/norm/norm_stage.h"

#include "modules/common/validate.h"

namespace te {

void NormSaved::clear() {
  x = TensorView();
  gamma = TensorView();
  mu.reset();
  rsigma.reset();
  ln_hp.reset();
}

void check_norm_params(const NormOptions &o, const NormInputs &in, const TensorView &ln_out, int64_t hidden,
                       DType dtype, const Device &device, const TensorView &input, const ArgName &gamma_name,
                       const ArgName &beta_name, const ArgName &ln_out_name) {
  check_vector(in.gamma, gamma_name, hidden, dtype, device);
  const bool layer = o.kind == NormKind::LayerNorm;
  check_presence(in.beta, beta_name, layer, layer ? "LayerNorm takes a beta" : "RMSNorm has no beta");
  if (in.beta.data) check_vector(in.beta, beta_name, hidden, dtype, device);
  if (ln_out.data) check_output_like(ln_out, ln_out_name, input, hidden, "the input's", dtype, device);
}

NormForwardStep::NormForwardStep(Backend &be, const NormOptions &o, const NormInputs &in, bool fused, bool keep_hp,
                                 const TensorView &ln_out, ScratchPlan *plan)
    : be_(be), o_(o), in_(in), fused_(fused), keep_hp_(keep_hp), ln_out_(ln_out) {
  const int64_t tokens = in.x.rows(), hidden = in.x.cols();
  const size_t stat_bytes = sizeof(float) * static_cast<size_t>(tokens);
  if (o.kind == NormKind::LayerNorm) mu_ = Buffer(&be, stat_bytes);
  rsigma_ = Buffer(&be, stat_bytes);
  if (!fused) {
    // The GEMM reads the high-precision output: the caller's ln_out when it asked for one and
    // the output is transient (FP8: quantized at once), else a library buffer.
    if (ln_out.data && !keep_hp) {
      hp_ = ln_out;
    } else {
      hp_buf_ = Buffer(&be, static_cast<size_t>(tokens * hidden) * dtype_size(in.x.dtype));
      hp_ = make_view(hp_buf_.get(), in.x.dtype, in.x.device, tokens, hidden);
    }
  }
  NormForwardArgs a;
  a.x = in.x;
  be.plan_norm_forward(a, plan);
}

void NormForwardStep::run(ProjectionForward *fused_into) {
  NormForwardArgs a;
  a.kind = o_.kind;
  a.eps = o_.eps;
  a.zero_centered_gamma = o_.zero_centered_gamma;
  a.x = in_.x;
  a.gamma = in_.gamma;
  a.beta = in_.beta;
  a.mu = mu_.floats();
  a.rsigma = rsigma_.floats();
  if (fused_) {
    QuantizedMatrix &q = fused_into->input();
    a.y = ln_out_;
    a.scale = fused_into->input_state().scale();
    a.amax_accum = fused_into->input_state().amax();
    a.out = &q.row;
    a.out_t = &q.col;
  } else {
    a.y = hp_;
  }
  be_.norm_forward(a);
  // The caller's copy, when the output it asked for went to the residual buffer.
  if (ln_out_.data && hp_buf_.get()) be_.copy(ln_out_.data, hp_.data, hp_.bytes());
}

void NormForwardStep::save(NormSaved *out) {
  out->x = in_.x;
  out->gamma = in_.gamma;
  out->mu = std::move(mu_);
  out->rsigma = std::move(rsigma_);
  if (keep_hp_) out->ln_hp = std::move(hp_buf_);
}

TensorView stats_view(const Buffer &b, const Device &device, int64_t tokens) {
  if (!b.get()) return TensorView();
  TensorView v = make_view(b.get(), DType::F32, device, tokens, 1);
  v.ndim = 1;
  return v;
}

NormBackwardArgs norm_backward_args(const NormOptions &o, const NormSaved &s, const TensorView &dln,
                                    const TensorView &dx, const TensorView &dgamma, const TensorView &dbeta) {
  NormBackwardArgs a;
  a.kind = o.kind;
  a.zero_centered_gamma = o.zero_centered_gamma;
  a.dy = dln;
  a.x = s.x;
  a.gamma = s.gamma;
  a.mu = s.mu.floats();
  a.rsigma = s.rsigma.floats();
  a.dx = dx;
  a.dgamma = dgamma;
  a.dbeta = dbeta;
  return a;
}

void norm_backward_and_end_pass(Backend &be, Autocast &ac, NormBackwardArgs nb, bool through_norm, bool ends_pass,
                                uint64_t pass) {
  const bool carried = through_norm && ends_pass && ac.carry_backward_update(pass, &nb);
  if (through_norm) be.norm_backward(nb);
  if (ends_pass) ac.finish_backward_pass(pass, carried);
}

}  // namespace te
