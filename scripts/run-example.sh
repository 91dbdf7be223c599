#!/usr/bin/env bash
# The README's main command: builds nodal and runs the example job under nodalrun: Fashion-MNIST
# trained by NODAL_RANKS (default 2) data-parallel trainer ranks, each fed by a DataLoader worker process.
#   scripts/run-example.sh [fashion_mnist options, e.g. --epochs 3 --num-workers 2]
# A fresh machine spends minutes installing and building: one line per step says which, the
# build's [n/N] shows how far, and the full output goes to build/run-example.log.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
mkdir -p build
log="$PWD/build/run-example.log"
: >"$log"
if bash scripts/setup-debian.sh --check >/dev/null; then
  echo "[1/3] Debian packages: all installed"
else
  run_step "[1/3] installing Debian packages (apt-get)" "$log" bash scripts/setup-debian.sh
fi
run_step "[2/3] building (release)" "$log" bash scripts/build.sh release
echo "[3/3] training Fashion-MNIST on ${NODAL_RANKS:-2} ranks under nodalrun ..."
exec build/release/launcher/nodalrun -n "${NODAL_RANKS:-2}" build/release/examples/fashion_mnist/fashion_mnist "$@"
