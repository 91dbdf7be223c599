#!/usr/bin/env bash
# nodal's collectives side by side with Open MPI, MPICH and Gloo, in one run on this machine.
#
#   bench/compare.sh [-r ROUNDS] [-b BUILD_DIR] [-l LIBS] [-o OPS] [-n "RANKS ..."] [-t TIMING]
#                    [-s MIN_BYTES] [-m MAX_BYTES] [-- EXTRA BENCH OPTIONS]
#
#   -r  rounds (default 5); the tables show the median over rounds
#   -b  an existing build directory (default: build/release, configured and built with the preset)
#   -l  libs, comma list of nodal, nodal-arena, openmpi, mpich, gloo (default: all five)
#   -o  ops, comma list (default: all eight, allreduce,broadcast,allgather,reduce_scatter,alltoall,
#       reduce,gather,scatter); -n ranks (default "2 4")
#   -t  back_to_back (default) or barrier: the timing loop (bench/collective_bench.hpp)
#   -s, -m  per-rank message sizes, powers of two from -s (default 4) to -m (default 64M)
#
# Every library is measured by the same program logic, bench/collective_bench.hpp: nodal-bench
# (built by CMake) and bench/peers/{mpi,gloo}_bench.cpp (built here with mpicxx.openmpi,
# mpicxx.mpich and g++ into BUILD_DIR/bench/peers/). "nodal" has private buffers like the peers;
# "nodal-arena" allocates them in the job's arena (Tensor::empty_shared), where peers read them in
# place.
#
# The runs are interleaved: each round goes over ranks, then ops, then every lib once, in an order
# that rotates from one (round, op) to the next. This VM's host moves the two vCPUs between "near"
# and "far" placements (a cache-line exchange costs ~50 ns or ~200 ns) for seconds to minutes, so a
# block of runs per lib would compare placements, not libraries; medians over rounds then take out
# what placement is left. Ranks are bound to cores while they fit (nodalrun's default, mpirun
# --bind-to core, hydra -bind-to core) and not bound when they outnumber the cores. Round 1 also
# checks every result (--check).
#
# Writes into BUILD_DIR/bench/: collectives.csv (medians, nodal-bench's columns), collectives.md
# (tables per op and ranks, the targets, the machine), collectives.png (algbw against size),
# collectives.raw.csv (every row, with its round), collectives.placement.csv (the core-to-core
# latency before and after each run) and collectives.log (the programs' output).
# Needs the Debian packages of scripts/setup-debian.sh (openmpi-bin libopenmpi-dev mpich
# libmpich-dev libgloo-dev gnuplot-nox python3).
set -euo pipefail

command_line="bench/compare.sh$(printf ' %q' "$@")"
rounds=5
build=""
libs=nodal,nodal-arena,openmpi,mpich,gloo
ops=allreduce,broadcast,allgather,reduce_scatter,alltoall,reduce,gather,scatter
ranks="2 4"
timing=back_to_back
min_bytes=4
max_bytes=64M
usage() {
  sed -n '3,14p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while getopts "r:b:l:o:n:t:s:m:h" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    b) build=$OPTARG ;;
    l) libs=$OPTARG ;;
    o) ops=$OPTARG ;;
    n) ranks=$OPTARG ;;
    t) timing=$OPTARG ;;
    s) min_bytes=$OPTARG ;;
    m) max_bytes=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
extra=("$@")
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage
[[ $timing == back_to_back || $timing == barrier ]] || usage
IFS=, read -r -a lib_list <<<"$libs"
IFS=, read -r -a op_list <<<"$ops"
read -r -a rank_list <<<"$ranks"
for lib in "${lib_list[@]}"; do
  case $lib in nodal | nodal-arena | openmpi | mpich | gloo) ;; *) echo "$0: unknown lib '$lib'" >&2 && usage ;; esac
done
for n in "${rank_list[@]}"; do [[ $n =~ ^[1-9][0-9]*$ ]] || usage; done

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
wants() { [[ ",$libs," == *",$1,"* ]]; }

