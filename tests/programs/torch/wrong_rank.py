"""A torch default group that is not nodal's world: rank order swapped by the caller.

Run as `nodalrun -n 2 python3 wrong_rank.py`: init_process_group("nodal") with rank 1 - RANK must
raise a RuntimeError that says which ranks differ; prints "refused: <message>" and exits 0.
"""
import os

import torch.distributed as dist

import nodal_torch  # noqa: F401

rank = int(os.environ["RANK"])
try:
    dist.init_process_group("nodal", rank=1 - rank, world_size=2)
except RuntimeError as e:
    print(f"refused: {e}", flush=True)
else:
    print("accepted a default group that is not nodal's world", flush=True)
