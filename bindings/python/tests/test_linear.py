import numpy as np
import pytest

import libte
from conftest import dequant64, fp64_linear_reference

T, IN, OUT = 32, 64, 48


def make(rng, tokens=T, fin=IN, fout=OUT, dtype=np.float32):
    x = rng.standard_normal((tokens, fin)).astype(dtype)
    w = (rng.standard_normal((fout, fin)) / np.sqrt(fin)).astype(dtype)
    b = rng.standard_normal(fout).astype(dtype)
    return x, w, b


def rel_err(a, ref):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(a - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_fp8_forward_matches_fp64_on_dequantized_residuals(ctx, rng, kind):
    lin = libte.Linear(ctx, IN, OUT)
    x, w, b = make(rng)
    with libte.autocast(ctx, recipe=libte.Recipe(kind=kind)):
        y, res = lin.forward_compute(x, w, b)
    assert res.fp8
    assert res.input_t.shape == (IN, T) and res.weight_t.shape == (IN, OUT)
    assert res.input_t.dtype_name == "float8_e4m3fn"
    ref = fp64_linear_reference(res, b)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    # ... and FP8 is close to the unquantized product.
    assert rel_err(y, x.astype(np.float64) @ w.T.astype(np.float64) + b) < 0.08
    res.release()


def test_high_precision_outside_autocast(ctx, rng):
    lin = libte.Linear(ctx, IN, OUT)
    x, w, b = make(rng)
    y, res = lin.forward_compute(x, w, b)
    assert not res.fp8
    np.testing.assert_array_equal(res.input_t, x)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T + b, rtol=1e-5, atol=1e-5)
    with libte.autocast(ctx, enabled=False):
        y2, _ = lin.forward(x, w, b)
    np.testing.assert_array_equal(y, y2)


