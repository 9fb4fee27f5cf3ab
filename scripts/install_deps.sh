#!/usr/bin/env bash
# Installs what building and testing libte needs on Debian bookworm (or a close relative):
#   apt: cmake, gcc/g++, make, ninja, pkg-config, OpenBLAS, GoogleTest, Google Benchmark, python3, pip,
#        swig and the Python headers (the Python binding's SWIG module)
#   pip: numpy, ml_dtypes, pytest, wheel (independent oracles for the FP8 casts, the Python tests,
#        `pip install bindings/python`)
# The Rust suite installs cargo, rustfmt and bindgen itself (scripts/test_rust.sh).
# Idempotent and quick on a machine that already has everything: it checks first (dpkg -s,
# command -v, a Python import) and runs apt-get / pip only for what is missing, with one
# `apt-get update` before installing.
set -euo pipefail

log() { echo "install_deps: $*" >&2; }

have_pkg() { dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed'; }
have_cmd() { command -v "$1" >/dev/null 2>&1; }

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

python_modules=(numpy ml_dtypes pytest wheel)
python_ok() { python3 -c 'import numpy, ml_dtypes, pytest, wheel' >/dev/null 2>&1; }
need_pip=0
if ! have_cmd python3 || ! python_ok; then
  need_pip=1
  # pip itself comes from apt on a fresh Debian.
  if ! have_cmd python3 || ! python3 -m pip --version >/dev/null 2>&1; then
    missing+=(python3-pip)
  fi
fi

if [[ ${#missing[@]} -eq 0 && $need_pip -eq 0 ]]; then
  log "everything is already installed"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  if have_cmd sudo; then
    sudo_cmd=(sudo)
  else
    log "need root (or sudo) to install: ${missing[*]:-} (and python: ${python_modules[*]})"
    exit 1
  fi
fi

if [[ ${#missing[@]} -gt 0 ]]; then
  have_cmd apt-get || { log "apt-get not found; please install: ${missing[*]}"; exit 1; }
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! python_ok; then
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
  python3 -m pip "${pip_args[@]}" "${python_modules[@]}"
  python_ok || { log "python modules still missing after pip: ${python_modules[*]}"; exit 1; }
fi

log "done"
