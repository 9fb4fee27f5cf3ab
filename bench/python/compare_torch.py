#!/usr/bin/env python3
"""libte's GPU benchmarks beside PyTorch's peers, measured in the same run, as one table.

    python3 bench/python/compare_torch.py build/.../bench/te_bench_gpu [--lib-dir DIR] [--json out.json]

Runs te_bench_gpu (bench/gpu_bench.cpp, which prints JSON), then times PyTorch on the shapes that
program reported, with CUDA events (median of 5 repetitions after warm-up):

  cast+transpose    a device copy (the bandwidth ceiling) and eager amax+scale+cast+transpose
  FP8 GEMM          torch._scaled_mm (E4M3, per-tensor scales, BF16 out, fast accumulation like
                    libte's fprop) and a BF16 torch.matmul
  block FP8 GEMM    libte's block-scaled GEMMs (1x128 x 128x128, 1x128 x 1x128) beside
                    torch._scaled_mm with per-row / per-column scales (scale_a [m,1], scale_b [1,n],
                    fp32, fast accumulation): a rowwise GEMM, not the same scaling
  Linear fwd+bwd    one training step of Linear(in, out, bias) on BF16 activations: forward,
                    backward from a random dy, gradients of x, W and b (PyTorch's .grad set to
                    None before each step, as zero_grad does). Peers: nn.Linear BF16 eager and
                    torch.compile'd, and torchao float8 training (convert_to_float8_training) with
                    the tensorwise recipe (the default config) and the rowwise recipe, each under
                    torch.compile. libte runs delayed, current, block and bf16 (autocast off), with
                    the FP8 weight cast again every step (weight_unchanged = 0), as torchao does.
                    Issue 15's target: libte's step <= 0.85x torchao's, delayed and current
                    against tensorwise (per-tensor scales both), block against rowwise (finer
                    scales both); both ratios are printed.
  host time         the forward call's host time inside an unsynchronised training loop

If torchao cannot be imported, its peers say SKIPPED with the reason, loudly, and the rest runs.
Dry runs without a GPU: --libte-json FILE reads libte's numbers instead of running the program,
--peers-json FILE the peers' (an earlier --json file has both).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

TARGET = 0.85  # libte Linear step time / torchao float8 compiled step time, at most
# The torchao recipe each libte FP8 recipe is held against (the other one is printed too).
MATCHING_TORCHAO = {"delayed": "tensorwise", "current": "tensorwise", "block": "rowwise"}
TORCHAO_RECIPES = ("tensorwise", "rowwise")
COMPILED_PEER_NEEDS_S = 120  # a compiled peer is not started with less time than this left
EAGER_PEER_NEEDS_S = 20      # nor an eager one with less than this
DEVICE = "cuda"  # every peer's tensors (a module constant so that a dry run can point it at "cpu")


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


# ---- the shapes libte reported -------------------------------------------------------------------
def _dims(text):
    return tuple(int(v) for v in text.split("x"))


def shapes_of(te):
    """{"cast": [(rows, cols)], "gemm": [(m, n, k)], "block_gemm": [(key, (m, n, k))],
    "linear": [(tokens, in, out)]} from te_bench_gpu's keys, in the program's order."""
    s = {"cast": [], "gemm": [], "block_gemm": [], "linear": []}
    for key in te:
        if m := re.fullmatch(r"cast_transpose_(\d+x\d+)", key):
            s["cast"].append(_dims(m.group(1)))
        elif m := re.fullmatch(r"gemm_fp8_(\d+x\d+x\d+)", key):
            s["gemm"].append(_dims(m.group(1)))
        elif m := re.fullmatch(r"gemm_fp8_block_[0-9x_]+?_(\d+x\d+x\d+)", key):
            s["block_gemm"].append((key, _dims(m.group(1))))
        elif m := re.fullmatch(r"linear_fwd_bwd_[a-z0-9]+_(\d+x\d+x\d+)", key):
            if _dims(m.group(1)) not in s["linear"]:
                s["linear"].append(_dims(m.group(1)))
    return s


def shape_text(dims):
    return "x".join(str(d) for d in dims)


def block_label(key):
    """'gemm_fp8_block_1x128_128x128_MxNxK' -> '1x128 x 128x128'."""
    m = re.fullmatch(r"gemm_fp8_block_(\d+x\d+)_(\d+x\d+_)?\d+x\d+x\d+", key)
    if not m:
        return key
    a = m.group(1)
    return f"{a} x {(m.group(2) or a + '_')[:-1]}"


# ---- PyTorch peers -------------------------------------------------------------------------------
class Peers:
    """Measures one peer at a time into a dict, keeping what it has (errors are recorded, not fatal;
    peers are skipped when the time budget is nearly spent). compare_modules.py uses it too, with
    one dict per module (`into`)."""

    def __init__(self, torch, start, deadline_s, on_update):
        self.torch, self.start, self.deadline_s, self.on_update = torch, start, deadline_s, on_update
        self.out = {}

    def left_s(self):
        return self.deadline_s - (time.time() - self.start)

    def measure(self, key, build, flops=None, iters=10, compiled=False, into=None, label=None):
        torch = self.torch
        out = self.out if into is None else into
        label = label or key
        need = COMPILED_PEER_NEEDS_S if compiled else EAGER_PEER_NEEDS_S
        if self.left_s() < need:
            out[key] = {"skipped": f"time budget: {self.left_s():.0f} s left of --deadline-s {self.deadline_s:.0f}, "
                                   f"a {'compiled' if compiled else 'eager'} peer needs about {need} s"}
            print(f"SKIPPED {label}: {out[key]['skipped']}", flush=True)
            return
        step = None
        try:
            step, note = build()
            t0 = time.time()
            step()  # compiles, for the compiled peers
            torch.cuda.synchronize()
            first_s = time.time() - t0
            ms = cuda_time(torch, step, iters=iters, warmup=3)
            r = {"ms": ms, "first_call_s": first_s, "iters": iters}
            if flops:
                r["TFLOPs"] = flops / (ms * 1e-3) / 1e12
            r.update(note or {})
            out[key] = r
            print(f"{label}: {ms:.3f} ms" + (f" ({r['TFLOPs']:.0f} TFLOP/s)" if flops else "") +
                  f"; first call {first_s:.1f} s", flush=True)
        except Exception as e:  # a peer that cannot run is reported, not fatal
            out[key] = {"error": f"{type(e).__name__}: {e}"[:2000]}
            print(f"FAILED {label}: {out[key]['error']}", flush=True)
        finally:
            step = None
            torch.cuda.synchronize()
            if compiled:
                try:  # a fresh dynamo cache: the next shape must not be compiled as a dynamic one
                    torch._dynamo.reset()
                except Exception:
                    pass
            torch.cuda.empty_cache()
            self.on_update()


def import_torchao():
    """((Float8LinearConfig, convert_to_float8_training), version, None) or (None, None, reason)."""
    try:
        import torchao
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except Exception as e:
        return None, None, f"torchao is not importable: {type(e).__name__}: {e}"
    return (Float8LinearConfig, convert_to_float8_training), getattr(torchao, "__version__", "?"), None


def eager_peers(torch, peers, shapes):
    dev = DEVICE
    for rows, cols in shapes["cast"]:
        x = torch.randn(rows, cols, device=dev, dtype=torch.bfloat16)
        y = torch.empty_like(x)

        def build_copy():
            return (lambda: y.copy_(x)), None

        def build_cast():
            def eager_cast():
                amax = x.abs().max().float()
                scale = 448.0 / amax
                q = (x.float() * scale).to(torch.float8_e4m3fn)
                return q, q.t().contiguous()
            return eager_cast, None

        shape = f"{rows}x{cols}"
        for key, build, iters in ((f"copy_{shape}", build_copy, 20), (f"eager_cast_{shape}", build_cast, 5)):
            peers.measure(key, build, iters=iters)
            if "ms" in peers.out[key]:
                peers.out[key]["TBps"] = 4 * x.numel() / (peers.out[key]["ms"] * 1e-3) / 1e12
        del x, y

    for m, n, k in shapes["gemm"]:
        shape, flops = f"{m}x{n}x{k}", 2.0 * m * n * k
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)
        peers.measure(f"scaled_mm_{shape}", lambda: ((lambda: torch._scaled_mm(
            a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)), None), flops)
        del a, b
        a16 = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b16 = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        peers.measure(f"matmul_bf16_{shape}", lambda: ((lambda: torch.matmul(a16, b16)), None), flops)
        del a16, b16

    # Block-scaled GEMMs: PyTorch has no 1x128 / 128x128 GEMM; the nearest is _scaled_mm with one
    # scale per row of A and per column of B (rowwise, what torchao's rowwise recipe runs).
    for key, (m, n, k) in shapes["block_gemm"]:
        shape = f"{m}x{n}x{k}"
        if f"scaled_mm_rowwise_{shape}" in peers.out:
            continue
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
        sa = torch.rand(m, 1, device=dev, dtype=torch.float32) + 0.5
        sb = torch.rand(1, n, device=dev, dtype=torch.float32) + 0.5
        peers.measure(f"scaled_mm_rowwise_{shape}", lambda: ((lambda: torch._scaled_mm(
            a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=True)),
            {"scaling": "scale_a [m,1] fp32, scale_b [1,n] fp32, use_fast_accum"}), 2.0 * m * n * k)
        del a, b, sa, sb

    for tokens, fin, fout in shapes["linear"]:
        shape = f"{tokens}x{fin}x{fout}"
        lin = torch.nn.Linear(fin, fout, device=dev, dtype=torch.bfloat16)
        x = torch.randn(tokens, fin, device=dev, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(tokens, fout, device=dev, dtype=torch.bfloat16) * 1e-3

        def step():
            x.grad = None
            lin.weight.grad = lin.bias.grad = None
            lin(x).backward(dy)

        peers.measure(f"nn_linear_fwd_bwd_{shape}", lambda: (step, None), 6.0 * tokens * fin * fout)
        # Host time of the forward call inside an unsynchronised training loop, as libte's.
        torch.cuda.synchronize()
        host, steps = 0.0, 8
        for _ in range(steps):
            x.grad = None
            lin.weight.grad = lin.bias.grad = None
            t0 = time.perf_counter()
            y = lin(x)
            host += time.perf_counter() - t0
            y.backward(dy)
        torch.cuda.synchronize()
        peers.out[f"nn_linear_host_forward_{shape}"] = {"us_per_call": host / steps * 1e6}
        del lin, x, dy, y
        torch.cuda.empty_cache()


def to_float8(torchao_api, model, recipe):
    """torchao's float8 training conversion of model's nn.Linear layers ("tensorwise" is the default
    config); returns how many it converted."""
    config_cls, convert = torchao_api
    convert(model, config=config_cls.from_recipe_name(recipe))
    return sum(1 for mod in model.modules() if type(mod).__name__ == "Float8Linear")


def fwd_bwd_step(torch, run, model, tokens, fin, fout):
    """One training step of run (model, compiled or not) on BF16 x [tokens, fin] and dy [tokens, fout]:
    gradients cleared, forward, backward."""
    params = list(model.parameters())
    x = torch.randn(tokens, fin, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, fout, device=DEVICE, dtype=torch.bfloat16)

    def step():
        x.grad = None
        for p in params:
            p.grad = None
        run(x).backward(dy)

    return step


def compiled_linear_peers(torch, peers, shapes, torchao_api, torchao_skip, with_compile=True):
    """torchao float8 (tensorwise, rowwise) and BF16 nn.Linear, each torch.compile'd, per shape:
    the issue's targets first, BF16 compiled last (it is only context)."""
    nn = torch.nn

    def builder(tokens, fin, fout, recipe):
        def build():
            model = nn.Sequential(nn.Linear(fin, fout, bias=True)).to(DEVICE, torch.bfloat16)
            note = None
            if recipe is not None:
                n_fp8 = to_float8(torchao_api, model, recipe)
                if n_fp8 != 1:
                    raise RuntimeError(f"convert_to_float8_training converted {n_fp8} nn.Linear, not 1")
                note = {"recipe": recipe, "float8_linears": n_fp8}
            return fwd_bwd_step(torch, torch.compile(model), model, tokens, fin, fout), note
        return build

    plan = []
    for tokens, fin, fout in shapes["linear"]:
        for recipe in TORCHAO_RECIPES:
            plan.append((f"torchao_{recipe}_compiled_fwd_bwd_{tokens}x{fin}x{fout}", (tokens, fin, fout), recipe))
    for tokens, fin, fout in shapes["linear"]:
        plan.append((f"torch_compile_bf16_fwd_bwd_{tokens}x{fin}x{fout}", (tokens, fin, fout), None))
    for key, (tokens, fin, fout), recipe in plan:
        if not with_compile:
            peers.out[key] = {"skipped": "--no-compile"}
        elif recipe is not None and torchao_api is None:
            peers.out[key] = {"skipped": torchao_skip}
        else:
            peers.measure(key, builder(tokens, fin, fout, recipe), 6.0 * tokens * fin * fout, iters=10, compiled=True)


