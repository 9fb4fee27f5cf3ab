"""The training-step ops (te_add, te_split_columns, te_concat_columns, te_embedding_*,
te_cross_entropy, te_adamw_step) against NumPy fp64 references, on the low-level backend the run
selected (scripts/test_python.sh runs the suite with LIBTE_BACKEND=ctypes, then swig). Bad input
raises the library's exception class carrying te_last_error()'s text, and changes nothing."""

import numpy as np
import pytest

import libte
from libte import _constants as C
from libte import _lowlevel_ctypes

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

# The low-level functions this file's C calls go through: both backends must have them.
LOW_LEVEL = ("add", "split_columns", "concat_columns", "embedding_forward", "embedding_backward",
             "cross_entropy_defaults", "cross_entropy", "adamw_defaults", "adamw_param_defaults",
             "adamw_step", "checkpoint_create", "checkpoint_destroy", "checkpoint_put_tensor",
             "checkpoint_put_bytes", "checkpoint_get_tensor", "checkpoint_get_bytes",
             "checkpoint_count", "checkpoint_name", "checkpoint_write", "checkpoint_read",
             "checkpoint_serialize", "checkpoint_deserialize")


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def library_error(excinfo, function):
    """The exception carries te_last_error()'s text, which names the C function."""
    e = excinfo.value
    assert e.message == libte.last_error(), (e.message, libte.last_error())
    assert e.message.startswith(function + ":"), e.message
    return e.message


# ---- both backends ------------------------------------------------------------------------------

def _swig():
    try:
        from libte import _lowlevel_swig
    except ImportError:
        pytest.skip("SWIG extension not built")
    return _lowlevel_swig


def test_both_backends_expose_the_new_calls():
    swig = _swig()
    for name in LOW_LEVEL:
        assert callable(getattr(_lowlevel_ctypes, name, None)), ("ctypes", name)
        assert callable(getattr(swig, name, None)), ("swig", name)
    for struct in ("te_cross_entropy_options", "te_adamw_param", "te_adamw_options"):
        assert _lowlevel_ctypes.SIZEOF[struct] == swig.SIZEOF[struct] > 0, struct
    # size_t, then the fields in te.h's order with C's padding.
    assert _lowlevel_ctypes.SIZEOF["te_cross_entropy_options"] == 16
    assert _lowlevel_ctypes.SIZEOF["te_adamw_param"] == 72
    assert _lowlevel_ctypes.SIZEOF["te_adamw_options"] == 56


def test_both_backends_compute_the_same_bytes(rng):
    """The same calls through each backend's low-level layer directly: identical outputs and
    identical errors."""
    swig = _swig()
    logits, a = f32(rng, 6, 10), f32(rng, 6, 10)
    targets = np.array([1, 9, -100, 0, 4, 4], np.int32)
    d = lambda x: (x.ctypes.data, C.DTYPE_I32 if x.dtype == np.int32 else C.DTYPE_F32, x.shape,
                   C.DEVICE_CPU, 0, 0, C.SCALING_PER_TENSOR)
    results = []
    for ll in (_lowlevel_ctypes, swig):
        ctx = ll.context_create((C.DEVICE_CPU, 0))
        y, loss, dl = np.empty_like(a), np.empty(1, np.float32), np.empty_like(logits)
        q, kv = np.empty((6, 4), np.float32), np.empty((6, 6), np.float32)
        ll.add(ctx, d(a), d(logits), d(y))
        ll.cross_entropy(ctx, -100, 0.5, d(logits), d(targets), d(loss), d(dl))
        ll.split_columns(ctx, d(y), [d(q), d(kv)])
        emb = np.empty((6, 10), np.float32)
        ll.embedding_forward(ctx, d(logits), d(np.array([5, 0, 1, 1, 2, 3], np.int32)), d(emb))
        with pytest.raises(libte.InvalidArgument) as e:
            ll.concat_columns(ctx, [d(q), d(q)], d(y))  # 4 + 4 != 10 columns
        results.append((y.tobytes(), loss.tobytes(), dl.tobytes(), q.tobytes(), kv.tobytes(),
                        emb.tobytes(), type(e.value), e.value.message))
        ll.context_destroy(ctx)
    assert results[0] == results[1]


