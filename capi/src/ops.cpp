// Activations and primitives: thin validation over the backend.
#include <cmath>
#include <utility>

#include "capi_common.h"

using namespace te;
using namespace te::capi;

static_assert(TE_ACTIVATION_SWIGLU == static_cast<int>(Activation::SwiGLU), "activations must match the core");
static_assert(TE_ACTIVATION_GEGLU == static_cast<int>(Activation::GeGLU), "activations must match the core");
static_assert(TE_ACTIVATION_SRELU == static_cast<int>(Activation::SReLU), "activations must match the core");
static_assert(TE_EPILOGUE_BIAS_GELU == static_cast<int>(Epilogue::BiasGelu), "epilogues must match the core");

namespace {

Activation to_activation(const te_activation &act) {
  const int a = enum_int(act);
  if (a < TE_ACTIVATION_RELU || a > TE_ACTIVATION_SRELU)
    fail(Status::InvalidArgument, "argument 'act': expected a te_activation value, got %d", a);
  return static_cast<Activation>(a);
}

// y's expected shape: x's, with the last dimension halved for the gated SwiGLU and GEGLU.
void check_activation_output(Activation act, const TensorView &x, const TensorView &y, const char *name) {
  if (is_gated(act) && x.cols() % 2)
    fail(Status::InvalidArgument, "argument 'x': %s needs an even last dimension, got %lld",
         act == Activation::GeGLU ? "GEGLU" : "SwiGLU", (long long)x.cols());
  int64_t cols = is_gated(act) ? x.cols() / 2 : x.cols();
  bool ok = y.ndim == x.ndim && y.cols() == cols;
  for (int i = 0; ok && i + 1 < x.ndim; ++i) ok = y.shape[i] == x.shape[i];
  if (!ok)
    fail(Status::InvalidArgument, "argument '%s': expected x's leading dimensions and last dimension %lld, got %d dims "
         "with last dimension %lld", name, (long long)cols, y.ndim, (long long)y.cols());
}

te_quantize_options quantize_options(const te_quantize_options *opts) {
  te_quantize_options o{};
  o.struct_size = sizeof o;
  if (opts) {
    check_options(opts, "opts");
    o = *opts;
  }
  if (!(o.amax_epsilon >= 0.0f) || o.amax_epsilon == INFINITY)
    fail(Status::InvalidArgument, "argument 'opts->amax_epsilon': expected a finite value >= 0, got %g", (double)o.amax_epsilon);
  check_bool(o.power_of_2_scales, "opts->power_of_2_scales");
  return o;
}

// The one quantization path behind te_quantize and te_cast_transpose.
void quantize_into(Context &c, const TensorView &x, TensorView *out, TensorView *out_t, const te_quantize_options &o) {
  Backend &be = c.backend();
  const TensorView &ref = out ? *out : *out_t;
  if (out && out_t && (out->dtype != out_t->dtype || out->scaling != out_t->scaling))
    fail(Status::InvalidArgument, "argument 'out_t': expected the dtype and scaling of 'out'");
  if (ref.scaling != ScalingMode::PerTensor) {
    if (o.scale)
      fail(Status::InvalidArgument, "argument 'opts->scale': block scaling computes its own scales: expected NULL");
    if (o.amax) be.amax(x, o.amax, true);
    be.block_quantize(x, ref.scaling, o.power_of_2_scales, o.amax_epsilon, out, out_t);
    return;
  }
  if (o.scale) {
    be.cast_transpose(x, o.scale, o.amax, out, out_t);
    return;
  }
  // Current scaling: amax, then scale, then the cast, all on the device.
  Buffer scratch(&be, 3 * sizeof(float));
  float *amax = scratch.floats(), *scale = amax + 1, *scale_inv = amax + 2;
  be.amax(x, amax, false);
  be.scale_from_amax(amax, scale, scale_inv, fp8_max(ref.dtype), o.power_of_2_scales, o.amax_epsilon);
  be.cast_transpose(x, scale, o.amax, out, out_t);
}

}  // namespace

extern "C" {

TE_API te_status te_activation_forward(te_context *ctx, te_activation act, const te_tensor *x, te_tensor *y) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Activation a = to_activation(act);
    TensorView xv = to_view(x, "x"), yv = to_view(y, "y");
    check_high_precision(xv, "x");
    check_dtype(yv, "y", xv.dtype);
    check_device(xv, "x", c->device());
    check_device(yv, "y", c->device());
    check_activation_output(a, xv, yv, "y");
    c->backend().activation_forward(a, xv, yv);
  });
}

