#!/usr/bin/env bash
# Installs what building and testing libte needs on Debian bookworm (or a close relative).
#
#   scripts/install_deps.sh           the build and the C / Python suites:
#     apt: cmake, gcc/g++, make, ninja, pkg-config, OpenBLAS, GoogleTest, Google Benchmark, python3,
#          pip, swig and the Python headers (the Python binding's SWIG module)
#     pip: numpy, ml_dtypes, pytest, wheel (independent oracles for the FP8 casts, the Python
#          tests, `pip install bindings/python`), tree-sitter + tree-sitter-julia (the Julia
#          binding's syntax check)
#   scripts/install_deps.sh --julia   a Julia runtime for the Julia binding's suite (see below)
#   scripts/install_deps.sh --apt PKG...   these apt packages (what test_rust.sh needs, ...)
#
# The Rust suite installs cargo, rustfmt and bindgen itself (scripts/test_rust.sh).
#
# Julia: Debian bookworm has no Julia package, and Julia's own installers download from hosts
# the project's machines cannot reach. Debian's archive still serves bullseye's julia 1.5.3, so
# --julia adds the bullseye suite with apt pin priority 100 (below bookworm's 500: a package
# bookworm has always comes from bookworm; only what bookworm lacks, julia and about ten old
# libraries, comes from bullseye), then installs julia. Debian's julia 1.5.3 crashes (SIGSEGV in
# libunwind) whenever it unwinds its own JIT frames, i.e. on any exception or failed @test, with
# bookworm's libunwind 1.6; bullseye's libunwind 1.3.2 works. So --julia also puts bullseye's
# libunwind.so.8 in Julia's private library directory (next to libjulia's other private libs,
# found through libjulia's RUNPATH), where only Julia loads it. The result is checked by running
# julia; a `julia` already on PATH that passes the same check is used as it is.
#
# Exit status: 0 when everything is installed; 1 on a failed install; 3 (--julia) when no Julia
# can be had here (not in the archive any more, or no root to install it), with the reason and
# the commands to run printed. Without root (and without password-less sudo) nothing is
# installed with apt: the script prints the exact apt-get command, installs the Python modules
# with `pip --user`, and exits 1 so callers know the machine is incomplete.
#
# Idempotent and quick on a machine that already has everything: it checks first (dpkg-query,
# command -v, a Python import) and runs apt-get / pip only for what is missing. apt waits for
# another process's dpkg lock (DPkg::Lock::Timeout) and retries `apt-get update` while the
# lists lock is held (apt-get update ignores DPkg::Lock::Timeout), up to TE_APT_LOCK_TIMEOUT
# seconds (default 600).
set -euo pipefail

log() { echo "install_deps: $*" >&2; }
have_cmd() { command -v "$1" >/dev/null 2>&1; }
# dpkg-query prints the status itself: no pipe into `grep -q`, which under pipefail can kill the
# producer with SIGPIPE and turn a match into a failure.
have_pkg() { [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]; }

lock_timeout="${TE_APT_LOCK_TIMEOUT:-600}"
export DEBIAN_FRONTEND=noninteractive

# ---- root -------------------------------------------------------------------------------------
sudo_cmd=()
can_root=1
if [[ $(id -u) -ne 0 ]]; then
  if have_cmd sudo && sudo -n true >/dev/null 2>&1; then
    sudo_cmd=(sudo -n)
  else
    can_root=0
  fi
fi
as_root() { "${sudo_cmd[@]}" "$@"; }

# ---- apt --------------------------------------------------------------------------------------
julia_source=/etc/apt/sources.list.d/libte-bullseye.sources  # what --julia adds
julia_pin=/etc/apt/preferences.d/libte-bullseye
apt_updated=0
# apt-get update, retried while another process holds apt's lists lock.
apt_update() {
  [[ $apt_updated -eq 1 ]] && return 0
  local out deadline=$((SECONDS + lock_timeout))
  out="$(mktemp)"
  while :; do
    if as_root apt-get -o DPkg::Lock::Timeout="$lock_timeout" update -qq >"$out" 2>&1; then
      cat "$out" >&2
      rm -f "$out"
      apt_updated=1
      return 0
    fi
    if grep -qE 'Could not get lock|Unable to lock' "$out" && [[ $SECONDS -lt $deadline ]]; then
      log "apt's lists lock is held by another process; waiting ($((deadline - SECONDS)) s left)"
      sleep 5
      continue
    fi
    if [[ -f "$julia_source" ]] && grep -q bullseye "$out"; then
      # The suite --julia added may have left the archive: take it out so that apt keeps working.
      cat "$out" >&2
      log "apt-get update failed on Debian bullseye (gone from the archive?): removing $julia_source and $julia_pin"
      as_root rm -f "$julia_source" "$julia_pin"
      continue
    fi
    cat "$out" >&2
    rm -f "$out"
    return 1
  done
}