# ---- Build: nodal with CMake, the peers with their compilers. ----
if [[ -z $build ]]; then
  build=build/release
  [[ -f $build/CMakeCache.txt ]] || cmake --preset release >/dev/null
  cmake --build --preset release --target nodalrun bench_nodal_bench bench_core_latency
else
  [[ -f $build/CMakeCache.txt ]] || { echo "$0: $build is not a CMake build directory" >&2; exit 1; }
  cmake --build "$build" --target nodalrun bench_nodal_bench bench_core_latency
fi
build=$(realpath "$build")
nodalrun=$build/launcher/nodalrun
nodal_bench=$build/bench/nodal-bench
core_latency=$build/bench/core-latency
peers=$build/bench/peers
out=$build/bench
mkdir -p "$peers"

need() {
  command -v "$1" >/dev/null || { echo "$0: $1 not found: run scripts/setup-debian.sh (Debian: $2)" >&2; exit 1; }
}
need python3 python3
need gnuplot gnuplot-nox
wants openmpi && need mpicxx.openmpi libopenmpi-dev && need mpirun.openmpi openmpi-bin
wants mpich && need mpicxx.mpich libmpich-dev && need mpiexec.mpich mpich

# build_peer OUTPUT COMPILER SOURCE [FLAGS...]: compiles when the binary is older than its sources.
# -O2 -g -DNDEBUG is the release preset's optimisation, so that the harness code is alike.
build_peer() {
  local output=$1 compiler=$2 source=$3
  shift 3
  if [[ ! -x $output || $source -nt $output || bench/collective_bench.hpp -nt $output ]]; then
    echo "compare: building $output" >&2
    "$compiler" -std=c++20 -O2 -g -DNDEBUG -Wall -Wextra -I bench "$source" -o "$output" "$@"
  fi
}
wants openmpi && build_peer "$peers/mpi_bench_openmpi" mpicxx.openmpi bench/peers/mpi_bench.cpp
wants mpich && build_peer "$peers/mpi_bench_mpich" mpicxx.mpich bench/peers/mpi_bench.cpp
wants gloo && build_peer "$peers/gloo_bench" g++ bench/peers/gloo_bench.cpp -lgloo -pthread

# ---- Run. ----
raw=$out/collectives.raw.csv
log=$out/collectives.log
meta=$out/collectives.meta
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "round,lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps" >"$raw"
: >"$log"

# Open MPI refuses root unless told twice. odls_base_num_threads 0: see bench/startup.sh.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
started=$(date -Is)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
bytes_of() { python3 -c 'import sys; s=sys.argv[1]; u={"K":1<<10,"M":1<<20,"G":1<<30}; s=s.rstrip("B").rstrip("i"); print(int(s[:-1])*u[s[-1]] if s[-1] in u else int(s))' "$1"; }
max_bytes_n=$(bytes_of "$max_bytes")

# The placement of the two vCPUs (see above), read before and after every run: "near" when both
# readings of bench/core-latency are under 0.1 us. One line per run in $placement; the report's
# header counts the near runs of each lib.
placement=$out/collectives.placement.csv
echo "round,lib,op,ranks,before_us,after_us" >"$placement"
# A failed or stuck reading is "nan" (counted as not near), never the end of the benchmark.
core_to_core() { timeout -k 1 10 "$core_latency" --quiet --round-trips 100000 2>/dev/null || echo nan; }

