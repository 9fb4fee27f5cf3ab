#!/usr/bin/env bash
# Installs a built libte into a temporary prefix and checks it the way users consume it:
#   1. the layout: header, libte.so -> libte.so.0 -> libte.so.0.1.0, SONAME, exported symbols,
#      te.pc, the CMake package;
#   2. a C program built with `pkg-config --cflags --libs te`, run against the installed copy;
#   3. the same program built by a separate CMake project with find_package(te) + te::te.
# Any deviation fails the test with a message saying what was expected. Run by ctest (label
# `install`); usable by hand:
#   tests/install/run_install_test.sh --build-dir build/release --version 0.1.0 --libdir lib
set -euo pipefail

build_dir="" version="" libdir="lib" includedir="include" cmake="cmake" cc="${CC:-cc}"
c_flags="" ld_flags="" generator="" make_program="" config=""
src_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    --libdir) libdir="$2"; shift 2 ;;
    --includedir) includedir="$2"; shift 2 ;;
    --cmake) cmake="$2"; shift 2 ;;
    --cc) cc="$2"; shift 2 ;;
    --c-flags) c_flags="$2"; shift 2 ;;          # the build's flags (e.g. sanitizers)
    --ld-flags) ld_flags="$2"; shift 2 ;;
    --generator) generator="$2"; shift 2 ;;
    --make-program) make_program="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    *) echo "run_install_test.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$build_dir" && -n "$version" ]] || { echo "usage: $0 --build-dir DIR --version X.Y.Z [...]" >&2; exit 2; }
major="${version%%.*}"

fail() { echo "install test: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

work="$(mktemp -d "${TMPDIR:-/tmp}/te-install-test.XXXXXX")"
prefix="$work/prefix"
# Keep the evidence when something fails; clean up after a pass.
trap 'rc=$?; if [[ $rc -eq 0 ]]; then rm -rf "$work"; else echo "install test: left $work for inspection" >&2; fi' EXIT

step "cmake --install $build_dir --prefix $prefix"
install_args=(--install "$build_dir" --prefix "$prefix")
[[ -n "$config" ]] && install_args+=(--config "$config")
"$cmake" "${install_args[@]}" || fail "cmake --install failed"

step "layout"
lib="$prefix/$libdir"
[[ -f "$prefix/$includedir/te/te.h" ]] || fail "missing $includedir/te/te.h"
[[ -f "$lib/libte.so.$version" && ! -L "$lib/libte.so.$version" ]] || fail "missing $libdir/libte.so.$version (a regular file)"
[[ -L "$lib/libte.so.$major" ]] || fail "$libdir/libte.so.$major is not a symlink"
[[ "$(readlink "$lib/libte.so.$major")" == "libte.so.$version" ]] || fail "libte.so.$major -> $(readlink "$lib/libte.so.$major"), expected libte.so.$version"
[[ -L "$lib/libte.so" ]] || fail "$libdir/libte.so is not a symlink"
[[ "$(readlink "$lib/libte.so")" == "libte.so.$major" ]] || fail "libte.so -> $(readlink "$lib/libte.so"), expected libte.so.$major"
soname="$(readelf -d "$lib/libte.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')"
[[ "$soname" == "libte.so.$major" ]] || fail "SONAME is '$soname', expected libte.so.$major"
# Outputs are captured whole and then searched: never `producer | grep -q` (or `| head`), which
# under pipefail fails whenever grep exits before the producer has written everything (SIGPIPE).
dynamic="$(readelf -d "$lib/libte.so.$version")" || fail "readelf -d failed"
if grep -Eq '\((RPATH|RUNPATH)\)' <<<"$dynamic"; then
  fail "the installed libte.so still carries an RPATH/RUNPATH (a build-tree path)"
fi
# Only the C API leaves the library (visibility hidden + capi/libte.map).
exported="$(nm -D --defined-only "$lib/libte.so.$version" | awk '$2 != "A" {sub(/@.*/, "", $3); print $3}')" ||
  fail "nm -D failed"
leaked="$(grep -v '^te_' <<<"$exported" || true)"
[[ -z "$leaked" ]] || fail "libte.so exports symbols outside te_*: $(sed -n '1,5p' <<<"$leaked" | tr '\n' ' ')"
grep -qx 'te_version_string' <<<"$exported" || fail "te_version_string is not exported"
for f in te.pc; do [[ -f "$lib/pkgconfig/$f" ]] || fail "missing $libdir/pkgconfig/$f"; done
for f in teConfig.cmake teConfigVersion.cmake teTargets.cmake; do
  [[ -f "$lib/cmake/te/$f" ]] || fail "missing $libdir/cmake/te/$f"
done
# Nothing from the build tree may leak into what consumers read.
if grep -rIl -- "$(cd "$build_dir" && pwd)" "$lib/pkgconfig" "$lib/cmake/te" >/dev/null 2>&1; then
  fail "installed package files mention the build tree: $(grep -rIl -- "$(cd "$build_dir" && pwd)" "$lib/pkgconfig" "$lib/cmake/te" | tr '\n' ' ')"
fi

run_consumer() {  # name binary
  local out
  out="$(LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$2" 2>&1)" || { echo "$out" >&2; fail "$1 consumer exited non-zero"; }
  sed 's/^/   | /' <<<"$out"
  grep -q "^libte $version " <<<"$out" || fail "$1 consumer did not report libte $version"
  grep -q "^consumer: OK$" <<<"$out" || fail "$1 consumer did not finish"
  # It must have run against the installed copy, not the build tree's.
  local resolved
  resolved="$(LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$2" | awk '$1 == "libte.so.'"$major"'" {print $3}')"
  [[ "$(readlink -f "$resolved")" == "$(readlink -f "$lib/libte.so.$version")" ]] || fail "$1 consumer resolved libte.so.$major to '$resolved', not the installed copy"
}

