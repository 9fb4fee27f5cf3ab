"""libte.Checkpoint (te_checkpoint_*): records in and out bit for bit through a file and through
bytes, the checks a corrupted or truncated checkpoint fails, names, and errors carrying
te_last_error()'s text with nothing changed; on the backend the run selected (ctypes, then
swig: scripts/test_python.sh)."""

import os

import numpy as np
import pytest

import libte
from libte import _constants as C
from libte._lowlevel import ll

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def library_error(excinfo, function):
    e = excinfo.value
    assert e.message == libte.last_error(), (e.message, libte.last_error())
    assert e.message.startswith(function + ":"), e.message
    return e.message


def records(rng):
    return {
        "layer0.weight": rng.standard_normal((7, 5)).astype(np.float32),
        "layer0.bias": rng.standard_normal(7).astype(np.float16),
        "emb": rng.standard_normal((3, 2, 4)).astype(BF16),
        "data.position": rng.integers(-2**31, 2**31 - 1, size=(2, 3), dtype=np.int32),
        "scalar": np.array([3.5], np.float32),
    }


def fill(ck, arrays, blobs):
    for name, a in arrays.items():
        ck.put_tensor(name, a)
    for name, b in blobs.items():
        ck.put_bytes(name, b)


def check_same(ck, arrays, blobs):
    assert ck.names() == list(arrays) + list(blobs)
    assert len(ck) == len(arrays) + len(blobs)
    for name, a in arrays.items():
        out = np.zeros_like(a)
        assert ck.get_tensor(name, out) is out
        assert out.dtype == a.dtype and out.tobytes() == a.tobytes(), name
    for name, b in blobs.items():
        assert ck.get_bytes(name) == bytes(b), name


BLOBS = {"step": (1234).to_bytes(8, "little"), "empty": b"", "binary": bytes(range(256)) * 3}


def test_file_round_trip_is_bit_exact(rng, tmp_path):
    arrays = records(rng)
    path = tmp_path / "model.teckpt"
    with libte.Checkpoint() as ck:
        fill(ck, arrays, BLOBS)
        check_same(ck, arrays, BLOBS)
        ck.write(path)
        ck.write(str(path))  # str, bytes and os.PathLike paths alike
        ck.write(os.fsencode(str(path)))
    assert sorted(os.listdir(tmp_path)) == ["model.teckpt"]  # nothing left beside it
    with libte.Checkpoint.read(path) as back:
        check_same(back, arrays, BLOBS)
    with open(path, "rb") as f:
        head = f.read(6)
    assert head == b"TECKPT"


def test_bytes_round_trip_matches_the_file(rng, tmp_path):
    arrays = records(rng)
    with libte.Checkpoint() as ck:
        fill(ck, arrays, BLOBS)
        data = ck.to_bytes()
        ck.write(tmp_path / "a")
    assert isinstance(data, bytes)
    assert (tmp_path / "a").read_bytes() == data
    for source in (data, bytearray(data), memoryview(data)):
        with libte.Checkpoint.from_bytes(source) as back:
            check_same(back, arrays, BLOBS)
            assert back.to_bytes() == data


def test_put_replaces_a_record(rng):
    with libte.Checkpoint() as ck:
        ck.put_tensor("w", np.ones((2, 2), np.float32))
        ck.put_bytes("b", b"old")
        ck.put_tensor("w", np.full(3, 2, np.float16))  # another dtype and shape
        ck.put_bytes("b", b"new!")
        assert len(ck) == 2 and set(ck.names()) == {"w", "b"}
        out = np.zeros(3, np.float16)
        ck.get_tensor("w", out)
        assert (out == 2).all()
        assert ck.get_bytes("b") == b"new!"
        src = np.arange(4, dtype=np.float32)
        ck.put_tensor("copy", src)
        src[:] = -1  # put copied the data in
        got = ck.get_tensor("copy", np.empty(4, np.float32))
        np.testing.assert_array_equal(got, np.arange(4, dtype=np.float32))


