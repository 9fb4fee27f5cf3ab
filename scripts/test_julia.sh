#!/usr/bin/env bash
# The Julia binding's suite (bindings/julia/LibTE, examples/julia). Checks that need no Julia:
#
#   1. the generated wrappers are in sync with te.h: scripts/gen_julia_bindings.py regenerates
#      src/gen/libte_api.jl into a temporary file, which must equal the checked-in one
#   2. the generator fails loudly on declarations it cannot translate (a union, a function
#      pointer, a non-integer macro, an enumerator without a value, a bit-field, a declarator list)
#   3. test/check_abi.py: the Julia structs' sizes/offsets/field types, the enum and #define
#      values, and every ccall's argument and return types against the C++ compiler's reading of
#      te.h; with a built libte.so.0: exported symbols, soname, LIBTE_PATH loading, and a few calls
#      made with the Julia signatures
#   4. test/check_static.py: every function/constant the hand-written code uses exists; blocks
#      and brackets balance
#   5. test/check_syntax.py: every Julia file parses with tree-sitter-julia (PyPI tree-sitter and
#      tree-sitter-julia, installed by scripts/install_deps.sh)
#
# and with Julia (scripts/install_deps.sh --julia: Debian bullseye's julia 1.5.3 on bookworm):
#
#   6. test/runtests.jl, every @test counted
#   7. examples/julia/train_mlp.jl trains FP8 next to FP32 (exit 0: converged, within 10%), and
#      its loss curve matches the C demo's (build/.../examples/train_mlp) to 1e-5
#   8. train_mlp.jl --help prints its usage, exits 0 and writes no file
#
# When no Julia can be installed (the package left the archive, or no root), 6-8 are reported
# as SKIPPED, loudly, with the reason, and the rest still runs; they do not fail the suite.
#
# The library: LIBTE_PATH (the file or its directory), else build/release/libte.so.0, built
# (release preset, target te) when missing. Prints `N passed, M failed[, K skipped]` last and
# exits non-zero on any failure. Failing checks are printed on lines starting with `FAIL `.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

case "${1:-}" in
  -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

PY="${PYTHON:-python3}"
PKG=bindings/julia/LibTE
passed=0
failed=0
skipped=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

ok() { passed=$((passed + 1)); echo "PASS $1"; }
ko() { failed=$((failed + 1)); echo "FAIL $1"; }

# The last line of a file (no pipe: `echo "$out" | tail` would do, but keep to one pattern).
last_line() { local l="" line; while IFS= read -r line || [[ -n "$line" ]]; do l="$line"; done <"$1"; printf '%s' "$l"; }

# Runs a checker printing "N passed, M failed" as its last line; adds its counts.
run_counted() {  # name command...
  local name="$1"
  shift
  echo "==== $name"
  local rc=0
  "$@" >"$tmp/out" 2>&1 || rc=$?
  sed '$d' "$tmp/out"
  local last
  last="$(last_line "$tmp/out")"
  if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    echo "$last"
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
    if [[ $rc -ne 0 && ${BASH_REMATCH[2]} -eq 0 ]]; then ko "$name exited $rc"; fi
  else
    echo "$last"
    ko "$name (exit $rc, no summary line)"
  fi
}

# ---- the library --------------------------------------------------------------------------------
if [[ -n "${LIBTE_PATH:-}" ]]; then
  lib="$LIBTE_PATH"
  [[ -d "$lib" ]] && lib="$lib/libte.so.0"
else
  lib="$root/build/release/libte.so.0"
  if [[ ! -e "$lib" ]]; then
    echo "==== build libte (release preset, target te)"
    { cmake --preset release && cmake --build --preset release --target te; } || ko "libte build"
  fi
fi
lib="$(cd "$(dirname "$lib")" 2>/dev/null && pwd)/$(basename "$lib")"
export LIBTE_PATH="$lib"
echo "libte: $LIBTE_PATH"

