#!/usr/bin/env python3
"""Static checks of the hand-written Julia code of LibTE.jl, which need no Julia runtime (they still
run when scripts/test_julia.sh has no Julia to run the code itself).

  names      every te_* / TE_* name the high-level layer, the tests and the example use is
             defined by the generated wrappers; every `LibTE.x`, every `using LibTE: x` and every
             exported name is defined in the package; every function the tests and the example
             call is defined in the file, exported or imported from LibTE, or a known Base /
             stdlib function (a typo in a call fails here)
  blocks     a lexical lint: `function`/`if`/`for`/`while`/`let`/`begin`/`try`/`do`/`struct`/
             `module`/`macro`/`quote` openers balance their `end`s and brackets balance, ignoring
             strings, comments and `end`/`begin` used as indices

Prints one PASS/FAIL line per check and exits non-zero on any failure.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, ".."))
ROOT = os.path.normpath(os.path.join(PKG, "..", "..", ".."))
GEN = os.path.join(PKG, "src", "gen", "libte_api.jl")
MODULE = os.path.join(PKG, "src", "LibTE.jl")
HIGHLEVEL = os.path.join(PKG, "src", "highlevel.jl")
OPS = os.path.join(PKG, "src", "ops.jl")
NORM = os.path.join(PKG, "src", "norm.jl")
MODULES = os.path.join(PKG, "src", "modules.jl")
ATTENTION = os.path.join(PKG, "src", "attention.jl")
TRAINING = os.path.join(PKG, "src", "training.jl")
CHECKPOINT = os.path.join(PKG, "src", "checkpoint.jl")
TESTS = os.path.join(PKG, "test", "runtests.jl")
# Test files runtests.jl includes (they share its imports and helpers).
TEST_PARTS = [os.path.join(PKG, "test", f) for f in ("training.jl", "checkpoint.jl")]
EXAMPLE = os.path.join(ROOT, "examples", "julia", "train_mlp.jl")
SRC_FILES = (HIGHLEVEL, OPS, NORM, MODULES, ATTENTION, TRAINING, CHECKPOINT)
HANDWRITTEN = [MODULE, *SRC_FILES, TESTS, *TEST_PARTS, EXAMPLE]

# Base / Core / stdlib (Test, LinearAlgebra, Libdl, GC) functions and macros the hand-written code
# calls. A call of anything else must be defined in the package or in the calling file.
KNOWN = set("""
abs abspath all any Array ArgumentError Base close codeunits collect convert copy Cuint Cint
DomainError Dict dlopen eachindex eltype eps error exit fieldcount fieldname fieldtype fill! Float16
Float32 Float64 finalizer gc get getfield haskey hasfield Int Int32 Int64 isbitstype isdefined isdir
isempty isopen joinpath keys length lock log lpad map max maximum min norm ntuple ones open pairs
pointer print println Ptr Ref ReentrantLock resize! reverse rethrow round similar sin size sizeof
sprint sqrt startswith occursin showerror string sum tanh throw trylock Tuple typeof UInt16 UInt32
UInt64 UInt8 unlock unsafe_convert unsafe_load unsafe_string vec VersionNumber view zeros zip cos
isnothing ndims show cconvert Val first last push! in exp warn nothing iszero new
UInt isfile Set Symbol eachmatch realpath isnan significand permutedims read something unsafe_copyto!
join foreach empty! prod atomic_add! atomic_sub! atomic_cas! Atomic dlsym dlpath reinterpret copyto!
testset test test_throws assert preserve eval warn time elapsed
vcat hcat fill repeat reshape
enumerate cumsum sort rm tempname write setfield! deepcopy typemax typemin String resize! Vector include
""".split())


def strip_code(text):
    """Julia source with comments and string/char literal contents blanked (lengths kept)."""
    out = []
    i, n = 0, len(text)
    prev = ""
    while i < n:
        c = text[i]
        if text.startswith("#=", i):
            j = text.find("=#", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "#":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if text.startswith('"""', i):
            j = text.find('"""', i + 3)
            j = n if j < 0 else j + 3
            out.append('"' + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + '"')
            i = j
            prev = '"'
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append('"' + " " * (j - i - 2) + '"')
            i = j
            prev = '"'
            continue
        if c == "'":
            # adjoint after an identifier, `)`, `]` or another `'`; else a Char literal
            if prev and (prev.isalnum() or prev in "_)]}'"):
                out.append(c)
                i += 1
                prev = c
                continue
            m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:])
            if m:
                out.append("'" + " " * (len(m.group(0)) - 2) + "'")
                i += len(m.group(0))
                prev = "'"
                continue
        out.append(c)
        if not c.isspace():
            prev = c
        i += 1
    return "".join(out)


