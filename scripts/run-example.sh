#!/usr/bin/env bash
# The README's main command: builds nodal and runs the example job under nodalrun.
# Today that is examples/primes (2 ranks sieve 10^9 and check pi(10^9)); the Fashion-MNIST
# training job replaces it when it lands.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release >/dev/null
exec build/release/launcher/nodalrun -n "${NODAL_RANKS:-2}" build/release/examples/primes/primes "${1:-1000000000}"
