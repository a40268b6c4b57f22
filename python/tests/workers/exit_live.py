"""One rank of the exit tests: the process ends without destroy_process_group or shutdown(), with
the group alive and, in some cases, operations still in flight; it must exit with status 0.

    exit_live.py ddp        DDP on backend="hetra", a few steps, then the script's end
    exit_live.py pending    dist.all_reduce(async_op=True) of 16 MiB, never waited for
    exit_live.py ht         hetra.torch's own allreduce in flight, its Work dropped, at the end
Prints DONE just before the script's end (the exit itself comes after).
"""
import sys

import torch
import torch.distributed as dist

import hetra.torch as ht

what = sys.argv[1]
torch.set_num_threads(1)
if what == "ddp":
    dist.init_process_group("hetra")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
elif what == "pending":
    dist.init_process_group("hetra")
    big = torch.full((4 << 20,), float(dist.get_rank() + 1))
    work = dist.all_reduce(big, async_op=True)
elif what == "ht":
    ht.init(timeout=60)
    ht.allreduce(torch.full((4 << 20,), float(ht.rank() + 1)))  # the Work is dropped at once
else:
    sys.exit(f"unknown case {what!r}")
print("DONE", flush=True)