# ---- te_add -------------------------------------------------------------------------------------

def test_add_matches_fp64(ctx, rng):
    a, b = f32(rng, 3, 5, 7), f32(rng, 3, 5, 7)
    y = libte.add(ctx, a, b)
    # fp32 addition is correctly rounded: the fp64 sum (exact here) rounded once to fp32.
    np.testing.assert_array_equal(y, (a.astype(np.float64) + b).astype(np.float32))
    out = np.full_like(a, np.nan)
    assert libte.add(ctx, a, b, out) is out
    np.testing.assert_array_equal(out, y)


def test_add_in_place_and_half_precision(ctx, rng):
    a, b = f32(rng, 4, 9), f32(rng, 4, 9)
    ref = (a.astype(np.float64) + b).astype(np.float32)
    libte.add(ctx, a, b, out=a)
    np.testing.assert_array_equal(a, ref)
    for dtype in (BF16, np.dtype(np.float16)):
        x, z = f32(rng, 8, 16).astype(dtype), f32(rng, 8, 16).astype(dtype)
        y = libte.add(ctx, x, z)
        assert y.dtype == dtype
        # fp32 arithmetic, rounded once to the dtype (the fp32 sum of two halves is exact).
        ref = (x.astype(np.float32) + z.astype(np.float32)).astype(dtype)
        np.testing.assert_array_equal(y.view(np.uint16), ref.view(np.uint16))


def test_add_errors(ctx, rng):
    a = f32(rng, 2, 3)
    before = a.copy()
    with pytest.raises(libte.InvalidArgument) as e:
        libte.add(ctx, a, f32(rng, 3, 2), out=a)
    assert "te_add" in library_error(e, "te_add")
    np.testing.assert_array_equal(a, before)  # nothing written
    with pytest.raises(libte.InvalidArgument) as e:
        libte.add(ctx, a, a.astype(np.float16))
    library_error(e, "te_add")
    with pytest.raises(libte.InvalidArgument, match="argument 'b'"):
        libte.add(ctx, a, np.zeros((2, 3), np.int32))  # the binding's own check
    with pytest.raises(libte.InvalidArgument, match="argument 'ctx'"):
        libte.add(None, a, a)


# ---- te_split_columns / te_concat_columns -------------------------------------------------------

def test_split_and_concat_are_exact_inverses(ctx, rng):
    x = f32(rng, 2, 3, 10)
    parts = libte.split_columns(ctx, x, [3, 5, 2])
    for got, ref in zip(parts, np.split(x, [3, 8], axis=-1)):
        assert got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)
    y = libte.concat_columns(ctx, parts)
    np.testing.assert_array_equal(y, x)
    # Outputs of any shape of rows * c_i elements whose last dimension is c_i.
    q, kv = np.empty((6, 4), np.float32), np.empty((3, 2, 6), np.float32)
    assert libte.split_columns(ctx, x, out=[q, kv]) == [q, kv]
    np.testing.assert_array_equal(q, x.reshape(6, 10)[:, :4])
    np.testing.assert_array_equal(kv.reshape(6, 6), x.reshape(6, 10)[:, 4:])
    out = np.empty((6, 10), np.float32)
    libte.concat_columns(ctx, [q, kv], out=out)
    np.testing.assert_array_equal(out, x.reshape(6, 10))


def test_split_and_concat_any_dtype(ctx, rng):
    ids = rng.integers(-2**31, 2**31 - 1, size=(5, 7), dtype=np.int32)
    a, b = libte.split_columns(ctx, ids, [6, 1])
    assert a.dtype == np.int32
    np.testing.assert_array_equal(libte.concat_columns(ctx, [b, a]),
                                  np.concatenate([ids[:, 6:], ids[:, :6]], axis=1))
    h = f32(rng, 4, 6).astype(BF16)
    parts = libte.split_columns(ctx, h, [2, 2, 2])
    assert all(p.dtype == BF16 for p in parts)
    assert libte.concat_columns(ctx, parts).tobytes() == h.tobytes()
    # FP8: the codes move, bit for bit; scale_inv is not touched (new outputs get a copy).
    codes = rng.integers(0, 256, size=(3, 8), dtype=np.uint8)
    x8 = libte.Float8Tensor(codes, np.array([0.25], np.float32), "e4m3")
    p8 = libte.split_columns(ctx, x8, [5, 3])
    assert [p.shape for p in p8] == [(3, 5), (3, 3)]
    assert p8[0].numpy_codes().view(np.uint8).tolist() == codes[:, :5].tolist()
    assert p8[1].scale_inv[0] == np.float32(0.25)
    y8 = libte.concat_columns(ctx, p8)
    assert y8.numpy_codes().view(np.uint8).tobytes() == codes.tobytes()


