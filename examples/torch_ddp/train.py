"""Fashion-MNIST with torch's DistributedDataParallel over the nodal backend, on CPU.

    PYTHONPATH=build/release/integrations/torch \
        build/release/launcher/nodalrun -n 2 /usr/bin/python3 examples/torch_ddp/train.py [--backend gloo]

An ordinary DDP script: the only nodal-specific lines are `import nodal_torch` and the backend's
name in init_process_group ("gloo" runs the same script on torch's own CPU backend, for
comparison). nodalrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, so torch's env://
rendezvous needs nothing else. Each rank trains an MLP (784-256-128-10) on its share of the 60000
training images (a DistributedSampler), gradients averaged by DDP's allreduce each step; rank 0
then reports the test accuracy on the 10000 test images and the samples per second.
The data: Debian's dataset-fashion-mnist (scripts/setup-debian.sh), or --data-dir.
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--backend", default="nodal", choices=["nodal", "gloo"])
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
args = parser.parse_args()

if args.backend == "nodal":
    import nodal_torch  # noqa: F401  (registers the "nodal" backend with torch.distributed)


def idx(name, offset, shape):
    path = os.path.join(args.data_dir, name)
    with gzip.open(path, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8, offset=offset)
    return torch.from_numpy(data.copy()).reshape(shape)


def load(split):
    images = idx(f"{split}-images-idx3-ubyte.gz", 16, (-1, 784)).float() / 255.0
    labels = idx(f"{split}-labels-idx1-ubyte.gz", 8, (-1,)).long()
    return TensorDataset((images - 0.2860) / 0.3530, labels)


torch.set_num_threads(1)
dist.init_process_group(args.backend)
rank, world = dist.get_rank(), dist.get_world_size()
train = load("train")
sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(train, batch_size=args.batch, sampler=sampler, drop_last=True)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

start = time.perf_counter()
samples = 0
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        samples += len(x) * world
    if rank == 0:
        print(f"epoch {epoch + 1}: loss {loss.item():.4f}", flush=True)
elapsed = time.perf_counter() - start

if rank == 0:
    test = load("t10k")
    with torch.no_grad():
        predicted = model(test.tensors[0]).argmax(1)
    accuracy = (predicted == test.tensors[1]).float().mean().item()
    print(f"backend {args.backend}, {world} ranks: test accuracy {accuracy:.4f}, "
          f"{samples / elapsed:.0f} samples/s ({elapsed:.1f} s)", flush=True)
dist.destroy_process_group()
