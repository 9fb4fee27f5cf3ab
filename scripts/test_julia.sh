#!/usr/bin/env bash
# Checks of the Julia binding (bindings/julia/LibTE) that can run without Julia: no Julia runtime
# is installable on the project's machines, so LibTE.jl is verified statically here.
#
#   1. the generated wrappers are in sync with te.h: scripts/gen_julia_bindings.py regenerates
#      src/gen/libte_api.jl into a temporary file, which must equal the checked-in one
#   2. the generator fails loudly on declarations it cannot translate (a union, a function
#      pointer, a non-integer macro, an enumerator without a value, a bit-field, a declarator list)
#   3. test/check_abi.py: the Julia structs' sizes/offsets/field types, the enum and #define
#      values, and every ccall's argument and return types against the C++ compiler's reading of
#      te.h; with a built libte.so.0 (LIBTE_PATH, else build/release): exported symbols, soname,
#      LIBTE_PATH loading, and a few calls made with the Julia signatures
#   4. test/check_static.py: every function/constant the high-level layer, tests and example use
#      exists; blocks and brackets balance
#   5. optional: test/check_syntax.py parses every Julia file with tree-sitter-julia when the
#      Python packages tree-sitter and tree-sitter-julia are importable (skipped otherwise)
#
# Prints `N passed, M failed` last and exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-python3}"
PKG=bindings/julia/LibTE
passed=0
failed=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

ok() { passed=$((passed + 1)); echo "PASS $1"; }
ko() { failed=$((failed + 1)); echo "FAIL $1"; }

# Runs a checker printing "N passed, M failed" as its last line; adds its counts.
run_counted() {  # name command...
  local name="$1"
  shift
  echo "==== $name"
  local out rc
  out="$("$@" 2>&1)"
  rc=$?
  echo "$out" | sed '$d'
  local last
  last="$(echo "$out" | tail -n 1)"
  if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
    if [[ $rc -ne 0 && ${BASH_REMATCH[2]} -eq 0 ]]; then ko "$name exited $rc"; fi
  else
    echo "$last"
    ko "$name (exit $rc, no summary line)"
  fi
}

echo "==== 1. generated wrappers in sync with capi/include/te/te.h"
if "$PY" scripts/gen_julia_bindings.py --output "$tmp/libte_api.jl" >/dev/null; then
  if diff -u "$PKG/src/gen/libte_api.jl" "$tmp/libte_api.jl" >"$tmp/diff"; then
    ok "src/gen/libte_api.jl equals a fresh generation from te.h"
  else
    head -n 40 "$tmp/diff"
    ko "src/gen/libte_api.jl differs from a fresh generation: run python3 scripts/gen_julia_bindings.py"
  fi
else
  ko "scripts/gen_julia_bindings.py failed on te.h"
fi

echo "==== 2. the generator refuses what it cannot translate"
# Each snippet is inserted into a copy of te.h just before its closing C++ guard.
snippets=(
  'typedef union te_u { int a; float b; } te_u;'
  'TE_API te_status te_set_callback(void (*cb)(int));'
  '#define TE_NAME "libte"'
  'typedef enum te_e { TE_E_A, TE_E_B = 1 } te_e;'
  'typedef struct te_bits { int a : 3; } te_bits;'
  'typedef struct te_pair { int32_t a, b; } te_pair;'
  'TE_API te_status te_by_value(te_context ctx);'
  'TE_API int te_varargs(int n, ...);'
  '#define TE_TWICE(x) ((x) * 2)'
  'extern int te_global_counter;'
)
for s in "${snippets[@]}"; do
  "$PY" - "$s" "$tmp/bad.h" <<'EOF'
import sys
text = open("capi/include/te/te.h").read()
marker = "#ifdef __cplusplus\n} /* extern \"C\" */"
assert marker in text, "te.h's closing guard moved: update scripts/test_julia.sh"
open(sys.argv[2], "w").write(text.replace(marker, sys.argv[1] + "\n\n" + marker))
EOF
  "$PY" scripts/gen_julia_bindings.py --header "$tmp/bad.h" --output "$tmp/bad.jl" >"$tmp/out" 2>&1
  rc=$?
  if [[ $rc -eq 2 ]] && grep -q "cannot translate the header" "$tmp/out"; then
    ok "rejected: $s  ($(sed 's/^gen_julia_bindings: cannot translate the header: //' "$tmp/out" | cut -c1-90))"
  else
    cat "$tmp/out"
    ko "accepted (exit $rc): $s"
  fi
done

run_counted "3. ABI: Julia declarations vs the C compiler and the built library" "$PY" "$PKG/test/check_abi.py"
run_counted "4. static checks of the hand-written Julia code" "$PY" "$PKG/test/check_static.py"

echo "==== 5. Julia syntax (tree-sitter-julia)"
if "$PY" -c "import tree_sitter, tree_sitter_julia" 2>/dev/null; then
  while read -r line; do
    echo "$line"
    case "$line" in PASS*) passed=$((passed + 1)) ;; FAIL*) failed=$((failed + 1)) ;; esac
  done < <("$PY" "$PKG/test/check_syntax.py" 2>&1)
else
  echo "SKIP the Python packages tree-sitter and tree-sitter-julia are not installed"
fi

echo "NOTE LibTE.jl's test/runtests.jl and examples/julia/train_mlp.jl need a Julia runtime; none is installed here, so they were not run"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
