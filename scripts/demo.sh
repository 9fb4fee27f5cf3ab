#!/usr/bin/env bash
# The libte demo: installs what this machine lacks, builds the `release` preset and runs
# examples/c/train_mlp.c, which trains the same small MLP in FP8 (through libte's autocast and
# FP8 Linear layers) and in FP32, and writes their loss curves to a CSV. Arguments are passed to
# the example (default: the CSV goes to build/release/train_mlp_loss.csv); its exit status is
# this script's: 0 when FP8 training converged close to FP32, 1 when not, 2 on an error.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install_deps.sh
cmake --preset release
cmake --build --preset release --target te_train_mlp

if [[ $# -eq 0 ]]; then
  set -- build/release/train_mlp_loss.csv
fi
exec build/release/examples/train_mlp "$@"
