#!/usr/bin/python3
"""The peer of bench/dataloader_bench.cpp: torch.utils.data.DataLoader (Debian's python3-torch) on
the same synthetic data set: f32 samples of 4 KiB, 64 KiB, 1 MiB and 4 MiB whose every element the
worker writes, batch 32, 2 workers, persistent workers, prefetch 2; the loop takes each batch and
drops it. Same output: name,median,min,max,rounds."""
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

EPOCHS = 7
CASES = [("4KiB", 4 << 10, 400), ("64KiB", 64 << 10, 100), ("1MiB", 1 << 20, 20), ("4MiB", 4 << 20, 8)]


class Synthetic(Dataset):
    def __init__(self, numel, count):
        self.numel = numel
        self.count = count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        return torch.full((self.numel,), float(index), dtype=torch.float32)


def report(name, values):
    values = sorted(values)
    print(f"torch_{name},{statistics.median(values):.3f},{values[0]:.3f},{values[-1]:.3f},{len(values)}", flush=True)


def main():
    for name, nbytes, batches in CASES:
        start = time.perf_counter()
        loader = DataLoader(Synthetic(nbytes // 4, 32 * batches), batch_size=32, num_workers=2,
                            persistent_workers=True, prefetch_factor=2)
        it = iter(loader)
        next(it)
        first_ms = (time.perf_counter() - start) * 1e3
        for _ in it:  # the first epoch: workers warm up
            pass
        per_second, gbps = [], []
        for _ in range(EPOCHS):
            t0 = time.perf_counter()
            count = 0
            for batch in loader:
                assert batch.shape[0] == 32
                count += 1
            seconds = time.perf_counter() - t0
            per_second.append(count / seconds)
            gbps.append(count * 32 * nbytes / seconds / 1e9)
        report(f"first_batch_ms_{name}", [first_ms])
        report(f"batches_per_s_{name}", per_second)
        report(f"GBps_{name}", gbps)
        del it, loader
    return 0


if __name__ == "__main__":
    sys.exit(main())
