#!/usr/bin/env python3
"""libte.torch.autocast(group=<torch.distributed ProcessGroup>) over two ranks, one process and
one GPU each.

    python3 bindings/python/tests/gpu/torch_dist_two_ranks.py   # LIBTE_PATH: default build/release

Each rank: torch.cuda.set_device(rank), dist.init_process_group("nccl", tcp://127.0.0.1:<port>),
the same model on both (same seed, then rank 0's parameters broadcast, as DDP does):
lt.LayerNormLinear(256, 768) -> lt.Linear(768, 256) -> lt.LayerNormMLP(256, 1024), bf16 on
cuda. STEPS training steps on different data per rank (rank 1's input scaled by 8, its loss by
8): the forward inside `lt.autocast(recipe=lt.DelayedScaling(amax_history_len=4),
group=dist.group.WORLD)`, loss.backward() outside it (TE's pattern), gradients all-reduced
(mean) over torch.distributed, SGD. libte turns the ProcessGroup into its own NCCL group (rank 0
broadcasts the id over torch.distributed) and all-reduces (MAX) each bucket's amaxes.

The parent checks, from what the ranks send back:
- every module's FP8 extra state (state_dict()'s bytes) and every scaling state (scale,
  scale_inv, amax history) is bit-identical on both ranks;
- the amax histories hold the global maxima (over both ranks) of the last steps, computed in
  torch, newest last (TE's layout: slot 0 is the current amax, 0 after the update): exactly for
  the tensors the test sees in bf16 (the Linear's input, every weight, the grad_outputs of
  LayerNormLinear, Linear and LayerNormMLP's fc2), within 2% for the norm outputs (computed in
  fp32 here); and scale == fp8_max / (the max of those over the last amax_history_len steps:
  TE's update takes the max before the roll drops the oldest; margin 0);
- NCCL's own log (NCCL_DEBUG=INFO, SUBSYS=COLL, one file per process) counts libte's
  ncclAllReduce calls on its communicator (the one that is not torch's: torch's broadcast the
  id and sums the gradients): one per bucket and pass, i.e. 2 per step (the forward bucket at
  the autocast exit, the backward bucket when the first module's backward completes), as
  tests/dist/nccl_cases_test.cpp counts them; libte's stats (amax_reductions) must agree.

Needs 2 GPUs, PyTorch with NCCL and a libte with CUDA and NCCL: exit 77 (skip) otherwise. Exit 0
after printing "torch_dist_two_ranks: OK ...", 1 with the reasons on any failure. Not a pytest
file (no test_ prefix; conftest.py also ignores this directory).
"""

import glob
import multiprocessing as mp
import os
import queue
import re
import shutil
import socket
import struct
import sys
import tempfile
import time
import traceback

RANKS, STEPS, TOKENS, HID, MID, FFN, HIST = 2, 5, 64, 256, 768, 1024, 4
LR = 0.01
SKIP = 77
WAIT_S = 300
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
if os.path.exists(os.path.join(ROOT, "build", "release", "libte.so")):
    os.environ.setdefault("LIBTE_PATH", os.path.join(ROOT, "build", "release"))

# (module name, gemm or None, role) -> how the test knows its amax: "exact" (a bf16 tensor it
# holds), "approx" (a norm output it recomputes in fp32), None (internal: not checked)
STATES = [
    ("lnl", None, "input", "approx"), ("lnl", None, "weight", "exact"),
    ("lnl", None, "grad_output", "exact"),
    ("lin", None, "input", "exact"), ("lin", None, "weight", "exact"),
    ("lin", None, "grad_output", "exact"),
    ("mlp", "fc1", "input", "approx"), ("mlp", "fc1", "weight", "exact"),
    ("mlp", "fc1", "grad_output", None),
    ("mlp", "fc2", "input", None), ("mlp", "fc2", "weight", "exact"),
    ("mlp", "fc2", "grad_output", "exact"),
]
LINE = re.compile(r"NCCL INFO (\w+): opCount \S+ .*?datatype (\S+) op (\S+) .*?comm (0x[0-9a-fA-F]+)")


class PeerFailed(Exception):
    pass


def key(name, gemm, role):
    return "%s%s.%s" % (name, "." + gemm if gemm else "", role)


def nccl_log(log_dir):
    """This process's NCCL log: [(collective, datatype, op, comm)]."""
    out = []
    for path in glob.glob(os.path.join(log_dir, "nccl.*.%d.log" % os.getpid())):
        with open(path, errors="replace") as f:
            for line in f:
                m = LINE.search(line)
                if m:
                    out.append(m.groups())
    return out


