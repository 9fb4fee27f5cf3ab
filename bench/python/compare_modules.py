#!/usr/bin/env python3
"""libte's transformer modules beside PyTorch's peers, measured in the same run, as one table.

    python3 bench/python/compare_modules.py build/.../bench/te_bench_modules [--json out.json]

Runs te_bench_modules (bench/modules_bench.cpp: LayerNormLinear 4096 -> 3x4096, LayerNormMLP
4096 -> 14336 SwiGLU -> 4096 and GroupedLinear, 8 experts 4096 -> 14336 on an uneven split,
16384 tokens, BF16, one fwd+bwd training step per recipe), then times PyTorch on the shapes that
program reports, with CUDA events (cuda_time from compare_torch.py):

  LayerNormLinear / LayerNormMLP: bf16 eager (nn.LayerNorm + nn.Linear; nn.LayerNorm +
      nn.Linear(4096, 2*14336) + SwiGLU + nn.Linear(14336, 4096)), the same under torch.compile
      (default mode), and torchao float8 training (convert_to_float8_training, tensorwise
      recipe) under torch.compile. Target: each libte recipe's step <= 0.85x torchao's.
  GroupedLinear: a per-expert bf16 loop, and torch._grouped_mm (bf16) where this PyTorch has it.

A training step everywhere: forward, backward from a random dy, gradients for the input and every
parameter (written fresh: PyTorch's .grad are set to None before each step, as zero_grad does).
TFLOP/s counts the GEMMs only: 2*M*N*K per forward GEMM, twice that for its backward.
If torchao cannot be imported the torchao column says SKIPPED, with the reason, loudly.

Dry runs without a GPU: --libte-json FILE reads libte's numbers from a file instead of running the
program, --peers-json FILE reads the peers' numbers (the "torch" object of an earlier --json).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import (Peers, fwd_bwd_step, load_peers_json, loud, new_record, peer_torch,  # noqa: E402
                           run_bench, to_float8)  # shared with te_bench_gpu's comparison

MODULES = ("layernorm_linear", "layernorm_mlp", "grouped_linear")
FP8_RECIPES = ("delayed", "current", "block")
TARGET = 0.85  # libte step time / torchao float8 compiled step time, at most

# The full-size shapes, used for a peer only when te_bench_modules reported nothing for it.
DEFAULT_SHAPES = {
    "layernorm_linear": {"tokens": 16384, "in_features": 4096, "out_features": 12288, "iters": 20},
    "layernorm_mlp": {"tokens": 16384, "hidden_size": 4096, "ffn_hidden_size": 14336, "iters": 10},
    "grouped_linear": {"tokens": 16384, "num_gemms": 8, "in_features": 4096, "out_features": 14336, "iters": 10,
                       "m_splits": [2411, 1563, 2048, 3007, 1129, 2600, 1817, 1809]},
}


def flops_per_step(module, s):
    """GEMM flops of one fwd+bwd step: 3 x (2*M*N*K per forward GEMM), as te_bench_modules counts."""
    if module == "layernorm_linear":
        return 3 * 2.0 * s["tokens"] * s["in_features"] * s["out_features"]
    if module == "layernorm_mlp":
        t, h, f = s["tokens"], s["hidden_size"], s["ffn_hidden_size"]
        return 3 * (2.0 * t * h * 2 * f + 2.0 * t * f * h)
    return 3 * 2.0 * sum(s["m_splits"]) * s["in_features"] * s["out_features"]


def shapes_from(te, module, quick):
    """The shapes libte ran (so the peers match it exactly), else the defaults."""
    b = (te.get("benchmarks") or {}).get(module) or {}
    if "tokens" in b:
        return b
    s = dict(DEFAULT_SHAPES[module])
    if quick:
        s["tokens"], s["iters"] = 2048, 3
        if module == "grouped_linear":
            s["m_splits"] = [301, 195, 256, 376, 141, 325, 227, 227]
    return s


# ---- PyTorch peers -------------------------------------------------------------------------------
class ModulePeers(Peers):
    """compare_torch's Peers, one result dict per module."""

    def measure(self, module, name, build, flops, iters, compiled=False):
        super().measure(name, build, flops, iters, compiled, into=self.out.setdefault(module, {}),
                        label=f"{module} {name}")


