#include <cstdio>

#include "modules/common/validate.h"
#include "modules/grouped_linear/grouped_linear.h"
#include "modules/grouped_linear/sequential_scratch.h"

namespace te {

void grouped_linear_validate_splits(const int64_t *splits, int n, int64_t rows, const char *p) {
  check_not_null(splits, ArgName(p, "m_splits"));
  int64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t m = splits[i];
    if (m < 0)
      fail(Status::InvalidArgument, "argument '%s->m_splits[%d]': expected a token count >= 0, got %lld", p, i,
           (long long)m);
    if (m > rows - sum)
      fail(Status::InvalidArgument, "argument '%s->m_splits': counts sum to more than the input's %lld rows "
           "(m_splits[0..%d] already sum to %lld + %lld)", p, (long long)rows, i, (long long)sum, (long long)m);
    sum += m;
  }
  if (sum != rows)
    fail(Status::InvalidArgument, "argument '%s->m_splits': counts sum to %lld, the input has %lld rows", p,
         (long long)sum, (long long)rows);
}

void grouped_linear_validate(Context &ctx, const GroupedLinearOptions &o, const GroupedLinearForwardArgs &a,
                             const TensorView &y, const char *p) {
  const Device &dev = ctx.device();
  const DType dt = o.activation_dtype;
  check_tensor(a.input, ArgName(p, "input"), dt, dev);
  if (a.input.cols() != o.in_features)
    fail(Status::InvalidArgument, "argument '%s->input': expected last dimension in_features=%lld, got %lld", p,
         (long long)o.in_features, (long long)a.input.cols());
  grouped_linear_validate_splits(a.m_splits, o.num_gemms, a.input.rows(), p);
  for (int i = 0; i < o.num_gemms; ++i)
    check_weight(a.weights[i], ArgName::element(p, "weights", i), o.out_features, o.in_features, dt, dev);
  if (o.bias && !a.biases)
    fail(Status::InvalidArgument, "argument '%s->biases': the layer was created with bias, got NULL", p);
  if (!o.bias && a.biases)
    fail(Status::InvalidArgument, "argument '%s->biases': the layer was created without bias, expected NULL", p);
  if (a.biases)
    for (int i = 0; i < o.num_gemms; ++i)
      check_vector(a.biases[i], ArgName::element(p, "biases", i), o.out_features, dt, dev);
  if (y.data) check_output_like(y, "y", a.input, o.out_features, "out_features", dt, dev);
}

namespace {

// The steps live in the layer's call storage; whatever happens, none outlives the call (a step
// that was never committed frees what it staged).
struct ForwardSteps {
  std::vector<std::optional<ProjectionForward>> &steps;
  ~ForwardSteps() {
    for (auto &s : steps) s.reset();
  }
};

}  // namespace

GroupedLinearSaved *grouped_linear_forward_compute(Context &ctx, GroupedLinear &g, const GroupedLinearForwardArgs &args,
                                                   const TensorView &y) {
  GroupedLinearCore &L = *g.core();
  const GroupedLinearOptions &o = L.opts;
  if (!y.data) fail(Status::InvalidArgument, "argument 'y->data': expected a non-NULL pointer, got NULL");
  grouped_linear_validate(ctx, o, args, y, "args");
  Backend &be = ctx.backend();
  Autocast &ac = ctx.autocast();
  const ForwardMode mode = ForwardMode::of(ac);
  // Tokens need no check: each expert's are padded to 16 below.
  if (mode.fp8 && (o.in_features % 16 || o.out_features % 16))
    fail(Status::Unsupported, "argument 'g': FP8 GEMMs need in_features and out_features to be multiples of 16 "
         "(tokens are padded per expert), got in_features=%lld, out_features=%lld", (long long)o.in_features,
         (long long)o.out_features);
  const int n = o.num_gemms;
  const Device dev = ctx.device();
  const DType dt = o.activation_dtype;
  const int64_t tokens = args.input.rows();
  const TensorView x2d = make_view(args.input.data, dt, dev, tokens, o.in_features);
  const TensorView y2d = make_view(y.data, dt, dev, tokens, o.out_features);
  ExpertRows *rows = L.call.rows.data();
  const int64_t pad_rows_total = layout_expert_rows(args.m_splits, n, mode.fp8, rows);

  // Allocate, stage and reserve everything for every expert first (nothing changes if memory
  // runs out); then commit and run them one after another.
  GroupedLinearPools &pools = grouped_linear_pools(ctx);
  GroupedLinearSaved *saved = pools.saved.acquire(ctx);
  ForwardSteps steps{L.call.forward};
  try {
    saved->splits.assign(args.m_splits, args.m_splits + n);
    saved->experts.resize(static_cast<size_t>(n));
    const size_t es = dtype_size(dt);
    Buffer x_pad(&be, static_cast<size_t>(pad_rows_total * o.in_features) * es);
    Buffer y_pad(&be, static_cast<size_t>(pad_rows_total * o.out_features) * es);
    const TensorView x_pad2d = make_view(x_pad.get(), dt, dev, pad_rows_total, o.in_features);
    const TensorView y_pad2d = make_view(y_pad.get(), dt, dev, pad_rows_total, o.out_features);
    SequentialScratch scratch(be);
    int states = 0;
    for (int i = 0; i < n; ++i) {
      const ExpertRows &e = rows[i];
      if (e.tokens == 0) continue;  // no GEMM, no amax: its states sit this pass out
      ScratchPlan plan;
      steps.steps[i].emplace(ctx, L.experts[i], mode, ProjectionDims{e.padded, o.in_features, o.out_features, true},
                             expert_matrix(e, x2d, x_pad2d), false, args.weights[i],
                             args.biases ? args.biases[i] : TensorView(), expert_matrix(e, y2d, y_pad2d),
                             args.weight_unchanged, &plan);
      scratch.add_step(plan);
      states += steps.steps[i]->states_to_register();
    }
    scratch.reserve();
    ac.reserve_forward(states);

    for (auto &s : steps.steps)
      if (s) s->commit();
    if (mode.fp8) saved->ticket = ac.enter_module();
    pad_experts(be, rows, n, x2d, x_pad2d);
    int running = 0;
    for (int i = 0; i < n; ++i)
      if (steps.steps[i]) L.call.forward_running[static_cast<size_t>(running++)] = &*steps.steps[i];
    ProjectionForward::run_all(L.call.forward_running.data(), running);
    for (int i = 0; i < n; ++i) {
      ProjectionSaved &ps = saved->experts[static_cast<size_t>(i)];
      if (rows[i].tokens == 0) {
        // A weight that changed was not quantized: a later weight_unchanged forward must not
        // reuse the FP8 copy of the old one.
        if (mode.fp8 && !args.weight_unchanged) L.experts[i].weight_cache.reset();
        ps.fp8 = mode.fp8;
        continue;
      }
      steps.steps[i]->save(&ps);
    }
    unpad_experts(be, rows, n, y_pad2d, y2d);
  } catch (...) {
    pools.saved.release(saved);
    throw;
  }
  saved->layer = g.core();
  saved->fp8 = mode.fp8;
  saved->tokens = tokens;
  if (mode.fp8) {
    saved->recipe = RecipeRef(mode.recipe);
    saved->group = GroupRef(mode.group);
  }
  return saved;
}

}  // namespace te
