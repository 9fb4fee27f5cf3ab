#!/usr/bin/env python3
"""libte's GPU benchmarks beside PyTorch's peers, measured in the same run, as one table.

    python3 bench/python/compare_torch.py build/release/bench/te_bench_gpu [--json out.json]

Runs te_bench_gpu (which prints JSON), then times PyTorch on the same shapes with CUDA events:
a device copy (the bandwidth ceiling), eager amax+scale+cast+transpose, torch._scaled_mm (E4M3,
per-tensor scales, BF16 out, fast accumulation like libte's fprop), a BF16 torch.matmul, and
nn.Linear BF16 forward+backward; then prints each libte number beside its peer and the issue's
target. Inputs are random, never zeros.
"""
import argparse
import json
import subprocess
import sys
import time


def cuda_time(torch, fn, iters=20, warmup=3):
    """Median milliseconds per call over 5 repetitions of `iters` calls (CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    times.sort()
    return times[len(times) // 2]


def torch_numbers(torch):
    out = {}
    dev = "cuda"
    for rows, cols in ((16384, 4096), (16384, 14336)):
        x = torch.randn(rows, cols, device=dev, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        ms = cuda_time(torch, lambda: y.copy_(x))
        out[f"copy_{rows}x{cols}"] = {"ms": ms, "TBps": 4 * x.numel() / (ms * 1e-3) / 1e12}

        def eager_cast():
            amax = x.abs().max().float()
            scale = 448.0 / amax
            q = (x.float() * scale).to(torch.float8_e4m3fn)
            return q, q.t().contiguous()

        ms = cuda_time(torch, eager_cast, iters=5)
        out[f"eager_cast_{rows}x{cols}"] = {"ms": ms, "TBps": 4 * x.numel() / (ms * 1e-3) / 1e12}

    for m, n, k in ((8192, 8192, 8192), (16384, 4096, 4096), (16384, 14336, 4096), (16384, 4096, 14336)):
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)
        ms = cuda_time(torch, lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                                       out_dtype=torch.bfloat16, use_fast_accum=True), iters=10)
        out[f"scaled_mm_{m}x{n}x{k}"] = {"ms": ms, "TFLOPs": 2 * m * n * k / (ms * 1e-3) / 1e12}
        a16 = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b16 = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        ms = cuda_time(torch, lambda: torch.matmul(a16, b16), iters=10)
        out[f"matmul_bf16_{m}x{n}x{k}"] = {"ms": ms, "TFLOPs": 2 * m * n * k / (ms * 1e-3) / 1e12}

    for tokens, fin, fout in ((16384, 4096, 14336), (16384, 4096, 4096)):
        lin = torch.nn.Linear(fin, fout, device=dev, dtype=torch.bfloat16)
        x = torch.randn(tokens, fin, device=dev, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(tokens, fout, device=dev, dtype=torch.bfloat16) * 1e-3

        def step():
            y = lin(x)
            y.backward(dy)

        ms = cuda_time(torch, step, iters=10)
        out[f"nn_linear_fwd_bwd_{tokens}x{fin}x{fout}"] = {"ms": ms}
        # Host time of the forward call inside an unsynchronised training loop, as libte's.
        torch.cuda.synchronize()
        host, steps = 0.0, 8
        for _ in range(steps):
            t0 = time.perf_counter()
            y = lin(x)
            host += time.perf_counter() - t0
            y.backward(dy)
        torch.cuda.synchronize()
        host /= steps
        out[f"nn_linear_host_forward_{tokens}x{fin}x{fout}"] = {"us_per_call": host * 1e6}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("te_bench_gpu")
    ap.add_argument("--json", help="also write all numbers here")
    args = ap.parse_args()

    te = json.loads(subprocess.run([args.te_bench_gpu], check=True, capture_output=True, text=True).stdout)
    if "skipped" in te:
        print("te_bench_gpu skipped:", te["skipped"])
        return 0
    try:
        import torch
    except ImportError:
        print(json.dumps(te, indent=2))
        print("PyTorch is not importable: libte's numbers only")
        return 0
    pt = torch_numbers(torch)

    rows = []
    for shape in ("16384x4096", "16384x14336"):
        c, peer, eager = te[f"cast_transpose_{shape}"], pt[f"copy_{shape}"], pt[f"eager_cast_{shape}"]
        rows.append((f"cast+transpose BF16 {shape}", f"{c['TBps']:.2f} TB/s", f"copy {peer['TBps']:.2f} TB/s; eager torch {eager['TBps']:.2f} TB/s",
                     f"{c['TBps'] / peer['TBps']:.2f}x copy", ">= 0.85x copy"))
    for shape in ("8192x8192x8192", "16384x4096x4096", "16384x14336x4096", "16384x4096x14336"):
        g, s, b = te[f"gemm_fp8_{shape}"], pt[f"scaled_mm_{shape}"], pt[f"matmul_bf16_{shape}"]
        rows.append((f"FP8 GEMM {shape}", f"{g['TFLOPs']:.0f} TFLOP/s", f"_scaled_mm {s['TFLOPs']:.0f}; bf16 matmul {b['TFLOPs']:.0f}",
                     f"{g['TFLOPs'] / s['TFLOPs']:.2f}x / {g['TFLOPs'] / b['TFLOPs']:.2f}x", ">= 1.0x / >= 1.8x"))
    for shape, target in (("16384x4096x14336", ">= 1.6x"), ("16384x4096x4096", ">= 1.4x")):
        l, n = te[f"linear_fwd_bwd_{shape}"], pt[f"nn_linear_fwd_bwd_{shape}"]
        rows.append((f"Linear fwd+bwd {shape}", f"{l['ms']:.3f} ms", f"nn.Linear bf16 {n['ms']:.3f} ms",
                     f"{n['ms'] / l['ms']:.2f}x faster", target))
        h, nh = te[f"host_linear_forward_{shape}"], pt[f"nn_linear_host_forward_{shape}"]
        rows.append((f"host time / forward call {shape}", f"{h['us_per_call']:.1f} us",
                     f"nn.Linear {nh['us_per_call']:.1f} us", f"{nh['us_per_call'] / h['us_per_call']:.2f}x less", "< nn.Linear"))

    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    header = ("benchmark", "libte", "peer (same run)", "ratio", "target")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(5)]
    for r in [header] + rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"libte": te, "torch": pt}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