def test_names(rng):
    with libte.Checkpoint() as ck:
        unicode_name = "couche.poids/Gewicht-\u00e9\u4e2d"
        ck.put_bytes(unicode_name, b"1")
        ck.put_bytes(b"raw-bytes-name", b"2")
        ck.put_bytes("n" * 255, b"3")  # the longest name
        assert ck.names() == [unicode_name, "raw-bytes-name", "n" * 255]
        assert unicode_name in ck and "raw-bytes-name" in ck and "other" not in ck
        assert b"raw-bytes-name" in ck and unicode_name.encode() in ck
        assert ck.get_bytes(unicode_name.encode("utf-8")) == b"1"
        with libte.Checkpoint.from_bytes(ck.to_bytes()) as back:
            assert back.names() == ck.names()
        for bad in ("", "n" * 256):
            with pytest.raises(libte.InvalidArgument) as e:
                ck.put_bytes(bad, b"x")
            library_error(e, "te_checkpoint_put_bytes")
        with pytest.raises(libte.InvalidArgument, match="NUL"):  # C would see "a" only
            ck.put_bytes("a\0b", b"x")
        with pytest.raises(libte.InvalidArgument, match="'name'"):
            ck.put_bytes(5, b"x")
        assert len(ck) == 3  # nothing added by the failed calls


def test_get_errors_leave_the_output_unchanged(rng):
    with libte.Checkpoint() as ck:
        ck.put_tensor("w", rng.standard_normal((4, 3)).astype(np.float32))
        ck.put_bytes("b", b"bytes")
        for out in (np.full((3, 4), 7, np.float32), np.full((4, 3), 7, np.float16),
                    np.full(12, 7, np.float32)):
            with pytest.raises(libte.InvalidArgument) as e:
                ck.get_tensor("w", out)  # shape or dtype differs
            library_error(e, "te_checkpoint_get_tensor")
            assert (out == 7).all()
        out = np.full((4, 3), 7, np.float32)
        with pytest.raises(libte.InvalidArgument) as e:
            ck.get_tensor("missing", out)
        assert "missing" in library_error(e, "te_checkpoint_get_tensor")
        with pytest.raises(libte.InvalidArgument) as e:
            ck.get_tensor("b", out)  # a byte record
        library_error(e, "te_checkpoint_get_tensor")
        assert (out == 7).all()
        with pytest.raises(libte.InvalidArgument) as e:
            ck.get_bytes("missing")
        assert "missing" in library_error(e, "te_checkpoint_get_bytes")


def test_fp8_tensors_are_refused(rng):
    codes = rng.integers(0, 256, size=(4, 4), dtype=np.uint8)
    x8 = libte.Float8Tensor(codes, np.ones(1, np.float32), "e4m3")
    with libte.Checkpoint() as ck:
        with pytest.raises(libte.InvalidArgument, match="FP8"):
            ck.put_tensor("x8", x8)
        # The library refuses it too (the binding's check aside).
        with libte.Context("cpu") as ctx:
            desc = (codes.ctypes.data, C.DTYPE_E4M3, codes.shape, C.DEVICE_CPU, 0,
                    x8.scale_inv.ctypes.data, C.SCALING_PER_TENSOR)
            with pytest.raises(libte.InvalidArgument) as e:
                ll.checkpoint_put_tensor(ck._handle(), ctx._handle(), b"x8", desc)
            library_error(e, "te_checkpoint_put_tensor")
        assert len(ck) == 0


def test_corrupted_and_truncated_checkpoints_are_refused(rng, tmp_path):
    with libte.Checkpoint() as ck:
        fill(ck, records(rng), BLOBS)
        data = ck.to_bytes()
    cases = {
        "empty": b"",
        "magic": b"XECKPT" + data[6:],
        "truncated": data[:len(data) // 2],
        "no checksum": data[:-4],
        "a flipped bit": data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0x10])
                         + data[len(data) // 2 + 1:],
        "a flipped checksum": data[:-1] + bytes([data[-1] ^ 0xFF]),
        "trailing bytes": data + b"\0",
    }
    for what, bad in cases.items():
        with pytest.raises(libte.InvalidArgument) as e:
            libte.Checkpoint.from_bytes(bad)
        library_error(e, "te_checkpoint_deserialize")
        path = tmp_path / "bad.teckpt"
        path.write_bytes(bad)
        with pytest.raises(libte.InvalidArgument) as e:
            libte.Checkpoint.read(path)
        library_error(e, "te_checkpoint_read")
    with pytest.raises(libte.Error) as e:
        libte.Checkpoint.read(tmp_path / "no-such-file")
    library_error(e, "te_checkpoint_read")


