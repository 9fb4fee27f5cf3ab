#!/usr/bin/env python3
"""plot_loss.py: draws the FP8 and FP32 loss curves of a train_mlp CSV (step,loss_fp8,loss_fp32,
as the C, Python, Rust and Julia demos write it) as an SVG image, with the standard library only.

Usage:  python3 scripts/plot_loss.py LOSS.csv [OUT.svg]     (default: LOSS.csv with .svg)

The loss axis is logarithmic. Exit status 0, or 2 when the CSV cannot be read or written.
"""
import csv
import math
import os
import sys

W, H = 800, 480
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 50


def main(argv):
    if any(a in ("-h", "--help") for a in argv) or not 1 <= len(argv) <= 2:
        print(__doc__.strip())
        return 0 if argv else 2
    src = argv[0]
    out = argv[1] if len(argv) > 1 else os.path.splitext(src)[0] + ".svg"
    try:
        with open(src, newline="") as f:
            rows = [r for r in csv.DictReader(f)]
        steps = [int(r["step"]) for r in rows]
        series = {"fp8": [float(r["loss_fp8"]) for r in rows], "fp32": [float(r["loss_fp32"]) for r in rows]}
    except (OSError, KeyError, ValueError) as e:
        sys.stderr.write("plot_loss.py: cannot read %s: %s\n" % (src, e))
        return 2
    if not steps:
        sys.stderr.write("plot_loss.py: %s has no rows\n" % src)
        return 2
    finite = [v for s in series.values() for v in s if v > 0 and math.isfinite(v)]
    lo, hi = math.log10(min(finite)), math.log10(max(finite))
    if hi - lo < 1e-9:
        hi = lo + 1
    x0, x1 = min(steps), max(steps) if max(steps) > min(steps) else min(steps) + 1

    def px(step):
        return LEFT + (step - x0) / (x1 - x0) * (W - LEFT - RIGHT)

    def py(v):
        v = min(max(v, 10 ** lo), 10 ** hi) if math.isfinite(v) and v > 0 else 10 ** hi
        return TOP + (hi - math.log10(v)) / (hi - lo) * (H - TOP - BOTTOM)

    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
             'font-size="12">' % (W, H), '<rect width="100%" height="100%" fill="white"/>',
             '<text x="%d" y="22" font-size="15">train_mlp: loss per step, FP8 vs FP32 (%s)</text>'
             % (LEFT, os.path.basename(src))]
    for e in range(math.floor(lo), math.ceil(hi) + 1):
        for m in (1, 2, 5):
            v = m * 10 ** e
            if 10 ** lo <= v <= 10 ** hi:
                y = py(v)
                parts.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' % (LEFT, W - RIGHT, y, y))
                parts.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (LEFT - 6, y + 4, v))
    for i in range(6):
        s = x0 + (x1 - x0) * i / 5
        parts.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (px(s), H - BOTTOM + 18, round(s)))
    parts.append('<text x="%d" y="%d" text-anchor="middle">step</text>' % ((LEFT + W - RIGHT) // 2, H - 10))
    parts.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>'
                 % (LEFT, TOP, W - LEFT - RIGHT, H - TOP - BOTTOM))
    for (name, color), ly in zip((("fp32", "#1f77b4"), ("fp8", "#d62728")), (TOP + 18, TOP + 36)):
        pts = " ".join("%.1f,%.1f" % (px(s), py(v)) for s, v in zip(steps, series[name]))
        parts.append('<polyline fill="none" stroke="%s" stroke-width="1.3" points="%s"/>' % (color, pts))
        parts.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/>'
                     % (W - RIGHT - 90, W - RIGHT - 70, ly - 4, ly - 4, color))
        parts.append('<text x="%d" y="%d">%s</text>' % (W - RIGHT - 64, ly, name.upper()))
    parts.append("</svg>\n")
    try:
        with open(out, "w") as f:
            f.write("\n".join(parts))
    except OSError as e:
        sys.stderr.write("plot_loss.py: cannot write %s: %s\n" % (out, e))
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