def test_split_concat_errors(ctx, rng):
    x = f32(rng, 4, 10)
    q, k = np.full((4, 4), 7, np.float32), np.full((4, 5), 7, np.float32)
    with pytest.raises(libte.InvalidArgument) as e:
        libte.split_columns(ctx, x, out=[q, k])  # 9 != 10 columns
    library_error(e, "te_split_columns")
    assert (q == 7).all() and (k == 7).all()
    with pytest.raises(libte.InvalidArgument) as e:
        libte.split_columns(ctx, f32(rng, 2, 65), [1] * 65)  # n > 64
    library_error(e, "te_split_columns")
    with pytest.raises(libte.InvalidArgument) as e:
        libte.concat_columns(ctx, [x, x.astype(np.float16)], out=np.empty((4, 20), np.float32))
    library_error(e, "te_concat_columns")
    with pytest.raises(libte.InvalidArgument) as e:
        libte.split_columns(ctx, x, out=[x[:, :5].copy(), x])  # an output overlapping x
    library_error(e, "te_split_columns")
    with pytest.raises(libte.InvalidArgument, match="'sizes'"):
        libte.split_columns(ctx, x, [4, 6], out=[q, k])  # sizes differ from the outputs
    with pytest.raises(libte.InvalidArgument, match="'parts'"):
        libte.concat_columns(ctx, [])


# ---- te_embedding_forward / backward ------------------------------------------------------------

def test_embedding_forward_is_a_gather(ctx, rng):
    table = f32(rng, 11, 6)
    ids = rng.integers(0, 11, size=(3, 5), dtype=np.int32)
    y = libte.embedding_forward(ctx, table, ids)
    assert y.shape == (3, 5, 6)
    np.testing.assert_array_equal(y, table[ids])
    tb = table.astype(BF16)
    out = np.empty((15, 6), BF16)
    libte.embedding_forward(ctx, tb, ids, out=out)
    assert out.tobytes() == tb[ids.ravel()].tobytes()


def test_embedding_backward_scatter_adds_in_token_order(ctx, rng):
    vocab, dim = 7, 5
    ids = rng.integers(0, vocab, size=(4, 6), dtype=np.int32)
    ids[0, :4] = 3  # a row hit several times
    dy = f32(rng, 4, 6, dim)
    dtable = np.full((vocab, dim), np.nan, np.float32)
    assert libte.embedding_backward(ctx, ids, dy, dtable) is dtable
    # te.h: each row sums its tokens in increasing t, in fp32 -> exactly this sequential sum.
    seq = np.zeros((vocab, dim), np.float32)
    for t, i in enumerate(ids.ravel()):
        seq[i] = seq[i] + dy.reshape(-1, dim)[t]
    np.testing.assert_array_equal(dtable, seq)
    ref = np.zeros((vocab, dim))
    np.add.at(ref, ids.ravel(), dy.reshape(-1, dim).astype(np.float64))
    np.testing.assert_allclose(dtable, ref, rtol=1e-5, atol=1e-6)
    # accumulate=True adds to what is there (a tied LM head's dW).
    prior = f32(rng, vocab, dim)
    acc = prior.copy()
    libte.embedding_backward(ctx, ids, dy.astype(BF16), acc, accumulate=True)
    ref_b = np.zeros((vocab, dim))
    np.add.at(ref_b, ids.ravel(), dy.astype(BF16).astype(np.float64).reshape(-1, dim))
    np.testing.assert_allclose(acc, prior + ref_b, rtol=1e-5, atol=1e-5)


