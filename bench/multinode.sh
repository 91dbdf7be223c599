#!/usr/bin/env bash
# nodal's allreduce across nodes beside Open MPI's, in one run, over a cluster of network
# namespaces on this machine (tests/support/netns-cluster.sh: real TCP between the "nodes").
#
#   bench/multinode.sh [-r ROUNDS] [-b BUILD_DIR] [-p "RANKS_PER_NODE ..."] [-s MIN] [-m MAX] [-o OP] [-g]
#
#   -r  rounds (default 5), interleaved; the table shows medians over rounds
#   -b  a built build directory (default build/release)
#   -p  ranks per node (default "1 2"); the cluster has 2 nodes
#   -s, -m  per-rank message sizes, powers of two from -s (default 4) to -m (default 64M)
#   -o  the collective (default allreduce; any op of nodal-bench that runs across nodes)
#   -g  also nodal-gathered: nodal with NODAL_NODE_FOLD_MIN_BYTES=off (reductions in the gathered shape, the
#       one before the folded shape: nodal/detail/node_bridge.hpp)
#
# Libraries, each started once per node by Open MPI's mpirun over the same namespaces:
#   nodal        mpirun -n 2 nodalrun -n P nodal-bench       (one agent per node, P ranks each)
#   openmpi      mpirun -n 2P mpi_bench_openmpi              (P ranks per node; btl tcp,vader,self)
#   openmpi-han  the same with --mca coll_han_priority 100   (Open MPI's hierarchical collectives)
#   nodal-gathered (-g) as nodal, with -x NODAL_NODE_FOLD_MIN_BYTES=off
# Where a node's processes outnumber the machine's cores, Open MPI runs with mpi_yield_when_idle
# (what mpirun --oversubscribe sets): its busy polling otherwise takes milliseconds per call here.
# Needs root (namespaces), Open MPI (openmpi-bin, libopenmpi-dev) and nodalrun's MPI engine.
# Writes BUILD_DIR/bench/multinode.{raw.csv,md,log}.
set -euo pipefail

command_line="bench/multinode.sh$(printf ' %q' "$@")"
rounds=5
build=build/release
per_node="1 2"
min_bytes=4
max_bytes=64M
op=allreduce
gathered=0
usage() {
  sed -n '3,14p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while getopts "r:b:p:s:m:o:gh" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    b) build=$OPTARG ;;
    p) per_node=$OPTARG ;;
    s) min_bytes=$OPTARG ;;
    m) max_bytes=$OPTARG ;;
    o) op=$OPTARG ;;
    g) gathered=1 ;;
    *) usage ;;
  esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
build=$(realpath "$build")
nodalrun=$build/launcher/nodalrun
nodal_bench=$build/bench/nodal-bench
mpi_bench=$build/bench/peers/mpi_bench_openmpi
cluster=tests/support/netns-cluster.sh
out=$build/bench
mkdir -p "$out" "$build/bench/peers"
[[ -x $nodalrun && -x $nodal_bench ]] || { echo "$0: build $build first (nodalrun, bench_nodal_bench)" >&2; exit 1; }
[[ -f $build/launcher/libnodal_internode_mpi.so ]] || { echo "$0: $build has no MPI engine (libopenmpi-dev)" >&2; exit 1; }
if [[ ! -x $mpi_bench || bench/peers/mpi_bench.cpp -nt $mpi_bench ]]; then
  mpicxx.openmpi -std=c++20 -O2 -g -DNDEBUG -I bench bench/peers/mpi_bench.cpp -o "$mpi_bench"
fi
bash "$cluster" available || { echo "$0: network namespaces are not available (needs root)" >&2; exit 3; }
trap 'bash "$cluster" down >/dev/null' EXIT
bash "$cluster" up 2 >&2
read -r -a cluster_args <<<"$(bash "$cluster" mpirun-args 2)"
# mpirun-args gives one slot per node and the tcp,self BTLs: the peers get P slots and shared memory.
hosts=$(sed -n 's/^\([0-9.]*\).*/\1/p' /tmp/nodal-netns/nodes | paste -sd,)
base=()
for ((i = 0; i < ${#cluster_args[@]}; i++)); do
  case ${cluster_args[i]} in
    --host) i=$((i + 1)) ;;
    btl) base=("${base[@]:0:${#base[@]}-1}"); i=$((i + 1)) ;;
    *) base+=("${cluster_args[i]}") ;;
  esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
raw=$out/multinode.raw.csv
log=$out/multinode.log
echo "round,lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps" >"$raw"
: >"$log"
work=$(mktemp -d)
trap 'bash "$cluster" down >/dev/null; rm -rf "$work"' EXIT
started=$(date -Is)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