def test_fp8_backward_matches_fp64_reference(ctx, rng):
    lin = libte.Linear(ctx, IN, OUT)
    x, w, b = make(rng)
    with libte.autocast(ctx, recipe=libte.Recipe(kind="current")):
        y, res = lin.forward_compute(x, w, b)
    xt, wt = dequant64(res.input_t), dequant64(res.weight_t)
    bwd = lin.forward_save(res)
    assert res.closed and bwd.fp8
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, dw, db = bwd.backward(dy)
    # dy is quantized to E5M2 (HYBRID) with its own current scale: reproduce it.
    q = libte.quantize(ctx, dy, dtype="e5m2")
    dq = dequant64(q)
    np.testing.assert_allclose(dx, dq @ wt.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, dq.T @ xt.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, dy.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    # ... and it is close to high precision.
    assert rel_err(dx, dy.astype(np.float64) @ w) < 0.15
    assert rel_err(dw, dy.astype(np.float64).T @ x) < 0.15
    # Repeatable until closed (retain-graph semantics).
    dx2, dw2, db2 = bwd.backward(dy)
    np.testing.assert_array_equal(dx, dx2)
    np.testing.assert_array_equal(dw, dw2)


def test_backward_into_given_arrays_and_skips(ctx, rng):
    lin = libte.Linear(ctx, IN, OUT)
    x, w, b = make(rng)
    y, bwd = lin.forward(x, w, b)
    dy = np.ones_like(y)
    dx = np.empty_like(x)
    dw = np.empty_like(w)
    r = lin.backward(bwd, dy, dx=dx, dw=dw, db=False)
    assert r[0] is dx and r[1] is dw and r[2] is None
    np.testing.assert_allclose(dx, dy @ w, rtol=1e-5, atol=1e-5)
    assert lin.backward(bwd, dy, dx=False, dw=False, db=False) == (None, None, None)


def test_backward_once(ctx, rng):
    lin = libte.Linear(ctx, IN, OUT)
    x, w, b = make(rng)
    with libte.autocast(ctx):
        y, res = lin.forward_compute(x, w, b)
    bwd = lin.forward_save(res)
    bwd.backward(np.ones_like(y), once=True)
    with pytest.raises(libte.InvalidState) as e:
        bwd.backward(np.ones_like(y))
    assert "te_linear_backward" in str(e.value)
    with pytest.raises(libte.InvalidState, match="once=True"):
        bwd.input_t


def test_no_bias_layer(ctx, rng):
    lin = libte.Linear(ctx, IN, OUT, bias=False)
    x, w, _ = make(rng)
    y, bwd = lin.forward(x, w)
    dx, dw, db = bwd.backward(np.ones_like(y))
    assert db is None
    with pytest.raises(libte.InvalidArgument) as e:
        lin.forward(x, w, np.zeros(OUT, np.float32))
    assert "bias" in str(e.value)


def test_fuse_wgrad_accumulation(ctx, rng):
    lin = libte.Linear(ctx, IN, OUT, fuse_wgrad_accumulation=True)
    x, w, b = make(rng)
    y, bwd = lin.forward(x, w, b)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    main_grad = np.ones((OUT, IN), np.float32)
    bwd.backward(dy, dw=main_grad)
    np.testing.assert_allclose(main_grad, 1 + dy.T.astype(np.float64) @ x, rtol=1e-4,
                               atol=1e-4)
    with pytest.raises(libte.InvalidArgument, match="main_grad"):
        bwd.backward(dy)


def test_bfloat16_layer(ctx, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    lin = libte.Linear(ctx, IN, OUT, dtype="bfloat16")
    x, w, b = make(rng, dtype=ml_dtypes.bfloat16)
    with libte.autocast(ctx, recipe=libte.Recipe(kind="current")):
        y, bwd = lin.forward(x, w, b)
    assert y.dtype == ml_dtypes.bfloat16
    ref = x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
    assert rel_err(y, ref) < 0.08
    dx, dw, db = bwd.backward(np.ones_like(y))
    assert dx.dtype == dw.dtype == db.dtype == ml_dtypes.bfloat16


def test_state_dict_round_trip_is_bit_exact(ctx, rng):
    recipe = libte.Recipe(amax_history_len=8)
    a = libte.Linear(ctx, IN, OUT)
    x, w, b = make(rng)
    for _ in range(3):
        with libte.autocast(ctx, recipe=recipe):
            y, bwd = a.forward(x, w, b)
        bwd.backward(np.ones_like(y), once=True)
    state = a.state_dict()
    assert isinstance(state, bytes) and len(state) > 0
    fresh = libte.Linear(ctx, IN, OUT)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    for role in ("input", "weight", "grad_output"):
        sa, sf = a.scaling_state(role), fresh.scaling_state(role)
        assert sa[:4] == sf[:4]
        np.testing.assert_array_equal(sa.amax_history, sf.amax_history)
    # Training resumes identically.
    with libte.autocast(ctx, recipe=recipe):
        ya, _ = a.forward(x, w, b)
        yf, _ = fresh.forward(x, w, b)
    np.testing.assert_array_equal(ya, yf)
    with pytest.raises(libte.InvalidArgument) as e:
        libte.Linear(ctx, IN, OUT * 2).load_state_dict(state)
    assert "te_linear_state_load" in str(e.value)
    with pytest.raises(libte.InvalidArgument):
        fresh.load_state_dict(state[:5])
    with pytest.raises(libte.InvalidArgument, match="expected bytes"):
        fresh.load_state_dict("text")


def test_scaling_state_after_delayed_step(ctx, rng):
    lin = libte.Linear(ctx, IN, OUT)
    s0 = lin.scaling_state("input")
    assert s0.amax_history_len == 0 and s0.scale == 1.0
    x, w, b = make(rng)
    with libte.autocast(ctx, recipe=libte.Recipe(amax_history_len=4)):
        lin.forward(x, w, b)
    s = lin.scaling_state("weight")
    assert s.amax_history_len == 4 and s.fp8_dtype == "float8_e4m3fn"
    amax = float(np.abs(w).max())
    assert s.scale == pytest.approx(448.0 / amax, rel=1e-6)
    assert s.scale_inv == pytest.approx(amax / 448.0, rel=1e-6)
    with pytest.raises(libte.InvalidArgument, match="argument 'role'"):
        lin.scaling_state("bias")


def test_weight_unchanged_reuses_cache(ctx, rng):
    lin = libte.Linear(ctx, IN, OUT)
    x, w, b = make(rng)
    with libte.autocast(ctx, recipe=libte.Recipe(kind="current")):
        y1, _ = lin.forward(x, w, b)
        y2, _ = lin.forward(x, w * 0, b, weight_unchanged=True)  # the cached FP8 W is used
    np.testing.assert_array_equal(y1, y2)


def test_fp8_shape_must_be_multiple_of_16(ctx, rng):
    lin = libte.Linear(ctx, IN, OUT)
    x, w, b = make(rng, tokens=10)
    with libte.autocast(ctx):
        with pytest.raises(libte.Unsupported) as e:
            lin.forward(x, w, b)
    assert "16" in str(e.value)
