"""Activations and primitives for callers who build their own layers."""

import numpy as np

from . import _constants as C
from ._arrays import adapt, te_dtype
from ._lowlevel import ll
from .errors import InvalidArgument
from .tensor import (Float8Tensor, as_input, check_context, follow_streams, fp8_dtype,
                     new_output, one_float, scaling_mode)

__all__ = ["activation_forward", "activation_backward", "quantize", "cast_transpose",
           "dequantize", "amax", "gemm", "add", "split_columns", "concat_columns"]

_ACTIVATIONS = {"relu": C.ACTIVATION_RELU, "gelu": C.ACTIVATION_GELU,
                "swiglu": C.ACTIVATION_SWIGLU, "geglu": C.ACTIVATION_GEGLU,
                "srelu": C.ACTIVATION_SRELU}


def _activation(act):
    code = _ACTIVATIONS.get(act.lower()) if isinstance(act, str) else None
    if code is None:
        raise InvalidArgument("argument 'act': expected 'relu', 'gelu', 'swiglu', 'geglu' or "
                              "'srelu', got %r" % (act,))
    return code


def _hp(ctx, x, name):
    if isinstance(x, Float8Tensor):
        raise InvalidArgument("argument '%s': expected a float32, float16 or bfloat16 array, "
                              "got a Float8Tensor" % name)
    return as_input(ctx, x, name)


