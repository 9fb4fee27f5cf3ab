"""LayerNormLinear against float64 references: in high precision against the formulas, in FP8
against the same formulas on the operands the library quantized (read back from the residuals)
and, loosely, against the unquantized formulas; repeatable backward, state round trips, errors,
lifetimes."""

import gc

import numpy as np
import pytest

import libte
from module_reference import (assert_close, dequant64, e5m2_exact, f64, layernorm_linear, norm,
                              norm_backward, rel_err)

T, IN, OUT = 32, 64, 48


def params(rng, kind="layernorm", dtype=np.float32, lead=(T,)):
    x = rng.uniform(-2, 3, lead + (IN,)).astype(dtype)
    gamma = rng.uniform(0.5, 1.5, IN).astype(dtype)
    beta = rng.uniform(-0.5, 0.5, IN).astype(dtype) if kind == "layernorm" else None
    w = rng.uniform(-0.2, 0.2, (OUT, IN)).astype(dtype)
    b = rng.uniform(-1, 1, OUT).astype(dtype)
    return x, gamma, beta, w, b


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zcg", [False, True])
def test_high_precision_forward_backward_match_fp64(ctx, rng, kind, zcg):
    m = libte.LayerNormLinear(ctx, IN, OUT, normalization=kind, zero_centered_gamma=zcg)
    x, gamma, beta, w, b = params(rng, kind, lead=(2, T // 2))
    y, ln_out, res = m.forward_compute(x, gamma, beta, w, b, ln_out=True)
    assert not res.fp8 and y.shape == (2, T // 2, OUT) and ln_out.shape == x.shape
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    ref = layernorm_linear(kind, x, gamma, beta, w, b, dy, zcg=zcg)
    # fp32 statistics, normalisation and a 64-term fp32 dot product: a few fp32 ulps.
    assert_close(ln_out, ref["ln_out"], 1e-6)
    assert_close(y, ref["y"], 1e-5)
    np.testing.assert_array_equal(res.ln_out_t, ln_out.reshape(T, IN))  # norm(x), not copied
    np.testing.assert_array_equal(res.weight_t, w)
    assert_close(res.rsigma, ref["rsigma"].reshape(-1), 1e-6)
    if kind == "layernorm":
        assert_close(res.mu, ref["mu"].reshape(-1), 1e-6)
    else:
        assert res.mu is None
    bwd = m.forward_save(res)
    g = bwd.backward(dy)
    assert isinstance(g, libte.LayerNormLinearGradients)
    # The norm's backward cancels terms (dx = rs (dyg - xhat c1 - c2)): 1e-4 of the scale.
    for name in ("dx", "dln_weight", "dw", "db") + (("dln_bias",) if kind == "layernorm" else ()):
        assert_close(getattr(g, name), ref[name], 1e-4)
    assert (g.dln_bias is None) == (kind == "rmsnorm")
    # Retain-graph: the same bytes again.
    g2 = bwd.backward(dy)
    for a, a2 in zip(g, g2):
        if a is not None:
            assert a.tobytes() == a2.tobytes()


def test_fp8_delayed_matches_fp64_on_quantized_operands(ctx, rng):
    m = libte.LayerNormLinear(ctx, IN, OUT)
    x, gamma, beta, w, b = params(rng)
    with libte.autocast(ctx, recipe=libte.Recipe(kind="delayed")):
        y, res = m.forward_compute(x, gamma, beta, w, b)
    assert res.fp8
    ln_t, w_t = res.ln_out_t, res.weight_t
    assert ln_t.shape == (IN, T) and ln_t.dtype_name == "float8_e4m3fn"
    assert w_t.shape == (IN, OUT) and w_t.dtype_name == "float8_e4m3fn"
    ln_q, w_q = dequant64(ln_t).T, dequant64(w_t).T
    ln_ref, _, _ = norm("layernorm", x, gamma, beta)
    # A fresh delayed-scaling state has scale 1: the norm's FP8 output is the fp64 norm rounded
    # to E4M3, within half an ulp (2^-4 relative) plus half the smallest subnormal (2^-10).
    assert np.all(np.abs(ln_q - ln_ref) <= 2.0 ** -4 * np.abs(ln_ref) + 2.0 ** -10)
    # The GEMM on the quantized operands: exact products, fp32 accumulation of 64 terms.
    assert_close(y, ln_q @ w_q.T + b, 1e-5)

    # dy exactly representable in E5M2, quantized with scale 1: exact too.
    dy = e5m2_exact(rng, (T, OUT))
    bwd = m.forward_save(res)
    assert res.closed and bwd.fp8
    g = bwd.backward(dy)
    dx, dg, dbeta = norm_backward("layernorm", dy @ w_q, x, gamma)
    assert_close(g.dx, dx, 1e-4)
    assert_close(g.dln_weight, dg, 1e-4)
    assert_close(g.dln_bias, dbeta, 1e-4)
    assert_close(g.dw, f64(dy).T @ ln_q, 1e-5)
    assert_close(g.db, f64(dy).sum(0), 1e-6)
    g2 = bwd.backward(dy)
    assert all(a.tobytes() == a2.tobytes() for a, a2 in zip(g, g2))


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_fp8_current_scaling_close_to_fp64(ctx, rng, kind):
    """Against the unquantized formulas. E4M3 rounds to 3 mantissa bits: a relative error of
    at most 2^-4 per operand, about 2^-4/sqrt(3) = 0.036 RMS; a product of two independently
    rounded operands summed over 64 terms then has a relative (Frobenius) error near
    sqrt(2) * 0.036 = 0.05: bound 0.08. The backward adds dy in E5M2 (2 mantissa bits, 0.072
    RMS): dgrad/wgrad errors near sqrt(0.072^2 + 0.036^2) = 0.08: bound 0.15."""
    m = libte.LayerNormLinear(ctx, IN, OUT, normalization=kind)
    x, gamma, beta, w, b = params(rng, kind)
    dy = rng.standard_normal((T, OUT)).astype(np.float32)
    ref = layernorm_linear(kind, x, gamma, beta, w, b, dy)
    with libte.autocast(ctx, recipe=libte.Recipe(kind="current")):
        y, bwd = m.forward(x, gamma, beta, w, b)
    assert rel_err(y - b, ref["y"] - b) < 0.08
    g = bwd.backward(dy, once=True)
    for name in ("dx", "dln_weight", "dw"):
        assert rel_err(getattr(g, name), ref[name]) < 0.15, name
    assert_close(g.db, ref["db"], 1e-6)  # a plain sum of dy in fp32


def test_backward_outputs_given_skipped_and_once(ctx, rng):
    m = libte.LayerNormLinear(ctx, IN, OUT)
    x, gamma, beta, w, b = params(rng)
    with libte.autocast(ctx):
        y, bwd = m.forward(x, gamma, beta, w, b)
    assert bwd.fp8 is None  # forward() reports no residuals
    with pytest.raises(libte.InvalidState, match="forward_compute"):
        bwd.ln_out_t
    dy = np.ones_like(y)
    dx = np.empty_like(x)
    g = m.backward(bwd, dy, dx=dx, dln_weight=False, dln_bias=False, dw=False, db=False)
    assert g.dx is dx and g[1:] == (None, None, None, None)
    full = bwd.backward(dy, once=True)
    assert full.dx.tobytes() == dx.tobytes()
    with pytest.raises(libte.InvalidState) as e:
        bwd.backward(dy)
    assert "te_layernorm_linear_backward" in str(e.value)


def test_fuse_wgrad_accumulation_and_no_bias(ctx, rng):
    m = libte.LayerNormLinear(ctx, IN, OUT, bias=False, fuse_wgrad_accumulation=True)
    x, gamma, beta, w, _ = params(rng)
    y, bwd = m.forward(x, gamma, beta, w)
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    main_grad = np.ones((OUT, IN), np.float32)
    g = bwd.backward(dy, dw=main_grad)
    assert g.dw is main_grad and g.db is None
    ref = layernorm_linear("layernorm", x, gamma, beta, w, None, dy)
    assert_close(main_grad, 1 + ref["dw"], 1e-5)
    with pytest.raises(libte.InvalidArgument, match="main_grad"):
        bwd.backward(dy)
    with pytest.raises(libte.InvalidArgument) as e:
        bwd.backward(dy, dw=main_grad, db=np.zeros(OUT, np.float32))
    assert "te_layernorm_linear_backward" in str(e.value) and "db" in str(e.value)


def test_bfloat16(ctx, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m = libte.LayerNormLinear(ctx, IN, OUT, dtype="bfloat16")
    x, gamma, beta, w, b = params(rng, dtype=ml_dtypes.bfloat16)
    y, bwd = m.forward(x, gamma, beta, w, b)
    assert y.dtype == ml_dtypes.bfloat16
    # bf16 keeps 8 bits: norm(x) rounded to bf16 (2^-9 relative), then a bf16 output.
    ref = layernorm_linear("layernorm", x, gamma, beta, w, b, np.zeros((T, OUT)))
    assert rel_err(y, ref["y"]) < 2.0 ** -7
    g = bwd.backward(np.ones_like(y))
    assert all(a.dtype == ml_dtypes.bfloat16 for a in g)


def test_weight_unchanged_reuses_the_fp8_weight(ctx, rng):
    m = libte.LayerNormLinear(ctx, IN, OUT)
    x, gamma, beta, w, b = params(rng)
    with libte.autocast(ctx, recipe=libte.Recipe(kind="current")):
        y1, _ = m.forward(x, gamma, beta, w, b)
        y2, _ = m.forward(x, gamma, beta, w * 0, b, weight_unchanged=True)
    assert y1.tobytes() == y2.tobytes()


def test_state_dict_round_trip_is_bit_exact(ctx, rng):
    recipe = libte.Recipe(amax_history_len=8)
    a = libte.LayerNormLinear(ctx, IN, OUT)
    x, gamma, beta, w, b = params(rng)
    for step in range(3):
        with libte.autocast(ctx, recipe=recipe):
            y, bwd = a.forward(x * (step + 1), gamma, beta, w, b)
        bwd.backward(np.ones_like(y), once=True)
    state = a.state_dict()
    assert isinstance(state, bytes) and len(state) > 0
    fresh = libte.LayerNormLinear(ctx, IN, OUT)
    assert fresh.state_dict() != state
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    for role in ("input", "weight", "grad_output"):
        sa, sf = a.scaling_state(role), fresh.scaling_state(role)
        assert sa[:4] == sf[:4] and sa.amax_history_len == 8
        assert sa.amax_history.tobytes() == sf.amax_history.tobytes()
    assert a.scaling_state("grad_output").fp8_dtype == "float8_e5m2"
    with libte.autocast(ctx, recipe=recipe):
        ya, _ = a.forward(x, gamma, beta, w, b)
        yf, _ = fresh.forward(x, gamma, beta, w, b)
    assert ya.tobytes() == yf.tobytes()
    with pytest.raises(libte.InvalidArgument) as e:
        libte.LayerNormLinear(ctx, IN, OUT + 16).load_state_dict(state)
    assert "te_layernorm_linear_state_load" in str(e.value)
    with pytest.raises(libte.InvalidArgument):
        fresh.load_state_dict(state[:-1])
    with pytest.raises(libte.InvalidArgument, match="expected bytes"):
        fresh.load_state_dict(None)


def test_errors_name_the_argument(ctx, rng):
    m = libte.LayerNormLinear(ctx, IN, OUT)
    x, gamma, beta, w, b = params(rng)

    def fails(cls, *texts, **kw):
        def run(f):
            with pytest.raises(cls) as e:
                f()
            for t in texts:
                assert t in str(e.value), str(e.value)
        return run

    fails(libte.InvalidArgument, "te_layernorm_linear_forward", "args->input")(
        lambda: m.forward(x[:, :32].copy(), gamma, beta, w, b))
    fails(libte.InvalidArgument, "args->ln_weight")(
        lambda: m.forward(x, gamma[:32].copy(), beta, w, b))
    fails(libte.InvalidArgument, "args->ln_bias")(lambda: m.forward(x, gamma, None, w, b))
    fails(libte.InvalidArgument, "args->weight")(lambda: m.forward(x, gamma, beta, w.T.copy(), b))
    fails(libte.InvalidArgument, "args->bias")(lambda: m.forward(x, gamma, beta, w))
    fails(libte.InvalidArgument, "args->ln_out")(
        lambda: m.forward(x, gamma, beta, w, b, ln_out=np.empty((T, IN + 1), np.float32)))
    fails(libte.InvalidArgument, "te_layernorm_linear_forward", "F32", "F16")(
        lambda: m.forward(x.astype(np.float16), gamma, beta, w, b))
    rms = libte.LayerNormLinear(ctx, IN, OUT, normalization="rmsnorm")
    fails(libte.InvalidArgument, "args->ln_bias")(lambda: rms.forward(x, gamma, beta, w, b))
    y, bwd = m.forward(x, gamma, beta, w, b)
    fails(libte.InvalidArgument, "te_layernorm_linear_backward", "dy")(
        lambda: bwd.backward(np.ones((T, OUT + 1), np.float32)))
    fails(libte.InvalidArgument, "grads->dx")(
        lambda: bwd.backward(np.ones_like(y), dx=np.empty((T, IN + 1), np.float32)))
    fails(libte.InvalidArgument, "grads->dln_weight")(
        lambda: bwd.backward(np.ones_like(y), dln_weight=np.empty(IN + 1, np.float32)))
    with libte.autocast(ctx):
        fails(libte.Unsupported, "16")(lambda: m.forward(x[:10], gamma, beta, w, b))
    # What only Python sees: its own messages, the same exception classes.
    fails(libte.InvalidArgument, "argument 'normalization'")(
        lambda: libte.LayerNormLinear(ctx, IN, OUT, normalization="batchnorm"))
    fails(libte.InvalidArgument, "argument 'in_features'")(
        lambda: libte.LayerNormLinear(ctx, 0, OUT))
    fails(libte.InvalidArgument, "te_layernorm_linear_create", "eps")(
        lambda: libte.LayerNormLinear(ctx, IN, OUT, eps=-1.0))
    fails(libte.InvalidArgument, "argument 'role'")(lambda: m.scaling_state("bias"))
    fails(libte.InvalidArgument, "argument 'residuals'")(lambda: m.forward_save(bwd))
    other = libte.LayerNormLinear(ctx, IN, OUT)
    fails(libte.InvalidArgument, "another LayerNormLinear")(
        lambda: other.backward(bwd, np.ones_like(y)))


def test_lifetimes(rng):
    """The backward context keeps the caller's arrays the forward referenced (x, gamma, W in
    high precision) and its context alive; closing the context closes the module and its
    backward contexts first."""
    ctx = libte.Context("cpu")
    m = libte.LayerNormLinear(ctx, IN, OUT)
    x, gamma, beta, w, b = params(rng)
    dy = rng.uniform(-1, 1, (T, OUT)).astype(np.float32)
    ref = layernorm_linear("layernorm", x, gamma, beta, w, b, dy)
    y, bwd = m.forward(x, gamma, beta, w, b)
    del x, gamma, beta, w
    gc.collect()
    for _ in range(3):  # new arrays that could reuse the freed memory
        np.full((T, IN), 1e6, np.float32), np.full((OUT, IN), 1e6, np.float32)
    m.close()  # the backward context outlives the module
    g = bwd.backward(dy)
    assert_close(g.dx, ref["dx"], 1e-4)
    assert_close(g.dw, ref["dw"], 1e-4)
    with pytest.raises(libte.InvalidState, match="LayerNormLinear is closed"):
        m.state_dict()
    ctx.close()
    assert bwd.closed
    with pytest.raises(libte.InvalidState, match="is closed"):
        bwd.backward(dy)
