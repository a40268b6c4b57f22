"""One rank of the collective tests: every collective of hetra.torch (ops) and of torch.distributed
on backend="hetra", on values distinct per rank and element; checks against references computed
here from the same formula, prints OK."""
import sys

import torch
import torch.distributed as dist

import hetra.torch as ht
from hetra import _core

ht.init(timeout=60)
rank, size = ht.rank(), ht.size()


def values(r, n, dtype=torch.float64):
    # Distinct per rank and element, exact in float64 and int64.
    return (torch.arange(n, dtype=torch.float64) * 1000 + r + 1).to(dtype)


def expect(name, got, want):
    if not torch.equal(got, want):
        sys.exit(f"{name}: got {got.tolist()[:8]}... want {want.tolist()[:8]}...")


n = 37  # odd, not a multiple of the world size
for dtype in (torch.float64, torch.int64, torch.float32):
    t = values(rank, n, dtype)
    ht.allreduce(t).wait(timeout=60)
    expect(f"allreduce {dtype}", t, sum(values(r, n, dtype) for r in range(size)))
# A premultiplied sum: each rank's values count (rank + 1) / 4 times (exact: quarters of integers).
t = values(rank, n)
ht.allreduce(t, scale=(rank + 1) / 4).wait(timeout=60)
expect("allreduce scale", t, sum(values(r, n) * (r + 1) / 4 for r in range(size)))
try:
    ht.allreduce(values(rank, n, torch.int64), scale=0.5)
    sys.exit("an input scale on int64 was accepted")
except _core.ConfigError:
    pass
t = values(rank, n)
ht.allreduce(t, op="max").wait(timeout=60)
expect("allreduce max", t, values(size - 1, n))
t = values(rank, n)
ht.broadcast(t, root=size - 1).wait(timeout=60)
expect("broadcast", t, values(size - 1, n))
counts = [r + 2 for r in range(size)]  # uneven
out = torch.empty(sum(counts), dtype=torch.float64)
ht.allgather(out, values(rank, counts[rank]), counts=counts).wait(timeout=60)
expect("allgather", out, torch.cat([values(r, counts[r]) for r in range(size)]))
mine = torch.empty(counts[rank], dtype=torch.float64)
ht.reduce_scatter(mine, values(rank, sum(counts)), counts=counts).wait(timeout=60)
offset = sum(counts[:rank])
expect("reduce_scatter", mine,
       sum(values(r, sum(counts)) for r in range(size))[offset:offset + counts[rank]])
obj = ht.broadcast_object({"from": rank, "list": [1, 2]} if rank == 0 else None)
if obj != {"from": 0, "list": [1, 2]}:
    sys.exit(f"broadcast_object: {obj}")

dist.init_process_group("hetra")
if dist.get_backend() != "hetra":
    sys.exit(f"backend {dist.get_backend()}")
t = values(rank, n)
dist.all_reduce(t)
expect("dist.all_reduce", t, sum(values(r, n) for r in range(size)))
t = values(rank, n)
dist.broadcast(t, src=1)
expect("dist.broadcast", t, values(1, n))
parts = [torch.empty(n, dtype=torch.float64) for _ in range(size)]
dist.all_gather(parts, values(rank, n))
for r in range(size):
    expect(f"dist.all_gather part {r}", parts[r], values(r, n))
mine = torch.empty(n, dtype=torch.float64)
dist.reduce_scatter(mine, [values(rank, n) * (k + 1) for k in range(size)])
expect("dist.reduce_scatter", mine, sum(values(r, n) for r in range(size)) * (rank + 1))
dist.barrier()
# A ring of sends: the lower rank sends first (hetra's sends complete when the peer receives).
got = torch.empty(n, dtype=torch.float64)
if rank == 0:
    dist.send(values(rank, n), dst=1)
    dist.recv(got, src=size - 1)
else:
    dist.recv(got, src=rank - 1)
    dist.send(values(rank, n), dst=(rank + 1) % size)
expect("dist.send/recv", got, values((rank - 1) % size, n))
dist.destroy_process_group()
print("OK")
