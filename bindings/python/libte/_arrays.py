"""Caller arrays -> TensorDesc tuples for the low-level interface, with no copies.

Accepted: NumPy arrays (host memory), objects with __cuda_array_interface__ (CuPy, Numba,
PyTorch CUDA tensors) and objects with __dlpack__ (PyTorch, JAX, CuPy, NumPy ≥ 1.22). Every
property the C library cannot check from a te_tensor is checked here: the Python type,
contiguity, writability of outputs, dtype, rank, and the size of FP8 scale_inv buffers.
"""

import ctypes

import numpy as np

from . import _constants as C
from ._dlpack import DLPackImport
from .errors import InvalidArgument

try:  # bfloat16 and FP8 NumPy dtypes
    import ml_dtypes
except ImportError:  # pragma: no cover - exercised only without ml_dtypes
    ml_dtypes = None

_NUMPY_TO_TE = {np.dtype(np.float32): C.DTYPE_F32, np.dtype(np.float16): C.DTYPE_F16}
if ml_dtypes is not None:
    _NUMPY_TO_TE[np.dtype(ml_dtypes.bfloat16)] = C.DTYPE_BF16
    _NUMPY_TO_TE[np.dtype(ml_dtypes.float8_e4m3fn)] = C.DTYPE_E4M3
    _NUMPY_TO_TE[np.dtype(ml_dtypes.float8_e5m2)] = C.DTYPE_E5M2
_UINT8 = np.dtype(np.uint8)
_INT32 = np.dtype(np.int32)

_NAME_TO_TE = {
    "float32": C.DTYPE_F32, "f32": C.DTYPE_F32, "fp32": C.DTYPE_F32,
    "float16": C.DTYPE_F16, "f16": C.DTYPE_F16, "fp16": C.DTYPE_F16, "half": C.DTYPE_F16,
    "bfloat16": C.DTYPE_BF16, "bf16": C.DTYPE_BF16,
    "float8_e4m3fn": C.DTYPE_E4M3, "e4m3": C.DTYPE_E4M3, "float8_e4m3": C.DTYPE_E4M3,
    "float8_e5m2": C.DTYPE_E5M2, "e5m2": C.DTYPE_E5M2,
}

_CAI_TYPESTR = {"<f4": C.DTYPE_F32, "<f2": C.DTYPE_F16}
_CAI_INT32 = {"<i4"}
_CAI_BYTES = {"|u1", "<u1", "|i1", "<i1"}
_CAI_VOID = {"<V2", "|V2"}


def te_dtype(dtype, name="dtype"):
    """A te_dtype code from a name ('bfloat16', 'e4m3', ...), a NumPy dtype, or a code."""
    if isinstance(dtype, str):
        code = _NAME_TO_TE.get(dtype.lower())
        if code is not None:
            return code
    elif isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype in C.DTYPE_NAMES:
            return dtype
    else:
        try:
            code = _NUMPY_TO_TE.get(np.dtype(dtype))
        except TypeError:
            code = None
        if code is not None:
            return code
        torch_name = str(dtype).rpartition(".")[2]  # torch.bfloat16 -> 'bfloat16'
        if torch_name in _NAME_TO_TE:
            return _NAME_TO_TE[torch_name]
    raise InvalidArgument("argument '%s': expected one of float32, float16, bfloat16, "
                          "float8_e4m3fn, float8_e5m2, got %r" % (name, dtype))


def numpy_dtype(code):
    """The NumPy dtype for a te_dtype (bfloat16 and FP8 need ml_dtypes)."""
    if code == C.DTYPE_F32:
        return np.dtype(np.float32)
    if code == C.DTYPE_F16:
        return np.dtype(np.float16)
    if code == C.DTYPE_I32:
        return _INT32
    if ml_dtypes is None:
        raise InvalidArgument("%s NumPy arrays need the ml_dtypes package (pip install "
                              "ml_dtypes)" % C.DTYPE_NAMES[code])
    return np.dtype({C.DTYPE_BF16: ml_dtypes.bfloat16, C.DTYPE_E4M3: ml_dtypes.float8_e4m3fn,
                     C.DTYPE_E5M2: ml_dtypes.float8_e5m2}[code])


