#!/usr/bin/env python3
"""Checks the generated Julia wrappers (src/gen/libte_api.jl) against the C compiler.

It needs no Julia: it catches header drift and layout mistakes also where no Julia can be
installed (scripts/test_julia.sh runs it before runtests.jl). The script does not reuse the
generator: it parses the *Julia file*, models Julia's own layout of
every `struct` it declares (isbits structs are laid out by the C rules: each field at the next
multiple of its alignment, the size rounded up to the largest alignment; `NTuple{N, T}` is N
T's; `Ptr` is 8 bytes), and compiles a C++17 program against the real header (te.h is also
valid C++) that prints what the compiler says. It then compares:

  layout     sizeof/alignof of every struct, offsetof and type of every field, against both
             Julia's layout rules and the offsets the generator wrote into its comments; the
             field lists against the header's struct bodies
  enums      sizeof of every enum type (4, as `Cint`), every enumerator's value and type
  defines    the value, size and signedness of every integer #define
  aliases    every scalar typedef (te_autocast_token)
  ccalls     for every wrapper, the return type and each argument type written in the ccall
             against the function's real prototype, extracted by template deduction from
             `&te_fn` (pointer depth, pointee struct or opaque handle, integer size and
             signedness, enum, float); and that every TE_API function of te.h has a wrapper
  library    when a built libte.so is found: every wrapped symbol is exported by it, its soname
             is `libte.so.0` (what `LibTE.libte` names), loading it by path makes the soname
             resolve (what LIBTE_PATH relies on), and a few calls made through ctypes with the
             Julia signatures and Julia struct offsets read back the documented defaults

Prints one `PASS`/`FAIL` line per check and exits non-zero on any failure.

    python3 bindings/julia/LibTE/test/check_abi.py [--lib path/to/libte.so.0] [--keep]
"""
import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, ".."))
ROOT = os.path.normpath(os.path.join(PKG, "..", "..", ".."))
HEADER_DIR = os.path.join(ROOT, "capi", "include")
HEADER = os.path.join(HEADER_DIR, "te", "te.h")
GEN = os.path.join(PKG, "src", "gen", "libte_api.jl")

# Julia scalar types on LP64 Linux: (size, alignment, descriptor)
JULIA_SCALARS = {
    "Cchar": (1, 1, "c1"),
    "Int8": (1, 1, "i1s"), "UInt8": (1, 1, "i1u"),
    "Int16": (2, 2, "i2s"), "UInt16": (2, 2, "i2u"), "Cshort": (2, 2, "i2s"), "Cushort": (2, 2, "i2u"),
    "Int32": (4, 4, "i4s"), "UInt32": (4, 4, "i4u"), "Cint": (4, 4, "i4s"), "Cuint": (4, 4, "i4u"),
    "Int64": (8, 8, "i8s"), "UInt64": (8, 8, "i8u"), "Clong": (8, 8, "i8s"), "Culong": (8, 8, "i8u"),
    "Clonglong": (8, 8, "i8s"), "Culonglong": (8, 8, "i8u"),
    "Csize_t": (8, 8, "i8u"), "Cptrdiff_t": (8, 8, "i8s"),
    "Cfloat": (4, 4, "f4"), "Float32": (4, 4, "f4"), "Cdouble": (8, 8, "f8"), "Float64": (8, 8, "f8"),
}


