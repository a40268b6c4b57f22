"""One rank of the balancer test: emulated devices of different speeds (--slowdown per rank), the
split moved online by hetra's balancer from the compute times DistributedOptimizer measures.
The data set is one global batch, so every step trains the full batch whatever the split.

    balanced.py SLOWDOWNS OUTDIR        SLOWDOWNS: one factor per rank, e.g. 1,1,4
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import problem  # noqa: E402

import hetra.torch as ht  # noqa: E402

SAMPLES, FEATURES, HIDDEN, STEPS = 240, 128, 1024, 40
slowdowns, outdir = [float(s) for s in sys.argv[1].split(",")], sys.argv[2]
ht.init(timeout=60)
torch.set_num_threads(1)
x, y = problem.data(SAMPLES, FEATURES)
sampler = ht.HeteroSampler(SAMPLES, SAMPLES, seed=5, balance="dynamic")
net = problem.model(FEATURES, HIDDEN)
opt = ht.DistributedOptimizer(problem.optimizer("sgd", net.parameters()), net, sampler=sampler,
                              slowdown=slowdowns[ht.rank()])
seen = []
for _ in range(STEPS):
    for indices in sampler:
        seen.append(list(indices))
        opt.zero_grad()
        problem.loss(net, x[indices], y[indices]).backward()
        opt.step()
torch.save({"params": [p.detach().clone() for p in net.parameters()], "indices": seen,
            "changes": sampler.schedule.changes, "plan": sampler.plan.summary()},
           os.path.join(outdir, f"rank{ht.rank()}.pt"))