def int32_role(index):
    """What an int32 argument holds, for messages: index=True is sequence offsets (attention's
    cu_seqlens); a string names it (e.g. 'token ids')."""
    return index if isinstance(index, str) else "sequence offsets"


def check_kind(code, fp8_dtype, name, got, index=False):
    """High precision expected (fp8_dtype None) or that FP8 dtype; with index=True (or a string
    naming what the int32 data is) int32 (sequence offsets: attention's cu_seqlens)."""
    if index:
        if code != C.DTYPE_I32:
            raise InvalidArgument("argument '%s': expected dtype int32 (%s), got %s"
                                  % (name, int32_role(index), got))
    elif fp8_dtype is None:
        if code is None or code in C.FP8_DTYPES or code == C.DTYPE_I32:
            raise InvalidArgument("argument '%s': expected dtype float32, float16 or bfloat16, "
                                  "got %s" % (name, got))
    elif code != fp8_dtype:
        raise InvalidArgument("argument '%s': expected FP8 data of dtype %s (or uint8), got %s"
                              % (name, C.DTYPE_NAMES[fp8_dtype], got))


def _check_rank(shape, name):
    if not 1 <= len(shape) <= C.MAX_DIMS:
        raise InvalidArgument("argument '%s': expected 1 to %d dimensions, got shape %s"
                              % (name, C.MAX_DIMS, tuple(shape)))
    for d in shape:
        if d < 1:
            raise InvalidArgument("argument '%s': expected no empty dimension, got shape %s"
                                  % (name, tuple(shape)))


def _contiguous_strides(shape, itemsize):
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


class Adapted:
    """One caller array as the C library sees it: its TensorDesc, what must stay alive while
    the C library may read it, and the stream its interface named (CUDA array interface)."""

    __slots__ = ("desc", "keep", "stream", "is_numpy")

    def __init__(self, desc, keep, stream=None, is_numpy=False):
        self.desc = desc
        self.keep = keep
        self.stream = stream
        self.is_numpy = is_numpy


def _from_numpy(a, name, writable, fp8_dtype, device, index=False):
    if not a.flags.c_contiguous:
        raise InvalidArgument("argument '%s': expected a C-contiguous array, got strides %s for "
                              "shape %s (use numpy.ascontiguousarray)" % (name, a.strides, a.shape))
    if writable and not a.flags.writeable:
        raise InvalidArgument("argument '%s': expected a writable array, got a read-only one"
                              % name)
    code = C.DTYPE_I32 if a.dtype == _INT32 else _NUMPY_TO_TE.get(a.dtype)
    if fp8_dtype is not None and a.dtype == _UINT8:
        code = fp8_dtype
    check_kind(code, fp8_dtype, name, a.dtype, index)
    shape = a.shape
    _check_rank(shape, name)
    dev = device if device is not None else (C.DEVICE_CPU, 0)
    return (a.__array_interface__["data"][0], code, shape, dev[0], dev[1], 0,
            C.SCALING_PER_TENSOR)


def _from_cuda_array_interface(obj, cai, name, writable, fp8_dtype, device, index=False):
    try:
        shape = tuple(int(d) for d in cai["shape"])
        typestr = cai["typestr"]
        ptr, readonly = cai["data"]
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidArgument("argument '%s': malformed __cuda_array_interface__ (%s)"
                              % (name, e)) from None
    if cai.get("mask") is not None:
        raise InvalidArgument("argument '%s': masked CUDA arrays are not supported" % name)
    if index:
        if typestr not in _CAI_INT32:
            raise InvalidArgument("argument '%s': expected dtype int32 (CUDA array typestr <i4: "
                                  "%s), got %r" % (name, int32_role(index), typestr))
        code = C.DTYPE_I32
    elif typestr in _CAI_TYPESTR and (fp8_dtype is None):
        code = _CAI_TYPESTR[typestr]
    elif typestr in _CAI_BYTES and fp8_dtype is not None:
        code = fp8_dtype
    else:
        raise InvalidArgument("argument '%s': expected CUDA array typestr <f4 or <f2 (or |u1 "
                              "for FP8 data), got %r" % (name, typestr))
    _check_rank(shape, name)
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _contiguous_strides(shape, C.DTYPE_ITEMSIZE[code]):
        raise InvalidArgument("argument '%s': expected a C-contiguous array, got strides %s for "
                              "shape %s" % (name, tuple(strides), shape))
    if writable and readonly:
        raise InvalidArgument("argument '%s': expected a writable array, got a read-only one"
                              % name)
    if not ptr:
        raise InvalidArgument("argument '%s': the CUDA array's data pointer is NULL" % name)
    stream = cai.get("stream")
    if stream is not None:
        if not isinstance(stream, int) or stream == 0:
            raise InvalidArgument("argument '%s': __cuda_array_interface__ stream must be a "
                                  "non-zero integer, got %r" % (name, stream))
        stream = 0 if stream == 1 else stream  # 1: the legacy default stream, NULL in CUDA
    index = device[1] if device is not None and device[0] == C.DEVICE_CUDA else 0
    desc = (ptr, code, shape, C.DEVICE_CUDA, index, 0, C.SCALING_PER_TENSOR)
    return Adapted(desc, obj, stream)


