#!/usr/bin/env bash
# The libte demo: installs what this machine lacks, builds the `release` preset and runs
# examples/c/train_gpt.c, which trains a small byte-level GPT on the Python standard library's
# sources twice from the same initial weights and batches: in FP8 (libte's autocast and FP8
# modules) and in the baseline precision (FP32 on the CPU, BF16 on a GPU). It writes both runs'
# loss curves to a CSV and a PNG plot of them (scripts/plot_loss.py), and prints where both are.
#
#   bash scripts/demo.sh [CSV] [-- TRAIN_GPT_FLAGS...]
#       --preset cpu (the default CSV: build/release/train_gpt_loss.csv, the PNG beside it), and
#       where a CUDA GPU is usable (nvidia-smi -L succeeds and the build has the CUDA backend)
#       also --preset gpu (CSV and PNG with _gpu before the extension). Flags after -- go to
#       every train_gpt run (build/release/examples/train_gpt --help lists them).
#   bash scripts/demo.sh --mlp [CSV]
#       The earlier, smaller demo: examples/c/train_mlp.c, an MLP in FP8 and FP32 on a synthetic
#       task (default CSV build/release/train_mlp_loss.csv, an SVG plot beside it).
#   bash scripts/demo.sh --help
#
# Exit status: the example's: 0 when FP8 ended within its tolerance of the baseline (train_gpt:
# final validation loss within 2%; with a GPU run too, both must), 1 when not, 2 on an error.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mlp=0
csv=""
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --mlp) mlp=1 ;;
    --) shift; extra=("$@"); break ;;
    -*) echo "demo.sh: unknown option $1 (--help)" >&2; exit 2 ;;
    *) [[ -z "$csv" ]] || { echo "demo.sh: at most one CSV path (--help)" >&2; exit 2; }; csv="$1" ;;
  esac
  shift
done
if [[ $mlp -eq 1 && ${#extra[@]} -gt 0 ]]; then
  echo "demo.sh: flags after -- are for train_gpt, not --mlp (--help)" >&2
  exit 2
fi

# An absolute path (the examples may change directory); its directory is created.
absolute() {
  mkdir -p "$(dirname "$1")"
  echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
}

# Without root install_deps.sh says what is missing; the build below then shows whether it matters.
bash scripts/install_deps.sh || echo "demo.sh: scripts/install_deps.sh could not install everything; trying anyway" >&2
cmake --preset release

if [[ $mlp -eq 1 ]]; then
  cmake --build --preset release --target te_train_mlp
  csv="$(absolute "${csv:-build/release/train_mlp_loss.csv}")"
  rc=0
  build/release/examples/train_mlp "$csv" || rc=$?
  echo
  if [[ -f "$csv" ]]; then
    echo "loss curves (CSV): $csv"
    svg="${csv%.csv}.svg"
    if python3 scripts/plot_loss.py "$csv" "$svg" >/dev/null; then
      echo "plot (SVG):        $svg"
    else
      echo "plot: scripts/plot_loss.py could not draw $csv" >&2
    fi
  fi
  exit "$rc"
fi

cmake --build --preset release --target te_train_gpt

# One train_gpt run: its status, then where its files are. The PNG is train_gpt's (--plot); if
# the run ended before drawing it, plot_loss.py draws it from whatever the CSV holds.
run_gpt() {  # preset csv
  local preset="$1" csv="$2" png="${2%.csv}.png" rc=0
  echo "== train_gpt --preset $preset =="
  build/release/examples/train_gpt --preset "$preset" --csv "$csv" --plot "$png" ${extra[@]+"${extra[@]}"} || rc=$?
  echo
  if [[ -f "$csv" ]]; then
    echo "loss curves (CSV): $csv"
    if [[ ! -f "$png" || "$png" -ot "$csv" ]]; then
      python3 scripts/plot_loss.py "$csv" "$png" >/dev/null || echo "plot: scripts/plot_loss.py could not draw $csv" >&2
    fi
    [[ -f "$png" ]] && echo "plot (PNG):        $png"
  fi
  return "$rc"
}

csv="$(absolute "${csv:-build/release/train_gpt_loss.csv}")"
rc=0
run_gpt cpu "$csv" || rc=$?

# The GPU preset where both a GPU and a CUDA build exist (TE_HAVE_CUDA_BACKEND=1 in the build).
if nvidia-smi -L >/dev/null 2>&1 && grep -q 'TE_HAVE_CUDA_BACKEND=1' build/release/build.ninja 2>/dev/null; then
  echo
  gpu_rc=0
  run_gpt gpu "${csv%.csv}_gpu.csv" || gpu_rc=$?
  [[ $rc -ne 0 ]] || rc=$gpu_rc
else
  echo "(no usable CUDA GPU, or a build without the CUDA backend: --preset gpu skipped)"
fi
exit "$rc"
