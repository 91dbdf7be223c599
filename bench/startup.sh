#!/usr/bin/env bash
# Start-up time of nodalrun next to mpiexec.hydra (MPICH) and mpirun.openmpi, and nodalrun's
# failure detection latency, all in one run.
#
#   bench/startup.sh [-r REPS] [-b BUILD_DIR] [-o OUT.md]
#
# Start-up: for N in 2 8 32 and PROGRAM in /bin/true, init_exit (calls nodal::init() and exits),
# each launcher starts N ranks of PROGRAM, REPS times. The runs are interleaved -- every
# repetition goes once round all (N, PROGRAM, launcher), the launchers in a rotating order --
# because this VM's speed drifts over minutes and a block of runs per launcher would measure
# the drift. Each run is timed by startup_timer (spawn to exit, CLOCK_MONOTONIC); the floor it
# adds is reported as "startup_timer -- /bin/true".
#
# MPI programs: tests/programs/mpi_program.c's hello (MPI_Init, an allreduce, a bcast, a ring of
# sends, MPI_Finalize), built here with mpicc.mpich and mpicc.openmpi, for N in 2 8: the MPICH
# build under nodalrun (its PMI-1 server) and mpiexec.hydra, the Open MPI build under nodalrun
# (its PMIx server) and mpirun.openmpi, interleaved the same way.
#
# Failure latency: `nodalrun -n N --grace 1 failure_latency DIR` for N in 2 8, REPS times. Rank 0
# exits 3 after 200 ms; the latency is, from the ranks, max over siblings of (SIGTERM received -
# rank 0's last clock read), and, from nodalrun, its --report's failure.others_signalled_after_ms.
#
# Writes OUT.md (default build/bench/startup.md; also printed), OUT.tsv (every run) and OUT.log
# (the launchers' output). Needs mpiexec.hydra (Debian: mpich), mpirun.openmpi (openmpi-bin), jq,
# mpicc.mpich (libmpich-dev) and mpicc.openmpi (libopenmpi-dev).
set -euo pipefail

reps=30
build=build/release
out=build/bench/startup.md
usage() { echo "usage: $0 [-r REPS] [-b BUILD_DIR (default $build)] [-o OUT.md (default $out)]" >&2; exit 2; }
while getopts "r:b:o:h" opt; do
  case $opt in
    r) reps=$OPTARG ;;
    b) build=$OPTARG ;;
    o) out=$OPTARG ;;
    *) usage ;;
  esac
done
[[ $reps =~ ^[1-9][0-9]*$ ]] || usage

nodalrun=$(realpath "$build/launcher/nodalrun")
timer=$(realpath "$build/bench/startup_timer")
init_exit=$(realpath "$build/bench/init_exit")
failure_latency=$(realpath "$build/bench/failure_latency")
for exe in "$nodalrun" "$timer" "$init_exit" "$failure_latency"; do
  [[ -x $exe ]] || { echo "$0: $exe is missing: cmake --build $build" >&2; exit 1; }
done
for tool in mpiexec.hydra mpirun.openmpi jq mpicc.mpich mpicc.openmpi; do
  command -v "$tool" >/dev/null ||
    { echo "$0: $tool not found (Debian: apt-get install mpich openmpi-bin jq libmpich-dev libopenmpi-dev)" >&2; exit 1; }
done

mkdir -p "$(dirname "$out")"
raw=${out%.md}.tsv
log=${out%.md}.log
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: >"$raw"
: >"$log"

# Open MPI refuses root unless told twice. odls_base_num_threads 0: from 32 ranks up (its
# odls_base_cutoff) Open MPI 4.1.4 launches through helper threads, and then mpirun hangs here
# after all ranks exited; without threads it is what it is below 32 ranks.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
launchers=(nodalrun hydra openmpi)
declare -A program_path=([true]=/bin/true [init_exit]=$init_exit)
mpi_source=$(dirname "$0")/../tests/programs/mpi_program.c
mpicc.mpich -O2 -pthread -o "$work/mpich_hello" "$mpi_source"
mpicc.openmpi -O2 -pthread -o "$work/ompi_hello" "$mpi_source"
# MPI program -> the MPI launcher it is compared with
declare -A mpi_peer=([mpich_hello]=hydra [ompi_hello]=openmpi)
mpi_programs=(mpich_hello ompi_hello)
mpi_sizes=(2 8)

# launcher_argv LAUNCHER N: sets argv to the command line that starts N ranks (program not included).
launcher_argv() {
  case $1 in
    nodalrun) argv=("$nodalrun" -n "$2") ;;
    hydra) argv=(mpiexec.hydra -n "$2") ;;
    openmpi) argv=(mpirun.openmpi --oversubscribe --allow-run-as-root --mca odls_base_num_threads 0 -n "$2") ;;
  esac
}