# ---- 1-5: without Julia -------------------------------------------------------------------------
echo "==== 1. generated wrappers in sync with capi/include/te/te.h"
if "$PY" scripts/gen_julia_bindings.py --output "$tmp/libte_api.jl" >/dev/null; then
  if diff -u "$PKG/src/gen/libte_api.jl" "$tmp/libte_api.jl" >"$tmp/diff"; then
    ok "src/gen/libte_api.jl equals a fresh generation from te.h"
  else
    sed -n '1,40p' "$tmp/diff"
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
  rc=0
  "$PY" scripts/gen_julia_bindings.py --header "$tmp/bad.h" --output "$tmp/bad.jl" >"$tmp/out" 2>&1 || rc=$?
  if [[ $rc -eq 2 ]] && grep -q "cannot translate the header" "$tmp/out"; then
    why="$(sed 's/^gen_julia_bindings: cannot translate the header: //' "$tmp/out")"
    ok "rejected: $s  (${why:0:90})"
  else
    cat "$tmp/out"
    ko "accepted (exit $rc): $s"
  fi
done

run_counted "3. ABI: Julia declarations vs the C compiler and the built library" "$PY" "$PKG/test/check_abi.py"
run_counted "4. static checks of the hand-written Julia code" "$PY" "$PKG/test/check_static.py"

echo "==== 5. Julia syntax (tree-sitter-julia)"
if "$PY" -c "import tree_sitter, tree_sitter_julia" 2>/dev/null; then
  "$PY" "$PKG/test/check_syntax.py" >"$tmp/out" 2>&1
  while IFS= read -r line; do
    case "$line" in
      PASS*) echo "$line"; passed=$((passed + 1)) ;;
      FAIL*) echo "$line"; failed=$((failed + 1)) ;;
      *) echo "$line" ;;
    esac
  done <"$tmp/out"
else
  ko "Julia syntax check: the Python packages tree-sitter and tree-sitter-julia are missing (bash scripts/install_deps.sh, or: $PY -m pip install 'tree-sitter>=0.22' 'tree-sitter-julia>=0.23')"
fi

# ---- 6-8: with Julia ----------------------------------------------------------------------------
echo "==== 6. Julia runtime (scripts/install_deps.sh --julia)"
julia_rc=0
bash scripts/install_deps.sh --julia >"$tmp/install.log" 2>&1 || julia_rc=$?
cat "$tmp/install.log"
julia_skip=""
if [[ $julia_rc -eq 3 ]]; then
  julia_skip="$(grep -m1 'SKIP:' "$tmp/install.log" | sed 's/.*SKIP: //')"
  julia_skip="${julia_skip:-no Julia could be installed}"
elif [[ $julia_rc -ne 0 ]]; then
  ko "installing Julia failed (scripts/install_deps.sh --julia exited $julia_rc; its output is above)"
  julia_skip="the Julia install failed"
fi

if [[ -n "$julia_skip" ]]; then
  skipped=$((skipped + 3))
  echo
  echo "##########################################################################################"
  echo "SKIPPED Julia: runtests.jl and examples/julia/train_mlp.jl did not run: $julia_skip"
  echo "##########################################################################################"
  echo
