"""Float8Tensor (FP8 codes + their scale_inv), and the shared steps of every tensor call:
adapting caller arrays, following their stream, allocating NumPy outputs."""

import numbers

import numpy as np

from . import _constants as C
from ._arrays import adapt, numpy_dtype, te_dtype
from ._lowlevel import ll
from .context import Context
from .errors import InvalidArgument

__all__ = ["Float8Tensor"]

_SCALINGS = {"per_tensor": C.SCALING_PER_TENSOR, "block_1x128": C.SCALING_BLOCK_1X128,
             "1x128": C.SCALING_BLOCK_1X128, "block_128x128": C.SCALING_BLOCK_128X128,
             "128x128": C.SCALING_BLOCK_128X128}
SCALING_NAMES = {C.SCALING_PER_TENSOR: "per_tensor", C.SCALING_BLOCK_1X128: "block_1x128",
                 C.SCALING_BLOCK_128X128: "block_128x128"}


def scaling_mode(scaling):
    if isinstance(scaling, str) and scaling.lower() in _SCALINGS:
        return _SCALINGS[scaling.lower()]
    if isinstance(scaling, int) and not isinstance(scaling, bool) and scaling in SCALING_NAMES:
        return scaling
    raise InvalidArgument("argument 'scaling': expected 'per_tensor', 'block_1x128' or "
                          "'block_128x128', got %r" % (scaling,))


def fp8_dtype(dtype, name="dtype"):
    code = te_dtype(dtype, name)
    if code not in C.FP8_DTYPES:
        raise InvalidArgument("argument '%s': expected an FP8 dtype (float8_e4m3fn or "
                              "float8_e5m2), got %r" % (name, dtype))
    return code


def check_context(ctx):
    if not isinstance(ctx, Context):
        raise InvalidArgument("argument 'ctx': expected a libte.Context, got %s"
                              % type(ctx).__name__)
    return ctx._handle()


def follow_streams(ctx, *adapted):
    """CUDA array interfaces name the stream their data is ready on: enqueue there."""
    for a in adapted:
        if a is not None and a.stream is not None and a.stream != ctx._stream:
            ctx.set_stream(a.stream)


def new_output(inputs, shape, code, name):
    """A NumPy output for host inputs; device inputs need the caller to pass one."""
    if all(a is None or a.is_numpy for a in inputs):
        return np.empty(shape, numpy_dtype(code))
    raise InvalidArgument("argument '%s': pass an output array: libte allocates outputs only "
                          "for NumPy inputs" % name)


def _infer_fp8(data):
    dt = getattr(data, "dtype", None)
    name = str(dt).rpartition(".")[2] if dt is not None else ""
    if name in ("float8_e4m3fn", "float8_e5m2"):
        return te_dtype(name)
    raise InvalidArgument("argument 'dtype': required for FP8 data of dtype %s (pass "
                          "dtype='e4m3' or 'e5m2')" % (dt,))


class Float8Tensor:
    """FP8 codes and their scale_inv: value = code * scale_inv (per tensor or per block).

    data       NumPy array of ml_dtypes float8_e4m3fn / float8_e5m2, or of uint8 with an
               explicit `dtype`; or a device array (CUDA array interface, DLPack)
    scale_inv  float32 array holding te_tensor_scale_inv_count floats (1 per tensor, or one per
               block), on the same device
    dtype      'e4m3' | 'e5m2' (inferred from an FP8 NumPy dtype)
    scaling    'per_tensor' | 'block_1x128' | 'block_128x128'
    """

    __slots__ = ("data", "scale_inv", "dtype", "scaling", "shape")

    def __init__(self, data, scale_inv, dtype=None, scaling="per_tensor"):
        self.dtype = _infer_fp8(data) if dtype is None else fp8_dtype(dtype)
        self.scaling = scaling_mode(scaling)
        shape = getattr(data, "shape", None)
        if shape is None:
            raise InvalidArgument("argument 'data': expected an array, got %s"
                                  % type(data).__name__)
        self.shape = tuple(int(d) for d in shape)
        self.data = data
        self.scale_inv = scale_inv
        needed = self.scale_inv_count(self.shape, self.dtype, self.scaling)
        have = getattr(scale_inv, "size", None)
        if have is None:
            have = int(np.prod(getattr(scale_inv, "shape", (0,))))
        if have < needed:
            raise InvalidArgument("argument 'scale_inv': expected %d float32 values for shape %s "
                                  "with %s scaling, got %d" % (needed, self.shape,
                                                               SCALING_NAMES[self.scaling], have))

    @staticmethod
    def scale_inv_count(shape, dtype="e4m3", scaling="per_tensor"):
        """te_tensor_scale_inv_count: floats a scale_inv of this shape and scaling holds."""
        return ll.tensor_scale_inv_count(fp8_dtype(dtype), tuple(shape), scaling_mode(scaling))

    @classmethod
    def empty(cls, shape, dtype="e4m3", scaling="per_tensor"):
        """Host storage for an FP8 result (quantize's `out`)."""
        code = fp8_dtype(dtype)
        shape = tuple(int(d) for d in shape)
        count = cls.scale_inv_count(shape, code, scaling)
        return cls(np.empty(shape, numpy_dtype(code)), np.ones(count, np.float32), code, scaling)

    @property
    def dtype_name(self):
        return C.DTYPE_NAMES[self.dtype]

    @property
    def scaling_name(self):
        return SCALING_NAMES[self.scaling]

    def _adapt(self, ctx, name, writable):
        data = adapt(self.data, name, writable=writable, fp8_dtype=self.dtype, device=ctx.device,
                     stream=ctx._stream)
        scale = adapt(self.scale_inv, name + ".scale_inv", writable=writable, device=ctx.device,
                      stream=ctx._stream)
        if scale.desc[1] != C.DTYPE_F32:
            raise InvalidArgument("argument '%s.scale_inv': expected float32, got %s"
                                  % (name, C.DTYPE_NAMES[scale.desc[1]]))
        if tuple(data.desc[2]) != self.shape:
            raise InvalidArgument("argument '%s': its data changed shape" % name)
        d = data.desc
        data.desc = (d[0], d[1], d[2], d[3], d[4], scale.desc[0], self.scaling)
        data.keep = (data.keep, scale.keep)
        data.is_numpy = data.is_numpy and scale.is_numpy
        if data.stream is None:
            data.stream = scale.stream
        return data

    def numpy_codes(self):
        """The codes as an FP8 NumPy array (host data only)."""
        a = np.asarray(self.data)
        return a if a.dtype != np.uint8 else a.view(numpy_dtype(self.dtype))

    def __repr__(self):
        return "<libte.Float8Tensor %s shape=%s %s>" % (self.dtype_name, self.shape,
                                                        self.scaling_name)


def as_input(ctx, x, name, writable=False):
    """Adapted for a high-precision array or a Float8Tensor."""
    if isinstance(x, Float8Tensor):
        return x._adapt(ctx, name, writable)
    return adapt(x, name, writable=writable, device=ctx.device, stream=ctx._stream)


def one_float(ctx, value, name, writable):
    """A one-float device/host buffer (quantize's scale and amax): a float32 array, or a Python
    number for a host context (copied)."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and not writable:
        value = np.array([value], np.float32)
    a = adapt(value, name, writable=writable, device=ctx.device, stream=ctx._stream)
    if a.desc[1] != C.DTYPE_F32:
        raise InvalidArgument("argument '%s': expected float32, got %s"
                              % (name, C.DTYPE_NAMES[a.desc[1]]))
    return a
