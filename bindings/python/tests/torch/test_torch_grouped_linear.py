"""libte.torch.GroupedLinear: experts over consecutive token groups (an empty one included)
against fp64, bitwise equal to libte's NumPy path, state_dict resume, torch.compile."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import libte  # noqa: E402
import libte.torch as lt  # noqa: E402

SPLITS = [16, 0, 32]


def _supported():
    try:
        lt.GroupedLinear(1, 16, 16)(torch.randn(16, 16), [16])
        return True
    except libte.Unsupported:
        return False


if not _supported():
    pytest.skip("this libte (or its SWIG module) has no te_grouped_linear_residuals_size yet",
                allow_module_level=True)


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def make(seed=0, bias=True):
    torch.manual_seed(seed)
    m = lt.GroupedLinear(3, 64, 32, bias=bias)
    with torch.no_grad():
        for b in m._biases():
            b.normal_()
    return m


def run(m, x, dy, kind, splits=SPLITS):
    x = x.clone().requires_grad_()
    m.zero_grad(set_to_none=True)
    if kind is None:
        y = m(x, splits)
    else:
        with lt.autocast(recipe=libte.Recipe(kind=kind)):
            y = m(x, splits)
    y.backward(dy)
    return [y.detach(), x.grad] + [p.grad.clone() for p in m.parameters()]


@pytest.mark.parametrize("kind", (None, "delayed", "current", "block"))
def test_vs_fp64(kind):
    m = make()
    x, dy = torch.randn(48, 64), torch.randn(48, 32)
    ws = [w.detach().double().requires_grad_() for w in m._weights()]
    bs = [b.detach().double().requires_grad_() for b in m._biases()]
    x64 = x.double().requires_grad_()
    y64 = torch.cat([F.linear(p, w, b) for p, w, b in zip(torch.split(x64, SPLITS), ws, bs)])
    y64.backward(dy.double())
    y, dx, *grads = run(m, x, dy, kind)
    # high precision: fp32 accumulation (1e-5); FP8: as Linear (0.15, see test_torch_linear)
    tol = 1e-5 if kind is None else 0.15
    assert rel(y, y64) < tol and rel(dx, x64.grad) < tol
    named = dict(zip([n for n, _ in m.named_parameters()], grads))
    for i, (w, b) in enumerate(zip(ws, bs)):
        if SPLITS[i] == 0:  # an expert without tokens: zero gradients
            assert not named["weight%d" % i].any() and not named["bias%d" % i].any()
            continue
        assert rel(named["weight%d" % i], w.grad) < tol
        assert rel(named["bias%d" % i], b.grad) < 1e-5


@pytest.mark.parametrize("kind", ("delayed", "block"))
def test_bitwise_equal_to_numpy_path(kind):
    m = make(1)
    x, dy = torch.randn(48, 64), torch.randn(48, 32)
    y, dx, *grads = run(m, x, dy, kind)
    n = lambda t: t.detach().numpy()  # noqa: E731
    with libte.Context("cpu") as ctx:
        ref = libte.GroupedLinear(ctx, 3, 64, 32)
        with libte.autocast(ctx, recipe=libte.Recipe(kind=kind)):
            y_np, bwd = ref.forward(n(x), SPLITS, [n(w) for w in m._weights()],
                                    [n(b) for b in m._biases()])
        g = bwd.backward(n(dy), once=True)
    assert np.array_equal(n(y), y_np) and np.array_equal(n(dx), g.dx)
    named = dict(zip([k for k, _ in m.named_parameters()], grads))
    for i in range(3):
        assert np.array_equal(n(named["weight%d" % i]), g.dw[i])
        assert np.array_equal(n(named["bias%d" % i]), g.db[i])


def test_compile_and_state_dict():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager, comp = make(2, bias=False), make(2, bias=False)
    compiled = torch.compile(comp, fullgraph=True, backend="aot_eager")
    x, dy = torch.randn(48, 64), torch.randn(48, 32)
    for kind in (None, "delayed", "current"):
        for a, b in zip(run(eager, x, dy, kind), run(compiled, x, dy, kind)):
            assert torch.equal(a, b), kind
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
    torch._dynamo.reset()
    fresh = make(3, bias=False)
    fresh.load_state_dict(eager.state_dict())
    for a, b in zip(run(eager, x, dy, "delayed"), run(fresh, x, dy, "delayed")):
        assert torch.equal(a, b)


def test_errors():
    m = make()
    with pytest.raises(libte.InvalidArgument, match="m_splits"):
        m(torch.randn(48, 64), [48, 0])
    with lt.autocast():
        with pytest.raises(libte.Error):
            m(torch.randn(48, 64), [16, 16, 8])  # does not sum to the tokens
