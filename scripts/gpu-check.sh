#!/usr/bin/env bash
# The GPU proof, in steps that each fit one device command (< 10 minutes), on a machine with an
# NVIDIA GPU (the H100 machine the `device` tool lends: Ubuntu 24.04, CUDA and NCCL, no package
# archive): builds nodal with what is there and runs every GPU mechanism, test and benchmark,
# each under an outer timeout, with one log per step and a summary table at the end.
# `scripts/gpu-check.sh --help` lists the steps.
set -uo pipefail
cd "$(dirname "$0")/.."

readonly build="${NODAL_GPU_BUILD:-build/gpu}"  # the build the steps make and use
out="${OUT:-build/gpu/check}"
steps_all=(env build smoke tests tests-more bench)

usage() {
  cat <<'EOF'
usage: scripts/gpu-check.sh [STEP...]      (no STEP: all of them, in this order)

Steps (time on the 16-core H100 machine; estimates until measured) and their outer timeouts:
  env         5 s       GPU, driver, compute mode, toolkit, NCCL, torch and C++ packages found
  build       3-5 min   configure (CUDA and NCCL required, examples on) and build into build/gpu
                        (NODAL_GPU_BUILD); seconds when it is already there (a warm device machine)
  smoke       1-2 min   each mechanism once, directly, under `timeout 120`: VMM pool hand-off,
                        legacy IPC of small and large cudaMalloc, producer exits, consumer dies,
                        NCCL one rank, CUDA IPC collectives 2 ranks (short), fashion_mnist --device
                        cuda; GPU memory in use before and after
  tests       3-6 min   GPU tests by binary (queue, NCCL, CUDA IPC matrix 2 ranks + fault drill,
                        fashion_mnist) and the unit tests, with NODAL_REQUIRE_GPU=1 (a GPU test
                        that would skip fails; only "needs N GPUs" skips are allowed)
  tests-more  4-8 min   the CUDA IPC matrix at 4 and 8 ranks, and the full matrix at 2
  bench       3-5 min   hand-off latency, CUDA IPC collectives 2/4/8 ranks, NCCL one rank, each
                        beside its torch peer
Each step but env has an outer timeout of 570 s; the script stops at the first step that fails.
Every invocation first checks, in seconds, that a GPU check can run here (a driver, a GPU, a
driver new enough for the toolkit) and otherwise exits 3 with one line saying why.

Logs: one per step in $OUT (default build/gpu/check): env.log build.log smoke.log tests.log
tests-more.log bench.log and summary.txt (7 files: the device tool brings back at most 8).
Exit status: 0 when every step run passed, 1 when one failed, 3 when no GPU check can run here.

NODAL_GPU_PREBUILT=DIR: the build step unpacks scripts/gpu-pack.sh's output (made on a machine
without a GPU, carried to this one) in seconds instead of building; the bench step then also runs
the main job on DIR/data (Fashion-MNIST), --device cuda and cpu.

With the device tool (its machine goes back after 30 s idle, and build/gpu with it), run the
build in the same command as what needs it:
  scripts/gpu-check.sh env build smoke tests
  scripts/gpu-check.sh build tests-more        (build: seconds if the machine stayed warm)
  scripts/gpu-check.sh build bench
EOF
}

# ---- Can a GPU check run here at all? (seconds; no build) ----

# The toolkit's nvcc: CUDACXX, PATH, then /usr/local/cuda.
find_nvcc() {
  local c
  for c in "${CUDACXX:-}" "$(command -v nvcc 2>/dev/null)" /usr/local/cuda/bin/nvcc; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}

# The oldest driver branch a CUDA major version runs on (CUDA Toolkit release notes, "CUDA Driver":
# 13.x needs r580, 12.x r525, 11.x r450 under minor-version compatibility).
min_driver_for() {
  case "$1" in
    13) echo 580 ;;
    12) echo 525 ;;
    11) echo 450 ;;
    *) echo 0 ;;
  esac
}

# nvidia-smi, or NVIDIA_SMI (tests/scripts/gpu_check_test.sh stands fakes in for it).
nvidia_smi() { "${NVIDIA_SMI:-nvidia-smi}" "$@"; }

