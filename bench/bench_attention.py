#!/usr/bin/env python3
"""Causal GQA attention: libte (BF16, FP8) against PyTorch's SDPA backends, forward and
forward+backward, as JSON lines.

    LIBTE_PATH=build/release PYTHONPATH=bindings/python python3 bench/bench_attention.py
    python3 bench/bench_attention.py --smoke          # tiny shapes, runs on the CPU too

Default shape (the GPU target): batch 4, seq 4096 and 8192, 32 query heads, 8 kv heads,
head_dim 128, causal (top-left), BF16, bshd layout, random normal data. Measured per seq:

  libte_bf16       libte.torch.DotProductAttention (eager: the custom ops, autograd)
  libte_bf16_c     the C calls alone (te_attention_forward_compute_into / backward_from on
                   preallocated tensors: no autograd, no Python module)
  libte_fp8        the same module with fp8_dpa=True under libte.torch.autocast(DelayedScaling)
                   (the autocast scope, with its scale update, entered every iteration)
  torch_<backend>  torch.nn.functional.scaled_dot_product_attention under
                   torch.nn.attention.sdpa_kernel(<backend>) for flash, cudnn, efficient (and
                   math with --math); enable_gqa=True, or, where a backend refuses GQA, k and v
                   expanded to 32 heads beforehand (kv_expanded: true, not timed)

Timing: CUDA events around each iteration (time.perf_counter on the CPU), --warmup iterations
first, the median of --iters. TFLOP/s with causal FLOPs: fwd = 2*b*h*s*s*d (half of the full
4*b*h*s^2*d), bwd = 2.5 x fwd, fwd+bwd = 3.5 x fwd. Each seq ends with a summary line: the best
torch backend and the ratios libte_bf16 / torch_best (TFLOP/s, fwd and fwd+bwd) and
libte_fp8 / libte_bf16. libte's output is checked against torch's (max_abs_diff, rel_err on the
summary line): a fast wrong kernel would show there.
"""

import argparse
import json
import statistics
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true",
                   help="tiny preset (batch 1, seq 64 and 128, 4/2 heads, head_dim 32, 5 iters): "
                        "checks the script, on the CPU if there is no GPU")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seqs", type=int, nargs="+", default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--math", action="store_true", help="time SDPA's math backend too")
    p.add_argument("--skip", nargs="*", default=[],
                   help="implementations to leave out (libte_bf16, libte_bf16_c, libte_fp8, "
                        "torch_flash, torch_cudnn, torch_efficient, torch_math)")
    a = p.parse_args()
    full = dict(batch=4, seqs=[4096, 8192], heads=32, kv_heads=8, head_dim=128, warmup=5,
                iters=20)
    smoke = dict(batch=1, seqs=[64, 128], heads=4, kv_heads=2, head_dim=32, warmup=2, iters=5)
    preset = smoke if a.smoke else full
    for k, v in preset.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return a


def sig(x, digits=4):
    """x to `digits` significant digits (TFLOP/s of tiny smoke shapes are not 0.0)."""
    return float("%.*g" % (digits, x))


def emit(**fields):
    print(json.dumps(fields), flush=True)


