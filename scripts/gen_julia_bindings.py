#!/usr/bin/env python3
"""Generate the low-level Julia wrappers of LibTE.jl from the public C header.

    python3 scripts/gen_julia_bindings.py                 # rewrite bindings/julia/LibTE/src/gen/libte_api.jl
    python3 scripts/gen_julia_bindings.py --check         # exit 1 when the checked-in file is stale
    python3 scripts/gen_julia_bindings.py --stdout        # print the generated code
    python3 scripts/gen_julia_bindings.py --layout-json F # also write the generator's own
                                                          # size/offset model of every struct

Python 3 standard library only. The translation is deliberately strict: anything in te.h this
script does not understand (a preprocessor directive other than the ones listed in
`Preprocessor`, a macro that is not an integer constant, an enumerator without an explicit
value, a union, a bit-field, a function pointer, a declarator list, a by-value opaque type, ...)
stops it with an error naming the line, so the wrappers provably cover the whole header. After
translating, it re-scans the raw header text and fails unless every `TE_API` function got a
wrapper and every struct body got all of its fields translated.

Translation rules:
  enum      -> `const te_x = Cint` (C enums are 4-byte ints on every ABI libte supports) and one
               `const TE_X = te_x(value)` per enumerator, with the header's explicit value
  struct    -> an immutable, isbits `struct` with the same fields in the same order: C scalar
               types map to their Julia equivalents (`size_t` -> Csize_t, `int32_t` -> Int32,
               `float` -> Cfloat, ...), pointers to `Ptr{...}`, fixed arrays to `NTuple{N, T}`;
               Julia lays isbits structs out by the C rules, so sizes and offsets agree (checked
               against the C compiler by bindings/julia/LibTE/test/check_abi.py)
  opaque    -> `const te_x = Cvoid`: a handle `te_x *` is `Ptr{te_x}`, i.e. a `Ptr{Cvoid}`
  typedef   -> `const te_x = <mapped type>`
  #define   -> `const TE_X = Cint(value)` (`Cuint` for a `u` suffix), evaluated
  TE_API fn -> `te_f(args...) = ccall((:te_f, libte), Ret, (ArgTypes...,), args...)`; `const
               char *` is `Cstring` (returned strings are static or owned by the library: read
               them with `unsafe_string`)
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HEADER = os.path.join(ROOT, "capi", "include", "te", "te.h")
OUTPUT = os.path.join(ROOT, "bindings", "julia", "LibTE", "src", "gen", "libte_api.jl")


class TranslationError(Exception):
    pass


def fail(line, msg):
    raise TranslationError("te.h:%d: %s" % (line, msg))


# --------------------------------------------------------------------------------------------
# Scalar types: C spelling -> (Julia spelling, size, alignment). LP64 (x86-64 SysV, AArch64).
# --------------------------------------------------------------------------------------------

SCALARS = {
    "char": ("Cchar", 1, 1),
    "signed char": ("Int8", 1, 1),
    "unsigned char": ("UInt8", 1, 1),
    "short": ("Cshort", 2, 2),
    "unsigned short": ("Cushort", 2, 2),
    "int": ("Cint", 4, 4),
    "unsigned": ("Cuint", 4, 4),
    "unsigned int": ("Cuint", 4, 4),
    "long": ("Clong", 8, 8),
    "unsigned long": ("Culong", 8, 8),
    "long long": ("Clonglong", 8, 8),
    "unsigned long long": ("Culonglong", 8, 8),
    "float": ("Cfloat", 4, 4),
    "double": ("Cdouble", 8, 8),
    "size_t": ("Csize_t", 8, 8),
    "ptrdiff_t": ("Cptrdiff_t", 8, 8),
    "int8_t": ("Int8", 1, 1),
    "uint8_t": ("UInt8", 1, 1),
    "int16_t": ("Int16", 2, 2),
    "uint16_t": ("UInt16", 2, 2),
    "int32_t": ("Int32", 4, 4),
    "uint32_t": ("UInt32", 4, 4),
    "int64_t": ("Int64", 8, 8),
    "uint64_t": ("UInt64", 8, 8),
}
POINTER_SIZE = 8

JULIA_KEYWORDS = {
    "baremodule", "begin", "break", "catch", "const", "continue", "do", "else", "elseif", "end",
    "export", "false", "finally", "for", "function", "global", "if", "import", "let", "local",
    "macro", "module", "quote", "return", "struct", "true", "try", "using", "while",
    "where", "in", "isa",
}


def julia_ident(name):
    return name + "_" if name in JULIA_KEYWORDS else name


# --------------------------------------------------------------------------------------------
# Lexing: the header as a stream of comments, preprocessor lines and code.
# --------------------------------------------------------------------------------------------


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def scan(text):
    """Yields (kind, text, start, end) with kind in {'comment', 'pp', 'code', 'blank'}.

    'code' items are runs of non-comment, non-preprocessor text; a 'blank' marks an empty line
    (it separates a section comment from the declaration below it)."""
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                fail(line_of(text, i), "unterminated comment")
            yield ("comment", text[i:j + 2], i, j + 2)
            i = j + 2
            at_line_start = False
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            yield ("comment", text[i:j], i, j)
            i = j
            continue
        if c == "\n":
            # A line holding nothing but whitespace is a blank line.
            k = i + 1
            while k < n and text[k] in " \t\r":
                k += 1
            if k < n and text[k] == "\n":
                yield ("blank", "", i, k)
            i += 1
            at_line_start = True
            continue
        if c in " \t\r":
            i += 1
            continue
        if c == "#" and at_line_start:
            j = i
            while True:
                e = text.find("\n", j)
                e = n if e < 0 else e
                if text[e - 1] == "\\":
                    j = e + 1
                    continue
                break
            yield ("pp", text[i:e], i, e)
            i = e
            continue
        # Code up to the next comment, preprocessor line or newline.
        j = i
        while j < n and text[j] != "\n" and not text.startswith("/*", j) and not text.startswith("//", j):
            j += 1
        yield ("code", text[i:j], i, j)
        i = j
        at_line_start = False


def comment_text(raw):
    """The words of a C comment, one string per source line, without the markers."""
    if raw.startswith("//"):
        return [raw[2:].strip()]
    body = raw[2:-2]
    lines = []
    for k, ln in enumerate(body.split("\n")):
        ln = ln.strip()
        if k > 0 and re.match(r"\*(\s|$)", ln):  # " * " continuation style
            ln = ln[1:].strip()
        lines.append(ln)
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def is_rule(lines):
    """A decorative rule comment (/* ---- */)."""
    return all(re.fullmatch(r"[-=*\s]*", ln) for ln in lines)


# --------------------------------------------------------------------------------------------
# The preprocessor subset te.h uses.
# --------------------------------------------------------------------------------------------


class Preprocessor:
    """#ifndef/#ifdef/#if defined(X)/#elif defined(X)/#else/#endif, #include of system headers,
    #define of integer constants, the include guard and TE_API. Anything else fails."""

    PREDEFINED = {"__GNUC__"}  # what the generated bindings target: GCC/Clang, not MSVC, not C++
    ALLOWED_INCLUDES = {"<stddef.h>", "<stdint.h>"}

    def __init__(self):
        self.defined = set(self.PREDEFINED)
        self.stack = []  # (active, taken, parent_active)
        self.constants = []  # (name, value, ctype, c_expr, doc, line)
        self.values = {}
        self.api_macro_defs = 0

    @property
    def active(self):
        return all(a for a, _, _ in self.stack)

    def cond(self, expr, line):
        expr = expr.strip()
        m = re.fullmatch(r"defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+)", expr)
        if not m:
            fail(line, "unsupported #if condition %r" % expr)
        return (m.group(1) or m.group(2)) in self.defined

    def directive(self, raw, line, doc):
        if raw.count("/*") != raw.count("*/"):
            fail(line, "a comment spanning a preprocessor line is not supported")
        trailing = [w for c in re.findall(r"/\*.*?\*/", raw, re.S) for w in comment_text(c)]
        doc = list(doc) + trailing
        text = re.sub(r"/\*.*?\*/", " ", raw, flags=re.S).replace("\\\n", " ")
        m = re.match(r"#\s*(\w+)\s*(.*)$", text, re.S)
        if not m:
            fail(line, "malformed preprocessor line %r" % raw)
        d, rest = m.group(1), m.group(2).strip()
        if d in ("ifdef", "ifndef"):
            name = rest
            if not re.fullmatch(r"\w+", name):
                fail(line, "unsupported #%s %r" % (d, rest))
            val = (name in self.defined) == (d == "ifdef")
            self.stack.append([val, val, self.active])
            return
        if d == "if":
            val = self.cond(rest, line)
            self.stack.append([val, val, self.active])
            return
        if d == "elif":
            if not self.stack:
                fail(line, "#elif without #if")
            top = self.stack[-1]
            val = (not top[1]) and self.cond(rest, line)
            top[0] = val
            top[1] = top[1] or val
            return
        if d == "else":
            if not self.stack:
                fail(line, "#else without #if")
            top = self.stack[-1]
            top[0] = not top[1]
            top[1] = True
            return
        if d == "endif":
            if not self.stack:
                fail(line, "#endif without #if")
            self.stack.pop()
            return
        if not self.active:
            return
        if d == "include":
            if rest not in self.ALLOWED_INCLUDES:
                fail(line, "unexpected #include %s" % rest)
            return
        if d == "define":
            m = re.fullmatch(r"(\w+)(\(.*?\))?\s*(.*)", rest, re.S)
            if not m:
                fail(line, "malformed #define %r" % rest)
            name, params, body = m.group(1), m.group(2), m.group(3).strip()
            if params:
                fail(line, "function-like macro %s cannot be translated" % name)
            self.defined.add(name)
            if name == "TE_API":
                # The export marker; its (GCC) spelling is checked, its meaning is "a function".
                if body not in ("", '__attribute__((visibility("default")))'):
                    fail(line, "unexpected TE_API definition %r" % body)
                self.api_macro_defs += 1
                return
            if body == "":
                if not name.endswith("_H"):
                    fail(line, "valueless macro %s is not an include guard" % name)
                return
            value, ctype = self.eval_int(body, line)
            self.values[name] = (value, ctype)
            self.constants.append((name, value, ctype, body, doc, line))
            return
        fail(line, "unsupported preprocessor directive #%s" % d)

    def eval_int(self, expr, line):
        """Evaluates an integer constant expression over literals and earlier constants.
        Returns (value, 'int' | 'unsigned')."""
        tokens = re.findall(r"0[xX][0-9a-fA-F]+[uU]?|\d+[uU]?|\w+|<<|>>|[-+*/%()|&~^]|\S", expr)
        out = []
        unsigned = False
        for t in tokens:
            m = re.fullmatch(r"(0[xX][0-9a-fA-F]+|\d+)([uU]?)", t)
            if m:
                lit = m.group(1)
                if len(lit) > 1 and lit[0] == "0" and lit[1] not in "xX":
                    fail(line, "octal literal %r is not supported" % t)
                out.append(str(int(lit, 0)))
                unsigned |= bool(m.group(2))
            elif re.fullmatch(r"[A-Za-z_]\w*", t):
                if t not in self.values:
                    fail(line, "macro %r uses %r, which is not an integer constant defined above" % (expr, t))
                v, ct = self.values[t]
                out.append(str(v))
                unsigned |= ct == "unsigned"
            elif t in ("+", "-", "*", "(", ")", "<<", ">>", "|", "&", "~", "^"):
                out.append(t)
            else:
                fail(line, "cannot evaluate macro body %r (token %r)" % (expr, t))
        try:
            value = eval(" ".join(out), {"__builtins__": {}}, {})  # only digits and operators
        except Exception as e:  # pragma: no cover - reported as a translation failure
            fail(line, "cannot evaluate macro body %r: %s" % (expr, e))
        if unsigned:
            if not 0 <= value < 2 ** 32:
                fail(line, "unsigned macro %r out of range" % expr)
            return value, "unsigned"
        if not -(2 ** 31) <= value < 2 ** 31:
            fail(line, "macro %r does not fit an int" % expr)
        return value, "int"


