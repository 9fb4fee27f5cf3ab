#!/usr/bin/env python3
"""plot_loss.py: draws the loss curves of a demo's CSV as a PNG or an SVG image, with the Python
standard library only (the PNG: zlib + struct, a built-in 5x7 bitmap font).

Usage:  python3 scripts/plot_loss.py LOSS.csv [OUT.png | OUT.svg]

Two CSV formats, told apart by their header:
  train_gpt (examples/c/train_gpt.c): run,step,train_loss,val_loss,tokens_per_s, one row per run
    and step (runs "fp8" and "baseline"; val_loss empty on steps without an evaluation). Drawn:
    the train and validation loss of each run (4 lines), linear loss axis; the legend gives each
    run's mean tokens/s and final validation loss.
  train_mlp (the C, Python, Rust and Julia MLP demos): step,loss_fp8,loss_fp32. Drawn: both
    losses, logarithmic loss axis.
The output's extension picks the format (.png or .svg); without OUT: LOSS.csv with .png for a
train_gpt CSV, .svg for a train_mlp CSV. Exit status 0, or 2 when the CSV cannot be read or the
image cannot be written.
"""
import csv
import math
import os
import struct
import sys
import zlib

W, H = 800, 480
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 50

RUN_COLOURS = {"fp8": ((0xF4, 0xA5, 0x82), (0xB2, 0x18, 0x2B)),       # train light, val dark
               "baseline": ((0x92, 0xC5, 0xDE), (0x21, 0x66, 0xAC))}
OTHER_COLOURS = [((0xA6, 0xDB, 0xA0), (0x1B, 0x78, 0x37)), ((0xFD, 0xD0, 0xA2), (0xD9, 0x5F, 0x0E))]


class Series(object):
    """One curve: its legend label, colour (r, g, b), points, line width, whether to mark each
    point, and z (curves are drawn in increasing z; the legend keeps the CSV's order)."""

    def __init__(self, label, colour, xs, ys, width=1, markers=False, z=0):
        self.label, self.colour, self.xs, self.ys = label, colour, xs, ys
        self.width, self.markers, self.z = width, markers, z


class Plot(object):
    def __init__(self, title, series, ylog):
        self.title, self.series, self.ylog = title, series, ylog


def _hex(colour):
    return "#%02x%02x%02x" % colour


def read_plot(src):
    """The Plot of a train_gpt or train_mlp CSV. Raises OSError, KeyError or ValueError."""
    with open(src, newline="") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames or []
        rows = list(reader)
    if not rows:
        raise ValueError("no rows")
    name = os.path.basename(src)
    if "run" in fields and "train_loss" in fields:
        runs = {}
        for r in rows:  # runs in the order they first appear
            run = runs.setdefault(r["run"], {"steps": [], "train": [], "vsteps": [], "val": [], "tps": []})
            step = int(r["step"])
            run["steps"].append(step)
            run["train"].append(float(r["train_loss"]))
            if (r.get("val_loss") or "").strip():
                run["vsteps"].append(step)
                run["val"].append(float(r["val_loss"]))
            if (r.get("tokens_per_s") or "").strip():
                tps = float(r["tokens_per_s"])
                if tps > 0 and math.isfinite(tps):
                    run["tps"].append(tps)
        series = []
        for i, (run_name, run) in enumerate(runs.items()):
            light, dark = RUN_COLOURS.get(run_name, OTHER_COLOURS[i % len(OTHER_COLOURS)])
            tps = " %.0f tok/s" % (sum(run["tps"]) / len(run["tps"])) if run["tps"] else ""
            # Where the runs coincide (the point of the demo), FP8's thinner line stays visible
            # on top of the wider baseline; train curves under validation curves.
            on_top = 1 if run_name == "fp8" else 0
            series.append(Series("%s train%s" % (run_name, "," + tps if tps else ""), light, run["steps"],
                                 run["train"], width=2 - on_top, z=on_top))
            if run["val"]:
                series.append(Series("%s val, final %.4f" % (run_name, run["val"][-1]), dark,
                                     run["vsteps"], run["val"], width=4 - 2 * on_top, markers=True, z=10 + on_top))
        return Plot("train_gpt: cross-entropy per step, FP8 vs baseline (%s)" % name, series, ylog=False)
    steps = [int(r["step"]) for r in rows]
    series = [Series("FP32", (0x1F, 0x77, 0xB4), steps, [float(r["loss_fp32"]) for r in rows], width=1),
              Series("FP8", (0xD6, 0x27, 0x28), steps, [float(r["loss_fp8"]) for r in rows], width=1)]
    return Plot("train_mlp: loss per step, FP8 vs FP32 (%s)" % name, series, ylog=True)


