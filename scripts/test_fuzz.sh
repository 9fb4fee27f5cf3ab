#!/usr/bin/env bash
# The libFuzzer harnesses (tests/fuzz), for a bounded time each:
#   fuzz_api_sequence  programs of public API calls (handles, scopes, linears, state, primitives)
#   fuzz_state_load    te_linear_state_load on mutated real saves (bit-exact round trip, finite FP8)
#   fuzz_dlpack        te_tensor_from_dlpack on fuzzed DLPack v1.0 structs
#   fuzz_checkpoint    te_checkpoint_deserialize on mutated real checkpoints (against a reference
#                      parser; canonical round trip)
# 1. needs clang with libFuzzer, ASan and UBSan: installs clang and libclang-rt-dev with apt-get
#    when missing (as root), else prints `SKIPPED <reason>` and exits 0;
# 2. configures build/fuzz with clang (CUDA, NCCL, tests, benchmarks, examples off), libte
#    instrumented with -fsanitize=fuzzer-no-link,address,undefined, the harnesses linked with
#    -fsanitize=fuzzer, and builds them;
# 3. writes fresh state-load and checkpoint seeds (real saves of this library) next to the checked-in corpora
#    (tests/fuzz/corpus/<name>/), then runs each fuzzer over them, two at a time, in a fresh
#    working corpus build/fuzz/work/<name>: fuzz_api_sequence for 1.5 x TE_FUZZ_SECONDS (the
#    largest input space), fuzz_state_load for TE_FUZZ_SECONDS, fuzz_dlpack and fuzz_checkpoint
#    for half of it (their coverage levels off within seconds);
# 4. prints `PASS <name> (<execs> execs, cov <n>)` or `FAIL <name> (...)` per fuzzer, with the
#    crash input (build/fuzz/artifacts/) and the first lines of its report, and as the LAST line
#    `N passed, M failed` (plus `, K skipped`); exits non-zero when any fuzzer failed.
# Any crash, sanitizer report, leak, timeout (-timeout=10 s per input), out-of-memory
# (-rss_limit_mb=2048) or violated invariant (the harness aborts) is a failure.
# Reproduce one: build/fuzz/tests/fuzz/<name> <crash file> (no environment needed; FUZZ_TRACE=1
# prints each call of fuzz_api_sequence). Environment: TE_FUZZ_SECONDS (default 80: 2 minutes of
# fuzzing, about 3 with the build, on 2 cores), TE_FUZZ_JOBS (fuzzers at a time, default 2),
# TE_FUZZ_SEED (libFuzzer's -seed; default random, printed), TE_FUZZ_BUILD_JOBS (default 2).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

case "${1:-}" in
  -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "usage: bash scripts/test_fuzz.sh (no arguments; --help)" >&2; exit 2 ;;
esac

secs="${TE_FUZZ_SECONDS:-80}"
par="${TE_FUZZ_JOBS:-2}"
build_jobs="${TE_FUZZ_BUILD_JOBS:-2}"
build="$root/build/fuzz"
fuzzers=(fuzz_api_sequence fuzz_state_load fuzz_dlpack fuzz_checkpoint)

skip() {
  echo "SKIPPED $*"
  echo "==== fuzzers SKIPPED: $*" >&2
  echo "0 passed, 0 failed, ${#fuzzers[@]} skipped"
  exit 0
}

# ---- 1. clang with libFuzzer + ASan + UBSan -----------------------------------------------------
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
have_libfuzzer() {
  command -v clang >/dev/null 2>&1 && command -v clang++ >/dev/null 2>&1 || return 1
  printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char *, unsigned long) { return 0; }\n' \
    >"$probe_dir/probe.cpp"
  clang++ -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cpp" -o "$probe_dir/probe" \
    >"$probe_dir/probe.log" 2>&1 || return 1
  local rt
  rt="$(clang -print-file-name=libclang_rt.asan-x86_64.so)"
  [[ -f "$rt" ]]
}
if ! have_libfuzzer; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "test_fuzz: installing clang and libclang-rt-dev (libFuzzer, ASan, UBSan)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -qq >&2 || true
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends clang libclang-rt-dev >&2 || true
  fi
  have_libfuzzer || skip "clang with libFuzzer/ASan/UBSan is not available (needs clang and libclang-rt-dev; \
$( [[ $(id -u) -eq 0 ]] && echo "apt-get could not install them" || echo "not root, so nothing was installed"))"
fi
rt_dir="$(dirname "$(clang -print-file-name=libclang_rt.asan-x86_64.so)")"
echo "test_fuzz: $(clang --version | head -1); runtime $rt_dir"

# ---- 2. configure and build -------------------------------------------------------------------
# libte.so links with --no-undefined, so it takes the shared ASan runtime (which carries UBSan and
# weak coverage hooks); the harnesses' libFuzzer provides the real hooks at run time. In the
# executables the runtime must come first in the library list: -nostdlib++ keeps clang from
# putting libstdc++ (which libFuzzer needs) before it, and the flags name it after the runtime. The harnesses' compiled-in sanitizer options (__asan_default_options) are exported for
# the shared runtime to find, so that a crash input reproduces without any environment.
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1"
link="-shared-libasan -fsanitize=address,undefined -Wl,-rpath,$rt_dir"
exe_link="-nostdlib++ $link -Wl,--no-as-needed -lstdc++ -Wl,--export-dynamic-symbol=__asan_default_options \
-Wl,--export-dynamic-symbol=__ubsan_default_options"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [[ -f "$build/CMakeCache.txt" ]] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang' "$build/CMakeCache.txt"; then
  rm -rf "$build"  # configured with another compiler
