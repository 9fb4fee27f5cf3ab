#!/usr/bin/env python3
"""libte.torch on a CUDA GPU: CUDA tensors (zero copy, PyTorch's current stream), numerics of
every module and recipe against fp64, torch.compile(fullgraph=True) bitwise equal to eager,
and a whole training step (forward under autocast, backward, optimizer step) captured in a CUDA
graph and replayed, against the same steps run eagerly.

    LIBTE_PATH=build/release PYTHONPATH=bindings/python \\
        python3 -m pytest -q bindings/python/tests/gpu/test_torch_gpu.py
    # or: python3 bindings/python/tests/gpu/test_torch_gpu.py

Skipped without PyTorch, without a CUDA device, or with a libte built without CUDA. Not collected
by the CPU suite (tests/conftest.py ignores this directory); name the file to run it.
"""

import os
import sys

import pytest

torch = pytest.importorskip("torch")

import libte  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch", allow_module_level=True)
try:
    libte.Context("cuda").close()
except libte.Error as e:
    pytest.skip("libte cannot use CUDA here: %s" % e, allow_module_level=True)

import libte.torch as lt  # noqa: E402

F = torch.nn.functional
DEV = torch.device("cuda", torch.cuda.current_device())
RECIPES = ("delayed", "current", "block")


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def recipe(kind):
    return libte.Recipe(kind=kind)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


# ---- eager numerics -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", (None,) + RECIPES)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_linear_cuda_vs_fp64(kind, dtype):
    torch.manual_seed(0)
    m = lt.Linear(256, 128, params_dtype=dtype, device=DEV)
    with torch.no_grad():
        m.bias.normal_()
    x = torch.randn(4, 64, 256, dtype=dtype, device=DEV, requires_grad=True)
    dy = torch.randn(4, 64, 128, dtype=dtype, device=DEV)
    if kind is None:
        y = m(x)
    else:
        with lt.autocast(recipe=recipe(kind)):
            y = m(x)
    y.backward(dy)
    assert y.device == DEV and y.dtype == dtype
    w64 = m.weight.detach().double().requires_grad_()
    b64 = m.bias.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y64 = F.linear(x64, w64, b64)
    y64.backward(dy.double())
    # High precision: fp32 accumulation, one rounding to the output dtype (bf16: 2^-8; fp32 on
    # tensor cores may use TF32 for inputs only if torch's flags allow: libte does not: 1e-5).
    # FP8: E4M3 operands ~0.05 normwise per GEMM, E5M2 dy ~0.1 (see the CPU suite).
    tol = (1e-2 if dtype == torch.bfloat16 else 1e-5) if kind is None else 0.15
    assert rel(y, y64) < tol
    assert rel(x.grad, x64.grad) < tol
    assert rel(m.weight.grad, w64.grad) < tol
    assert rel(m.bias.grad, b64.grad) < 1e-2


@pytest.mark.parametrize("kind", (None,) + RECIPES)
def test_layernorm_modules_cuda(kind):
    torch.manual_seed(1)
    lnl = lt.LayerNormLinear(256, 128, params_dtype=torch.bfloat16, device=DEV)
    mlp = lt.LayerNormMLP(128, 512, activation="swiglu", params_dtype=torch.bfloat16,
                          device=DEV)
    x = torch.randn(128, 256, dtype=torch.bfloat16, device=DEV, requires_grad=True)
    if kind is None:
        y = mlp(lnl(x))
    else:
        with lt.autocast(recipe=recipe(kind)):
            y = mlp(lnl(x))
    # A sum, not a mean: dy must be O(1). Delayed scaling's first step has no amax history
    # and casts with scale 1, where a mean's dy (~1e-7 here) would flush to zero in E5M2.
    y.float().square().sum().backward()

    def ref(x64, P):
        h = F.layer_norm(x64, (256,), P["0.layer_norm_weight"], P["0.layer_norm_bias"], 1e-5)
        h = F.linear(h, P["0.weight"], P["0.bias"])
        h2 = F.layer_norm(h, (128,), P["1.layer_norm_weight"], P["1.layer_norm_bias"], 1e-5)
        a = F.linear(h2, P["1.fc1_weight"], P["1.fc1_bias"])
        a = F.silu(a[:, :512]) * a[:, 512:]
        return F.linear(a, P["1.fc2_weight"], P["1.fc2_bias"])

    seq = torch.nn.Sequential(lnl, mlp)
    P = {n: p.detach().double().requires_grad_() for n, p in seq.named_parameters()}
    x64 = x.detach().double().requires_grad_()
    y64 = ref(x64, P)
    y64.square().sum().backward()
    tol = 2e-2 if kind is None else 0.25  # bf16 rounding of every intermediate / FP8, 3 GEMMs
    assert rel(y, y64) < tol
    assert rel(x.grad, x64.grad) < tol
    for n, p in seq.named_parameters():
        assert rel(p.grad, P[n].grad) < tol, n


