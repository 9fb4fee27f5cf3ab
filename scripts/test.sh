#!/usr/bin/env bash
# Every test suite, the way CI runs it (.ci/run calls this):
#   1. installs what this machine lacks (scripts/install_deps.sh; without root it says what to
#      install, and the suites that can still run, run);
#   2. `release` preset: build everything, run every ctest suite (unit, api, header, install,
#      docs, bench smoke, and whatever else registers itself);
#   3. the bindings' suites against the release build: scripts/test_python.sh (pytest on the
#      ctypes and the SWIG backend, the Python examples), test_rust.sh (cargo test, the example),
#      test_julia.sh (static checks, then runtests.jl and examples/julia/train_mlp.jl on Julia
#      1.5.3 from Debian bullseye; SKIPPED, loudly, when no Julia can be installed);
#      then scripts/test_packages.sh (the Python wheel in a fresh venv, a fresh cargo project
#      on the Rust crates, from outside the tree with no libte environment variable);
#   4. `asan` preset: the same build under AddressSanitizer + UndefinedBehaviorSanitizer, and
#      ctest again. No test is excluded: the install test builds its consumer with the same
#      sanitizer flags, so every suite runs instrumented. On a machine without a GPU
#      (`nvidia-smi -L` fails) this tree is built CPU-only: no kernel could run there;
#   5. `tsan` preset (ThreadSanitizer), when CMakePresets.json has one: build and ctest;
#   6. scripts/test_fuzz.sh (the libFuzzer harnesses, bounded), when it exists.
# Every suite runs even when an earlier one failed, so one run shows everything. The end is a
# summary: each suite with its counts and time, then every failing test by name, then one
# `total: N passed, M failed, K skipped` line; the exit status is non-zero when any build or
# test failed (a SKIPPED suite does not fail the run). Each suite's full output is also kept in
# build/test-logs/. Budget: 33-70 minutes on 2 cores before the asan tree went CPU-only on
# GPU-less machines (2026-12-02: that tree builds in 17 min and its 1136 tests run in 7.5, where
# the CUDA one took about 15 min more to build). Environment: TE_TEST_JOBS (parallel jobs, default nproc).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

case "${1:-}" in
  -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "usage: bash scripts/test.sh (no arguments; --help)" >&2; exit 2 ;;
esac

jobs="${TE_TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}"
logs="$root/build/test-logs"
rm -rf "$logs"
mkdir -p "$logs"
export TE_TEST_REPORT_DIR="$logs"  # test_python.sh writes its JUnit XML here

# One row per suite: name, status (PASS / FAIL / SKIPPED), counts, seconds; failing tests by name.
names=() statuses=() counts=() times=()
failures=()
total_passed=0 total_failed=0 total_skipped=0

record() {  # name status counts seconds
  names+=("$1")
  statuses+=("$2")
  counts+=("$3")
  times+=("$4")
}

add_counts() {  # passed failed skipped
  total_passed=$((total_passed + $1))
  total_failed=$((total_failed + $2))
  total_skipped=$((total_skipped + $3))
}

# Runs a command with its output on the terminal and in a log; returns its exit status.
run_logged() {  # log command...
  local log="$1"
  shift
  "$@" 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}

