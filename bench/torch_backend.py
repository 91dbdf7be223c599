"""torch.distributed from Python with the nodal backend or gloo (one rank program; the driver is
bench/torch_backend.sh, which runs both backends in one run, interleaved).

    nodalrun -n 2 python3 bench/torch_backend.py allreduce --backend nodal|gloo
        rank 0 prints "allreduce,<bytes>,<us per call>" for 4 B .. 64 MiB of float32
        (median of 5 timed batches; each batch is enough calls for ~0.2 s)
    nodalrun -n 2 python3 bench/torch_backend.py ddp --backend nodal|gloo
        DistributedDataParallel step time of a ~9.5M-parameter MLP (batch 32, SGD), rank 0 prints
        "ddp_step,<ms median of 20>", "local_step,<ms>" (the same step without DDP, the compute)
        and "free_step,<ms>" (DDP with a comm hook that returns each bucket unreduced: the step of
        any backend whose allreduce took no time)
Both set one torch thread per rank (2 ranks on a 2-core machine). --arena-allocator (nodal only):
nodal_torch.use_arena_allocator() right after init_process_group, so that tensors from 1 MiB (the
model's weights and gradients, DDP's buckets, the all_reduce tensors) live in nodal's arena.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["allreduce", "ddp"])
parser.add_argument("--backend", choices=["nodal", "gloo"], required=True)
parser.add_argument("--batch", type=int, default=32, help="ddp: samples per rank per step")
parser.add_argument("--bucket-cap-mb", type=float, default=25, help="ddp: DDP's bucket_cap_mb (its default: 25)")
parser.add_argument("--bucket-view", action="store_true",
                    help="ddp: DDP's gradient_as_bucket_view=True (gradients live in the buckets: no copies in and out)")
parser.add_argument("--arena-allocator", action="store_true",
                    help="nodal: torch's CPU tensors from 1 MiB in nodal's arena (nodal_torch.use_arena_allocator)")
args = parser.parse_args()
if args.backend == "nodal":
    import nodal_torch
elif args.arena_allocator:
    parser.error("--arena-allocator is for --backend nodal")

torch.set_num_threads(1)
dist.init_process_group(args.backend)
if args.arena_allocator:
    nodal_torch.use_arena_allocator()
RANK = dist.get_rank()


def timed(fn, calls):
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


if args.mode == "allreduce":
    for size in [4, 64, 1024, 16 << 10, 256 << 10, 4 << 20, 64 << 20]:
        t = torch.ones(size // 4, dtype=torch.float32)
        one = timed(lambda: dist.all_reduce(t), 3)
        calls = max(3, min(20000, int(0.2 / max(one, 1e-7))))
        # Every rank must make the same number of calls: rank 0's count for all.
        n = torch.tensor([calls])
        dist.broadcast(n, 0)
        runs = [timed(lambda: dist.all_reduce(t), int(n.item())) for _ in range(5)]
        if RANK == 0:
            print(f"allreduce,{size},{statistics.median(runs) * 1e6:.3f}", flush=True)
else:
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                             nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))

    def steps(net, count):
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        times = []
        g = torch.Generator().manual_seed(RANK)
        for _ in range(count):
            x, y = torch.randn(args.batch, 1024, generator=g), torch.randint(0, 10, (args.batch,), generator=g)
            start = time.perf_counter()
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - start)
        return statistics.median(times[5:]) * 1e3

    def unreduced(state, bucket):
        done = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    local = steps(model(), 25)
    dist.barrier()
    def ddp_of(net):
        return nn.parallel.DistributedDataParallel(net, bucket_cap_mb=args.bucket_cap_mb,
                                                   gradient_as_bucket_view=args.bucket_view)

    free = ddp_of(model())
    free.register_comm_hook(None, unreduced)
    free = steps(free, 25)
    dist.barrier()
    ddp = steps(ddp_of(model()), 25)
    if RANK == 0:
        params = sum(p.numel() for p in model().parameters())
        print(f"ddp_step,{ddp:.2f}", flush=True)
        print(f"local_step,{local:.2f}", flush=True)
        print(f"free_step,{free:.2f}", flush=True)
        print(f"parameters,{params}", flush=True)
dist.destroy_process_group()