# ---- the table -----------------------------------------------------------------------------------
def ok(r):
    return isinstance(r, dict) and "ms" in r


def why_not(r):
    if r is None:
        return "not run"
    if "skipped" in r:
        return f"SKIPPED ({short(r['skipped'], 60)})"
    if "error" in r:
        return f"FAILED ({short(r['error'], 60)})"
    return "?"


def short(text, n=90):
    text = str(text)
    return text if len(text) <= n else text[: n - 3] + "..."


def fmt_ms(r, tflops=True):
    if not ok(r):
        return why_not(r)
    if tflops and "TFLOPs" in r:
        return f"{r['ms']:.3f} ms ({tflops_text(r['TFLOPs'])})"
    return f"{r['ms']:.3f} ms"


def tflops_text(tf):
    return f"{tf:.0f} TFLOP/s" if tf >= 10 else f"{tf:.3g} TFLOP/s"


def fmt_tflops(r):
    return tflops_text(r["TFLOPs"]) if ok(r) and "TFLOPs" in r else why_not(r)


def verdict(value, limit, at_least):
    return "met" if (value >= limit if at_least else value <= limit) else "not met"


def linear_rows(te, pt, tokens, fin, fout):
    shape = f"{tokens}x{fin}x{fout}"
    ao = {r: pt.get(f"torchao_{r}_compiled_fwd_bwd_{shape}") for r in TORCHAO_RECIPES}
    ao_cell = "; ".join(f"torchao {r} compiled {fmt_ms(ao[r])}" for r in TORCHAO_RECIPES)
    rows, problems = [], []
    for recipe in ("delayed", "current", "block"):
        label = f"Linear fwd+bwd {recipe} {tokens}x{fin}->{fout}"
        match = MATCHING_TORCHAO[recipe]
        target = f"<= {TARGET}x torchao {match}"
        lt = te.get(f"linear_fwd_bwd_{recipe}_{shape}")
        if not ok(lt):
            rows.append((label, why_not(lt), ao_cell, "-", target, "not measured (libte)"))
            if lt is not None and "error" in lt:
                problems.append(f"linear {recipe} {shape}: {lt['error']}")
            continue
        ratios = {r: lt["ms"] / ao[r]["ms"] for r in TORCHAO_RECIPES if ok(ao[r])}
        ratio = "; ".join(f"time {ratios[r]:.2f}x {r}" for r in TORCHAO_RECIPES if r in ratios) or "-"
        if match not in ratios:
            state = "not run" if ao[match] is None else "SKIPPED" if "skipped" in ao[match] else "FAILED"
            v = f"not measured (torchao {match} {state})"
        else:
            v = verdict(ratios[match], TARGET, False)
            best = max(ratios.values())  # libte against the faster torchao recipe
            if verdict(best, TARGET, False) != v:
                v += f"; against the faster torchao: {verdict(best, TARGET, False)}"
        rows.append((label, fmt_ms(lt), ao_cell, ratio, target, v))
        ao_cell = "(as above)"
    lt = te.get(f"linear_fwd_bwd_bf16_{shape}")
    c, e = pt.get(f"torch_compile_bf16_fwd_bwd_{shape}"), pt.get(f"nn_linear_fwd_bwd_{shape}")
    if lt is not None:
        ratio = "; ".join(f"time {lt['ms'] / p['ms']:.2f}x {n}" for p, n in ((c, "compiled"), (e, "eager")) if ok(p) and ok(lt))
        rows.append((f"Linear fwd+bwd bf16 (autocast off) {tokens}x{fin}->{fout}", fmt_ms(lt),
                     f"nn.Linear bf16 compiled {fmt_ms(c)}; eager {fmt_ms(e)}", ratio or "-", "report", "-"))
        if "error" in lt:
            problems.append(f"linear bf16 {shape}: {lt['error']}")
    return rows, problems


