"""Bad input raises the right exception with a useful message; nothing crashes."""

import numpy as np
import pytest

import libte


@pytest.fixture
def layer(ctx):
    return libte.Linear(ctx, 32, 16)


def xwb(dtype=np.float32):
    return (np.ones((16, 32), dtype), np.ones((16, 32), dtype), np.ones(16, dtype))


def check(exc_info, cls, *texts):
    assert type(exc_info.value) is cls
    for t in texts:
        assert t in str(exc_info.value), str(exc_info.value)


def test_status_mapping():
    C = libte.constants
    for status, cls in [(C.ERROR_INVALID_ARGUMENT, libte.InvalidArgument),
                        (C.ERROR_INVALID_STATE, libte.InvalidState),
                        (C.ERROR_UNSUPPORTED, libte.Unsupported),
                        (C.ERROR_OUT_OF_MEMORY, libte.OutOfMemory),
                        (C.ERROR_CUDA, libte.CudaError), (C.ERROR_CUBLAS, libte.CublasError),
                        (C.ERROR_NCCL, libte.NcclError), (C.ERROR_INTERNAL, libte.InternalError)]:
        e = libte.errors.error_for_status(status, "msg")
        assert type(e) is cls and e.status == status and isinstance(e, libte.Error)
    e = libte.errors.error_for_status(99, "future")
    assert type(e) is libte.Error and e.status == 99


def test_cuda_context_unsupported_here():
    with pytest.raises(libte.Unsupported) as e:
        libte.Context("cuda")
    assert "te_context_create" in str(e.value)
    with pytest.raises(libte.InvalidArgument, match="argument 'device'"):
        libte.Context("tpu")


def test_wrong_dtype(ctx, layer):
    x, w, b = xwb(np.float64)
    with pytest.raises(libte.InvalidArgument) as e:
        layer.forward(x, w, b)
    check(e, libte.InvalidArgument, "argument 'x'", "float64")
    x, w, b = xwb(np.float16)  # a supported dtype, but not the layer's: the C library says so
    with pytest.raises(libte.InvalidArgument) as e:
        layer.forward(x, w, b)
    check(e, libte.InvalidArgument, "te_linear_forward", "F32", "F16")


def test_wrong_shape(ctx, layer):
    x, w, b = xwb()
    with pytest.raises(libte.InvalidArgument) as e:
        layer.forward(np.ones((16, 33), np.float32), w, b)
    check(e, libte.InvalidArgument, "te_linear_forward", "input")
    y, bwd = layer.forward(x, w, b)
    with pytest.raises(libte.InvalidArgument) as e:
        bwd.backward(np.ones((16, 15), np.float32))
    check(e, libte.InvalidArgument, "te_linear_backward", "dy")
    with pytest.raises(libte.InvalidArgument) as e:
        bwd.backward(y, dx=np.empty((16, 31), np.float32))
    check(e, libte.InvalidArgument, "te_linear_backward", "dx")
    with pytest.raises(libte.InvalidArgument, match="1 to 8 dimensions"):
        layer.forward(np.array(1.0, np.float32), w, b)
    with pytest.raises(libte.InvalidArgument, match="empty dimension"):
        layer.forward(np.ones((0, 32), np.float32), w, b)


def test_non_contiguous(ctx, layer):
    x, w, b = xwb()
    with pytest.raises(libte.InvalidArgument) as e:
        layer.forward(np.ones((32, 16), np.float32).T, w, b)
    check(e, libte.InvalidArgument, "argument 'x'", "C-contiguous")
    with pytest.raises(libte.InvalidArgument) as e:
        layer.forward(x, w, np.ones(32, np.float32)[::2])
    check(e, libte.InvalidArgument, "argument 'bias'", "C-contiguous")


def test_read_only_output(ctx, layer):
    x, w, b = xwb()
    out = np.zeros((16, 16), np.float32)
    out.flags.writeable = False
    with pytest.raises(libte.InvalidArgument) as e:
        layer.forward(x, w, b, out=out)
    check(e, libte.InvalidArgument, "argument 'out'", "read-only")
    with pytest.raises(libte.InvalidArgument, match="C-contiguous"):  # strides 0: aliasing
        libte.activation_forward(ctx, "relu", x, out=np.broadcast_to(np.float32(0), x.shape))
    with pytest.raises(libte.InvalidArgument, match="read-only"):
        libte.activation_forward(ctx, "relu", x, out=np.frombuffer(bytes(x.nbytes), np.float32))