def adapt(obj, name, *, writable=False, fp8_dtype=None, device=None, stream=0, index=False):
    """The Adapted view of a caller array. `device` is the context's (type, index): NumPy
    arrays are host memory whatever it is (the C library rejects a mismatch with a message);
    `stream` is the context's stream, handed to DLPack producers. index=True: an int32 array
    of sequence offsets (TE_DTYPE_I32) is expected instead of floating-point data; a string
    instead of True names what the int32 data is (e.g. 'token ids') in messages."""
    if isinstance(obj, np.ndarray):
        return Adapted(_from_numpy(obj, name, writable, fp8_dtype, None, index), obj, None, True)
    has_dlpack = hasattr(obj, "__dlpack__")
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except (KeyError, TypeError):
        if not has_dlpack:
            raise
        cai = None  # PyTorch before bfloat16's '<V2' raised KeyError for it: DLPack names it
    if cai is not None:
        if not isinstance(cai, dict):
            raise InvalidArgument("argument '%s': __cuda_array_interface__ is not a dict" % name)
        # A void typestr says nothing of the dtype (PyTorch's bfloat16 is '<V2'): where the
        # object speaks DLPack too, that route names it.
        if not (has_dlpack and cai.get("typestr") in _CAI_VOID):
            return _from_cuda_array_interface(obj, cai, name, writable, fp8_dtype, device, index)
    if has_dlpack:
        try:
            imported = DLPackImport(obj, name, fp8_dtype, stream)
        except InvalidArgument as e:
            if "argument '%s'" % name in str(e):
                raise
            raise InvalidArgument("argument '%s': %s%s" % (
                name, e, " (expected int32 %s)" % int32_role(index) if index else "")) from e
        if writable and imported.readonly:
            raise InvalidArgument("argument '%s': expected a writable tensor, the DLPack "
                                  "producer marked it read-only" % name)
        check_kind(imported.desc[1], fp8_dtype, name,
                   "DLPack dtype " + C.DTYPE_NAMES.get(imported.desc[1], "?"), index)
        _check_rank(imported.desc[2], name)
        return Adapted(imported.desc, imported)
    raise InvalidArgument("argument '%s': expected a NumPy array or an object with "
                          "__cuda_array_interface__ or __dlpack__, got %s"
                          % (name, type(obj).__name__))


def host_copy(desc, owner_name):
    """A NumPy copy of a host TensorDesc's data (used for residuals, which live in library
    memory that a later call may free)."""
    data, code, shape, device_type, _, _, _ = desc
    if device_type != C.DEVICE_CPU:
        from .errors import Unsupported
        raise Unsupported("%s: only host (CPU context) tensors can be copied to NumPy" % owner_name)
    dtype = numpy_dtype(code)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = (ctypes.c_char * n).from_address(data)
    return np.frombuffer(bytes(raw), dtype=dtype).reshape(shape)


def host_floats(ptr, count):
    if not ptr or count <= 0:
        return np.zeros(0, np.float32)
    return np.frombuffer(bytes((ctypes.c_char * (4 * count)).from_address(ptr)),
                         dtype=np.float32).copy()
