"""GroupedLinear against float64 references (one product per expert over its rows), bitwise
against one libte.Linear per expert, FP8 within a justified tolerance, repeatable backward, state
round trips, the Pythonic argument forms (lists, stacked arrays), and errors."""

import numpy as np
import pytest

import libte
from module_reference import assert_close, e5m2_exact, f64, rel_err

E, IN, OUT = 4, 64, 48


def params(rng, splits, dtype=np.float32):
    x = rng.uniform(-2, 2, (sum(splits), IN)).astype(dtype)
    ws = rng.uniform(-0.2, 0.2, (E, OUT, IN)).astype(dtype)
    bs = rng.uniform(-1, 1, (E, OUT)).astype(dtype)
    return x, ws, bs


def reference(x, splits, ws, bs, dy):
    """y, dx, dw[i], db[i] in float64, expert by expert."""
    x, dy = f64(x), f64(dy)
    y = np.zeros((x.shape[0], OUT))
    dx = np.zeros_like(x)
    dw, db = [], []
    start = 0
    for i, n in enumerate(splits):
        rows = slice(start, start + n)
        y[rows] = x[rows] @ f64(ws[i]).T + (f64(bs[i]) if bs is not None else 0.0)
        dx[rows] = dy[rows] @ f64(ws[i])
        dw.append(dy[rows].T @ x[rows])
        db.append(dy[rows].sum(0))
        start += n
    return y, dx, dw, db


def test_high_precision_matches_fp64(ctx, rng):
    splits = [10, 0, 37, 17]  # uneven, an empty expert, not multiples of 16
    m = libte.GroupedLinear(ctx, E, IN, OUT)
    x, ws, bs = params(rng, splits)
    dy = rng.uniform(-1, 1, (sum(splits), OUT)).astype(np.float32)
    y_ref, dx_ref, dw_ref, db_ref = reference(x, splits, ws, bs, dy)
    # Lists of arrays, a stacked [E, ...] array, and numpy integers all work.
    y, res = m.forward_compute(x, np.array(splits), list(ws), bs)
    assert not res.fp8 and y.shape == (sum(splits), OUT)
    assert_close(y, y_ref, 1e-5)  # fp32 sums of 64 terms
    bwd = m.forward_save(res)
    g = bwd.backward(dy)
    assert isinstance(g, libte.GroupedLinearGradients)
    assert_close(g.dx, dx_ref, 1e-5)
    assert len(g.dw) == len(g.db) == E
    for i in range(E):
        assert_close(g.dw[i], dw_ref[i], 1e-5) if splits[i] else \
            np.testing.assert_array_equal(g.dw[i], 0)
        assert_close(g.db[i], db_ref[i], 1e-5) if splits[i] else \
            np.testing.assert_array_equal(g.db[i], 0)
    g2 = bwd.backward(dy)
    assert g2.dx.tobytes() == g.dx.tobytes()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(g.dw + g.db, g2.dw + g2.db))


def test_leading_dimensions_and_no_bias(ctx, rng):
    splits = [8, 8, 0, 16]
    m = libte.GroupedLinear(ctx, E, IN, OUT, bias=False)
    x, ws, _ = params(rng, splits)
    y, bwd = m.forward(x.reshape(2, 16, IN), splits, ws)
    assert y.shape == (2, 16, OUT)
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    y_ref, dx_ref, dw_ref, _ = reference(x, splits, ws, None, dy.reshape(-1, OUT))
    assert_close(y.reshape(-1, OUT), y_ref, 1e-5)
    g = bwd.backward(dy)
    assert g.db is None and g.dx.shape == (2, 16, IN)
    assert_close(g.dx.reshape(-1, IN), dx_ref, 1e-5)


@pytest.mark.parametrize("kind", ["delayed", "current", "block"])
def test_fp8_equals_one_linear_per_expert(ctx, rng, kind):
    """Experts with multiples of 16 tokens are exactly te_linear's FP8 GEMMs: the same bytes
    as one Linear per expert over several steps (the empty expert sits them out)."""
    splits = [32, 0, 16, 48]
    recipe = libte.Recipe(kind=kind, amax_history_len=4) if kind == "delayed" else \
        libte.Recipe(kind=kind)
    m = libte.GroupedLinear(ctx, E, IN, OUT)
    linears = [libte.Linear(ctx, IN, OUT) for _ in range(E)]
    x, ws, bs = params(rng, splits)
    bounds = np.cumsum([0] + splits)
    for step in range(3):
        xs = x * (step + 1)
        dy = rng.uniform(-1, 1, (sum(splits), OUT)).astype(np.float32)
        with libte.autocast(ctx, recipe=recipe):
            y, bwd = m.forward(xs, splits, ws, bs)
        # One pass per Linear: a pass's backward scales are updated after the backward of its
        # first FP8 module, and the grouped module's experts all run before its update.
        per = []
        for i, lin in enumerate(linears):
            if not splits[i]:
                per.append(None)
                continue
            with libte.autocast(ctx, recipe=recipe):
                per.append(lin.forward(xs[bounds[i]:bounds[i + 1]], ws[i], bs[i]))
        g = bwd.backward(dy, once=True)
        for i, p in enumerate(per):
            if p is None:
                assert not g.dw[i].any() and not g.db[i].any()
                continue
            rows = slice(bounds[i], bounds[i + 1])
            assert y[rows].tobytes() == p[0].tobytes(), (step, i)
            dx, dw, db = p[1].backward(dy[rows], once=True)
            assert g.dx[rows].tobytes() == dx.tobytes()
            assert g.dw[i].tobytes() == dw.tobytes() and g.db[i].tobytes() == db.tobytes()
    for i in (0, 2, 3):
        for role in ("input", "weight", "grad_output"):
            a, b = m.scaling_state(role, i), linears[i].scaling_state(role)
            assert a[:4] == b[:4] and a.amax_history.tobytes() == b.amax_history.tobytes()
    assert m.scaling_state("input", 1).amax_history_len == 0  # never used


