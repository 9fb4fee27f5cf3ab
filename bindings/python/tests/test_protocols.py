"""The GPU-facing array protocols, exercised with fake objects: __cuda_array_interface__
parsing (contiguity, dtype, read-only, streams) and real DLPack capsules built here."""

import ctypes

import numpy as np
import pytest

import libte
from libte._arrays import adapt


class FakeCudaArray:
    def __init__(self, shape=(16, 32), typestr="<f4", strides=None, readonly=False, stream=None,
                 ptr=0x7F0000000000, version=3):
        self.__cuda_array_interface__ = dict(shape=shape, typestr=typestr, strides=strides,
                                             data=(ptr, readonly), version=version)
        if stream is not None:
            self.__cuda_array_interface__["stream"] = stream


def test_cai_parsing():
    a = adapt(FakeCudaArray(stream=1234), "x", device=(1, 2))
    data, dtype, shape, dev_type, dev_index, scale_inv, scaling = a.desc
    assert (data, dtype, shape, dev_type, dev_index) == (0x7F0000000000, 0, (16, 32), 1, 2)
    assert a.stream == 1234 and not a.is_numpy
    assert adapt(FakeCudaArray(stream=1), "x").stream == 0  # legacy default = NULL
    assert adapt(FakeCudaArray(typestr="<f2", strides=(64, 2)), "x").desc[1] == 1
    assert adapt(FakeCudaArray(typestr="|u1"), "x", fp8_dtype=4).desc[1] == 4


@pytest.mark.parametrize("kwargs, text", [
    (dict(strides=(4, 64)), "C-contiguous"),
    (dict(typestr="<f8"), "typestr"),
    (dict(typestr="|u1"), "typestr"),
    (dict(stream=0), "stream"),
    (dict(ptr=0), "NULL"),
    (dict(shape=()), "1 to 8 dimensions"),
])
def test_cai_rejects(kwargs, text):
    with pytest.raises(libte.InvalidArgument, match=text):
        adapt(FakeCudaArray(**kwargs), "x")


def test_cai_read_only_output():
    with pytest.raises(libte.InvalidArgument, match="read-only"):
        adapt(FakeCudaArray(readonly=True), "out", writable=True)


def test_cuda_array_on_cpu_context_is_refused_by_the_library(ctx):
    with pytest.raises(libte.InvalidArgument) as e:
        libte.amax(ctx, FakeCudaArray(), np.zeros(1, np.float32))
    assert "te_amax" in str(e.value) and "device" in str(e.value)


def test_cai_stream_is_set_on_the_context(ctx):
    # A CPU context refuses a non-NULL stream: the binding did pass it on.
    with pytest.raises(libte.InvalidArgument) as e:
        libte.amax(ctx, FakeCudaArray(stream=77))
    assert "te_context_set_stream" in str(e.value)


# ---- DLPack: build DLManagedTensor capsules by hand -------------------------------------------

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeDLPack:
    """A producer whose capsule points at a NumPy array (kept alive by this object)."""

    def __init__(self, array, device_type=1, code=2, strides=None, versioned=False,
                 readonly=False):
        self.array = array
        self.shape = (ctypes.c_int64 * array.ndim)(*array.shape)
        self.strides = (ctypes.c_int64 * array.ndim)(*strides) if strides else None
        t = DLTensor(array.ctypes.data, DLDevice(device_type, 0), array.ndim,
                     DLDataType(code, array.itemsize * 8, 1), self.shape, self.strides, 0)
        if versioned:
            self.managed = DLManagedTensorVersioned(1, 0, None, None, 1 if readonly else 0, t)
        else:
            self.managed = DLManagedTensor(t, None, None)
        self.versioned = versioned
        self.device_type = device_type
        self.calls = []

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, stream=None, max_version=None):
        self.calls.append(dict(stream=stream, max_version=max_version))
        name = b"dltensor_versioned" if self.versioned else b"dltensor"
        return _capsule_new(ctypes.addressof(self.managed), name, None)


@pytest.mark.parametrize("versioned", [False, True])
def test_dlpack_cpu_tensor_zero_copy(ctx, versioned):
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    producer = FakeDLPack(x, versioned=versioned)
    out = np.zeros(1, np.float32)
    libte.amax(ctx, producer, out)
    assert out[0] == 31
    assert producer.calls[0]["stream"] is None  # no stream for host memory
    y = np.zeros_like(x)
    libte.activation_forward(ctx, "relu", producer, out=FakeDLPack(y, versioned=versioned))
    np.testing.assert_array_equal(y, x)  # written through the capsule: no copy


def test_dlpack_rejections(ctx):
    x = np.ones((4, 4), np.float32)
    with pytest.raises(libte.InvalidArgument) as e:
        libte.amax(ctx, FakeDLPack(x, strides=(1, 4)))
    assert "te_tensor_from_dlpack" in str(e.value) and "contiguous" in str(e.value)
    with pytest.raises(libte.InvalidArgument) as e:
        libte.amax(ctx, FakeDLPack(x.astype(np.float64)))
    assert "te_tensor_from_dlpack" in str(e.value)
    with pytest.raises(libte.InvalidArgument, match="read-only"):
        libte.activation_forward(ctx, "relu", x, out=FakeDLPack(x, versioned=True,
                                                                readonly=True))


def test_dlpack_cuda_tensor_gets_our_stream(ctx):
    producer = FakeDLPack(np.ones((4, 4), np.float32), device_type=2)
    with pytest.raises(libte.InvalidArgument) as e:  # a CUDA tensor on a CPU context
        libte.amax(ctx, producer)
    assert "device" in str(e.value)
    assert producer.calls[0]["stream"] == 1  # the legacy default stream: ctx.stream == 0


def test_dlpack_uint8_as_fp8(ctx):
    codes = np.full((4, 4), 0x38, np.uint8)  # 1.0 in E4M3
    t = libte.Float8Tensor(FakeDLPack(codes, code=1), np.full(1, 2.0, np.float32), dtype="e4m3")
    out = np.zeros((4, 4), np.float32)
    libte.dequantize(ctx, t, out)  # device-style inputs need an output
    np.testing.assert_array_equal(out, np.full((4, 4), 2.0))


class FakeTorchBf16(FakeDLPack):
    """As a PyTorch bfloat16 tensor: __cuda_array_interface__ cannot name the dtype (typestr
    '<V2', or a KeyError in older PyTorch), DLPack can (kDLBfloat, 16 bits)."""

    def __init__(self, array, cai_error=None):
        super().__init__(array, code=4)
        self.cai_error = cai_error

    @property
    def __cuda_array_interface__(self):
        if self.cai_error is not None:
            raise self.cai_error
        return dict(shape=self.array.shape, typestr="<V2", strides=None,
                    data=(self.array.ctypes.data, False), version=2)


@pytest.mark.parametrize("cai_error", [None, KeyError("torch.bfloat16")])
def test_bfloat16_goes_through_dlpack(ctx, cai_error):
    bits = np.full((4, 8), 0x4040, np.uint16)  # 3.0 in bfloat16
    bits[1, 2] = 0xC0A0  # -5.0
    producer = FakeTorchBf16(bits, cai_error)
    out = np.zeros(1, np.float32)
    libte.amax(ctx, producer, out)
    assert out[0] == 5.0 and len(producer.calls) == 1
    with pytest.raises(libte.InvalidArgument, match="typestr"):  # no DLPack: refused as before
        adapt(FakeCudaArray(typestr="<V2"), "x")
