"""A torch default group that is not nodal's world: rank order swapped by the caller.

Run as `nodalrun -n 2 python3 wrong_rank.py`: init_process_group("nodal") with rank 1 - RANK must
raise a RuntimeError that says which ranks differ; prints "refused: <message>" and exits 0.
"""
import os
import tempfile

import torch.distributed as dist

import nodal_torch  # noqa: F401

rank = int(os.environ["RANK"])
# A FileStore, not env://'s TCPStore: the TCPStore's server lives in torch's rank 0, which is
# refused and exits, at times before the other rank has connected; that rank then retries for
# init_process_group's 30-minute timeout. The file is the ranks' parent's (nodalrun's) alone.
store = os.path.join(tempfile.gettempdir(), f"nodal-wrong-rank-{os.getppid()}")
try:
    dist.init_process_group("nodal", init_method=f"file://{store}", rank=1 - rank, world_size=2)
except RuntimeError as e:
    print(f"refused: {e}", flush=True)
else:
    print("accepted a default group that is not nodal's world", flush=True)