apt_install() {  # packages...
  # dpkg's progress lines go to stdout even with -qq: keep only errors
  as_root apt-get -o DPkg::Lock::Timeout="$lock_timeout" install -y -qq --no-install-recommends "$@" >/dev/null
}

# ---- Julia ------------------------------------------------------------------------------------

# Runs julia far enough to prove it usable: an exception unwinds JIT frames and Test reports a
# failure with its backtrace (what crashes Debian's 1.5.3 with the wrong libunwind).
julia_works() {
  have_cmd julia || return 1
  local depot rc=0
  depot="$(mktemp -d)"  # a private depot: nothing of the user's ~/.julia is read or written
  # (in a subshell, whose stderr also takes bash's "Segmentation fault" report)
  (JULIA_DEPOT_PATH="$depot" timeout 300 julia --startup-file=no -e '
    using Test, Libdl, LinearAlgebra
    f(x) = x > 0 ? error("probe") : x
    try f(1) catch end
    length(backtrace()) > 0 || exit(1)
    try
        @testset "probe" begin
            @test 1 == 2
        end
    catch
    end
    norm([3.0, 4.0]) == 5.0 || exit(1)' >/dev/null 2>&1
   exit $?) 2>/dev/null || rc=$?  # `exit $?`: no exec of julia, so the subshell reports the crash
  rm -rf "$depot"
  return "$rc"
}

# The URI of the Debian archive this machine already uses for its own release (deb822 .sources
# or one-line .list files); empty when there is none.
debian_archive_uri() {
  local codename="$1" f uri
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    uri="$(awk -v c="$codename" '$1 == "deb" && $0 ~ (" " c " ") && $0 ~ / main/ {
             for (i = 2; i <= NF; ++i) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' "$f")"
    [[ -n "$uri" ]] && { echo "$uri"; return 0; }
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    uri="$(awk -v c="$codename" '
             /^[ \t]*$/ { if (ok && main && u != "") { print u; found = 1; exit } ok = main = 0; u = ""; next }
             $1 == "URIs:" { u = $2 }
             $1 == "Suites:" { for (i = 2; i <= NF; ++i) if ($i == c) ok = 1 }
             $1 == "Components:" { for (i = 2; i <= NF; ++i) if ($i == "main") main = 1 }
             END { if (!found && ok && main && u != "") print u }' "$f")"
    [[ -n "$uri" ]] && { echo "$uri"; return 0; }
  done
  return 1
}

julia_manual_steps() {  # uri
  local uri="${1:-URI-OF-YOUR-DEBIAN-MIRROR}"
  cat >&2 <<EOF
install_deps: to install Julia by hand, as root:
  cat > $julia_source <<'END'
Types: deb
URIs: $uri
Suites: bullseye
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
END
  printf 'Package: *\nPin: release n=bullseye\nPin-Priority: 100\n' > $julia_pin
  apt-get update && apt-get install --no-install-recommends julia
  then bash scripts/install_deps.sh --julia (as root) to add bullseye's libunwind for Julia
EOF
}

