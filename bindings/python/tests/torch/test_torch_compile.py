"""torch.compile(fullgraph=True) of models built from libte.torch modules: no graph breaks, and
bitwise the eager numbers (the libte ops are the same calls; the rest of the model uses ops
whose compiled form is exact: ReLU, sums), forward and backward, for every autocast mode."""

import pytest

torch = pytest.importorskip("torch")

import libte  # noqa: E402
import libte.torch as lt  # noqa: E402

MODES = (None, "delayed", "current", "block")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = lt.Linear(32, 64)
        self.fc2 = lt.Linear(64, 32, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) + x


def make(seed=0):
    torch.manual_seed(seed)
    return Block()


def step(model, x, kind):
    """One forward (under the mode) and backward; (y, dx, parameter grads)."""
    x = x.clone().requires_grad_()
    if kind is None:
        y = model(x)
    else:
        with lt.autocast(recipe=libte.Recipe(kind=kind)):
            y = model(x)
    (y * y).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return y.detach(), x.grad, grads


def assert_same(a, b):
    ya, dxa, ga = a
    yb, dxb, gb = b
    assert torch.equal(ya, yb)
    assert torch.equal(dxa, dxb)
    assert len(ga) == len(gb)
    for p, q in zip(ga, gb):
        assert torch.equal(p, q)


def graph_breaks():
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def test_aot_eager_fullgraph_every_mode_bitwise():
    eager, comp = make(), make()
    compiled = torch.compile(comp, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 16, 32)
    # Each mode twice (the second call reuses the graph); modes switch under the guards.
    for kind in MODES + MODES[::-1]:
        assert_same(step(eager, x, kind), step(compiled, x, kind))
    assert graph_breaks() == 0
    # One graph per mode, none recompiled for the repeats.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == len(MODES)


def test_explain_reports_no_graph_break():
    model = make()
    x = torch.randn(16, 32)
    with lt.autocast(recipe=libte.Recipe(kind="current")):
        explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1


def test_delayed_scaling_state_evolves_identically():
    """Several delayed-scaling steps (the scales update at each autocast exit): the compiled
    and eager models stay bitwise equal, and so do their FP8 states."""
    eager, comp = make(), make()
    compiled = torch.compile(comp, fullgraph=True, backend="aot_eager")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.01)
    opt_c = torch.optim.SGD(comp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(3)
    ac = lt.autocast(recipe=lt.DelayedScaling(amax_history_len=8))
    for _ in range(4):
        x = torch.randn(16, 32, generator=gen) * 3
        for model, opt in ((eager, opt_e), (compiled, opt_c)):
            with ac:
                y = model(x)
            opt.zero_grad()
            y.square().mean().backward()
            opt.step()
    for p, q in zip(eager.parameters(), comp.parameters()):
        assert torch.equal(p, q)
    assert eager.fc1.get_extra_state().tolist() == comp.fc1.get_extra_state().tolist()
    assert graph_breaks() == 0


def test_inductor_fullgraph_bitwise():
    eager, comp = make(), make()
    compiled = torch.compile(comp, fullgraph=True)  # the default backend, inductor
    x = torch.randn(16, 32)
    for kind in ("current", None):
        assert_same(step(eager, x, kind), step(compiled, x, kind))
    assert graph_breaks() == 0


def test_autocast_inside_compiled_function_is_a_clear_error():
    model = make()

    def f(x):
        with lt.autocast():
            return model(x)

    with pytest.raises(Exception, match="around the compiled call"):
        torch.compile(f, fullgraph=True, backend="aot_eager")(torch.randn(16, 32))


def test_compiled_errors_are_libte_errors():
    compiled = torch.compile(make(), fullgraph=True, backend="aot_eager")
    with lt.autocast():
        with pytest.raises(Exception, match="multiple of 16"):
            compiled(torch.randn(10, 32))
    with pytest.raises(Exception, match="expected dtype"):
        compiled(torch.randn(16, 32, dtype=torch.bfloat16))


def test_token_counts_specialise():
    """The residual size comes from concrete shapes: a new token count is a new graph (dynamo's
    automatic dynamic shapes are specialised back by the fake impl), never an error."""
    eager, comp = make(), make()
    compiled = torch.compile(comp, fullgraph=True, backend="aot_eager")
    for n in (16, 32, 48):
        x = torch.randn(n, 32)
        assert_same(step(eager, x, "current"), step(compiled, x, "current"))
    assert graph_breaks() == 0