def test_fp8_uneven_splits_close_to_fp64(ctx, rng):
    """Experts padded to 16 rows inside the library. E4M3 operands (3 mantissa bits: 0.036 RMS
    relative each) give products near 0.05 relative (Frobenius): bound 0.08; the backward
    adds dy in E5M2 (0.072 RMS): bound 0.15."""
    splits = [5, 0, 40, 19]
    m = libte.GroupedLinear(ctx, E, IN, OUT)
    x, ws, bs = params(rng, splits)
    dy = rng.standard_normal((sum(splits), OUT)).astype(np.float32)
    y_ref, dx_ref, dw_ref, db_ref = reference(x, splits, ws, bs, dy)
    with libte.autocast(ctx, recipe=libte.Recipe(kind="current")):
        y, res = m.forward_compute(x, splits, ws, bs)
    assert res.fp8
    bwd = m.forward_save(res)
    bias_rows = np.repeat(bs, splits, axis=0)
    assert rel_err(y - bias_rows, y_ref - bias_rows) < 0.08
    g = bwd.backward(dy)
    assert rel_err(g.dx, dx_ref) < 0.15
    for i in (0, 2, 3):
        assert rel_err(g.dw[i], dw_ref[i]) < 0.15
        assert_close(g.db[i], db_ref[i], 1e-5)  # a plain fp32 sum of dy
    assert not g.dw[1].any() and not g.db[1].any()


def test_fp8_exact_dy_on_quantized_operands(ctx, rng):
    """With a fresh delayed-scaling state every scale is 1: x, W rounded to E4M3 and dy exactly
    representable in E5M2 make every GEMM exact up to fp32 accumulation."""
    import ml_dtypes
    splits = [16, 16, 0, 32]
    m = libte.GroupedLinear(ctx, E, IN, OUT)
    x, ws, bs = params(rng, splits)
    with libte.autocast(ctx, recipe=libte.Recipe(kind="delayed")):
        y, bwd = m.forward(x, splits, ws, bs)
    xq = f64(x.astype(ml_dtypes.float8_e4m3fn))
    wq = f64(ws.astype(ml_dtypes.float8_e4m3fn))
    dy = e5m2_exact(rng, (sum(splits), OUT))
    y_ref, dx_ref, dw_ref, db_ref = reference(xq, splits, wq, bs, dy)
    assert_close(y, y_ref, 1e-5)
    g = bwd.backward(dy)
    assert_close(g.dx, dx_ref, 1e-5)
    for i in (0, 1, 3):
        assert_close(g.dw[i], dw_ref[i], 1e-5)
        assert_close(g.db[i], db_ref[i], 1e-6)


def test_outputs_given_skipped_and_main_grads(ctx, rng):
    splits = [16, 0, 16, 16]
    m = libte.GroupedLinear(ctx, E, IN, OUT, fuse_wgrad_accumulation=True)
    x, ws, bs = params(rng, splits)
    y, bwd = m.forward(x, splits, ws, bs)
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    _, _, dw_ref, _ = reference(x, splits, ws, bs, dy)
    main = np.ones((E, OUT, IN), np.float32)
    g = bwd.backward(dy, dx=False, dw=main, db=False)  # a stacked array is taken row by row
    assert g.dx is None and g.db is None and len(g.dw) == E
    for i in range(E):
        assert_close(main[i], 1 + dw_ref[i], 1e-5)  # the empty expert: nothing added
    np.testing.assert_array_equal(main[1], 1)
    with pytest.raises(libte.InvalidArgument, match="main_grads"):
        bwd.backward(dy)
    with pytest.raises(libte.InvalidArgument, match=r"argument 'dw': expected num_gemms \(4\)"):
        bwd.backward(dy, dw=list(main[:3]))


