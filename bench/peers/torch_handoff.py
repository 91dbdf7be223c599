#!/usr/bin/env python3
"""CUDA tensor hand-off latency with torch.multiprocessing, the peer of bench/gpu_handoff.cpp.

    python3 bench/peers/torch_handoff.py [--repeats N]

Two processes (spawn) ping-pong CUDA tensors over two torch.multiprocessing queues: the producer
sends its tensor, the consumer answers with one of its own of the same size (torch refuses to send
on a CUDA tensor received from another process: "Consider cloning before sending"); one-way
latency = round trip / 2, median of N round trips after a warm-up, for 1 KiB to 256 MiB. Prints
the same CSV as gpu_handoff (lib,what,bytes,usec). torch shares CUDA tensors through
cudaIpcGetMemHandle of the caching allocator's block plus a reference-count file per block, and
each receiver opens the handle (cudaIpcOpenMemHandle, cached per process while the storage lives).
Without torch or a GPU it prints one "skip" line and exits 0.
"""
import argparse
import statistics
import sys
import time

SIZES = [1024, 1 << 20, 64 << 20, 256 << 20]
WARMUP = 10


TIMEOUT_S = 60  # a peer that died or failed to send: an error, not a hang


def consumer(ping, pong, repeats):
    import torch

    torch.cuda.set_device(0)
    for size in SIZES:
        own = torch.empty(size, dtype=torch.uint8, device="cuda")
        for _ in range(WARMUP + repeats):
            t = ping.get(timeout=TIMEOUT_S)
            pong.put(own)
            del t
        del own
    # The producer may still be opening our last tensor: exit only once it says it is done.
    ping.get(timeout=TIMEOUT_S)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"skip: torch_handoff needs torch: {e}")
        return 0
    if not torch.cuda.is_available():
        print("skip: torch_handoff needs a GPU: torch.cuda.is_available() is False")
        return 0
    ctx = mp.get_context("spawn")
    ping, pong = ctx.Queue(), ctx.Queue()
    peer = ctx.Process(target=consumer, args=(ping, pong, args.repeats))
    peer.start()
    torch.cuda.set_device(0)
    print("lib,what,bytes,usec")
    for size in SIZES:
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        trips = []
        for _ in range(WARMUP + args.repeats):
            start = time.perf_counter()
            ping.put(t)
            back = pong.get(timeout=TIMEOUT_S)
            trips.append((time.perf_counter() - start) * 1e6)
            del back
        trips = trips[WARMUP:]
        print(f"torch,mp_queue_one_way,{size},{statistics.median(trips) / 2:.2f}", flush=True)
        del t
    ping.put(None)  # done: the consumer may free its tensors and exit
    peer.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