def test_wrong_python_types(ctx, layer):
    x, w, b = xwb()
    for bad in ([[1.0] * 32] * 16, "x", None, 3.0):
        with pytest.raises(libte.InvalidArgument) as e:
            layer.forward(bad, w, b)
        check(e, libte.InvalidArgument, "argument 'x'", "expected a NumPy array")
    with pytest.raises(libte.InvalidArgument, match="argument 'ctx'"):
        libte.Linear("cpu", 32, 16)
    with pytest.raises(libte.InvalidArgument, match="argument 'in_features'"):
        libte.Linear(ctx, 0, 16)
    with pytest.raises(libte.InvalidArgument, match="argument 'out_features'"):
        libte.Linear(ctx, 32, "16")
    with pytest.raises(libte.InvalidArgument, match="argument 'dtype'"):
        libte.Linear(ctx, 32, 16, dtype="int8")
    with pytest.raises(libte.InvalidArgument, match="argument 'bwd'"):
        layer.backward(None, np.ones((16, 16), np.float32))
    with pytest.raises(libte.InvalidArgument, match="argument 'residuals'"):
        layer.forward_save(None)
    with pytest.raises(libte.InvalidArgument, match="argument 'act'"):
        libte.activation_forward(ctx, "tanh", x)
    with pytest.raises(libte.InvalidArgument, match="argument 'ctx'"):
        libte.amax(None, x)


def test_closed_handles(ctx):
    layer = libte.Linear(ctx, 32, 16)
    x, w, b = xwb()
    y, res = layer.forward_compute(x, w, b)
    y, bwd = layer.forward(x, w, b)
    layer.close()
    layer.close()  # idempotent
    with pytest.raises(libte.InvalidState, match="Linear is closed"):
        layer.forward(x, w, b)
    with pytest.raises(libte.InvalidState, match="Linear is closed"):
        layer.state_dict()
    bwd.backward(np.ones_like(y))  # backward contexts outlive their layer
    bwd.close()
    with pytest.raises(libte.InvalidState, match="BackwardContext is closed"):
        bwd.backward(np.ones_like(y))
    ctx.close()
    assert res.closed
    with pytest.raises(libte.InvalidState, match="Residuals are released"):
        res.input_t
    with pytest.raises(libte.InvalidState, match="Context is closed"):
        ctx.stats()
    with pytest.raises(libte.InvalidState, match="Context is closed"):
        libte.Linear(ctx, 32, 16)


def test_context_close_closes_children(ctx):
    layer = libte.Linear(ctx, 32, 16)
    x, w, b = xwb()
    y, bwd = layer.forward(x, w, b)
    with ctx:
        pass
    assert layer.closed and bwd.closed and ctx.closed
    with pytest.raises(libte.InvalidState):
        bwd.backward(np.ones_like(y))


def test_residuals_cannot_be_saved_twice_or_elsewhere(ctx):
    a, b_ = libte.Linear(ctx, 32, 16), libte.Linear(ctx, 32, 16)
    x, w, b = xwb()
    _, res = a.forward_compute(x, w, b)
    with pytest.raises(libte.InvalidArgument, match="another Linear"):
        b_.forward_save(res)
    a.forward_save(res)
    with pytest.raises(libte.InvalidState, match="saved into a BackwardContext"):
        a.forward_save(res)


def test_garbage_collection_in_any_order():
    import gc
    for _ in range(3):
        c = libte.Context("cpu")
        layer = libte.Linear(c, 32, 16)
        x, w, b = xwb()
        _, bwd = layer.forward(x, w, b)
        _, res = layer.forward_compute(x, w, b)
        cycle = [c, layer, bwd, res]
        cycle.append(cycle)
        del c, layer, bwd, res, cycle
        gc.collect()


def test_error_message_is_last_error(ctx):
    with pytest.raises(libte.Error) as e:
        libte.Context("cuda")
    assert libte.last_error() == e.value.message