# timed KEY EXPECTED_CODE COMMAND...: runs COMMAND under startup_timer and appends
# "KEY ns exit_code leftovers" to $raw; says on stderr when the exit code or leftovers are wrong.
# Returns 1 for such a bad run.
timed() {
  local key=$1 expected=$2 result ns code leftovers
  shift 2
  echo "== $key: $*" >>"$log"
  result=$("$timer" --timeout 60 -- "$@" 2>>"$log") || { echo "$0: startup_timer failed on: $*" >&2; exit 1; }
  read -r ns code leftovers <<<"$result"
  echo "$key $ns $code $leftovers" >>"$raw"
  if [[ $code != "$expected" || $leftovers != 0 ]]; then
    echo "$0: bad run: $* -> exit code $code (expected $expected), $leftovers leftover process(es); see $log" >&2
    return 1
  fi
}

# stats: reads "KEY VALUE" lines, prints "KEY n median p10 p90 max" per KEY (quantiles
# interpolated between order statistics).
stats() {
  sort -k1,1 -k2,2g | awk '
    function q(p,  h, i) { h = (n - 1) * p; i = int(h); return v[i] + (h - i) * (v[i + 1] - v[i]) }
    function flush() { if (n) printf "%s %d %.3f %.3f %.3f %.3f\n", key, n, q(0.5), q(0.1), q(0.9), v[n - 1] }
    $1 != key { flush(); key = $1; n = 0 }
    { v[n++] = $2 }
    END { flush() }'
}

# load_stats: reads stats lines into the global maps n_, med_, p10_, p90_, max_ (by KEY).
declare -A n_ med_ p10_ p90_ max_
load_stats() {
  local key n med p10 p90 max
  while read -r key n med p10 p90 max; do
    n_[$key]=$n med_[$key]=$med p10_[$key]=$p10 p90_[$key]=$p90 max_[$key]=$max
  done
}

