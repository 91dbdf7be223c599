"""nodal_torch's arena allocator (integrations/torch/include/nodal/torch/arena_allocator.hpp).

Run under nodalrun (tests/integration/torch_backend_test.cpp):
    nodalrun -n N --shm-size 160M python3 arena_allocator.py
        install, tensors from min_bytes in the arena and freed back, an allreduce of them in place
        (nodal's in_place algorithm), one rank's tensor in the arena and another's not, an arena
        with no room left (torch's allocator takes over, the results stay right), a forked child
        that drops an arena tensor (its parent's block stays) and allocates its own (torch's
        memory), torch's raw allocations (mkldnn, conv2d), stop and resize_ after it. Prints
        "arena allocator ok: C checks".
    nodalrun -n N -x NODAL_TORCH_ARENA_MIN_BYTES=V python3 arena_allocator.py --env V
        init_process_group installs it from the variable: prints "env: installed I, min_bytes M"
        (and a new_group after stop_arena_allocator() leaves it stopped);
        a value that is not a byte count: "env refused: <RuntimeError's text>".
Any failed check raises, which fails the job.
"""
import argparse
import gc
import os
import tempfile

import torch
import torch.distributed as dist

import nodal_torch

parser = argparse.ArgumentParser()
parser.add_argument("--env")
args = parser.parse_args()

