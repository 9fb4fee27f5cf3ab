"""libte.Attention and RoPE against float64 references written from the formulas: BSHD and THD
layouts, the three masks, GQA, the repeatable backward, residuals in the caller's memory, FP8
(delayed scaling) within FP8 tolerance, state round trips and errors. Runs under both low-level
backends (scripts/test_python.sh runs the suite with LIBTE_BACKEND=ctypes, then swig)."""

import numpy as np
import pytest

import libte
from module_reference import assert_close, dequant64, f64, rel_err


def _has_attention():
    c = libte.Context("cpu")
    try:
        libte.Attention(c, 1, 8).close()
        return True
    except libte.Unsupported:
        return False
    finally:
        c.close()


pytestmark = pytest.mark.skipif(not _has_attention(),
                                reason="this libte.so (or SWIG module) has no te_attention_*")

MASKS = ("no_mask", "causal", "causal_bottom_right")


# ---- float64 references ------------------------------------------------------------------------

def visible(sq, skv, mask):
    """[sq, skv] bool: key j visible to query i."""
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    if mask == "causal":
        return j <= i
    if mask == "causal_bottom_right":
        return j <= i + skv - sq
    return np.ones((sq, skv), bool)


def attention_seq(q, k, v, do, mask, scale):
    """One sequence: q [sq, h, d], k, v [skv, hk, d], do like q -> o, lse [sq, h], dq, dk, dv
    (float64). A query that sees no key: o = 0, lse = -inf, no gradient."""
    q, k, v, do = f64(q), f64(k), f64(v), f64(do)
    sq, h, d = q.shape
    skv, hk = k.shape[:2]
    g = h // hk
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # head i reads kv head i // g
    s = np.einsum("ihd,jhd->hij", q, kk) * scale
    vis = np.broadcast_to(visible(sq, skv, mask)[None], s.shape)
    s = np.where(vis, s, -np.inf)
    any_vis = vis.any(-1, keepdims=True)
    m = np.where(any_vis, np.max(np.where(vis, s, -1e300), -1, keepdims=True), 0.0)
    e = np.where(vis, np.exp(s - m), 0.0)
    z = e.sum(-1, keepdims=True)
    p = np.where(any_vis, e / np.where(z > 0, z, 1.0), 0.0)
    lse = np.where(any_vis[..., 0], m[..., 0] + np.log(np.where(z[..., 0] > 0, z[..., 0], 1.0)),
                   -np.inf).T
    o = np.einsum("hij,jhd->ihd", p, vv)
    dp = np.einsum("ihd,jhd->hij", do, vv)
    D = np.einsum("ihd,ihd->hi", do, o)
    ds = p * (dp - D[..., None])
    dq = np.einsum("hij,jhd->ihd", ds, kk) * scale
    dkk = np.einsum("hij,ihd->jhd", ds, q) * scale
    dvv = np.einsum("hij,ihd->jhd", p, do)
    dk = dkk.reshape(skv, hk, g, d).sum(2)
    dv = dvv.reshape(skv, hk, g, d).sum(2)
    return o, lse, dq, dk, dv


def attention_bshd(q, k, v, do, mask, scale):
    outs = [attention_seq(q[b], k[b], v[b], do[b], mask, scale) for b in range(q.shape[0])]
    return tuple(np.stack(parts) for parts in zip(*outs))


def attention_thd(q, k, v, do, cu_q, cu_kv, mask, scale):
    o, dq = np.zeros(q.shape), np.zeros(q.shape)
    lse = np.full(q.shape[:2], -np.inf)
    dk, dv = np.zeros(k.shape), np.zeros(v.shape)
    for b in range(len(cu_q) - 1):
        a, e = cu_q[b], cu_q[b + 1]
        ka, ke = cu_kv[b], cu_kv[b + 1]
        if e == a:
            continue
        if ke == ka:  # no keys: nothing visible, o = 0
            continue
        ob, lb, dqb, dkb, dvb = attention_seq(q[a:e], k[ka:ke], v[ka:ke], do[a:e], mask, scale)
        o[a:e], lse[a:e], dq[a:e], dk[ka:ke], dv[ka:ke] = ob, lb, dqb, dkb, dvb
    return o, lse, dq, dk, dv