def ln_models(torch, module, s):
    nn, F = torch.nn, torch.nn.functional
    dev, dt = "cuda", torch.bfloat16
    if module == "layernorm_linear":
        h = s["in_features"]

        def make():
            return nn.Sequential(nn.LayerNorm(h, eps=1e-5), nn.Linear(h, s["out_features"])).to(dev, dt)

        return make, h, s["out_features"]
    h, f = s["hidden_size"], s["ffn_hidden_size"]

    class LayerNormMLP(nn.Module):
        # fc1's gate rows first, as libte's SwiGLU: silu(x[..., :f]) * x[..., f:]
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(h, eps=1e-5)
            self.fc1 = nn.Linear(h, 2 * f)
            self.fc2 = nn.Linear(f, h)

        def forward(self, x):
            a, b = self.fc1(self.norm(x)).chunk(2, dim=-1)
            return self.fc2(F.silu(a) * b)

    return (lambda: LayerNormMLP().to(dev, dt)), h, h


def measure_ln_peers(torch, peers, module, s, torchao_api, torchao_skip, with_compile=True):
    make, fin, fout = ln_models(torch, module, s)
    flops = flops_per_step(module, s)
    iters = int(s.get("iters", 10))
    tokens = s["tokens"]

    def builder(kind):
        def build():
            model = make()
            note = None
            if kind == "torchao":
                n_fp8 = to_float8(torchao_api, model, "tensorwise")
                note = {"float8_linears": n_fp8, "recipe": "tensorwise"}
                if n_fp8 == 0:
                    raise RuntimeError("convert_to_float8_training converted no nn.Linear")
            run = torch.compile(model) if kind in ("compile", "torchao") else model
            return fwd_bwd_step(torch, run, model, tokens, fin, fout), note

        return build

    peers.measure(module, "torch_eager_bf16", builder("eager"), flops, iters)
    if torchao_api is None:
        peers.out.setdefault(module, {})["torchao_float8_compiled"] = {"skipped": torchao_skip}
    else:
        peers.measure(module, "torchao_float8_compiled", builder("torchao"), flops, iters, compiled=True)
    if with_compile:
        peers.measure(module, "torch_compile_bf16", builder("compile"), flops, iters, compiled=True)
    else:
        peers.out[module]["torch_compile_bf16"] = {"skipped": "--no-compile"}