def test_state_dict_round_trip(ctx, rng):
    splits = [16, 0, 32, 16]
    recipe = libte.Recipe(amax_history_len=4)
    a = libte.GroupedLinear(ctx, E, IN, OUT)
    x, ws, bs = params(rng, splits)
    for step in range(2):
        with libte.autocast(ctx, recipe=recipe):
            y, bwd = a.forward(x * (step + 1), splits, ws, bs)
        bwd.backward(np.ones_like(y), once=True)
    state = a.state_dict()
    fresh = libte.GroupedLinear(ctx, E, IN, OUT)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    for i in range(E):
        for role in ("input", "weight", "grad_output"):
            sa, sf = a.scaling_state(role, expert=i), fresh.scaling_state(role, expert=i)
            assert sa[:4] == sf[:4] and sa.amax_history.tobytes() == sf.amax_history.tobytes()
    with libte.autocast(ctx, recipe=recipe):
        ya, _ = a.forward(x, splits, ws, bs)
        yf, _ = fresh.forward(x, splits, ws, bs)
    assert ya.tobytes() == yf.tobytes()
    with pytest.raises(libte.InvalidArgument) as e:
        libte.GroupedLinear(ctx, E + 1, IN, OUT).load_state_dict(state)
    assert "te_grouped_linear_state_load" in str(e.value)


def test_errors_name_the_argument(ctx, rng):
    splits = [10, 0, 30, 24]
    m = libte.GroupedLinear(ctx, E, IN, OUT)
    x, ws, bs = params(rng, splits)

    def fails(cls, f, *texts):
        with pytest.raises(cls) as e:
            f()
        for t in texts:
            assert t in str(e.value), str(e.value)

    lib = "te_grouped_linear_forward"
    fails(libte.InvalidArgument, lambda: m.forward(x, [10, 0, 30, 25], ws, bs), lib,
          "args->m_splits")
    fails(libte.InvalidArgument, lambda: m.forward(x, [10, -1, 31, 24], ws, bs), lib,
          "args->m_splits[1]")
    bad = list(ws)
    bad[2] = ws[2][:, :32].copy()
    fails(libte.InvalidArgument, lambda: m.forward(x, splits, bad, bs), lib, "args->weights[2]")
    fails(libte.InvalidArgument, lambda: m.forward(x, splits, ws), lib, "args->biases")
    fails(libte.InvalidArgument, lambda: m.forward(x[:, :32].copy(), splits, ws, bs), lib,
          "args->input")
    y, bwd = m.forward(x, splits, ws, bs)
    dw = [np.empty((OUT, IN), np.float32) for _ in range(E)]
    dw[3] = np.empty((OUT, IN + 1), np.float32)
    fails(libte.InvalidArgument, lambda: bwd.backward(np.ones_like(y), dw=dw),
          "te_grouped_linear_backward", "dw[3]")
    fails(libte.InvalidArgument, lambda: bwd.backward(np.ones((63, OUT), np.float32)),
          "te_grouped_linear_backward", "dy")
    fails(libte.InvalidArgument, lambda: m.scaling_state("input", E),
          "te_grouped_linear_get_scaling_state", "expert")
    with libte.autocast(ctx):
        odd = libte.GroupedLinear(ctx, 2, 24, OUT)
        fails(libte.Unsupported, lambda: odd.forward(x[:, :24].copy(), [32, 32],
                                                      [w[:, :24].copy() for w in ws[:2]],
                                                      bs[:2]), "multiples of 16")
    # What only Python sees (lengths, Python types): its own messages, same classes.
    fails(libte.InvalidArgument, lambda: m.forward(x, [10, 54], ws, bs),
          "argument 'm_splits': expected num_gemms (4) counts, got 2")
    fails(libte.InvalidArgument, lambda: m.forward(x, [10, 0, 30, 24.0], ws, bs),
          "argument 'm_splits[3]'")
    fails(libte.InvalidArgument, lambda: m.forward(x, splits, ws[:3], bs),
          "argument 'weights': expected num_gemms (4)")
    fails(libte.InvalidArgument, lambda: m.forward(x, splits, ws[0], bs),
          "argument 'weights': expected num_gemms (4)")
    fails(libte.InvalidArgument, lambda: m.forward(x, splits, [None] * E, bs),
          "argument 'weights[0]'")
    fails(libte.InvalidArgument, lambda: libte.GroupedLinear(ctx, 2000, IN, OUT),
          "argument 'num_gemms'")
    fails(libte.InvalidArgument, lambda: m.scaling_state("input", 2 ** 40), "argument 'expert'")


def test_many_experts(ctx, rng):
    n = 1024  # TE_GROUPED_LINEAR_MAX_GEMMS
    m = libte.GroupedLinear(ctx, n, 16, 16, bias=False)
    x = rng.uniform(-1, 1, (n // 2, 16)).astype(np.float32)
    w = rng.uniform(-1, 1, (n, 16, 16)).astype(np.float32)
    splits = [1, 0] * (n // 2)
    y, bwd = m.forward(x, splits, w)
    np.testing.assert_allclose(y, np.einsum("ti,toi->to", x, w[0::2]), rtol=1e-5, atol=1e-5)
    g = bwd.backward(np.ones_like(y))
    assert len(g.dw) == n and not g.dw[1].any()
