#!/usr/bin/env bash
# The README's test command: installs what the build needs, builds from scratch if needed, and
# runs the whole suite in the release build and again under AddressSanitizer + UBSan.
#   scripts/test.sh            both builds
#   scripts/test.sh release    one of them
set -euo pipefail
cd "$(dirname "$0")/.."
presets=("${@:-release}")
[ $# -eq 0 ] && presets=(release asan)
for preset in "${presets[@]}"; do
  echo "== $preset: build"
  bash scripts/build.sh "$preset"
  echo "== $preset: test"
  ctest --preset "$preset"
done