def build_rows(te, pt):
    """The table's rows (benchmark, libte, peers, ratio, target, verdict) and libte's problems."""
    rows, problems = [], []
    shapes = shapes_of(te)
    for rows_, cols in shapes["cast"]:
        shape = f"{rows_}x{cols}"
        c, peer, eager = te[f"cast_transpose_{shape}"], pt.get(f"copy_{shape}"), pt.get(f"eager_cast_{shape}")
        eager_cell = f"{eager['TBps']:.2f} TB/s" if ok(eager) else why_not(eager)
        if ok(peer):
            ratio = c["TBps"] / peer["TBps"]
            rows.append((f"cast+transpose BF16 {shape}", f"{c['TBps']:.2f} TB/s",
                         f"copy {peer['TBps']:.2f} TB/s; eager torch {eager_cell}", f"{ratio:.2f}x copy",
                         f">= {TARGET}x copy", verdict(ratio, TARGET, True)))
        else:
            rows.append((f"cast+transpose BF16 {shape}", f"{c['TBps']:.2f} TB/s", f"copy {why_not(peer)}", "-",
                         f">= {TARGET}x copy", "not measured"))
    for m, n, k in shapes["gemm"]:
        shape = f"{m}x{n}x{k}"
        g, s, b = te[f"gemm_fp8_{shape}"], pt.get(f"scaled_mm_{shape}"), pt.get(f"matmul_bf16_{shape}")
        ratios = [f"{g['TFLOPs'] / p['TFLOPs']:.2f}x" if ok(p) else "-" for p in (s, b)]
        v = "not measured"
        if ok(s) and ok(b):
            v = "met" if g["TFLOPs"] >= s["TFLOPs"] and g["TFLOPs"] >= 1.8 * b["TFLOPs"] else "not met"
        rows.append((f"FP8 GEMM per-tensor {shape}", fmt_tflops(g), f"_scaled_mm {fmt_tflops(s)}; bf16 matmul {fmt_tflops(b)}",
                     " / ".join(ratios), ">= 1.0x / >= 1.8x", v))
    for key, (m, n, k) in shapes["block_gemm"]:
        shape = f"{m}x{n}x{k}"
        g, s = te[key], pt.get(f"scaled_mm_rowwise_{shape}")
        rows.append((f"FP8 GEMM block {block_label(key)} {shape}", fmt_tflops(g),
                     f"rowwise _scaled_mm (not the same scaling) {fmt_tflops(s)}",
                     f"{g['TFLOPs'] / s['TFLOPs']:.2f}x" if ok(s) and ok(g) else "-", "report", "-"))
    for tokens, fin, fout in shapes["linear"]:
        shape = f"{tokens}x{fin}x{fout}"
        target = {"16384x4096x14336": 1.6, "16384x4096x4096": 1.4}.get(shape)
        lt, n = te.get(f"linear_fwd_bwd_{shape}"), pt.get(f"nn_linear_fwd_bwd_{shape}")
        if ok(lt):
            sp = n["ms"] / lt["ms"] if ok(n) else None
            rows.append((f"Linear fwd+bwd delayed vs eager bf16 {shape}", fmt_ms(lt), f"nn.Linear bf16 eager {fmt_ms(n)}",
                         f"{sp:.2f}x faster" if sp else "-", f">= {target}x" if target else "report",
                         verdict(sp, target, True) if sp and target else "-"))
        h, nh = te.get(f"host_linear_forward_{shape}"), pt.get(f"nn_linear_host_forward_{shape}")
        if h is not None:
            less = f"{nh['us_per_call'] / h['us_per_call']:.2f}x less" if nh else "-"
            rows.append((f"host time / forward call {shape}", f"{h['us_per_call']:.1f} us",
                         f"nn.Linear {nh['us_per_call']:.1f} us" if nh else "not run", less, "< nn.Linear",
                         verdict(nh["us_per_call"], h["us_per_call"], True) if nh else "-"))
        r, p = linear_rows(te, pt, tokens, fin, fout)
        rows += r
        problems += p
    return rows, problems