run_one() {  # ROUND LIB P
  local round=$1 lib=$2 p=$3 csv=$work/rows.csv hostlist cmd
  hostlist="${hosts//,/:$p,}:$p"
  local args=(--op "$op" --min-bytes "$min_bytes" --max-bytes "$max_bytes" --no-header --csv "$csv")
  ((round == 1)) && args+=(--check)
  local yield=()
  ((2 * p + 2 > cores)) && yield=(--mca mpi_yield_when_idle 1)
  case $lib in
    nodal) cmd=(mpirun.openmpi "${base[@]}" --mca btl tcp,self --host "${hosts//,/:1,}:1" -n 2 "$nodalrun" -n "$p" "$nodal_bench" "${args[@]}") ;;
    nodal-gathered) cmd=(mpirun.openmpi "${base[@]}" --mca btl tcp,self -x NODAL_NODE_FOLD_MIN_BYTES=off --host "${hosts//,/:1,}:1" -n 2 "$nodalrun" -n "$p" "$nodal_bench" "${args[@]}") ;;
    openmpi) cmd=(mpirun.openmpi "${base[@]}" --mca btl tcp,vader,self "${yield[@]}" --host "$hostlist" -n $((2 * p)) "$mpi_bench" "${args[@]}") ;;
    openmpi-han) cmd=(mpirun.openmpi "${base[@]}" --mca btl tcp,vader,self "${yield[@]}" --mca coll_han_priority 100 --host "$hostlist" -n $((2 * p)) "$mpi_bench" "${args[@]}") ;;
  esac
  rm -f "$csv"
  echo "== round $round, $lib, 2 nodes x $p: ${cmd[*]}" >>"$log"
  if ! timeout -k 10 900 "${cmd[@]}" >>"$log" 2>&1; then
    echo "multinode: $lib failed (round $round, 2 x $p); see $log" >&2
  fi
  # The lib column says which one ran (openmpi-han prints "openmpi").
  [[ -f $csv ]] && awk -F, -v OFS=, -v r="$round" -v l="$lib" '{ $1 = l; print r, $0 }' "$csv" >>"$raw"
  return 0
}

libs=(nodal openmpi openmpi-han)
((gathered)) && libs+=(nodal-gathered)
turn=0
for ((round = 1; round <= rounds; round++)); do
  for p in $per_node; do
    for ((i = 0; i < ${#libs[@]}; i++)); do
      lib=${libs[$(((i + turn) % ${#libs[@]}))]}
      echo "multinode: round $round/$rounds, 2 nodes x $p, $lib" >&2
      run_one "$round" "$lib" "$p"
    done
    turn=$((turn + 1))
  done
done

ompi_version=$(dpkg-query -W -f='${Version}' openmpi-bin 2>/dev/null || echo '?')
python3 - "$raw" "$out/multinode.md" <<EOF
import csv, statistics, sys
from collections import defaultdict
rows = defaultdict(list)
for r in csv.DictReader(open(sys.argv[1])):
    rows[(r["lib"], int(r["ranks"]), int(r["bytes"]))].append(float(r["usec"]))
med = {k: statistics.median(v) for k, v in rows.items()}
def size(b):
    for unit, s in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << s: return f"{b >> s} {unit}"
    return f"{b} B"
lines = ["# $op across 2 nodes (network namespaces, TCP), nodal vs Open MPI", "",
         "- started: $started; load before: $load_before; after: $(cut -d' ' -f1-3 /proc/loadavg)",
         "- cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $cores cores; kernel $(uname -r)",
         "- nodal: $(git describe --always --dirty); Open MPI: $ompi_version",
         "- command: $command_line; $rounds rounds, interleaved; medians of the time per call (us)",
         "- ratio: Open MPI's time / nodal's (> 1: nodal is faster); GB/s: algbw = bytes per rank / time", ""]
gathered = any(k[0] == "nodal-gathered" for k in med)
for ranks in sorted({k[1] for k in med}):
    head = "| bytes | nodal us | Open MPI us | Open MPI han us | nodal GB/s | Open MPI GB/s | han GB/s | vs Open MPI | vs han |"
    if gathered: head += " nodal-gathered us | gathered / nodal |"
    lines += [f"## 2 nodes x {ranks // 2} ranks ({ranks} ranks)", "", head, "|---" * head.count(" | ") + "|---|"]
    for b in sorted({k[2] for k in med if k[1] == ranks}):
        t = {lib: med.get((lib, ranks, b)) for lib in ("nodal", "openmpi", "openmpi-han", "nodal-gathered")}
        cell = lambda x: f"{x:.1f}" if x else "-"
        gbs = lambda x: f"{b / x / 1e3:.3f}" if x else "-"
        ratio = lambda x: f"{x / t['nodal']:.2f}x" if x and t["nodal"] else "-"
        row = (f"| {size(b)} | {cell(t['nodal'])} | {cell(t['openmpi'])} | {cell(t['openmpi-han'])} | "
               f"{gbs(t['nodal'])} | {gbs(t['openmpi'])} | {gbs(t['openmpi-han'])} | {ratio(t['openmpi'])} | {ratio(t['openmpi-han'])} |")
        if gathered: row += f" {cell(t['nodal-gathered'])} | {ratio(t['nodal-gathered'])} |"
        lines.append(row)
    lines.append("")
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
EOF
echo "multinode: wrote $out/multinode.md (raw rows: $raw, log: $log)" >&2
cat "$out/multinode.md"
