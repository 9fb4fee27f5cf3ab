#include "modules/attention/attention.h"
#include "modules/common/validate.h"

namespace te {

namespace {

bool same_shape(const TensorView &a, const TensorView &b) {
  if (a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  return true;
}

// A gradient or dO: the activation dtype, on the device, shaped like the forward's tensor (for
// FP8 forwards the high-precision shape, which the saved output o keeps for q).
void check_like(const TensorView &t, const char *name, const TensorView &ref, const char *ref_name, DType dt,
                const Device &dev) {
  check_tensor(t, name, dt, dev);
  if (!same_shape(t, ref)) fail(Status::InvalidArgument, "argument '%s': expected the shape of the forward's %s", name, ref_name);
}

// k's and v's high-precision shape: [batch, seq_kv, kv_heads, hd] or [tokens_kv, kv_heads, hd].
TensorView kv_shape(const AttentionDims &d, const TensorView &o) {
  TensorView t = o;
  if (d.varlen()) {
    t.shape[0] = d.tokens_kv;
  } else {
    t.shape[1] = d.max_seq_kv;
  }
  t.shape[t.ndim - 2] = d.kv_heads;
  return t;
}

TensorView scratch_view(Buffer &b, Backend &be, const TensorView &shape, DType dt) {
  TensorView v = shape;
  b = Buffer(&be, static_cast<size_t>(shape.numel()) * dtype_size(dt));
  v.data = b.get();
  v.dtype = dt;
  v.scale_inv = nullptr;
  return v;
}

}  // namespace

void attention_backward(Context &ctx, AttentionBackwardCtx &bwd, const TensorView &d_o, const AttentionGrads &g,
                        bool once) {
  if (!bwd.saved)
    fail(Status::InvalidState, "argument 'bwd': its residuals were freed by an earlier TE_BACKWARD_ONCE backward");
  AttentionSaved &s = *bwd.saved;
  AttentionCore &A = *s.layer;
  const AttentionOptions &opt = A.opts;
  const Device dev = ctx.device();
  const DType dt = opt.activation_dtype;
  const AttentionDims &d = s.dims;
  const TensorView kv = kv_shape(d, s.o);
  check_like(d_o, "d_o", s.o, "q", dt, dev);
  if (g.dq.data) check_like(g.dq, "grads->dq", s.o, "q", dt, dev);
  if (g.dk.data) check_like(g.dk, "grads->dk", kv, "k", dt, dev);
  if (g.dv.data) check_like(g.dv, "grads->dv", kv, "v", dt, dev);
  Backend &be = ctx.backend();

  // Gradients nobody asked for still have to go somewhere: the kernels write all three.
  Buffer dq_tmp, dk_tmp, dv_tmp;
  AttentionBackwardArgs ba;
  ba.dims = d;
  ba.q = s.q;
  ba.k = s.k;
  ba.v = s.v;
  ba.o = s.o;
  ba.d_o = d_o;
  ba.lse = s.lse.floats();
  ba.dq = g.dq.data ? g.dq : scratch_view(dq_tmp, be, s.o, dt);
  ba.dk = g.dk.data ? g.dk : scratch_view(dk_tmp, be, kv, dt);
  ba.dv = g.dv.data ? g.dv : scratch_view(dv_tmp, be, kv, dt);
  ScratchPlan plan;
  const Recipe *recipe = s.recipe.get();
  const bool delayed = s.fp8 && recipe->kind() == RecipeKind::Delayed;
  QuantizedMatrix do8;
  Buffer grad_scales;
  ScalingState::Staged staged_do, staged_dp;
  QuantizeRequest req;
  AttentionBackwardArgs amax_pass;
  if (s.fp8) {
    const DType f8 = recipe->backward_dtype();
    req.recipe = recipe;
    req.group = s.group.get();
    do8.allocate(be, ScalingMode::PerTensor, f8, d.tokens_q * d.heads, d.head_dim, true, false);
    if (delayed && !s.grad_scales_taken) grad_scales = Buffer(&be, 4 * sizeof(float));
    staged_do = A.state(AttnTensor::DO).stage(be, ctx.amax_slots(), *recipe, f8);
    staged_dp = A.state(AttnTensor::DP).stage(be, ctx.amax_slots(), *recipe, f8);
    plan_quantize(be, req, d_o, do8, &plan);
    ba.d_o8 = do8.row;
    ba.s_scale = s.s_scale;
    ba.s_scale_inv = s.s_scale + 1;
    if (!delayed) {
      amax_pass = ba;
      amax_pass.dp_amax_only = true;
      be.plan_attention_backward(amax_pass, &plan);
    }
  }
  be.plan_attention_backward(ba, &plan);
  be.reserve(plan);
  // The first FP8 module's backward ends its pass (te.h); reserving first keeps the update from
  // allocating after the outputs are written.
  const int registering = delayed ? 2 : 0;
  const bool ends_pass = s.ticket.first && s.ticket.pass != 0;
  if (registering || ends_pass) ctx.autocast().reserve_backward(s.ticket.pass, registering);

  if (s.fp8) {
    ScalingState &DO = A.state(AttnTensor::DO), &DP = A.state(AttnTensor::DP);
    DO.commit(be, std::move(staged_do));
    DP.commit(be, std::move(staged_dp));
    // The first backward snapshots the gradient scales (later calls reuse them, whatever updates
    // ran since): dO's comes out of its cast (scale_copy), dS's is copied.
    const bool snapshot = delayed && !s.grad_scales_taken;
    if (snapshot) {
      s.grad_scales = std::move(grad_scales);
      be.copy(s.grad_scales.floats() + 2, DP.scale(), 2 * sizeof(float));
      s.grad_scales_taken = true;
    }
    req.state = &DO;
    req.scale = delayed && !snapshot ? s.grad_scales.floats() : nullptr;
    req.scale_copy = snapshot ? s.grad_scales.floats() : nullptr;
    quantize(be, req, d_o, do8);
    if (delayed) {
      ba.dp_scale = s.grad_scales.floats() + 2;
      ba.dp_scale_inv = s.grad_scales.floats() + 3;
      ba.dp_amax = DP.amax();
    } else {
      // Current scaling: dS's amax first (a pass over the scores), then its scale.
      be.fill_floats(DP.amax_scratch(), 0.0f, 1);
      amax_pass.dp_amax = DP.amax_scratch();
      be.attention_backward(amax_pass);
      const RecipeOptions &ro = recipe->options();
      if (req.group && ro.reduce_amax) req.group->allreduce_max(DP.amax_scratch(), 1, be);
      be.scale_from_amax(DP.amax_scratch(), DP.scale(), DP.scale_inv(), fp8_max(DP.fp8_dtype()), ro.power_of_2_scales,
                         ro.amax_epsilon);
      ba.dp_scale = DP.scale();
      ba.dp_scale_inv = DP.scale_inv();
    }
  }
  be.attention_backward(ba);
  if (registering) {
    ctx.autocast().register_backward(s.ticket.pass, recipe, s.group.get(), &A.state(AttnTensor::DO));
    ctx.autocast().register_backward(s.ticket.pass, recipe, s.group.get(), &A.state(AttnTensor::DP));
  }
  if (ends_pass) ctx.autocast().finish_backward_pass(s.ticket.pass);
  if (once) {
    attention_pools(ctx).saved.release(bwd.saved);
    bwd.saved = nullptr;
  }
}

}  // namespace te
