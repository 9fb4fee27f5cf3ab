#!/usr/bin/env python3
"""Generates the bad-input sweep's view of the public header.

Reads capi/include/te/te.h and writes two files into the build directory:

  sweep_api.h    one struct per TE_API function holding its arguments, in declaration order
                 (sweep::args::<function>), so that fixtures fill a valid call with plain,
                 type-checked assignments;
  sweep_api.cpp  the tables the sweep walks: every function (return type, parameters with their
                 parsed types, offsets and kinds), every struct of the header (fields flattened,
                 with offsets and kinds), every enum (its values), every opaque handle type, and
                 one invoker per function that calls it with the arguments of its struct.

The invokers call each function through its symbol, looked up in the loaded libte.so at run time
(dlsym), not through a link-time reference: a function te.h declares but libte.so does not export
(yet) then fails its own sweep case, `<function>__not_exported`, instead of failing the link of
the whole sweep, so the functions that do exist are still swept.

Nothing here knows about particular functions: a function added to te.h appears in the tables
on the next build, and the sweep fails for it until tests/sweep/fixtures.cpp has its valid call.

Standard library only. Fails (non-zero exit, message naming the declaration) on a declaration it
cannot parse, so that a new kind of declaration cannot slip through unswept.
"""
import argparse
import re
import sys


class GenError(Exception):
    pass


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return text


def strip_preprocessor(text):
    out, cont = [], False
    for line in text.split("\n"):
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            out.append("")
            continue
        out.append(line)
    return "\n".join(out)


def norm_type(t):
    t = re.sub(r"\s+", " ", t.strip())
    t = re.sub(r"\s*\*\s*", " *", t)
    t = t.replace("* *", "**")
    return t.strip()


def split_decl(decl):
    """'const te_tensor *x' -> ('const te_tensor *', 'x'); 'int64_t shape[8]' -> (..., 'shape', '[8]')."""
    decl = decl.strip()
    m = re.match(r"^(.*?)(\b[A-Za-z_]\w*)\s*(\[[^\]]*\])?$", decl, re.S)
    if not m or not m.group(1).strip():
        raise GenError("cannot split declaration %r into a type and a name" % decl)
    return norm_type(m.group(1)), m.group(2), m.group(3) or ""


