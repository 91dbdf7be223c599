#!/usr/bin/env python3
"""torch.distributed's best for ranks sharing one GPU, as nodal-gpu-bench's peer.

NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected"), so what a
torch user does is copy the cuda tensor to the host, allreduce it with gloo, and copy it back: this
script times exactly that (D2H copy, gloo all_reduce / broadcast, H2D copy, synchronize) for 2, 4
and 8 ranks on cuda:0, started with torch.multiprocessing.spawn, and prints the rows of
bench/gpu_bench.cpp (lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps,hbm_fraction; usec = the median
call of the slowest rank; hbm_fraction with nodal-gpu-bench's traffic model, so that the columns
compare).

On the GPU machine, after nodal-gpu-bench (see bench/gpu_bench.cpp):
    python3 bench/peers/torch_gpu_bench.py --ranks 2,4,8 --sizes 4KiB,1MiB,64MiB >> gpu.csv
"""
import argparse
import os
import re
import socket
import statistics
import sys
import time

UNITS = {"": 1, "b": 1, "kib": 1 << 10, "kb": 1000, "mib": 1 << 20, "mb": 1000**2, "gib": 1 << 30, "gb": 1000**3,
         "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_bytes(text):
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(m.group(1)) * UNITS[m.group(2).lower()]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_calls(call, seconds, min_iters, max_iters, warmup, agree):
    """As bench/gpu_bench.cpp: warm-up, min_iters timed calls, then as many as fill `seconds`, the
    count agreed by every rank (agree: the largest), so that all ranks make the same calls."""
    for _ in range(warmup):
        call()
    usec = []

    def timed():
        t0 = time.perf_counter()
        call()
        usec.append((time.perf_counter() - t0) * 1e6)

    first = max(1, min(min_iters, max_iters))
    for _ in range(first):
        timed()
    per_call = max(1e-3, statistics.median(usec))
    total = agree(int(min(max(seconds * 1e6 / per_call, first), max_iters)))
    while len(usec) < total:
        timed()
    return usec


def worker(rank, world_size, port, args):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    torch.cuda.set_device(0)
    n = world_size
    for size_text in args.sizes.split(","):
        nbytes = parse_bytes(size_text)
        count = nbytes // 4
        gpu = torch.zeros(count, dtype=torch.float32, device="cuda:0")
        host = torch.empty(count, dtype=torch.float32, pin_memory=True)
        for op in args.ops.split(","):
            if op == "allreduce":
                def call():
                    host.copy_(gpu, non_blocking=True)
                    torch.cuda.synchronize()
                    dist.all_reduce(host)
                    gpu.copy_(host, non_blocking=True)
                    torch.cuda.synchronize()
                factor, traffic = 2.0 * (n - 1) / n, (3.0 * n - 1) * nbytes
            elif op == "broadcast":
                def call():
                    if rank == 0:
                        host.copy_(gpu, non_blocking=True)
                        torch.cuda.synchronize()
                    dist.broadcast(host, 0)
                    if rank != 0:
                        gpu.copy_(host, non_blocking=True)
                    torch.cuda.synchronize()
                factor, traffic = 1.0, 2.0 * (n - 1) * nbytes
            else:
                raise SystemExit(f"unknown op {op}")
            def agree(k):
                t = torch.tensor([k], dtype=torch.int64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                return int(t.item())

            usec = time_calls(call, args.seconds, args.min_iters, args.max_iters, args.warmup, agree)
            slowest = torch.tensor([statistics.median(usec)], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if rank == 0:
                t = slowest.item()
                algbw = nbytes / (t * 1e-6) / 1e9
                print(f"torch-gloo-cpu-copy,{op},{n},{nbytes},{t:.3f},{algbw:.6g},{algbw * factor:.6g},"
                      f"{traffic / (t * 1e-6) / 3e12:.4f}", flush=True)
        dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4,8")
    parser.add_argument("--sizes", default="4KiB,1MiB,64MiB")
    parser.add_argument("--ops", default="allreduce,broadcast")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--min-iters", type=int, default=20)
    parser.add_argument("--max-iters", type=int, default=10000)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--header", action="store_true", help="print the CSV header first")
    args = parser.parse_args()

    import torch.multiprocessing as mp

    if args.header:
        print("lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps,hbm_fraction", flush=True)
    for n in (int(x) for x in args.ranks.split(",")):
        mp.spawn(worker, args=(n, free_port(), args), nprocs=n, join=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.exit(main())
