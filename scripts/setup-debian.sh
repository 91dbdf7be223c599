#!/usr/bin/env bash
# Installs the Debian 12 packages nodal builds, tests and benchmarks with.
# Idempotent: when every package is already installed it does nothing (no apt-get update).
#   scripts/setup-debian.sh [--check]   --check: install nothing, exit 1 if a package is missing
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libhwloc-dev
  libboost1.81-dev libboost-stacktrace1.81-dev libboost-serialization1.81-dev
  libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libdlpack-dev libeigen3-dev zlib1g-dev
  mpich openmpi-bin libgloo-dev libmpich-dev libopenmpi-dev libpmix-dev python3
  python3-dev python3-torch libtorch-dev pybind11-dev
  dataset-fashion-mnist
  gnuplot-nox hyperfine jq
  iproute2 gdb
  slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "setup-debian: missing ${missing[*]}"
  exit 1
fi

echo "setup-debian: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# The munge and Slurm packages' postinst would start system daemons (slurmd and slurmctld fail
# with no /etc/slurm/slurm.conf); tests/support/slurm-cluster.sh runs its own. A policy-rc.d
# that says no (exit 101) stops invoke-rc.d and deb-systemd-invoke from starting anything; one
# already there (a container's) is left as it is.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  trap '$sudo rm -f "$policy"' EXIT
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
fi
$sudo apt-get update -qq
# dpkg's lines (a few per package) are the installation's log: scripts/run-example.sh keeps them.
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
# Under systemd they are also enabled for the next boot: not the ones just installed here.
if [ -d /run/systemd/system ]; then
  for unit in munge slurmd slurmctld; do
    case " ${missing[*]} " in
      *" $unit "*) $sudo systemctl disable --quiet "$unit.service" 2>/dev/null || true ;;
    esac
  done
fi