class Axes(object):
    """Maps steps and losses to pixels, and picks the ticks."""

    def __init__(self, plot):
        xs = [x for s in plot.series for x in s.xs]
        self.x0, self.x1 = min(xs), max(xs)
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        self.ylog = plot.ylog
        finite = [v for s in plot.series for v in s.ys if math.isfinite(v) and (v > 0 or not self.ylog)]
        if not finite:
            finite = [1.0]
        if self.ylog:
            self.lo, self.hi = math.log10(min(finite)), math.log10(max(finite))
            if self.hi - self.lo < 1e-9:
                self.hi = self.lo + 1
        else:
            lo, hi = min(finite), max(finite)
            pad = (hi - lo) * 0.05 or max(abs(lo) * 0.05, 0.5)
            self.lo, self.hi = lo - pad, hi + pad

    def px(self, step):
        return LEFT + (step - self.x0) / float(self.x1 - self.x0) * (W - LEFT - RIGHT)

    def py(self, v):
        if self.ylog:
            v = min(max(v, 10 ** self.lo), 10 ** self.hi) if math.isfinite(v) and v > 0 else 10 ** self.hi
            t = math.log10(v)
        else:
            t = min(max(v, self.lo), self.hi) if math.isfinite(v) else self.hi
        return TOP + (self.hi - t) / (self.hi - self.lo) * (H - TOP - BOTTOM)

    def yticks(self):
        if self.ylog:
            ticks = []
            for e in range(math.floor(self.lo), math.ceil(self.hi) + 1):
                for m in (1, 2, 5):
                    v = m * 10 ** e
                    if 10 ** self.lo <= v <= 10 ** self.hi:
                        ticks.append(v)
            return ticks
        raw = (self.hi - self.lo) / 6
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
        first = math.ceil(self.lo / step) * step
        return [first + i * step for i in range(int((self.hi - first) / step + 1e-9) + 1)]

    def xticks(self):
        """About 6 ticks at whole multiples of 1, 2, 2.5 or 5 x 10^k steps (at least 1)."""
        raw = max((self.x1 - self.x0) / 6.0, 1.0)
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
        step = max(1, int(round(step))) if step >= 1 else 1
        first = int(math.ceil(self.x0 / float(step))) * step
        return list(range(first, int(self.x1) + 1, step))


def tick_label(v):
    return "%g" % float("%.6g" % v)


# --- SVG ------------------------------------------------------------------------------------------

def render_svg(plot):
    ax = Axes(plot)
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
             'font-size="12">' % (W, H), '<rect width="100%" height="100%" fill="white"/>',
             '<text x="%d" y="22" font-size="15">%s</text>' % (LEFT, plot.title)]
    for v in ax.yticks():
        y = ax.py(v)
        parts.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' % (LEFT, W - RIGHT, y, y))
        parts.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (LEFT - 6, y + 4, tick_label(v)))
    for s in ax.xticks():
        parts.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (ax.px(s), H - BOTTOM + 18, round(s)))
    parts.append('<text x="%d" y="%d" text-anchor="middle">step</text>' % ((LEFT + W - RIGHT) // 2, H - 10))
    parts.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>'
                 % (LEFT, TOP, W - LEFT - RIGHT, H - TOP - BOTTOM))
    legend_w = max(90, max(len(s.label) for s in plot.series) * 7 + 30)
    for s in sorted(plot.series, key=lambda s: s.z):
        pts = " ".join("%.1f,%.1f" % (ax.px(x), ax.py(v)) for x, v in zip(s.xs, s.ys))
        parts.append('<polyline fill="none" stroke="%s" stroke-width="%.1f" points="%s"/>'
                     % (_hex(s.colour), 1.3 * s.width, pts))
    for i, s in enumerate(plot.series):
        ly = TOP + 18 * (i + 1)
        parts.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/>'
                     % (W - RIGHT - legend_w, W - RIGHT - legend_w + 20, ly - 4, ly - 4, _hex(s.colour)))
        parts.append('<text x="%d" y="%d">%s</text>' % (W - RIGHT - legend_w + 26, ly, s.label.upper()))
    parts.append("</svg>\n")
    return "\n".join(parts).encode()


# --- PNG: a raster canvas, a 5x7 font, and the PNG container --------------------------------------