def print_table(rows):
    header = ("benchmark", "libte", "peers (same run)", "ratio (\"time\": libte time / peer time, else libte throughput / peer's)",
              "target", "verdict")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")


def loud(msg):
    bar = "=" * 78
    print(f"\n{bar}\n{msg}\n{bar}\n", flush=True)


# ---- main ----------------------------------------------------------------------------------------
def run_bench(cmd, lib_dir=None):
    """(JSON the benchmark program printed, its exit status); {"error": ...} when it printed none."""
    name = os.path.basename(cmd[0])
    env = dict(os.environ)
    if lib_dir:  # libte.so (and what it needs) for the program only, not for this Python process
        dirs = [os.path.abspath(d) for d in lib_dir.split(":") if d] + [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
        env["LD_LIBRARY_PATH"] = ":".join(dirs)
    print("running:", " ".join(cmd), flush=True)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    sys.stderr.write(p.stderr)
    print(f"{name}: exit status {p.returncode} after {time.time() - t0:.1f} s", flush=True)
    try:
        return json.loads(p.stdout), p.returncode
    except ValueError:
        tail = (p.stderr.strip().splitlines()[-1:] or [""])[0]
        if p.returncode == 77:  # the program's own "no CUDA device" line
            return {"error": tail}, p.returncode
        return {"error": f"{name} failed: exit status {p.returncode}, no JSON on stdout: {tail}"}, p.returncode


def new_record(build_info, json_path):
    """The run's JSON record and save(), which rewrites json_path (when given) with it; both
    comparison programs keep everything they have measured there, so a late failure loses nothing."""
    record = {"libte": None, "torch": {}, "env": {}}
    if build_info:
        with open(build_info) as f:
            record["libte_build"] = f.read()

    def save():
        if json_path:
            with open(json_path, "w") as f:
                json.dump(record, f, indent=2)

    return record, save


def load_peers_json(record, path):
    """The peers' numbers (and env) of an earlier run into record; returns its torchao skip reason."""
    with open(path) as f:
        loaded = json.load(f)
    record["torch"], record["env"] = loaded.get("torch", loaded), loaded.get("env", {})
    return record["env"].get("torchao_skipped")


def peer_torch(record, no_compile):
    """(torch, torchao_api, torchao_skip): torch is None, with the reason said loudly and kept in
    record["env"], when PyTorch or its CUDA is missing; torchao_skip is why torchao's peers cannot
    run (None when they can)."""
    try:
        import torch
    except ImportError as e:
        loud(f"SKIPPED: every PyTorch peer: PyTorch is not importable ({e})")
        record["env"]["torch_skipped"] = str(e)
        return None, None, None
    if not torch.cuda.is_available():
        loud("SKIPPED: every PyTorch peer: torch.cuda.is_available() is False")
        record["env"]["torch_skipped"] = "no CUDA device visible to PyTorch"
        return None, None, None
    record["env"].update({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda})
    torchao_api, ver, torchao_skip = (None, None, "--no-compile") if no_compile else import_torchao()
    if torchao_skip:
        loud(f"SKIPPED: torchao float8 peers: {torchao_skip}")
        record["env"]["torchao_skipped"] = torchao_skip
    else:
        record["env"]["torchao"] = ver
        if ver != "0.18.0":
            print(f"note: torchao {ver}, not 0.18.0", flush=True)
    print(f"GPU: {record['env']['gpu']}, torch {torch.__version__}, torchao {ver or 'SKIPPED'}", flush=True)
    return torch, torchao_api, torchao_skip


def main():
    start = time.time()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("te_bench_gpu", nargs="?", help="path of the te_bench_gpu program")
    ap.add_argument("--json", help="also write all numbers here (rewritten after each peer)")
    ap.add_argument("--quick", action="store_true", help="te_bench_gpu --quick (fewer shapes); the peers follow")
    ap.add_argument("--lib-dir", help="directories (':'-separated) put before LD_LIBRARY_PATH for te_bench_gpu only")
    ap.add_argument("--build-info", help="a file describing the build (commit, flags), copied into the JSON")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile and torchao peers")
    ap.add_argument("--deadline-s", type=float, default=540.0,
                    help=f"start no compiled peer with less than {COMPILED_PEER_NEEDS_S} s left of this many "
                         "seconds since this script started (default 540)")
    ap.add_argument("--libte-json", help="read libte's JSON from this file instead of running the program")
    ap.add_argument("--peers-json", help="read the peers' numbers from this file instead of measuring them")
    args = ap.parse_args()
    if not args.te_bench_gpu and not args.libte_json:
        ap.error("give the te_bench_gpu program or --libte-json")

    record, save = new_record(args.build_info, args.json)

    rc = 0
    if args.libte_json:
        with open(args.libte_json) as f:
            te = json.load(f)
        te = te.get("libte", te) if isinstance(te.get("libte"), dict) else te
    else:
        te, rc = run_bench([args.te_bench_gpu] + (["--quick"] if args.quick else []), args.lib_dir)
    record["libte"] = te
    save()
    if "error" in te:
        loud(f"libte FAILED: {te['error']}")
        return 1
    if "skipped" in te:
        print("te_bench_gpu skipped:", te["skipped"])
        return 0

    torchao_skip = None
    if args.peers_json:
        torchao_skip = load_peers_json(record, args.peers_json)
    else:
        torch, torchao_api, torchao_skip = peer_torch(record, args.no_compile)
        if torch is not None:
            peers = Peers(torch, start, args.deadline_s, save)
            peers.out = record["torch"]
            shapes = shapes_of(te)
            eager_peers(torch, peers, shapes)
            compiled_linear_peers(torch, peers, shapes, torchao_api, torchao_skip, with_compile=not args.no_compile)
    save()

    env = record["env"]
    print()
    print(f"GPU: {env.get('gpu', '?')}, torch {env.get('torch', '?')}, torchao {env.get('torchao', 'SKIPPED')}; "
          "medians of 5 repetitions after warm-up (libte: wall clock between synchronisations; PyTorch: CUDA events)")
    rows, problems = build_rows(te, record["torch"])
    print_table(rows)
    if torchao_skip:
        loud(f"SKIPPED: torchao float8 peers: {torchao_skip}\n(the <= {TARGET}x torchao targets were not measured)")
    if problems:
        print("libte problems:")
        for p in problems:
            print("  -", p)
    peer_problems = [f"{k}: {v['error']}" for k, v in record["torch"].items() if isinstance(v, dict) and "error" in v]
    if peer_problems:
        print("peer problems:")
        for p in peer_problems:
            print("  -", p)
    if args.json:
        print(f"numbers written to {args.json}")
    return 1 if (rc != 0 or problems) else 0


if __name__ == "__main__":
    sys.exit(main())