OPENERS = {"function", "if", "for", "while", "let", "begin", "try", "do", "struct", "module",
           "baremodule", "macro", "quote"}


def block_lint(path):
    text = strip_code(open(path, encoding="utf-8").read())
    problems = []
    stack = []  # ('kw'|'(' ..., line)
    for m in re.finditer(r"[A-Za-z_][A-Za-z_0-9!]*|[()\[\]{}]|\S", text):
        tok = m.group(0)
        line = text.count("\n", 0, m.start()) + 1
        in_brackets = any(k in "([{" for k, _ in stack)
        if tok in "([{":
            stack.append((tok, line))
        elif tok in ")]}":
            want = {")": "(", "]": "[", "}": "{"}[tok]
            if not stack or stack[-1][0] != want:
                problems.append("%s:%d: unbalanced %r (open: %s)" % (os.path.basename(path), line, tok,
                                                                      stack[-1] if stack else None))
                return problems
            stack.pop()
        elif tok in OPENERS:
            prev = text[:m.start()].rstrip()
            if tok == "begin" and stack and stack[-1][0] == "[":
                continue  # a[begin]
            if tok == "for" and in_brackets and stack[-1][0] in "([":
                # comprehension / generator: `for` inside brackets without its own `end`
                # (a `for` block inside parentheses would need one; this code has none)
                continue
            if tok == "if" and in_brackets and stack[-1][0] in "([" and re.search(r"for\b[^()\[\]]*$", prev):
                continue  # filter of a comprehension
            if tok == "struct" and prev.endswith("mutable"):
                pass
            stack.append((tok, line))
        elif tok == "end":
            if stack and stack[-1][0] == "[":
                continue  # a[end]
            if not stack or stack[-1][0] not in OPENERS | {"abstract", "primitive"}:
                problems.append("%s:%d: `end` without an opener (open: %s)" % (os.path.basename(path), line,
                                                                               stack[-1] if stack else None))
                return problems
            stack.pop()
        elif tok in ("abstract", "primitive"):
            if re.match(r"\s+type\b", text[m.end():]):
                stack.append((tok, line))
    if stack:
        problems.append("%s: unclosed %s" % (os.path.basename(path), ", ".join("%s (line %d)" % s for s in stack)))
    return problems


def defined_names(text):
    code = strip_code(text)
    names = set()
    for pat in (r"^\s*(?:mutable\s+)?struct\s+(\w+)", r"^\s*abstract\s+type\s+(\w+)",
                r"^\s*(?:@inline\s+)?function\s+(?:Base\.)?([\w!]+)\s*\(", r"^\s*(?:Base\.)?([\w!]+)\((?:[^()]|\([^()]*\))*\)\s*(?:where\s*\{[^}]*\}\s*)?=",
                r"^\s*const\s+(\w+)", r"^\s*macro\s+(\w+)", r"^\s*(?:Base\.)?([\w!]+)\(::Type"):
        names.update(re.findall(pat, code, re.M))
    for m in re.finditer(r"^\s*const\s+((?:\w+\s*,\s*)+\w+)\s*=", code, re.M):
        names.update(x.strip() for x in m.group(1).split(","))
    # parameters (callables passed in: f, init, destroy) and `where {T}` type parameters
    for m in re.finditer(r"(?:function\s+[\w.!]+|^\s*[\w.!]+)\(((?:[^()]|\([^()]*\))*)\)", code, re.M):
        for p in re.split(r"[,;]", m.group(1)):
            pm = re.match(r"\s*([A-Za-z_]\w*)", p)
            if pm:
                names.add(pm.group(1))
    for m in re.finditer(r"where\s*\{([^}]*)\}", code):
        names.update(re.findall(r"[A-Za-z_]\w*", m.group(1)))
    for m in re.finditer(r"\bwhere\s+([A-Za-z_]\w*)", code):
        names.add(m.group(1))
    return names