# ---- ctest presets ----------------------------------------------------------------------------
run_preset() {  # preset label [extra configure arguments...]
  local preset="$1" label="$2" t0=$SECONDS rc=0
  shift 2
  local log="$logs/$preset.log"
  echo "==== [$preset] configure + build${*:+ ($*)}"
  if ! run_logged "$logs/$preset.configure.log" cmake --preset "$preset" "$@" ||
     ! run_logged "$logs/$preset.build.log" cmake --build --preset "$preset" --parallel "$jobs"; then
    record "$label" FAIL "build failed (build/test-logs/$preset.*.log)" $((SECONDS - t0))
    failures+=("$label: the build failed")
    total_failed=$((total_failed + 1))
    return
  fi
  echo "==== [$preset] ctest"
  run_logged "$log" ctest --preset "$preset" --parallel "$jobs" || rc=$?
  # "NN% tests passed, F tests failed out of T"; skipped tests count as passed there and are
  # listed as "  N - name (Skipped)" under "The following tests did not run:".
  local line total=-1 nfailed=0 nskipped=0
  line="$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" || true)"
  if [[ "$line" =~ ([0-9]+)\ tests?\ failed\ out\ of\ ([0-9]+) ]]; then
    nfailed=${BASH_REMATCH[1]}
    total=${BASH_REMATCH[2]}
    nskipped="$(grep -cE '^[[:space:]]*[0-9]+ - .* \((Skipped|Not Run|Disabled)\)$' "$log" || true)"
  fi
  local failed_log="build/$preset/Testing/Temporary/LastTestsFailed.log"
  if [[ $rc -ne 0 && -f "$failed_log" ]]; then
    while IFS= read -r t; do failures+=("$label: ${t#*:}"); done <"$failed_log"
  fi
  if [[ $total -ge 0 ]]; then
    local npassed=$((total - nfailed - nskipped))
    add_counts "$npassed" "$nfailed" "$nskipped"
    if [[ $rc -ne 0 && $nfailed -eq 0 ]]; then
      record "$label" FAIL "ctest exited $rc; $npassed passed, 0 failed, $nskipped skipped" $((SECONDS - t0))
      failures+=("$label: ctest exited $rc")
      total_failed=$((total_failed + 1))
    else
      record "$label" "$([[ $rc -eq 0 ]] && echo PASS || echo FAIL)" \
        "$npassed passed, $nfailed failed, $nskipped skipped" $((SECONDS - t0))
    fi
  else
    record "$label" FAIL "ctest exited $rc without a summary" $((SECONDS - t0))
    failures+=("$label: ctest exited $rc without a summary")
    total_failed=$((total_failed + 1))
  fi
}

# ---- the bindings -----------------------------------------------------------------------------
# pytest's JUnit XML: "passed failed skipped" and the failing tests' names (one per line after).
junit_counts() {  # xml
  python3 - "$1" <<'EOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
n = sum(int(s.get("tests", 0)) for s in suites)
f = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
k = sum(int(s.get("skipped", 0)) for s in suites)
print(n - f - k, f, k)
for s in suites:
    for c in s.iter("testcase"):
        if c.find("failure") is not None or c.find("error") is not None:
            print("%s::%s" % (c.get("classname", ""), c.get("name", "")))
EOF
}

