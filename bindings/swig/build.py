#!/usr/bin/env python3
"""Builds the SWIG accelerator libte._te_swig into bindings/python/libte/.

    python3 bindings/swig/build.py [--libdir build/release] [--force]

Runs `swig -python -builtin` on bindings/swig/te.i (generated C in build/swig-python/), then
compiles it with the C compiler and this Python's headers, linked against libte.so from
--libdir. Up to date outputs (newer than te.i, te.h, this script and that libte.so) are left
alone (idempotent). The module finds libte.so at run time through the package, which loads it
first (LIBTE_PATH, ...); no rpath is baked in.

A libte.so that does not export GroupedLinear (te_grouped_linear_*: built before the module
existed) gets a module without it (TE_SWIG_WITHOUT_GROUPED_LINEAR), so that it still imports:
Python resolves every symbol of an extension when it loads it. Likewise attention and RoPE
(te_attention_*, te_rope_*: TE_SWIG_WITHOUT_ATTENTION).
"""

import argparse
import ctypes
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INTERFACE = os.path.join(ROOT, "bindings", "swig", "te.i")
HEADER = os.path.join(ROOT, "capi", "include", "te", "te.h")
PACKAGE = os.path.join(ROOT, "bindings", "python", "libte")
WORK = os.path.join(ROOT, "build", "swig-python")


def run(cmd):
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.check_call(cmd)


def exports(library, symbol):
    """Whether the shared library at `library` exports `symbol`."""
    try:
        return hasattr(ctypes.CDLL(os.path.abspath(library)), symbol)
    except OSError as e:
        sys.exit("build.py: cannot load %s: %s" % (library, e))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--libdir", default=os.path.join(ROOT, "build", "release"),
                        help="directory holding libte.so (default build/release)")
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args()

    swig = shutil.which("swig") or shutil.which("swig4.0")
    if swig is None:
        sys.exit("build.py: swig not found (Debian: apt-get install swig)")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        sys.exit("build.py: Python.h not found in %s (Debian: apt-get install python3-dev)"
                 % include)
    if not os.path.exists(os.path.join(args.libdir, "libte.so")):
        sys.exit("build.py: %s/libte.so not found; build libte first" % args.libdir)

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    module = os.path.join(PACKAGE, "__te_swig" + suffix)
    wrapper = os.path.join(WORK, "te_wrap.c")
    library = os.path.join(args.libdir, "libte.so")
    sources = [INTERFACE, HEADER, os.path.abspath(__file__), os.path.realpath(library)]
    if (not args.force and os.path.exists(module)
            and os.path.exists(os.path.join(PACKAGE, "_te_swig.py"))
            and os.path.getmtime(module) >= max(os.path.getmtime(s) for s in sources)):
        print("build.py: %s is up to date" % os.path.relpath(module, ROOT))
        return

    defines = []
    if not exports(library, "te_grouped_linear_create"):
        print("build.py: %s does not export te_grouped_linear_*: building without GroupedLinear"
              % library)
        defines.append("-DTE_SWIG_WITHOUT_GROUPED_LINEAR")
    if not exports(library, "te_attention_create") or not exports(library, "te_rope_forward"):
        print("build.py: %s does not export te_attention_* / te_rope_*: building without "
              "attention" % library)
        defines.append("-DTE_SWIG_WITHOUT_ATTENTION")
    os.makedirs(WORK, exist_ok=True)
    run([swig, "-python", "-builtin", "-O", "-I" + os.path.join(ROOT, "capi", "include")]
        + defines + ["-outdir", PACKAGE, "-o", wrapper, INTERFACE])
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    run(shlex.split(cc) + ["-O2", "-fPIC", "-shared", "-w"] + defines + ["-I" + include,
                           "-I" + os.path.join(ROOT, "capi", "include"), wrapper,
                           "-L" + os.path.abspath(args.libdir), "-lte", "-o", module])
    print("build.py: built %s" % os.path.relpath(module, ROOT))


if __name__ == "__main__":
    main()