# Debian's julia 1.5.3 with bookworm's libunwind: put bullseye's libunwind.so.8 where libjulia's
# RUNPATH ($ORIGIN/julia) finds it before the system's.
fix_julia_libunwind() {
  local libjulia dir tmp so
  # awk reads all its input (a `grep -m1` could end dpkg-query with SIGPIPE under pipefail)
  libjulia="$(dpkg-query -L libjulia1 2>/dev/null | awk '/\/libjulia\.so\.1$/ && !n++' || true)"
  [[ -n "$libjulia" ]] || { log "libjulia1 is not installed from Debian: cannot apply the libunwind fix"; return 1; }
  dir="$(dirname "$libjulia")/julia"
  [[ -d "$dir" ]] || { log "no directory $dir (libjulia's RUNPATH \$ORIGIN/julia)"; return 1; }
  tmp="$(mktemp -d)"
  chown _apt "$tmp" 2>/dev/null || true  # apt-get download writes as the user _apt
  if ! (cd "$tmp" && as_root apt-get download -qq libunwind8/bullseye >&2); then
    rm -rf "$tmp"
    log "apt-get download libunwind8/bullseye failed"
    return 1
  fi
  dpkg-deb -x "$tmp"/libunwind8_*.deb "$tmp/x"
  so="$(find "$tmp/x" -name 'libunwind.so.8.*' -type f -print -quit)"
  if [[ -z "$so" ]]; then rm -rf "$tmp"; log "no libunwind.so.8 in bullseye's libunwind8"; return 1; fi
  as_root install -m 644 "$so" "$dir/libunwind.so.8"
  printf '%s\n' "libunwind.so.8: bullseye's libunwind8 ($(basename "$tmp"/libunwind8_*.deb)), put here by" \
    "libte's scripts/install_deps.sh --julia: Debian's julia 1.5.3 crashes with bookworm's libunwind 1.6" \
    "when it unwinds JIT frames. libjulia finds this copy first through its RUNPATH (\$ORIGIN/julia)." |
    as_root tee "$dir/libunwind.so.8.README" >/dev/null
  rm -rf "$tmp"
  log "installed bullseye's libunwind.so.8 into $dir (for Julia only)"
}

install_julia() {
  if julia_works; then
    log "julia works: $(julia --version)"
    return 0
  fi
  if ! have_cmd apt-get; then
    log "SKIP: no Julia on PATH and no apt-get to install one (Julia 1.5 or newer is needed)"
    return 3
  fi
  local codename uri
  codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
  uri="$(debian_archive_uri "$codename" || true)"
  if [[ $can_root -eq 0 ]]; then
    if have_cmd julia; then
      log "SKIP: $(command -v julia) fails a probe (an exception, a failed @test, LinearAlgebra): Debian's julia 1.5.3 needs bullseye's libunwind, which takes root to add: run bash scripts/install_deps.sh --julia as root"
      return 3
    fi
    log "SKIP: Julia is not installed, and installing it needs root (or password-less sudo)"
    julia_manual_steps "$uri"
    return 3
  fi
  if ! have_cmd julia; then
    if [[ "$codename" != bullseye && ! -f "$julia_source" ]]; then
      if [[ -z "$uri" ]]; then
        log "SKIP: found no Debian archive in this machine's apt sources to add bullseye from"
        julia_manual_steps ""
        return 3
      fi
      log "adding Debian bullseye ($uri) to apt's sources, pinned at priority 100: $julia_source, $julia_pin"
      printf '%s\n' "# Added by libte's scripts/install_deps.sh --julia: bullseye's julia 1.5.3 (bookworm has none)." \
        "Types: deb" "URIs: $uri" "Suites: bullseye" "Components: main" \
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" | as_root tee "$julia_source" >/dev/null
      printf '%s\n' "# Added by libte's scripts/install_deps.sh --julia: nothing that bookworm has comes from bullseye." \
        "Package: *" "Pin: release n=bullseye" "Pin-Priority: 100" | as_root tee "$julia_pin" >/dev/null
      apt_updated=0
    fi
    if ! apt_update; then
      log "apt-get update failed"
      return 1
    fi
    if [[ "$codename" != bullseye && ! -f "$julia_source" ]]; then
      log "SKIP: Debian bullseye is not reachable any more (apt-get update dropped it again)"
      return 3
    fi
    local candidate
    candidate="$(apt-cache policy julia 2>/dev/null | awk '$1 == "Candidate:" { print $2 }')"
    if [[ -z "$candidate" || "$candidate" == "(none)" ]]; then
      log "SKIP: the Debian archive has no julia package any more (apt-cache policy julia: no candidate)"
      return 3
    fi
    log "apt-get install julia ($candidate)"
    apt_install julia || { log "apt-get install julia failed"; return 1; }
  fi
  if ! julia_works; then
    log "julia $(julia --version 2>/dev/null | awk '{print $3}') crashes on an exception: adding bullseye's libunwind for it"
    fix_julia_libunwind || return 1
    if ! julia_works; then
      log "julia still fails the probe (an exception, a failed @test, LinearAlgebra) after the libunwind fix"
      return 1
    fi
  fi
  log "julia works: $(julia --version)"
  return 0
}

