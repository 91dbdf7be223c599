#!/usr/bin/env bash
# Builds the GPU build here (a machine without a GPU: CUDA and NCCL compile, nothing runs) and
# packs it for the GPU machine, so that its short device time goes to tests, not to compiling:
#
#   scripts/gpu-pack.sh [OUT_DIR]            (default .gpurun; build/gpu is built first)
#
# OUT_DIR then holds:
#   build-gpu.tar.gz  build/gpu without objects, debug info stripped (~16 MB)
#   lib/              the shared libraries nodalrun, the tests and the benchmarks load that
#                     an Ubuntu 24.04 GPU machine may lack (Boost 1.81, fmt 9, hwloc, PMIx, ...);
#                     CUDA's and NCCL's come from the GPU machine
#   data/             the Fashion-MNIST IDX files, where this machine has them (the main job)
#   source-dir        this checkout's absolute path: the test binaries hold absolute paths
# On the GPU machine, `NODAL_GPU_PREBUILT=OUT_DIR scripts/gpu-check.sh build ...` unpacks it
# (seconds) instead of building (minutes). Where the checkout's path differs there, it makes a
# link at source-dir to the checkout, which needs permission to create it.
#
# 2026-11-27: the H100 run used this (then a session script): unpacked in 1 s; ldd of every
# binary found everything.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpurun}
build=build/gpu

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNODAL_CUDA=ON -DNODAL_NCCL=ON \
  -DNODAL_BUILD_EXAMPLES=ON > /dev/null
ninja -C "$build"

mkdir -p "$out/lib"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
tar -C build --exclude='*.o' --exclude='*.a' --exclude='.ninja_*' --exclude='*.d' --exclude='CMakeFiles/[0-9]*' \
  -cf - gpu | tar -C "$stage" -xf -
find "$stage/gpu" -type f -exec sh -c 'file -b "$1" | grep -q ELF && strip --strip-debug "$1"' _ {} \;
tar -C "$stage" -czf "$out/build-gpu.tar.gz" gpu
pwd > "$out/source-dir"

# Every library the binaries load, but the C and C++ runtimes, zlib and udev (newer there, and
# python3's torch loads them too) and CUDA's and NCCL's (the machine's own, matching its driver). Binaries that load torch, MPI or Gloo (the torch
# module, the MPI programs, the CPU benchmarks' peers) are not for the GPU machine: left out.
find "$build/launcher" "$build/tests" "$build/bench" "$build/examples" "$build/runtime" "$build/collectives" \
  "$build/data" -maxdepth 2 -type f -perm -u+x 2>/dev/null |
  while read -r f; do
    deps=$(ldd "$f" 2>/dev/null) || continue
    echo "$deps" | grep -q -E 'libtorch|libmpi|libgloo' && continue
    echo "$deps"
  done |
  awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcuda|libcudart|libnccl|libz|libudev|ld-linux)[.-]' |
  grep -v "^$PWD/" |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done

if [ -d /usr/share/datasets/fashion-mnist ]; then
  mkdir -p "$out/data"
  cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$out/data/"
fi
du -sh "$out"/* | sed 's/^/gpu-pack: /'