def test_write_replaces_the_file_atomically(rng, tmp_path):
    path = tmp_path / "ck"
    path.write_bytes(b"an older file, longer than the checkpoint will be " * 100)
    with libte.Checkpoint() as ck:
        ck.put_bytes("only", b"1")
        ck.write(path)
        assert path.read_bytes() == ck.to_bytes()
    assert os.listdir(tmp_path) == ["ck"]
    with libte.Checkpoint() as ck:
        with pytest.raises(libte.Error) as e:
            ck.write(tmp_path / "no-such-dir" / "ck")
        library_error(e, "te_checkpoint_write")


def test_closed_checkpoint_raises_invalid_state():
    ck = libte.Checkpoint()
    ck.put_bytes("a", b"1")
    ck.close()
    ck.close()  # idempotent
    assert ck.closed and repr(ck) == "<libte.Checkpoint closed>"
    for call in (lambda: ck.names(), lambda: ck.get_bytes("a"), lambda: ck.to_bytes(),
                 lambda: ck.put_tensor("t", np.zeros(1, np.float32)), lambda: len(ck)):
        with pytest.raises(libte.InvalidState):
            call()


def test_checkpoint_with_an_explicit_context_and_module_state(ctx, rng, tmp_path):
    """A training state - weights, an FP8 layer's state_dict bytes, the step - saved and
    restored: the restored layer's FP8 forward is bit-identical to the original's."""
    x = rng.standard_normal((16, 32)).astype(np.float32)
    w = (rng.standard_normal((16, 32)) * 0.2).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    recipe = libte.Recipe(kind="delayed", amax_history_len=4)
    layer = libte.Linear(ctx, 32, 16)
    with libte.autocast(ctx, recipe=recipe):
        for _ in range(3):
            layer.forward(x, w, b)
    with libte.Checkpoint() as ck:
        ck.put_tensor("w", w, ctx=ctx)
        ck.put_tensor("b", b, ctx=ctx)
        ck.put_bytes("fp8", layer.state_dict())
        ck.put_bytes("step", (3).to_bytes(8, "little"))
        ck.write(tmp_path / "train.teckpt")
    with libte.Checkpoint.read(tmp_path / "train.teckpt") as ck:
        w2 = ck.get_tensor("w", np.empty_like(w), ctx=ctx)
        b2 = ck.get_tensor("b", np.empty_like(b), ctx=ctx)
        restored = libte.Linear(ctx, 32, 16)
        restored.load_state_dict(ck.get_bytes("fp8"))
        assert int.from_bytes(ck.get_bytes("step"), "little") == 3
    with libte.autocast(ctx, recipe=recipe):
        y_a, _ = layer.forward(x, w, b)
        y_b, _ = restored.forward(x, w2, b2)
    assert y_a.tobytes() == y_b.tobytes()


def test_low_level_checkpoint_calls(tmp_path):
    """The low-level layer directly: handles, counts, bytes names; NULL arguments reach the
    library, which names them."""
    ck = ll.checkpoint_create()
    try:
        ll.checkpoint_put_bytes(ck, b"k", b"v")
        assert ll.checkpoint_count(ck) == 1
        assert ll.checkpoint_name(ck, 0) == b"k"
        with pytest.raises(libte.InvalidArgument) as e:
            ll.checkpoint_name(ck, 1)  # index past the count
        library_error(e, "te_checkpoint_name")
        with pytest.raises(libte.InvalidArgument) as e:
            ll.checkpoint_put_bytes(ck, None, b"v")
        assert "name" in library_error(e, "te_checkpoint_put_bytes")
        data = ll.checkpoint_serialize(ck)
        ck2 = ll.checkpoint_deserialize(data)
        assert ll.checkpoint_get_bytes(ck2, "k") == b"v"
        ll.checkpoint_destroy(ck2)
        ll.checkpoint_write(ck, str(tmp_path / "f"))
        ck3 = ll.checkpoint_read(str(tmp_path / "f"))
        assert ll.checkpoint_serialize(ck3) == data
        ll.checkpoint_destroy(ck3)
    finally:
        ll.checkpoint_destroy(ck)