def activation_forward(ctx, act, x, out=None):
    """y = act(x), act 'relu' | 'gelu' (tanh approximation) | 'srelu' (squared ReLU) |
    'swiglu' / 'geglu' (gated: x [..., 2n] -> act(x[..., :n]) * x[..., n:], last dim halved)."""
    h = check_context(ctx)
    code = _activation(act)
    a_x = _hp(ctx, x, "x")
    if out is None:
        shape = tuple(a_x.desc[2])
        if code in C.GATED_ACTIVATIONS:
            if shape[-1] % 2:
                raise InvalidArgument("argument 'x': %s needs an even last dimension, got "
                                      "shape %s" % (act.lower(), shape))
            shape = shape[:-1] + (shape[-1] // 2,)
        out = new_output((a_x,), shape, a_x.desc[1], "out")
    a_y = as_input(ctx, out, "out", writable=True)
    follow_streams(ctx, a_x, a_y)
    ll.activation_forward(h, code, a_x.desc, a_y.desc)
    return out


def activation_backward(ctx, act, x, dy, out=None):
    """dx = dy * act'(x)."""
    h = check_context(ctx)
    code = _activation(act)
    a_x = _hp(ctx, x, "x")
    a_dy = _hp(ctx, dy, "dy")
    if out is None:
        out = new_output((a_x, a_dy), tuple(a_x.desc[2]), a_x.desc[1], "out")
    a_dx = as_input(ctx, out, "out", writable=True)
    follow_streams(ctx, a_x, a_dy, a_dx)
    ll.activation_backward(h, code, a_x.desc, a_dy.desc, a_dx.desc)
    return out


def _fp8_out(ctx, out, like, shape, dtype, scaling, name):
    if out is None:
        if not like.is_numpy:
            raise InvalidArgument("argument '%s': pass a Float8Tensor: libte allocates outputs "
                                  "only for NumPy inputs" % name)
        out = Float8Tensor.empty(shape, dtype, scaling)
    elif not isinstance(out, Float8Tensor):
        raise InvalidArgument("argument '%s': expected a libte.Float8Tensor, got %s"
                              % (name, type(out).__name__))
    return out, out._adapt(ctx, name, writable=True)


def quantize(ctx, x, out=None, *, dtype="e4m3", scaling="per_tensor", scale=None, amax=None,
             amax_epsilon=0.0, power_2_scale=False):
    """FP8 codes of x with their scale_inv (a Float8Tensor; `out` to write into one).
    scale: per-tensor scale to use (delayed scaling), a float32 one-element array (or a number
    on a CPU context); None computes it from x's amax. amax: optional float32 one-element
    array x's amax is max-accumulated into."""
    h = check_context(ctx)
    a_x = _hp(ctx, x, "x")
    out, a_out = _fp8_out(ctx, out, a_x, a_x.desc[2], fp8_dtype(dtype), scaling_mode(scaling),
                          "out")
    a_scale = one_float(ctx, scale, "scale", False)
    a_amax = one_float(ctx, amax, "amax", True)
    follow_streams(ctx, a_x, a_out, a_scale, a_amax)
    ll.quantize(h, a_x.desc, a_out.desc, a_scale.desc[0] if a_scale else 0,
                a_amax.desc[0] if a_amax else 0, float(amax_epsilon), power_2_scale)
    return out


def cast_transpose(ctx, x, out=None, out_t=None, *, dtype="e4m3", scaling="per_tensor",
                   scale=None, amax=None, amax_epsilon=0.0, power_2_scale=False):
    """Quantizes x [rows, cols] into out [rows, cols] and out_t [cols, rows] in one pass.
    Pass out=False or out_t=False to skip one. Returns (out, out_t)."""
    h = check_context(ctx)
    a_x = _hp(ctx, x, "x")
    shape = tuple(a_x.desc[2])
    if len(shape) != 2:
        raise InvalidArgument("argument 'x': expected a matrix [rows, cols], got shape %s"
                              % (shape,))
    code, mode = fp8_dtype(dtype), scaling_mode(scaling)
    a_out = a_out_t = None
    if out is not False:
        out, a_out = _fp8_out(ctx, out, a_x, shape, code, mode, "out")
    if out_t is not False:
        out_t, a_out_t = _fp8_out(ctx, out_t, a_x, shape[::-1], code, mode, "out_t")
    a_scale = one_float(ctx, scale, "scale", False)
    a_amax = one_float(ctx, amax, "amax", True)
    follow_streams(ctx, a_x, a_out, a_out_t, a_scale, a_amax)
    ll.cast_transpose(h, a_x.desc, a_out.desc if a_out else None,
                      a_out_t.desc if a_out_t else None, a_scale.desc[0] if a_scale else 0,
                      a_amax.desc[0] if a_amax else 0, float(amax_epsilon), power_2_scale)
    return (out if out is not False else None), (out_t if out_t is not False else None)


def dequantize(ctx, x, out=None, *, dtype="float32"):
    """code * scale_inv of a Float8Tensor, into `out` or a new array of `dtype`."""
    h = check_context(ctx)
    if not isinstance(x, Float8Tensor):
        raise InvalidArgument("argument 'x': expected a libte.Float8Tensor, got %s"
                              % type(x).__name__)
    a_x = x._adapt(ctx, "x", writable=False)
    if out is None:
        out = new_output((a_x,), x.shape, te_dtype(dtype), "out")
    if isinstance(out, Float8Tensor):
        raise InvalidArgument("argument 'out': expected a high-precision array, got a "
                              "Float8Tensor")
    a_out = as_input(ctx, out, "out", writable=True)
    follow_streams(ctx, a_x, a_out)
    ll.dequantize(h, a_x.desc, a_out.desc)
    return out


def amax(ctx, x, out=None):
    """max |x| (NaN if x holds one). Returns a float, or writes into `out` (a float32
    one-element array on x's device) and returns it."""
    h = check_context(ctx)
    a_x = _hp(ctx, x, "x")
    result = out if out is not None else np.zeros(1, np.float32)
    a_out = one_float(ctx, result, "out", True)
    follow_streams(ctx, a_x, a_out)
    ll.amax(h, a_x.desc, a_out.desc[0])
    return out if out is not None else float(result[0])


def gemm(ctx, a, b, out=None, *, transa=False, transb=False, bias=None, gelu=False,
         gelu_input=None, accumulate=False, use_split_accumulator=False, dtype="float32"):
    """out[m, n] = epilogue(op(a) op(b) (+ out when accumulate)), op = transpose when trans*.
    a, b: both Float8Tensor (FP8 rules: transa=False, transb=True, dims multiples of 16) or
    both arrays of one dtype. bias [n] adds a bias, gelu=True applies GELU (gelu_input, [m, n],
    receives the pre-GELU values). A new `out` has `dtype`."""
    h = check_context(ctx)
    a_a = as_input(ctx, a, "a")
    a_b = as_input(ctx, b, "b")
    sa, sb = tuple(a_a.desc[2]), tuple(a_b.desc[2])
    if len(sa) != 2 or len(sb) != 2:
        raise InvalidArgument("arguments 'a' and 'b': expected matrices, got shapes %s and %s"
                              % (sa, sb))
    if out is None:
        if accumulate:
            raise InvalidArgument("argument 'out': accumulate=True needs the existing out")
        m = sa[1] if transa else sa[0]
        n = sb[0] if transb else sb[1]
        out = new_output((a_a, a_b), (m, n), te_dtype(dtype), "out")
    a_d = as_input(ctx, out, "out", writable=True)
    a_bias = _hp(ctx, bias, "bias") if bias is not None else None
    a_gelu = as_input(ctx, gelu_input, "gelu_input", writable=True) \
        if gelu_input is not None else None
    epilogue = {(False, False): C.EPILOGUE_NONE, (True, False): C.EPILOGUE_BIAS,
                (False, True): C.EPILOGUE_GELU, (True, True): C.EPILOGUE_BIAS_GELU}[
        (bias is not None, bool(gelu))]
    follow_streams(ctx, a_a, a_b, a_d, a_bias, a_gelu)
    ll.gemm(h, a_a.desc, a_b.desc, a_d.desc, transa, transb, epilogue,
            a_bias.desc if a_bias else None, a_gelu.desc if a_gelu else None, accumulate,
            use_split_accumulator)
    return out


# ---- glue between modules: residual adds, column split / concat ---------------------------------

def add(ctx, a, b, out=None):
    """out = a + b elementwise (fp32 arithmetic, rounded once to out's dtype): a, b and out of
    one dtype (float32, float16, bfloat16) and one shape; out may be a or b (in place).
    Returns out (a new NumPy array for NumPy inputs when not given)."""
    h = check_context(ctx)
    a_a = _hp(ctx, a, "a")
    a_b = _hp(ctx, b, "b")
    if out is None:
        out = new_output((a_a, a_b), tuple(a_a.desc[2]), a_a.desc[1], "out")
    if isinstance(out, Float8Tensor):
        raise InvalidArgument("argument 'out': expected a float32, float16 or bfloat16 array, "
                              "got a Float8Tensor")
    a_y = as_input(ctx, out, "out", writable=True)
    follow_streams(ctx, a_a, a_b, a_y)
    ll.add(h, a_a.desc, a_b.desc, a_y.desc)
    return out


def _is_int32(x):
    dt = getattr(x, "dtype", None)
    return dt is not None and str(dt).rpartition(".")[2] == "int32"


def _any_input(ctx, x, name, writable=False):
    """Adapted for data of any dtype split/concat move as bytes: a high-precision array, an
    int32 array or a Float8Tensor."""
    if isinstance(x, Float8Tensor):
        return x._adapt(ctx, name, writable)
    if _is_int32(x):
        return adapt(x, name, writable=writable, device=ctx.device, stream=ctx._stream,
                     index="int32 data")
    return as_input(ctx, x, name, writable)


def _like(part, a_part, shape, name):
    """A new host output like `part` (an array or a per-tensor Float8Tensor, whose scale_inv is
    copied: split and concat move the codes, the scale stays the same)."""
    if isinstance(part, Float8Tensor):
        if not a_part.is_numpy:
            raise InvalidArgument("argument '%s': pass outputs: libte allocates outputs only for "
                                  "NumPy inputs" % name)
        if part.scaling != C.SCALING_PER_TENSOR:
            raise InvalidArgument("argument '%s': pass outputs for block-scaled FP8 data (their "
                                  "scale_inv blocks follow the columns)" % name)
        return Float8Tensor(np.empty(shape, part.numpy_codes().dtype),
                            np.array(part.scale_inv, np.float32, copy=True), part.dtype,
                            part.scaling)
    return new_output((a_part,), shape, a_part.desc[1], name)


def _ints(values, name):
    try:
        out = [int(v) for v in values]
    except (TypeError, ValueError):
        raise InvalidArgument("argument '%s': expected a sequence of ints, got %r"
                              % (name, values)) from None
    return out


def split_columns(ctx, x, sizes=None, *, out=None):
    """Splits x [..., c_0 + ... + c_{n-1}] by its last dimension into n arrays [..., c_i] (a
    fused QKV projection's output into q, k, v): `sizes` the c_i (new outputs, NumPy inputs
    only), or `out` a list of arrays to write (any shape of rows * c_i elements whose last
    dimension is c_i). Any dtype (FP8 as Float8Tensor: codes move, scale_inv does not; new FP8
    outputs get a copy of x's per-tensor scale_inv); exact copies. Returns the list of parts."""
    h = check_context(ctx)
    a_x = _any_input(ctx, x, "x")
    if out is None:
        if sizes is None:
            raise InvalidArgument("arguments 'sizes' and 'out': pass the column counts or the "
                                  "outputs")
        lead = tuple(a_x.desc[2][:-1])
        out = [_like(x, a_x, lead + (c,), "out[%d]" % i)
               for i, c in enumerate(_ints(sizes, "sizes"))]
    else:
        out = list(out)
        if sizes is not None:
            widths = [tuple(getattr(o, "shape", ()))[-1:] for o in out]
            if [w[0] if w else None for w in widths] != _ints(sizes, "sizes"):
                raise InvalidArgument("argument 'sizes': %r differs from the outputs' last "
                                      "dimensions %r" % (list(sizes), [w[0] if w else None
                                                                       for w in widths]))
    parts = [_any_input(ctx, o, "out[%d]" % i, writable=True) for i, o in enumerate(out)]
    follow_streams(ctx, a_x, *parts)
    ll.split_columns(h, a_x.desc, [p.desc for p in parts])
    return out


def concat_columns(ctx, parts, out=None):
    """The inverse of split_columns: out[..., c_0 + ... + c_{n-1}] from parts [..., c_i] (one
    dtype throughout, any; FP8 as Float8Tensor). A new output (NumPy inputs only) has the
    first part's leading shape; for FP8 it gets a copy of the first part's per-tensor
    scale_inv. Returns out."""
    h = check_context(ctx)
    parts = list(parts)
    adapted = [_any_input(ctx, p, "parts[%d]" % i) for i, p in enumerate(parts)]
    if out is None:
        if not parts:
            raise InvalidArgument("argument 'parts': expected at least one array, got none")
        shape = tuple(adapted[0].desc[2][:-1]) + (sum(a.desc[2][-1] for a in adapted),)
        if not all(a.is_numpy for a in adapted):
            raise InvalidArgument("argument 'out': pass an output array: libte allocates "
                                  "outputs only for NumPy inputs")
        out = _like(parts[0], adapted[0], shape, "out")
    a_y = _any_input(ctx, out, "out", writable=True)
    follow_streams(ctx, a_y, *adapted)
    ll.concat_columns(h, [a.desc for a in adapted], a_y.desc)
    return out