# --------------------------------------------------------------------------------------------
# Declarations
# --------------------------------------------------------------------------------------------


class Type:
    """A parsed C type: base name, qualifiers, pointer depth, array extent."""

    def __init__(self, base, const, ptr, array=None, stars=None):
        self.base, self.const, self.ptr, self.array = base, const, ptr, array
        # The pointer part as the header spells it ("*const *"), for the generated comments;
        # the Julia type does not depend on it.
        self.stars = stars if stars is not None else "*" * ptr

    def c(self):
        s = ("const " if self.const else "") + self.base + (" " + self.stars if self.ptr else "")
        return s + ("[%d]" % self.array if self.array is not None else "")


class Model:
    def __init__(self):
        self.items = []  # in header order: ('section'|'enum'|'struct'|'opaque'|'alias'|'const'|'func', ...)
        self.enums = {}
        self.structs = {}
        self.opaques = set()
        self.aliases = {}
        self.functions = {}
        self.layouts = {}


def split_items(body, base, text, sep):
    """Splits an enum or struct body into items on `sep` at nesting depth 0. Each item is
    (code, line, docs). A comment that starts on a line where the item's code already stands
    documents that item; a comment on a line of its own documents the next item."""
    items = []
    code, code_line, docs, leading = "", None, [], []
    last_code_line = None
    prev_item = None
    i, n = 0, len(body)
    depth = 0
    while i < n:
        if body.startswith("/*", i) or body.startswith("//", i):
            if body.startswith("/*", i):
                j = body.find("*/", i + 2) + 2
            else:
                j = body.find("\n", i)
                j = n if j < 0 else j
            raw = body[i:j]
            cline = line_of(text, base + i)
            words = comment_text(raw)
            if code.strip() and last_code_line == cline:
                docs.extend(words)
            elif prev_item is not None and prev_item[1] == cline and not code.strip():
                prev_item[2].extend(words)
            else:
                leading.extend(words)
            i = j
            continue
        c = body[i]
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        if c == sep and depth == 0:
            item = [code.strip(), code_line, leading + docs, line_of(text, base + i)]
            items.append(item)
            prev_item = [None, line_of(text, base + i), item[2]]
            code, code_line, docs, leading = "", None, [], []
            i += 1
            continue
        if not c.isspace():
            if code_line is None:
                code_line = line_of(text, base + i)
            last_code_line = line_of(text, base + i)
        code += c
        i += 1
    if code.strip():
        items.append([code.strip(), code_line, leading + docs, last_code_line])
    elif leading:
        fail(line_of(text, base + n), "comment after the last item has nothing to document")
    return [(c, l, d) for c, l, d, _ in items]