fi
fail_all() {  # reason
  for f in "${fuzzers[@]}"; do echo "FAIL $f ($1)"; done
  echo "0 passed, ${#fuzzers[@]} failed"
  exit 1
}
echo "==== [fuzz] configure + build ($build)"
t0=$SECONDS
CC=clang CXX=clang++ cmake -S "$root" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Debug -DTE_WITH_CUDA=OFF -DTE_WITH_NCCL=OFF \
  -DTE_BUILD_TESTS=OFF -DTE_BUILD_BENCH=OFF -DTE_BUILD_EXAMPLES=OFF -DTE_BUILD_FUZZERS=ON \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="$exe_link" -DCMAKE_SHARED_LINKER_FLAGS="$link" >"$probe_dir/configure.log" 2>&1 ||
  { cat "$probe_dir/configure.log"; fail_all "configure failed"; }
cmake --build "$build" --parallel "$build_jobs" --target "${fuzzers[@]}" fuzz_make_corpus fuzz_make_checkpoint_corpus ||
  fail_all "build failed"
echo "test_fuzz: built in $((SECONDS - t0)) s"

# ---- 3. run ------------------------------------------------------------------------------------
export ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export OPENBLAS_NUM_THREADS=1  # no BLAS threads: the fuzzers are single-threaded and share 2 cores
unset FUZZ_TRACE

rm -rf "$build/work" "$build/artifacts" "$build/seeds" "$build/logs"
mkdir -p "$build/work" "$build/artifacts" "$build/seeds" "$build/logs"
if ! "$build/tests/fuzz/fuzz_make_corpus" state "$build/seeds/fuzz_state_load" >"$build/logs/make_corpus.log" 2>&1; then
  cat "$build/logs/make_corpus.log"
  fail_all "fuzz_make_corpus could not write the state seeds (build/fuzz/logs/make_corpus.log)"
fi
if ! "$build/tests/fuzz/fuzz_make_checkpoint_corpus" "$build/seeds/fuzz_checkpoint" >>"$build/logs/make_corpus.log" 2>&1; then
  cat "$build/logs/make_corpus.log"
  fail_all "fuzz_make_checkpoint_corpus could not write the checkpoint seeds (build/fuzz/logs/make_corpus.log)"
fi

fuzz_seconds() {  # name
  case "$1" in
    fuzz_api_sequence) echo $((secs * 3 / 2)) ;;
    fuzz_dlpack | fuzz_checkpoint) echo $(((secs + 1) / 2)) ;;
    *) echo "$secs" ;;
  esac
}

run_one() {  # name
  local name="$1" dirs=("$build/work/$1" "$root/tests/fuzz/corpus/$1") t
  t="$(fuzz_seconds "$1")"
  mkdir -p "$build/work/$name"
  [[ -d "$build/seeds/$name" ]] && dirs+=("$build/seeds/$name")
  local seed=()
  [[ -n "${TE_FUZZ_SEED:-}" ]] && seed=(-seed="$TE_FUZZ_SEED")
  timeout -k 10 $((t + 300)) "$build/tests/fuzz/$name" "${dirs[@]}" "${seed[@]}" \
    -max_total_time="$t" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$name-" >"$build/logs/$name.log" 2>&1
  echo $? >"$build/logs/$name.rc"
}

plan=""
for f in "${fuzzers[@]}"; do plan+="${plan:+, }$f $(fuzz_seconds "$f") s"; done
echo "==== [fuzz] $plan; $par at a time"
t0=$SECONDS
running=0
for f in "${fuzzers[@]}"; do
  if [[ $running -ge $par ]]; then
    wait -n
    running=$((running - 1))
  fi
  run_one "$f" &
  running=$((running + 1))
done
wait
echo "test_fuzz: fuzzed for $((SECONDS - t0)) s"

# ---- 4. report ---------------------------------------------------------------------------------
passed=0 failed=0
for f in "${fuzzers[@]}"; do
  log="$build/logs/$f.log"
  rc="$(cat "$build/logs/$f.rc" 2>/dev/null || echo 99)"
  execs="$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -1)"
  cov="$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)"
  seed_used="$(sed -n 's/^INFO: Seed: \([0-9]*\).*/\1/p' "$log" | head -1)"
  artifacts=("$build/artifacts/$f-"*)
  [[ -e "${artifacts[0]}" ]] || artifacts=()
  if [[ "$rc" == 0 && ${#artifacts[@]} -eq 0 && -n "$execs" ]]; then
    echo "PASS $f (${execs} execs, cov ${cov:-?})"
    passed=$((passed + 1))
  else
    what="$(grep -m1 -E 'INVARIANT VIOLATED|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|SUMMARY:' "$log" |
      sed 's/^==[0-9]*==//' | cut -c1-200)"
    echo "FAIL $f (exit $rc, ${execs:-?} execs, cov ${cov:-?}, seed ${seed_used:-?}: ${what:-see the log}; input: ${artifacts[*]:-none}; log: build/fuzz/logs/$f.log)"
    # The report itself, for the CI log.
    grep -E -A25 'INVARIANT VIOLATED|ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log" | head -40 | sed 's/^/    /'
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