@pytest.mark.parametrize("kind", (None,) + RECIPES)
def test_grouped_linear_cuda(kind):
    torch.manual_seed(6)
    splits = [64, 0, 128]
    m = lt.GroupedLinear(3, 256, 128, params_dtype=torch.bfloat16, device=DEV)
    x = torch.randn(192, 256, dtype=torch.bfloat16, device=DEV, requires_grad=True)
    dy = torch.randn(192, 128, dtype=torch.bfloat16, device=DEV)
    if kind is None:
        y = m(x, splits)
    else:
        with lt.autocast(recipe=recipe(kind)):
            y = m(x, splits)
    y.backward(dy)
    ws = [w.detach().double().requires_grad_() for w in m._weights()]
    bs = [b.detach().double().requires_grad_() for b in m._biases()]
    x64 = x.detach().double().requires_grad_()
    y64 = torch.cat([F.linear(p, w, b) for p, w, b in zip(torch.split(x64, splits), ws, bs)])
    y64.backward(dy.double())
    tol = 1e-2 if kind is None else 0.15
    assert rel(y, y64) < tol and rel(x.grad, x64.grad) < tol
    for i, (w, w64) in enumerate(zip(m._weights(), ws)):
        if splits[i]:
            assert rel(w.grad, w64.grad) < tol, i
        else:
            assert not w.grad.any(), i  # an expert without tokens: dW = 0


def test_follows_the_current_stream():
    torch.manual_seed(2)
    m = lt.Linear(128, 128, device=DEV)
    x = torch.randn(64, 128, device=DEV)
    with lt.autocast(recipe=recipe("current")):
        want = m(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with lt.autocast(recipe=recipe("current")):
            got = m(x)
        assert lt.context(DEV).stream == side.cuda_stream
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want)


# ---- torch.compile -----------------------------------------------------------------------------

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = lt.LayerNormLinear(128, 256)
        self.fc = lt.Linear(256, 128)
        self.mlp = lt.LayerNormMLP(128, 256)

    def forward(self, x):
        return self.mlp(self.fc(torch.relu(self.ln(x))) + x)


def _step(model, x, kind):
    x = x.clone().requires_grad_()
    if kind is None:
        y = model(x)
    else:
        with lt.autocast(recipe=recipe(kind)):
            y = model(x)
    y.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return [y.detach(), x.grad] + grads


@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
def test_compile_fullgraph_bitwise(backend):
    torch.manual_seed(3)
    eager = Block().to(DEV)
    comp = Block().to(DEV)
    comp.load_state_dict(eager.state_dict())
    compiled = torch.compile(comp, fullgraph=True, backend=backend)
    x = torch.randn(2, 64, 128, device=DEV)
    for kind in (None,) + RECIPES:
        for a, b in zip(_step(eager, x, kind), _step(compiled, x, kind)):
            assert torch.equal(a, b), kind
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0


# ---- CUDA graphs -------------------------------------------------------------------------------

def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(lt.LayerNormLinear(128, 256), torch.nn.ReLU(),
                               lt.Linear(256, 128), lt.LayerNormMLP(128, 256)).to(DEV)


@pytest.mark.parametrize("kind", ("current", "delayed"))
def test_cuda_graph_training_step(kind):
    """A whole step captured in one CUDA graph (torch.cuda.graph): forward inside
    libte.torch.autocast (so the scope's end - amax reduction, scale update - is captured),
    backward, SGD step. Replayed with new inputs copied into the static input, it must give the
    losses and parameters of the same steps run eagerly on a twin model."""
    rec = lt.DelayedScaling(amax_history_len=16) if kind == "delayed" \
        else lt.Float8CurrentScaling()
    graphed, eager = _model(4), _model(4)
    for p, q in zip(graphed.parameters(), eager.parameters()):
        assert torch.equal(p, q)
    opt_g = torch.optim.SGD(graphed.parameters(), lr=0.05)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    gen = torch.Generator(device=DEV).manual_seed(5)
    batches = [torch.randn(64, 128, device=DEV, generator=gen) for _ in range(8)]
    warmup, replays = 3, 5

    def step(model, opt, x):
        with lt.autocast(recipe=rec):
            y = model(x)
        loss = y.float().square().mean()
        loss.backward()
        opt.step()
        return loss

    static_x = torch.empty_like(batches[0])
    # Warm up on a side stream (as PyTorch requires before capture): allocations, the libte
    # layers, their FP8 weight caches and (delayed) non-empty amax histories all exist before
    # the capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(warmup):
            static_x.copy_(batches[i])
            opt_g.zero_grad(set_to_none=True)
            step(graphed, opt_g, static_x)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    opt_g.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = step(graphed, opt_g, static_x)

    losses_g = []
    for i in range(warmup, warmup + replays):
        static_x.copy_(batches[i])
        graph.replay()
        losses_g.append(static_loss.clone())
    torch.cuda.synchronize()

    losses_e = []
    for i in range(warmup + replays):
        opt_e.zero_grad(set_to_none=True)
        loss = step(eager, opt_e, batches[i])
        if i >= warmup:
            losses_e.append(loss.detach().clone())
    torch.cuda.synchronize()

    lg, le = torch.stack(losses_g), torch.stack(losses_e)
    assert torch.isfinite(lg).all()
    # The replayed kernels are the eager ones (same shapes, same libte calls, same cuBLASLt
    # choices): expect bitwise equality; the bound leaves room only for a different GEMM
    # algorithm under capture.
    torch.testing.assert_close(lg, le, rtol=1e-5, atol=1e-7)
    for (n, p), q in zip(graphed.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=n)
    # The FP8 state evolved identically too (delayed: histories and scales updated by the
    # captured scope ends on every replay).
    if kind == "delayed":
        for a, b in zip(graphed.modules(), eager.modules()):
            if hasattr(a, "te_layer") and a.te_layer is not None and isinstance(a, lt.Linear):
                for role in ("input", "weight", "grad_output"):
                    sa, sb = a.te_layer.scaling_state(role), b.te_layer.scaling_state(role)
                    assert abs(sa.scale - sb.scale) <= 1e-5 * abs(sb.scale), role


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider"]))
