#!/usr/bin/env bash
# torch.multiprocessing's figures side by side: nodal (bench/multiprocessing_bench) and Python's
# multiprocessing / torch.multiprocessing (bench/peers/mp_bench.py, Debian's python3-torch), run
# one after the other on a quiet machine. Prints both CSVs and the ratios of their medians.
#   bench/multiprocessing.sh [BUILD_DIR]   (default build/release)
# The peer needs Debian's python3-torch (large, and no test needs it: scripts/setup-debian.sh
# leaves it out); this script installs it when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
. bench/peers/python_torch.sh
ensure_python_torch multiprocessing.sh
nodal=$("$build/bench/multiprocessing_bench")
python=$(/usr/bin/python3 bench/peers/mp_bench.py)
echo "$nodal"
echo "$python"
/usr/bin/python3 - "$nodal" "$python" <<'PY'
import sys
def rows(text):
    return {line.split(",")[0]: float(line.split(",")[1]) for line in text.splitlines() if line}
nodal, python = rows(sys.argv[1]), rows(sys.argv[2])
for name, us in nodal.items():
    peers = [p for p in python if p.split("_", 1)[1] == name]
    for peer in peers:
        print(f"{name}: nodal {us:.3f} us, {peer} {python[peer]:.1f} us: {python[peer] / us:.0f}x faster")
PY