def run_rank(rank, port, log_dir):
    import torch
    import torch.distributed as dist
    import libte.torch as lt

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=RANKS)
    torch.manual_seed(0)
    bf = torch.bfloat16
    mods = {"lnl": lt.LayerNormLinear(HID, MID, params_dtype=bf, device=dev),
            "lin": lt.Linear(MID, HID, params_dtype=bf, device=dev),
            "mlp": lt.LayerNormMLP(HID, FFN, params_dtype=bf, device=dev)}
    params = [p for m in mods.values() for p in m.parameters()]
    with torch.no_grad():  # as DDP: rank 0's parameters everywhere
        for p in params:
            dist.broadcast(p, src=0)
    recipe = lt.DelayedScaling(amax_history_len=HIST)
    ctx = lt.context(dev)
    steps = []
    for step in range(STEPS):
        gen = torch.Generator(device=dev).manual_seed(1000 * rank + step)
        x = torch.randn(TOKENS, HID, device=dev, generator=gen).to(bf)
        if rank == 1:
            x = x * 8  # exact in bf16
        weights = {"lnl.weight": mods["lnl"].weight, "lin.weight": mods["lin"].weight,
                   "mlp.fc1.weight": mods["mlp"].fc1_weight,
                   "mlp.fc2.weight": mods["mlp"].fc2_weight}
        local = {k: w.detach().float().abs().max().item() for k, w in weights.items()}
        red0 = ctx.stats()[2]
        with lt.autocast(recipe=recipe, group=dist.group.WORLD):
            h1 = mods["lnl"](x)
            h2 = mods["lin"](h1)
            out = mods["mlp"](h2)
        torch.cuda.synchronize()
        red_fwd = ctx.stats()[2] - red0
        for t in (h1, h2, out):
            t.retain_grad()
        loss = out.float().square().mean() * (8.0 if rank == 1 else 1.0)
        loss.backward()
        torch.cuda.synchronize()
        red_step = ctx.stats()[2] - red0
        amax = lambda t: t.detach().float().abs().max().item()  # noqa: E731
        with torch.no_grad():  # the norm outputs, in fp32 from the parameters the forward saw
            f = torch.nn.functional
            lnl, mlp = mods["lnl"], mods["mlp"]
            ln1 = f.layer_norm(x.float(), (HID,), lnl.layer_norm_weight.float(),
                               lnl.layer_norm_bias.float(), 1e-5)
            ln2 = f.layer_norm(h2.float(), (HID,), mlp.layer_norm_weight.float(),
                               mlp.layer_norm_bias.float(), 1e-5)
        local.update({"lnl.input": amax(ln1), "lin.input": amax(h1), "mlp.fc1.input": amax(ln2),
                      "lnl.grad_output": amax(h1.grad), "lin.grad_output": amax(h2.grad),
                      "mlp.fc2.grad_output": amax(out.grad)})
        with torch.no_grad():
            for p in params:
                dist.all_reduce(p.grad)  # SUM on torch's communicator
                p.add_(p.grad, alpha=-LR / RANKS)
                p.grad = None
        torch.cuda.synchronize()
        steps.append(dict(local=local, red_fwd=red_fwd, red_step=red_step, loss=loss.item(),
                          log=len(nccl_log(log_dir))))
    states, extra = {}, {}
    for name, gemm, role, _ in STATES:
        layer = mods[name].te_layer
        s = layer.scaling_state(role, gemm) if gemm else layer.scaling_state(role)
        states[key(name, gemm, role)] = (s.scale, s.scale_inv, s.amax_history_len, s.fp8_dtype,
                                         s.amax_history.tobytes())
    for name, m in mods.items():
        extra[name] = bytes(m.state_dict()["_extra_state"].numpy().tobytes())
    pbytes = b"".join(p.detach().float().cpu().numpy().tobytes() for p in params)
    log = nccl_log(log_dir)
    result = dict(steps=steps, states=states, extra=extra, params=pbytes, log=log,
                  stats=tuple(ctx.stats()), torch=torch.__version__,
                  nccl=str(torch.cuda.nccl.version()))
    return result, dist


