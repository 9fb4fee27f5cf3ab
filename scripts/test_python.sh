#!/usr/bin/env bash
# The Python binding's suite (bindings/python, bindings/swig, examples/python):
#   1. builds libte (release preset, target te) when build/release/libte.so is missing;
#   2. installs swig and python3-dev with apt-get, only when absent (needs root);
#   3. builds the SWIG extension libte._te_swig (bindings/swig/build.py; no-op when up to date);
#   3b. installs PyTorch (python3 -m pip install torch, PyPI's wheel: ~5 GB with its CUDA
#      libraries) when it is not importable and there is room: at least 12 GB free on the
#      filesystems of pip's site-packages and of TMPDIR; otherwise, or when the install fails,
#      prints "SKIPPED: libte.torch tests: <reason>" and goes on (the libte.torch tests skip);
#      LIBTE_NO_TORCH_INSTALL=1 never installs;
#   4. runs pytest against both low-level backends (LIBTE_BACKEND=ctypes, then swig), with
#      LIBTE_PATH=build/release;
#   5. runs the Python demo (examples/python/train_mlp.py) and the PyTorch example (which skips
#      without torch), and checks that both answer --help with their usage and exit 0.
# Idempotent. Every step runs even when an earlier one failed; exit status non-zero on any failure.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

case "${1:-}" in
  -h|--help) sed -n '2,/^set -uo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

root="$(pwd)"
failed=()

if [[ ! -e build/release/libte.so ]]; then
  echo "==== [python] build libte (release preset, target te)"
  { cmake --preset release && cmake --build --preset release --target te; } || failed+=("libte build")
fi

python=${PYTHON:-python3}
need=()
command -v swig >/dev/null 2>&1 || need+=(swig)
inc="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
[[ -f "$inc/Python.h" ]] || need+=(python3-dev)
if [[ ${#need[@]} -gt 0 ]]; then
  echo "==== [python] apt-get install ${need[*]}"
  bash scripts/install_deps.sh --apt "${need[@]}" || failed+=("apt-get install ${need[*]}")
fi

echo "==== [python] SWIG extension"
"$python" bindings/swig/build.py --libdir build/release || failed+=("swig build")

# PyTorch for the libte.torch tests (bindings/python/tests/torch): installed when missing and
# there is room for it; never a failure of this script.
need_gb=${LIBTE_TORCH_NEED_GB:-12}  # for testing this step
if "$python" -c 'import torch' >/dev/null 2>&1; then
  echo "==== [python] PyTorch $("$python" -c 'import torch; print(torch.__version__)') present"
elif [[ -n "${LIBTE_NO_TORCH_INSTALL:-}" ]]; then
  echo "SKIPPED: libte.torch tests: PyTorch is not installed (LIBTE_NO_TORCH_INSTALL is set)"
else
  site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)"
  tmp="${TMPDIR:-/tmp}"
  free_gb() { df -Pk "$1" 2>/dev/null | awk 'NR==2 { print int($4 / 1048576) }'; }
  reason=""
  for dir in "$site" "$tmp"; do
    probe="$dir"
    while [[ -n "$probe" && ! -e "$probe" ]]; do probe="$(dirname "$probe")"; done
    gb="$(free_gb "${probe:-/}")"
    if [[ -z "$gb" ]]; then
      reason="cannot tell the free space of $dir"
    elif (( gb < need_gb )); then
      reason="only ${gb} GB free on the filesystem of $dir (PyTorch needs ${need_gb} GB)"
    fi
    [[ -n "$reason" ]] && break
  done
  if [[ -z "$reason" ]]; then
    # The version libte.torch is tested with here and on the GPU machine (PyTorch 2.11); any
    # other PyPI version when that one cannot be had for this Python.
    echo "==== [python] pip install torch==2.11.* (PyPI's wheel, ~5 GB)"
    if ! "$python" -m pip install --quiet 'torch==2.11.*' && ! "$python" -m pip install --quiet torch; then
      reason="python3 -m pip install torch failed"
    elif ! "$python" -c 'import torch' >/dev/null 2>&1; then
      reason="torch installed but does not import"
    fi
  fi
  if [[ -n "$reason" ]]; then
    echo "##################################################################"
    echo "SKIPPED: libte.torch tests: $reason"
    echo "##################################################################"
  fi
fi

export LIBTE_PATH="$root/build/release"
export PYTHONPATH="$root/bindings/python${PYTHONPATH:+:$PYTHONPATH}"

# TE_TEST_REPORT_DIR (set by scripts/test.sh): each run's JUnit XML goes there, as
# pytest-<backend>.xml, for the summary's counts and failing test names.
for backend in ctypes swig; do
  echo "==== [python] pytest, LIBTE_BACKEND=$backend"
  report=()
  [[ -n "${TE_TEST_REPORT_DIR:-}" ]] && report=("--junitxml=$TE_TEST_REPORT_DIR/pytest-$backend.xml")
  LIBTE_BACKEND=$backend "$python" -m pytest -p no:cacheprovider -rfE "${report[@]}" bindings/python/tests ||
    failed+=("pytest ($backend)")
done

echo "==== [python] examples/python/train_mlp.py"
"$python" examples/python/train_mlp.py --csv build/release/train_mlp_python_loss.csv ||
  failed+=("train_mlp.py")
echo "==== [python] examples/python/torch_linear.py"
"$python" examples/python/torch_linear.py || failed+=("torch_linear.py")
echo "==== [python] examples/python/train_gpt_torch.py (CPU preset, 30 steps)"
if "$python" -c 'import torch' >/dev/null 2>&1; then
  "$python" examples/python/train_gpt_torch.py --preset cpu --steps 30 --log-every 10 \
    --csv build/release/train_gpt_torch_loss.csv || failed+=("train_gpt_torch.py")
else
  echo "SKIPPED: train_gpt_torch.py: PyTorch is not installed"
fi
for ex in train_mlp.py torch_linear.py train_gpt_torch.py; do
  echo "==== [python] examples/python/$ex --help"
  help_dir="$(mktemp -d)"
  if (cd "$help_dir" && "$python" "$root/examples/python/$ex" --help) && [[ -z "$(ls -A "$help_dir")" ]]; then
    echo "PASS $ex --help"
  else
    failed+=("$ex --help")
  fi
  rm -rf "$help_dir"
done

if [[ ${#failed[@]} -gt 0 ]]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "python binding: all passed (ctypes and swig)"