class Julia:
    """What the generated Julia file declares."""

    def __init__(self, text):
        self.text = text
        self.int_consts = {}  # name -> (value, 'Cint'|'Cuint')
        self.enums = {}  # enum type name -> [(enumerator, value)]
        self.opaques = set()
        self.aliases = {}  # name -> julia type string
        self.structs = {}  # name -> [(field, type string, generator's offset)]
        self.struct_sizes = {}  # name -> generator's size comment
        self.functions = {}  # name -> (params, ret, [arg types], [call args])
        self.parse()

    def parse(self):
        lines = self.text.split("\n")
        i = 0
        pending_enum = None
        while i < len(lines):
            ln = lines[i]
            m = re.match(r"# enum (\w+)$", ln)
            if m:
                pending_enum = m.group(1)
                i += 1
                continue
            m = re.match(r"const (\w+) = (Cint|Cuint)\((-?\d+)\)", ln)
            if m:
                self.int_consts[m.group(1)] = (int(m.group(3)), m.group(2))
                i += 1
                continue
            m = re.match(r"const (\w+) = Cint$", ln)
            if m:
                if m.group(1) != pending_enum:
                    raise SystemExit("check_abi: %s = Cint without an '# enum' marker" % m.group(1))
                self.enums[m.group(1)] = []
                i += 1
                continue
            m = re.match(r"const (\w+) = (\w+)\((-?\d+)\)$", ln)
            if m and m.group(2) in self.enums:
                self.enums[m.group(2)].append((m.group(1), int(m.group(3))))
                i += 1
                continue
            m = re.match(r"const (\w+) = Cvoid$", ln)
            if m:
                self.opaques.add(m.group(1))
                i += 1
                continue
            m = re.match(r"const (\w+) = ([\w{}, ]+?)\s*(#.*)?$", ln)
            if m and m.group(1) != "TE_API_FUNCTIONS":
                self.aliases[m.group(1)] = m.group(2)
                i += 1
                continue
            m = re.match(r"# struct (\w+): (\d+) bytes", ln)
            if m:
                self.struct_sizes[m.group(1)] = int(m.group(2))
            m = re.match(r"struct (\w+)$", ln)
            if m:
                name, fields = m.group(1), []
                i += 1
                while lines[i] != "end":
                    f = re.match(r"    (\w+)::(.+?)  # offset (\d+): ", lines[i])
                    if f:
                        fields.append((f.group(1), f.group(2), int(f.group(3))))
                    elif not lines[i].lstrip().startswith("#"):
                        raise SystemExit("check_abi: cannot read struct line %r" % lines[i])
                    i += 1
                self.structs[name] = fields
                i += 1
                continue
            m = re.match(r"function (te_\w+)\((.*)\)$", ln)
            if m:
                name, params = m.group(1), [p.strip() for p in m.group(2).split(",") if p.strip()]
                body = lines[i + 1]
                c = re.fullmatch(r"    ccall\(\(:(\w+), libte\), (.+?), \((.*?)\)((?:, \w+)*)\)", body)
                if not c or lines[i + 2] != "end":
                    raise SystemExit("check_abi: cannot read the wrapper of %s: %r" % (name, body))
                if c.group(1) != name:
                    raise SystemExit("check_abi: wrapper %s calls %s" % (name, c.group(1)))
                types = split_types(c.group(3))
                call_args = [a.strip() for a in c.group(4).split(",") if a.strip()]
                self.functions[name] = (params, c.group(2), types, call_args)
                i += 3
                continue
            i += 1

    # ---- Julia's layout rules ------------------------------------------------------------

    def size_align(self, t):
        t = t.strip()
        if t in JULIA_SCALARS:
            s, a, _ = JULIA_SCALARS[t]
            return s, a
        if t.startswith("Ptr{") or t == "Cstring":
            return 8, 8
        m = re.fullmatch(r"NTuple\{(\d+), (.+)\}", t)
        if m:
            s, a = self.size_align(m.group(2))
            return s * int(m.group(1)), a
        if t in self.enums:
            return 4, 4
        if t in self.aliases:
            return self.size_align(self.aliases[t])
        if t in self.structs:
            lay = self.layout(t)
            return lay[0], lay[1]
        raise SystemExit("check_abi: no Julia layout for type %r" % t)

    def layout(self, name):
        off, align, offsets = 0, 1, []
        for _, t, _ in self.structs[name]:
            s, a = self.size_align(t)
            off = (off + a - 1) // a * a
            offsets.append(off)
            off += s
            align = max(align, a)
        return (off + align - 1) // align * align, align, offsets

    def desc(self, t):
        """A descriptor of a Julia type comparable with the C++ side's."""
        t = t.strip()
        if t == "Cvoid":
            return "v"
        if t == "Cstring":
            return "p(c1)"
        m = re.fullmatch(r"Ptr\{(.+)\}", t)
        if m:
            return "p(%s)" % self.desc(m.group(1))
        m = re.fullmatch(r"NTuple\{(\d+), (.+)\}", t)
        if m:
            return "a%s(%s)" % (m.group(1), self.desc(m.group(2)))
        if t in JULIA_SCALARS:
            return JULIA_SCALARS[t][2]
        if t in self.enums:
            return "e4"
        if t in self.opaques:
            return "o:" + t
        if t in self.structs:
            return "s:" + t
        if t in self.aliases:
            return self.desc(self.aliases[t])
        raise SystemExit("check_abi: unknown Julia type %r" % t)


