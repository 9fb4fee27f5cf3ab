"""libte.torch.LayerNormLinear and LayerNormMLP: high precision vs an fp64 torch reference,
FP8 bitwise equal to libte's NumPy path (library-owned residuals) and close to the reference,
autograd of every parameter, retain_graph, state_dict resume, torch.compile fullgraph."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import libte  # noqa: E402
import libte.torch as lt  # noqa: E402

RECIPES = ("delayed", "current", "block")


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def randomize(m):
    torch.manual_seed(11)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "layer_norm" in name or "bias" in name:
                p.normal_(0.5 if name == "layer_norm_weight" else 0.0, 0.3)


def norm64(x, g, b, kind, eps=1e-5):
    if kind == "LayerNorm":
        return F.layer_norm(x, (x.shape[-1],), g, b, eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def act64(a, name, ffn):
    if name == "gelu":
        return F.gelu(a, approximate="tanh")
    if name == "relu":
        return F.relu(a)
    if name == "srelu":
        return F.relu(a) ** 2
    gate, up = a[..., :ffn], a[..., ffn:]
    return (F.silu(gate) if name == "swiglu" else F.gelu(gate, approximate="tanh")) * up


def reference(m, x):
    """fp64 forward of module m's math, with fp64 leaf copies of its parameters."""
    P = {n: p.detach().double().requires_grad_() for n, p in m.named_parameters()}
    x64 = x.detach().double().requires_grad_()
    h = norm64(x64, P["layer_norm_weight"], P.get("layer_norm_bias"), m.normalization)
    if isinstance(m, lt.LayerNormLinear):
        y = F.linear(h, P["weight"], P.get("bias"))
    else:
        a = act64(F.linear(h, P["fc1_weight"], P.get("fc1_bias")), m.activation,
                  m.ffn_hidden_size)
        y = F.linear(a, P["fc2_weight"], P.get("fc2_bias"))
    return x64, P, y


def run(m, x, dy, kind=None):
    x = x.clone().requires_grad_()
    m.zero_grad(set_to_none=True)
    if kind is None:
        y = m(x)
    else:
        with lt.autocast(recipe=libte.Recipe(kind=kind)):
            y = m(x)
    y.backward(dy)
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in m.named_parameters()}


MODULES = [
    ("lnl-layernorm", lambda dt: lt.LayerNormLinear(64, 48, params_dtype=dt)),
    ("lnl-rmsnorm-nobias", lambda dt: lt.LayerNormLinear(64, 48, bias=False,
                                                          normalization="RMSNorm",
                                                          params_dtype=dt)),
    ("mlp-gelu", lambda dt: lt.LayerNormMLP(64, 96, params_dtype=dt)),
    ("mlp-swiglu-rmsnorm", lambda dt: lt.LayerNormMLP(64, 96, activation="swiglu",
                                                       normalization="RMSNorm", params_dtype=dt)),
    ("mlp-srelu-nobias", lambda dt: lt.LayerNormMLP(64, 96, bias=False, activation="srelu",
                                                     params_dtype=dt)),
]


@pytest.mark.parametrize("name,make", MODULES, ids=[n for n, _ in MODULES])
def test_high_precision_vs_fp64(name, make):
    m = make(torch.float32)
    randomize(m)
    x = torch.randn(2, 7, 64)  # 3-D, tokens off 16: fine in high precision
    x64, P, y64 = reference(m, x)
    dy = torch.randn(y64.shape)
    y64.backward(dy.double())
    y, dx, grads = run(m, x, dy)
    # fp32 accumulation and rounding throughout: ~1e-6 normwise.
    assert rel(y, y64) < 1e-5
    assert rel(dx, x64.grad) < 1e-5
    assert set(grads) == set(P)
    for n in P:
        assert rel(grads[n], P[n].grad) < 1e-5, n


@pytest.mark.parametrize("kind", RECIPES)
@pytest.mark.parametrize("name,make", MODULES[:3], ids=[n for n, _ in MODULES[:3]])
def test_fp8_close_to_fp64_and_bf16(name, make, kind):
    # Bound as for Linear (test_torch_linear.test_fp8_close_to_nn_linear): E4M3 operands give
    # ~0.05 normwise per GEMM, E5M2 dy ~0.1; the MLP chains two GEMMs (fc2's dgrad feeds fc1):
    # 0.2. A wrong operand or scale would be O(1).
    for dtype in (torch.float32, torch.bfloat16):
        m = make(dtype)
        randomize(m)
        x = torch.randn(32, 64, dtype=dtype)
        x64, P, y64 = reference(m, x)
        dy = torch.randn(y64.shape, dtype=dtype)
        y64.backward(dy.double())
        y, dx, grads = run(m, x, dy, kind)
        assert y.dtype == dtype
        assert rel(y, y64) < 0.2
        assert rel(dx, x64.grad) < 0.2
        for n in P:
            assert rel(grads[n], P[n].grad) < 0.2, n