run_python() {
  local t0=$SECONDS rc=0 log="$logs/python.log"
  echo "==== [bindings] python"
  run_logged "$log" bash scripts/test_python.sh || rc=$?
  local secs=$((SECONDS - t0)) backend label
  for backend in ctypes swig; do
    label="pytest $([[ $backend == swig ]] && echo SWIG || echo ctypes)"
    local xml="$logs/pytest-$backend.xml" out
    if [[ -s "$xml" ]] && out="$(junit_counts "$xml" 2>/dev/null)"; then
      local first p f k
      first="${out%%$'\n'*}"
      read -r p f k <<<"$first"
      add_counts "$p" "$f" "$k"
      record "$label" "$([[ $f -eq 0 ]] && echo PASS || echo FAIL)" "$p passed, $f failed, $k skipped" "$secs"
      if [[ "$out" == *$'\n'* ]]; then
        while IFS= read -r t; do failures+=("$label: $t"); done <<<"${out#*$'\n'}"
      fi
    else
      record "$label" FAIL "no report (test_python.sh exited $rc)" "$secs"
      failures+=("$label: no JUnit report")
      total_failed=$((total_failed + 1))
    fi
  done
  # test_python.sh's own failures that are not pytest's: builds, the examples.
  local other=()
  while IFS= read -r t; do
    [[ "$t" == "pytest ("* ]] || other+=("$t")
  done < <(sed -n 's/^FAILED: //p' "$log")
  if [[ ${#other[@]} -gt 0 ]]; then
    record "python examples" FAIL "${#other[@]} failed" "$secs"
    for t in "${other[@]}"; do failures+=("python: $t"); done
    add_counts 0 "${#other[@]}" 0
  elif [[ $rc -eq 0 ]] || grep -q '^FAILED: pytest' "$log"; then
    record "python examples" PASS "train_mlp.py, torch_linear.py, --help" "$secs"
  else
    record "python examples" FAIL "test_python.sh exited $rc" "$secs"
    failures+=("python: test_python.sh exited $rc")
    total_failed=$((total_failed + 1))
  fi
}

run_rust() {
  local t0=$SECONDS rc=0 log="$logs/rust.log"
  echo "==== [bindings] rust"
  run_logged "$log" bash scripts/test_rust.sh || rc=$?
  local secs=$((SECONDS - t0)) line
  # test_rust.sh adds up cargo's "test result:" lines: "cargo test total: P passed, F failed, I ignored".
  line="$(grep -E '^cargo test total: ' "$log" || true)"
  while IFS= read -r t; do failures+=("cargo: $t"); done < <(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$log")
  while IFS= read -r t; do
    [[ "$t" == "cargo test" ]] || failures+=("rust: $t")
  done < <(sed -n 's/^FAILED: //p' "$log")
  if [[ "$line" =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ ignored ]]; then
    local p=${BASH_REMATCH[1]} f=${BASH_REMATCH[2]} k=${BASH_REMATCH[3]}
    add_counts "$p" "$f" "$k"
    if [[ $rc -ne 0 && $f -eq 0 ]]; then
      total_failed=$((total_failed + 1))
      [[ $(sed -n 's/^FAILED: //p' "$log") ]] || failures+=("rust: test_rust.sh exited $rc")
    fi
    record "cargo" "$([[ $rc -eq 0 ]] && echo PASS || echo FAIL)" "$p passed, $f failed, $k ignored" "$secs"
  else
    record "cargo" FAIL "test_rust.sh exited $rc before cargo test's results" "$secs"
    failures+=("rust: test_rust.sh exited $rc before cargo test's results")
    total_failed=$((total_failed + 1))
  fi
}

# scripts/test_packages.sh (the wheel in a fresh venv, a fresh cargo project): "FAIL ..." per
# failed check and a closing "packages: N passed, M failed" line.
run_packages() {
  local t0=$SECONDS rc=0 log="$logs/packages.log"
  echo "==== packages: scripts/test_packages.sh"
  run_logged "$log" bash scripts/test_packages.sh || rc=$?
  local secs=$((SECONDS - t0)) line
  line="$(grep -E '^packages: [0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1 || true)"
  while IFS= read -r t; do failures+=("packages: $t"); done < <(sed -n 's/^FAIL \(.*\)$/\1/p' "$log")
  if [[ "$line" =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
    local p=${BASH_REMATCH[1]} f=${BASH_REMATCH[2]}
    add_counts "$p" "$f" 0
    if [[ $rc -ne 0 && $f -eq 0 ]]; then
      failures+=("packages: test_packages.sh exited $rc")
      total_failed=$((total_failed + 1))
    fi
    record "packages" "$([[ $rc -eq 0 && $f -eq 0 ]] && echo PASS || echo FAIL)" "$p passed, $f failed" "$secs"
  else
    record "packages" FAIL "test_packages.sh exited $rc without a 'packages: N passed, M failed' line" "$secs"
    failures+=("packages: test_packages.sh exited $rc without a summary line")
    total_failed=$((total_failed + 1))
  fi
}

# A script printing "N passed, M failed[, K skipped]" last and "FAIL ..." for each failure.
run_counted_script() {  # label log command...
  local label="$1" log="$2" t0=$SECONDS rc=0
  shift 2
  run_logged "$log" "$@" || rc=$?
  local secs=$((SECONDS - t0)) last="" line
  while IFS= read -r line || [[ -n "$line" ]]; do [[ -n "$line" ]] && last="$line"; done <"$log"
  while IFS= read -r t; do failures+=("$label: $t"); done < <(sed -n 's/^FAIL \(.*\)$/\1/p' "$log")
  local skip_reason
  skip_reason="$(sed -n 's/^SKIPPED //p' "$log")"
  if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)?$ ]]; then
    local p=${BASH_REMATCH[1]} f=${BASH_REMATCH[2]} k=${BASH_REMATCH[4]:-0}
    add_counts "$p" "$f" "$k"
    local status=PASS
    if [[ $rc -ne 0 || $f -ne 0 ]]; then
      status=FAIL
      if [[ $f -eq 0 ]]; then failures+=("$label: exited $rc"); total_failed=$((total_failed + 1)); fi
    fi
    local c="$p passed, $f failed"
    [[ $k -gt 0 ]] && c="$c, $k skipped"
    [[ -n "$skip_reason" ]] && { c="$c; SKIPPED ${skip_reason}"; [[ $status == PASS ]] && status="PASS*"; }
    record "$label" "$status" "$c" "$secs"
  else
    record "$label" FAIL "exited $rc without a 'N passed, M failed' line" "$secs"
    failures+=("$label: exited $rc without a summary line")
    total_failed=$((total_failed + 1))
  fi
}

start=$SECONDS

echo "==== setup: scripts/install_deps.sh"
t0=$SECONDS
setup_rc=0
run_logged "$logs/setup.log" bash scripts/install_deps.sh || setup_rc=$?
if [[ $setup_rc -eq 0 ]]; then
  record "setup" PASS "install_deps.sh" $((SECONDS - t0))
else
  record "setup" FAIL "install_deps.sh exited $setup_rc: this machine lacks something (build/test-logs/setup.log says what); running what can run" $((SECONDS - t0))
  failures+=("setup: scripts/install_deps.sh exited $setup_rc")
  total_failed=$((total_failed + 1))
fi

run_preset release "ctest release"
[[ -f scripts/test_python.sh ]] && run_python
[[ -f scripts/test_rust.sh ]] && run_rust
if [[ -f scripts/test_julia.sh ]]; then
  echo "==== [bindings] julia"
  run_counted_script "Julia" "$logs/julia.log" bash scripts/test_julia.sh
fi
[[ -f scripts/test_packages.sh ]] && run_packages
# Without a GPU no kernel can run, so the sanitized build leaves CUDA out (about 15 of CI's
# minutes on 2 cores were nvcc compiling kernels that could never execute); the release ctest
# above still covers the CUDA backend's host paths on such a machine. With a GPU, asan builds all.
if nvidia-smi -L >/dev/null 2>&1; then
  run_preset asan "ASan ctest"
else
  echo "==== [asan] no GPU here (nvidia-smi -L failed): building the sanitized tree CPU-only"
  run_preset asan "ASan ctest" -DTE_WITH_CUDA=OFF -DTE_WITH_NCCL=OFF
fi
presets="$(cmake --list-presets 2>/dev/null || true)"
if [[ "$presets" == *'"tsan"'* ]]; then
  run_preset tsan "TSan ctest"
else
  record "TSan ctest" SKIPPED "no tsan preset in CMakePresets.json" 0
fi
if [[ -f scripts/test_fuzz.sh ]]; then
  echo "==== fuzzers: scripts/test_fuzz.sh"
  run_counted_script "fuzzers" "$logs/fuzz.log" bash scripts/test_fuzz.sh
else
  record "fuzzers" SKIPPED "no scripts/test_fuzz.sh" 0
fi
elapsed=$((SECONDS - start))

echo
echo "==== summary ($((elapsed / 60)) min $((elapsed % 60)) s; full logs in build/test-logs/)"
any_failed=0
for i in "${!names[@]}"; do
  printf '  %-16s %-8s %-60s %4d s\n' "${names[$i]}" "${statuses[$i]}" "${counts[$i]}" "${times[$i]}"
  [[ "${statuses[$i]}" == FAIL ]] && any_failed=1
done
for i in "${!names[@]}"; do
  if [[ "${statuses[$i]}" == "PASS*" ]]; then
    echo "  * ${names[$i]}: parts of the suite were SKIPPED (see its line above)"
  fi
done
if [[ ${#failures[@]} -gt 0 ]]; then
  echo "failing:"
  printf '  %s\n' "${failures[@]}"
fi
echo "total: $total_passed passed, $total_failed failed, $total_skipped skipped"
[[ $any_failed -eq 0 && $total_failed -eq 0 ]]
