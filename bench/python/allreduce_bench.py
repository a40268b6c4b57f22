"""One rank of the torch.distributed allreduce comparison (issue: hetra for PyTorch users): a
float32 `dist.all_reduce` of --size bytes (default 16 MiB) on backend "hetra" against "gloo", both
groups in one job, timed alternately (the order swaps every round, so neither always runs first).

    hetra launch -np 2 -- /usr/bin/python3 bench/python/allreduce_bench.py [--size 16M]

The default group is Gloo's, the second group hetra's (dist.new_group(backend="hetra")); every
round runs --iters back-to-back synchronous all_reduce calls per backend after a barrier on that
group, and each backend's time is the round's mean per call. The first call of each backend is
checked against the sum computed here (every rank and element distinct, exact in float32).
Rank 0 prints one JSON line: {"bytes", "ranks", "gloo_us", "hetra_us", "speedup"} with medians
over rounds (speedup: the median over rounds of gloo's time / hetra's within the round).
Needs a quiet machine with a core per rank: on a busy one the numbers measure the other load.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

import hetra.torch  # noqa: F401  (registers the "hetra" backend)


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    suffix = text[-1].lower()
    return int(float(text[:-1]) * units[suffix]) if suffix in units else int(text)


parser = argparse.ArgumentParser()
parser.add_argument("--size", default="16M", help="bytes of the float32 buffer (16M, 1M, 4096)")
parser.add_argument("--iters", type=int, default=10, help="calls per backend and round")
parser.add_argument("--rounds", type=int, default=7)
parser.add_argument("--warmup", type=int, default=3, help="untimed calls per backend first")
args = parser.parse_args()
torch.set_num_threads(1)

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
groups = {"gloo": dist.group.WORLD, "hetra": dist.new_group(backend="hetra")}
count = parse_size(args.size) // 4
if count < 1:
    sys.exit(f"--size {args.size} holds no float32 element")

# Every element distinct within a rank and across ranks, small enough that the sum is exact in
# float32 (below 2^24) and that --iters sums in place stay finite.
source = (torch.arange(count, dtype=torch.float64) % 4096 * size + rank).float()
expected = sum((torch.arange(count, dtype=torch.float64) % 4096 * size + r) for r in range(size))
buffer = torch.empty_like(source)


def check(name):
    buffer.copy_(source)
    dist.all_reduce(buffer, group=groups[name])
    if not torch.equal(buffer.double(), expected):
        wrong = int((buffer.double() != expected).sum())
        sys.exit(f"{name}: all_reduce of {count} float32 gave {wrong} wrong elements")


def timed(name):
    buffer.copy_(source)
    group = groups[name]
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(buffer, group=group)
    return (time.perf_counter() - start) / args.iters


for name in groups:
    check(name)
    for _ in range(args.warmup):
        dist.all_reduce(buffer, group=groups[name])
times = {name: [] for name in groups}
ratios = []
for r in range(args.rounds):
    order = ["gloo", "hetra"] if r % 2 == 0 else ["hetra", "gloo"]
    this_round = {name: timed(name) for name in order}
    for name, seconds in this_round.items():
        times[name].append(seconds)
    ratios.append(this_round["gloo"] / this_round["hetra"])
if rank == 0:
    print(json.dumps({"bytes": count * 4, "ranks": size, "iters": args.iters,
                      "rounds": args.rounds,
                      "gloo_us": round(statistics.median(times["gloo"]) * 1e6, 1),
                      "hetra_us": round(statistics.median(times["hetra"]) * 1e6, 1),
                      "speedup": round(statistics.median(ratios), 2)}), flush=True)