TYPE_WORDS = {"const", "signed", "unsigned", "short", "long", "int", "char", "struct", "enum"}


def parse_decl(decl, line, model, allow_array):
    """Parses `const T *name[N]` into (name, Type)."""
    s = decl.strip()
    if any(bad in s for bad in ("(", ",", ":", "volatile", "restrict", "union", "=")):
        fail(line, "cannot translate declaration %r (function pointer, bit-field, declarator "
                   "list, union, initialiser or qualifier not supported)" % s)
    array = None
    m = re.fullmatch(r"(.*?)\[\s*([^\]]+)\s*\]", s)
    if m:
        if not allow_array:
            fail(line, "array parameter %r not supported" % s)
        s = m.group(1).strip()
        ext = m.group(2).strip()
        if re.fullmatch(r"\d+", ext):
            array = int(ext)
        elif ext in model.constants:
            array = model.constants[ext][0]
        else:
            fail(line, "array extent %r is neither a literal nor a #define constant" % ext)
    m = re.fullmatch(r"(.*?)([A-Za-z_]\w*)", s)
    if not m:
        fail(line, "no declarator name in %r" % decl)
    tpart, name = m.group(1), m.group(2)
    t = parse_type(tpart, line, model)
    t.array = array
    return name, t


def parse_type(tpart, line, model):
    ptr = tpart.count("*")
    before, _, after = tpart.partition("*")
    # `T *const *` (a pointer to constant pointers) is ABI-identical to `T **`: Julia's Ptr has
    # no const, so only `const` may follow a '*'.
    if re.sub(r"\bconst\b", "", after.replace("*", "")).strip():
        fail(line, "qualifier after '*' in %r is not supported" % tpart)
    words = before.split()
    const = "const" in words
    words = [w for w in words if w != "const"]
    if words and words[0] in ("struct", "enum"):
        fail(line, "elaborated type %r: te.h uses typedef names" % tpart)
    base = " ".join(words)
    known = (base == "void" or base in SCALARS or base in model.enums or base in model.structs
             or base in model.opaques or base in model.aliases)
    if not known:
        fail(line, "unknown type %r" % base)
    if base == "void" and ptr == 0:
        return Type("void", const, 0)
    if base in model.opaques and ptr == 0:
        fail(line, "opaque type %s used by value" % base)
    stars = re.sub(r"\s+", " ", ("*" + after).strip()).replace("* *", "**") if ptr else ""
    return Type(base, const, ptr, stars=stars)