# Upper case only (text is drawn upper-cased); '#' is ink. Unknown characters draw as '?'.
_FONT_ROWS = {
    "A": ".###. #...# #...# ##### #...# #...# #...#", "B": "####. #...# #...# ####. #...# #...# ####.",
    "C": ".###. #...# #.... #.... #.... #...# .###.", "D": "####. #...# #...# #...# #...# #...# ####.",
    "E": "##### #.... #.... ####. #.... #.... #####", "F": "##### #.... #.... ####. #.... #.... #....",
    "G": ".###. #...# #.... #.### #...# #...# .####", "H": "#...# #...# #...# ##### #...# #...# #...#",
    "I": ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.", "J": "..### ...#. ...#. ...#. ...#. #..#. .##..",
    "K": "#...# #..#. #.#.. ##... #.#.. #..#. #...#", "L": "#.... #.... #.... #.... #.... #.... #####",
    "M": "#...# ##.## #.#.# #.#.# #...# #...# #...#", "N": "#...# #...# ##..# #.#.# #..## #...# #...#",
    "O": ".###. #...# #...# #...# #...# #...# .###.", "P": "####. #...# #...# ####. #.... #.... #....",
    "Q": ".###. #...# #...# #...# #.#.# #..#. .##.#", "R": "####. #...# #...# ####. #.#.. #..#. #...#",
    "S": ".#### #.... #.... .###. ....# ....# ####.", "T": "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    "U": "#...# #...# #...# #...# #...# #...# .###.", "V": "#...# #...# #...# #...# #...# .#.#. ..#..",
    "W": "#...# #...# #...# #.#.# #.#.# #.#.# .#.#.", "X": "#...# #...# .#.#. ..#.. .#.#. #...# #...#",
    "Y": "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#..", "Z": "##### ....# ...#. ..#.. .#... #.... #####",
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.", "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####", "3": "##### ...#. ..#.. ...#. ....# #...# .###.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.", "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.", "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.", "9": ".###. #...# #...# .#### ....# ...#. .##..",
    " ": "..... ..... ..... ..... ..... ..... .....", ".": "..... ..... ..... ..... ..... .##.. .##..",
    ",": "..... ..... ..... ..... .##.. ..#.. .#...", ":": "..... .##.. .##.. ..... .##.. .##.. .....",
    "-": "..... ..... ..... ##### ..... ..... .....", "+": "..... ..#.. ..#.. ##### ..#.. ..#.. .....",
    "_": "..... ..... ..... ..... ..... ..... #####", "(": "...#. ..#.. .#... .#... .#... ..#.. ...#.",
    ")": ".#... ..#.. ...#. ...#. ...#. ..#.. .#...", "/": "..... ....# ...#. ..#.. .#... #.... .....",
    "%": "##... ##..# ...#. ..#.. .#... #..## ...##", "=": "..... ..... ##### ..... ##### ..... .....",
    "?": ".###. #...# ....# ...#. ..#.. ..... ..#..",
}
FONT = {ch: [row for row in rows.split()] for ch, rows in _FONT_ROWS.items()}
GLYPH_W, GLYPH_H = 5, 7


class Canvas(object):
    """An RGB image, white, with clipped pixel, rectangle, line and text drawing."""

    def __init__(self, width, height):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def set(self, x, y, colour):
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i:i + 3] = bytes(colour)

    def get(self, x, y):
        i = (y * self.width + x) * 3
        return tuple(self.pixels[i:i + 3])

    def fill_rect(self, x0, y0, w, h, colour, clip=None):
        for y in range(y0, y0 + h):
            for x in range(x0, x0 + w):
                if clip is None or (clip[0] <= x <= clip[2] and clip[1] <= y <= clip[3]):
                    self.set(x, y, colour)

    def hline(self, x0, x1, y, colour):
        for x in range(min(x0, x1), max(x0, x1) + 1):
            self.set(x, y, colour)

    def vline(self, x, y0, y1, colour):
        for y in range(min(y0, y1), max(y0, y1) + 1):
            self.set(x, y, colour)

    def line(self, x0, y0, x1, y1, colour, width=1, clip=None):
        """Bresenham, each point a width x width square, clipped to clip (x0, y0, x1, y1)."""
        x0, y0, x1, y1 = int(round(x0)), int(round(y0)), int(round(x1)), int(round(y1))
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, off = dx + dy, width // 2
        while True:
            self.fill_rect(x0 - off, y0 - off, width, width, colour, clip)
            if x0 == x1 and y0 == y1:
                break
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x, y, s, colour, scale=2, anchor="left"):
        """Draws s upper-cased with its top at y; anchor: left, right or center of x."""
        s = s.upper()
        advance = (GLYPH_W + 1) * scale
        width = len(s) * advance - scale
        if anchor == "right":
            x -= width
        elif anchor == "center":
            x -= width // 2
        for k, ch in enumerate(s):
            glyph = FONT.get(ch, FONT["?"])
            gx = x + k * advance
            for row, bits in enumerate(glyph):
                for col, bit in enumerate(bits):
                    if bit == "#":
                        self.fill_rect(gx + col * scale, y + row * scale, scale, scale, colour)


