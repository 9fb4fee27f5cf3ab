#!/usr/bin/env python3
"""A PyTorch autograd.Function over libte's Linear, split as PyTorch 2.x wants it:
`forward` calls forward_compute (pure compute), `setup_context` calls forward_save.

Checked against torch.nn.Linear on the same parameters: with autocast disabled the results must
match to fp32 rounding; with FP8 (current scaling) within FP8's error. Tensors cross over DLPack
with no copy (CPU tensors here; CUDA tensors once libte's CUDA backend exists).

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


class TELinearFunction(torch.autograd.Function):
    """y = x W^T + b through a libte.Linear. The FP8 decision is the libte autocast scope that
    is open on the layer's context while forward runs."""

    @staticmethod
    def forward(x, weight, bias, layer):
        x = x.contiguous()
        y = torch.empty(x.shape[:-1] + (layer.out_features,), dtype=x.dtype, device=x.device)
        _, residuals = layer.forward_compute(x.detach(), weight.detach(), bias.detach(),
                                             out=y)
        return y, residuals

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, layer = inputs
        _, residuals = output
        ctx.layer = layer
        ctx.bwd = layer.forward_save(residuals)  # the context-saving step
        ctx.keep = (x, weight)  # high-precision residuals alias them

    @staticmethod
    def backward(ctx, dy, _dres):
        layer = ctx.layer
        dy = dy.contiguous()
        x, weight = ctx.keep
        dx = torch.empty_like(x)
        dw = torch.empty_like(weight)
        db = torch.empty(layer.out_features, dtype=dy.dtype, device=dy.device)
        ctx.bwd.backward(dy, dx=dx, dw=dw, db=db, once=True)
        ctx.bwd.close()
        return dx, dw, db, None


def te_linear(x, weight, bias, layer):
    y, _ = TELinearFunction.apply(x, weight, bias, layer)
    return y


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
    # DLPack, zero-copy), else the CPU; argv[1] may force "cpu" or "cuda".
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
    with libte.Context(device) as ctx:
        layer = libte.Linear(ctx, fin, fout, dtype="float32")
        for label, scope, tol in (
                ("high precision (autocast disabled)", libte.autocast(ctx, enabled=False), 1e-5),
                ("FP8 current scaling, HYBRID",
                 libte.autocast(ctx, recipe=libte.Recipe(kind="current")), 0.15)):
            print(label)
            w = ref.weight.detach().clone().requires_grad_(True)
            b = ref.bias.detach().clone().requires_grad_(True)
            xx = x.detach().clone().requires_grad_(True)
            with scope:
                y = te_linear(xx, w, b, layer)
            y.backward(dy)
            got = dict(y=y.detach(), dx=xx.grad, dw=w.grad, db=b.grad)
            for k in ("y", "dx", "dw", "db"):
                ok &= compare(k, got[k], want[k], tol if k != "db" else 1e-5)
    print("torch_linear: %s" % ("all checks passed" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
