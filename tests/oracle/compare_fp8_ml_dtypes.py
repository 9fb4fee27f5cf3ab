#!/usr/bin/env python3
"""Checks libte's float -> FP8 casts bit for bit against ml_dtypes, an independent implementation.

Usage: compare_fp8_ml_dtypes.py PATH/TO/te_fp8_oracle_dump

Runs the dump program (see fp8_oracle_dump.cpp), then converts the same float32 inputs with
ml_dtypes' float8_e4m3fn and float8_e5m2 and compares the codes. NaN inputs only need to give
a NaN code on both sides (the NaN code itself is implementation-defined).

Exit status: 0 all equal, 1 mismatches, 77 numpy or ml_dtypes cannot be imported (ctest SKIP).
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import ml_dtypes
except ImportError as exc:  # pragma: no cover - environment dependent
    print(f"SKIP: {exc}")
    sys.exit(77)

FORMATS = (
    # name, ml_dtypes type, largest finite value, column in the dump
    ("E4M3", ml_dtypes.float8_e4m3fn, 448.0, "e4m3"),
    ("E5M2", ml_dtypes.float8_e5m2, 57344.0, "e5m2"),
)

RECORD = np.dtype([("bits", "<u4"), ("e4m3", "u1"), ("e5m2", "u1")])


def reference_codes(x, fp8_type, fp8_max):
    # libte saturates (CUDA's __NV_SATFINITE): finite overflow and +-inf become +-max. ml_dtypes
    # does not: out-of-range values become inf (E5M2) or NaN (E4M3, which has no inf). Clipping
    # the input to [-max, max] first is exactly saturation: any |x| >= max ends at max, every
    # |x| < max is untouched and rounds as before, and NaN passes through np.clip unchanged.
    clipped = np.clip(x, np.float32(-fp8_max), np.float32(fp8_max))
    with np.errstate(invalid="ignore"):  # NaN inputs are expected here
        return clipped.astype(fp8_type).view(np.uint8)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "fp8_codes.bin")
        subprocess.run([sys.argv[1], dump], check=True)
        records = np.fromfile(dump, dtype=RECORD)
    x = records["bits"].view(np.float32)
    failures = 0
    for name, fp8_type, fp8_max, column in FORMATS:
        ours = records[column]
        theirs = reference_codes(x, fp8_type, fp8_max)
        ours_nan = np.isnan(ours.view(fp8_type).astype(np.float32))
        theirs_nan = np.isnan(theirs.view(fp8_type).astype(np.float32))
        equal = (ours == theirs) | (ours_nan & theirs_nan)
        bad = np.flatnonzero(~equal)
        nan_inputs = int(np.isnan(x).sum())
        print(f"{name}: {len(x)} inputs ({nan_inputs} NaN), {len(bad)} mismatches")
        for i in bad[:20]:
            print(f"  x={x[i]!r} (0x{records['bits'][i]:08x}): libte 0x{ours[i]:02x}, "
                  f"ml_dtypes 0x{theirs[i]:02x}")
        failures += len(bad)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
