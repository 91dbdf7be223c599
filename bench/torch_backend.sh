#!/usr/bin/env bash
# torch.distributed from Python with the nodal backend beside gloo, in one run: all_reduce of
# float32 from 4 B to 64 MiB, and the DistributedDataParallel step of a ~9.5M-parameter MLP,
# 2 ranks under nodalrun, the backends interleaved for R rounds; prints the medians and ratios as
# a markdown table (bench/torch_backend.py is the rank program). Three columns: nodal, nodal with
# its arena allocator (nodal_torch.use_arena_allocator: tensors from 1 MiB in the arena, DDP's
# buckets among them) and gloo.
#   bench/torch_backend.sh [-r ROUNDS] [-b BATCH] [-v] [BUILD_DIR]   (defaults: 3, 32, build/release)
# -v: DDP with gradient_as_bucket_view=True for both backends (gradients live in the buckets).
# torch's matrix products run on the machine's BLAS: Debian's generic one makes the step's compute
# 20x slower than OpenBLAS (apt-get install libopenblas0-pthread); the table says which it was.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 batch=32 view=()
while getopts "r:b:v" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    b) batch=$OPTARG ;;
    v) view=(--bucket-view) ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
build=${1:-build/release}
. bench/peers/python_torch.sh
ensure_python_torch torch_backend.sh
[ -e "$build/integrations/torch" ] || { echo "torch_backend.sh: $build has no integrations/torch (configure where Torch and pybind11 are found)" >&2; exit 1; }
export PYTHONPATH="$build/integrations/torch" OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((round = 1; round <= rounds; round++)); do
  for backend in nodal nodal-arena gloo; do
    flags=(--backend "${backend%-arena}")
    [ "$backend" = nodal-arena ] && flags+=(--arena-allocator)
    for mode in allreduce ddp; do
      "$build/launcher/nodalrun" -n 2 /usr/bin/python3 bench/torch_backend.py "$mode" "${flags[@]}" --batch "$batch" "${view[@]}" |
        sed -n "s/^\[0\] /$backend,/p" >>"$out"
    done
  done
done
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)
/usr/bin/python3 - "$out" "$rounds" "$batch" "$blas" "${#view[@]}" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    parts = line.strip().split(",")
    rows[tuple(parts[:-1])].append(float(parts[-1]))
med = {k: statistics.median(v) for k, v in rows.items()}
print(f"2 ranks, {sys.argv[2]} rounds interleaved, medians; BLAS: {sys.argv[4]}\n")
names = ["nodal", "nodal-arena", "gloo"]
print("| all_reduce f32 | nodal | nodal, arena allocator | gloo | gloo / nodal | gloo / nodal (arena allocator) |")
print("|---|---|---|---|---|---|")
sizes = sorted({int(k[2]) for k in med if k[1] == "allreduce"})
def gbs(s, t):
    return f" ({s / t / 1e3:.2f} GB/s)" if s >= 1 << 20 else ""
for s in sizes:
    n, a, g = (med[(b, "allreduce", str(s))] for b in names)
    label = f"{s} B" if s < 1024 else f"{s >> 10} KiB" if s < 1 << 20 else f"{s >> 20} MiB"
    print(f"| {label} | {n:.2f} us{gbs(s, n)} | {a:.2f} us{gbs(s, a)} | {g:.2f} us{gbs(s, g)} | {g / n:.1f}x | {g / a:.1f}x |")
params = int(med[("nodal", "parameters")])
view = ", gradient_as_bucket_view" if sys.argv[5] == "1" else ""
print(f"\n| DDP step, {params / 1e6:.2f}M parameters, batch {sys.argv[3]} per rank{view} | nodal | nodal, arena allocator | gloo |")
print("|---|---|---|---|")
step = {b: med[(b, "ddp_step")] for b in names}
local = {b: med[(b, "local_step")] for b in names}
free = {b: med[(b, "free_step")] for b in names}
g = step["gloo"]
print("| step (ms) | " + " | ".join(f"{step[b]:.1f}" for b in names) + " |")
print("| gloo's step / this step | " + " | ".join(f"{g / step[b]:.2f}x" for b in names) + " |")
print("| the same step without DDP (ms) | " + " | ".join(f"{local[b]:.1f}" for b in names) + " |")
print("| DDP's share of the step | " + " | ".join(f"{(step[b] - local[b]) / step[b] * 100:.0f} %" for b in names) + " |")
print("| DDP with a free allreduce (a hook that does not reduce; ms) | " + " | ".join(f"{free[b]:.1f}" for b in names) + " |")
print("| the allreduce's share of the step | " + " | ".join(f"{(step[b] - free[b]) / step[b] * 100:.0f} %" for b in names) + " |")
print(f"| the best ratio any backend could reach: gloo's step / a free allreduce's | {g / free['nodal']:.2f}x | {g / free['nodal-arena']:.2f}x | |")
PY
