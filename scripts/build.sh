#!/usr/bin/env bash
# Configures and builds one CMake preset (release by default; asan for the sanitized build).
#   scripts/build.sh [release|asan]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
bash scripts/setup-debian.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
