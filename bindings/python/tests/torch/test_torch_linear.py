"""libte.torch.Linear: numerics (vs torch.nn.Linear, vs libte's own NumPy path, vs fp64 on the
dequantized FP8 operands), autograd, recipes, autocast, errors, retain_graph, state_dict."""

import io
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import libte  # noqa: E402
import libte.torch as lt  # noqa: E402
from conftest import fp64_linear_reference  # noqa: E402

RECIPES = ("delayed", "current", "block")


def recipe(kind):
    return libte.Recipe(kind=kind)


def copy_of(mod, bias=True):
    ref = torch.nn.Linear(mod.in_features, mod.out_features, bias=bias,
                          dtype=mod.weight.dtype)
    with torch.no_grad():
        ref.weight.copy_(mod.weight)
        if bias:
            ref.bias.copy_(mod.bias)
    return ref


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def test_import_libte_without_torch():
    # sys.modules["torch"] = None makes `import torch` fail: libte must not need it.
    code = ("import sys; sys.modules['torch'] = None\n"
            "import libte\n"
            "try:\n"
            "    import libte.torch\n"
            "except ImportError as e:\n"
            "    assert 'PyTorch' in str(e), e\n"
            "else:\n"
            "    raise SystemExit('libte.torch imported without torch')\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("bias", [True, False])
def test_high_precision_matches_nn_linear(dtype, tol, bias):
    torch.manual_seed(0)
    m = lt.Linear(48, 40, bias=bias, params_dtype=dtype)
    ref = copy_of(m, bias)
    if bias:
        with torch.no_grad():
            m.bias.normal_()
            ref.bias.copy_(m.bias)
    x = torch.randn(3, 7, 48, dtype=dtype)  # 3-D, tokens not a multiple of 16: fine off FP8
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    dy = torch.randn(3, 7, 40, dtype=dtype)
    y = m(x1)
    y.backward(dy)
    # The reference in fp64 on the same operands: libte and torch both accumulate in fp32 and
    # round once to the output dtype, so bf16 agrees to its rounding (2^-8), fp32 to ~1e-7.
    r64 = copy_of(m, bias).double()
    x64 = x.double().requires_grad_()
    y64 = r64(x64)
    y64.backward(dy.double())
    assert y.shape == (3, 7, 40) and y.dtype == dtype
    assert rel(y, y64) < tol
    assert rel(x1.grad, x64.grad) < tol
    assert rel(m.weight.grad, r64.weight.grad) < tol
    if bias:
        assert rel(m.bias.grad, r64.bias.grad) < tol
    if dtype == torch.float32:  # and nn.Linear itself, to fp32 rounding
        yr = ref(x2)
        yr.backward(dy)
        torch.testing.assert_close(y, yr, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", RECIPES)
def test_fp8_bitwise_equal_to_numpy_path_and_fp64_reference(kind):
    """The torch ops (caller-owned residuals) against libte.Linear's NumPy path (library-owned
    residuals): the C ABI makes them bitwise equal, forward and backward; and y against fp64
    on the FP8 operands the NumPy path exposes (both accumulate in fp32: ~1e-6)."""
    torch.manual_seed(1)
    m = lt.Linear(64, 32)
    with torch.no_grad():
        m.bias.normal_()
    x = torch.randn(32, 64, requires_grad=True)
    dy = torch.randn(32, 32)
    with lt.autocast(recipe=recipe(kind)):
        y = m(x)
    y.backward(dy)

    w, b = m.weight.detach().numpy(), m.bias.detach().numpy()
    with libte.Context("cpu") as ctx:
        ref = libte.Linear(ctx, 64, 32)
        with libte.autocast(ctx, recipe=recipe(kind)):
            y_np, res = ref.forward_compute(x.detach().numpy(), w, b)
        if kind != "block":  # per-tensor scaling: the dequantized operands are exact
            want = fp64_linear_reference(res, b)
            assert np.linalg.norm(y.detach().numpy() - want) / np.linalg.norm(want) < 1e-5
        bwd = ref.forward_save(res)
        dx, dw, db = bwd.backward(dy.numpy(), once=True)
    assert np.array_equal(y.detach().numpy(), y_np)
    assert np.array_equal(x.grad.numpy(), dx)
    assert np.array_equal(m.weight.grad.numpy(), dw)
    assert np.array_equal(m.bias.grad.numpy(), db)


@pytest.mark.parametrize("kind", RECIPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_close_to_nn_linear(kind, dtype):
    # FP8 error: E4M3 keeps 3 mantissa bits (relative rounding error <= 2^-4 per element, ~2^-4
    # / sqrt(3) rms for uniform rounding), E5M2 (dy, HYBRID) 2 bits. Two quantized operands per
    # GEMM, errors independent: normwise ~ sqrt(2) * 0.036 ~ 0.05 for y and dx/dw (E5M2 dy: ~
    # 0.1). Bound 0.15; high precision would be 1e-6 and a wrong operand O(1).
    torch.manual_seed(2)
    m = lt.Linear(64, 48, params_dtype=dtype)
    x = torch.randn(2, 16, 64, dtype=dtype)
    dy = torch.randn(2, 16, 48, dtype=dtype)
    r64 = copy_of(m).double()
    x64 = x.double().requires_grad_()
    y64 = r64(x64)
    y64.backward(dy.double())
    x1 = x.clone().requires_grad_()
    with lt.autocast(recipe=recipe(kind)):
        y = m(x1)
    y.backward(dy)
    assert y.dtype == dtype
    for got, want in ((y, y64), (x1.grad, x64.grad), (m.weight.grad, r64.weight.grad)):
        assert rel(got, want) < 0.15
    assert rel(m.bias.grad, r64.bias.grad) < 1e-2  # db: a sum of dy, no FP8


def test_input_grad_not_required_and_noncontiguous_input():
    torch.manual_seed(3)
    m = lt.Linear(32, 16)
    xt = torch.randn(32, 16).t()  # non-contiguous view of [16, 32]
    with lt.autocast(recipe=recipe("current")):
        y1 = m(xt)
        y2 = m(xt.contiguous())
    assert torch.equal(y1, y2)
    y1.sum().backward()
    assert m.weight.grad is not None and m.bias.grad is not None


def test_autocast_nesting_and_reuse():
    torch.manual_seed(4)
    m = lt.Linear(32, 32)
    x = torch.randn(16, 32)
    hp = m(x)
    outer = lt.autocast(recipe=recipe("current"))
    with outer:
        fp8 = m(x)
        with lt.autocast(enabled=False):
            inner_hp = m(x)
        with outer:  # the same instance, entered again while open
            fp8_again = m(x)
        after = m(x)
    assert torch.equal(inner_hp, hp)
    assert not torch.equal(fp8, hp)
    assert torch.equal(fp8, fp8_again) and torch.equal(fp8, after)
    assert lt.context("cpu").autocast_state().depth == 0


def test_delayed_scaling_updates_at_exit():
    torch.manual_seed(5)
    m = lt.Linear(32, 32)
    x = torch.randn(16, 32) * 4
    with lt.autocast(recipe=lt.DelayedScaling(amax_history_len=4)):
        m(x).sum().backward()
    s = m.te_layer.scaling_state("input")
    assert s.amax_history_len == 4
    assert np.isclose(s.amax_history.max(), x.abs().max().item())
    # scale = fp8_max / amax (margin 0; E4M3 max 448)
    assert np.isclose(s.scale, 448.0 / x.abs().max().item(), rtol=1e-6)


def test_te_like_recipes():
    r = lt.DelayedScaling(margin=1, fp8_format=lt.Format.E4M3, amax_history_len=16,
                          amax_compute_algo="most_recent")
    assert (r.kind, r.fp8_format, r.margin, r.amax_history_len, r.amax_compute_algo) == \
        ("delayed", "E4M3", 1, 16, "most_recent")
    assert lt.Float8CurrentScaling().kind == "current"
    assert lt.Float8BlockScaling().kind == "block"
    with pytest.raises(libte.InvalidArgument, match="recipe"):
        lt.autocast(recipe="delayed")


def test_weight_unchanged_reuses_the_fp8_weight():
    torch.manual_seed(6)
    m = lt.Linear(32, 32)
    x = torch.randn(16, 32)
    with lt.autocast(recipe=recipe("current")):
        a = m(x, is_first_microbatch=True)
        b = m(x, is_first_microbatch=False)
    assert torch.equal(a, b)


def test_errors_name_the_argument():
    m = lt.Linear(64, 32)
    with pytest.raises(libte.InvalidArgument, match="'input'.*dtype"):
        m(torch.randn(16, 64, dtype=torch.float64))
    with pytest.raises(libte.InvalidArgument, match=r"'input'.*\[\.\.\., 64\]"):
        m(torch.randn(16, 48))
    with pytest.raises(libte.InvalidArgument, match="params_dtype"):
        lt.Linear(8, 8, params_dtype=torch.int32)
    with pytest.raises(libte.InvalidArgument, match="in_features"):
        lt.Linear(0, 8)
    with lt.autocast():
        with pytest.raises(libte.Unsupported, match="args->input.*multiple of 16"):
            m(torch.randn(10, 64))  # tokens
    with lt.autocast():
        with pytest.raises(libte.Unsupported, match="multiple of 16"):
            lt.Linear(40, 32)(torch.randn(16, 40))  # in_features
    # nothing left open or broken: the layer still works
    with lt.autocast():
        assert m(torch.randn(16, 64)).shape == (16, 32)


def test_retain_graph():
    torch.manual_seed(7)
    m = lt.Linear(32, 32)
    x = torch.randn(16, 32, requires_grad=True)
    # High precision: x and W are saved tensors, a second backward just works.
    y = m(x)
    y.sum().backward(retain_graph=True)
    g1 = m.weight.grad.clone()
    y.sum().backward()
    torch.testing.assert_close(m.weight.grad, 2 * g1)
    # FP8: the first backward releases the residual record by default ...
    m.zero_grad()
    with lt.autocast(recipe=recipe("delayed")):
        y = m(x)
    y.sum().backward(retain_graph=True)
    with pytest.raises(libte.InvalidState, match="retain_residuals"):
        y.sum().backward()
    # ... unless the forward ran inside retain_residuals(): then backwards repeat exactly.
    m.zero_grad()
    with lt.autocast(recipe=recipe("delayed")), lt.retain_residuals():
        y = m(x)
    y.sum().backward(retain_graph=True)
    g1 = m.weight.grad.clone()
    y.sum().backward()
    assert torch.equal(m.weight.grad, g1 + g1)


def _train(model, steps, kind, seed, opt=None):
    gen = torch.Generator().manual_seed(seed)
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 32, generator=gen)
        with lt.autocast(recipe=recipe(kind)):
            y = model(x)
        loss = (y.float() ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _mlp():
    return torch.nn.Sequential(lt.Linear(32, 64), torch.nn.ReLU(), lt.Linear(64, 32))


@pytest.mark.parametrize("kind", RECIPES)
def test_state_dict_resumes_bit_for_bit(kind):
    torch.manual_seed(8)
    a = _mlp()
    _train(a, 3, kind, seed=1)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf)  # weights_only=True by default: the extra state is a tensor
    assert state["0._extra_state"].dtype == torch.uint8
    b = _mlp()
    b.load_state_dict(state)
    la = _train(a, 2, kind, seed=2)
    lb = _train(b, 2, kind, seed=2)
    assert la == lb
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    if kind == "delayed":
        for ma, mb in ((a[0], b[0]), (a[2], b[2])):
            for role in ("input", "weight", "grad_output"):
                sa, sb = ma.te_layer.scaling_state(role), mb.te_layer.scaling_state(role)
                assert (sa.scale, sa.scale_inv) == (sb.scale, sb.scale_inv)
                assert np.array_equal(sa.amax_history, sb.amax_history)


def test_extra_state_before_first_forward_and_bad_blobs():
    a, b = lt.Linear(16, 16), lt.Linear(16, 16)
    b.load_state_dict(a.state_dict())  # no FP8 state yet: fine
    with pytest.raises(libte.InvalidArgument, match="magic"):
        b.set_extra_state(torch.zeros(32, dtype=torch.uint8))
    blob = a.get_extra_state().clone()
    blob[12] = 99  # version
    with pytest.raises(libte.InvalidArgument, match="version 99"):
        b.set_extra_state(blob)


def test_group_from_torch_distributed_single_rank(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised")
    dist.init_process_group("gloo", init_method="file://%s" % (tmp_path / "store"), rank=0,
                            world_size=1)
    try:
        m = lt.Linear(32, 32)
        x = torch.randn(16, 32)
        with lt.autocast(recipe=recipe("delayed"), group=dist.group.WORLD):
            y = m(x)
        with lt.autocast(recipe=recipe("delayed")):
            y2 = lt.Linear(32, 32)(x)
        assert y.shape == y2.shape
    finally:
        dist.destroy_process_group()