if args.env is not None:
    # A FileStore, not env://'s TCPStore, whose server lives in rank 0: with a refused value rank 0
    # can raise and exit before the other rank has connected, which then retries for
    # init_process_group's 30 minutes (as tests/programs/torch/wrong_rank.py found). The file is
    # the ranks' parent's (nodalrun's) alone.
    store = os.path.join(tempfile.gettempdir(), f"nodal-arena-env-{os.getppid()}")
    try:
        dist.init_process_group("nodal", init_method=f"file://{store}", rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    except RuntimeError as e:
        print(f"env refused: {e}", flush=True)
        raise SystemExit(0)
    s = nodal_torch.arena_allocator_stats()
    print(f"env: installed {s['installed']}, min_bytes {s['min_bytes']}", flush=True)
    big = torch.ones(s["min_bytes"] // 4)
    assert nodal_torch.arena_allocator_stats()["live_bytes"] == big.numel() * big.element_size()
    # A later group must not reinstall it: the variable is read for the default group only.
    nodal_torch.stop_arena_allocator()
    dist.new_group(list(range(dist.get_world_size())), backend="nodal")
    assert not nodal_torch.arena_allocator_stats()["installed"], "new_group reinstalled the arena allocator"
    dist.barrier()  # no rank leaves (and takes torch's store away) while another is still in init
    dist.destroy_process_group()
    raise SystemExit(0)

torch.set_num_threads(1)  # the forked child below runs torch ops: no OpenMP pool to inherit
dist.init_process_group("nodal")
RANK, N = dist.get_rank(), dist.get_world_size()
PG = dist.distributed_c10d._get_default_group()
MIN = 1 << 20
checks = 0


def check(ok, what):
    global checks
    if not ok:
        raise AssertionError(f"rank {RANK}: {what}")
    checks += 1


def stats():
    return nodal_torch.arena_allocator_stats()


def nbytes(t):
    return t.numel() * t.element_size()  # torch 1.13's Tensor has no nbytes


def expected_sum(shape):
    # Rank r contributes r + 1 + i % 7 at element i (exact in f32 at these sizes).
    base = torch.arange(shape, dtype=torch.float32).remainder(7)
    return base * N + N * (N + 1) / 2


check(not stats()["installed"], "installed before use_arena_allocator")
try:
    nodal_torch.use_arena_allocator(0)
    check(False, "min_bytes 0 accepted")
except RuntimeError as e:
    check("min_bytes must be at least 1" in str(e), f"min_bytes 0: {e}")

nodal_torch.use_arena_allocator(MIN)
s = stats()
check(s["installed"] and s["min_bytes"] == MIN and s["live_bytes"] == 0, f"after install: {s}")

# Below min_bytes: torch's memory. From min_bytes: the arena, and back when the tensor goes.
small = torch.empty(MIN // 4 - 1)
check(stats()["live_bytes"] == 0, "a tensor below min_bytes went to the arena")
elements = (3 << 20) // 4 + 5
x = torch.arange(elements, dtype=torch.float32).remainder(7) + (RANK + 1)
check(stats()["live_bytes"] == nbytes(x), f"a {nbytes(x)}-byte tensor: {stats()}")
check(x.data_ptr() % 64 == 0, "arena tensor not 64-byte aligned")

# An allreduce of arena tensors on every rank: in place in the arena.
dist.all_reduce(x)
check(PG.algorithm() == "in_place", f"allreduce of arena tensors took {PG.algorithm()}")
check(torch.equal(x, expected_sum(elements)), "allreduce of arena tensors: wrong sum")
del x
check(stats()["live_bytes"] == 0, f"freed tensor still counted: {stats()}")

# One rank's tensor in the arena, the others' in their own memory: right, and not in place.
if RANK == 1:
    nodal_torch.stop_arena_allocator()
    check(not stats()["installed"], "stop_arena_allocator left it installed")
y = torch.arange(elements, dtype=torch.float32).remainder(7) + (RANK + 1)
check((stats()["live_bytes"] == nbytes(y)) == (RANK != 1), f"rank {RANK}'s tensor: {stats()}")
dist.all_reduce(y)
check(PG.algorithm() != "in_place", f"a partly-arena allreduce took {PG.algorithm()}")
check(torch.equal(y, expected_sum(elements)), "partly-arena allreduce: wrong sum")
del y
if RANK == 1:
    nodal_torch.use_arena_allocator(MIN)

# Fill the arena (nodalrun --shm-size 160M, shared by every rank): later tensors come from
# torch's allocator, counted, and everything still computes and reduces right.
held = []
while stats()["fallbacks"] == 0:
    held.append(torch.full(((16 << 20) // 4,), float(RANK)))
    check(len(held) < 64, "the arena never ran out")
over = held[-1]
check(torch.equal(over, torch.full_like(over, float(RANK))), "a fallback tensor lost its values")
dist.barrier()  # every rank has filled its share: the arena has less than a block over the reserve
before = stats()
extra = torch.empty((16 << 20) // 4)
after = stats()
check(after["fallbacks"] == before["fallbacks"] + 1 and after["live_bytes"] == before["live_bytes"],
      f"a block past the reserve: {before} -> {after}")
z = torch.arange(elements, dtype=torch.float32).remainder(7) + (RANK + 1)
dist.all_reduce(z)
check(torch.equal(z, expected_sum(elements)), "allreduce once the arena is full: wrong sum")
# nodal itself still has room (the allocator's reserve): a new communicator and a call that stages
# in the arena (all_to_all_single with split sizes: the v-variants' scratch).
group = dist.new_group(list(range(N)), backend="nodal")
splits = [j + 1 for j in range(N)]
send = torch.full((sum(splits),), float(RANK))
recv = torch.empty(N * (RANK + 1))
dist.all_to_all_single(recv, send, output_split_sizes=[RANK + 1] * N, input_split_sizes=splits, group=group)
check(torch.equal(recv, torch.arange(N, dtype=torch.float32).repeat_interleave(RANK + 1)), "all_to_all_single once the arena is full")
del held, over, extra, z
dist.barrier()

# torch's raw allocations (mkldnn's buffers: raw_allocate / raw_deallocate) go through the same
# allocator, from the arena and from torch's.
dense = torch.randn(512, 1024, generator=torch.Generator().manual_seed(RANK))
for shape in [(512, 1024), (8, 16)]:
    d = dense[: shape[0], : shape[1]].contiguous()
    before = stats()["live_bytes"]
    m = d.to_mkldnn()
    check((stats()["live_bytes"] > before) == (d.numel() * 4 >= MIN), f"to_mkldnn of {shape}: {stats()}")
    check(torch.equal(m.to_dense(), d), f"to_mkldnn of {shape}")
    del m
image = torch.randn(1, 4, 256, 256)
kernel = torch.randn(8, 4, 3, 3)
out = torch.nn.functional.conv2d(image, kernel, padding=1)
check(out.shape == (1, 8, 256, 256) and torch.isfinite(out).all().item(), "conv2d")
del d, dense, image, kernel, out
check(stats()["live_bytes"] == 0, f"after the raw allocations: {stats()}")

# A forked child drops its copy of an arena tensor: the parent's block stays allocated (a
# child's free would hand it to the parent's next tensor).
keep = torch.full((MIN // 4,), 5.0)
pid = os.fork()
if pid == 0:
    del keep
    gc.collect()
    # Its own large tensors come from torch's allocator, not the job's arena.
    before = stats()["live_bytes"]
    mine = torch.ones(MIN)
    os._exit(0 if stats()["live_bytes"] == before and mine.sum().item() == MIN else 1)
check(os.waitpid(pid, 0)[1] == 0, "the forked child's tensor went to the arena (or the child failed)")
other = torch.full((MIN // 4,), 7.0)
check(keep.data_ptr() != other.data_ptr() and torch.all(keep == 5.0).item(), "a forked child freed its parent's block")
del keep, other

# After stop: new tensors are torch's again; tensors already in the arena stay valid, and an
# mkldnn buffer made before (raw_allocate) is freed after it through torch's raw_deallocate.
w = torch.full((MIN // 4,), 2.0)
check(stats()["live_bytes"] == nbytes(w), "a tensor after the fallbacks was not in the arena")
mk = torch.ones(MIN // 4).to_mkldnn()
check(stats()["live_bytes"] > nbytes(w), f"an mkldnn buffer before stop: {stats()}")
nodal_torch.stop_arena_allocator()
del mk
check(stats()["live_bytes"] == nbytes(w), f"an mkldnn buffer freed after stop: {stats()}")
v = torch.empty(MIN // 4)
check(stats()["live_bytes"] == nbytes(w) and not stats()["installed"], f"after stop: {stats()}")
check(w.sum().item() == 2.0 * (MIN // 4), "an arena tensor after stop")
w.resize_(4 * MIN)  # its storage's allocator is the arena allocator, now stopped: torch's memory
check(stats()["live_bytes"] == 0, f"resize_ after stop went to the arena: {stats()}")
del w, v
check(stats()["live_bytes"] == 0, f"after stop, freed: {stats()}")

print(f"arena allocator ok: {checks} checks", flush=True)
dist.destroy_process_group()