TE_API te_status te_activation_backward(te_context *ctx, te_activation act, const te_tensor *x, const te_tensor *dy,
                                        te_tensor *dx) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    Activation a = to_activation(act);
    TensorView xv = to_view(x, "x"), dyv = to_view(dy, "dy"), dxv = to_view(dx, "dx");
    check_high_precision(xv, "x");
    check_dtype(dyv, "dy", xv.dtype);
    check_dtype(dxv, "dx", xv.dtype);
    check_device(xv, "x", c->device());
    check_device(dyv, "dy", c->device());
    check_device(dxv, "dx", c->device());
    check_activation_output(a, xv, dyv, "dy");
    check_same_shape(dxv, "dx", xv, "x");
    c->backend().activation_backward(a, xv, dyv, dxv);
  });
}

TE_API te_status te_quantize_options_init(te_quantize_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_quantize_options{};
    opts->struct_size = sizeof *opts;
  });
}

TE_API te_status te_quantize(te_context *ctx, const te_tensor *x, te_tensor *out, const te_quantize_options *opts) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    TensorView xv = to_view(x, "x"), ov = to_view(out, "out");
    check_high_precision(xv, "x");
    check_fp8(ov, "out");
    check_device(xv, "x", c->device());
    check_device(ov, "out", c->device());
    check_same_shape(ov, "out", xv, "x");
    te_quantize_options o = quantize_options(opts);
    quantize_into(*c, xv, &ov, nullptr, o);
  });
}

TE_API te_status te_cast_transpose(te_context *ctx, const te_tensor *x, te_tensor *out, te_tensor *out_t,
                                   const te_quantize_options *opts) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    TensorView xv = to_view(x, "x");
    TensorView ov = to_optional_view(out, "out"), tv = to_optional_view(out_t, "out_t");
    if (!out && !out_t) fail(Status::InvalidArgument, "argument 'out': expected 'out', 'out_t' or both, got two NULLs");
    check_high_precision(xv, "x");
    check_device(xv, "x", c->device());
    if (out) {
      check_fp8(ov, "out");
      check_device(ov, "out", c->device());
      check_matrix(ov, "out", xv.rows(), xv.cols());
    }
    if (out_t) {
      check_fp8(tv, "out_t");
      check_device(tv, "out_t", c->device());
      if (tv.ndim != 2) fail(Status::InvalidArgument, "argument 'out_t': expected 2 dimensions, got %d", tv.ndim);
      check_matrix(tv, "out_t", xv.cols(), xv.rows());
    }
    te_quantize_options o = quantize_options(opts);
    quantize_into(*c, xv, out ? &ov : nullptr, out_t ? &tv : nullptr, o);
  });
}

TE_API te_status te_dequantize(te_context *ctx, const te_tensor *x, te_tensor *out) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    TensorView xv = to_view(x, "x"), ov = to_view(out, "out");
    check_fp8(xv, "x");
    check_high_precision(ov, "out");
    check_device(xv, "x", c->device());
    check_device(ov, "out", c->device());
    check_same_shape(ov, "out", xv, "x");
    c->backend().dequantize(xv, ov);
  });
}

TE_API te_status te_amax(te_context *ctx, const te_tensor *x, float *amax) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    TensorView xv = to_view(x, "x");
    check_not_null(amax, "amax");
    check_high_precision(xv, "x");
    check_device(xv, "x", c->device());
    c->backend().amax(xv, amax, false);
  });
}

TE_API te_status te_gemm_options_init(te_gemm_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_gemm_options{};
    opts->struct_size = sizeof *opts;
  });
}