# Prints one line and returns 1 when no GPU check can run here.
preflight() {
  if ! command -v "${NVIDIA_SMI:-nvidia-smi}" >/dev/null 2>&1; then
    echo "no NVIDIA driver on this machine (nvidia-smi not found): no GPU check can run here"
    return 1
  fi
  local smi
  if ! smi=$(nvidia_smi --query-gpu=index,name,driver_version,compute_mode --format=csv,noheader 2>&1); then
    echo "nvidia-smi failed ($(echo "$smi" | head -1)): the NVIDIA driver is not working here"
    return 1
  fi
  if [ -z "$smi" ]; then
    echo "no GPU: nvidia-smi lists none"
    return 1
  fi
  local nvcc
  if ! nvcc=$(find_nvcc); then
    echo "no CUDA toolkit (nvcc not in CUDACXX, on PATH or in /usr/local/cuda/bin): nothing to build with"
    return 1
  fi
  local toolkit driver need
  toolkit=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
  driver=$(echo "$smi" | head -1 | cut -d, -f3 | tr -d ' ')
  need=$(min_driver_for "${toolkit%%.*}")
  if [ "${driver%%.*}" -lt "$need" ] 2>/dev/null; then
    echo "the NVIDIA driver $driver is too old for CUDA $toolkit ($nvcc): it needs r$need or newer"
    return 1
  fi
  return 0
}

# ---- The steps (each runs as `gpu-check.sh --run-step NAME`, under an outer timeout) ----

nodalrun="$build/launcher/nodalrun"
tmp="$build/check-tmp"  # what a step tells the summary (notes), and files that are not logs

note() { echo "$*" >> "$tmp/$STEP.note"; }

# Runs one command under `timeout LIMIT`, prints its output, and notes its name, exit code and
# time. Returns the command's exit code.
probe() {
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*"
  local start=$SECONDS
  timeout -k 10 "$limit" "$@"
  local rc=$?
  local took=$((SECONDS - start))
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && rc="$rc (timed out after ${limit}s)"
  echo "== $name: rc=$rc in ${took}s"
  note "$name: rc=$rc, ${took}s"
  [ "${rc%% *}" = 0 ]
}

