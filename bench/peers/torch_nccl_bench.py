#!/usr/bin/env python3
"""torch.distributed's NCCL allreduce, in nodal-bench's CSV, for the "NCCL allreduce overhead
against torch.distributed's NCCL in the same run" measurement (bench/collective_bench.hpp has
the columns and the iteration policy; this script follows them for allreduce):

    lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps

Run it as the GPU nodal-bench is run, one rank per GPU, side by side in one session:

    python3 bench/peers/torch_nccl_bench.py                 # 1 rank and, with N > 1 GPUs, N ranks
    python3 bench/peers/torch_nccl_bench.py --ranks 1 --max-bytes 64M --csv out.csv
    torchrun --nproc-per-node 4 bench/peers/torch_nccl_bench.py --launched   # under a launcher

f32 sum. torch.distributed's all_reduce is in place only, so every call reduces one buffer in
place (NCCL itself runs the same kernel in and out of place; compare with nodal-bench --in-place
for the strictest pairing). Timing: back to back, `iters` calls between two CUDA-synchronised
clock reads per rank, usec the max over ranks of the time per call (collective_bench.hpp's
back_to_back). Warm-up: batches of 1, 2, 4, ... calls until one lasts a quarter of --target-ms,
then iters = --target-ms worth, clamped to [--min-iters, --max-iters]. Needs torch with CUDA.
"""
import argparse
import os
import sys
import time


def parse_bytes(text):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip()
    if t.endswith("B"):
        t = t[:-1]
    if t.endswith("i"):
        t = t[:-1]
    digits = t.rstrip("KMGk")
    unit = t[len(digits):].upper()
    if not digits.isdigit() or unit not in units:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (say 4, 64K, 64M or 1G)")
    return int(digits) * units[unit]


def busbw_factor(n):
    return 2 * (n - 1) / n if n > 0 else 1.0


def format_row(lib, ranks, nbytes, usec):
    algbw = nbytes / (usec * 1e3) if usec > 0 else 0.0
    busbw = algbw * busbw_factor(ranks)
    return f"{lib},allreduce,{ranks},{nbytes},{usec:.3f},{algbw:.6g},{busbw:.6g}\n"


def worker(rank, world, args, port):
    import torch
    import torch.distributed as dist

    if not args.launched:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        os.environ["RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(world)
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    try:  # device_id (torch >= 2.3) binds the NCCL communicator to the GPU eagerly
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    except TypeError:
        dist.init_process_group("nccl", rank=rank, world_size=world)

    def max_over_ranks(x):
        t = torch.tensor([x], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    sizes = []
    b = args.min_bytes
    while b <= args.max_bytes:
        if b % 4 == 0:
            sizes.append(b)
        b *= 2
    buf = torch.empty(args.max_bytes // 4, dtype=torch.float32, device=device)
    out = None
    if rank == 0:
        out = open(args.csv, "a") if args.csv else sys.stdout
        if not args.no_header and (not args.csv or out.tell() == 0):
            out.write("lib,op,ranks,bytes,usec,algbw_GBps,busbw_GBps\n")
            out.flush()

    def loop(view, calls):
        dist.barrier(device_ids=[local])
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(view)
        torch.cuda.synchronize(device)
        return time.perf_counter() - start

    for nbytes in sizes:
        view = buf[: nbytes // 4]
        view.fill_(float(rank % 251))
        # Warm-up that also sizes iters (the better of the last two batches, max over ranks).
        warm_s = args.target_ms * 1e-3 / 4
        previous = 0.0
        per_call = 0.0
        batch = 1
        while True:
            slowest = max_over_ranks(loop(view, batch))
            this_batch = slowest / batch
            per_call = min(previous, this_batch) if previous > 0 else this_batch
            if previous > 0 and (slowest >= warm_s or batch >= args.max_iters):
                break
            previous = this_batch
            batch *= 2
        wanted = args.target_ms * 1e-3 / per_call if per_call > 0 else args.max_iters
        iters = args.iters or max(args.min_iters, min(args.max_iters, int(wanted + 0.999999)))
        seconds = loop(view, iters)
        usec = max_over_ranks(seconds / iters) * 1e6
        if args.check:
            view.fill_(float(rank % 251))
            dist.all_reduce(view)
            want = float(sum(r % 251 for r in range(world)))
            if not bool(torch.all(view == want)):
                raise RuntimeError(f"check failed: allreduce of {nbytes} bytes on rank {rank}")
        if rank == 0:
            out.write(format_row(args.lib, world, nbytes, usec))
            out.flush()
    if rank == 0 and args.csv:
        out.close()
    dist.barrier(device_ids=[local])
    dist.destroy_process_group()


def spawn(world, args):
    import socket
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world, args, port), nprocs=world, join=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, action="append",
                   help="world sizes to run (repeatable; default 1 and, with N > 1 GPUs, N)")
    p.add_argument("--min-bytes", type=parse_bytes, default=4)
    p.add_argument("--max-bytes", type=parse_bytes, default=64 << 20)
    p.add_argument("--iters", type=int, default=0, help="timed calls per size (default: --target-ms worth)")
    p.add_argument("--target-ms", type=float, default=40.0)
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=100000)
    p.add_argument("--lib", default="torch-nccl", help="the CSV's lib column")
    p.add_argument("--csv", default="", help="rank 0 appends the rows to FILE instead of printing them")
    p.add_argument("--no-header", action="store_true")
    p.add_argument("--check", action="store_true", help="verify one extra call per size")
    p.add_argument("--launched", action="store_true",
                   help="already started by torchrun/nodalrun (RANK, WORLD_SIZE, MASTER_* set): run this rank only")
    args = p.parse_args()
    if args.min_bytes <= 0 or args.min_bytes > args.max_bytes:
        p.error("need 0 < --min-bytes <= --max-bytes")

    import torch
    if not torch.cuda.is_available():
        print("torch_nccl_bench: no CUDA device visible to torch", file=sys.stderr)
        return 2
    if args.launched:
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, int(os.environ.get("MASTER_PORT", 29500)))
        return 0
    gpus = torch.cuda.device_count()
    worlds = args.ranks or ([1, gpus] if gpus > 1 else [1])
    for world in worlds:
        if world > gpus:
            print(f"torch_nccl_bench: skipping {world} ranks: NCCL needs one GPU per rank, {gpus} visible",
                  file=sys.stderr)
            continue
        spawn(world, args)
        args.no_header = True  # one header per output
    return 0


if __name__ == "__main__":
    sys.exit(main())