def test_dlpack_tensors(ctx, rng):
    torch = pytest.importorskip("torch")
    a = rng.standard_normal((3, 5)).astype(np.float32)
    ids = rng.integers(0, 100, size=7, dtype=np.int32)
    with libte.Checkpoint() as ck:
        ck.put_tensor("a", torch.from_numpy(a), ctx=ctx)
        ck.put_tensor("ids", torch.from_numpy(ids))
        out, out_ids = torch.empty((3, 5)), torch.empty(7, dtype=torch.int32)
        ck.get_tensor("a", out, ctx=ctx)
        ck.get_tensor("ids", out_ids)
    assert out.numpy().tobytes() == a.tobytes() and out_ids.numpy().tobytes() == ids.tobytes()


def test_record_info(rng, tmp_path):
    """record_info against the arrays and bytes that went in, before and after a file round
    trip; byte records have no dtype or shape; a missing record is named."""
    arrays = records(rng)
    expected = {name: libte.checkpoint.RecordInfo("tensor", a.dtype.name, a.shape, a.nbytes)
                for name, a in arrays.items()}
    expected.update({name: libte.checkpoint.RecordInfo("bytes", None, None, len(b))
                     for name, b in BLOBS.items()})
    path = tmp_path / "info.teckpt"
    with libte.Checkpoint() as ck:
        fill(ck, arrays, BLOBS)
        assert {name: ck.record_info(name) for name in ck} == expected
        ck.write(path)
    assert expected["emb"].dtype == "bfloat16" and expected["data.position"].dtype == "int32"
    with libte.Checkpoint.read(path) as ck:
        for name in ck:
            info = ck.record_info(name)
            assert info == expected[name] and info.kind == expected[name][0], name
            assert ck.record_info(name.encode()) == info  # bytes names too
        with pytest.raises(libte.InvalidArgument) as e:
            ck.record_info("missing")
        assert "missing" in library_error(e, "te_checkpoint_record_info")
        assert ck.names() == list(arrays) + list(BLOBS)  # nothing changed


def test_get_tensor_without_out_allocates_the_stored_array(ctx, rng):
    arrays = records(rng)
    with libte.Checkpoint() as ck:
        fill(ck, arrays, BLOBS)
        for name, a in arrays.items():
            got = ck.get_tensor(name)
            assert isinstance(got, np.ndarray), name
            assert got.dtype == a.dtype and got.shape == a.shape, name
            assert got.tobytes() == a.tobytes(), name
        got = ck.get_tensor("emb", ctx=ctx)  # an explicit CPU context
        assert got.dtype == BF16 and got.tobytes() == arrays["emb"].tobytes()
        with pytest.raises(libte.InvalidArgument, match="holds bytes"):
            ck.get_tensor("step")
        with pytest.raises(libte.InvalidArgument) as e:
            ck.get_tensor("missing")
        assert "missing" in library_error(e, "te_checkpoint_record_info")


def test_low_level_record_info():
    ck = ll.checkpoint_create()
    try:
        ll.checkpoint_put_bytes(ck, b"k", b"value")
        a = np.arange(6, dtype=np.float32).reshape(2, 3, 1)
        desc = (a.ctypes.data, C.DTYPE_F32, a.shape, C.DEVICE_CPU, 0, 0, 0)
        with libte.Context("cpu") as c:
            ll.checkpoint_put_tensor(ck, c._handle(), "t", desc)
        assert ll.checkpoint_record_info(ck, "k") == (False, None, None, 5)
        assert ll.checkpoint_record_info(ck, b"t") == (True, C.DTYPE_F32, (2, 3, 1), 24)
        with pytest.raises(libte.InvalidArgument) as e:
            ll.checkpoint_record_info(ck, None)
        assert "name" in library_error(e, "te_checkpoint_record_info")
        with pytest.raises(libte.InvalidArgument) as e:
            ll.checkpoint_record_info(None, "k")
        library_error(e, "te_checkpoint_record_info")
    finally:
        ll.checkpoint_destroy(ck)
