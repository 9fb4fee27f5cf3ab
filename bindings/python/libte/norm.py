"""LayerNorm and RMSNorm over the last dimension (te_norm_forward / te_norm_backward).

    res = libte.norm_forward(ctx, x, gamma, beta)                  # LayerNorm, y in x's dtype
    res = libte.norm_forward(ctx, x, gamma, kind="rmsnorm", dtype="e4m3", out_t=True)
    y, y_t, mu, rsigma = res                                       # FP8: Float8Tensors
    dx, dgamma, dbeta = libte.norm_backward(ctx, dy, x, gamma, mu, rsigma)
"""

import collections

from . import _constants as C
from ._arrays import te_dtype
from ._lowlevel import ll
from .errors import InvalidArgument
from .tensor import (Float8Tensor, as_input, check_context, follow_streams, new_output,
                     one_float)

__all__ = ["NormGradients", "NormOutputs", "norm_backward", "norm_forward"]

_KINDS = {"layernorm": C.NORM_LAYERNORM, "rmsnorm": C.NORM_RMSNORM}

NormOutputs = collections.namedtuple("NormOutputs", "out out_t mu rsigma")
NormOutputs.__doc__ = """What norm_forward wrote: the normalised values (an array or a
Float8Tensor), their FP8 transpose [hidden, rows], and the statistics mu (LayerNorm) and
rsigma, float32 [rows]; None for each output not asked for."""
NormGradients = collections.namedtuple("NormGradients", "dx dgamma dbeta")
NormGradients.__doc__ = """norm_backward's results; None for each output not asked for (dbeta
always None for RMSNorm)."""


def _kind(kind):
    code = _KINDS.get(kind.lower()) if isinstance(kind, str) else None
    if code is None:
        raise InvalidArgument("argument 'kind': expected 'layernorm' or 'rmsnorm', got %r"
                              % (kind,))
    return code


def _hp(ctx, x, name, writable=False):
    if isinstance(x, Float8Tensor):
        raise InvalidArgument("argument '%s': expected a float32, float16 or bfloat16 array, "
                              "got a Float8Tensor" % name)
    return as_input(ctx, x, name, writable=writable)


def _fp8(ctx, t, name):
    if not isinstance(t, Float8Tensor):
        raise InvalidArgument("argument '%s': expected a libte.Float8Tensor, got %s"
                              % (name, type(t).__name__))
    return t._adapt(ctx, name, writable=True)