def julia_type(t, model, *, context):
    """Julia spelling of a C type. context: 'field', 'param' or 'return'."""
    if t.base == "char" and t.ptr == 1 and t.const and context in ("param", "return"):
        inner = "Cstring"
    elif t.base == "void":
        inner = "Cvoid"
    elif t.base in SCALARS:
        inner = SCALARS[t.base][0]
    else:
        inner = t.base  # enum / struct / opaque / alias names are Julia names too
    depth = t.ptr - (1 if inner == "Cstring" else 0)
    for _ in range(depth):
        inner = "Ptr{%s}" % inner
    if t.array is not None:
        inner = "NTuple{%d, %s}" % (t.array, inner)
    return inner


def size_align(t, model, line):
    if t.ptr:
        s, a = POINTER_SIZE, POINTER_SIZE
    elif t.base in SCALARS:
        _, s, a = SCALARS[t.base]
    elif t.base in model.enums:
        s, a = 4, 4
    elif t.base in model.structs:
        lay = model.layouts[t.base]
        s, a = lay["size"], lay["align"]
    elif t.base in model.aliases:
        s, a = size_align(model.aliases[t.base][0], model, line)
    else:
        fail(line, "no layout for %s" % t.c())
    if t.array is not None:
        s *= t.array
    return s, a


