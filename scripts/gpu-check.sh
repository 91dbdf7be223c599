#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (the H100 machine the `device` tool lends: Ubuntu 24.04, CUDA and
# NCCL in /usr/local/cuda, no package registry): builds nodal with what is there (no installs, no
# examples: they need Debian's dataset), runs every GPU test, then the GPU benchmarks beside their
# torch peers, and leaves logs and CSVs in OUT (default build/gpu/check; the device tool's $OUT).
#   scripts/gpu-check.sh            build, tests, benchmarks
#   scripts/gpu-check.sh tests      build and tests only
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build/gpu/check}"
mkdir -p "$out"
build=build/gpu
what="${1:-all}"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed: no GPU?" >&2

echo "== configure and build ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNODAL_CUDA=ON -DNODAL_BUILD_EXAMPLES=OFF \
  > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
ninja -C "$build" -j"$(nproc)" > "$out/build.log" 2>&1 || { grep -B2 -A10 -m5 'error' "$out/build.log"; exit 1; }

echo "== GPU tests"
ctest --test-dir "$build" -L 'gpu|unit' -j4 --output-on-failure --timeout 600 > "$out/ctest-gpu.log" 2>&1
status=$?
tail -25 "$out/ctest-gpu.log"
[ "$what" = tests ] && exit $status

nodalrun="$build/launcher/nodalrun"
echo "== hand-off latency (nodal, then torch.multiprocessing)"
"$nodalrun" -n 2 --gpus 0 --ranks-per-gpu 2 "$build/bench/gpu_handoff" > "$out/handoff.csv" 2>&1
python3 bench/peers/torch_handoff.py >> "$out/handoff.csv" 2>&1
cat "$out/handoff.csv"

echo "== collectives on one GPU: CUDA IPC (2, 4, 8 ranks), floors, torch gloo on CPU copies"
for n in 2 4 8; do
  "$nodalrun" -n "$n" --gpus 0 --ranks-per-gpu "$n" "$build/bench/nodal-gpu-bench" --csv "$out/gpu.csv" \
    >> "$out/gpu-bench.log" 2>&1
done
python3 bench/peers/torch_gpu_bench.py --ranks 2,4,8 --sizes 4KiB,1MiB,64MiB >> "$out/gpu.csv" 2>> "$out/gpu-bench.log"
cat "$out/gpu.csv"

echo "== NCCL, one rank: nodal's backend against torch.distributed's"
"$nodalrun" -n 1 --gpus 0 "$build/bench/nodal-gpu-bench" --csv "$out/nccl.csv" >> "$out/gpu-bench.log" 2>&1
python3 bench/peers/torch_nccl_bench.py --ranks 1 --max-bytes 64M --csv "$out/nccl.csv" >> "$out/gpu-bench.log" 2>&1
cat "$out/nccl.csv"
exit $status
