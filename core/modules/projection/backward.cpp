#include "modules/projection/projection.h"

#include "base/check.h"

namespace te {

namespace {

GemmArgs gemm_tn(const TensorView &a, const TensorView &b, const TensorView &d, bool accumulate, bool split) {
  GemmArgs g;
  g.a = a;
  g.b = b;
  g.transb = true;
  g.d = d;
  g.accumulate = accumulate;
  g.split_accumulator = split;
  return g;
}

}  // namespace

ProjectionBackward::ProjectionBackward(Context &ctx, ProjectionState &st, ProjectionSaved &saved,
                                       const Recipe *recipe, const Group *group, const ProjectionDims &dims,
                                       const TensorView &dy, const ProjectionGrads &g, bool accumulate_dw,
                                       ScratchPlan *plan, const ActivationSource &dy_source)
    : ctx_(ctx), st_(st), saved_(saved), recipe_(recipe), group_(group), dy_(dy), dy_source_(dy_source), g_(g) {
  Backend &be = ctx.backend();
  const bool want_dx = g.dx.data != nullptr, want_dw = g.dw.data != nullptr;
  if (dy_source.active() && !(saved.fp8 && (want_dx || want_dw)))
    fail(Status::Internal, "ProjectionBackward: an activation source needs an FP8 backward that quantizes dy");
  if (g.db.data) be.plan_bias_grad(dy, plan);
  if (!saved.fp8) {
    dgrad_.a = dy;  // dx = dy W
    dgrad_.b = saved.w_hp;
    dgrad_.d = g.dx;
    wgrad_.a = dy;  // dW = dy^T x
    wgrad_.transa = true;
    wgrad_.b = saved.x_hp;
    wgrad_.d = g.dw;
    wgrad_.accumulate = accumulate_dw;
    dgrad_.shape_varies = wgrad_.shape_varies = dims.tokens_vary;
    if (want_dx) be.plan_gemm(dgrad_, plan);
    if (want_dw) be.plan_gemm(wgrad_, plan);
    return;
  }
  const RecipeOptions &ro = recipe->options();
  const DType f8 = recipe->backward_dtype();
  delayed_ = recipe->kind() == RecipeKind::Delayed;
  registers_ = delayed_ && (want_dx || want_dw);
  dyq_.allocate(be, scaling_mode_for(*recipe, TensorKind::Gradient), f8, dims.tokens, dims.out, want_dx, want_dw);
  if (delayed_ && !saved.grad_scale_taken) grad_scale_ = Buffer(&be, sizeof(float));
  staged_ = st.grad_output.stage(be, ctx.amax_slots(), *recipe, f8);
  dgrad_ = gemm_tn(dyq_.row, saved.w->q.col, g.dx, false, ro.dgrad_split_accumulator);
  wgrad_ = gemm_tn(dyq_.col, saved.x.col, g.dw, accumulate_dw, ro.wgrad_split_accumulator);
  dgrad_.shape_varies = wgrad_.shape_varies = dims.tokens_vary;
  QuantizeRequest req;
  req.recipe = recipe;
  req.group = group;
  req.source = dy_source;
  if (want_dx || want_dw) plan_quantize(be, req, dy, dyq_, plan);
  if (want_dx) be.plan_gemm(dgrad_, plan);
  if (want_dw) be.plan_gemm(wgrad_, plan);
}

void ProjectionBackward::commit() {
  if (!saved_.fp8) return;
  Backend &be = ctx_.backend();
  st_.grad_output.commit(be, std::move(staged_));
  if (delayed_ && !saved_.grad_scale_taken) {
    // The first backward snapshots the gradient scale (later calls reuse it, whatever scale
    // updates happened since): run() has the cast copy it, or copies it when nothing is cast.
    saved_.grad_scale = std::move(grad_scale_);
    saved_.grad_scale_taken = true;
    snapshot_pending_ = true;
  }
}

bool ProjectionBackward::quantizes() const { return saved_.fp8 && (g_.dx.data != nullptr || g_.dw.data != nullptr); }

QuantizeRequest ProjectionBackward::dy_request() const {
  QuantizeRequest req;
  req.recipe = recipe_;
  req.group = group_;
  req.state = &st_.grad_output;
  if (delayed_ && !snapshot_pending_) req.scale = saved_.grad_scale.floats();
  if (snapshot_pending_) req.scale_copy = saved_.grad_scale.floats();
  req.dbias = g_.db;  // the bias gradient in the pass that casts dy
  req.source = dy_source_;
  return req;
}

void ProjectionBackward::snapshot_without_cast() {
  if (snapshot_pending_) ctx_.backend().copy(saved_.grad_scale.get(), st_.grad_output.scale(), sizeof(float));
}

int ProjectionBackward::gemms(GemmArgs *out) const {
  int n = 0;
  if (g_.dx.data) out[n++] = dgrad_;
  if (g_.dw.data) out[n++] = wgrad_;
  return n;
}

void ProjectionBackward::unfused_bias_grad() {
  if (bias_grad_unfused()) ctx_.backend().bias_grad(dy_, g_.db);
}

void ProjectionBackward::run() {
  if (quantizes()) quantize(ctx_.backend(), dy_request(), dy_, dyq_);
  else snapshot_without_cast();
  snapshot_pending_ = false;
  // dgrad and wgrad in one backend call: small ones share a launch.
  GemmArgs g[2];
  ctx_.backend().gemm_many(g, gemms(g));
  unfused_bias_grad();
}

void ProjectionBackward::run_all(ProjectionBackward *const *steps, int n) {
  if (n < 1) return;
  Backend &be = steps[0]->ctx_.backend();
  constexpr int kBatch = 8;  // dy casts per backend call
  QuantizeBatch<kBatch> batch(be);
  for (int i = 0; i < n; ++i) {
    ProjectionBackward &s = *steps[i];
    if (!s.quantizes()) {
      s.snapshot_without_cast();
      continue;
    }
    batch.add(1, [&](QuantizeRequest *req, TensorView *x, QuantizedMatrix **out) {
      *req = s.dy_request(), *x = s.dy_, *out = &s.dyq_;
      return 1;
    });
  }
  batch.flush();
  for (int i = 0; i < n; ++i) steps[i]->snapshot_pending_ = false;
  // dgrad and wgrad through one backend call: small ones share a launch (a step's two stay together).
  GemmArgs gemms[kProjectionGemmBatch];
  int k = 0;
  for (int i = 0; i < n; ++i) {
    if (k + 2 > kProjectionGemmBatch) be.gemm_many(gemms, k), k = 0;
    k += steps[i]->gemms(gemms + k);
  }
  if (k) be.gemm_many(gemms, k);
  // The bias gradients no cast took, through one backend call per kBiasBatch (one launch, where
  // each is small).
  constexpr int kBiasBatch = 32;
  TensorView dys[kBiasBatch], dbs[kBiasBatch];
  int m = 0;
  for (int i = 0; i < n; ++i) {
    const ProjectionBackward &s = *steps[i];
    if (!s.bias_grad_unfused()) continue;
    dys[m] = s.dy_, dbs[m++] = s.g_.db;
    if (m == kBiasBatch) be.bias_grad_many(dys, dbs, m), m = 0;
  }
  if (m) be.bias_grad_many(dys, dbs, m);
}

void ProjectionBackward::register_state(uint64_t pass) {
  if (registers_) ctx_.autocast().register_backward(pass, recipe_, group_, &st_.grad_output);
}

}  // namespace te
