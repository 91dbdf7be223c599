#!/usr/bin/env bash
# nodal::data::DataLoader beside torch's DataLoader on the same synthetic data set, one after the
# other on a quiet machine (bench/dataloader_bench.cpp, bench/peers/torch_dataloader.py). Prints
# both CSVs and the ratios of their medians.
#   bench/dataloader.sh [BUILD_DIR]   (default build/release)
# The peer needs Debian's python3-torch (no test needs it: scripts/setup-debian.sh leaves it out);
# this script installs it when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
. bench/peers/python_torch.sh
ensure_python_torch dataloader.sh
nodal=$("$build/bench/dataloader_bench")
torch=$(/usr/bin/python3 bench/peers/torch_dataloader.py)
echo "$nodal"
echo "$torch"
/usr/bin/python3 - "$nodal" "$torch" <<'PY'
import sys
def rows(text):
    return {line.split(",")[0]: float(line.split(",")[1]) for line in text.splitlines() if line}
nodal, torch = rows(sys.argv[1]), rows(sys.argv[2])
for name, value in nodal.items():
    peer = torch.get("torch_" + name)
    if peer is None:
        continue
    better = peer / value if name.startswith("first_batch") else value / peer
    print(f"{name}: nodal {value:.3f}, torch {peer:.3f}: {better:.1f}x")
PY