@pytest.mark.parametrize("kind", (None,) + RECIPES)
def test_bitwise_equal_to_numpy_path(kind):
    torch.manual_seed(12)
    lnl, mlp = lt.LayerNormLinear(64, 48), lt.LayerNormMLP(64, 96, activation="geglu")
    randomize(lnl)
    randomize(mlp)
    x = torch.randn(32, 64)
    dy1, dy2 = torch.randn(32, 48), torch.randn(32, 64)
    y1, dx1, g1 = run(lnl, x, dy1, kind)
    y2, dx2, g2 = run(mlp, x, dy2, kind)
    n = lambda t: t.detach().numpy()  # noqa: E731
    with libte.Context("cpu") as ctx:
        a = libte.LayerNormLinear(ctx, 64, 48)
        b = libte.LayerNormMLP(ctx, 64, 96, activation="geglu")
        scope = libte.autocast(ctx, enabled=kind is not None,
                               recipe=libte.Recipe(kind=kind or "delayed"))
        with scope:
            ya, bwa = a.forward(n(x), n(lnl.layer_norm_weight), n(lnl.layer_norm_bias),
                                n(lnl.weight), n(lnl.bias))
            yb, bwb = b.forward(n(x), n(mlp.layer_norm_weight), n(mlp.layer_norm_bias),
                                n(mlp.fc1_weight), n(mlp.fc1_bias), n(mlp.fc2_weight),
                                n(mlp.fc2_bias))
        ga = bwa.backward(n(dy1), once=True)
        gb = bwb.backward(n(dy2), once=True)
    assert np.array_equal(n(y1), ya) and np.array_equal(n(y2), yb)
    assert np.array_equal(n(dx1), ga.dx) and np.array_equal(n(dx2), gb.dx)
    for ours, theirs in ((g1["layer_norm_weight"], ga.dln_weight), (g1["layer_norm_bias"],
                         ga.dln_bias), (g1["weight"], ga.dw), (g1["bias"], ga.db),
                         (g2["fc1_weight"], gb.dfc1_weight), (g2["fc2_weight"], gb.dfc2_weight),
                         (g2["fc1_bias"], gb.dfc1_bias), (g2["layer_norm_weight"],
                                                          gb.dln_weight)):
        assert np.array_equal(n(ours), theirs)


def test_retain_graph_and_release():
    m = lt.LayerNormMLP(32, 64)
    x = torch.randn(16, 32, requires_grad=True)
    y = m(x)  # high precision too keeps a record here
    y.sum().backward(retain_graph=True)
    with pytest.raises(libte.InvalidState, match="retain_residuals"):
        y.sum().backward()
    m.zero_grad()
    with lt.autocast(recipe=libte.Recipe(kind="current")), lt.retain_residuals():
        y = m(x)
    y.sum().backward(retain_graph=True)
    g = m.fc1_weight.grad.clone()
    y.sum().backward()
    assert torch.equal(m.fc1_weight.grad, g + g)


def test_errors():
    with pytest.raises(libte.InvalidArgument, match="activation"):
        lt.LayerNormMLP(32, 64, activation="tanh")
    with pytest.raises(libte.InvalidArgument, match="normalization"):
        lt.LayerNormLinear(32, 32, normalization="BatchNorm")
    m = lt.LayerNormLinear(32, 32)
    with pytest.raises(libte.InvalidArgument, match="'input'.*dtype"):
        m(torch.randn(16, 32, dtype=torch.bfloat16))
    with lt.autocast():
        with pytest.raises(libte.Unsupported, match="multiple of 16"):
            m(torch.randn(10, 32))


def _model():
    torch.manual_seed(13)
    return torch.nn.Sequential(lt.LayerNormLinear(32, 32), lt.LayerNormMLP(32, 64),
                               lt.Linear(32, 32))


def _train(model, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen)
        with lt.autocast(recipe=lt.DelayedScaling(amax_history_len=4)):
            y = model(x)
        loss = y.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_state_dict_resumes_bit_for_bit():
    a = _model()
    _train(a, 3, seed=1)
    b = _model()
    with torch.no_grad():
        for p in b.parameters():
            p.zero_()
    b.load_state_dict(a.state_dict())
    assert _train(a, 2, seed=2) == _train(b, 2, seed=2)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(libte.InvalidArgument, match="another module kind"):
        a[0].set_extra_state(a[1].get_extra_state())


def test_compile_fullgraph_bitwise():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager, comp = _model(), _model()
    compiled = torch.compile(comp, fullgraph=True, backend="aot_eager")
    x = torch.randn(16, 32)
    dy = torch.randn(16, 32)
    for kind in (None, "delayed", "block"):
        ye, dxe, ge = run(eager, x, dy, kind)
        yc, dxc, gc = run(compiled, x, dy, kind)
        assert torch.equal(ye, yc) and torch.equal(dxe, dxc)
        for n in ge:
            assert torch.equal(ge[n], gc["_orig_mod." + n] if "_orig_mod." + n in gc
                               else gc[n]), n
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
    torch._dynamo.reset()
