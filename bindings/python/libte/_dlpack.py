"""DLPack import: obj.__dlpack__() -> a capsule -> te_tensor_from_dlpack, zero copy.

The capsule is kept (not renamed to 'used_dltensor'), so its producer's destructor calls the
DLManagedTensor's deleter when the last reference to this import goes away: the memory stays
valid exactly as long as libte may read it.
"""

import ctypes

from . import _constants as C
from ._lowlevel import ll
from .errors import InvalidArgument

_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_capsule = ctypes.pythonapi.PyCapsule_IsValid
_is_capsule.restype = ctypes.c_int
_is_capsule.argtypes = [ctypes.py_object, ctypes.c_char_p]

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3
_FLAG_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
_VERSIONED_FLAGS_OFFSET = 24  # DLManagedTensorVersioned: version (8), manager_ctx, deleter, flags


class DLPackImport:
    """Holds the capsule (and so the producer's memory) and the TensorDesc libte made of it."""

    __slots__ = ("capsule", "desc", "readonly")

    def __init__(self, obj, name, fp8_dtype, stream):
        kwargs = {}
        try:
            device_type, _ = obj.__dlpack_device__()
        except Exception:  # producers before DLPack 0.6 have no __dlpack_device__
            device_type = KDL_CPU
        if device_type == KDL_CUDA:
            # The consumer names its stream; the producer makes it wait for the data.
            # 1 is the legacy default stream, which a NULL (0) libte stream means.
            kwargs["stream"] = stream or 1
        try:
            capsule = obj.__dlpack__(max_version=(1, 0), **kwargs)
        except TypeError:  # a producer of the pre-1.0 protocol
            capsule = obj.__dlpack__(**kwargs)
        if _is_capsule(capsule, b"dltensor_versioned"):
            versioned, cname = True, b"dltensor_versioned"
        elif _is_capsule(capsule, b"dltensor"):
            versioned, cname = False, b"dltensor"
        else:
            raise InvalidArgument("argument '%s': __dlpack__ returned %s, expected an unused "
                                  "'dltensor' capsule" % (name, type(capsule).__name__))
        ptr = _get_pointer(capsule, cname)
        self.capsule = capsule
        self.desc = ll.tensor_from_dlpack(ptr, versioned,
                                          C.DTYPE_F32 if fp8_dtype is None else fp8_dtype)
        self.readonly = versioned and bool(
            ctypes.c_uint64.from_address(ptr + _VERSIONED_FLAGS_OFFSET).value & _FLAG_READ_ONLY)