def split_types(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            if cur.strip():
                out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def header_facts(text):
    """An independent regex reading of te.h: functions, struct field names, enumerators."""
    code = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    code = re.sub(r"(?m)^\s*#.*$", " ", code)
    funcs = re.findall(r"\bTE_API\b[^;(]*?\b(te_\w+)\s*\(", code)
    structs = {}
    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{([^{}]*)\}", code):
        structs[m.group(1)] = [re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", x).group(1)
                               for x in m.group(2).split(";") if x.strip()]
    enums = {}
    for m in re.finditer(r"typedef\s+enum\s+(\w+)\s*\{([^{}]*)\}", code):
        enums[m.group(1)] = [x.split("=")[0].strip() for x in m.group(2).split(",") if x.strip()]
    defines = re.findall(r"(?m)^[ \t]*#[ \t]*define[ \t]+(TE_\w+)[ \t]+\S", text)
    defines = [d for d in defines if d != "TE_API"]
    return funcs, structs, enums, defines


CPP_PRELUDE = r"""
#include <te/te.h>
#include <cstddef>
#include <cstdio>
#include <string>
#include <type_traits>

template <class T> struct Name;  // specialised for every struct and opaque type below

template <class T> std::string desc() {
  if constexpr (std::is_void_v<T>) return "v";
  else if constexpr (std::is_same_v<T, char>) return "c1";
  else if constexpr (std::is_enum_v<T>) return "e" + std::to_string(sizeof(T));
  else if constexpr (std::is_integral_v<T>)
    return "i" + std::to_string(sizeof(T)) + (std::is_signed_v<T> ? "s" : "u");
  else if constexpr (std::is_floating_point_v<T>) return "f" + std::to_string(sizeof(T));
  else if constexpr (std::is_pointer_v<T>)
    return "p(" + desc<std::remove_cv_t<std::remove_pointer_t<T>>>() + ")";
  else if constexpr (std::is_array_v<T>)
    return "a" + std::to_string(std::extent_v<T>) + "(" + desc<std::remove_cv_t<std::remove_extent_t<T>>>() + ")";
  else return Name<T>::get();
}

template <class R, class... A> std::string sig(R (*)(A...)) {
  std::string s = desc<R>() + "<-";
  ((s += desc<A>() + ","), ...);
  return s;
}
"""


def build_cpp(jl):
    out = [CPP_PRELUDE]
    for s in jl.structs:
        out.append('template <> struct Name<%s> { static std::string get() { return "s:%s"; } };' % (s, s))
    for o in sorted(jl.opaques):
        out.append('template <> struct Name<%s> { static std::string get() { return "o:%s"; } };' % (o, o))
    out.append("int main() {")
    for s, fields in jl.structs.items():
        out.append('  std::printf("struct %s %%zu %%zu\\n", sizeof(%s), alignof(%s));' % (s, s, s))
        for f, _, _ in fields:
            out.append('  std::printf("field %s %s %%zu %%s\\n", offsetof(%s, %s), desc<decltype(%s::%s)>().c_str());'
                       % (s, f, s, f, s, f))
    for e, members in jl.enums.items():
        out.append('  std::printf("enum %s %%zu %%d\\n", sizeof(%s), (int)std::is_enum_v<%s>);' % (e, e, e))
        for m, _ in members:
            out.append("  static_assert(std::is_same_v<decltype(%s), %s>, \"%s is not a %s\");" % (m, e, m, e))
            out.append('  std::printf("enumerator %s %%lld\\n", (long long)%s);' % (m, m))
    for c in jl.int_consts:
        out.append('  std::printf("define %s %%lld %%zu %%d\\n", (long long)(%s), sizeof(%s), (int)std::is_signed_v<decltype(%s)>);'
                   % (c, c, c, c))
    for a in jl.aliases:
        out.append('  std::printf("alias %s %%s\\n", desc<%s>().c_str());' % (a, a))
    for f in jl.functions:
        out.append('  std::printf("func %s %%s\\n", sig(static_cast<decltype(&%s)>(nullptr)).c_str());' % (f, f))
    out.append("  return 0;\n}\n")
    return "\n".join(out)


class Report:
    def __init__(self):
        self.passed, self.failed = 0, 0

    def check(self, name, problems):
        if problems:
            self.failed += 1
            print("FAIL %s" % name)
            for p in problems[:40]:
                print("     %s" % p)
            if len(problems) > 40:
                print("     ... and %d more" % (len(problems) - 40))
        else:
            self.passed += 1
            print("PASS %s" % name)


def find_library(explicit):
    cands = [explicit] if explicit else []
    env = os.environ.get("LIBTE_PATH")
    if env:
        cands.append(os.path.join(env, "libte.so.0") if os.path.isdir(env) else env)
    for d in ("build/release", "build", "build-pkg"):
        cands.append(os.path.join(ROOT, d, "libte.so.0"))
    for c in cands:
        if c and os.path.isfile(c):
            return os.path.abspath(c)
    return None


LOADER_PROBE = r"""
import ctypes, os, sys
path = sys.argv[1]
ctypes.CDLL(path)  # what LibTE.__init__ does with LIBTE_PATH
# ...after which "libte.so.0", the name every ccall uses, must resolve to the loaded copy
# without any search path: dlopen matches an already loaded object by its soname.
h = ctypes.CDLL("libte.so.0", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
print("ok", h._handle != 0)
"""


def library_checks(jl, lib, report):
    # Exported symbols.
    try:
        nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
        exported = set(re.findall(r"\s[TW]\s+(te_\w+)", nm))
        report.check("library exports every wrapped function (%s)" % os.path.relpath(lib, ROOT),
                     ["%s is not exported" % f for f in jl.functions if f not in exported])
    except (OSError, subprocess.CalledProcessError) as e:
        report.check("library exports every wrapped function", ["nm failed: %s" % e])
    # Soname.
    try:
        rd = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
        m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", rd)
        soname = m.group(1) if m else None
        want = re.search(r'const libte = "([^"]+)"', open(os.path.join(PKG, "src", "LibTE.jl")).read())
        want = want.group(1) if want else None
        report.check("soname %s is the name LibTE.libte uses (%s)" % (soname, want),
                     [] if soname and soname == want else ["soname %r, LibTE.libte %r" % (soname, want)])
    except (OSError, subprocess.CalledProcessError) as e:
        report.check("library soname", ["readelf failed: %s" % e])
    # The LIBTE_PATH mechanism: load by path, then resolve by soname with no search path.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    r = subprocess.run([sys.executable, "-c", LOADER_PROBE, lib], capture_output=True, text=True, env=env,
                       cwd=tempfile.gettempdir())
    report.check("LIBTE_PATH loading: the soname resolves after loading the file by path",
                 [] if r.returncode == 0 and "ok True" in r.stdout else [(r.stdout + r.stderr).strip()])
    # A few calls with the Julia signatures and offsets.
    report.check("calls through the Julia signatures and struct offsets", smoke_calls(jl, lib))