def text_width(s, scale=2):
    return len(s) * (GLYPH_W + 1) * scale - scale


def png_bytes(width, height, rgb):
    """A PNG of 8-bit RGB pixels (rows top to bottom): signature, IHDR, one IDAT, IEND."""
    if len(rgb) != width * height * 3:
        raise ValueError("png_bytes: %d bytes of pixels for %dx%d RGB" % (len(rgb), width, height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    stride = width * 3
    raw = b"".join(b"\x00" + bytes(rgb[y * stride:(y + 1) * stride]) for y in range(height))  # filter 0: none
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit truecolour, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def render_png(plot):
    ax = Axes(plot)
    c = Canvas(W, H)
    black, grey, frame = (0, 0, 0), (0xDD, 0xDD, 0xDD), (0x44, 0x44, 0x44)
    right, bottom = W - RIGHT, H - BOTTOM
    title = plot.title
    while len(title) > 4 and text_width(title) > W - 2 * 8:  # the 5x7 font is wide: shorten to fit
        title = title[:-4].rstrip() + "..."
    c.text(8, 12, title, black)
    for v in ax.yticks():
        y = int(round(ax.py(v)))
        c.hline(LEFT, right, y, grey)
        c.hline(LEFT - 4, LEFT - 1, y, frame)
        c.text(LEFT - 8, y - GLYPH_H, tick_label(v), black, anchor="right")
    for s in ax.xticks():
        x = int(round(ax.px(s)))
        c.vline(x, bottom + 1, bottom + 4, frame)
        c.text(x, bottom + 8, "%d" % round(s), black, anchor="center")
    c.text((LEFT + right) // 2, H - 18, "step", black, anchor="center")
    clip = (LEFT + 1, TOP + 1, right - 1, bottom - 1)
    for s in sorted(plot.series, key=lambda s: s.z):
        pts = [(ax.px(x), ax.py(v)) for x, v in zip(s.xs, s.ys)]
        for (xa, ya), (xb, yb) in zip(pts, pts[1:]):
            c.line(xa, ya, xb, yb, s.colour, s.width, clip)
        if len(pts) == 1 or s.markers:
            r = s.width + 1  # a square marker, wider than its line
            for x, y in pts:
                c.fill_rect(int(round(x)) - r, int(round(y)) - r, 2 * r + 1, 2 * r + 1, s.colour, clip)
    # The frame after the curves, the legend (on white) on top of everything.
    c.hline(LEFT, right, TOP, frame)
    c.hline(LEFT, right, bottom, frame)
    c.vline(LEFT, TOP, bottom, frame)
    c.vline(right, TOP, bottom, frame)
    legend_w = max(text_width(s.label) for s in plot.series) + 40
    lx, ly = right - legend_w - 8, TOP + 8
    c.fill_rect(lx, ly, legend_w, 20 * len(plot.series) + 8, (0xFF, 0xFF, 0xFF))
    for i, s in enumerate(plot.series):
        y = ly + 6 + 20 * i
        c.fill_rect(lx + 6, y + 5, 22, 4, s.colour)
        c.text(lx + 34, y, s.label, black)
    return png_bytes(W, H, c.pixels)


def main(argv):
    if any(a in ("-h", "--help") for a in argv) or not 1 <= len(argv) <= 2:
        print(__doc__.strip())
        return 0 if argv else 2
    src = argv[0]
    try:
        plot = read_plot(src)
    except (OSError, KeyError, ValueError) as e:
        sys.stderr.write("plot_loss.py: cannot read %s: %s\n" % (src, e))
        return 2
    gpt = plot.title.startswith("train_gpt")
    out = argv[1] if len(argv) > 1 else os.path.splitext(src)[0] + (".png" if gpt else ".svg")
    ext = os.path.splitext(out)[1].lower()
    if ext not in (".png", ".svg"):
        sys.stderr.write("plot_loss.py: %s: the output must end in .png or .svg\n" % out)
        return 2
    data = render_png(plot) if ext == ".png" else render_svg(plot)
    try:
        with open(out, "wb") as f:
            f.write(data)
    except OSError as e:
        sys.stderr.write("plot_loss.py: cannot write %s: %s\n" % (out, e))
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
