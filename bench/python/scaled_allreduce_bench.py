"""What a premultiplied sum costs (ops.allreduce(scale=...), DistributedOptimizer's weighting)
against a plain sum of the same float32 tensor, on the job's ranks: both timed alternately, the
order swapped every round. Rank 0 prints the medians and their ratio as one JSON line.

    hetra launch -np 3 -- /usr/bin/python3 bench/python/scaled_allreduce_bench.py [--elements N]
(PYTHONPATH as in bench/compare_python.sh; N defaults to the MLP's first layer, 784 x 512.)
"""
import argparse
import json
import statistics
import time

import torch

import hetra.torch as ht
from hetra.torch import ops

parser = argparse.ArgumentParser()
parser.add_argument("--elements", type=int, default=784 * 512)
parser.add_argument("--rounds", type=int, default=30)
parser.add_argument("--iterations", type=int, default=20)
args = parser.parse_args()

ht.init()
tensor = torch.ones(args.elements)
seconds = {1.0: [], 0.5: []}
for round_ in range(args.rounds):
    for scale in ((1.0, 0.5) if round_ % 2 else (0.5, 1.0)):
        ops.allreduce(tensor, "sum", scale=scale).wait()  # warm
        start = time.perf_counter()
        for _ in range(args.iterations):
            ops.allreduce(tensor, "sum", scale=scale).wait()
        seconds[scale].append((time.perf_counter() - start) / args.iterations)
if ht.rank() == 0:
    plain, scaled = statistics.median(seconds[1.0]), statistics.median(seconds[0.5])
    print(json.dumps({"ranks": ht.size(), "elements": args.elements,
                      "plain_ms": round(plain * 1e3, 3), "scaled_ms": round(scaled * 1e3, 3),
                      "scaled_over_plain": round(scaled / plain, 3)}))