step "pkg-config"
export PKG_CONFIG_PATH="$lib/pkgconfig"
command -v pkg-config >/dev/null || fail "pkg-config is not installed"
pc_version="$(pkg-config --modversion te)" || fail "pkg-config cannot read te.pc"
[[ "$pc_version" == "$version" ]] || fail "pkg-config --modversion te = '$pc_version', expected $version"
pc_flags="$(pkg-config --cflags --libs te)" || fail "pkg-config --cflags --libs te failed"
echo "   pkg-config --cflags --libs te: $pc_flags"
[[ "$pc_flags" == *"-I$prefix/$includedir"* || "$prefix/$includedir" == /usr/include ]] || fail "te.pc Cflags lack -I$prefix/$includedir"
[[ "$pc_flags" == *"-L$lib"* && "$pc_flags" == *"-lte"* ]] || fail "te.pc Libs lack -L$lib -lte"
pkg-config --libs --static te >/dev/null || fail "pkg-config --static te cannot resolve Requires.private"
# shellcheck disable=SC2086  # flags are word lists
"$cc" -std=c99 -Wall -Wextra -pedantic -Werror $c_flags "$src_dir/consumer.c" -o "$work/consumer_pc" \
  $(pkg-config --cflags --libs te) -lm $ld_flags || fail "building the consumer with pkg-config flags failed"
run_consumer pkg-config "$work/consumer_pc"

step "find_package(te)"
cmake_args=(-S "$src_dir/consumer_cmake" -B "$work/consumer_cmake"
  "-DCMAKE_PREFIX_PATH=$prefix" "-DTE_EXPECTED_VERSION=$version" "-DTE_EXPECTED_PREFIX=$prefix"
  "-DCMAKE_C_COMPILER=$cc" "-DCMAKE_C_FLAGS=$c_flags" "-DCMAKE_EXE_LINKER_FLAGS=$ld_flags"
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_BUILD_TYPE=Release)
[[ -n "$generator" ]] && cmake_args+=(-G "$generator")
[[ -n "$make_program" ]] && cmake_args+=("-DCMAKE_MAKE_PROGRAM=$make_program")
# The consumer must not see the parent build's environment-provided prefix paths.
env -u CMAKE_PREFIX_PATH "$cmake" "${cmake_args[@]}" || fail "configuring the find_package(te) consumer failed"
"$cmake" --build "$work/consumer_cmake" || fail "building the find_package(te) consumer failed"
run_consumer find_package "$work/consumer_cmake/consumer"

echo "install test: PASS (prefix $prefix)"