# run_one ROUND LIB RANKS OP: one program run; appends its rows, with the round, to $raw.
failures=0
run_one() {
  local round=$1 lib=$2 n=$3 op=$4 csv=$work/rows.csv
  local args=(--op "$op" --min-bytes "$min_bytes" --max-bytes "$max_bytes" --timing "$timing" --no-header
    --csv "$csv")
  ((round == 1)) && args+=(--check)
  args+=("${extra[@]}")
  local fits=1
  ((n > cores)) && fits=0
  # The arena holds every rank's buffers (at most 2 * n * max-bytes each, alltoall) and the slots.
  local shm=$((n * 2 * n * max_bytes_n + (512 << 20)))
  local cmd
  case $lib in
    nodal) cmd=("$nodalrun" -n "$n" --shm-size "$shm" -- "$nodal_bench" --buffers private "${args[@]}") ;;
    nodal-arena) cmd=("$nodalrun" -n "$n" --shm-size "$shm" -- "$nodal_bench" --buffers arena "${args[@]}") ;;
    openmpi)
      local bind=(--bind-to core)
      ((fits)) || bind=(--oversubscribe --bind-to none)
      cmd=(mpirun.openmpi --mca odls_base_num_threads 0 "${bind[@]}" -n "$n" "$peers/mpi_bench_openmpi" "${args[@]}")
      ;;
    mpich)
      local bind=(-bind-to core)
      ((fits)) || bind=(-bind-to none)
      cmd=(mpiexec.mpich "${bind[@]}" -n "$n" "$peers/mpi_bench_mpich" "${args[@]}")
      ;;
    gloo) cmd=("$nodalrun" -n "$n" -- "$peers/gloo_bench" "${args[@]}") ;;
  esac
  rm -f "$csv"
  echo "== round $round, $lib, $n ranks, $op: ${cmd[*]}" >>"$log"
  local start=$SECONDS before
  before=$(core_to_core)
  if ! timeout -k 10 600 "${cmd[@]}" >>"$log" 2>&1; then
    echo "compare: $lib failed (round $round, $n ranks, $op); see $log" >&2
    failures=$((failures + 1))
  fi
  echo "$round,$lib,$op,$n,$before,$(core_to_core)" >>"$placement"
  echo "== took $((SECONDS - start)) s" >>"$log"
  [[ -f $csv ]] && sed "s/^/$round,/" "$csv" >>"$raw"
  return 0
}

nlibs=${#lib_list[@]}
turn=0
for ((round = 1; round <= rounds; round++)); do
  for n in "${rank_list[@]}"; do
    for op in "${op_list[@]}"; do
      order=()
      for ((i = 0; i < nlibs; i++)); do order+=("${lib_list[$(((i + turn) % nlibs))]}"); done
      turn=$((turn + 1))
      echo "compare: round $round/$rounds, $n ranks, $op: ${order[*]}" >&2
      for lib in "${order[@]}"; do run_one "$round" "$lib" "$n" "$op"; done
    done
  done
done

# ---- Report. ----
version_of() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo "?"; }
{
  echo "started: $started"
  echo "finished: $(date -Is)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $cores cores"
  echo "load average (1, 5, 15 min) before: $load_before"
  echo "load average (1, 5, 15 min) after: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "kernel: $(uname -r)"
  echo "nodal: $(git -C "$repo" describe --always --dirty 2>/dev/null || echo '?')"
  echo "Open MPI: $(version_of openmpi-bin); MPICH: $(version_of mpich); Gloo: $(version_of libgloo-dev)"
  echo "rounds: $rounds; timing: $timing; sizes: $min_bytes..$max_bytes per rank; ranks: $ranks"
  echo "command: $command_line"
  echo "failed runs: $failures"
  echo "placement: runs in the near placement (bench/core-latency under 0.1 us before and after; see $(basename "$placement")): $(
    python3 -c 'import csv, sys, collections
near, runs = collections.Counter(), collections.Counter()
for r in csv.DictReader(open(sys.argv[1])):
    runs[r["lib"]] += 1
    try:
        readings = [float(r["before_us"]), float(r["after_us"])]
    except ValueError:
        continue
    near[r["lib"]] += all(x < 0.1 for x in readings)  # a nan reading is not under 0.1
print(", ".join(f"{lib} {near[lib]} of {runs[lib]}" for lib in runs))' "$placement")"
} >"$meta"
python3 bench/compare_report.py --raw "$raw" --meta "$meta" --out "$out/collectives"
gnuplot "$out/collectives.gp"
echo "compare: wrote $out/collectives.md, collectives.csv, collectives.png (raw rows: $raw)" >&2
cat "$out/collectives.md"
((failures == 0))