# A gtest binary (or ctest) under `timeout`, then its skips: only "needs N GPUs" (fewer GPUs than
# the test needs) and "a GPU is available here" (the no-GPU behaviour) may skip here.
gtest() {
  local name=$1 limit=$2
  shift 2
  local log="$tmp/$name.out"
  probe "$name" "$limit" "$@" 2>&1 | tee "$log"
  local status=${PIPESTATUS[0]}
  local bad=0 line test reason
  while IFS= read -r line; do
    test=${line#\[  SKIPPED \] }
    test=${test%% (*}
    reason=$(grep -B3 -F "[  SKIPPED ] $test (" "$log" | grep -v '^\[' | tr '\n' ' ')
    if echo "$reason" | grep -qE 'needs [0-9]+ GPUs|a GPU is available here'; then
      note "  skipped, allowed: $test: $reason"
    else
      note "  SKIPPED, not allowed: $test: $reason"
      bad=1
    fi
  done < <(grep -E '^\[  SKIPPED \] [A-Za-z].* \([0-9]+ ms\)$' "$log")
  [ "$status" -eq 0 ] && [ $bad -eq 0 ]
}

gpu_memory_used() { nvidia_smi --query-gpu=memory.used --format=csv,noheader | tr '\n' ' '; }

step_env() {
  echo "== nvidia-smi"
  nvidia_smi
  nvidia_smi --query-gpu=index,name,driver_version,compute_mode,mig.mode.current,memory.total --format=csv
  note "$(nvidia_smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader | head -1)"
  echo "== toolkit: $(find_nvcc)"
  "$(find_nvcc)" --version | tail -2
  note "nvcc: $("$(find_nvcc)" --version | sed -n 's/.*\(release [0-9.]*\).*/\1/p')"
  echo "== build tools"
  cmake --version | head -1
  ninja --version 2>&1 | sed 's/^/ninja /'
  g++ --version | head -1
  echo "== NCCL"
  ls -l /usr/local/cuda/include/nccl.h /usr/local/cuda/lib*/libnccl* /usr/include/nccl.h \
    /usr/lib/x86_64-linux-gnu/libnccl* 2>&1
  python3 -c "import nvidia.nccl as n; print('wheel:', list(n.__path__)[0])" 2>&1
  echo "== C++ packages nodal needs (configure says what is missing)"
  pkg-config --modversion hwloc 2>&1 | sed 's/^/hwloc /'
  ls -d /usr/include/fmt /usr/include/CLI /usr/include/gtest /usr/include/boost /usr/include/eigen3 \
    /usr/include/zlib.h /usr/include/benchmark 2>&1
  echo "== torch (the benchmarks' peers)"
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" 2>&1
  echo "== compute capability and sharing"
  nvidia_smi -q | grep -iE 'compute mode|MIG Mode|Product Name|Driver Version|CUDA Version' | sort -u
  return 0
}

step_build() {
  if [ -n "${NODAL_GPU_PREBUILT:-}" ]; then
    build_prebuilt
    return
  fi
  # Examples (fashion_mnist: Eigen and zlib) when their headers exist: its GPU test needs it.
  local examples=ON
  if [ ! -e /usr/include/zlib.h ] || [ ! -d /usr/include/eigen3 ]; then
    examples=OFF
    note "examples OFF: zlib.h or Eigen missing (fashion_mnist_gpu_test is not built)"
  fi
  probe configure 240 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNODAL_CUDA=ON \
    -DNODAL_NCCL=ON -DNODAL_BUILD_EXAMPLES="$examples" | tee "$tmp/configure.out"
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  note "$(grep -E '^-- nodal:' "$tmp/configure.out")"
  probe ninja 540 ninja -C "$build" -j"$(nproc)" || {
    grep -B2 -A10 -m5 'error' "$out/build.log" >&2
    return 1
  }
}

# NODAL_GPU_PREBUILT=DIR (scripts/gpu-pack.sh's output): unpacks DIR's build instead of building.
# The binaries hold the absolute paths of the checkout they were built in: where this checkout is
# elsewhere, a link at that path leads here.
build_prebuilt() {
  local source_dir
  source_dir=$(cat "$NODAL_GPU_PREBUILT/source-dir") || return 1
  if [ "$build" != build/gpu ]; then
    echo "NODAL_GPU_PREBUILT holds build/gpu: leave NODAL_GPU_BUILD unset"
    return 1
  fi
  if [ "$source_dir" != "$PWD" ] && [ ! -e "$source_dir" ]; then
    mkdir -p "$(dirname "$source_dir")" && ln -s "$PWD" "$source_dir" || return 1
    note "linked $source_dir -> $PWD (the prebuilt binaries' paths)"
  fi
  probe "unpack $NODAL_GPU_PREBUILT/build-gpu.tar.gz" 120 tar -xzf "$NODAL_GPU_PREBUILT/build-gpu.tar.gz" -C build || return 1
  local missing
  missing=$(for f in "$nodalrun" "$build"/tests/*_test "$build"/tests/*_program "$build"/bench/*; do
    [ -f "$f" ] && [ -x "$f" ] && ldd "$f" 2>/dev/null | grep 'not found' | grep -v -E 'libtorch|libc10|libmpi|libgloo'
  done | sort -u)
  if [ -n "$missing" ]; then
    echo "libraries not found (LD_LIBRARY_PATH=$LD_LIBRARY_PATH):"
    echo "$missing"
    return 1
  fi
  note "prebuilt: $NODAL_GPU_PREBUILT (built in $source_dir); every library found"
}

# The main job on the real data set where the prebuilt pack carries it (gpu-pack.sh's data/).
main_job() {
  local data="${NODAL_GPU_PREBUILT:-/nonexistent}/data" ok=0 device
  if [ ! -d "$data" ]; then
    note "fashion_mnist on Fashion-MNIST: no data set here (NODAL_GPU_PREBUILT's data/)"
    return 0
  fi
  for device in cuda cpu; do
    probe "fashion_mnist --device $device, 2 ranks on GPU 0" 90 "$nodalrun" -n 2 --gpus 0 --ranks-per-gpu 2 \
      "$build/examples/fashion_mnist/fashion_mnist" --device "$device" --data-dir "$data" || ok=1
  done
  return $ok
}

step_smoke() {
  local Q="$build/tests/gpu_queue_program" ok=0
  note "GPU memory used before: $(gpu_memory_used)MiB"
  probe "pool hand-off (VMM, fd broker, events)" 120 "$nodalrun" -n 2 "$Q" handoff 20 4099 pool || ok=1
  probe "legacy IPC, 1 KiB cudaMalloc" 120 "$nodalrun" -n 2 "$Q" handoff 20 1024 external || ok=1
  probe "legacy IPC, 2 MiB cudaMalloc" 120 "$nodalrun" -n 2 "$Q" handoff 20 2097152 external || ok=1
  probe "producer exits" 120 "$nodalrun" -n 2 "$Q" producer_exits 1048576 || ok=1
  probe "consumer dies" 120 "$nodalrun" -n 2 "$Q" consumer_dies 1048576 || ok=1
  probe "NCCL one rank" 120 env NODAL_GPU_BACKEND=nccl NCCL_DEBUG=WARN "$build/tests/nccl_program" ops || ok=1
  probe "CUDA IPC collectives, 2 ranks, short" 120 "$nodalrun" -n 2 --gpus 0 --ranks-per-gpu 2 --timeout 110 \
    "$build/tests/ipc_program" matrix dtypes=f32,bf16,i32 sizes=7,70001,1048581 || ok=1
  if [ -x "$build/tests/fashion_mnist_gpu_test" ]; then
    probe "fashion_mnist --device cuda" 180 env NODAL_REQUIRE_GPU=1 "$build/tests/fashion_mnist_gpu_test" || ok=1
  else
    note "fashion_mnist --device cuda: NOT BUILT (examples off)"
    ok=1
  fi
  sleep 1
  note "GPU memory used after: $(gpu_memory_used)MiB"
  return $ok
}

step_tests() {
  export NODAL_REQUIRE_GPU=1
  local ok=0
  gtest queue_gpu_test 240 "$build/tests/queue_gpu_test" || ok=1
  gtest nccl_gpu_test 180 "$build/tests/nccl_gpu_test" || ok=1
  gtest "ipc_collectives_test 2 ranks + fault drill" 300 "$build/tests/ipc_collectives_test" \
    --gtest_filter='Ranks/IpcMatrix.*/0:IpcFaults.*' || ok=1
  if [ -x "$build/tests/fashion_mnist_gpu_test" ]; then
    gtest fashion_mnist_gpu_test 180 "$build/tests/fashion_mnist_gpu_test" || ok=1
  else
    note "fashion_mnist_gpu_test: NOT BUILT (examples off)"
    ok=1
  fi
  probe "unit tests (ctest -L unit)" 180 ctest --test-dir "$build" -L unit -j8 --output-on-failure || ok=1
  return $ok
}

step_tests_more() {
  export NODAL_REQUIRE_GPU=1
  local ok=0
  gtest "ipc_collectives_test 4 ranks" 240 "$build/tests/ipc_collectives_test" --gtest_filter='Ranks/IpcMatrix.*/1' || ok=1
  gtest "ipc_collectives_test 8 ranks" 300 "$build/tests/ipc_collectives_test" --gtest_filter='Ranks/IpcMatrix.*/2' || ok=1
  gtest "ipc_collectives_test 2 ranks, full matrix" 300 env NODAL_IPC_MATRIX=full "$build/tests/ipc_collectives_test" \
    --gtest_filter='Ranks/IpcMatrix.EveryOpAndDtypeMatchesTheCpuPathBitwise/0' || ok=1
  return $ok
}

step_bench() {
  local ok=0 n
  echo "== hand-off latency (nodal, then torch.multiprocessing)"
  probe "gpu_handoff" 120 "$nodalrun" -n 2 --gpus 0 --ranks-per-gpu 2 "$build/bench/gpu_handoff" || ok=1
  probe "torch_handoff.py" 120 python3 bench/peers/torch_handoff.py || ok=1
  echo "== collectives on one GPU: CUDA IPC (2, 4, 8 ranks), then torch (gloo over host copies)"
  rm -f "$tmp/gpu.csv" "$tmp/gpu-mps.csv" "$tmp/nccl.csv"
  for n in 2 4 8; do
    probe "nodal-gpu-bench $n ranks" 150 "$nodalrun" -n "$n" --gpus 0 --ranks-per-gpu "$n" "$build/bench/nodal-gpu-bench" \
      --csv "$tmp/gpu.csv" || ok=1
  done
  # The same under nodalrun --mps (a job-private MPS daemon), where the machine has MPS: ranks
  # sharing a GPU then run kernels side by side instead of time-slicing it (2026-11-27, H200, a
  # daemon started by hand: 8 ranks at 4 KiB 2230 -> 99 us).
  if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    for n in 2 4 8; do
      probe "nodal-gpu-bench $n ranks, --mps" 150 "$nodalrun" -n "$n" --gpus 0 --ranks-per-gpu "$n" --mps \
        "$build/bench/nodal-gpu-bench" --csv "$tmp/gpu-mps.csv" || ok=1
    done
  else
    note "MPS: nvidia-cuda-mps-control not found, the MPS rows are not measured"
  fi
  probe "torch_gpu_bench.py" 150 python3 bench/peers/torch_gpu_bench.py --ranks 2,4,8 --sizes 4KiB,1MiB,64MiB --header \
    || ok=1
  echo "== NCCL, one rank: nodal's backend against torch.distributed's"
  probe "nodal-gpu-bench NCCL" 120 "$nodalrun" -n 1 --gpus 0 "$build/bench/nodal-gpu-bench" \
    --ops allreduce,allreduce-inplace,broadcast --csv "$tmp/nccl.csv" || ok=1
  probe "torch_nccl_bench.py" 120 python3 bench/peers/torch_nccl_bench.py --ranks 1 --max-bytes 64M --csv "$tmp/nccl.csv" \
    || ok=1
  main_job || ok=1
  for f in gpu gpu-mps nccl; do
    echo "== $f.csv"
    cat "$tmp/$f.csv" 2>/dev/null
  done
  return $ok
}

if [ "${1:-}" = --run-step ]; then
  STEP=$2
  case "$STEP" in
    env) step_env ;;
    build) step_build ;;
    smoke) step_smoke ;;
    tests) step_tests ;;
    tests-more) step_tests_more ;;
    bench) step_bench ;;
    *) echo "gpu-check: no step $STEP" >&2; exit 2 ;;
  esac
  exit $?
