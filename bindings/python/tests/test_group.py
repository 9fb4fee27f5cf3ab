"""Process groups: the single-rank group, NCCL groups' arguments and errors (no GPU here: NCCL
is Unsupported, but every argument check comes first), and a group's lifetime under autocast.
The two-GPU check is tests/gpu/nccl_two_ranks.py (not collected by pytest)."""

import gc
import re
import weakref

import numpy as np
import pytest

import libte
from libte import _lowlevel_ctypes
from libte._lowlevel import ll
from conftest import fp64_linear_reference

C = libte.constants
UID = bytes(range(128))  # any 128 bytes pass the argument checks


def _cuda_usable():
    try:
        libte.Context("cuda").close()
        return True
    except libte.Error:
        return False


no_gpu = pytest.mark.skipif(_cuda_usable(), reason="a CUDA device is usable: NCCL may work here")


def _backends():
    """The low-level layers to check directly: ctypes, and SWIG when built."""
    layers = [_lowlevel_ctypes]
    try:
        from libte import _lowlevel_swig
        layers.append(_lowlevel_swig)
    except ImportError:
        pass
    return layers


def check(exc_info, cls, *texts):
    assert type(exc_info.value) is cls, repr(exc_info.value)
    assert exc_info.value.status == cls.status
    for t in texts:
        assert t in str(exc_info.value), str(exc_info.value)


# ---- the single-rank group -------------------------------------------------------------------

def test_default_constructor_is_single_rank():
    g = libte.Group()
    assert (g.rank, g.size, g.kind) == (0, 1, "single") and g.id != 0
    s = libte.Group.single()
    assert (s.rank, s.size) == (0, 1) and s.id not in (0, g.id)
    assert "single" in repr(g) and "size=1" in repr(g)
    with libte.Group() as h:
        assert not h.closed
    assert h.closed and "closed" in repr(h)
    with pytest.raises(libte.InvalidState, match="Group is closed"):
        h.rank
    g.close()
    g.close()  # idempotent
    with pytest.raises(libte.InvalidState, match="Group is closed"):
        g.id


def test_abort_single_rank_is_invalid_state():
    g = libte.Group()
    with pytest.raises(libte.InvalidState) as e:
        g.abort()
    check(e, libte.InvalidState, "te_group_abort", "single-rank")
    assert libte.last_error() == e.value.message
    assert (g.rank, g.size) == (0, 1)  # still usable
    g.close()
    with pytest.raises(libte.InvalidState, match="Group is closed"):
        g.abort()


# ---- NCCL groups without a GPU: Unsupported, after the argument checks ------------------------

def _mentions_cuda(e):
    # "need a CUDA device" (a CUDA build on a machine without a usable GPU), or "need the CUDA
    # backend" (a build without it).
    return re.search(r"CUDA (device|backend)", str(e.value)) is not None


@no_gpu
def test_nccl_unique_id_unsupported_here():
    with pytest.raises(libte.Unsupported) as e:
        libte.nccl_unique_id()
    check(e, libte.Unsupported, "te_nccl_get_unique_id")
    assert _mentions_cuda(e), str(e.value)
    assert isinstance(e.value, NotImplementedError)
    assert libte.last_error() == e.value.message


@no_gpu
@pytest.mark.parametrize("timeout_ms", [None, 0, 2000])
def test_init_nccl_unsupported_here(timeout_ms):
    with pytest.raises(libte.Unsupported) as e:
        libte.Group.init_nccl(0, 2, UID, timeout_ms=timeout_ms)
    check(e, libte.Unsupported, "te_group_init_nccl")
    assert _mentions_cuda(e), str(e.value)
    with pytest.raises(libte.Unsupported):  # bytearray and memoryview are ids too
        libte.Group.init_nccl(1, 2, memoryview(bytearray(UID)), timeout_ms=timeout_ms)


@no_gpu
def test_from_nccl_comm_unsupported_here():
    # Refused before the (bogus) communicator is ever looked at.
    with pytest.raises(libte.Unsupported) as e:
        libte.Group.from_nccl_comm(0x1000)
    check(e, libte.Unsupported, "te_group_create_nccl")
    assert _mentions_cuda(e), str(e.value)


