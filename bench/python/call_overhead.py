#!/usr/bin/env python3
"""Host overhead of one autocast begin+end pair from Python: through ctypes, through the SWIG
extension, and torch.autocast where PyTorch is installed. Prints JSON, then a small table.

    LIBTE_PATH=build/release PYTHONPATH=bindings/python python3 bench/python/call_overhead.py

Targets: SWIG <= 1 us, ctypes <= 3 us per pair. Each figure is the best of --repeats runs of
--number pairs (the minimum is the least noisy estimate of the cost itself).
"""

import argparse
import json
import sys
import timeit


def pair_time(ll, number, repeats):
    ctx = ll.context_create((0, 0))
    recipe = ll.recipe_create(ll.recipe_defaults(0))
    opts = ll.autocast_options(True, False, recipe, None)
    begin, end = ll.autocast_begin, ll.autocast_end

    def raw():
        end(ctx, begin(ctx, opts))
    best = min(timeit.repeat(raw, number=number, repeat=repeats)) / number
    ll.recipe_release(recipe)
    ll.context_destroy(ctx)
    return best


def wrapper_time(number, repeats):
    """The public context manager (whichever backend libte selected)."""
    import libte
    ctx = libte.Context("cpu")
    scope = libte.autocast(ctx, recipe=libte.Recipe())

    def run():
        with scope:
            pass
    best = min(timeit.repeat(run, number=number, repeat=repeats)) / number
    ctx.close()
    return best, libte.BACKEND


def torch_time(number, repeats):
    try:
        import torch
    except ImportError:
        return None

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pass
    return min(timeit.repeat(run, number=number, repeat=repeats)) / number


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--number", type=int, default=100000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    from libte import _lowlevel_ctypes
    results = {"unit": "us per begin+end pair"}
    results["ctypes"] = pair_time(_lowlevel_ctypes, args.number, args.repeats) * 1e6
    try:
        from libte import _lowlevel_swig
        results["swig"] = pair_time(_lowlevel_swig, args.number, args.repeats) * 1e6
    except ImportError as e:
        results["swig"] = None
        results["swig_missing"] = str(e)
    wrapped, backend = wrapper_time(args.number, args.repeats)
    results["libte.autocast (%s)" % backend] = wrapped * 1e6
    t = torch_time(args.number // 10, args.repeats)
    results["torch.autocast"] = t * 1e6 if t is not None else None
    results["targets"] = {"swig": 1.0, "ctypes": 3.0}
    print(json.dumps(results, indent=2))
    print()
    print("%-28s %10s" % ("path", "us/pair"))
    for k, v in results.items():
        if isinstance(v, float):
            print("%-28s %10.3f" % (k, v))
        elif v is None:
            print("%-28s %10s" % (k, "n/a"))
    ok = results["ctypes"] <= 3.0 and (results["swig"] is None or results["swig"] <= 1.0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