class Header:
    def __init__(self, text):
        self.raw = text
        code = strip_preprocessor(strip_comments(text))
        self.code = code
        self.enums = {}        # name -> [(enumerator, value)]
        self.structs = {}      # name -> [(type, name, array)]
        self.struct_order = []
        self.opaque = []       # opaque handle type names
        self.aliases = {}      # typedef name -> underlying scalar type
        self.functions = []    # (ret, name, [(type, name)])
        self._parse_enums()
        self._parse_structs()
        self._parse_simple_typedefs()
        self._parse_functions()

    def _parse_enums(self):
        for m in re.finditer(r"typedef\s+enum\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", self.code, re.S):
            if m.group(1) != m.group(3):
                raise GenError("enum %s is typedef'd as %s" % (m.group(1), m.group(3)))
            values, nxt = [], 0
            for item in m.group(2).split(","):
                item = item.strip()
                if not item:
                    continue
                em = re.match(r"^(\w+)\s*(?:=\s*(.+))?$", item, re.S)
                if not em:
                    raise GenError("cannot parse enumerator %r of %s" % (item, m.group(1)))
                val = int(em.group(2), 0) if em.group(2) else nxt
                values.append((em.group(1), val))
                nxt = val + 1
            self.enums[m.group(1)] = values

    def _parse_structs(self):
        for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", self.code, re.S):
            if m.group(1) != m.group(3):
                raise GenError("struct %s is typedef'd as %s" % (m.group(1), m.group(3)))
            fields = []
            for decl in m.group(2).split(";"):
                if not decl.strip():
                    continue
                if "," in decl:
                    # A C declarator list ('const te_tensor *q, *k, *v'): the base type of the first
                    # declarator, then each declarator's own pointer stars and array suffix.
                    parts = decl.split(",")
                    first = split_decl(parts[0])
                    fields.append(first)
                    base = re.sub(r"[\s*]+$", "", parts[0].strip()[: -len(first[1]) - len(first[2])].rstrip())
                    if not base:
                        raise GenError("struct %s: cannot read declaration %r" % (m.group(1), decl.strip()))
                    for d in parts[1:]:
                        dm = re.match(r"^\s*(\**)\s*([A-Za-z_]\w*)\s*(\[[^\]]*\])?\s*$", d, re.S)
                        if not dm:
                            raise GenError("struct %s: cannot read declarator %r of %r" % (m.group(1), d.strip(), decl.strip()))
                        fields.append(split_decl(base + " " + dm.group(1) + dm.group(2) + (dm.group(3) or "")))
                    continue
                fields.append(split_decl(decl))
            self.structs[m.group(1)] = fields
            self.struct_order.append(m.group(1))

    def _parse_simple_typedefs(self):
        for m in re.finditer(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;", self.code):
            if m.group(1) != m.group(2):
                raise GenError("opaque struct %s is typedef'd as %s" % (m.group(1), m.group(2)))
            self.opaque.append(m.group(1))
        for m in re.finditer(r"typedef\s+((?:unsigned\s+)?\w+)\s+(\w+)\s*;", self.code):
            if m.group(1) in ("struct", "enum"):
                continue
            self.aliases[m.group(2)] = m.group(1)

    def _parse_functions(self):
        n_tokens = len(re.findall(r"\bTE_API\b", self.code))
        pat = re.compile(r"\bTE_API\s+([^;{}()]*?)\b(\w+)\s*\(([^()]*)\)\s*;", re.S)
        for m in pat.finditer(self.code):
            ret, name, params = norm_type(m.group(1)), m.group(2), m.group(3).strip()
            plist = []
            if params and params != "void":
                for p in params.split(","):
                    t, n, arr = split_decl(p)
                    if arr:
                        raise GenError("%s: array parameter %r" % (name, p.strip()))
                    plist.append((t, n))
            self.functions.append((ret, name, plist))
        if n_tokens != len(self.functions):
            parsed = {f[1] for f in self.functions}
            missed = []
            for m in re.finditer(r"\bTE_API\b[^;]*;", self.code, re.S):
                nm = re.search(r"(\w+)\s*\(", m.group(0))
                if not nm or nm.group(1) not in parsed:
                    missed.append(re.sub(r"\s+", " ", m.group(0))[:120])
            raise GenError("%d TE_API declarations, %d parsed; not understood: %s" % (n_tokens, len(self.functions), missed))
        names = [f[1] for f in self.functions]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise GenError("functions declared twice: %s" % dups)


# ---- classification ---------------------------------------------------------------------------

def base_of(t):
    """'const te_tensor *' -> ('te_tensor', True, 1). The flag says whether what the pointer points
    to is const: 'te_tensor *const *' (an array of const pointers, only read) is const too."""
    const = t.startswith("const ") or (t.count("*") > 1 and t.rsplit("*", 1)[0].strip().endswith("const"))
    core = t[6:] if t.startswith("const ") else t
    stars = core.count("*")
    base = core.replace("*", "").strip()
    return base, const, stars


def has_struct_size(h, s):
    f = h.structs.get(s)
    return bool(f) and f[0][0] == "size_t" and f[0][1] == "struct_size"


def scalar_kind(h, t):
    if t in h.enums:
        return "Enum"
    t = h.aliases.get(t, t)
    return {"size_t": "Size", "int": "Int", "int32_t": "Int", "uint32_t": "UInt", "int64_t": "Int64",
            "uint64_t": "UInt64", "unsigned": "UInt", "float": "Float", "double": "Float"}.get(t)


def param_kind(h, fn, t):
    base, const, stars = base_of(t)
    if stars == 0:
        k = scalar_kind(h, base)
        if not k:
            raise GenError("%s: parameter type %r is not a scalar the sweep knows" % (fn, t))
        return k
    if stars == 2:
        if base in h.opaque and not const:
            return "OutHandle"
        return "Pointer"
    if base in h.opaque:
        return "Handle"
    if base == "te_tensor":
        return "Tensor"
    if has_struct_size(h, base):
        return "Options"
    if base in h.structs:
        return "Struct"
    return "Pointer"


def field_kind(h, owner, t, arr):
    base, const, stars = base_of(t)
    if arr:
        return "Array"
    if stars >= 1:
        if base in h.opaque:
            return "Handle"
        if base == "te_tensor" and stars == 1:
            return "Tensor"
        return "Pointer"
    if base == "te_tensor":
        return "TensorValue"
    if base in h.structs:
        return "Nested"
    k = scalar_kind(h, base)
    if not k:
        raise GenError("struct %s: field type %r is not one the sweep knows" % (owner, t))
    return k


def flatten_fields(h, sname, prefix="", cprefix=""):
    out = []
    for t, n, arr in h.structs[sname]:
        k = field_kind(h, sname, t, arr)
        if k == "Nested":
            out += flatten_fields(h, base_of(t)[0], prefix + n + ".", cprefix + n + ".")
        else:
            out.append((t, prefix + n, cprefix + n, arr, k))
    return out


def pointee_sizeof(t, opaque=()):
    """sizeof what a pointer type points to; 0 for void and opaque handles (incomplete types)."""
    base, const, stars = base_of(t)
    if stars == 1 and (base == "void" or base in opaque):
        return "0"
    inner = base + " " + "*" * (stars - 1) if stars > 1 else base
    return "sizeof(%s)" % inner.strip()


def cstr(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def generate(h, out_h, out_cpp, header_path):
    ret_kinds = {}
    lines_h = [
        "// GENERATED by tests/sweep/gen_sweep.py from %s. Do not edit." % header_path,
        "#pragma once",
        "#include <te/te.h>",
        "",
        "namespace sweep {",
        "namespace args {",
        "// One struct per TE_API function: its arguments, in order, named as in te.h.",
    ]
    for ret, name, params in h.functions:
        lines_h.append("struct %s {" % name)
        lines_h.append("  static constexpr const char *kFunction = %s;" % cstr(name))
        if not params:
            lines_h.append("  char no_arguments_;")
        for t, n in params:
            lines_h.append("  %s%s%s;" % (t, "" if t.endswith("*") else " ", n))
        lines_h.append("};")
    lines_h += ["}  // namespace args", "}  // namespace sweep", ""]

    c = [
        "// GENERATED by tests/sweep/gen_sweep.py from %s. Do not edit." % header_path,
        "#include <dlfcn.h>",
        "",
        "#include <cstddef>",
        "#include <cstdint>",
        "#include <cstring>",
        "#include \"sweep_api.h\"",
        "#include \"sweep_model.h\"",
        "",
        "#pragma GCC diagnostic ignored \"-Winvalid-offsetof\"",
        "",
        "namespace sweep {",
        "",
        "// The function libte.so exports under `name`, or NULL (te.h declares it, libte.so lacks it).",
        "const void *exported_symbol(const char *name) { return dlsym(RTLD_DEFAULT, name); }",
        "",
        "namespace {",
        "template <class T> T load(const void *p) { T v; std::memcpy(&v, p, sizeof v); return v; }",
        "// A function pointer of te.h's exact type: calls through it are type-checked as direct ones.",
        "template <class F> F resolve(const char *name) { return reinterpret_cast<F>(const_cast<void *>(exported_symbol(name))); }",
        "",
    ]
    # enums
    for en, vals in h.enums.items():
        c.append("const EnumValue kEnum_%s[] = {%s};" % (en, ", ".join("{%s, %d}" % (cstr(a), v) for a, v in vals)))
    c.append("const EnumInfo kEnums[] = {")
    for en, vals in h.enums.items():
        c.append("  {%s, kEnum_%s, %d}," % (cstr(en), en, len(vals)))
    c.append("};")
    c.append("")
    # structs
    for s in h.struct_order:
        fl = flatten_fields(h, s)
        c.append("const FieldInfo kFields_%s[] = {" % s)
        for t, path, cpath, arr, k in fl:
            base = base_of(t)[0]
            c.append("  {%s, %s, offsetof(%s, %s), sizeof(((%s *)0)->%s), FieldKind::%s, %s, %s, %s}," % (
                cstr(path), cstr(t + arr), s, cpath, s, cpath, k, cstr(base),
                "true" if base_of(t)[1] else "false",
                pointee_sizeof(t, h.opaque) if k in ("Pointer", "Tensor", "Handle") else "0"))
        c.append("};")
    c.append("const StructInfo kStructs[] = {")
    for s in h.struct_order:
        c.append("  {%s, sizeof(%s), %s, kFields_%s, sizeof(kFields_%s) / sizeof(FieldInfo)}," % (
            cstr(s), s, "true" if has_struct_size(h, s) else "false", s, s))
    c.append("};")
    c.append("const char *const kHandleTypes[] = {%s};" % ", ".join(cstr(o) for o in h.opaque))
    c.append("")

    def struct_index(name):
        return h.struct_order.index(name) if name in h.structs else -1

    # functions
    for ret, name, params in h.functions:
        if ret == "te_status":
            rk = "Status"
        elif ret == "void":
            rk = "Void"
        else:
            rk = "Value"
        ret_kinds[name] = rk
        # Enum arguments are read as int and converted: a C caller may pass any int, and loading
        # an out-of-range value through the C++ enum type would be the harness's own UB.
        args = ", ".join("enum_arg(&a->%s)" % n if param_kind(h, name, t) == "Enum" else "a->%s" % n
                         for t, n in params)
        c.append("CallResult invoke_%s(const void *p) {" % name)
        c.append("  static const auto fn = resolve<decltype(&::%s)>(%s);" % (name, cstr(name)))
        c.append("  const auto *a = static_cast<const args::%s *>(p);" % name)
        c.append("  (void)a;")
        c.append("  CallResult r;")
        c.append("  if (!fn) {")
        c.append("    r.not_exported = true;")
        c.append("    return r;")
        c.append("  }")
        if rk == "Status":
            c.append("  r.status = fn(%s);" % args)
        elif rk == "Void":
            c.append("  fn(%s);" % args)
        else:
            base, const, stars = base_of(ret)
            if stars and base == "char":
                c.append("  r.text = fn(%s);" % args)
                c.append("  r.has_text = true;")
            elif stars:
                c.append("  r.pointer = (const void *)fn(%s);" % args)
                c.append("  r.has_pointer = true;")
            else:
                c.append("  r.value = (long long)fn(%s);" % args)
                c.append("  r.has_value = true;")
        c.append("  return r;")
        c.append("}")
        if params:
            c.append("const ParamInfo kParams_%s[] = {" % name)
            for t, n in params:
                k = param_kind(h, name, t)
                base, const, stars = base_of(t)
                si = struct_index(base) if k in ("Options", "Struct", "Tensor") else -1
                c.append("  {%s, %s, offsetof(args::%s, %s), sizeof(((args::%s *)0)->%s), ParamKind::%s, %s, %s, %s, %d}," % (
                    cstr(n), cstr(t), name, n, name, n, k, cstr(base),
                    "true" if const else "false",
                    pointee_sizeof(t, h.opaque) if stars else "0", si))
            c.append("};")
    c.append("")
    c.append("const FunctionInfo kFunctions[] = {")
    for ret, name, params in h.functions:
        c.append("  {%s, %s, ReturnKind::%s, sizeof(args::%s), %s, %d, &invoke_%s}," % (
            cstr(name), cstr(ret), ret_kinds[name], name,
            "kParams_%s" % name if params else "nullptr", len(params), name))
    c.append("};")
    c += [
        "}  // namespace",
        "",
        "Span<FunctionInfo> header_functions() { return {kFunctions, sizeof kFunctions / sizeof kFunctions[0]}; }",
        "Span<StructInfo> header_structs() { return {kStructs, sizeof kStructs / sizeof kStructs[0]}; }",
        "Span<EnumInfo> header_enums() { return {kEnums, sizeof kEnums / sizeof kEnums[0]}; }",
        "Span<const char *const> header_handle_types() {",
        "  return {kHandleTypes, sizeof kHandleTypes / sizeof kHandleTypes[0]};",
        "}",
        "",
        "}  // namespace sweep",
        "",
    ]
    write_if_changed(out_h, "\n".join(lines_h))
    write_if_changed(out_cpp, "\n".join(c))


def write_if_changed(path, text):
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--header", required=True)
    ap.add_argument("--out-h", required=True)
    ap.add_argument("--out-cpp", required=True)
    ap.add_argument("--list", action="store_true", help="print the parsed functions and exit")
    a = ap.parse_args()
    with open(a.header) as f:
        text = f.read()
    try:
        h = Header(text)
        if a.list:
            for ret, name, params in h.functions:
                print("%-34s %-12s %s" % (name, ret, ", ".join("%s %s [%s]" % (t, n, param_kind(h, name, t))
                                                                 for t, n in params)))
            return 0
        generate(h, a.out_h, a.out_cpp, "capi/include/te/te.h")
    except GenError as e:
        sys.stderr.write("gen_sweep.py: %s: %s\n" % (a.header, e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