@pytest.mark.parametrize("rank, nranks, name, text", [
    (2, 2, "rank", "expected 0..1, got 2"),
    (-1, 2, "rank", "got -1"),
    (0, 0, "nranks", "expected >= 1, got 0"),
    (0, -3, "nranks", "got -3"),
])
def test_init_nccl_bad_rank_or_nranks(rank, nranks, name, text):
    with pytest.raises(libte.InvalidArgument) as e:
        libte.Group.init_nccl(rank, nranks, UID)
    check(e, libte.InvalidArgument, "te_group_init_nccl", "argument '%s'" % name, text)
    assert isinstance(e.value, ValueError)
    assert libte.last_error() == e.value.message
    with pytest.raises(libte.InvalidArgument, match="argument '%s'" % name):
        libte.Group.init_nccl(rank, nranks, UID, timeout_ms=1000)


@pytest.mark.parametrize("uid, text", [
    (bytes(64), "expected 128 bytes"),
    (bytes(129), "got 129"),
    (b"", "got 0"),
    ("x" * 128, "got str"),
    (None, "got NoneType"),
    (list(UID), "got list"),
])
def test_init_nccl_bad_id(uid, text):
    with pytest.raises(libte.InvalidArgument) as e:  # checked in Python, before the C call
        libte.Group.init_nccl(0, 2, uid)
    check(e, libte.InvalidArgument, "argument 'unique_id'", text)
    assert isinstance(e.value, ValueError)


def test_init_nccl_bad_timeout_and_types():
    with pytest.raises(libte.InvalidArgument) as e:  # the C library's check
        libte.Group.init_nccl(0, 2, UID, timeout_ms=-1)
    check(e, libte.InvalidArgument, "te_group_init_nccl", "timeout_ms", "got -1")
    for bad, text in ((2 ** 31, "32-bit"), (1.5, "float"), ("10", "str"), (True, "bool")):
        with pytest.raises(libte.InvalidArgument) as e:
            libte.Group.init_nccl(0, 2, UID, timeout_ms=bad)
        check(e, libte.InvalidArgument, "argument 'timeout_ms'", text)
    for kwargs, name in ((dict(rank="0", nranks=2), "rank"), (dict(rank=0, nranks=2.0), "nranks"),
                         (dict(rank=False, nranks=2), "rank"),
                         (dict(rank=0, nranks=2 ** 40), "nranks")):
        with pytest.raises(libte.InvalidArgument, match="argument '%s'" % name):
            libte.Group.init_nccl(unique_id=UID, **kwargs)


@pytest.mark.parametrize("bad", [0, -1, 2 ** 64, "0x1000", None, 1.0, True])
def test_from_nccl_comm_bad_pointer(bad):
    with pytest.raises(libte.InvalidArgument) as e:
        libte.Group.from_nccl_comm(bad)
    check(e, libte.InvalidArgument, "argument 'comm_ptr'", "ncclComm_t")


# ---- the low-level layers, both of them ----------------------------------------------------

@pytest.mark.parametrize("layer", _backends(), ids=lambda m: m.NAME)
def test_lowlevel_group_calls(layer):
    assert layer.group_nccl_options_defaults() == {"timeout_ms": 600000}
    assert layer.SIZEOF["te_nccl_id"] == C.NCCL_ID_BYTES == 128
    # The id's length and type are checked before the C call.
    for call in (lambda i: layer.group_init_nccl(0, 2, i),
                 lambda i: layer.group_init_nccl_with_options(0, 2, i, 1000)):
        with pytest.raises(ValueError, match="128 bytes, got 127"):
            call(bytes(127))
        with pytest.raises(TypeError):
            call(12345)
        with pytest.raises(libte.InvalidArgument) as e:  # None is NULL: the C library says so
            call(None)
        check(e, libte.InvalidArgument, "te_group_init_nccl", "'id'")
    with pytest.raises(libte.InvalidArgument) as e:
        layer.group_create_nccl(0)
    check(e, libte.InvalidArgument, "te_group_create_nccl", "nccl_comm")
    with pytest.raises(libte.InvalidArgument, match="timeout_ms"):
        layer.group_init_nccl_with_options(0, 1, UID, -5)
    g = layer.group_create_single()
    with pytest.raises(libte.InvalidState, match="te_group_abort"):
        layer.group_abort(g)
    layer.group_destroy(g)
    if not _cuda_usable():
        with pytest.raises(libte.Unsupported, match="te_nccl_get_unique_id"):
            layer.nccl_get_unique_id()