TE_API te_status te_gemm(te_context *ctx, const te_tensor *a, const te_tensor *b, te_tensor *d, const te_gemm_options *opts) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    te_gemm_options o{};
    o.struct_size = sizeof o;
    if (opts) {
      check_options(opts, "opts");
      o = *opts;
    }
    check_bool(o.transa, "opts->transa");
    check_bool(o.transb, "opts->transb");
    check_bool(o.accumulate, "opts->accumulate");
    check_bool(o.use_split_accumulator, "opts->use_split_accumulator");
    const int epilogue = enum_int(o.epilogue);
    if (epilogue < TE_EPILOGUE_NONE || epilogue > TE_EPILOGUE_BIAS_GELU)
      fail(Status::InvalidArgument, "argument 'opts->epilogue': expected a te_epilogue value, got %d", epilogue);
    GemmArgs g;
    g.a = to_view(a, "a");
    g.b = to_view(b, "b");
    g.d = to_view(d, "d");
    g.transa = o.transa;
    g.transb = o.transb;
    g.epilogue = static_cast<Epilogue>(epilogue);
    g.accumulate = o.accumulate;
    g.split_accumulator = o.use_split_accumulator;
    const Device &dev = c->device();
    check_device(g.a, "a", dev);
    check_device(g.b, "b", dev);
    check_device(g.d, "d", dev);
    for (const auto &[v, name] : {std::pair<const TensorView &, const char *>{g.a, "a"}, {g.b, "b"}, {g.d, "d"}})
      if (v.ndim != 2) fail(Status::InvalidArgument, "argument '%s': expected 2 dimensions, got %d", name, v.ndim);
    check_high_precision(g.d, "d");
    if (is_fp8(g.a.dtype) != is_fp8(g.b.dtype))
      fail(Status::InvalidArgument, "argument 'b': expected FP8 like 'a' (or neither), got %s and %s",
           dtype_name(g.a.dtype), dtype_name(g.b.dtype));
    if (!is_fp8(g.a.dtype)) {
      check_high_precision(g.a, "a");
      check_dtype(g.b, "b", g.a.dtype);
    }
    int64_t m = g.transa ? g.a.shape[1] : g.a.shape[0], k = g.transa ? g.a.shape[0] : g.a.shape[1];
    int64_t kb = g.transb ? g.b.shape[1] : g.b.shape[0], n = g.transb ? g.b.shape[0] : g.b.shape[1];
    if (kb != k)
      fail(Status::InvalidArgument, "argument 'b': op(b) must have %lld rows (op(a)'s columns), got %lld", (long long)k, (long long)kb);
    check_matrix(g.d, "d", m, n);
    if (is_fp8(g.a.dtype)) {
      if (g.transa || !g.transb)
        fail(Status::Unsupported, "argument 'opts': FP8 GEMMs need transa=0 and transb=1 (both operands K-major, "
             "cuBLASLt's TN rule), got transa=%d transb=%d", o.transa, o.transb);
      if (g.a.dtype == DType::E5M2 && g.b.dtype == DType::E5M2)
        fail(Status::Unsupported, "argument 'b': FP8 GEMMs need at least one E4M3 operand, got E5M2 x E5M2");
      check_fp8_dims("argument 'a'", m, n, k);
      if (g.a.scaling == ScalingMode::Block128x128)
        fail(Status::Unsupported, "argument 'a': block-scaled A must use 1x128 blocks, got 128x128");
      if ((g.a.scaling == ScalingMode::PerTensor) != (g.b.scaling == ScalingMode::PerTensor))
        fail(Status::Unsupported, "argument 'b': per-tensor and block scaling cannot be mixed in one GEMM");
    }
    bool bias = g.epilogue == Epilogue::Bias || g.epilogue == Epilogue::BiasGelu;
    bool gelu = g.epilogue == Epilogue::Gelu || g.epilogue == Epilogue::BiasGelu;
    if (bias) {
      g.bias = to_view(o.bias, "opts->bias");
      check_high_precision(g.bias, "opts->bias");
      check_device(g.bias, "opts->bias", dev);
      if (g.bias.ndim != 1 || g.bias.shape[0] != n)
        fail(Status::InvalidArgument, "argument 'opts->bias': expected shape [%lld], got %d dims, %lld elements",
             (long long)n, g.bias.ndim, (long long)g.bias.numel());
    } else if (o.bias) {
      fail(Status::InvalidArgument, "argument 'opts->bias': the epilogue adds no bias, expected NULL");
    }
    if (o.gelu_input) {
      if (!gelu) fail(Status::InvalidArgument, "argument 'opts->gelu_input': the epilogue has no GELU, expected NULL");
      g.gelu_input = to_view(o.gelu_input, "opts->gelu_input");
      check_high_precision(g.gelu_input, "opts->gelu_input");
      check_device(g.gelu_input, "opts->gelu_input", dev);
      check_matrix(g.gelu_input, "opts->gelu_input", m, n);
    }
    c->backend().gemm(g);
  });
}

}  // extern "C"
