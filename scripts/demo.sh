#!/usr/bin/env bash
# The libte demo: installs what this machine lacks, builds the `release` preset and runs
# examples/c/train_mlp.c, which trains the same small MLP in FP8 (through libte's autocast and
# FP8 Linear layers) and in FP32, and writes their loss curves to a CSV; scripts/plot_loss.py
# then draws them as an SVG next to it. It prints where both files are.
#
#   bash scripts/demo.sh [loss.csv]     (default build/release/train_mlp_loss.csv; --help: usage)
#
# Exit status: the example's: 0 when FP8 training converged close to FP32, 1 when not, 2 on an
# error.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  -*) echo "demo.sh: unknown option $1 (--help)" >&2; exit 2 ;;
esac
[[ $# -le 1 ]] || { echo "demo.sh: at most one argument, the CSV path (--help)" >&2; exit 2; }

# Without root install_deps.sh says what is missing; the build below then shows whether it matters.
bash scripts/install_deps.sh || echo "demo.sh: scripts/install_deps.sh could not install everything; trying anyway" >&2
cmake --preset release
cmake --build --preset release --target te_train_mlp

csv="${1:-build/release/train_mlp_loss.csv}"
mkdir -p "$(dirname "$csv")"
csv="$(cd "$(dirname "$csv")" && pwd)/$(basename "$csv")"
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