def test_swig_typemaps_take_ids_as_bytes():
    try:
        from libte import _te_swig as te
        from libte import _lowlevel_swig  # noqa: F401 (registers the error factory)
    except ImportError:
        pytest.skip("SWIG extension not built")
    assert not hasattr(te, "te_nccl_id")  # no proxy class: ids are bytes
    assert te.te_group_nccl_options().timeout_ms == 600000
    assert te.te_group_nccl_options().struct_size == te.te_swig_sizeof("te_group_nccl_options")
    with pytest.raises(ValueError, match="argument 'id': expected 128 bytes"):
        te.te_group_init_nccl(0, 2, bytes(5))
    with pytest.raises(TypeError, match="argument 'id'"):
        te.te_group_init_nccl(0, 2, "text")
    with pytest.raises(libte.InvalidArgument, match="argument 'rank'"):
        te.te_group_init_nccl(3, 2, bytearray(UID))
    if not _cuda_usable():
        with pytest.raises(libte.Unsupported):
            te.te_group_init_nccl_with_options(0, 2, UID, None)


# ---- a group under autocast --------------------------------------------------------------------

def _xwb(rng, tokens=32, fin=64, fout=48):
    x = rng.standard_normal((tokens, fin)).astype(np.float32)
    w = (rng.standard_normal((fout, fin)) / 8).astype(np.float32)
    b = rng.standard_normal(fout).astype(np.float32)
    return x, w, b


def test_single_rank_group_in_autocast_linear_forward(ctx, rng):
    x, w, b = _xwb(rng)
    recipe = libte.Recipe(amax_history_len=4)
    states = {}
    for label, group in (("group", libte.Group()), ("none", None)):
        lin = libte.Linear(ctx, 64, 48)
        with libte.autocast(ctx, recipe=recipe, group=group):
            y, res = lin.forward_compute(x, w, b)
        assert res.fp8
        np.testing.assert_allclose(y, fp64_linear_reference(res, b), rtol=1e-4, atol=1e-4)
        res.release()
        s = lin.scaling_state("input")
        assert s.amax_history.max() == np.abs(x).max()
        assert s.scale == pytest.approx(448.0 / np.abs(x).max(), rel=1e-6)
        states[label] = [lin.scaling_state(r) for r in ("input", "weight")]
    # A single-rank group changes nothing: no reduction, the same states as no group.
    assert ctx.stats().amax_reductions == 0 and ctx.stats().bucket_updates == 2
    for a, b_ in zip(states["group"], states["none"]):
        assert (a.scale, a.scale_inv) == (b_.scale, b_.scale_inv)
        np.testing.assert_array_equal(a.amax_history, b_.amax_history)


def test_context_keeps_its_groups_alive(rng):
    # The group's buckets outlive the scope (a backward reduces over it later): the context
    # holds the native group until it closes, whatever happens to the Python objects.
    ctx = libte.Context("cpu")
    lin = libte.Linear(ctx, 64, 48)
    x, w, b = _xwb(rng)

    def step():
        g = libte.Group()
        with libte.autocast(ctx, group=g, recipe=libte.Recipe(amax_history_len=4)):
            y, bwd = lin.forward(x, w, b)
        return y, bwd, weakref.ref(g), weakref.ref(g._native)

    y, bwd, group_ref, native_ref = step()
    gc.collect()
    assert group_ref() is None  # the Python Group is gone ...
    native = native_ref()
    assert native is not None and native.ptr is not None  # ... its native group is not
    bwd.backward(np.ones_like(y), once=True)
    ctx.flush_backward()
    assert ctx.stats().bucket_updates >= 2
    g2 = libte.Group()
    with libte.autocast(ctx, group=g2):
        lin.forward(x, w, b)
    g2.close()  # only marked: the context still uses it
    assert g2.closed and g2._native.ptr is not None
    with pytest.raises(libte.InvalidState, match="Group is closed"):
        libte.autocast(ctx, group=g2)
    ctx.close()
    assert g2._native.ptr is None  # freed after the context
    # The first group's handle, no longer needed by anyone, goes with its last reference.
    assert native.ptr is not None and not native._dependents
    del native
    gc.collect()
    assert native_ref() is None