def test_embedding_errors(ctx, rng):
    table = f32(rng, 4, 3)
    ids = np.array([0, 4, 1], np.int32)  # 4 is out of range
    out = np.full((3, 3), 9, np.float32)
    with pytest.raises(libte.InvalidArgument) as e:
        libte.embedding_forward(ctx, table, ids, out=out)
    library_error(e, "te_embedding_forward")
    assert (out == 9).all()  # nothing written
    dtable = np.full((4, 3), 9, np.float32)
    with pytest.raises(libte.InvalidArgument) as e:
        libte.embedding_backward(ctx, ids, f32(rng, 3, 3), dtable)
    library_error(e, "te_embedding_backward")
    assert (dtable == 9).all()
    with pytest.raises(libte.InvalidArgument) as e:
        libte.embedding_backward(ctx, np.array([0, 1], np.int32), f32(rng, 2, 3),
                                 dtable.astype(np.float16))  # dtable must be F32
    library_error(e, "te_embedding_backward")
    with pytest.raises(libte.InvalidArgument, match="'ids'.*int32.*token ids"):
        libte.embedding_forward(ctx, table, ids.astype(np.int64))


# ---- te_cross_entropy ---------------------------------------------------------------------------

def ce_reference(logits, targets, ignore_index=-100, grad_scale=1.0):
    """fp64 mean cross-entropy over the non-ignored rows and its gradient."""
    x = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    t = targets.ravel()
    keep = t != ignore_index
    count = int(keep.sum())
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    p = np.exp(x - lse[:, None])
    rows = np.arange(len(t))
    safe = np.where(keep, t, 0)
    loss = float(((lse - x[rows, safe]) * keep).sum() / count) if count else 0.0
    grad = p.copy()
    grad[rows, safe] -= 1.0
    grad *= keep[:, None] * (grad_scale / count if count else 0.0)
    return loss, grad.reshape(logits.shape)


def test_cross_entropy_matches_fp64(ctx, rng):
    logits = f32(rng, 3, 4, 50, scale=4.0)
    targets = rng.integers(0, 50, size=(3, 4), dtype=np.int32)
    targets[1, 2] = targets[2, 0] = -100
    loss, dlogits = libte.cross_entropy(ctx, logits, targets, dlogits=True)
    ref_loss, ref_grad = ce_reference(logits, targets)
    assert loss.shape == (1,) and loss.dtype == np.float32
    np.testing.assert_allclose(loss[0], ref_loss, rtol=1e-6)
    np.testing.assert_allclose(dlogits, ref_grad, rtol=1e-5, atol=1e-7)
    assert not dlogits[1, 2].any() and not dlogits[2, 0].any()  # ignored rows are zero


def test_cross_entropy_options_in_place_and_loss_only(ctx, rng):
    logits = f32(rng, 16, 33, scale=3.0)
    targets = rng.integers(0, 33, size=16, dtype=np.int32)
    targets[::5] = 7
    ref_loss, ref_grad = ce_reference(logits, targets, ignore_index=7, grad_scale=0.25)
    loss = np.full(1, np.nan, np.float32)
    only, none = libte.cross_entropy(ctx, logits, targets, loss, ignore_index=7)
    assert only is loss and none is None
    np.testing.assert_allclose(loss[0], ref_loss, rtol=1e-6)
    work = logits.copy()
    libte.cross_entropy(ctx, work, targets, loss, dlogits=work, ignore_index=7, grad_scale=0.25)
    np.testing.assert_allclose(loss[0], ref_loss, rtol=1e-6)
    np.testing.assert_allclose(work, ref_grad, rtol=1e-5, atol=1e-7)
    # Stable for large logits (the row max is subtracted).
    big, _ = libte.cross_entropy(ctx, logits + 1e4, targets, ignore_index=7)
    np.testing.assert_allclose(big[0], ref_loss, rtol=1e-3)
    # count = 0: loss 0 and zero gradients.
    zl, zg = libte.cross_entropy(ctx, logits, np.full(16, -100, np.int32), dlogits=True)
    assert zl[0] == 0.0 and not zg.any()


