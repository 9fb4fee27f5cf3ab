"""LayerNormMLP against float64 references: every activation in high precision against the
formulas; FP8 against the formulas on the operands the library quantized (read back from the
residuals) and, loosely, against the unquantized chain; repeatable backward, state round trips,
errors."""

import numpy as np
import pytest

import libte
from module_reference import (activation, assert_close, dequant64, e5m2_exact, f64,
                              layernorm_mlp, norm, rel_err)

T, HIDDEN, FFN = 32, 64, 96
ACTIVATIONS = ["gelu", "relu", "srelu", "swiglu", "geglu"]


def fc1_rows(act):
    return 2 * FFN if act in ("swiglu", "geglu") else FFN


def params(rng, act="gelu", kind="layernorm", dtype=np.float32, lead=(T,)):
    x = rng.uniform(-2, 3, lead + (HIDDEN,)).astype(dtype)
    gamma = rng.uniform(0.5, 1.5, HIDDEN).astype(dtype)
    beta = rng.uniform(-0.5, 0.5, HIDDEN).astype(dtype) if kind == "layernorm" else None
    w1 = rng.uniform(-0.2, 0.2, (fc1_rows(act), HIDDEN)).astype(dtype)
    b1 = rng.uniform(-0.2, 0.2, fc1_rows(act)).astype(dtype)
    w2 = rng.uniform(-0.2, 0.2, (HIDDEN, FFN)).astype(dtype)
    b2 = rng.uniform(-0.2, 0.2, HIDDEN).astype(dtype)
    return x, gamma, beta, w1, b1, w2, b2