def main():
    failed = passed = 0

    def report(name, problems):
        nonlocal failed, passed
        if problems:
            failed += 1
            print("FAIL %s" % name)
            for p in problems[:40]:
                print("     %s" % p)
        else:
            passed += 1
            print("PASS %s" % name)

    gen_text = open(GEN, encoding="utf-8").read()
    gen = set(re.findall(r"^function (te_\w+)\(", gen_text, re.M))
    gen |= set(re.findall(r"^const (\w+) =", gen_text, re.M))
    gen |= set(re.findall(r"^struct (\w+)$", gen_text, re.M))
    hl_text = "\n".join(open(p, encoding="utf-8").read() for p in SRC_FILES)
    mod_text = open(MODULE, encoding="utf-8").read()
    package = gen | defined_names(hl_text) | defined_names(mod_text)

    # te_* / TE_* names in hand-written code.
    problems = []
    for path in HANDWRITTEN:
        code = strip_code(open(path, encoding="utf-8").read())
        for name in sorted(set(re.findall(r"\b(te_\w+|TE_\w+)\b", code))):
            if name not in gen:
                problems.append("%s uses %s, which the generated wrappers do not define"
                                % (os.path.relpath(path, ROOT), name))
    report("every te_*/TE_* name used by the high-level layer, tests and example is generated (%d files)"
           % len(HANDWRITTEN), problems)

    # Exports, qualified names, imports.
    exports = set()
    for m in re.finditer(r"^export\s+((?:[\w!]+\s*,\s*)*[\w!]+)", strip_code(hl_text + "\n" + mod_text), re.M):
        exports.update(x.strip() for x in m.group(1).replace("\n", " ").split(","))
    problems = ["export %s is not defined" % e for e in sorted(exports) if e not in package]
    imported = {}
    for path in (TESTS, EXAMPLE, *TEST_PARTS):
        code = strip_code(open(path, encoding="utf-8").read())
        for name in set(re.findall(r"\bLibTE\.([A-Za-z_][\w!]*)", code)):
            if name not in package:
                problems.append("%s uses LibTE.%s, which is not defined" % (os.path.relpath(path, ROOT), name))
        imp = set()
        for m in re.finditer(r"^using LibTE:\s*((?:[\w!]+\s*,\s*)*[\w!]+)", code, re.M):
            imp.update(x.strip() for x in m.group(1).split(","))
        for name in imp:
            if name not in package:
                problems.append("%s imports LibTE.%s, which is not defined" % (os.path.relpath(path, ROOT), name))
        imported[path] = imp
    for path in TEST_PARTS:  # included by runtests.jl: its imports and helpers apply
        imported[path] |= imported[TESTS] | defined_names(open(TESTS, encoding="utf-8").read())
    report("exports, `LibTE.x` and `using LibTE: x` names are all defined (%d exports)" % len(exports), problems)

    # Calls in the tests and the example.
    problems = []
    for path in (TESTS, *TEST_PARTS, EXAMPLE, *SRC_FILES):
        text = open(path, encoding="utf-8").read()
        code = strip_code(text)
        local = defined_names(text)
        # local variables bound to functions (`gelu(v) = ...` is caught above); do-block args etc.
        for m in re.finditer(r"(?<![\w.!:])([A-Za-z_][\w]*!?)\(", code):
            name = m.group(1)
            if name in OPENERS or name in ("end", "else", "elseif", "return", "where", "catch", "in", "isa",
                                           "local", "global", "const", "export", "using", "import"):
                continue
            prev = code[:m.start()].rstrip()
            if prev.endswith("function"):
                continue
            if (name in local or name in package or name in exports or name in imported.get(path, set())
                    or name in KNOWN):
                continue
            line = code.count("\n", 0, m.start()) + 1
            problems.append("%s:%d: call of %s: not defined here, in LibTE, or known to this check"
                            % (os.path.relpath(path, ROOT), line, name))
    report("every function the tests, example and high-level layer call exists", problems)

    for path in HANDWRITTEN + [GEN]:
        report("blocks and brackets balance in %s" % os.path.relpath(path, ROOT), block_lint(path))

    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
