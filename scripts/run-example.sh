#!/usr/bin/env bash
# The README's main command: builds nodal and runs the example job under nodalrun: Fashion-MNIST
# trained by NODAL_RANKS (default 2) data-parallel trainer ranks, each fed by a loader process.
#   scripts/run-example.sh [fashion_mnist options, e.g. --epochs 3 --loaders 2]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release >/dev/null
exec build/release/launcher/nodalrun -n "${NODAL_RANKS:-2}" build/release/examples/fashion_mnist/fashion_mnist "$@"