CTYPES = {
    "c1": ctypes.c_char, "i1s": ctypes.c_int8, "i1u": ctypes.c_uint8, "i2s": ctypes.c_int16, "i2u": ctypes.c_uint16,
    "i4s": ctypes.c_int32, "i4u": ctypes.c_uint32, "i8s": ctypes.c_int64, "i8u": ctypes.c_uint64,
    "f4": ctypes.c_float, "f8": ctypes.c_double, "e4": ctypes.c_int32,
}


def ctype_of(jl, t):
    d = jl.desc(t)
    if d == "v":
        return None
    if d.startswith("p("):
        return ctypes.c_char_p if t == "Cstring" else ctypes.c_void_p
    return CTYPES[d]


def smoke_calls(jl, path):
    problems = []
    lib = ctypes.CDLL(path)

    def fn(name):
        params, ret, types, _ = jl.functions[name]
        f = getattr(lib, name)
        f.restype = ctype_of(jl, ret)
        f.argtypes = [ctype_of(jl, t) for t in types]
        return f

    def field(struct, buf, fname):
        size, _, offsets = jl.layout(struct)
        for (f, t, _), off in zip(jl.structs[struct], offsets):
            if f == fname:
                return ctype_of(jl, t).from_buffer(buf, off).value
        raise KeyError(fname)

    v = fn("te_version")()
    want = jl.int_consts["TE_VERSION_NUMBER"][0]
    if v != want:
        problems.append("te_version() = %d, TE_VERSION_NUMBER = %d" % (v, want))
    s = fn("te_status_string")(jl_enum(jl, "TE_ERROR_INVALID_ARGUMENT"))
    if s != b"TE_ERROR_INVALID_ARGUMENT":
        problems.append("te_status_string(TE_ERROR_INVALID_ARGUMENT) = %r" % s)
    # te_recipe_options_init into a buffer of Julia's size: struct_size and TE's defaults land at
    # Julia's offsets.
    size = jl.layout("te_recipe_options")[0]
    buf = (ctypes.c_char * size)()
    st = fn("te_recipe_options_init")(ctypes.addressof(buf), jl_enum(jl, "TE_RECIPE_DELAYED_SCALING"))
    got = {f: field("te_recipe_options", buf, f) for f in ("struct_size", "kind", "amax_history_len",
                                                           "reduce_amax", "dgrad_split_accumulator")}
    want = {"struct_size": size, "kind": 0, "amax_history_len": 1024, "reduce_amax": 1, "dgrad_split_accumulator": 1}
    if st != 0 or got != want:
        problems.append("te_recipe_options_init: status %d, fields %s, expected %s" % (st, got, want))
    # An error: the message comes back through te_last_error.
    rbuf = (ctypes.c_char * size).from_buffer_copy(buf)
    off = jl.layout("te_recipe_options")[2][[f for f, _, _ in jl.structs["te_recipe_options"]].index("amax_history_len")]
    ctypes.c_int32.from_buffer(rbuf, off).value = 0
    handle = ctypes.c_void_p()
    st = fn("te_recipe_create")(ctypes.addressof(handle), ctypes.addressof(rbuf))
    msg = fn("te_last_error")()
    if st != jl_enum(jl, "TE_ERROR_INVALID_ARGUMENT") or b"amax_history_len" not in msg:
        problems.append("te_recipe_create(amax_history_len = 0): status %d, message %r" % (st, msg))
    # te_linear_options_init: in/out features at Julia's offsets.
    size = jl.layout("te_linear_options")[0]
    buf = (ctypes.c_char * size)()
    st = fn("te_linear_options_init")(ctypes.addressof(buf))
    got = (field("te_linear_options", buf, "struct_size"), field("te_linear_options", buf, "bias"),
           field("te_linear_options", buf, "activation_dtype"))
    if st != 0 or got != (size, 1, jl_enum(jl, "TE_DTYPE_BF16")):
        problems.append("te_linear_options_init: status %d, (struct_size, bias, activation_dtype) = %s" % (st, got))
    return problems