def rope_ref(x, freqs, rot_dim, interleaved, positions):
    """x [..., tokens, h, d] flattened to [tokens, h, d] with positions [tokens]."""
    x = f64(x)
    y = x.copy()
    half = rot_dim // 2
    ang = f64(freqs)[positions][:, None, :]  # [tokens, 1, half]
    c, s = np.cos(ang), np.sin(ang)
    if interleaved:
        x1, x2 = x[..., 0:rot_dim:2], x[..., 1:rot_dim:2]
        y[..., 0:rot_dim:2] = x1 * c - x2 * s
        y[..., 1:rot_dim:2] = x2 * c + x1 * s
    else:
        x1, x2 = x[..., :half], x[..., half:rot_dim]
        y[..., :half] = x1 * c - x2 * s
        y[..., half:rot_dim] = x2 * c + x1 * s
    return y


def data(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# ---- BSHD --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)])
def test_bshd_forward_backward_match_fp64(ctx, rng, mask, heads, kv_heads):
    b, sq, skv, d = 2, 24, 40, 16
    if mask == "causal":
        sq, skv = 40, 24  # top-left causal with more queries than keys
    m = libte.Attention(ctx, heads, d, num_kv_heads=kv_heads, mask=mask)
    assert m.mask == mask and m.num_kv_heads == kv_heads
    q, k, v = data(rng, (b, sq, heads, d)), data(rng, (b, skv, kv_heads, d)), \
        data(rng, (b, skv, kv_heads, d))
    do = data(rng, (b, sq, heads, d))
    o, res = m.forward_compute(q, k, v)
    assert o.shape == q.shape and o.dtype == np.float32 and not res.fp8
    ro, rlse, rdq, rdk, rdv = attention_bshd(q, k, v, do, mask, 1 / np.sqrt(d))
    assert_close(o, ro, 2e-5)
    lse = res.lse
    assert lse.shape == (b * sq, heads) and lse.dtype == np.float32
    rl = rlse.reshape(b * sq, heads)
    fin = np.isfinite(rl)
    assert_close(lse[fin], rl[fin], 2e-6)
    np.testing.assert_array_equal(res.o, o)
    np.testing.assert_array_equal(res.q, q)  # high precision: the caller's q, not a copy
    bwd = m.forward_save(res)
    g = bwd.backward(do)
    assert isinstance(g, libte.AttentionGradients)
    assert g.dq.shape == q.shape and g.dk.shape == k.shape and g.dv.shape == v.shape
    assert_close(g.dq, rdq, 1e-4)
    assert_close(g.dk, rdk, 1e-4)
    assert_close(g.dv, rdv, 1e-4)
    # Callable again: the same bytes.
    g2 = bwd.backward(do)
    for a, a2 in zip(g, g2):
        assert a.tobytes() == a2.tobytes()
    bwd.close()


def test_softmax_scale_and_forward_match_forward_compute(ctx, rng):
    m = libte.Attention(ctx, 2, 8, softmax_scale=0.5, mask="causal")
    assert m.softmax_scale == 0.5
    q, k, v = (data(rng, (1, 16, 2, 8)) for _ in range(3))
    do = data(rng, q.shape)
    o1, bwd1 = m.forward(q, k, v)
    o2, res = m.forward_compute(q, k, v)
    bwd2 = m.forward_save(res)
    assert res.closed
    assert o1.tobytes() == o2.tobytes()
    assert_close(o1, attention_bshd(q, k, v, do, "causal", 0.5)[0], 2e-5)
    for a, b in zip(bwd1.backward(do), bwd2.backward(do)):
        assert a.tobytes() == b.tobytes()
    with pytest.raises(libte.InvalidState):
        _ = bwd1.lse  # forward() hands back no residuals


def test_backward_once_and_skipped_and_given_outputs(ctx, rng):
    m = libte.Attention(ctx, 4, 16, num_kv_heads=2, mask="causal")
    q, k, v = data(rng, (1, 8, 4, 16)), data(rng, (1, 8, 2, 16)), data(rng, (1, 8, 2, 16))
    do = data(rng, q.shape)
    o, bwd = m.forward(q, k, v)
    full = bwd.backward(do)
    dk = np.full(k.shape, 7.0, np.float32)
    g = bwd.backward(do, dq=False, dk=dk, dv=False)
    assert g.dq is None and g.dv is None and g.dk is dk
    assert dk.tobytes() == full.dk.tobytes()  # written, not accumulated
    g = bwd.backward(do, once=True)
    assert g.dq.tobytes() == full.dq.tobytes()
    with pytest.raises(libte.InvalidState):
        bwd.backward(do)


def test_caller_memory_residuals_bitwise_equal_library_memory(ctx, rng):
    m = libte.Attention(ctx, 8, 16, num_kv_heads=2, mask="causal_bottom_right")
    q, k, v = data(rng, (2, 12, 8, 16)), data(rng, (2, 20, 2, 16)), data(rng, (2, 20, 2, 16))
    do = data(rng, q.shape)
    o_ref, bwd = m.forward(q, k, v)
    g_ref = bwd.backward(do)
    n = m.residuals_size(q, k, v)
    assert n >= 2 * 12 * 8 * 4  # the LSE at least
    block = np.zeros(n, np.uint8)
    o = m.forward_compute_into(q, k, v, block)
    assert o.tobytes() == o_ref.tobytes()
    assert block.any()
    g = m.backward_from(q, k, v, o, block, do)
    g2 = m.backward_from(q.copy(), k.copy(), v.copy(), o.copy(), block, do)  # inputs moved
    for a, b, c in zip(g_ref, g, g2):
        assert a.tobytes() == b.tobytes() == c.tobytes()
    with pytest.raises(libte.InvalidArgument, match="te_attention_forward_compute_into"):
        m.forward_compute_into(q, k, v, np.zeros(n - 16, np.uint8))


# ---- THD ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask", MASKS)
def test_thd_variable_lengths_match_fp64(ctx, rng, mask):
    heads, kv_heads, d = 8, 2, 16
    lens_q = [1, 17, 0, 33]
    lens_kv = [1, 17, 0, 33] if mask != "causal_bottom_right" else [5, 17, 0, 40]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_kv = np.concatenate([[0], np.cumsum(lens_kv)]).astype(np.int32)
    tq, tkv = int(cu_q[-1]), int(cu_kv[-1])
    q, k, v = data(rng, (tq, heads, d)), data(rng, (tkv, kv_heads, d)), \
        data(rng, (tkv, kv_heads, d))
    do = data(rng, q.shape)
    m = libte.Attention(ctx, heads, d, num_kv_heads=kv_heads, mask=mask)
    o, res = m.forward_compute(q, k, v, cu_q, cu_kv)  # max_seqlen read from the host offsets
    ro, rlse, rdq, rdk, rdv = attention_thd(q, k, v, do, cu_q, cu_kv, mask, 1 / np.sqrt(d))
    assert_close(o, ro, 2e-5)
    fin = np.isfinite(rlse)
    assert_close(res.lse[fin], rlse[fin], 2e-6)
    bwd = m.forward_save(res)
    g = bwd.backward(do)
    assert_close(g.dq, rdq, 1e-4)
    assert_close(g.dk, rdk, 1e-4)
    assert_close(g.dv, rdv, 1e-4)
    g2 = bwd.backward(do)
    for a, a2 in zip(g, g2):
        assert a.tobytes() == a2.tobytes()
    # Explicit max_seqlen, and THD equals BSHD per sequence.
    o2, _ = m.forward(q, k, v, cu_q, cu_kv, max_seqlen_q=max(lens_q), max_seqlen_kv=max(lens_kv))
    assert o2.tobytes() == o.tobytes()
    a, e, ka, ke = cu_q[1], cu_q[2], cu_kv[1], cu_kv[2]
    ob, _ = m.forward(q[None, a:e].copy(), k[None, ka:ke].copy(), v[None, ka:ke].copy())
    assert_close(ob[0], o[a:e], 1e-6)


def test_thd_bad_offsets_raise(ctx, rng):
    m = libte.Attention(ctx, 2, 8)
    q = data(rng, (10, 2, 8))
    with pytest.raises(libte.InvalidArgument, match="te_attention_forward"):
        m.forward(q, q, q, np.array([0, 6, 4, 10], np.int32), np.array([0, 6, 4, 10], np.int32),
                  max_seqlen_q=10, max_seqlen_kv=10)  # decreasing
    with pytest.raises(libte.InvalidArgument, match="te_attention_forward"):
        m.forward(q, q, q, np.array([0, 4, 9], np.int32), np.array([0, 4, 9], np.int32))
    with pytest.raises(libte.InvalidArgument, match="cu_seqlens_q.*int32"):
        m.forward(q, q, q, np.array([0, 4, 10], np.int64), np.array([0, 4, 10], np.int32))
    with pytest.raises(libte.InvalidArgument, match="te_attention_forward"):
        m.forward(q, q, q, np.array([0, 4, 10], np.int32), None, max_seqlen_q=6)


# ---- errors, state -------------------------------------------------------------------------------

def test_bad_inputs_raise_with_the_function_name(ctx, rng):
    with pytest.raises(libte.InvalidArgument, match="te_attention_create"):
        libte.Attention(ctx, 4, 12)  # head_dim not a multiple of 8
    with pytest.raises(libte.InvalidArgument, match="te_attention_create"):
        libte.Attention(ctx, 4, 16, num_kv_heads=3)
    with pytest.raises(libte.InvalidArgument, match="argument 'mask'"):
        libte.Attention(ctx, 4, 16, mask="padding")
    m = libte.Attention(ctx, 4, 16, num_kv_heads=2)
    q, kv = data(rng, (1, 8, 4, 16)), data(rng, (1, 8, 2, 16))
    with pytest.raises(libte.InvalidArgument, match="te_attention_forward.*'?k"):
        m.forward(q, data(rng, (1, 8, 4, 16)), kv)  # k with the query's head count
    with pytest.raises(libte.InvalidArgument, match="te_attention_forward"):
        m.forward(q, kv, kv.astype(np.float16))
    with pytest.raises(libte.InvalidArgument, match="te_attention_forward"):
        m.forward(q, data(rng, (2, 8, 2, 16)), data(rng, (2, 8, 2, 16)))  # batch differs
    with pytest.raises(libte.InvalidArgument, match="argument 'q'"):
        m.forward(q.astype(np.float64), kv, kv)
    o, bwd = m.forward(q, kv, kv)
    with pytest.raises(libte.InvalidArgument, match="te_attention_backward"):
        bwd.backward(data(rng, (1, 8, 4, 8)))
    with pytest.raises(libte.InvalidArgument, match="argument 'which'"):
        m.scaling_state("x")
    with pytest.raises(libte.InvalidArgument, match="expected bytes"):
        m.load_state_dict("no")


def test_fp8_delayed_within_fp8_tolerance_and_state_round_trip(ctx, rng):
    heads, kv_heads, d = 4, 2, 32
    m = libte.Attention(ctx, heads, d, num_kv_heads=kv_heads, mask="causal", fp8=True)
    q, k, v = data(rng, (2, 32, heads, d)), data(rng, (2, 32, kv_heads, d)), \
        data(rng, (2, 32, kv_heads, d))
    do = data(rng, q.shape)
    recipe = libte.Recipe(kind="delayed", amax_history_len=4)
    ro, _, rdq, rdk, rdv = attention_bshd(q, k, v, do, "causal", 1 / np.sqrt(d))
    for step in range(3):
        with libte.autocast(ctx, recipe=recipe):
            o, res = m.forward_compute(q, k, v)
            assert res.fp8
            rq = res.q
            assert isinstance(rq, libte.Float8Tensor) and rq.dtype_name == "float8_e4m3fn"
            bwd = m.forward_save(res)
            g = bwd.backward(do)
        # E4M3 Q, K, V and P (3 mantissa bits): a few percent, once the delayed scales have
        # a history (step 0 quantizes with scale 1).
        tol = 0.08 if step else 0.2
        assert rel_err(o, ro) < tol, step
        assert rel_err(g.dq, rdq) < 2 * tol and rel_err(g.dk, rdk) < 2 * tol and \
            rel_err(g.dv, rdv) < 2 * tol, step
        bwd.close()
    st = m.scaling_state("q")
    assert st.amax_history_len == 4 and st.scale > 0
    assert np.max(st.amax_history) == pytest.approx(np.abs(q).max(), rel=1e-6)
    assert m.scaling_state("do").fp8_dtype == "float8_e5m2"  # HYBRID: E5M2 gradients
    for which in ("k", "v", "s", "dp"):
        m.scaling_state(which)
    blob = m.state_dict()
    m2 = libte.Attention(ctx, heads, d, num_kv_heads=kv_heads, mask="causal", fp8=True)
    m2.load_state_dict(blob)
    assert m2.state_dict() == blob
    with libte.autocast(ctx, recipe=recipe):
        o1, _ = m.forward(q, k, v)
        o2, _ = m2.forward(q, k, v)
    assert o1.tobytes() == o2.tobytes()
    # Without autocast (or fp8=False) the same layer runs in high precision.
    o_hp, res = m.forward_compute(q, k, v)
    assert not res.fp8
    assert_close(o_hp, ro, 2e-5)


def test_fp8_current_scaling_within_fp8_tolerance(ctx, rng):
    m = libte.Attention(ctx, 8, 32, num_kv_heads=2, mask="causal_bottom_right", fp8=True)
    q, k, v = data(rng, (2, 24, 8, 32)), data(rng, (2, 40, 2, 32)), data(rng, (2, 40, 2, 32))
    do = data(rng, q.shape)
    ro, _, rdq, rdk, rdv = attention_bshd(q, k, v, do, "causal_bottom_right", 1 / np.sqrt(32))
    with libte.autocast(ctx, recipe=libte.Recipe(kind="current")):
        o, bwd = m.forward(q, k, v)
        g = bwd.backward(do)
        g2 = bwd.backward(do)
    assert rel_err(o, ro) < 0.08
    for a, r in zip(g, (rdq, rdk, rdv)):
        assert rel_err(a, r) < 0.16
    for a, a2 in zip(g, g2):
        assert a.tobytes() == a2.tobytes()


def test_fp8_under_block_scaling_is_unsupported(ctx, rng):
    m = libte.Attention(ctx, 2, 16, fp8=True)
    q = data(rng, (1, 8, 2, 16))
    with libte.autocast(ctx, recipe=libte.Recipe(kind="block")):
        with pytest.raises(libte.Unsupported, match="te_attention"):
            m.forward(q, q, q)


def test_bfloat16_close_to_fp64(ctx, rng):
    ml = pytest.importorskip("ml_dtypes")
    m = libte.Attention(ctx, 4, 16, mask="causal", dtype="bfloat16")
    q, k, v = (data(rng, (1, 32, 4, 16)).astype(ml.bfloat16) for _ in range(3))
    do = data(rng, q.shape).astype(ml.bfloat16)
    o, bwd = m.forward(q, k, v)
    g = bwd.backward(do)
    assert o.dtype == ml.bfloat16 and g.dq.dtype == ml.bfloat16
    ro, _, rdq, rdk, rdv = attention_bshd(q, k, v, do, "causal", 0.25)
    assert rel_err(o, ro) < 1e-2
    for a, r in zip(g, (rdq, rdk, rdv)):
        assert rel_err(a, r) < 2e-2


# ---- RoPE --------------------------------------------------------------------------------------

def angles(positions, half, base=10000.0):
    inv = 1.0 / base ** (np.arange(half) / half)
    return (np.arange(positions)[:, None] * inv[None, :]).astype(np.float32)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rot_dim", [16, 8])
def test_rope_bshd_matches_numpy_and_round_trips(ctx, rng, interleaved, rot_dim):
    b, s, h, d = 2, 12, 3, 16
    x = data(rng, (b, s, h, d))
    freqs = angles(20, rot_dim // 2)
    y = libte.rope_forward(ctx, x, freqs, interleaved=interleaved)
    pos = np.tile(np.arange(s), b)
    ref = rope_ref(x.reshape(b * s, h, d), freqs, rot_dim, interleaved, pos).reshape(x.shape)
    assert_close(y, ref, 1e-6)
    np.testing.assert_array_equal(y[..., rot_dim:], x[..., rot_dim:])  # copied
    back = libte.rope_backward(ctx, y, freqs, interleaved=interleaved)
    assert_close(back, x, 1e-6)
    # The backward is the inverse rotation: <dy, R x> = <R^T dy, x>.
    dy = data(rng, x.shape)
    dx = libte.rope_backward(ctx, dy, freqs, interleaved=interleaved)
    assert np.isclose(np.vdot(f64(dy), f64(y)), np.vdot(f64(dx), f64(x)), rtol=1e-5)
    # In place.
    z = x.copy()
    libte.rope_forward(ctx, z, freqs, interleaved=interleaved, out=z)
    assert z.tobytes() == y.tobytes()


def test_rope_thd_positions_restart_per_sequence(ctx, rng):
    lens = [1, 17, 0, 33]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    x = data(rng, (int(cu[-1]), 4, 32))
    freqs = angles(40, 8)  # rot_dim 16 of 32
    y = libte.rope_forward(ctx, x, freqs, cu)
    pos = np.concatenate([np.arange(n) for n in lens])
    assert_close(y, rope_ref(x, freqs, 16, False, pos), 1e-6)
    assert_close(libte.rope_backward(ctx, y, freqs, cu), x, 1e-6)


def test_rope_errors(ctx, rng):
    x = data(rng, (1, 8, 2, 16))
    with pytest.raises(libte.InvalidArgument, match="te_rope_forward"):
        libte.rope_forward(ctx, x, angles(4, 8))  # positions beyond freqs
    with pytest.raises(libte.InvalidArgument, match="te_rope_forward"):
        libte.rope_forward(ctx, x, angles(8, 12))  # rot_dim 24 > head_dim 16
    with pytest.raises(libte.InvalidArgument, match="te_rope_backward"):
        libte.rope_backward(ctx, x, angles(8, 8).astype(np.float16))
    with pytest.raises(libte.InvalidArgument, match="cu_seqlens.*int32"):
        libte.rope_forward(ctx, x[0], angles(8, 8), np.array([0, 8], np.float32))


def test_dlpack_inputs_and_int32_offsets(ctx, rng):
    """Tensors of another framework through DLPack, int32 offsets included (kDLInt 32 ->
    TE_DTYPE_I32): the same bytes as NumPy's."""
    torch = pytest.importorskip("torch")
    m = libte.Attention(ctx, 4, 16, num_kv_heads=2, mask="causal")
    q, k = data(rng, (10, 4, 16)), data(rng, (10, 2, 16))
    cu = np.array([0, 3, 10], np.int32)
    o_np, _ = m.forward(q, k, k, cu, cu)
    o = torch.empty(q.shape)
    m.forward(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(k),
              torch.from_numpy(cu), torch.from_numpy(cu), max_seqlen_q=7, max_seqlen_kv=7, out=o)
    assert o.numpy().tobytes() == o_np.tobytes()
    with pytest.raises(libte.InvalidArgument, match="cu_seqlens_kv.*int32"):
        m.forward(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(k),
                  torch.from_numpy(cu), torch.from_numpy(cu).long(), max_seqlen_q=7,
                  max_seqlen_kv=7, out=o)