else
  echo "$(julia --version) ($(command -v julia))"
  # A private depot: the precompiled LibTE and Julia's logs stay out of ~/.julia.
  export JULIA_DEPOT_PATH="$tmp/depot"
  julia_cmd=(julia --startup-file=no --color=no "--project=$root/$PKG")

  echo "==== 6. $PKG/test/runtests.jl"
  t0=$SECONDS
  rc=0
  "${julia_cmd[@]}" "$PKG/test/runtests.jl" >"$tmp/runtests.log" 2>&1 || rc=$?
  cat "$tmp/runtests.log"
  # Julia's Test prints "<testset>: Test Failed at <file>:<line>" / "Error During Test at" for
  # each failure and, when any, "Some tests did not pass: P passed, F failed, E errored, B broken."
  jp="" jf=0
  summary="$(grep -E 'Some tests did not pass: [0-9]+ passed' "$tmp/runtests.log" || true)"
  if [[ "$summary" =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ errored ]]; then
    jp=${BASH_REMATCH[1]}
    jf=$((BASH_REMATCH[2] + BASH_REMATCH[3]))
  else
    # All passed: the top testset's summary row, "LibTE | <pass> <total>".
    row="$(grep -E '^LibTE +\| +[0-9]+ +[0-9]+ *$' "$tmp/runtests.log" || true)"
    [[ "$row" =~ \|\ +([0-9]+)\ +([0-9]+) ]] && jp=${BASH_REMATCH[1]}
  fi
  while IFS= read -r line; do
    echo "FAIL runtests.jl: $line"
  done < <(grep -E ': (Test Failed|Error During Test) at ' "$tmp/runtests.log" | sed "s#$root/##")
  if [[ -n "$jp" ]]; then
    passed=$((passed + jp))
    failed=$((failed + jf))
    echo "runtests.jl: $jp passed, $jf failed ($((SECONDS - t0)) s)"
    if [[ $rc -ne 0 && $jf -eq 0 ]]; then ko "runtests.jl exited $rc"; fi
  else
    ko "runtests.jl (exit $rc, no test summary: crashed or did not load)"
  fi

  echo "==== 7. examples/julia/train_mlp.jl"
  t0=$SECONDS
  csv="$tmp/train_mlp_julia.csv"
  rc=0
  "${julia_cmd[@]}" examples/julia/train_mlp.jl "$csv" || rc=$?
  if [[ $rc -eq 0 ]]; then ok "train_mlp.jl: FP8 converged within 10% of FP32 ($((SECONDS - t0)) s)"; else ko "train_mlp.jl exited $rc"; fi
  c_demo="$(dirname "$LIBTE_PATH")/examples/train_mlp"
  if [[ $rc -eq 0 && -x "$c_demo" ]]; then
    crc=0
    "$c_demo" "$tmp/train_mlp_c.csv" >"$tmp/c_demo.log" 2>&1 || crc=$?
    if grep -q "CPU context" "$tmp/c_demo.log"; then
      if "$PY" - "$tmp/train_mlp_c.csv" "$csv" <<'EOF'
import csv, sys
c, j = (list(csv.reader(open(p)))[1:] for p in sys.argv[1:3])
assert len(c) == len(j) == 600, (len(c), len(j))
worst = max(abs(float(a) - float(b)) / abs(float(a)) for rc, rj in zip(c, j) for a, b in zip(rc[1:], rj[1:]))
print("largest relative difference between the C and Julia loss curves: %.2g" % worst)
sys.exit(0 if worst <= 1e-5 else 1)
EOF
      then
        ok "train_mlp.jl's loss curve equals the C demo's (to 1e-5)"
      else
        ko "train_mlp.jl's loss curve differs from the C demo's ($c_demo exited $crc)"
      fi
    else
      echo "NOTE the C demo ran on a GPU context: its curve is not compared with Julia's (CPU)"
    fi
  fi

  echo "==== 8. train_mlp.jl --help"
  rc=0
  (cd "$tmp" && "${julia_cmd[@]}" "$root/examples/julia/train_mlp.jl" --help >"$tmp/help.out" 2>&1) || rc=$?
  if [[ $rc -eq 0 ]] && grep -q '^Usage' "$tmp/help.out" && [[ ! -e "$tmp/--help" ]]; then
    ok "train_mlp.jl --help prints its usage and exits 0"
  else
    cat "$tmp/help.out"
    ko "train_mlp.jl --help (exit $rc)"
  fi
fi

if [[ $skipped -gt 0 ]]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[[ $failed -eq 0 ]]