def layout(fields, model, line):
    off, align, out = 0, 1, []
    for name, t, fline, _ in fields:
        s, a = size_align(t, model, fline)
        off = (off + a - 1) // a * a
        out.append({"name": name, "offset": off, "size": s})
        off += s
        align = max(align, a)
    size = (off + align - 1) // align * align
    return {"size": size, "align": align, "fields": out}


def translate(text):
    model = Model()
    pp = Preprocessor()
    model.constants = {}
    pending = []  # doc comment lines waiting for a declaration
    decl_start = None  # where the declaration being read starts
    last_decl = None  # (line where the last declaration ended, its doc list)
    section_open = False  # the last thing seen was a /* ---- */ rule (and maybe a title)
    items = list(scan(text))
    for idx, (kind, raw, start, end) in enumerate(items):
        if kind == "blank":
            if decl_start is None:
                pending = []
            section_open = False
            continue
        if decl_start is not None and kind == "comment":
            continue  # a comment inside a declaration: handle_decl reads it from the text
        if kind == "comment":
            if not pp.active:
                continue
            words = comment_text(raw)
            if last_decl is not None and last_decl[0] == line_of(text, start):
                last_decl[1].extend(words)  # `decl; /* trailing */` documents decl
                continue
            if is_rule(words):
                if section_open and pending:
                    model.items.append(("section", " ".join(w for w in pending if w)))
                pending = []
                section_open = True
                continue
            pending.extend(words)
            continue
        section_open = False
        if kind == "pp":
            if decl_start is not None:
                fail(line_of(text, start), "preprocessor line inside a declaration")
            # A #define directly above a declaration does not take the comment above it: that
            # comment documents the declaration (te_autocast_begin and TE_AUTOCAST_MAX_DEPTH).
            nxt = next((it for it in items[idx + 1:] if it[0] != "comment"), None)
            sandwiched = nxt is not None and nxt[0] == "code"
            n_before = len(pp.constants)
            last_decl = None
            pp.directive(raw, line_of(text, start), [] if sandwiched else pending)
            if len(pp.constants) > n_before:
                name, value, ctype = pp.constants[-1][:3]
                model.constants[name] = (value, ctype)
                model.items.append(("const",) + pp.constants[-1])
            if not sandwiched:
                pending = []
            continue
        # code
        if not pp.active:
            continue
        if decl_start is None:
            decl_start = start
            doc = pending
            pending = []
        decl = text[decl_start:end]
        code_only = re.sub(r"/\*.*?\*/|//[^\n]*", " ", decl, flags=re.S)
        if re.fullmatch(r'\s*extern\s+"C"\s*\{\s*|\s*\}\s*', code_only):
            fail(line_of(text, start), "C++ linkage block is active: the header must be read as C")
        if code_only.count("{") == code_only.count("}") and code_only.rstrip().endswith(";"):
            doc = list(doc)
            handle_decl(decl, line_of(text, decl_start), doc, model, text, decl_start)
            last_decl = (line_of(text, end), doc)
            decl_start = None
    if decl_start is not None:
        fail(line_of(text, decl_start), "unterminated declaration %r" % text[decl_start:decl_start + 60])
    if pp.stack:
        fail(line_of(text, len(text)), "unterminated #if")
    if pp.api_macro_defs == 0:
        fail(1, "TE_API is never defined")
    verify_coverage(text, model)
    return model


