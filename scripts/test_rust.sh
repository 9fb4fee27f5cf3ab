#!/usr/bin/env bash
# The Rust bindings' suite (bindings/rust: libte-sys + libte):
#   1. installs what is missing: cargo (apt) and Debian's bindgen CLI (apt, pulls libclang);
#   2. builds libte when build/release/libte.so is missing (release preset, target te only);
#   3. installs it into a temporary prefix and points PKG_CONFIG_PATH / LD_LIBRARY_PATH there:
#      the installed te.pc is what libte-sys's build script finds;
#   4. regenerates the -sys bindings and fails if they differ from the checked-in file;
#   5. `cargo test --offline` (unit, integration, layout and doc tests);
#   6. `cargo run --offline --example train_mlp --release` (FP8 within 10% of FP32, or exit 1), and
#      its `--help` (usage, exit 0).
# Idempotent; cargo's target dir is bindings/rust/target (git-ignored). Every step runs even
# when an earlier one failed (except when there is nothing to test against); the exit status is
# non-zero when any failed. Environment: TE_TEST_JOBS (parallel build jobs, default nproc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
root=$PWD

log() { echo "test_rust: $*" >&2; }
have_cmd() { command -v "$1" >/dev/null 2>&1; }

# ---- 1. tools --------------------------------------------------------------------------------
# rustup installs cargo under ~/.cargo/bin, which non-login shells may not have on PATH.
if ! have_cmd cargo && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
missing=()
have_cmd cargo || missing+=(cargo)
have_cmd rustfmt || missing+=(rustfmt)
have_cmd bindgen || missing+=(bindgen)
have_cmd pkg-config || missing+=(pkg-config)
if [[ ${#missing[@]} -gt 0 ]]; then
  # waits for apt's locks; without root it prints the apt-get line to run (and this suite stops)
  bash scripts/install_deps.sh --apt "${missing[@]}"
fi
bindgen_version="$(bindgen --version 2>/dev/null || true)"  # captured whole: no `| head` under pipefail
log "$(cargo --version), ${bindgen_version%%$'\n'*}"

# ---- 2 + 3. libte, installed into a temporary prefix -------------------------------------------
jobs="${TE_TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}"
if [[ ! -e build/release/libte.so ]]; then
  log "building libte (release preset, target te)"
  cmake --preset release
  cmake --build --preset release --target te --parallel "$jobs"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install build/release --prefix "$tmp" >/dev/null
pcdir=$(dirname "$(find "$tmp" -name te.pc -print -quit)")
[[ -f "$pcdir/te.pc" ]] || { log "cmake --install put no te.pc under $tmp"; exit 1; }
libdir=$(PKG_CONFIG_PATH="$pcdir" pkg-config --variable=libdir te)
export PKG_CONFIG_PATH="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset LIBTE_LIB_DIR  # the installed te.pc is what this suite tests
export CARGO_TARGET_DIR="$root/bindings/rust/target"
export CARGO_BUILD_JOBS="$jobs"
log "libte installed in $tmp (te.pc in $pcdir)"

failed=()

# ---- 4. generated bindings up to date ----------------------------------------------------------
echo "==== [rust] bindgen: bindings.rs matches te.h"
bash scripts/gen_rust_bindings.sh --check || failed+=("bindings.rs out of date")

# ---- 5. cargo test -----------------------------------------------------------------------------
echo "==== [rust] cargo test --offline"
cd bindings/rust
test_log="$tmp/cargo_test.log"
if ! cargo test --offline 2>&1 | tee "$test_log"; then
  failed+=("cargo test")
fi
# cargo prints one "test result:" line per test binary; add them up.
awk '/^test result:/ { for (i = 1; i <= NF; ++i) { if ($(i+1) ~ /^passed;/) p += $i; if ($(i+1) ~ /^failed;/) f += $i; if ($(i+1) ~ /^ignored;/) g += $i } }
     END { printf "cargo test total: %d passed, %d failed, %d ignored\n", p, f, g }' "$test_log"

# ---- 6. the example ----------------------------------------------------------------------------
echo "==== [rust] cargo run --example train_mlp --release"
if ! cargo run --offline --example train_mlp --release; then
  failed+=("example train_mlp")
fi

echo "==== [rust] cargo run --example train_mlp --release -- --help"
help_out="$(cargo run --offline --quiet --example train_mlp --release -- --help 2>&1)" && help_rc=0 || help_rc=$?
echo "$help_out"
if [[ $help_rc -ne 0 || "$help_out" != *Usage:* || -e --help ]]; then
  rm -f -- --help
  failed+=("example train_mlp --help")
fi

echo "==== [rust] summary"
if [[ ${#failed[@]} -gt 0 ]]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "rust bindings: all passed"
