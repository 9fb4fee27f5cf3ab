#!/usr/bin/env python3
"""libte.torch.Linear, a torch.nn.Module, checked against torch.nn.Linear on the same
parameters: eager and torch.compile(fullgraph=True), high precision and FP8.

With autocast disabled the results must match to fp32 rounding; with FP8 (current scaling,
HYBRID) within FP8's error. Tensors reach libte zero-copy (their data pointers), on PyTorch's
current stream; forward and backward are the custom ops libte::linear_fwd / linear_bwd.

    LIBTE_PATH=build/release PYTHONPATH=bindings/python python3 examples/python/torch_linear.py [cpu|cuda]

The device defaults to the GPU when both PyTorch and libte can use one, else the CPU.
Exit 0 when every check passes (or, with a message, when PyTorch is not installed), 1 on a
mismatch, 2 on a bad argument.
"""

import sys

if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] not in ("cpu", "cuda")):
        sys.stderr.write("torch_linear.py: expected at most one argument, cpu or cuda; got %s\n\n%s"
                         % (" ".join(sys.argv[1:]), __doc__))
        sys.exit(2)

try:
    import torch
except ImportError:
    print("torch_linear.py: PyTorch is not installed; skipping")
    sys.exit(0)

import libte
import libte.torch as lt


def compare(name, got, want, rtol):
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    ok = err <= rtol
    print("  %-6s relative error %.3e (limit %.0e) %s" % (name, err, rtol, "ok" if ok else "FAIL"))
    return ok


def cuda_context_ok():
    try:
        libte.Context("cuda").close()
        return True
    except libte.Error:
        return False


def main():
    torch.manual_seed(0)
    # The GPU when both PyTorch and libte can use one (torch tensors reach libte through
    # their data pointers, zero-copy), else the CPU; argv[1] may force "cpu" or "cuda".
    device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() and cuda_context_ok() else "cpu")
    print("device:", device)
    tokens, fin, fout = 64, 128, 96
    ref = torch.nn.Linear(fin, fout).to(device)
    x = torch.randn(tokens, fin, device=device, requires_grad=True)
    dy = torch.randn(tokens, fout, device=device)
    y_ref = ref(x)
    y_ref.backward(dy)
    want = dict(y=y_ref.detach(), dx=x.grad.clone(), dw=ref.weight.grad.clone(),
                db=ref.bias.grad.clone())

    ok = True
    layer = lt.Linear(fin, fout, params_dtype=torch.float32, device=device)
    with torch.no_grad():
        layer.weight.copy_(ref.weight)
        layer.bias.copy_(ref.bias)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    for label, scope, tol in (
            ("high precision (autocast disabled)", lt.autocast(enabled=False), 1e-5),
            ("FP8 current scaling, HYBRID", lt.autocast(recipe=lt.Float8CurrentScaling()), 0.15)):
        for how, model in (("eager", layer), ("torch.compile", compiled)):
            print("%s, %s" % (label, how))
            layer.zero_grad(set_to_none=True)
            xx = x.detach().clone().requires_grad_(True)
            with scope:
                y = model(xx)
            y.backward(dy)
            got = dict(y=y.detach(), dx=xx.grad, dw=layer.weight.grad, db=layer.bias.grad)
            for k in ("y", "dx", "dw", "db"):
                ok &= compare(k, got[k], want[k], tol if k != "db" else 1e-5)
    print("torch_linear: %s" % ("all checks passed" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
