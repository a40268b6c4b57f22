"""An unchanged DistributedDataParallel script on backend="hetra" (the two changed lines are
marked; --backend gloo runs the original). Run it with torchrun or hetra launch:

    torchrun --nproc_per_node 3 examples/python/ddp_backend.py
    hetra launch -np 3 -- /usr/bin/python3 examples/python/ddp_backend.py

--weighted trains on hetra's uneven split (HeteroSampler) with the comm hook that weights each
rank's gradients by its share, which DDP's default 1/world_size weighting gets wrong.
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import fashion_mnist
import hetra.torch as ht  # changed line 1 of 2: registers the "hetra" backend

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="hetra")  # changed line 2 of 2 (was "gloo")
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--global-batch", type=int, default=512)
parser.add_argument("--weighted", action="store_true")
args = parser.parse_args()
torch.set_num_threads(1)

dist.init_process_group(args.backend)
rank, size = dist.get_rank(), dist.get_world_size()
x, y = fashion_mnist.load("train")
torch.manual_seed(0)
model = DDP(fashion_mnist.mlp())
if args.weighted:
    sampler = ht.HeteroSampler(len(x), args.global_batch, seed=0)
    model.register_comm_hook(ht.WeightedHookState(sampler), ht.weighted_allreduce_hook)
else:
    data = TensorDataset(x, y)
    loader = DataLoader(data, batch_size=args.global_batch // size,
                        sampler=DistributedSampler(data, size, rank, seed=0))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def batches():
    while True:  # one pass after another
        if args.weighted:
            for indices in sampler:  # this rank's share of one global batch
                yield x[indices], y[indices]
        else:
            yield from loader


start = time.perf_counter()
stream = batches()
for step in range(args.steps):
    inputs, labels = next(stream)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    optimizer.step()
if rank == 0:
    seconds = time.perf_counter() - start
    print(f"backend {dist.get_backend()}: {args.steps} steps in {seconds:.1f} s, last loss "
          f"{loss.item():.4f}", flush=True)
dist.destroy_process_group()
