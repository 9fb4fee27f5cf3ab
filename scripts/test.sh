#!/usr/bin/env bash
# Every test suite, the way CI runs it (.ci/run calls this):
#   1. installs what this machine lacks (scripts/install_deps.sh);
#   2. `release` preset: build everything, run every ctest suite (unit, api, header, install,
#      docs, bench smoke, and whatever else registers itself);
#   3. the bindings' suites (scripts/test_python.sh, test_rust.sh, test_julia.sh) against the
#      release build;
#   4. `asan` preset: the same build under AddressSanitizer + UndefinedBehaviorSanitizer, and
#      ctest again. No test is excluded: the install test builds its consumer with the same
#      sanitizer flags, so every suite runs instrumented.
# Both passes run even when the first fails, so one run shows everything; the exit status is
# non-zero when any build or test failed. Budget: ~25 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

jobs="${TE_TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}"
failed=()

bash scripts/install_deps.sh

run_preset() {  # preset
  local preset="$1"
  echo "==== [$preset] configure + build"
  if ! cmake --preset "$preset" || ! cmake --build --preset "$preset"; then
    failed+=("$preset: build")
    return
  fi
  echo "==== [$preset] ctest"
  # ctest prints its summary ("N% tests passed, ..." and the label times) at the end.
  if ! ctest --preset "$preset" --parallel "$jobs"; then
    failed+=("$preset: tests")
  fi
}

# The bindings' suites run against the release build (each script says what it checks).
run_binding() {  # language
  local lang="$1"
  echo "==== [bindings] $lang"
  if ! bash "scripts/test_$lang.sh"; then
    failed+=("bindings: $lang")
  fi
}

start=$SECONDS
run_preset release
for lang in python rust julia; do
  if [[ -f "scripts/test_$lang.sh" ]]; then run_binding "$lang"; fi
done
run_preset asan
elapsed=$((SECONDS - start))

echo "==== summary ($((elapsed / 60)) min $((elapsed % 60)) s)"
if [[ ${#failed[@]} -gt 0 ]]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all test suites passed (release and asan)"
