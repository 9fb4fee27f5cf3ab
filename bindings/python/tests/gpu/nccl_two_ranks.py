#!/usr/bin/env python3
"""Two ranks, one process and one GPU each, one libte NCCL group from Python.

    python3 bindings/python/tests/gpu/nccl_two_ranks.py   # LIBTE_PATH: default build/release

Rank 0 makes the id (libte.nccl_unique_id()) and hands it to rank 1 through a queue; each rank
joins Group.init_nccl(rank, 2, id, timeout_ms=60000) and runs a bf16 Linear forward on its own
random input (rank 1's scaled by 8) inside libte.autocast(ctx, group=g), delayed scaling. The
parent then checks, from what the ranks send back, that both ranks hold bit-identical scales,
scale_invs and amax histories, and that the recorded input/weight amaxes are the maxima over both
ranks (max|x| in float32 of the bf16 tensors, computed in torch). Last, rank 0 alone calls
init_nccl with a fresh id and timeout_ms=2000: that must raise libte.NcclError within 10 s.

Needs 2 GPUs, PyTorch and a libte with CUDA and NCCL: exit 77 (skip) otherwise. Exit 0 after
printing "nccl_two_ranks: OK ...", 1 with the reasons on any failure. Not a pytest file (no
test_ prefix; conftest.py also ignores this directory): it needs GPUs and spawns processes.
"""

import multiprocessing as mp
import os
import queue
import struct
import sys
import time
import traceback

RANKS, TOKENS, IN, OUT = 2, 32, 64, 32
ROLES = ("input", "weight")
JOIN_TIMEOUT_MS, LONE_TIMEOUT_MS, LONE_LIMIT_S = 60000, 2000, 10.0
SKIP = 77

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
if os.path.exists(os.path.join(ROOT, "build", "release", "libte.so")):
    os.environ.setdefault("LIBTE_PATH", os.path.join(ROOT, "build", "release"))


class PeerFailed(Exception):
    pass


def run_rank(rank, id_q):
    import torch  # only now: CUDA_VISIBLE_DEVICES is set, this rank's GPU is device 0
    import libte

    torch.cuda.set_device(0)
    uid = None
    if rank == 0:
        try:
            ctx = libte.Context("cuda:0")
            uid = libte.nccl_unique_id()
        finally:
            for _ in range(RANKS - 1):
                id_q.put(uid)  # None when that failed: the others stop too
    else:
        ctx = libte.Context("cuda:0")
        uid = id_q.get(timeout=120)
        if uid is None:
            raise PeerFailed("rank 0 sent no NCCL id")
    group = libte.Group.init_nccl(rank, RANKS, uid, timeout_ms=JOIN_TIMEOUT_MS)
    if (group.rank, group.size) != (rank, RANKS):
        raise RuntimeError("group rank/size %d/%d" % (group.rank, group.size))
    layer = libte.Linear(ctx, IN, OUT, bias=False, dtype="bfloat16")
    gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
    x = torch.randn(TOKENS, IN, device="cuda", generator=gen).to(torch.bfloat16)
    if rank == 1:
        x = x * 8  # exact in bf16: rank 1 holds the larger input amax
    w = (torch.randn(OUT, IN, device="cuda", generator=gen) / 8).to(torch.bfloat16)
    y = torch.empty(TOKENS, OUT, device="cuda", dtype=torch.bfloat16)
    with libte.autocast(ctx, enabled=True, group=group):  # the default recipe: delayed scaling
        _, bwd = layer.forward(x, w, None, out=y)
    ctx.synchronize()  # the scope's end reduced the amaxes over NCCL and updated the scales
    torch.cuda.synchronize()
    bwd.close()
    local = {"input": x.float().abs().max().item(), "weight": w.float().abs().max().item()}
    states = {}
    for role in ROLES:
        s = layer.scaling_state(role)
        states[role] = (s.scale, s.scale_inv, s.amax_history_len, s.amax_history.tobytes())
    result = dict(local=local, states=states, stats=tuple(ctx.stats()), lone=None)
    ctx.close()
    group.close()  # both ranks destroy their communicator (an intra-node collective)

    if rank == 0:  # rank 0 alone, with an id nobody else has: a timeout, not a hang
        fresh = libte.nccl_unique_id()
        start = time.monotonic()
        try:
            libte.Group.init_nccl(0, RANKS, fresh, timeout_ms=LONE_TIMEOUT_MS).close()
            result["lone"] = ("no error", time.monotonic() - start, "")
        except libte.Error as e:
            result["lone"] = (type(e).__name__, time.monotonic() - start, str(e))
    return result


