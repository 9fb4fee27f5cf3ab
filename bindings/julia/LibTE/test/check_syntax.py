#!/usr/bin/env python3
"""Optional: parses LibTE.jl's Julia files with tree-sitter-julia (a real Julia grammar) and
fails on any syntax error. Julia itself parses these files when scripts/test_julia.sh runs them;
this check is what still catches a syntax error where no Julia could be installed. Needs the PyPI
packages `tree-sitter` and `tree-sitter-julia`, which scripts/install_deps.sh installs.

    python3 bindings/julia/LibTE/test/check_syntax.py [files...]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, ".."))
ROOT = os.path.normpath(os.path.join(PKG, "..", "..", ".."))
FILES = [os.path.join(PKG, "src", "LibTE.jl"), os.path.join(PKG, "src", "highlevel.jl"),
         os.path.join(PKG, "src", "ops.jl"), os.path.join(PKG, "src", "norm.jl"),
         os.path.join(PKG, "src", "modules.jl"), os.path.join(PKG, "src", "attention.jl"),
         os.path.join(PKG, "src", "training.jl"), os.path.join(PKG, "src", "checkpoint.jl"),
         os.path.join(PKG, "test", "training.jl"), os.path.join(PKG, "test", "checkpoint.jl"),
         os.path.join(PKG, "src", "gen", "libte_api.jl"), os.path.join(PKG, "test", "runtests.jl"),
         os.path.join(ROOT, "examples", "julia", "train_mlp.jl")]


def main():
    import tree_sitter_julia
    from tree_sitter import Language, Parser

    parser = Parser(Language(tree_sitter_julia.language()))
    bad = 0
    for path in sys.argv[1:] or FILES:
        src = open(path, "rb").read()
        errors = []
        stack = [parser.parse(src).root_node]
        while stack:
            n = stack.pop()
            if n.type == "ERROR" or n.is_missing:
                errors.append(n)
            stack.extend(n.children)
        rel = os.path.relpath(path, ROOT)
        print("%s %s: %d syntax errors" % ("FAIL" if errors else "PASS", rel, len(errors)))
        for e in sorted(errors, key=lambda n: n.start_point)[:10]:
            line = e.start_point[0] + 1
            print("     line %d: %s" % (line, src.split(b"\n")[line - 1].decode(errors="replace").strip()[:100]))
        bad += bool(errors)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