fi

# ---- The driver: steps in order, a summary ----

case "${1:-}" in
  -h | --help) usage; exit 0 ;;
esac
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=("${steps_all[@]}")
for s in "${steps[@]}"; do
  case " ${steps_all[*]} " in
    *" $s "*) ;;
    *) echo "gpu-check: unknown step '$s' (steps: ${steps_all[*]}; see --help)" >&2; exit 2 ;;
  esac
done

if ! why=$(preflight); then
  echo "gpu-check: $why"
  exit 3
fi

mkdir -p "$out" "$tmp"
if [ -n "${NODAL_GPU_PREBUILT:-}" ]; then
  NODAL_GPU_PREBUILT=$(cd "$NODAL_GPU_PREBUILT" && pwd)
  export NODAL_GPU_PREBUILT
  # The pack's libraries, then NCCL's and CUDA's of this machine (the pip wheel torch uses).
  nccl_wheel=$(python3 -c "import nvidia.nccl as n, os; print(os.path.join(list(n.__path__)[0], 'lib'))" 2>/dev/null)
  export LD_LIBRARY_PATH="$NODAL_GPU_PREBUILT/lib${nccl_wheel:+:$nccl_wheel}:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
summary="$out/summary.txt"
rows=()
failed=0
for s in "${steps[@]}"; do
  if [ $failed -ne 0 ]; then
    rows+=("$(printf '%-11s %-10s %6s  %s' "$s" "not run" "-" "an earlier step failed")")
    continue
  fi
  rm -f "$tmp/$s.note"
  limit=570
  [ "$s" = env ] && limit=60
  echo "== step $s (timeout ${limit}s, log $out/$s.log)"
  start=$SECONDS
  timeout -k 15 "$limit" bash "$0" --run-step "$s" > "$out/$s.log" 2>&1
  rc=$?
  took=$((SECONDS - start))
  pkill -9 -f "$PWD/$build/" 2>/dev/null
  pkill -9 -f "^$build/" 2>/dev/null  # nothing of this step outlives it
  case $rc in
    0) result=passed ;;
    124 | 137) result="TIMED OUT"; failed=1 ;;
    *) result=FAILED; failed=1 ;;
  esac
  rows+=("$(printf '%-11s %-10s %5ss  %s' "$s" "$result" "$took" "$out/$s.log")")
  if [ -f "$tmp/$s.note" ]; then
    while IFS= read -r line; do rows+=("                               $line"); done < "$tmp/$s.note"
  fi
  [ "$result" = passed ] || tail -15 "$out/$s.log"
done

{
  echo "gpu-check on $(hostname), $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  printf '%-11s %-10s %6s  %s\n' step result time "log / what ran"
  printf '%s\n' "${rows[@]}"
} | tee "$summary"
exit $failed