def jl_enum(jl, name):
    for members in jl.enums.values():
        for m, v in members:
            if m == name:
                return v
    raise KeyError(name)


def main():
    ap = argparse.ArgumentParser(description="LibTE.jl: generated wrappers vs the C compiler")
    ap.add_argument("--lib", help="libte.so to check the symbols of (default: LIBTE_PATH, build/release)")
    ap.add_argument("--keep", action="store_true", help="keep the generated C++ program")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "c++"))
    args = ap.parse_args()

    with open(GEN, encoding="utf-8") as f:
        jl = Julia(f.read())
    with open(HEADER, encoding="utf-8") as f:
        funcs, hstructs, henums, hdefines = header_facts(f.read())
    report = Report()

    # ---- coverage against an independent reading of the header -----------------------------
    problems = ["TE_API %s has no wrapper" % f for f in funcs if f not in jl.functions]
    problems += ["wrapper %s is not a TE_API function of te.h" % f for f in jl.functions if f not in funcs]
    tuple_names = re.findall(r"^    :(te_\w+),$", jl.text, re.M)
    if tuple_names != list(jl.functions):
        problems.append("TE_API_FUNCTIONS does not list the wrappers in order")
    report.check("every TE_API function of te.h has exactly one wrapper (%d)" % len(funcs), problems)
    problems = []
    for s, fields in hstructs.items():
        got = [f for f, _, _ in jl.structs.get(s, [])]
        if got != fields:
            problems.append("struct %s: header fields %s, Julia fields %s" % (s, fields, got))
    problems += ["Julia struct %s is not in te.h" % s for s in jl.structs if s not in hstructs]
    report.check("every struct of te.h is a Julia struct with the same fields in order (%d)" % len(hstructs),
                 problems)
    problems = []
    for e, members in henums.items():
        got = [m for m, _ in jl.enums.get(e, [])]
        if got != members:
            problems.append("enum %s: header %s, Julia %s" % (e, members, got))
    problems += ["#define %s has no Julia constant" % d for d in hdefines if d not in jl.int_consts]
    report.check("every enum, enumerator and #define of te.h has a Julia constant (%d enums, %d defines)"
                 % (len(henums), len(hdefines)), problems)

    # ---- the wrappers themselves are well formed ------------------------------------------
    problems = []
    for f, (params, ret, types, call_args) in jl.functions.items():
        if len(params) != len(types) or call_args != params:
            problems.append("%s: parameters %s, ccall types %s, ccall arguments %s" % (f, params, types, call_args))
    report.check("every wrapper passes its parameters to ccall in order, one type each", problems)

    # ---- the compiler's view --------------------------------------------------------------
    tmp = tempfile.mkdtemp(prefix="libte_julia_abi_")
    try:
        src = os.path.join(tmp, "abi.cpp")
        exe = os.path.join(tmp, "abi")
        with open(src, "w") as f:
            f.write(build_cpp(jl))
        cc = subprocess.run([args.cxx, "-std=c++17", "-Wall", "-Werror", "-I", HEADER_DIR, src, "-o", exe],
                            capture_output=True, text=True)
        report.check("the probe program (every Julia name exists in te.h with the same kind) compiles",
                     [] if cc.returncode == 0 else (cc.stdout + cc.stderr).strip().split("\n")[:30])
        if cc.returncode != 0:
            print("%d passed, %d failed" % (report.passed, report.failed))
            return 1
        run = subprocess.run([exe], capture_output=True, text=True, check=True)
        c_struct, c_field, c_enum, c_enumerator, c_define, c_alias, c_func = {}, {}, {}, {}, {}, {}, {}
        for ln in run.stdout.splitlines():
            p = ln.split(" ")
            if p[0] == "struct":
                c_struct[p[1]] = (int(p[2]), int(p[3]))
            elif p[0] == "field":
                c_field[(p[1], p[2])] = (int(p[3]), p[4])
            elif p[0] == "enum":
                c_enum[p[1]] = (int(p[2]), p[3] == "1")
            elif p[0] == "enumerator":
                c_enumerator[p[1]] = int(p[2])
            elif p[0] == "define":
                c_define[p[1]] = (int(p[2]), int(p[3]), p[4] == "1")
            elif p[0] == "alias":
                c_alias[p[1]] = p[2]
            elif p[0] == "func":
                c_func[p[1]] = p[2]
    finally:
        if args.keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    problems = []
    for s, fields in jl.structs.items():
        size, align, offsets = jl.layout(s)
        csize, calign = c_struct[s]
        if (size, align) != (csize, calign):
            problems.append("%s: Julia %d bytes / align %d, C %d / %d" % (s, size, align, csize, calign))
        if jl.struct_sizes.get(s) != csize:
            problems.append("%s: the generator says %s bytes, C %d" % (s, jl.struct_sizes.get(s), csize))
        for (f, t, gen_off), off in zip(fields, offsets):
            coff, cdesc = c_field[(s, f)]
            if off != coff or gen_off != coff:
                problems.append("%s.%s: offset Julia %d, generator %d, C %d" % (s, f, off, gen_off, coff))
            if jl.desc(t) != cdesc:
                problems.append("%s.%s: Julia %s (%s), C %s" % (s, f, t, jl.desc(t), cdesc))
    report.check("struct sizes, alignments, field offsets and field types match the C compiler (%d structs, %d fields)"
                 % (len(jl.structs), sum(len(v) for v in jl.structs.values())), problems)

    problems = []
    for e, members in jl.enums.items():
        size, is_enum = c_enum[e]
        if size != 4 or not is_enum:
            problems.append("enum %s: sizeof %d (Julia: Cint, 4)" % (e, size))
        for m, v in members:
            if c_enumerator[m] != v:
                problems.append("%s: Julia %d, C %d" % (m, v, c_enumerator[m]))
    report.check("enum sizes and every enumerator's value match (%d enumerators)"
                 % sum(len(v) for v in jl.enums.values()), problems)

    problems = []
    for c, (v, jt) in jl.int_consts.items():
        cv, csize, csigned = c_define[c]
        if (v, 4, jt == "Cint") != (cv, csize, csigned):
            problems.append("%s: Julia %s(%d), C value %d size %d signed %s" % (c, jt, v, cv, csize, csigned))
    for a, t in jl.aliases.items():
        if jl.desc(t) != c_alias[a]:
            problems.append("alias %s: Julia %s (%s), C %s" % (a, t, jl.desc(t), c_alias[a]))
    report.check("#define values and types, and typedef aliases, match (%d defines, %d aliases)"
                 % (len(jl.int_consts), len(jl.aliases)), problems)

    problems = []
    for f, (params, ret, types, _) in jl.functions.items():
        jsig = jl.desc(ret) + "<-" + "".join(jl.desc(t) + "," for t in types)
        if jsig != c_func[f]:
            problems.append("%s: ccall %s <- (%s) is %s, the prototype is %s"
                            % (f, ret, ", ".join(types), jsig, c_func[f]))
    report.check("every ccall's return and argument types match the C prototype (%d functions)"
                 % len(jl.functions), problems)

    lib = find_library(args.lib)
    if lib:
        library_checks(jl, lib, report)
    else:
        print("SKIP library checks: no built libte.so.0 (set LIBTE_PATH or build the release preset)")

    print("%d passed, %d failed" % (report.passed, report.failed))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