def norm_forward(ctx, x, gamma, beta=None, *, kind="layernorm", eps=1e-5,
                 zero_centered_gamma=False, out=None, out_t=False, mu=None, rsigma=None,
                 dtype=None, scale=None, amax=None, amax_epsilon=0.0, power_2_scale=False):
    """y = norm(x) over x's last dimension (hidden); the other dimensions are rows.

    kind                'layernorm' ((x - mean) / sqrt(var + eps) * gamma + beta; beta
                        required) or 'rmsnorm' (x / sqrt(mean(x^2) + eps) * gamma; no beta)
    zero_centered_gamma the scale applied is (1 + gamma)
    out                 None: a new output, an array of `dtype` (default x's dtype) or, for an
                        FP8 `dtype` ('e4m3', 'e5m2'), a Float8Tensor; an array or Float8Tensor
                        (x's shape or [rows, hidden]) to write into; False: none (needs out_t)
    out_t               False (default): none; True: a new Float8Tensor [hidden, rows] (out's
                        FP8 dtype, else `dtype`, else e4m3); or a Float8Tensor to write into
    mu, rsigma          None: new float32 arrays [rows] (mu for LayerNorm only); arrays to
                        write into; False: not computed
    scale               FP8 outputs: the per-tensor scale (delayed scaling; a float32 one-element
                        array, or a number on a CPU context); None: current scaling from y's own
                        amax, with amax_epsilon and power_2_scale
    amax                a float32 one-element array max |y| is max-accumulated into (any output)

    New outputs are allocated for NumPy inputs only. Returns NormOutputs(out, out_t, mu, rsigma).
    """
    h = check_context(ctx)
    code = _kind(kind)
    a_x = _hp(ctx, x, "x")
    a_g = _hp(ctx, gamma, "gamma")
    a_b = _hp(ctx, beta, "beta") if beta is not None else None
    shape = tuple(a_x.desc[2])
    hidden = shape[-1] if shape else 1
    rows = 1
    for d in shape[:-1]:
        rows *= d
    out_code = te_dtype(dtype) if dtype is not None else a_x.desc[1]

    a_out = None
    if out is None:
        if out_code in C.FP8_DTYPES:
            if not a_x.is_numpy:
                raise InvalidArgument("argument 'out': pass a Float8Tensor: libte allocates "
                                      "outputs only for NumPy inputs")
            out = Float8Tensor.empty(shape, out_code)
        else:
            out = new_output((a_x,), shape, out_code, "out")
    if out is not False:
        a_out = as_input(ctx, out, "out", writable=True)
    else:
        out = None

    a_out_t = None
    if out_t is True:
        if not a_x.is_numpy:
            raise InvalidArgument("argument 'out_t': pass a Float8Tensor: libte allocates "
                                  "outputs only for NumPy inputs")
        t_code = (out.dtype if isinstance(out, Float8Tensor) else
                  out_code if out_code in C.FP8_DTYPES else C.DTYPE_E4M3)
        out_t = Float8Tensor.empty((hidden, rows), t_code)
    if out_t is not False and out_t is not None:
        a_out_t = _fp8(ctx, out_t, "out_t")
    else:
        out_t = None

    stats = []
    for name, value, wanted in (("mu", mu, code == C.NORM_LAYERNORM), ("rsigma", rsigma, True)):
        if value is None and wanted:
            value = new_output((a_x,), (rows,), C.DTYPE_F32, name)
        if value is None or value is False:
            stats.append((None, None))
        else:
            stats.append((value, _hp(ctx, value, name, writable=True)))
    (mu, a_mu), (rsigma, a_rs) = stats

    a_scale = one_float(ctx, scale, "scale", False)
    a_amax = one_float(ctx, amax, "amax", True)
    quantize = None
    if a_scale is not None or a_amax is not None or amax_epsilon or power_2_scale:
        quantize = (a_scale.desc[0] if a_scale else 0, a_amax.desc[0] if a_amax else 0,
                    float(amax_epsilon), 1 if power_2_scale else 0)
    follow_streams(ctx, a_x, a_g, a_b, a_out, a_out_t, a_mu, a_rs, a_scale, a_amax)
    ll.norm_forward(h, code, float(eps), 1 if zero_centered_gamma else 0, a_x.desc, a_g.desc,
                    a_b.desc if a_b else None, a_out.desc if a_out else None,
                    a_out_t.desc if a_out_t else None, a_mu.desc if a_mu else None,
                    a_rs.desc if a_rs else None, quantize)
    return NormOutputs(out, out_t, mu, rsigma)


def norm_backward(ctx, dy, x, gamma, mu, rsigma, *, kind="layernorm", eps=1e-5,
                  zero_centered_gamma=False, dx=None, dgamma=None, dbeta=None):
    """Gradients of the norm from dy (x's shape and dtype), the forward's x, gamma and its
    statistics (mu: LayerNorm only, None for RMSNorm; rsigma).

    dx, dgamma, dbeta   None: new arrays (dx like x, dgamma/dbeta [hidden] of gamma's dtype;
                        dbeta for LayerNorm only); arrays to write into; False: not computed.
                        dgamma and dbeta are written, not accumulated.

    Returns NormGradients(dx, dgamma, dbeta).
    """
    h = check_context(ctx)
    code = _kind(kind)
    a_dy = _hp(ctx, dy, "dy")
    a_x = _hp(ctx, x, "x")
    a_g = _hp(ctx, gamma, "gamma")
    a_mu = _hp(ctx, mu, "mu") if mu is not None else None
    a_rs = _hp(ctx, rsigma, "rsigma") if rsigma is not None else None
    results = []
    for name, value, shape, like, wanted in (
            ("dx", dx, tuple(a_x.desc[2]), a_x, True),
            ("dgamma", dgamma, tuple(a_g.desc[2]), a_g, True),
            ("dbeta", dbeta, tuple(a_g.desc[2]), a_g, code == C.NORM_LAYERNORM)):
        if value is None and wanted:
            value = new_output((a_x, a_dy, a_g), shape, like.desc[1], name)
        if value is None or value is False:
            results.append((None, None))
        else:
            results.append((value, _hp(ctx, value, name, writable=True)))
    (dx, a_dx), (dgamma, a_dg), (dbeta, a_db) = results
    follow_streams(ctx, a_dy, a_x, a_g, a_mu, a_rs, a_dx, a_dg, a_db)
    ll.norm_backward(h, code, float(eps), 1 if zero_centered_gamma else 0, a_dy.desc, a_x.desc,
                     a_g.desc, a_mu.desc if a_mu else None, a_rs.desc if a_rs else None,
                     a_dx.desc if a_dx else None, a_dg.desc if a_dg else None,
                     a_db.desc if a_db else None)
    return NormGradients(dx, dgamma, dbeta)