class Timer:
    def __init__(self, device, warmup, iters):
        import torch
        self.torch = torch
        self.cuda = device.type == "cuda"
        self.warmup, self.iters = warmup, iters

    def __call__(self, fn):
        """Median milliseconds of fn()."""
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        if self.cuda:
            torch.cuda.synchronize()
            events = []
            for _ in range(self.iters):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                events.append((s, e))
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in events]
        else:
            times = []
            for _ in range(self.iters):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def main():
    a = parse()
    import torch
    import libte
    import libte.torch as lt
    from libte import _constants as C
    from libte._lowlevel import ll
    from libte.torch import _runtime as rt

    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    F = torch.nn.functional
    timer = Timer(device, a.warmup, a.iters)
    b, h, hk, d = a.batch, a.heads, a.kv_heads, a.head_dim
    dt = torch.bfloat16
    emit(bench="attention", event="config", device=str(device),
         device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
         torch=torch.__version__, libte=libte.version(), backend=libte.BACKEND, batch=b,
         seqs=a.seqs, heads=h, kv_heads=hk, head_dim=d, dtype="bfloat16", mask="causal",
         warmup=a.warmup, iters=a.iters)

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backends = [("flash", SDPBackend.FLASH_ATTENTION),
                    ("cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None)),
                    ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
        if a.math or device.type == "cpu":
            backends.append(("math", SDPBackend.MATH))
    except ImportError:  # pragma: no cover - torch < 2.3
        sdpa_kernel, backends = None, []

    for s in a.seqs:
        fwd_flops = 2.0 * b * h * s * s * d
        flops = {"fwd": fwd_flops, "fwd_bwd": 3.5 * fwd_flops}
        g = torch.Generator(device=device).manual_seed(s)
        q = torch.randn(b, s, h, d, generator=g, device=device, dtype=dt).requires_grad_()
        k = torch.randn(b, s, hk, d, generator=g, device=device, dtype=dt).requires_grad_()
        v = torch.randn(b, s, hk, d, generator=g, device=device, dtype=dt).requires_grad_()
        dy = torch.randn(b, s, h * d, generator=g, device=device, dtype=dt)
        results = {}   # impl -> {pass: tflops}
        outputs = {}

        def record(impl, pas, ms, **extra):
            tf = flops[pas] / (ms * 1e-3) / 1e12
            results.setdefault(impl, {})[pas] = tf
            emit(bench="attention", seq=s, impl=impl, **{"pass": pas}, ms=sig(ms),
                 tflops=sig(tf), **extra)

        def skipped(impl, reason):
            emit(bench="attention", seq=s, impl=impl, skipped=str(reason)[:300])

        def train(fn, inputs):
            def step():
                for t in inputs:
                    t.grad = None
                fn().backward(dy)
            return step

        def run(impl, fwd, inputs, **extra):
            if impl in a.skip:
                return
            try:
                with torch.no_grad():
                    outputs[impl] = fwd().detach()
                    record(impl, "fwd", timer(fwd), **extra)
                record(impl, "fwd_bwd", timer(train(fwd, inputs)), **extra)
            except Exception as e:  # a backend that cannot run this shape: say so, go on
                skipped(impl, "%s: %s" % (type(e).__name__, e))
            if device.type == "cuda":
                torch.cuda.empty_cache()

        # libte BF16, the module (eager).
        m = lt.DotProductAttention(h, d, num_gqa_groups=hk, qkv_format="bshd",
                                   attn_mask_type="causal")
        run("libte_bf16", lambda: m(q, k, v), (q, k, v))

        # libte BF16, the C calls alone.
        if "libte_bf16_c" not in a.skip:
            try:
                cw, hd = m._native(q)
                rt.sync_scopes(cw, 0)
                cw.follow_stream(device)
                code = C.DTYPE_BF16
                qd, kd, vd = (rt.desc(t, code) for t in (q, k, v))
                o = torch.empty_like(q)
                n = ll.attention_residuals_size(cw.h, hd, qd, kd, vd, None, None, 0, 0)
                res = torch.empty(n, dtype=torch.uint8, device=device)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                do = dy.view(b, s, h, d)
                od, rp = rt.desc(o, code), res.data_ptr()
                grads = (rt.desc(dq, code), rt.desc(dk, code), rt.desc(dv, code))

                def c_fwd():
                    ll.attention_forward_compute_into(cw.h, hd, qd, kd, vd, None, None, 0, 0,
                                                      od, rp, n)

                def c_fwd_bwd():
                    c_fwd()
                    ll.attention_backward_from(cw.h, hd, qd, kd, vd, None, None, 0, 0, od, rp,
                                               n, rt.desc(do, code), *grads, False)
                record("libte_bf16_c", "fwd", timer(c_fwd))
                record("libte_bf16_c", "fwd_bwd", timer(c_fwd_bwd))
                del o, res, dq, dk, dv
            except Exception as e:
                skipped("libte_bf16_c", "%s: %s" % (type(e).__name__, e))

        # libte FP8 (fp8_dpa) under delayed scaling.
        m8 = lt.DotProductAttention(h, d, num_gqa_groups=hk, qkv_format="bshd",
                                    attn_mask_type="causal", fp8_dpa=True)
        recipe = lt.DelayedScaling()

        def fp8_fwd():
            with lt.autocast(recipe=recipe):
                return m8(q, k, v)
        run("libte_fp8", fp8_fwd, (q, k, v), recipe="delayed")

        # torch SDPA, each backend.
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        ke = ve = None
        for name, be in backends:
            impl = "torch_" + name
            if impl in a.skip:
                continue
            if be is None:
                skipped(impl, "this PyTorch has no SDPBackend for it")
                continue

            def sdpa(kk, vv, gqa, be=be):
                with sdpa_kernel([be]):
                    o = F.scaled_dot_product_attention(qt, kk, vv, is_causal=True,
                                                       enable_gqa=gqa)
                return o.transpose(1, 2).reshape(b, s, h * d)
            try:
                with torch.no_grad():
                    sdpa(kt, vt, hk != h)
                run(impl, lambda: sdpa(kt, vt, hk != h), (q, k, v), kv_expanded=False)
            except Exception as e:
                if hk == h:
                    skipped(impl, "%s: %s" % (type(e).__name__, e))
                    continue
                # This backend refuses GQA: expand k and v (outside the timing).
                if ke is None:
                    ke = k.detach().repeat_interleave(h // hk, dim=2).requires_grad_()
                    ve = v.detach().repeat_interleave(h // hk, dim=2).requires_grad_()
                kte, vte = ke.transpose(1, 2), ve.transpose(1, 2)
                run(impl, lambda: sdpa(kte, vte, False), (q, ke, ve), kv_expanded=True)

        # Summary.
        torch_impls = {k2: v2 for k2, v2 in results.items() if k2.startswith("torch_")}
        summary = dict(bench="attention", event="summary", seq=s)
        for pas in ("fwd", "fwd_bwd"):
            cands = [(r[pas], impl) for impl, r in torch_impls.items() if pas in r]
            best = max(cands) if cands else None
            summary["torch_best_" + pas] = best[1] if best else None
            summary["torch_best_%s_tflops" % pas] = sig(best[0]) if best else None
            lb = results.get("libte_bf16", {}).get(pas)
            lf = results.get("libte_fp8", {}).get(pas)
            summary["libte_bf16_over_torch_best_" + pas] = \
                round(lb / best[0], 3) if lb and best else None
            summary["libte_fp8_over_libte_bf16_" + pas] = round(lf / lb, 3) if lf and lb else None
        ref_impl = next((i for i in ("torch_flash", "torch_cudnn", "torch_efficient",
                                     "torch_math") if i in outputs), None)
        if ref_impl is not None:
            ref = outputs[ref_impl].float()
            for impl in ("libte_bf16", "libte_fp8"):
                if impl in outputs:
                    diff = outputs[impl].float() - ref
                    summary["%s_max_abs_diff_vs_%s" % (impl, ref_impl)] = \
                        round(diff.abs().max().item(), 5)
                    summary["%s_rel_err_vs_%s" % (impl, ref_impl)] = \
                        round((diff.norm() / ref.norm()).item(), 5)
        emit(**summary)
        del q, k, v, dy, ke, ve, outputs, m, m8
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
