#!/usr/bin/env python3
"""The training-step ops, AdamW and checkpoints from Python on a CUDA GPU: every result on a CUDA
context (PyTorch CUDA tensors, through DLPack) against the same call on a CPU context (NumPy),
bit for bit where te.h says so (add, split/concat, embedding forward and backward, cross-entropy,
AdamW with clipping and a bf16 model weight, the owner's FP8 weight-cache refresh), CUDA's
documented behaviour for ids and targets out of range, and checkpoints of device tensors.

    LIBTE_PATH=build/<cuda build> PYTHONPATH=bindings/python \\
        python3 -m pytest -q bindings/python/tests/gpu/test_training_gpu.py

Skipped without PyTorch, without a CUDA device, or with a libte built without CUDA. Not
collected by the CPU suite (tests/conftest.py ignores this directory).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import libte  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch", allow_module_level=True)
try:
    libte.Context("cuda").close()
except libte.Error as e:
    pytest.skip("libte has no usable CUDA device: %s" % e, allow_module_level=True)

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def gpu():
    c = libte.Context("cuda")
    yield c
    c.close()


@pytest.fixture(scope="module")
def cpu():
    c = libte.Context("cpu")
    yield c
    c.close()


@pytest.fixture
def rng():
    return np.random.default_rng(99)


def dev(a):
    """A CUDA copy of a NumPy array (bfloat16 through its bits)."""
    a = np.ascontiguousarray(a)
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
    return torch.from_numpy(a).cuda()


def host(t):
    torch.cuda.synchronize()
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def same(gpu_tensor, cpu_array):
    got = host(gpu_tensor)
    assert got.dtype == cpu_array.dtype and got.shape == cpu_array.shape
    assert got.tobytes() == cpu_array.tobytes()


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def test_add_split_concat(gpu, cpu, rng):
    for dtype in (np.dtype(np.float32), BF16):
        a, b = f32(rng, 64, 96).astype(dtype), f32(rng, 64, 96).astype(dtype)
        y = torch.empty_like(dev(a))
        libte.add(gpu, dev(a), dev(b), out=y)
        same(y, libte.add(cpu, a, b))
        parts = [torch.empty((64, c), dtype=y.dtype, device="cuda") for c in (32, 48, 16)]
        libte.split_columns(gpu, y, out=parts)
        ref = libte.split_columns(cpu, libte.add(cpu, a, b), [32, 48, 16])
        for p, r in zip(parts, ref):
            same(p, r)
        back = torch.empty_like(y)
        libte.concat_columns(gpu, parts, out=back)
        same(back, libte.concat_columns(cpu, ref))


def test_embedding(gpu, cpu, rng):
    table = f32(rng, 500, 64)
    ids = rng.integers(0, 500, size=(4, 128), dtype=np.int32)
    ids[0, :50] = 7  # one row hit many times: the ordered sum matters
    y = torch.empty((4, 128, 64), device="cuda")
    libte.embedding_forward(gpu, dev(table), dev(ids), out=y)
    same(y, libte.embedding_forward(cpu, table, ids))
    dy = f32(rng, 4, 128, 64)
    for dy_dtype in (np.dtype(np.float32), BF16):
        d = dy.astype(dy_dtype)
        dt = torch.full((500, 64), float("nan"), device="cuda")
        libte.embedding_backward(gpu, dev(ids), dev(d), dt)
        ref = np.empty((500, 64), np.float32)
        libte.embedding_backward(cpu, ids, d, ref)
        same(dt, ref)
    # CUDA cannot refuse an id out of range without a host sync: that token's row is zeros.
    bad = ids.copy()
    bad[1, 3] = 500
    libte.embedding_forward(gpu, dev(table), dev(bad), out=y)
    got = host(y)
    assert not got[1, 3].any()
    np.testing.assert_array_equal(got[0], table[ids[0]])


def test_cross_entropy(gpu, cpu, rng):
    for dtype in (np.dtype(np.float32), BF16):
        logits = f32(rng, 256, 1000, scale=3.0).astype(dtype)
        targets = rng.integers(0, 1000, size=256, dtype=np.int32)
        targets[::7] = -100
        loss = torch.empty(1, device="cuda")
        d = torch.empty_like(dev(logits))
        libte.cross_entropy(gpu, dev(logits), dev(targets), loss, d, grad_scale=0.5)
        ref_loss, ref_d = libte.cross_entropy(cpu, logits, targets, dlogits=True, grad_scale=0.5)
        same(loss, ref_loss)
        same(d, ref_d)
    bad = targets.copy()
    bad[5] = 1000  # out of range on CUDA: a NaN loss (no host sync to refuse it)
    libte.cross_entropy(gpu, dev(logits), dev(bad), loss)
    assert np.isnan(host(loss)[0])


def test_adamw(gpu, cpu, rng):
    shapes = [(256, 128), (128,), (1000, 33)]
    params = [f32(rng, *s) for s in shapes]
    dparams = [dev(p) for p in params]
    mw = [np.empty(s, BF16) for s in shapes]
    dmw = [torch.empty(s, dtype=torch.bfloat16, device="cuda") for s in shapes]
    opt_cpu = libte.AdamW(lr=1e-2, max_grad_norm=5.0)
    opt_gpu = libte.AdamW(lr=1e-2, max_grad_norm=5.0)
    grads = [np.zeros(s, np.float32) for s in shapes]
    dgrads = [torch.zeros(s, device="cuda") for s in shapes]
    for i in range(3):
        opt_cpu.add_param(params[i], grads[i], model_weight=mw[i], weight_decay=i != 1)
        opt_gpu.add_param(dparams[i], dgrads[i], torch.zeros(shapes[i], device="cuda"),
                          torch.zeros(shapes[i], device="cuda"), model_weight=dmw[i],
                          weight_decay=i != 1)
    norm = torch.empty(1, device="cuda")
    for step in range(1, 4):
        for g, dg in zip(grads, dgrads):
            g[...] = f32(rng, *g.shape)
            dg.copy_(torch.from_numpy(g))
        n_cpu = opt_cpu.step(cpu, step, grad_norm=True)
        opt_gpu.step(gpu, step, grad_norm=norm)
        assert host(norm)[0] == np.float32(n_cpu)
    for i in range(3):
        same(dparams[i], params[i])
        same(dmw[i], mw[i])
        same(opt_gpu.params[i].exp_avg, opt_cpu.params[i].exp_avg)
        same(opt_gpu.params[i].exp_avg_sq, opt_cpu.params[i].exp_avg_sq)


def test_adamw_owner_refresh(gpu, rng):
    x, w, b = dev(f32(rng, 64, 128)), dev(f32(rng, 96, 128, scale=0.1)), dev(f32(rng, 96))
    owned, twin = libte.Linear(gpu, 128, 96), libte.Linear(gpu, 128, 96)
    recipe = libte.Recipe(kind="delayed", amax_history_len=4)
    y = torch.empty((64, 96), device="cuda")
    with libte.autocast(gpu, recipe=recipe):
        for layer in (owned, twin):
            layer.forward(x, w, b, out=y)
    g = dev(f32(rng, 96, 128))
    w_owned, w_twin = w.clone(), w.clone()
    for weight, owner in ((w_owned, owned), (w_twin, None)):
        opt = libte.AdamW(lr=0.05)
        opt.add_param(weight, g, torch.zeros_like(weight), torch.zeros_like(weight), owner=owner)
        opt.step(gpu, 1)
    assert torch.equal(w_owned, w_twin)
    y_cached, y_cast = torch.empty_like(y), torch.empty_like(y)
    with libte.autocast(gpu, recipe=recipe):
        owned.forward(x, w_owned, b, weight_unchanged=True, out=y_cached)
        twin.forward(x, w_twin, b, out=y_cast)
    torch.cuda.synchronize()
    assert torch.equal(y_cached, y_cast)


def test_checkpoint_of_device_tensors(gpu, cpu, rng, tmp_path):
    a = f32(rng, 33, 17)
    ids = rng.integers(0, 9, size=11, dtype=np.int32)
    with libte.Checkpoint() as ck:
        ck.put_tensor("a", dev(a), ctx=gpu)
        ck.put_tensor("ids", dev(ids), ctx=gpu)
        ck.put_tensor("bf", dev(a.astype(BF16)), ctx=gpu)
        ck.write(tmp_path / "ck")
    with libte.Checkpoint.read(tmp_path / "ck") as ck:
        np.testing.assert_array_equal(ck.get_tensor("a", np.empty_like(a)), a)
        out = torch.empty((33, 17), device="cuda")
        ck.get_tensor("a", out, ctx=gpu)
        same(out, a)
        out_ids = torch.empty(11, dtype=torch.int32, device="cuda")
        ck.get_tensor("ids", out_ids, ctx=gpu)
        same(out_ids, ids)
        bf = torch.empty((33, 17), dtype=torch.bfloat16, device="cuda")
        ck.get_tensor("bf", bf, ctx=gpu)
        same(bf, a.astype(BF16))
        with pytest.raises(libte.InvalidArgument, match="te_checkpoint_get_tensor"):
            ck.get_tensor("a", torch.empty((17, 33), device="cuda"), ctx=gpu)
