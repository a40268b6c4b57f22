"""One rank of the compression test: a float32 allreduce through hetra.torch with each codec;
saves the results and the bytes this rank sent for each."""
import os
import sys

import torch

import hetra.torch as ht

COUNT = 150001  # above hetra's minimum compressed size, odd
outdir = sys.argv[1]
ht.init(timeout=60, transport="tcp")  # the bytes of a real wire (shm shares memory)


def values(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(COUNT, generator=g) * (rank + 1)


results = {}
for codec in ("none", "fp16", "bf16"):
    t = values(ht.rank())
    before = ht.world().comm.bytes_sent
    ht.allreduce(t, compression=codec).wait()
    results[codec] = (t, ht.world().comm.bytes_sent - before)
torch.save(results, os.path.join(outdir, f"rank{ht.rank()}.pt"))
