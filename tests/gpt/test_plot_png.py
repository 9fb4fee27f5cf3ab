#!/usr/bin/env python3
"""test_plot_png.py: scripts/plot_loss.py's PNG writer and its train_gpt plot (ctest gpt.plot_png).

Decodes the PNGs with an independent reader written here (chunk walk, CRC check, zlib, filter
type 0), so a wrong length, CRC, IHDR or row layout fails. Standard library only; exit 0 or 1.
"""
import importlib.util
import os
import struct
import subprocess
import sys
import tempfile
import unittest
import zlib

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "plot_loss.py")

spec = importlib.util.spec_from_file_location("plot_loss", SCRIPT)
plot_loss = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_loss)


def decode_png(data):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "bad signature"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert len(body) == length, "chunk %r truncated" % kind
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, "bad CRC in %r" % kind
        chunks.append((kind, body))
        pos += 12 + length
    assert pos == len(data), "trailing bytes"
    kinds = [k for k, _ in chunks]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds, kinds
    width, height, depth, colour, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, comp, filt, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    stride = 1 + 3 * width
    assert len(raw) == height * stride, "IDAT holds %d bytes, not %d" % (len(raw), height * stride)
    rows = []
    for y in range(height):
        line = raw[y * stride:(y + 1) * stride]
        assert line[0] == 0, "row %d: filter %d" % (y, line[0])
        rows.append([tuple(line[1 + 3 * x:4 + 3 * x]) for x in range(width)])
    return width, height, rows


GPT_CSV = "run,step,train_loss,val_loss,tokens_per_s\n" + "".join(
    "%s,%d,%.4f,%s,%s\n" % (run, s, 5.5 - 0.03 * s + (0.01 if run == "fp8" else 0),
                            "%.4f" % (5.4 - 0.03 * s + (0.3 if run == "fp8" else 0)) if s % 10 == 0 else "", "1000.5" if s else "")
    for run in ("fp8", "baseline") for s in range(101))


class PngWriter(unittest.TestCase):
    def test_tiny_image_round_trips(self):
        rgb = bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30, 40, 50, 60, 70, 80, 90])
        w, h, rows = decode_png(plot_loss.png_bytes(3, 2, rgb))
        self.assertEqual((w, h), (3, 2))
        self.assertEqual(rows, [[(255, 0, 0), (0, 255, 0), (0, 0, 255)],
                                [(10, 20, 30), (40, 50, 60), (70, 80, 90)]])

    def test_wrong_pixel_count_is_refused(self):
        with self.assertRaises(ValueError):
            plot_loss.png_bytes(3, 2, bytes(17))

    def test_corruption_is_detected_by_the_reader(self):
        data = bytearray(plot_loss.png_bytes(2, 2, bytes(12)))
        data[20] ^= 1  # inside IHDR's data
        with self.assertRaises(AssertionError):
            decode_png(bytes(data))


class GptPlot(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="te_plot_png_")
        self.csv = os.path.join(self.dir, "gpt_loss.csv")
        with open(self.csv, "w") as f:
            f.write(GPT_CSV)

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True)

    def test_png_of_a_gpt_csv(self):
        out = os.path.join(self.dir, "loss.png")
        r = self.run_script(self.csv, out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), out)
        with open(out, "rb") as f:
            w, h, rows = decode_png(f.read())
        self.assertEqual((w, h), (plot_loss.W, plot_loss.H))
        counts = {}
        for row in rows:
            for px in row:
                counts[px] = counts.get(px, 0) + 1
        self.assertGreater(counts.get((255, 255, 255), 0), w * h // 2)  # a white background
        self.assertGreater(counts.get((0, 0, 0), 0), 500)               # text
        for light, dark in plot_loss.RUN_COLOURS.values():              # the 4 curves
            self.assertGreater(counts.get(light, 0), 100)
            self.assertGreater(counts.get(dark, 0), 100)

    def test_default_output_is_png_beside_the_csv(self):
        r = self.run_script(self.csv)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "gpt_loss.png")))

    def test_the_mlp_csv_still_gives_an_svg(self):
        mlp = os.path.join(self.dir, "train_mlp_loss.csv")
        with open(mlp, "w") as f:
            f.write("step,loss_fp8,loss_fp32\n0,0.7,0.7\n1,0.5,0.4\n2,0.1,0.1\n")
        r = self.run_script(mlp)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.dir, "train_mlp_loss.svg")) as f:
            svg = f.read()
        self.assertTrue(svg.startswith("<svg") and svg.count("<polyline") == 2)

    def test_bad_input_exits_2(self):
        bad = os.path.join(self.dir, "bad.csv")
        with open(bad, "w") as f:
            f.write("run,step,train_loss,val_loss,tokens_per_s\nfp8,notanumber,1,,\n")
        self.assertEqual(self.run_script(bad, os.path.join(self.dir, "x.png")).returncode, 2)
        self.assertEqual(self.run_script(os.path.join(self.dir, "missing.csv")).returncode, 2)
        self.assertEqual(self.run_script(self.csv, os.path.join(self.dir, "x.jpg")).returncode, 2)


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