def handle_decl(decl, line, doc, model, text, start):
    body_text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", decl, flags=re.S)
    s = " ".join(body_text.split())
    m = re.fullmatch(r"typedef\s+enum\s+(\w+)\s*\{(.*)\}\s*(\w+)\s*;", s, re.S)
    if m:
        tag, name = m.group(1), m.group(3)
        if tag != name:
            fail(line, "enum tag %s differs from typedef name %s" % (tag, name))
        raw_body = decl[decl.index("{") + 1:decl.rindex("}")]
        base = start + decl.index("{") + 1
        enumerators = []
        for code, eline, edoc in split_items(raw_body, base, text, ","):
            em = re.fullmatch(r"([A-Za-z_]\w*)\s*=\s*(-?\s*(?:0[xX][0-9a-fA-F]+|\d+))", code)
            if not em:
                fail(eline, "enumerator %r must be NAME = integer literal" % code)
            value = int(em.group(2).replace(" ", ""), 0)
            if not -(2 ** 31) <= value < 2 ** 31:
                fail(eline, "enumerator %s out of int range" % em.group(1))
            enumerators.append((em.group(1), value, edoc, eline))
        if not enumerators:
            fail(line, "empty enum %s" % name)
        model.enums[name] = enumerators
        model.items.append(("enum", name, enumerators, doc, line))
        return
    m = re.fullmatch(r"typedef\s+struct\s+(\w+)\s*\{(.*)\}\s*(\w+)\s*;", s, re.S)
    if m:
        tag, name = m.group(1), m.group(3)
        if tag != name:
            fail(line, "struct tag %s differs from typedef name %s" % (tag, name))
        raw_body = decl[decl.index("{") + 1:decl.rindex("}")]
        base = start + decl.index("{") + 1
        fields = []
        for code, fline, fdoc in split_items(raw_body, base, text, ";"):
            if "{" in code or "}" in code:
                fail(fline, "nested struct/union definition in %s" % name)
            fname, ftype = parse_decl(code, fline, model, allow_array=True)
            fields.append((fname, ftype, fline, fdoc))
        if not fields:
            fail(line, "empty struct %s" % name)
        model.structs[name] = fields
        model.layouts[name] = layout(fields, model, line)
        model.items.append(("struct", name, fields, doc, line))
        return
    m = re.fullmatch(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;", s)
    if m:
        if m.group(1) != m.group(2):
            fail(line, "opaque struct tag %s differs from typedef name %s" % (m.group(1), m.group(2)))
        model.opaques.add(m.group(1))
        model.items.append(("opaque", m.group(1), doc, line))
        return
    m = re.fullmatch(r"typedef\s+([\w\s\*]+?)\s*\b(\w+)\s*;", s)
    if m and "struct" not in m.group(1) and "enum" not in m.group(1):
        t = parse_type(m.group(1), line, model)
        model.aliases[m.group(2)] = (t, line)
        model.items.append(("alias", m.group(2), t, doc, line))
        return
    m = re.fullmatch(r"TE_API\s+(.*?)\b(te_\w+)\s*\((.*)\)\s*;", s, re.S)
    if m:
        ret = parse_type(m.group(1).strip(), line, model)
        fname = m.group(2)
        params = []
        plist = m.group(3).strip()
        if plist == "...":
            fail(line, "variadic function %s" % fname)
        if plist != "void":
            for p in plist.split(","):
                if p.strip() == "...":
                    fail(line, "variadic function %s" % fname)
                pname, ptype = parse_decl(p, line, model, allow_array=False)
                if ptype.base == "void" and ptype.ptr == 0:
                    fail(line, "void parameter in %s" % fname)
                params.append((pname, ptype))
        if fname in model.functions:
            fail(line, "%s declared twice" % fname)
        model.functions[fname] = (ret, params, line)
        model.items.append(("func", fname, ret, params, doc, line))
        return
    fail(line, "cannot translate declaration: %s" % s[:120])


def verify_coverage(text, model):
    """Independent re-scan of the raw header: every TE_API function has a wrapper, every struct
    body's every ';'-terminated member was translated, every enumerator is a constant."""
    stripped = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    stripped = re.sub(r"(?m)^\s*#.*(?:\\\n.*)*$", " ", stripped)  # preprocessor lines
    api = set(re.findall(r"\bTE_API\b[^;(]*?\b(\w+)\s*\(", stripped))
    missing = api - set(model.functions)
    if missing:
        fail(1, "TE_API functions without a wrapper: %s" % ", ".join(sorted(missing)))
    extra = set(model.functions) - api
    if extra:
        fail(1, "wrappers for functions not marked TE_API: %s" % ", ".join(sorted(extra)))
    n_api = len(re.findall(r"\bTE_API\b", stripped))
    if n_api != len(model.functions):
        fail(1, "%d TE_API uses but %d wrappers" % (n_api, len(model.functions)))
    for m in re.finditer(r"\bstruct\s+(\w+)\s*\{([^{}]*)\}", stripped):
        name, body = m.group(1), m.group(2)
        members = [x.strip() for x in body.split(";") if x.strip()]
        if name not in model.structs:
            fail(line_of(stripped, m.start()), "struct %s was not translated" % name)
        got = [f[0] for f in model.structs[name]]
        want = [re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", x).group(1) for x in members]
        if got != want:
            fail(line_of(stripped, m.start()), "struct %s: fields %s translated as %s" % (name, want, got))
    for m in re.finditer(r"\benum\s+(\w+)\s*\{([^{}]*)\}", stripped):
        name = m.group(1)
        want = [x.split("=")[0].strip() for x in m.group(2).split(",") if x.strip()]
        got = [e[0] for e in model.enums.get(name, [])]
        if got != want:
            fail(line_of(stripped, m.start()), "enum %s: %s translated as %s" % (name, want, got))
    for m in re.finditer(r"\btypedef\s+struct\s+(\w+)\s+\w+\s*;", stripped):
        if m.group(1) not in model.opaques:
            fail(line_of(stripped, m.start()), "opaque %s was not translated" % m.group(1))
    n_typedefs = len(re.findall(r"\btypedef\b", stripped))
    n_done = len(model.enums) + len(model.structs) + len(model.opaques) + len(model.aliases)
    if n_typedefs != n_done:
        fail(1, "%d typedefs in te.h but %d translated" % (n_typedefs, n_done))


# --------------------------------------------------------------------------------------------
# Emission
# --------------------------------------------------------------------------------------------


def jl_comment(lines, indent=""):
    return "".join("%s#%s\n" % (indent, (" " + ln) if ln else "") for ln in lines)


def emit(model):
    out = []
    w = out.append
    w("# GENERATED by scripts/gen_julia_bindings.py from capi/include/te/te.h. DO NOT EDIT.\n")
    w("# Regenerate with `python3 scripts/gen_julia_bindings.py`; scripts/test_julia.sh fails when\n")
    w("# this file and the header disagree. The comments are the header's own.\n")
    w("#\n")
    w("# Included by src/LibTE.jl, which defines `libte` (the library's soname; see there for how\n")
    w("# LIBTE_PATH is honoured). Every function is a thin `ccall`: it returns the raw C result\n")
    w("# (a `te_status` is a Cint) and never throws. Pointer arguments take `Ref`s, arrays,\n")
    w("# `Ptr`s or `C_NULL`; `Cstring` results are read with `unsafe_string`.\n")
    for item in model.items:
        kind = item[0]
        if kind == "section":
            w("\n# %s\n# %s\n# %s\n" % ("-" * 94, item[1], "-" * 94))
        elif kind == "const":
            _, name, value, ctype, body, doc, line = item
            w("\n")
            w(jl_comment(doc))
            jt = "Cuint" if ctype == "unsigned" else "Cint"
            note = "" if re.fullmatch(r"\d+[uU]?", body) else "  # %s" % " ".join(body.split())
            w("const %s = %s(%d)%s\n" % (name, jt, value, note))
        elif kind == "enum":
            _, name, enumerators, doc, line = item
            w("\n")
            w(jl_comment(doc))
            w("# enum %s\n" % name)
            w("const %s = Cint\n" % name)
            for ename, value, edoc, _ in enumerators:
                w(jl_comment(edoc))
                w("const %s = %s(%d)\n" % (ename, name, value))
        elif kind == "struct":
            _, name, fields, doc, line = item
            lay = model.layouts[name]
            w("\n")
            w(jl_comment(doc))
            w("# struct %s: %d bytes, %d-byte aligned\n" % (name, lay["size"], lay["align"]))
            w("struct %s\n" % name)
            for (fname, ftype, fline, fdoc), fl in zip(fields, lay["fields"]):
                w(jl_comment(fdoc, "    "))
                w("    %s::%s  # offset %d: %s\n" % (julia_ident(fname), julia_type(ftype, model, context="field"),
                                                     fl["offset"], ftype.c()))
            w("end\n")
        elif kind == "opaque":
            _, name, doc, line = item
            w("\n")
            w(jl_comment(doc))
            w("# opaque struct %s: handles are `Ptr{%s}` == `Ptr{Cvoid}`\n" % (name, name))
            w("const %s = Cvoid\n" % name)
        elif kind == "alias":
            _, name, t, doc, line = item
            w("\n")
            w(jl_comment(doc))
            w("const %s = %s  # %s\n" % (name, julia_type(t, model, context="field"), t.c()))
        elif kind == "func":
            _, name, ret, params, doc, line = item
            w("\n")
            w(jl_comment(doc))
            def cdecl(t, n):
                c = t.c()
                return c + n if c.endswith("*") else c + " " + n
            csig = "%s(%s)" % (cdecl(ret, name), ", ".join(cdecl(t, n) for n, t in params) or "void")
            w("# C: %s\n" % csig)
            names = [julia_ident(n) for n, _ in params]
            types = [julia_type(t, model, context="param") for _, t in params]
            rt = julia_type(ret, model, context="return")
            tup = "(" + ", ".join(types) + ("," if len(types) == 1 else "") + ")"
            call_args = "".join(", " + n for n in names)
            w("function %s(%s)\n" % (name, ", ".join(names)))
            w("    ccall((:%s, libte), %s, %s%s)\n" % (name, rt, tup, call_args))
            w("end\n")
        else:  # pragma: no cover
            raise AssertionError(kind)
    w("\n")
    w("# Every function above, in header order (the static checks use it).\n")
    names = [it[1] for it in model.items if it[0] == "func"]
    w("const TE_API_FUNCTIONS = (\n")
    for n in names:
        w("    :%s,\n" % n)
    w(")\n")
    return "".join(out)


def layouts_json(model):
    return {
        "structs": {n: model.layouts[n] | {"julia_fields": [
            [julia_ident(f[0]), julia_type(f[1], model, context="field")] for f in model.structs[n]]}
            for n in model.structs},
        "enums": {n: [[e[0], e[1]] for e in v] for n, v in model.enums.items()},
        "constants": {n: list(v) for n, v in model.constants.items()},
        "functions": sorted(model.functions),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--header", default=HEADER)
    ap.add_argument("--output", default=OUTPUT)
    ap.add_argument("--check", action="store_true", help="fail if --output differs from what would be generated")
    ap.add_argument("--stdout", action="store_true", help="print instead of writing")
    ap.add_argument("--layout-json", help="write the generator's struct layout model to this file")
    args = ap.parse_args()
    with open(args.header, encoding="utf-8") as f:
        text = f.read()
    try:
        model = translate(text)
    except TranslationError as e:
        print("gen_julia_bindings: cannot translate the header: %s" % e, file=sys.stderr)
        return 2
    code = emit(model)
    if args.layout_json:
        with open(args.layout_json, "w", encoding="utf-8") as f:
            json.dump(layouts_json(model), f, indent=1, sort_keys=True)
    if args.stdout:
        sys.stdout.write(code)
        return 0
    if args.check:
        try:
            with open(args.output, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != code:
            print("gen_julia_bindings: %s is out of date with %s; run python3 scripts/gen_julia_bindings.py"
                  % (os.path.relpath(args.output, ROOT), os.path.relpath(args.header, ROOT)), file=sys.stderr)
            return 1
        print("gen_julia_bindings: %s is up to date (%d functions, %d structs, %d enums)"
              % (os.path.relpath(args.output, ROOT), len(model.functions), len(model.structs), len(model.enums)))
        return 0
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(code)
    print("gen_julia_bindings: wrote %s (%d functions, %d structs, %d enums, %d constants)"
          % (os.path.relpath(args.output, ROOT), len(model.functions), len(model.structs), len(model.enums),
             len(model.constants)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