def measure_grouped_peers(torch, peers, s):
    module = "grouped_linear"
    flops = flops_per_step(module, s)
    iters = int(s.get("iters", 10))
    splits = [int(v) for v in s["m_splits"]]
    e, k, n, tokens = len(splits), s["in_features"], s["out_features"], sum(splits)
    dev, dt = "cuda", torch.bfloat16

    def inputs():
        x = torch.randn(tokens, k, device=dev, dtype=dt, requires_grad=True)
        dy = torch.randn(tokens, n, device=dev, dtype=dt)
        return x, dy

    def build_loop():
        ws = [(torch.randn(n, k, device=dev, dtype=dt) * 0.02).requires_grad_() for _ in range(e)]
        x, dy = inputs()

        def step():
            x.grad = None
            for w in ws:
                w.grad = None
            y = torch.cat([torch.nn.functional.linear(xs, w) for xs, w in zip(x.split(splits), ws)])
            y.backward(dy)

        return step, None

    peers.measure(module, "torch_loop_bf16", build_loop, flops, iters)

    grouped_mm = getattr(torch, "_grouped_mm", None)
    if grouped_mm is None:
        peers.out[module]["torch_grouped_mm_bf16"] = {"skipped": f"torch {torch.__version__} has no torch._grouped_mm"}
        return

    def build_grouped():
        w = (torch.randn(e, n, k, device=dev, dtype=dt) * 0.02).requires_grad_()
        x, dy = inputs()
        offs = torch.tensor(splits, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        # Same function as the loop: check one forward against it before timing.
        with torch.no_grad():
            ref = torch.cat([xs @ wi.t() for xs, wi in zip(x.split(splits), w)]).float()
            got = grouped_mm(x, w.transpose(-2, -1), offs=offs).float()
            rel = ((got - ref).norm() / ref.norm()).item()
        if not rel < 1e-2:
            raise RuntimeError(f"torch._grouped_mm differs from the per-expert loop: relative error {rel:.3g}")

        def step():
            x.grad = None
            w.grad = None
            grouped_mm(x, w.transpose(-2, -1), offs=offs).backward(dy)

        return step, {"check_vs_loop_rel_err": rel}

    # Last: a device-side assert inside _grouped_mm would poison this process's CUDA context.
    peers.measure(module, "torch_grouped_mm_bf16", build_grouped, flops, iters)


# ---- the table -----------------------------------------------------------------------------------
def fmt_time(r):
    if r is None:
        return "not run"
    if "error" in r:
        return "FAILED"
    if "skipped" in r:
        return "SKIPPED"
    tf = r["TFLOPs"]
    return f"{r['ms']:.2f} ms ({tf:.0f} TFLOP/s)" if tf >= 10 else f"{r['ms']:.3g} ms ({tf:.3g} TFLOP/s)"


def short(text, n=90):
    return text if len(text) <= n else text[: n - 3] + "..."


def shape_label(module, s):
    if module == "layernorm_linear":
        return f"LayerNormLinear {s['tokens']}x{s['in_features']}->{s['out_features']}"
    if module == "layernorm_mlp":
        return f"LayerNormMLP {s['tokens']}x{s['hidden_size']}->{s['ffn_hidden_size']} SwiGLU->{s['hidden_size']}"
    return f"GroupedLinear {len(s['m_splits'])}x {s['in_features']}->{s['out_features']}, {sum(s['m_splits'])} tokens"


def build_rows(te, pt, quick, only=MODULES):
    rows, problems = [], []
    for module in only:
        s = shapes_from(te, module, quick)
        b = (te.get("benchmarks") or {}).get(module)
        recipes = (b or {}).get("recipes", {})
        p = pt.get(module, {})
        label = shape_label(module, s)
        if b is None or "error" in b or "skipped" in b:
            why = "not run" if b is None else b.get("error") or f"SKIPPED: {b.get('skipped')}"
            if "error" in (te or {}):
                why = te["error"]
            rows.append((label, short(why), peer_summary(module, p), "-", target_of(module), "not measured"))
            if b is not None and "error" in b:
                problems.append(f"{module}: {b['error']}")
            continue
        peers_cell = peer_summary(module, p)
        for recipe in list(FP8_RECIPES) + ["bf16"]:
            r = recipes.get(recipe)
            if r is None:
                continue
            rlabel = f"{label}, {recipe if recipe != 'bf16' else 'libte bf16 (autocast off)'}"
            if "error" in r:
                rows.append((rlabel, short("FAILED: " + r["error"]), peers_cell, "-", target_of(module, recipe),
                             "FAILED (libte error)"))
                peers_cell = "(as above)"
                problems.append(f"{module}/{recipe}: {r['error']}")
                continue
            ratio, verdict = compare(module, recipe, r, p)
            if r.get("output_check", "ok") != "ok":
                verdict = f"not met: output check failed ({r['output_check']})"
                problems.append(f"{module}/{recipe}: output check: {r['output_check']}")
            rows.append((rlabel, fmt_time(r), peers_cell, ratio, target_of(module, recipe), verdict))
            peers_cell = "(as above)"
    return rows, problems


def target_of(module, recipe="delayed"):
    if module == "grouped_linear":
        return "report TFLOP/s"
    return f"<= {TARGET}x torchao compiled" if recipe in FP8_RECIPES else "-"


def peer_summary(module, p):
    names = {"torch_eager_bf16": "bf16 eager", "torch_compile_bf16": "bf16 compile",
             "torchao_float8_compiled": "torchao fp8 compiled", "torch_loop_bf16": "bf16 per-expert loop",
             "torch_grouped_mm_bf16": "bf16 _grouped_mm"}
    order = (("torchao_float8_compiled", "torch_compile_bf16", "torch_eager_bf16") if module != "grouped_linear"
             else ("torch_grouped_mm_bf16", "torch_loop_bf16"))
    parts = []
    for key in order:
        r = p.get(key)
        cell = fmt_time(r)
        if r is not None and "skipped" in r:
            cell = f"SKIPPED ({short(r['skipped'], 70)})"
        parts.append(f"{names[key]} {cell}")
    return "; ".join(parts)


def compare(module, recipe, r, p):
    """(ratio text, verdict) of one libte row against its peers."""
    def ok(x):
        return x is not None and "ms" in x

    if module == "grouped_linear":
        parts = [f"{r['ms'] / p[k]['ms']:.2f}x {lbl}"
                 for k, lbl in (("torch_grouped_mm_bf16", "_grouped_mm"), ("torch_loop_bf16", "loop")) if ok(p.get(k))]
        return ("; ".join(parts) or "-"), "reported"
    if recipe not in FP8_RECIPES:
        c = p.get("torch_compile_bf16")
        return (f"{r['ms'] / c['ms']:.2f}x bf16 compile" if ok(c) else "-"), "-"
    ao = p.get("torchao_float8_compiled")
    extra = ""
    c = p.get("torch_compile_bf16")
    if ok(c):
        extra = f"; {r['ms'] / c['ms']:.2f}x bf16 compile"
    if not ok(ao):
        why = "torchao SKIPPED" if ao is not None and "skipped" in ao else "torchao FAILED" if ao else "torchao not run"
        return extra.lstrip("; ") or "-", f"not measured ({why})"
    ratio = r["ms"] / ao["ms"]
    return f"{ratio:.2f}x torchao{extra}", "met" if ratio <= TARGET else "not met"


def print_table(rows):
    header = ("benchmark (fwd+bwd step)", "libte", "peers (same run)", "ratio (libte time / peer time)", "target",
              "verdict")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")


def version_text(v):
    """te_version()'s MAJOR * 10000 + MINOR * 100 + PATCH as text."""
    return "?" if not isinstance(v, (int, float)) else f"{int(v) // 10000}.{int(v) // 100 % 100}.{int(v) % 100}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("te_bench_modules", nargs="?", help="path of the te_bench_modules program")
    ap.add_argument("--json", help="also write all numbers here (rewritten after each peer)")
    ap.add_argument("--quick", action="store_true", help="2048 tokens, 3 steps: a smoke run")
    ap.add_argument("--only", help="comma-separated: layernorm_linear,layernorm_mlp,grouped_linear")
    ap.add_argument("--bench-args", default="", help="more arguments for te_bench_modules (one string)")
    ap.add_argument("--lib-dir", help="directories (':'-separated) put before LD_LIBRARY_PATH for te_bench_modules only")
    ap.add_argument("--build-info", help="a file describing the build (commit, flags), copied into the JSON")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile and torchao peers")
    ap.add_argument("--deadline-s", type=float, default=540.0,
                    help="skip peers that would start too late to finish within this many seconds (default 540)")
    ap.add_argument("--libte-json", help="read libte's JSON from this file instead of running the program")
    ap.add_argument("--peers-json", help="read the peers' numbers from this file instead of measuring them")
    args = ap.parse_args()
    if not args.te_bench_modules and not args.libte_json:
        ap.error("give the te_bench_modules program or --libte-json")
    only = [m for m in (args.only or ",".join(MODULES)).split(",") if m]
    for m in only:
        if m not in MODULES:
            ap.error(f"unknown module {m!r} (one of {', '.join(MODULES)})")

    record, save = new_record(args.build_info, args.json)

    rc = 0
    if args.libte_json:
        with open(args.libte_json) as f:
            te = json.load(f)
    else:
        extra = (["--quick"] if args.quick else []) + (["--only", ",".join(only)] if args.only else [])
        te, rc = run_bench([args.te_bench_modules] + extra + args.bench_args.split(), args.lib_dir)
    record["libte"] = te
    if "error" in te:
        loud(f"libte FAILED: {te['error']}")
    save()

    torchao_skip = None
    if args.peers_json:
        torchao_skip = load_peers_json(record, args.peers_json)
    else:
        torch, torchao_api, torchao_skip = peer_torch(record, args.no_compile)
        if torch is not None:
            record["env"]["has_torch_grouped_mm"] = hasattr(torch, "_grouped_mm")
            peers = ModulePeers(torch, time.time(), args.deadline_s, save)
            peers.out = record["torch"]
            for module in ("layernorm_linear", "layernorm_mlp"):
                if module not in only:
                    continue
                measure_ln_peers(torch, peers, module, shapes_from(te, module, args.quick), torchao_api, torchao_skip,
                                 with_compile=not args.no_compile)
            if "grouped_linear" in only:
                measure_grouped_peers(torch, peers, shapes_from(te, "grouped_linear", args.quick))
    save()

    env = record["env"]
    print()
    print(f"GPU: {env.get('gpu', '?')}, torch {env.get('torch', '?')}, torchao {env.get('torchao', 'SKIPPED')}; "
          f"libte {version_text(te.get('libte_version'))}; medians of 5 repetitions after warm-up")
    rows, problems = build_rows(te, record["torch"], args.quick, only)
    print_table(rows)
    if torchao_skip:
        loud(f"SKIPPED: torchao float8 peers: {torchao_skip}\n(the <= {TARGET}x targets were not measured)")
    if problems:
        print("libte problems:")
        for p in problems:
            print("  -", p)
    peer_problems = [f"{m}/{k}: {v['error']}" for m, d in record["torch"].items() if m in only
                     for k, v in d.items() if "error" in v]
    if peer_problems:
        print("peer problems:")
        for p in peer_problems:
            print("  -", p)
    if args.json:
        print(f"numbers written to {args.json}")
    return 1 if (rc != 0 or problems or "error" in te) else 0



if __name__ == "__main__":
    sys.exit(main())
