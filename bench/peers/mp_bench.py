#!/usr/bin/python3
"""The peer of bench/multiprocessing_bench.cpp: the same figures with Python's multiprocessing and
torch.multiprocessing (Debian's python3 and python3-torch), same output format:
name,median_us,min_us,max_us,rounds."""
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

ROUNDS = 15


def report(name, us):
    us = sorted(us)
    print(f"{name},{statistics.median(us):.3f},{us[0]:.3f},{us[-1]:.3f},{len(us)}", flush=True)


def echo(conn):
    try:
        while True:
            conn.send(conn.recv())
    except EOFError:
        pass


def empty():
    pass


def process_start_join(method, rounds, per_round):
    context = mp.get_context(method)
    us = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(per_round):
            p = context.Process(target=empty)
            p.start()
            p.join()
        us.append((time.perf_counter() - start) / per_round * 1e6)
    return us


def identity(x):
    return x


def new_mebibyte_empty(_):
    return torch.empty(1 << 20, dtype=torch.uint8)


def new_mebibyte_zeros(_):
    return torch.zeros(1 << 20, dtype=torch.uint8)


def timed(rounds, fn):
    us = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        us.append((time.perf_counter() - start) * 1e6)
    return us


def pool_figures():
    with mp.get_context("fork").Pool(2) as pool:
        tasks = list(range(10000))
        pool.map(identity, tasks, chunksize=1)  # warm-up
        report("python_pool_map_per_task_10k_chunksize1",
               [us / len(tasks) for us in timed(5, lambda: pool.map(identity, tasks, chunksize=1))])
        thousand = list(range(1000))
        for name, fn in (("empty", new_mebibyte_empty), ("zeros", new_mebibyte_zeros)):
            pool.map(fn, thousand)  # warm-up
            report(f"torch_pool_map_1000_tasks_new_1MiB_tensor_{name}", timed(5, lambda: pool.map(fn, thousand)))


def round_trips(conn, message, per_round):
    us = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(per_round):
            conn.send(message)
            conn.recv()
        us.append((time.perf_counter() - start) / per_round * 1e6)
    return us


def main():
    report("python_process_start_join_fork", process_start_join("fork", ROUNDS, 20))
    # A fresh interpreter imports torch per child (and forkserver's server once): 5 rounds of 1.
    report("python_process_start_join_forkserver", process_start_join("forkserver", 5, 1))
    fork = mp.get_context("fork")
    parent, child = fork.Pipe()
    p = fork.Process(target=echo, args=(child,))
    p.start()
    child.close()
    report("python_pipe_round_trip_8B", round_trips(parent, b"x" * 8, 2000))
    big = torch.empty(64 << 20, dtype=torch.uint8).share_memory_()
    report("torch_pipe_round_trip_shared_64MiB_tensor", round_trips(parent, big, 200))
    # The forked child holds a copy of `parent` too, so it never sees EOF: stop it.
    p.terminate()
    p.join()
    pool_figures()
    return 0


if __name__ == "__main__":
    sys.exit(main())