GRADS = ("dx", "dln_weight", "dln_bias", "dfc1_weight", "dfc1_bias", "dfc2_weight", "dfc2_bias")


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_high_precision_forward_backward_match_fp64(ctx, rng, act, kind):
    m = libte.LayerNormMLP(ctx, HIDDEN, FFN, activation=act, normalization=kind)
    assert m.fc1_rows == fc1_rows(act) and m.activation == act
    x, gamma, beta, w1, b1, w2, b2 = params(rng, act, kind, lead=(2, T // 2))
    y, ln_out, res = m.forward_compute(x, gamma, beta, w1, b1, w2, b2, ln_out=True)
    assert not res.fp8 and y.shape == x.shape
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    ref = layernorm_mlp(kind, act, x, gamma, beta, w1, b1, w2, b2, dy)
    # fp32 throughout: the norm, two GEMMs of 64 and 96 terms and the activation (tanh, exp
    # within a few ulps) stay within 1e-5 of each tensor's scale; the backward through the
    # norm (cancelling terms) within 1e-4.
    assert_close(ln_out, ref["ln_out"], 1e-6)
    assert_close(res.fc1_out, ref["fc1_out"].reshape(T, -1), 1e-5)
    assert_close(res.act_out_t, ref["act_out"].reshape(T, FFN), 1e-5)
    assert_close(y, ref["y"], 1e-5)
    np.testing.assert_array_equal(res.fc1_weight_t, w1)
    np.testing.assert_array_equal(res.fc2_weight_t, w2)
    assert (res.mu is None) == (kind == "rmsnorm")
    bwd = m.forward_save(res)
    g = bwd.backward(dy)
    assert isinstance(g, libte.LayerNormMLPGradients)
    for name in GRADS:
        if name == "dln_bias" and kind == "rmsnorm":
            assert g.dln_bias is None
            continue
        assert_close(getattr(g, name), ref[name], 1e-4)
    g2 = bwd.backward(dy)
    for a, a2 in zip(g, g2):
        if a is not None:
            assert a.tobytes() == a2.tobytes()


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_fp8_delayed_matches_fp64_on_quantized_operands(ctx, rng, act):
    m = libte.LayerNormMLP(ctx, HIDDEN, FFN, activation=act)
    x, gamma, beta, w1, b1, w2, b2 = params(rng, act)
    with libte.autocast(ctx, recipe=libte.Recipe(kind="delayed")):
        y, res = m.forward_compute(x, gamma, beta, w1, b1, w2, b2)
    assert res.fp8
    for name, shape in (("ln_out_t", (HIDDEN, T)), ("fc1_weight_t", (HIDDEN, fc1_rows(act))),
                        ("act_out_t", (FFN, T)), ("fc2_weight_t", (FFN, HIDDEN))):
        t = getattr(res, name)
        assert isinstance(t, libte.Float8Tensor) and t.shape == shape, name
    ln_q = dequant64(res.ln_out_t).T
    w1_q = dequant64(res.fc1_weight_t).T
    a_q = dequant64(res.act_out_t).T
    w2_q = dequant64(res.fc2_weight_t).T
    fc1_out = f64(res.fc1_out)
    assert fc1_out.shape == (T, fc1_rows(act)) and res.fc1_out.dtype == np.float32
    # Fresh delayed-scaling states have scale 1: FP8 values are the fp64 ones rounded to E4M3
    # (half an ulp, 2^-4 relative, plus half the smallest subnormal, 2^-10).
    ln_ref, _, _ = norm("layernorm", x, gamma, beta)
    assert np.all(np.abs(ln_q - ln_ref) <= 2.0 ** -4 * np.abs(ln_ref) + 2.0 ** -10)
    # Each GEMM on the operands it used: exact products, fp32 accumulation.
    assert_close(fc1_out, ln_q @ w1_q.T + b1, 1e-5)
    a_ref = activation(act, fc1_out)  # the activation of the library's own fc1 output
    assert np.all(np.abs(a_q - a_ref) <= 2.0 ** -4 * np.abs(a_ref) + 2.0 ** -10 + 1e-6)
    assert_close(y, a_q @ w2_q.T + b2, 1e-5)

    dy = e5m2_exact(rng, (T, HIDDEN))  # quantized exactly with scale 1
    bwd = m.forward_save(res)
    g = bwd.backward(dy)
    # fc2's wgrad and dbias read dy and act's FP8 output only: exact up to fp32 sums.
    assert_close(g.dfc2_weight, f64(dy).T @ a_q, 1e-5)
    assert_close(g.dfc2_bias, f64(dy).sum(0), 1e-6)
    # Deeper, the activation's gradient is quantized to E5M2 with a delayed scale, so the rest
    # is checked against the fp64 chain on the quantized forward operands, loosely: E5M2 keeps
    # 2 mantissa bits (2^-3 relative at most, about 0.072 RMS), so 0.15 (Frobenius).
    ref = layernorm_mlp("layernorm", act, x, gamma, beta, w1_q, b1, w2_q, b2, dy)
    for name in ("dx", "dln_weight", "dln_bias", "dfc1_weight", "dfc1_bias"):
        assert rel_err(getattr(g, name), ref[name]) < 0.15, name
    g2 = bwd.backward(dy, once=True)
    assert all(a.tobytes() == a2.tobytes() for a, a2 in zip(g, g2))
    with pytest.raises(libte.InvalidState, match="te_layernorm_mlp_backward"):
        bwd.backward(dy)


@pytest.mark.parametrize("recipe", ["current", "block"])
def test_fp8_close_to_fp64(ctx, rng, recipe):
    """Against the unquantized chain: each GEMM's two E4M3 operands (about 0.036 RMS relative
    rounding each) and fc2's input passing through fc1's error: relative (Frobenius) errors
    near 0.07 forward; the backward adds E5M2 gradients (0.072 RMS) at fc2 and fc1: 0.2."""
    m = libte.LayerNormMLP(ctx, HIDDEN, FFN * 4 // 3, activation="geglu")  # ffn 128
    x, gamma, beta, _, _, _, _ = params(rng)
    w1 = rng.uniform(-0.2, 0.2, (256, HIDDEN)).astype(np.float32)
    b1 = rng.uniform(-0.2, 0.2, 256).astype(np.float32)
    w2 = rng.uniform(-0.2, 0.2, (HIDDEN, 128)).astype(np.float32)
    b2 = rng.uniform(-0.2, 0.2, HIDDEN).astype(np.float32)
    dy = rng.standard_normal((T, HIDDEN)).astype(np.float32)
    ref = layernorm_mlp("layernorm", "geglu", x, gamma, beta, w1, b1, w2, b2, dy)
    with libte.autocast(ctx, recipe=libte.Recipe(kind=recipe)):
        y, bwd = m.forward(x, gamma, beta, w1, b1, w2, b2)
    assert rel_err(y - b2, ref["y"] - b2) < 0.12
    g = bwd.backward(dy, once=True)
    for name in GRADS:
        assert rel_err(getattr(g, name), ref[name]) < 0.2, name


def test_backward_given_skipped_and_fused_wgrad(ctx, rng):
    m = libte.LayerNormMLP(ctx, HIDDEN, FFN, bias=False, fuse_wgrad_accumulation=True,
                           normalization="rmsnorm", zero_centered_gamma=True)
    x, gamma, _, w1, _, w2, _ = params(rng, kind="rmsnorm")
    y, bwd = m.forward(x, gamma - 1, None, w1, None, w2)
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    mg1 = np.ones((FFN, HIDDEN), np.float32)
    mg2 = np.full((HIDDEN, FFN), 2.0, np.float32)
    g = bwd.backward(dy, dx=False, dfc1_weight=mg1, dfc2_weight=mg2)
    assert g.dx is None and g.dfc1_weight is mg1 and g.dfc2_weight is mg2
    assert g.dln_bias is None and g.dfc1_bias is None and g.dfc2_bias is None
    ref = layernorm_mlp("rmsnorm", "gelu", x, gamma - 1, None, w1, None, w2, None, dy, zcg=True)
    assert_close(g.dln_weight, ref["dln_weight"], 1e-4)
    assert_close(mg1, 1 + ref["dfc1_weight"], 1e-4)
    assert_close(mg2, 2 + ref["dfc2_weight"], 1e-4)
    with pytest.raises(libte.InvalidArgument, match="main_grad"):
        bwd.backward(dy, dfc1_weight=mg1)


def test_state_dict_round_trip_and_scaling_states(ctx, rng):
    recipe = libte.Recipe(amax_history_len=4)
    a = libte.LayerNormMLP(ctx, HIDDEN, FFN, activation="swiglu")
    x, gamma, beta, w1, b1, w2, b2 = params(rng, "swiglu")
    for step in range(2):
        with libte.autocast(ctx, recipe=recipe):
            y, bwd = a.forward(x * (step + 1), gamma, beta, w1, b1, w2, b2)
        bwd.backward(np.ones_like(y), once=True)
    s1 = a.scaling_state("weight", "fc1")
    assert s1.amax_history_len == 4
    assert s1.scale == pytest.approx(448.0 / np.abs(w1).max(), rel=1e-6)
    s2 = a.scaling_state("weight", gemm="fc2")
    assert s2.scale == pytest.approx(448.0 / np.abs(w2).max(), rel=1e-6)
    state = a.state_dict()
    fresh = libte.LayerNormMLP(ctx, HIDDEN, FFN, activation="swiglu")
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    for gemm in ("fc1", "fc2"):
        for role in ("input", "weight", "grad_output"):
            sa, sf = a.scaling_state(role, gemm), fresh.scaling_state(role, gemm)
            assert sa[:4] == sf[:4] and sa.amax_history.tobytes() == sf.amax_history.tobytes()
    with libte.autocast(ctx, recipe=recipe):
        ya, _ = a.forward(x, gamma, beta, w1, b1, w2, b2)
        yf, _ = fresh.forward(x, gamma, beta, w1, b1, w2, b2)
    assert ya.tobytes() == yf.tobytes()
    with pytest.raises(libte.InvalidArgument) as e:
        libte.LayerNormMLP(ctx, HIDDEN, FFN + 16, activation="swiglu").load_state_dict(state)
    assert "te_layernorm_mlp_state_load" in str(e.value)
    with pytest.raises(libte.InvalidArgument, match="argument 'gemm'"):
        a.scaling_state("input", "fc3")


def test_errors_name_the_argument(ctx, rng):
    m = libte.LayerNormMLP(ctx, HIDDEN, FFN)
    x, gamma, beta, w1, b1, w2, b2 = params(rng)
    cases = [
        ((x[:, :32].copy(), gamma, beta, w1, b1, w2, b2), "args->input"),
        ((x, gamma, beta, w1[:, :32].copy(), b1, w2, b2), "args->fc1_weight"),
        ((x, gamma, beta, w1, b1[:32].copy(), w2, b2), "args->fc1_bias"),
        ((x, gamma, beta, w1, b1, w2.T.copy(), b2), "args->fc2_weight"),
        ((x, gamma, beta, w1, b1, w2, None), "args->fc2_bias"),
        ((x, gamma, None, w1, b1, w2, b2), "args->ln_bias"),
    ]
    for args, name in cases:
        with pytest.raises(libte.InvalidArgument) as e:
            m.forward(*args)
        assert "te_layernorm_mlp_forward" in str(e.value) and name in str(e.value), str(e.value)
    gated = libte.LayerNormMLP(ctx, HIDDEN, FFN, activation="swiglu")
    with pytest.raises(libte.InvalidArgument) as e:  # fc1 must have 2 * ffn rows when gated
        gated.forward(x, gamma, beta, w1, b1, w2, b2)
    assert "args->fc1_weight" in str(e.value)
    y, bwd = m.forward(x, gamma, beta, w1, b1, w2, b2)
    with pytest.raises(libte.InvalidArgument) as e:
        bwd.backward(np.ones_like(y), dfc2_weight=np.empty((FFN, HIDDEN), np.float32))
    assert "te_layernorm_mlp_backward" in str(e.value) and "grads->dfc2_weight" in str(e.value)
    with libte.autocast(ctx):
        with pytest.raises(libte.Unsupported) as e:
            libte.LayerNormMLP(ctx, HIDDEN, 40).forward(
                x, gamma, beta, w1[:40].copy(), b1[:40].copy(), w2[:, :40].copy(), b2)
    assert "16" in str(e.value)
    with pytest.raises(libte.InvalidArgument, match="argument 'activation'"):
        libte.LayerNormMLP(ctx, HIDDEN, FFN, activation="tanh")
    with pytest.raises(libte.InvalidArgument) as e:
        libte.LayerNormMLP(ctx, HIDDEN, FFN, dtype="e4m3")
    assert "te_layernorm_mlp_create" in str(e.value) and "activation_dtype" in str(e.value)