def test_cross_entropy_half_precision(ctx, rng):
    logits = f32(rng, 8, 40, scale=2.0).astype(BF16)
    targets = rng.integers(0, 40, size=8, dtype=np.int32)
    loss, d = libte.cross_entropy(ctx, logits, targets, dlogits=True)
    ref_loss, ref_grad = ce_reference(logits, targets)
    assert d.dtype == BF16
    np.testing.assert_allclose(loss[0], ref_loss, rtol=1e-5)  # fp32 math on bf16 inputs
    np.testing.assert_allclose(d.astype(np.float64), ref_grad, rtol=1e-2, atol=1e-4)


def test_cross_entropy_errors(ctx, rng):
    logits = f32(rng, 4, 10)
    loss = np.full(1, 5, np.float32)
    d = np.full_like(logits, 5)
    with pytest.raises(libte.InvalidArgument) as e:  # target 10 outside [0, 10)
        libte.cross_entropy(ctx, logits, np.array([0, 1, 10, 2], np.int32), loss, d)
    library_error(e, "te_cross_entropy")
    assert loss[0] == 5 and (d == 5).all()
    with pytest.raises(libte.InvalidArgument) as e:  # 3 targets for 4 rows
        libte.cross_entropy(ctx, logits, np.array([0, 1, 2], np.int32), loss)
    library_error(e, "te_cross_entropy")
    with pytest.raises(libte.InvalidArgument) as e:  # dlogits of another shape
        libte.cross_entropy(ctx, logits, np.zeros(4, np.int32), loss, np.zeros((4, 9), np.float32))
    library_error(e, "te_cross_entropy")
    with pytest.raises(libte.InvalidArgument, match="'targets'.*int32"):
        libte.cross_entropy(ctx, logits, np.zeros(4, np.float32), loss)
    with pytest.raises(libte.InvalidArgument, match="'loss_out'"):
        libte.cross_entropy(ctx, logits, np.zeros(4, np.int32), np.zeros(1, np.float16))


# ---- te_adamw_step ------------------------------------------------------------------------------

def adamw_reference(p, g, m, v, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.01,
                    decay=True, clip=1.0):
    """torch.optim.AdamW's update in fp64 (te.h's formulas)."""
    p, g, m, v = (np.asarray(a, np.float64) for a in (p, g, m, v))
    g = g * clip
    if decay:
        p = p - lr * wd * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - lr * (m / (1 - beta1 ** step)) / (np.sqrt(v / (1 - beta2 ** step)) + eps)
    return p, m, v