# ---- start-up ----
sizes=(2 8 32)
programs=(true init_exit)
start_s=$SECONDS
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((rep = 0; rep < reps; rep++)); do
  printf '\rstart-up: repetition %d/%d' $((rep + 1)) "$reps" >&2
  timed "floor/1/true" 0 /bin/true || true
  for n in "${sizes[@]}"; do
    for program in "${programs[@]}"; do
      for ((i = 0; i < ${#launchers[@]}; i++)); do
        launcher=${launchers[(i + rep) % ${#launchers[@]}]}
        launcher_argv "$launcher" "$n"
        timed "$launcher/$n/$program" 0 "${argv[@]}" "${program_path[$program]}" || true
      done
    done
  done
  for n in "${mpi_sizes[@]}"; do
    for program in "${mpi_programs[@]}"; do
      pair=(nodalrun "${mpi_peer[$program]}")
      for ((i = 0; i < 2; i++)); do
        launcher=${pair[(i + rep) % 2]}
        launcher_argv "$launcher" "$n"
        timed "$launcher/$n/$program" 0 "${argv[@]}" "$work/$program" hello || true
      done
    done
  done
done
echo >&2

# ---- failure latency ----
failure_sizes=(2 8)
: >"$work/latency"
: >"$work/unstamped"
for ((rep = 0; rep < reps; rep++)); do
  printf '\rfailure latency: repetition %d/%d' $((rep + 1)) "$reps" >&2
  for n in "${failure_sizes[@]}"; do
    dir="$work/fail.$rep.$n"
    mkdir "$dir"
    timed "fail/$n" 3 "$nodalrun" -n "$n" --grace 1 --report "$dir/report.json" "$failure_latency" "$dir" || continue
    stamps=("$dir"/term.*.ns)
    if [[ ! -e ${stamps[0]} || ${#stamps[@]} != $((n - 1)) || ! -s $dir/fail.ns ]]; then
      echo "$0: bad run: nodalrun -n $n failure_latency: ${#stamps[@]} of $((n - 1)) siblings stamped SIGTERM" >&2
      echo "fail/$n" >>"$work/unstamped"
      continue
    fi
    # in ms, like the report's figure
    awk -v key="ranks/$n" -v fail="$(cat "$dir/fail.ns")" '$1 > last { last = $1 } END { print key, (last - fail) / 1e6 }' \
        "${stamps[@]}" >>"$work/latency"
    echo "report/$n $(jq -r '.failure.others_signalled_after_ms' "$dir/report.json")" >>"$work/latency"
  done
done
echo >&2
elapsed_s=$((SECONDS - start_s))
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- report ----
# Good runs only (expected exit code, nothing left running, every sibling stamped); the bad ones
# are counted in the tables.
load_stats < <(awk '$1 !~ /^fail/ && $3 == 0 && $4 == 0 { print $1, $2 / 1e6 }' "$raw" | stats; stats <"$work/latency")
declare -A bad_
while read -r count key; do bad_[$key]=$count; done < <(
  { awk '$3 != ($1 ~ /^fail/ ? 3 : 0) || $4 != 0 { print $1 }' "$raw"; cat "$work/unstamped"; } | sort | uniq -c)

cell() {  # cell KEY: "median (p10-p90)" in ms, and the bad runs if any
  local key=$1 text=n/a
  [[ -n ${med_[$key]:-} ]] && text=$(printf '%.1f (%.1f-%.1f)' "${med_[$key]}" "${p10_[$key]}" "${p90_[$key]}")
  [[ -n ${bad_[$key]:-} ]] && text+=" **${bad_[$key]} bad**"
  echo "$text"
}

{
  echo "# nodalrun start-up and failure detection, side by side"
  echo
  echo "\`$0 -r $reps -b $build -o $out\` on $(hostname), $(nproc) cores, $(uname -r), $(date -u '+%Y-%m-%d %H:%M UTC'), took $elapsed_s s;"
  echo "load average $load_before before, $load_after after (other work on the machine widens p10-p90)."
  echo "$("$nodalrun" --version); $(mpiexec.hydra --version | awk '/Version:/ { print "MPICH hydra " $2; exit }');" \
       "$(mpirun.openmpi --version | head -1)."
  echo
  echo "## Start-up: ms from spawn to exit of the launcher, median (p10-p90) of $reps runs"
  echo
  echo "| program | N | nodalrun | mpiexec.hydra | mpirun.openmpi | nodalrun / hydra |"
  echo "|---|---:|---:|---:|---:|---:|"
  for program in "${programs[@]}"; do
    for n in "${sizes[@]}"; do
      ratio=$(awk -v a="${med_[nodalrun/$n/$program]:-0}" -v b="${med_[hydra/$n/$program]:-0}" \
                  'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
      echo "| ${program_path[$program]##*/} | $n | $(cell "nodalrun/$n/$program") | $(cell "hydra/$n/$program") |" \
           "$(cell "openmpi/$n/$program") | $ratio |"
    done
  done
  echo
  echo "Floor: \`startup_timer -- /bin/true\` (one process, no launcher) $(cell floor/1/true) ms."
  echo "Target: nodalrun / hydra <= 0.50 for 2 x /bin/true. Under the MPI launchers init_exit runs as a"
  echo "nodal singleton. mpirun.openmpi runs with --oversubscribe --mca odls_base_num_threads 0."
  echo
  echo "## MPI programs: ms from spawn to exit of the launcher, median (p10-p90) of $reps runs"
  echo
  echo "hello: MPI_Init, MPI_Allreduce, MPI_Bcast, a ring of MPI_Send/MPI_Recv, MPI_Finalize; nodalrun serves"
  echo "MPICH's wire-up with PMI-1 and Open MPI's with PMIx (\`--mpi auto\`, the default)."
  echo
  echo "| program | N | nodalrun | its MPI launcher | nodalrun / that launcher |"
  echo "|---|---:|---:|---:|---:|"
  for program in "${mpi_programs[@]}"; do
    peer=${mpi_peer[$program]}
    for n in "${mpi_sizes[@]}"; do
      ratio=$(awk -v a="${med_[nodalrun/$n/$program]:-0}" -v b="${med_[$peer/$n/$program]:-0}" \
                  'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
      name=mpiexec.hydra
      [[ $peer == openmpi ]] && name=mpirun.openmpi
      echo "| $program | $n | $(cell "nodalrun/$n/$program") | $name $(cell "$peer/$n/$program") | $ratio |"
    done
  done
  echo
  echo "## Failure detection: rank 0 exits 3, ms until the other ranks are told (nodalrun --grace 1)"
  echo
  echo "| N | good runs | ranks see SIGTERM after: median / p90 / max | report's others_signalled_after_ms: median / p90 / max |"
  echo "|---:|---:|---:|---:|"
  for n in "${failure_sizes[@]}"; do
    echo "| $n | ${n_[ranks/$n]:-0} of $reps${bad_[fail/$n]:+ (**${bad_[fail/$n]} bad**)} |" \
         "${med_[ranks/$n]:-n/a} / ${p90_[ranks/$n]:-n/a} / ${max_[ranks/$n]:-n/a} |" \
         "${med_[report/$n]:-n/a} / ${p90_[report/$n]:-n/a} / ${max_[report/$n]:-n/a} |"
  done
  echo
  echo "Ranks' figure: max over siblings of (CLOCK_MONOTONIC at SIGTERM in sigwaitinfo - rank 0's clock"
  echo "just before _exit). Target: under 5 ms. Every run: $raw; launchers' output: $log."
} >"$out"
cat "$out"