def rank_main(rank, device, id_q, results):
    os.environ["CUDA_VISIBLE_DEVICES"] = device  # before anything starts CUDA in this process
    try:
        results.put((rank, "ok", run_rank(rank, id_q)))
    except BaseException as e:  # noqa: B902 - report everything to the parent
        status = {"Unsupported": "skip", "PeerFailed": "peer"}.get(type(e).__name__, "error")
        results.put((rank, status, "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())))


def bits(v):
    return struct.pack("<f", v)


def check(got):
    """The failures, as messages (none: OK), and a summary of what was checked."""
    errors = []
    r0, r1 = got[0], got[1]
    for role in ROLES:
        a, b = r0["states"][role], r1["states"][role]
        for i, what in enumerate(("scale", "scale_inv", "amax_history_len")):
            same = bits(a[i]) == bits(b[i]) if i < 2 else a[i] == b[i]
            if not same:
                errors.append("%s %s differs: rank 0 %r, rank 1 %r" % (role, what, a[i], b[i]))
        if a[3] != b[3]:
            errors.append("%s amax history differs between the ranks" % role)
        want = max(r["local"][role] for r in (r0, r1))
        history = [v for (v,) in struct.iter_unpack("<f", a[3])]
        recorded = [v for v in history if v != 0.0]
        if recorded != [want]:
            errors.append("%s amax history: non-zero entries %r, want [%r] (max over both ranks' "
                          "max|x|; rank 0's own: %r)" % (role, recorded[:4], want,
                                                         r0["local"][role]))
        if want > 0 and abs(a[0] * want / 448.0 - 1.0) > 1e-6:
            errors.append("%s scale %r, want 448/%r (E4M3, margin 0)" % (role, a[0], want))
    if not r1["local"]["input"] > r0["local"]["input"]:
        errors.append("setup: rank 1's input amax is not the larger one")
    for rank, r in ((0, r0), (1, r1)):
        if r["stats"][2] != 1:  # amax_reductions: one bucket, one scope
            errors.append("rank %d: amax_reductions %d, want 1" % (rank, r["stats"][2]))
    lone = r0["lone"]
    if lone is None or lone[0] != "NcclError" or lone[1] > LONE_LIMIT_S:
        errors.append("lone init_nccl (timeout_ms=%d): want NcclError within %.0f s, got %r"
                      % (LONE_TIMEOUT_MS, LONE_LIMIT_S, lone))
    summary = ("input amax %g (rank 0's own %g), weight amax %g; scales and histories "
               "bit-identical on both ranks; lone init_nccl -> NcclError after %.1f s"
               % (max(r0["local"]["input"], r1["local"]["input"]), r0["local"]["input"],
                  max(r0["local"]["weight"], r1["local"]["weight"]), lone[1] if lone else -1))
    return errors, summary


def main():
    try:
        import torch
    except ImportError:
        print("nccl_two_ranks: SKIP: PyTorch is not installed")
        return SKIP
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < RANKS:
        print("nccl_two_ranks: SKIP: %d usable GPU(s), %d needed" % (count, RANKS))
        return SKIP
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    devices = visible[:RANKS] if len(visible) >= RANKS else [str(r) for r in range(RANKS)]
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off, as in tests/dist

    spawn = mp.get_context("spawn")
    id_q, results = spawn.Queue(), spawn.Queue()
    procs = [spawn.Process(target=rank_main, args=(r, devices[r], id_q, results))
             for r in range(RANKS)]
    for p in procs:
        p.start()
    got, reports, failures, dead_since = {}, {}, [], {}
    deadline = time.monotonic() + 240
    try:
        while len(reports) < RANKS:
            try:
                rank, status, payload = results.get(timeout=1)
            except queue.Empty:
                now = time.monotonic()
                if now > deadline:
                    failures.append("timed out after 240 s waiting for the ranks")
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
                p.kill()
    statuses = set(reports.values())
    if "skip" in statuses and statuses <= {"skip", "peer"}:
        print("nccl_two_ranks: SKIP: no NCCL groups or CUDA in this libte\n" + "\n".join(failures))
        return SKIP
    if failures:
        print("nccl_two_ranks: FAILED\n" + "\n".join(failures), file=sys.stderr)
        return 1
    errors, summary = check(got)
    if errors:
        print("nccl_two_ranks: FAILED\n  " + "\n  ".join(errors), file=sys.stderr)
        return 1
    print("nccl_two_ranks: OK " + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
