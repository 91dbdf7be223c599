"""DDP training of a small MLP (with a BatchNorm buffer) under the nodal backend and under gloo.

Run under nodalrun (tests/integration/torch_backend_test.cpp):
    nodalrun -n N python3 ddp.py [--steps S]
        trains the same model on the same batches twice, DistributedDataParallel over gloo then
        over nodal, and compares the parameters: "ddp: S steps, max difference D, identical B".
    nodalrun -n N python3 ddp.py [--steps S] --arena-min-bytes B
        the same with nodal_torch.use_arena_allocator(B) installed first (B small enough for DDP's
        bucket to be in the arena): also prints "bucket allreduce: <nodal's algorithm>"
    nodalrun -n N python3 ddp.py --steps S --kill-rank R --kill-step K
        trains over nodal only; rank R SIGKILLs itself at step K. The others ignore nodalrun's
        SIGTERM so that they can show what torch raised: "rank r caught RuntimeError after T ms: ..."
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import nodal_torch  # registers the "nodal" backend

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--kill-rank", type=int, default=-1)
parser.add_argument("--kill-step", type=int, default=-1)
parser.add_argument("--arena-min-bytes", type=int, default=0)
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("nodal")
if args.arena_min_bytes:
    nodal_torch.use_arena_allocator(args.arena_min_bytes)
RANK, N = dist.get_rank(), dist.get_world_size()


def make_model():
    torch.manual_seed(1234 + RANK)  # different on every rank: DDP's construction broadcasts rank 0's
    return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def train(group, on_step=None):
    model = make_model()
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(args.steps):
        if on_step:
            on_step(step)
        x, y = batch(step)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [t.detach().clone() for t in list(model.parameters()) + list(model.buffers())]


if args.kill_rank >= 0:
    signal.signal(signal.SIGTERM, lambda *_: None)
    start = [0.0]

    def maybe_die(step):
        if step == args.kill_step:
            start[0] = time.monotonic()
            if RANK == args.kill_rank:
                print(f"rank {RANK} kills itself at step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    try:
        train(None, maybe_die)
    except RuntimeError as e:
        ms = (time.monotonic() - start[0]) * 1000
        print(f"rank {RANK} caught RuntimeError after {ms:.0f} ms: {e}", flush=True)
        sys.exit(1)
    print(f"rank {RANK} finished without noticing", flush=True)
    sys.exit(0)

gloo = dist.new_group(backend="gloo")
with_gloo = train(gloo)
with_nodal = train(None)
if args.arena_min_bytes:
    # The last call of the last step was the gradient bucket's allreduce.
    print(f"bucket allreduce: {dist.distributed_c10d._get_default_group().algorithm()}", flush=True)
diff = max((a.double() - b.double()).abs().max().item() for a, b in zip(with_gloo, with_nodal))
identical = all(torch.equal(a, b) for a, b in zip(with_gloo, with_nodal))
# Every rank ends with the same parameters (BatchNorm's running statistics, the buffers, are each
# rank's own after its last forward: DDP broadcasts them before each forward).
parameters = len(list(make_model().parameters()))
fingerprint = torch.cat([t.double().reshape(-1) for t in with_nodal[:parameters]])
everyone = [torch.empty_like(fingerprint) for _ in range(N)]
dist.all_gather(everyone, fingerprint)
agree = all(torch.equal(everyone[0], f) for f in everyone)
print(f"ddp: {args.steps} steps, max difference {diff:.3g}, identical {identical}, ranks agree {agree}", flush=True)
dist.destroy_process_group()