def rank_main(rank, port, log_dir, results):
    dist = None
    try:
        result, dist = run_rank(rank, port, log_dir)
        results.put((rank, "ok", result))
    except BaseException as e:  # noqa: B902 - report everything to the parent
        status = {"Unsupported": "skip", "PeerFailed": "peer"}.get(type(e).__name__, "error")
        results.put((rank, status, "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())))
    if dist is not None:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the results are already sent
            pass


def floats(b):
    return [v for (v,) in struct.iter_unpack("<f", b)]


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def comms(log):
    """{comm: [(collective, datatype, op)]} and torch's comms (those with a Broadcast or an
    all-reduce that is not MAX; libte's does only MAX all-reduces)."""
    by = {}
    for coll, dt, op, comm in log:
        by.setdefault(comm, []).append((coll, dt, op))
    torch_comms = {c for c, ops in by.items()
                   if any(o[0] != "AllReduce" or o[2] not in ("2", "ncclMax", "max") for o in ops)}
    return by, torch_comms


def check(got):
    errors, notes = [], []
    r0, r1 = got[0], got[1]
    for name in ("lnl", "lin", "mlp"):
        if r0["extra"][name] != r1["extra"][name]:
            errors.append("%s: FP8 extra state (state_dict) differs between the ranks" % name)
    if r0["params"] != r1["params"]:
        errors.append("parameters differ between the ranks after the steps")
    last = STEPS - 1
    for name, gemm, role, how in STATES:
        k = key(name, gemm, role)
        a, b = r0["states"][k], r1["states"][k]
        for i, what in enumerate(("scale", "scale_inv", "amax_history_len", "fp8_dtype",
                                  "amax_history")):
            same = struct.pack("<f", a[i]) == struct.pack("<f", b[i]) if i < 2 else a[i] == b[i]
            if not same:
                errors.append("%s %s differs: rank 0 %r, rank 1 %r" % (
                    k, what, floats(a[i]) if i == 4 else a[i], floats(b[i]) if i == 4 else b[i]))
        hist = floats(a[4])
        fmax = FP8_MAX.get(a[3])
        if a[2] != HIST or len(hist) != HIST:
            errors.append("%s: amax_history_len %d (%d values), want %d" % (k, a[2], len(hist),
                                                                            HIST))
            continue
        # TE's update: scale = fp8_max / max over the whole history with the step's amax in
        # slot 0, then the roll drops the oldest value: the last HIST steps' amaxes set the scale
        if fmax is None or max(hist) <= 0 or a[0] * max(hist) / fmax > 1.0 + 1e-6:
            errors.append("%s: scale %r with fp8 %s and history %r: want at most "
                          "fp8_max/max(history)" % (k, a[0], a[3], hist))
        if how is None:
            continue
        window = max(max(r["steps"][s]["local"][k] for r in (r0, r1))
                     for s in range(STEPS - HIST, STEPS))
        if abs(a[0] * window / fmax - 1.0) > (1e-6 if how == "exact" else 0.02):
            errors.append("%s: scale %r, want fp8_max / %r (the max over both ranks and the "
                          "last %d steps)" % (k, a[0], window, HIST))
        want = [f32(max(r["steps"][s]["local"][k] for r in (r0, r1)))
                for s in range(STEPS - (HIST - 1), STEPS)]
        got_tail = hist[1:]
        if how == "exact":
            ok = hist[0] == 0.0 and got_tail == want
        else:
            ok = hist[0] == 0.0 and all(abs(g / w - 1.0) <= 0.02 for g, w in zip(got_tail, want))
        if not ok:
            own = [f32(r0["steps"][s]["local"][k]) for s in range(STEPS - (HIST - 1), STEPS)]
            errors.append("%s: amax history %r, want [0] + %r (%s; rank 0's own: %r)"
                          % (k, hist, want, "max over both ranks" if how == "exact"
                             else "within 2%", own))
        l0, l1 = r0["steps"][last]["local"][k], r1["steps"][last]["local"][k]
        if l0 != l1 and how == "exact":
            notes.append("%s %s" % (k, "r1" if l1 > l0 else "r0"))
    # all-reduce counts
    counts = {}
    for rank, r in ((0, r0), (1, r1)):
        by, torch_comms = comms(r["log"])
        libte_comms = [c for c in by if c not in torch_comms]
        if len(libte_comms) != 1 or not torch_comms:
            errors.append("rank %d: NCCL's log: communicators %s, torch's %s: want one of libte's "
                          "besides torch's" % (rank, {c: len(v) for c, v in by.items()},
                                               sorted(torch_comms)))
            continue
        mine = libte_comms[0]
        kinds = sorted({o for o in by[mine]})
        if any(o[0] != "AllReduce" or o[1] not in ("7", "ncclFloat32", "float32") for o in kinds):
            errors.append("rank %d: libte's communicator did %r, want float32 MAX all-reduces only"
                          % (rank, kinds))
        # per step: lines on libte's comm up to each step's end
        per_step, prev = [], 0
        for s in r["steps"]:
            n = sum(1 for coll, _, _, c in r["log"][:s["log"]] if c == mine)
            per_step.append(n - prev)
            prev = n
        counts[rank] = dict(log=per_step, fwd=[s["red_fwd"] for s in r["steps"]],
                            stats=[s["red_step"] for s in r["steps"]], total=len(by[mine]))
        if per_step[1:] != [2] * (STEPS - 1) or not 1 <= per_step[0] <= 2:
            errors.append("rank %d: libte ncclAllReduce calls per step %r (NCCL's log), want 2 "
                          "(forward bucket + backward bucket)" % (rank, per_step))
        if counts[rank]["stats"] != per_step:
            errors.append("rank %d: libte's stats count %r reductions per step, NCCL's log %r"
                          % (rank, counts[rank]["stats"], per_step))
        if counts[rank]["fwd"] != [1] * STEPS:
            errors.append("rank %d: reductions at the autocast exit per step %r, want 1 each"
                          % (rank, counts[rank]["fwd"]))
        if counts[rank]["total"] != sum(per_step):
            notes.append("rank %d: %d all-reduces on libte's communicator in all, %d in the steps"
                         % (rank, counts[rank]["total"], sum(per_step)))
    if r0["steps"][0]["local"]["lnl.grad_output"] >= r1["steps"][0]["local"]["lnl.grad_output"]:
        errors.append("setup: rank 1's grad_output amax is not the larger one")
    summary = ("torch %s, NCCL %s; %d steps, %d ranks: FP8 extra states and %d scaling states "
               "bit-identical; amax histories = global maxima of the last %d steps (larger one "
               "held by: %s); libte all-reduces per step (NCCL log) rank0 %r rank1 %r, stats %r; "
               "losses r0 %s r1 %s" % (
                   r0["torch"], r0["nccl"], STEPS, RANKS, len(STATES), HIST - 1,
                   ", ".join(notes) or "-", counts.get(0, {}).get("log"),
                   counts.get(1, {}).get("log"), counts.get(0, {}).get("stats"),
                   ["%.4g" % s["loss"] for s in r0["steps"]],
                   ["%.4g" % s["loss"] for s in r1["steps"]]))
    return errors, summary


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("torch_dist_two_ranks: SKIP: PyTorch is not installed")
        return SKIP
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < RANKS:
        print("torch_dist_two_ranks: SKIP: %d usable GPU(s), %d needed" % (count, RANKS))
        return SKIP
    if not dist.is_available() or not dist.is_nccl_available():
        print("torch_dist_two_ranks: SKIP: torch.distributed without NCCL")
        return SKIP
    log_dir = tempfile.mkdtemp(prefix="torch_dist_two_ranks.")
    os.environ.update(NCCL_NVLS_ENABLE="0",  # NVLink multicast stays off, as in tests/dist
                      NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="COLL",
                      NCCL_DEBUG_FILE=os.path.join(log_dir, "nccl.%h.%p.log"))
    port = free_port()
    spawn = mp.get_context("spawn")
    results = spawn.Queue()
    procs = [spawn.Process(target=rank_main, args=(r, port, log_dir, results))
             for r in range(RANKS)]
    for p in procs:
        p.start()
    got, reports, failures, teardown, dead_since = {}, {}, [], [], {}
    deadline = time.monotonic() + WAIT_S
    try:
        while len(reports) < RANKS:
            try:
                rank, status, payload = results.get(timeout=1)
            except queue.Empty:
                now = time.monotonic()
                if now > deadline:
                    failures.append("timed out after %d s waiting for the ranks" % WAIT_S)
                    break
                for r, p in enumerate(procs):  # died without a word (a crash)?
                    if r not in reports and p.exitcode is not None:
                        if now - dead_since.setdefault(r, now) > 10:
                            reports[r] = "crashed"
                            failures.append("rank %d exited with %s, sending nothing"
                                            % (r, p.exitcode))
                continue
            reports[rank] = status
            if status == "ok":
                got[rank] = payload
            else:
                failures.append("rank %d (%s): %s" % (rank, status, payload))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                teardown.append("rank %d still running 30 s after its report: killed"
                                % procs.index(p))
                p.kill()
            elif p.exitcode not in (0, None) and procs.index(p) in got:
                teardown.append("rank %d exited with %s after its report"
                                % (procs.index(p), p.exitcode))
        if os.environ.get("TORCH_DIST_TWO_RANKS_KEEP_LOGS"):
            print("NCCL logs kept in %s" % log_dir)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)
    statuses = set(reports.values())
    if "skip" in statuses and statuses <= {"skip", "peer"}:
        print("torch_dist_two_ranks: SKIP: no NCCL groups or CUDA in this libte\n"
              + "\n".join(failures))
        return SKIP
    if failures:
        print("torch_dist_two_ranks: FAILED\n" + "\n".join(failures), file=sys.stderr)
        return 1
    errors, summary = check(got)
    errors += teardown
    if errors:
        print("torch_dist_two_ranks: FAILED\n  " + "\n  ".join(errors) + "\n(" + summary + ")",
              file=sys.stderr)
        return 1
    print("torch_dist_two_ranks: OK " + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