def test_adamw_matches_fp64_over_steps(ctx, rng):
    w, b = f32(rng, 6, 5), f32(rng, 6)
    opt = libte.AdamW(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    pw = opt.add_param(w, np.zeros_like(w))
    pb = opt.add_param(b, np.zeros_like(b), weight_decay=False)
    ref = {"w": (w.astype(np.float64), 0.0, 0.0), "b": (b.astype(np.float64), 0.0, 0.0)}
    for step in range(1, 5):
        gw, gb = f32(rng, 6, 5), f32(rng, 6)
        pw.grad[...] = gw
        pb.grad[...] = gb
        opt.step(ctx, step)
        for key, g, decay in (("w", gw, True), ("b", gb, False)):
            ref[key] = adamw_reference(*ref[key][:1], g, *ref[key][1:], step, lr=0.01, beta1=0.8,
                                       beta2=0.99, eps=1e-6, wd=0.1, decay=decay)
    for entry, key in ((pw, "w"), (pb, "b")):
        p, m, v = ref[key]
        np.testing.assert_allclose(entry.param, p, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(entry.exp_avg, m, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(entry.exp_avg_sq, v, rtol=1e-5, atol=1e-9)


def test_adamw_model_weight_lr_override_and_grad_norm(ctx, rng):
    w = f32(rng, 4, 8)
    g = f32(rng, 4, 8).astype(BF16)
    mw = np.empty((4, 8), BF16)
    opt = libte.AdamW(lr=0.5)
    opt.add_param(w, g, model_weight=mw)
    w0 = w.copy()
    norm = opt.step(ctx, 1, lr=0.05, grad_norm=True)
    np.testing.assert_allclose(norm, np.sqrt((g.astype(np.float64) ** 2).sum()), rtol=1e-5)
    p, _, _ = adamw_reference(w0, g.astype(np.float64), 0.0, 0.0, 1, lr=0.05)
    np.testing.assert_allclose(w, p, rtol=1e-5, atol=1e-6)
    assert mw.tobytes() == w.astype(BF16).tobytes()  # the new param rounded to bf16
    out = np.full(1, np.nan, np.float32)
    assert opt.step(ctx, 2, grad_norm=out) is out
    assert np.isfinite(out[0])


def test_adamw_clipping_and_non_finite_gradients(ctx, rng):
    w, g = f32(rng, 10), f32(rng, 10, scale=10.0)
    opt = libte.AdamW(max_grad_norm=1.0, weight_decay=0.0)
    opt.add_param(w, g)
    w0 = w.copy()
    norm = opt.step(ctx, 1, grad_norm=True)
    n64 = np.sqrt((g.astype(np.float64) ** 2).sum())
    np.testing.assert_allclose(norm, n64, rtol=1e-5)
    p, m, _ = adamw_reference(w0, g, 0.0, 0.0, 1, wd=0.0, clip=min(1.0, 1.0 / (n64 + 1e-6)))
    np.testing.assert_allclose(w, p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(opt.params[0].exp_avg, m, rtol=1e-4, atol=1e-7)
    # A non-finite norm skips the whole update: nothing changes.
    before = [a.copy() for a in (w, opt.params[0].exp_avg, opt.params[0].exp_avg_sq)]
    g[3] = np.inf
    opt.step(ctx, 2)
    for a, b in zip((w, opt.params[0].exp_avg, opt.params[0].exp_avg_sq), before):
        assert a.tobytes() == b.tobytes()


def _linear_pair(ctx, rng):
    x, w, b = f32(rng, 16, 32), f32(rng, 16, 32, scale=0.2), f32(rng, 16)
    layers = [libte.Linear(ctx, 32, 16) for _ in range(2)]
    return x, w, b, layers


def test_adamw_refreshes_the_owner_fp8_weight_cache(ctx, rng):
    """After a step with an owner, a forward with weight_unchanged=True (no cast) gives the same
    bytes as a twin layer's forward that casts the new weight."""
    x, w, b, (owned, twin) = _linear_pair(ctx, rng)
    recipe = libte.Recipe(kind="current")
    with libte.autocast(ctx, recipe=recipe):
        for layer in (owned, twin):
            layer.forward(x, w, b)
    g = f32(rng, 16, 32)
    w_owned, w_twin = w.copy(), w.copy()
    opt_owned = libte.AdamW(lr=0.05)
    opt_owned.add_param(w_owned, g, owner=owned)
    opt_twin = libte.AdamW(lr=0.05)
    opt_twin.add_param(w_twin, g)
    opt_owned.step(ctx, 1)
    opt_twin.step(ctx, 1)
    assert w_owned.tobytes() == w_twin.tobytes()
    assert w_owned.tobytes() != w.tobytes()
    with libte.autocast(ctx, recipe=recipe):
        y_cached, _ = owned.forward(x, w_owned, b, weight_unchanged=True)
        y_cast, _ = twin.forward(x, w_twin, b)
        y_stale, _ = twin.forward(x, w, b)
    assert y_cached.tobytes() == y_cast.tobytes()
    assert y_cached.tobytes() != y_stale.tobytes()


def test_adamw_owner_gemm_of_layernorm_mlp(ctx, rng):
    mlp = libte.LayerNormMLP(ctx, 32, 16)
    fc1, fc2 = f32(rng, 16, 32), f32(rng, 32, 16)
    opt = libte.AdamW()
    opt.add_param(fc1, f32(rng, 16, 32), owner=mlp, owner_gemm="fc1")
    opt.add_param(fc2, f32(rng, 32, 16), owner=(mlp, "fc2"))
    opt.step(ctx, 1)  # no FP8 forward yet: nothing to refresh, but the owners are checked
    bad = libte.AdamW()
    bad.add_param(f32(rng, 32, 16), f32(rng, 32, 16), owner=mlp, owner_gemm="fc1")  # fc2's shape
    with pytest.raises(libte.InvalidArgument) as e:
        bad.step(ctx, 1)
    library_error(e, "te_adamw_step")
    with pytest.raises(libte.InvalidArgument, match="owner_gemm"):
        libte.AdamW().add_param(fc1, fc1, owner=mlp)
    with pytest.raises(libte.InvalidArgument, match="owner_gemm"):
        libte.AdamW().add_param(fc1, fc1, owner=libte.Linear(ctx, 32, 16), owner_gemm="fc1")
    with pytest.raises(libte.InvalidArgument, match="owner"):
        libte.AdamW().add_param(fc1, fc1, owner=object())


def test_adamw_errors_change_nothing(ctx, rng):
    w, g = f32(rng, 3, 4), f32(rng, 3, 4)
    ok = libte.AdamW()
    ok.add_param(w, g)
    snapshot = lambda opt: [np.array(a, copy=True) for p in opt.params
                            for a in (p.param, p.exp_avg, p.exp_avg_sq)]
    cases = [
        (dict(lr=-1.0), "lr"), (dict(betas=(1.0, 0.999)), "beta1"),
        (dict(betas=(0.9, -0.5)), "beta2"), (dict(eps=0.0), "eps"),
        (dict(weight_decay=-0.1), "weight_decay"),
    ]
    for kwargs, field in cases:
        opt = libte.AdamW(**kwargs)
        opt.add_param(w, g)
        before = snapshot(opt)
        with pytest.raises(libte.InvalidArgument) as e:
            opt.step(ctx, 1)
        assert field in library_error(e, "te_adamw_step")
        for a, b in zip(snapshot(opt), before):
            assert a.tobytes() == b.tobytes(), field
    with pytest.raises(libte.InvalidArgument) as e:
        ok.step(ctx, 0)  # step < 1
    library_error(e, "te_adamw_step")
    # A tensor given twice (the same param in two entries), and shapes that differ.
    twice = libte.AdamW()
    twice.add_param(w, g)
    twice.add_param(w, g)
    with pytest.raises(libte.InvalidArgument) as e:
        twice.step(ctx, 1)
    library_error(e, "te_adamw_step")
    short = libte.AdamW()
    short.add_param(w, g[:2])
    with pytest.raises(libte.InvalidArgument) as e:
        short.step(ctx, 1)
    library_error(e, "te_adamw_step")
    with pytest.raises(libte.InvalidArgument, match="exp_avg"):
        libte.AdamW().add_param(memoryview(w), g)  # moments are allocated for NumPy params only


# ---- other frameworks' arrays, and the SWIG module's own conventions ---------------------------

def test_dlpack_arrays_and_int32_ids(ctx, rng):
    """Tensors of another framework through DLPack, int32 ids and targets included (kDLInt 32 ->
    TE_DTYPE_I32): the same bytes as NumPy's."""
    torch = pytest.importorskip("torch")
    table = f32(rng, 9, 4)
    ids = rng.integers(0, 9, size=(2, 3), dtype=np.int32)
    y = torch.empty((2, 3, 4))
    libte.embedding_forward(ctx, torch.from_numpy(table), torch.from_numpy(ids), out=y)
    assert y.numpy().tobytes() == libte.embedding_forward(ctx, table, ids).tobytes()
    logits = f32(rng, 6, 9)
    loss, d = torch.empty(1), torch.empty((6, 9))
    libte.cross_entropy(ctx, torch.from_numpy(logits), torch.from_numpy(ids.ravel()), loss, d)
    ref_l, ref_d = libte.cross_entropy(ctx, logits, ids.ravel(), dlogits=True)
    assert loss.numpy().tobytes() == ref_l.tobytes() and d.numpy().tobytes() == ref_d.tobytes()
    with pytest.raises(libte.InvalidArgument, match="'ids'.*int32"):
        libte.embedding_forward(ctx, torch.from_numpy(table), torch.from_numpy(ids).long(), out=y)
    a = torch.from_numpy(f32(rng, 2, 6))
    parts = [torch.empty((2, 2)), torch.empty((2, 4))]
    libte.split_columns(ctx, a, out=parts)
    assert torch.equal(torch.cat(parts, dim=1), a)
    with pytest.raises(libte.InvalidArgument, match="'out'"):
        libte.add(ctx, a, a)  # libte allocates outputs for NumPy inputs only


def test_swig_module_conventions(ctx, rng):
    """The raw SWIG module: te_adamw_step takes a list of te_adamw_param proxies or 9-tuples;
    te_adamw_param's tensor members take te_tensor proxies only (a converted tuple would
    dangle); checkpoint names come back as bytes, counts as ints."""
    try:
        from libte import _lowlevel_swig  # noqa: F401 (registers the error factory)
        from libte import _te_swig as te
    except ImportError:
        pytest.skip("SWIG extension not built")
    tup = (0, C.DTYPE_F32, (1,), 0, 0, 0, 0)
    p = te.te_adamw_param()
    assert p.struct_size == _lowlevel_ctypes.SIZEOF["te_adamw_param"] and p.weight_decay == 1
    for name in ("param", "grad", "exp_avg", "exp_avg_sq", "model_weight"):
        with pytest.raises(TypeError, match="proxy"):
            setattr(p, name, tup)
        setattr(p, name, None)
    o = te.te_adamw_options()
    assert o.struct_size == _lowlevel_ctypes.SIZEOF["te_adamw_options"]
    assert (o.lr, o.step) == (pytest.approx(1e-3), 1)
    c = te.te_context_create(None)
    w, g, m, v = (np.zeros(4, np.float32) for _ in range(4))
    g[:] = 1
    d = lambda x: (x.ctypes.data, C.DTYPE_F32, x.shape, 0, 0, 0, 0)
    te.te_adamw_step(c, o, [(d(w), d(g), d(m), d(v), None, 1, 0, None, 0)])
    assert (w < 0).all()  # a step against a positive gradient
    # A proxy entry reaches the library as it is (its NULL param named there).
    with pytest.raises(libte.InvalidArgument, match=r"params\[0\]\.param"):
        te.te_adamw_step(c, o, [p])
    with pytest.raises(libte.InvalidArgument, match="te_adamw_step"):
        te.te_adamw_step(c, o, [(d(w), d(w), d(m), d(v), None, 1, 0, None, 0)])  # param twice
    with pytest.raises(TypeError, match="9-tuple"):
        te.te_adamw_step(c, o, [(d(w), d(g))])
    ck = te.te_checkpoint_create()
    te.te_checkpoint_put_bytes(ck, "n\u00e9", b"v")
    assert te.te_checkpoint_count(ck) == 1
    assert te.te_checkpoint_name(ck, 0) == "n\u00e9".encode()
    te.te_checkpoint_destroy(ck)
    te.te_context_destroy(c)


class _FakeCudaArray:
    """Only a __cuda_array_interface__ (nothing is read: a CPU context refuses device memory)."""

    def __init__(self, shape, typestr):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "version": 3,
                                         "data": (0x1000, False), "strides": None}


def test_cuda_array_interface_ids(ctx, rng):
    table = f32(rng, 5, 3)
    out = np.zeros((4, 3), np.float32)
    # int32 device ids pass the binding (typestr <i4 -> TE_DTYPE_I32); the library then refuses
    # device memory on a CPU context, naming the argument.
    with pytest.raises(libte.InvalidArgument) as e:
        libte.embedding_forward(ctx, table, _FakeCudaArray((4,), "<i4"), out=out)
    assert "ids" in library_error(e, "te_embedding_forward")
    with pytest.raises(libte.InvalidArgument, match="'ids'.*int32.*token ids"):
        libte.embedding_forward(ctx, table, _FakeCudaArray((4,), "<f4"), out=out)
    with pytest.raises(libte.InvalidArgument, match="'targets'.*int32.*target ids"):
        libte.cross_entropy(ctx, f32(rng, 4, 5), _FakeCudaArray((4,), "<i8"))
