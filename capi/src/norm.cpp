// LayerNorm and RMSNorm: validation over the backend's norm_forward / norm_backward. The norm runs
// over the last dimension; the leading dimensions are folded into rows.
#include <cmath>
#include <cstdio>

#include "capi_common.h"

using namespace te;
using namespace te::capi;

static_assert(TE_NORM_LAYERNORM == static_cast<int>(NormKind::LayerNorm), "norm kinds must match the core");
static_assert(TE_NORM_RMSNORM == static_cast<int>(NormKind::RMSNorm), "norm kinds must match the core");

namespace {

struct NormOptions {
  NormKind kind = NormKind::LayerNorm;
  float eps = 1e-5f;
  bool zero_centered_gamma = false;
};

NormOptions norm_options(const te_norm_options *opts) {
  NormOptions r;
  if (!opts) return r;
  check_options(opts, "opts");
  const int kind = enum_int(opts->kind);
  if (kind != TE_NORM_LAYERNORM && kind != TE_NORM_RMSNORM)
    fail(Status::InvalidArgument, "argument 'opts->kind': expected a te_norm_kind value, got %d", kind);
  if (!(opts->eps > 0.0f) || opts->eps == INFINITY)
    fail(Status::InvalidArgument, "argument 'opts->eps': expected a finite value > 0, got %g", (double)opts->eps);
  check_bool(opts->zero_centered_gamma, "opts->zero_centered_gamma");
  r.kind = static_cast<NormKind>(kind);
  r.eps = opts->eps;
  r.zero_centered_gamma = opts->zero_centered_gamma;
  return r;
}

// "[2, 3, 4]", for messages.
struct ShapeText {
  char s[8 * 24];
  explicit ShapeText(const TensorView &t) {
    int n = std::snprintf(s, sizeof s, "[");
    for (int i = 0; i < t.ndim && n < static_cast<int>(sizeof s); ++i)
      n += std::snprintf(s + n, sizeof s - n, i ? ", %lld" : "%lld", (long long)t.shape[i]);
    if (n < static_cast<int>(sizeof s)) std::snprintf(s + n, sizeof s - n, "]");
  }
};

// A tensor laid out like x: x's own shape, or [rows, hidden].
void check_like_x(const TensorView &t, const char *name, const TensorView &x, const char *xname) {
  bool same = t.ndim == x.ndim;
  for (int i = 0; same && i < x.ndim; ++i) same = t.shape[i] == x.shape[i];
  if (same || (t.ndim == 2 && t.shape[0] == x.rows() && t.shape[1] == x.cols())) return;
  fail(Status::InvalidArgument, "argument '%s': expected the shape of '%s' %s or [rows, hidden] = [%lld, %lld], got %s",
       name, xname, ShapeText(x).s, (long long)x.rows(), (long long)x.cols(), ShapeText(t).s);
}

// gamma, beta and their gradients: [hidden].
void check_hidden_vector(const TensorView &t, const char *name, int64_t hidden) {
  if (t.ndim != 1 || t.shape[0] != hidden)
    fail(Status::InvalidArgument, "argument '%s': expected shape [%lld] (x's last dimension), got %s", name,
         (long long)hidden, ShapeText(t).s);
}

// mu and rsigma: F32 [rows], or x's leading dimensions.
void check_stats(const TensorView &t, const char *name, const TensorView &x, const Device &dev) {
  check_dtype(t, name, DType::F32);
  check_device(t, name, dev);
  bool leading = x.ndim > 1 && t.ndim == x.ndim - 1;
  for (int i = 0; leading && i < t.ndim; ++i) leading = t.shape[i] == x.shape[i];
  if (leading || (t.ndim == 1 && t.shape[0] == x.rows())) return;
  fail(Status::InvalidArgument, "argument '%s': expected shape [rows] = [%lld] (or x's leading dimensions), got %s",
       name, (long long)x.rows(), ShapeText(t).s);
}

// The same elements seen as the matrix [rows, cols] the backend works on.
TensorView as_matrix(TensorView t, int64_t rows, int64_t cols) {
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  return t;
}

te_quantize_options quantize_options(const te_quantize_options *q) {
  te_quantize_options o{};
  o.struct_size = sizeof o;
  if (!q) return o;
  check_options(q, "args->quantize");
  o = *q;
  if (!(o.amax_epsilon >= 0.0f) || o.amax_epsilon == INFINITY)
    fail(Status::InvalidArgument, "argument 'args->quantize->amax_epsilon': expected a finite value >= 0, got %g",
         (double)o.amax_epsilon);
  check_bool(o.power_of_2_scales, "args->quantize->power_of_2_scales");
  return o;
}

void check_fp8_output(const TensorView &t, const char *name) {
  if (t.scaling != ScalingMode::PerTensor)
    fail(Status::InvalidArgument, "argument '%s': a norm writes FP8 with per-tensor scaling only, got %s scaling", name,
         t.scaling == ScalingMode::Block1x128 ? "1x128 block" : "128x128 block");
}

void norm_forward(Context &c, const NormOptions &no, const te_norm_forward_args *args) {
  check_options(args, "args");
  const Device &dev = c.device();
  const bool layer = no.kind == NormKind::LayerNorm;

  const TensorView x = to_view(args->input, "args->input");
  check_high_precision(x, "args->input");
  check_device(x, "args->input", dev);
  const int64_t rows = x.rows(), hidden = x.cols();

  const TensorView gamma = to_view(args->weight, "args->weight");
  check_dtype(gamma, "args->weight", x.dtype);
  check_device(gamma, "args->weight", dev);
  check_hidden_vector(gamma, "args->weight", hidden);

  TensorView beta;
  if (layer) {
    if (!args->bias)
      fail(Status::InvalidArgument, "argument 'args->bias': LayerNorm adds beta: expected a tensor [%lld], got NULL",
           (long long)hidden);
    beta = to_view(args->bias, "args->bias");
    check_dtype(beta, "args->bias", x.dtype);
    check_device(beta, "args->bias", dev);
    check_hidden_vector(beta, "args->bias", hidden);
  } else if (args->bias) {
    fail(Status::InvalidArgument, "argument 'args->bias': RMSNorm has no beta: expected NULL, got a tensor");
  }

  if (!args->output && !args->output_t)
    fail(Status::InvalidArgument,
         "argument 'args->output': expected 'args->output', 'args->output_t' or both, got two NULLs");
  TensorView out = to_optional_view(args->output, "args->output");
  TensorView out_t = to_optional_view(args->output_t, "args->output_t");
  if (args->output) {
    check_device(out, "args->output", dev);
    if (is_fp8(out.dtype)) check_fp8_output(out, "args->output");
    else check_high_precision(out, "args->output");
    check_like_x(out, "args->output", x, "args->input");
  }
  if (args->output_t) {
    check_fp8(out_t, "args->output_t");
    check_fp8_output(out_t, "args->output_t");
    check_device(out_t, "args->output_t", dev);
    if (out_t.ndim != 2 || out_t.shape[0] != hidden || out_t.shape[1] != rows)
      fail(Status::InvalidArgument, "argument 'args->output_t': expected shape [hidden, rows] = [%lld, %lld], got %s",
           (long long)hidden, (long long)rows, ShapeText(out_t).s);
    if (args->output && is_fp8(out.dtype) && out.dtype != out_t.dtype)
      fail(Status::InvalidArgument, "argument 'args->output_t': expected the FP8 dtype of 'args->output' (%s), got %s",
           dtype_name(out.dtype), dtype_name(out_t.dtype));
  }
  const bool fp8_out = args->output && is_fp8(out.dtype);
  const bool fp8 = fp8_out || args->output_t;
  const DType f8 = fp8_out ? out.dtype : out_t.dtype;

  TensorView mu, rsigma;
  if (args->mu) {
    if (!layer)
      fail(Status::InvalidArgument, "argument 'args->mu': RMSNorm computes no mean: expected NULL, got a tensor");
    mu = to_view(args->mu, "args->mu");
    check_stats(mu, "args->mu", x, dev);
  }
  if (args->rsigma) {
    rsigma = to_view(args->rsigma, "args->rsigma");
    check_stats(rsigma, "args->rsigma", x, dev);
  }

  const te_quantize_options q = quantize_options(args->quantize);
  if (q.scale && !fp8)
    fail(Status::InvalidArgument, "argument 'args->quantize->scale': the outputs are not FP8, so there is nothing to "
         "scale: expected NULL");

  NormForwardArgs a;
  a.kind = no.kind;
  a.eps = no.eps;
  a.zero_centered_gamma = no.zero_centered_gamma;
  a.x = as_matrix(x, rows, hidden);
  a.gamma = gamma;
  a.beta = beta;
  if (args->output && !fp8_out) a.y = as_matrix(out, rows, hidden);
  a.mu = static_cast<float *>(mu.data);
  a.rsigma = static_cast<float *>(rsigma.data);
  TensorView out2d = fp8_out ? as_matrix(out, rows, hidden) : TensorView();
  if (fp8_out) a.out = &out2d;
  if (args->output_t) a.out_t = &out_t;
  a.amax_accum = q.amax;

  Backend &be = c.backend();
  if (!fp8 || q.scale) {
    // High precision, or FP8 with the caller's scale (delayed scaling): one pass.
    a.scale = q.scale;
    ScratchPlan plan;
    be.plan_norm_forward(a, &plan);
    be.reserve(plan);
    be.norm_forward(a);
    return;
  }
  // Current scaling: a first pass finds the amax of the normalised values, the scale comes from
  // it on the device, a second pass writes the outputs (and the caller's amax) with that scale.
  Buffer scratch(&be, 3 * sizeof(float));
  float *amax = scratch.floats(), *scale = amax + 1, *scale_inv = amax + 2;
  NormForwardArgs probe;
  probe.kind = a.kind;
  probe.eps = a.eps;
  probe.zero_centered_gamma = a.zero_centered_gamma;
  probe.x = a.x;
  probe.gamma = a.gamma;
  probe.beta = a.beta;
  probe.amax_accum = amax;
  a.scale = scale;
  ScratchPlan plan;
  be.plan_norm_forward(probe, &plan);
  be.plan_norm_forward(a, &plan);
  be.reserve(plan);
  be.fill_floats(amax, 0.0f, 1);
  be.norm_forward(probe);
  be.scale_from_amax(amax, scale, scale_inv, fp8_max(f8), q.power_of_2_scales, q.amax_epsilon);
  be.norm_forward(a);
}

void norm_backward(Context &c, const NormOptions &no, const te_tensor *dy, const te_tensor *x, const te_tensor *gamma,
                   const te_tensor *mu, const te_tensor *rsigma, te_tensor *dx, te_tensor *dgamma, te_tensor *dbeta) {
  const Device &dev = c.device();
  const bool layer = no.kind == NormKind::LayerNorm;

  const TensorView xv = to_view(x, "x");
  check_high_precision(xv, "x");
  check_device(xv, "x", dev);
  const int64_t rows = xv.rows(), hidden = xv.cols();

  const TensorView dyv = to_view(dy, "dy");
  check_dtype(dyv, "dy", xv.dtype);
  check_device(dyv, "dy", dev);
  check_like_x(dyv, "dy", xv, "x");

  const TensorView g = to_view(gamma, "gamma");
  check_dtype(g, "gamma", xv.dtype);
  check_device(g, "gamma", dev);
  check_hidden_vector(g, "gamma", hidden);

  TensorView muv;
  if (layer) {
    if (!mu)
      fail(Status::InvalidArgument, "argument 'mu': LayerNorm's backward needs the forward's means: expected an F32 "
           "tensor [%lld], got NULL", (long long)rows);
    muv = to_view(mu, "mu");
    check_stats(muv, "mu", xv, dev);
  } else if (mu) {
    fail(Status::InvalidArgument, "argument 'mu': RMSNorm computes no mean: expected NULL, got a tensor");
  }
  const TensorView rs = to_view(rsigma, "rsigma");
  check_stats(rs, "rsigma", xv, dev);

  TensorView dxv = to_optional_view(dx, "dx");
  if (dx) {
    check_dtype(dxv, "dx", xv.dtype);
    check_device(dxv, "dx", dev);
    check_like_x(dxv, "dx", xv, "x");
  }
  TensorView dg = to_optional_view(dgamma, "dgamma");
  if (dgamma) {
    check_dtype(dg, "dgamma", g.dtype);
    check_device(dg, "dgamma", dev);
    check_hidden_vector(dg, "dgamma", hidden);
  }
  TensorView db;
  if (dbeta) {
    if (!layer) fail(Status::InvalidArgument, "argument 'dbeta': RMSNorm has no beta: expected NULL, got a tensor");
    db = to_view(dbeta, "dbeta");
    check_dtype(db, "dbeta", g.dtype);
    check_device(db, "dbeta", dev);
    check_hidden_vector(db, "dbeta", hidden);
  }
  if (!dx && !dgamma && !dbeta) return;  // nothing asked for

  NormBackwardArgs a;
  a.kind = no.kind;
  a.zero_centered_gamma = no.zero_centered_gamma;
  a.dy = as_matrix(dyv, rows, hidden);
  a.x = as_matrix(xv, rows, hidden);
  a.gamma = g;
  a.mu = static_cast<const float *>(muv.data);
  a.rsigma = static_cast<const float *>(rs.data);
  if (dx) a.dx = as_matrix(dxv, rows, hidden);
  a.dgamma = dg;
  a.dbeta = db;
  Backend &be = c.backend();
  ScratchPlan plan;
  be.plan_norm_backward(a, &plan);
  be.reserve(plan);
  be.norm_backward(a);
}

}  // namespace

extern "C" {

TE_API te_status te_norm_options_init(te_norm_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_norm_options{};
    opts->struct_size = sizeof *opts;
    opts->kind = TE_NORM_LAYERNORM;
    opts->eps = 1e-5f;
    opts->zero_centered_gamma = 0;
  });
}

TE_API te_status te_norm_forward_args_init(te_norm_forward_args *args) {
  return guarded(__func__, [&] {
    check_not_null(args, "args");
    *args = te_norm_forward_args{};
    args->struct_size = sizeof *args;
  });
}

TE_API te_status te_norm_forward(te_context *ctx, const te_norm_options *opts, const te_norm_forward_args *args) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    const NormOptions no = norm_options(opts);
    norm_forward(*c, no, args);
  });
}

TE_API te_status te_norm_backward(te_context *ctx, const te_norm_options *opts, const te_tensor *dy,
                                  const te_tensor *x, const te_tensor *gamma, const te_tensor *mu,
                                  const te_tensor *rsigma, te_tensor *dx, te_tensor *dgamma, te_tensor *dbeta) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    const NormOptions no = norm_options(opts);
    norm_backward(*c, no, dy, x, gamma, mu, rsigma, dx, dgamma, dbeta);
  });
}

}  // extern "C"