if [[ "${1:-}" == "--julia" ]]; then
  rc=0
  install_julia || rc=$?
  exit "$rc"
elif [[ "${1:-}" == "--apt" ]]; then
  # The other suites' own apt packages (test_python.sh, test_rust.sh), with the same lock
  # handling and the same answer without root.
  shift
  [[ $# -gt 0 ]] || exit 0
  if ! have_cmd apt-get; then log "apt-get not found; please install: $*"; exit 1; fi
  if [[ $can_root -eq 0 ]]; then
    log "need root (or password-less sudo) to install: $*"
    log "run as root: apt-get install -y --no-install-recommends $*"
    exit 1
  fi
  log "apt-get install $*"
  apt_update || { log "apt-get update failed"; exit 1; }
  apt_install "$@" || { log "apt-get install $* failed"; exit 1; }
  exit 0
elif [[ $# -gt 0 ]]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  [[ "$1" == "-h" || "$1" == "--help" ]] && exit 0
  exit 2
fi

# ---- the build and the C / Python suites --------------------------------------------------------
# Tools count as present when on PATH (however they were installed); libraries are checked
# with dpkg, since their headers and CMake/pkg-config files are what the build looks for.
missing=()
declare -A tool_pkg=([cmake]=cmake [gcc]=gcc [g++]=g++ [make]=make [ninja]=ninja-build
                     [pkg-config]=pkg-config [python3]=python3)
for tool in cmake gcc g++ make ninja pkg-config python3; do
  have_cmd "$tool" || missing+=("${tool_pkg[$tool]}")
done
for pkg in libopenblas-dev libgtest-dev libbenchmark-dev; do
  have_pkg "$pkg" || missing+=("$pkg")
done
# The Python binding's SWIG module: swig and the Python headers.
have_cmd swig || missing+=(swig)
python3 -c 'import sysconfig, os, sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' \
  >/dev/null 2>&1 || missing+=(python3-dev)

python_modules=(numpy ml_dtypes pytest wheel "tree-sitter>=0.22" "tree-sitter-julia>=0.23")
python_ok() { python3 -c 'import numpy, ml_dtypes, pytest, wheel, tree_sitter, tree_sitter_julia' >/dev/null 2>&1; }
if ! have_cmd python3 || ! python_ok; then
  # pip itself comes from apt on a fresh Debian.
  if ! have_cmd python3 || ! python3 -m pip --version >/dev/null 2>&1; then
    missing+=(python3-pip)
  fi
fi

rc=0
if [[ ${#missing[@]} -gt 0 ]]; then
  if ! have_cmd apt-get; then
    log "apt-get not found; please install: ${missing[*]}"
    rc=1
  elif [[ $can_root -eq 0 ]]; then
    log "need root (or password-less sudo) to install: ${missing[*]}"
    log "run as root: apt-get install -y --no-install-recommends ${missing[*]}"
    rc=1
  else
    log "apt-get install ${missing[*]}"
    apt_update || { log "apt-get update failed"; exit 1; }
    apt_install "${missing[@]}" || { log "apt-get install ${missing[*]} failed"; exit 1; }
  fi
fi

if have_cmd python3 && ! python_ok; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    log "no pip for python3: install python3-pip, then: python3 -m pip install ${python_modules[*]}"
    rc=1
  else
    log "pip install ${python_modules[*]}"
    # Debian's python3 is "externally managed" (PEP 668); these are test-only packages, so
    # install them next to the system ones rather than demand a virtualenv.
    pip_args=(install --quiet --disable-pip-version-check)
    if python3 -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
      pip_args+=(--break-system-packages)
    fi
    if [[ $(id -u) -eq 0 ]]; then
      export PIP_ROOT_USER_ACTION=ignore
    else
      pip_args+=(--user)
    fi
    python3 -m pip "${pip_args[@]}" "${python_modules[@]}" || true
    python_ok || { log "python modules still missing after pip: ${python_modules[*]}"; rc=1; }
  fi
fi

if [[ $rc -eq 0 && ${#missing[@]} -eq 0 ]]; then
  log "everything is installed"
else
  [[ $rc -eq 0 ]] && log "done"
fi
exit "$rc"
