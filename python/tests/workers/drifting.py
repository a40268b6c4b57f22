"""One rank of the drift tests: trains problem.py through DistributedOptimizer with
`resync_every`; within each step's update (after the gradients are in, before step()) it adds
eps * rank * (1 + i % 7) / 7 to element i of every parameter, as a device that rounds differently
would drift (distinct per rank and element). Saves its parameters after 12 steps and the
optimizer's replica_drifts.

    drifting.py RESYNC_EVERY EPS OUTDIR
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import problem  # noqa: E402

import hetra.torch as ht  # noqa: E402

resync_every, eps, outdir = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ht.init(timeout=60)
rank = ht.rank()
x, y = problem.data()
sampler = ht.HeteroSampler(problem.GLOBAL_BATCH, problem.GLOBAL_BATCH, seed=11,
                           batches=[20, 14, 10] if ht.size() == 3 else None)
net = problem.model()
opt = ht.DistributedOptimizer(problem.optimizer("sgd", net.parameters()), net, sampler=sampler,
                              resync_every=resync_every)
ht.broadcast_parameters(net.state_dict())
before = None
for step in range(14):
    for indices in sampler:  # one pass is one step: the data set is one global batch
        opt.zero_grad()
        problem.loss(net, x[indices], y[indices]).backward()
        opt.synchronize()
        with torch.no_grad():  # this rank's rounding, within the step's update
            for p in net.parameters():
                i = torch.arange(p.numel()).reshape(p.shape)
                p.add_(((i % 7) + 1).float() * (eps * rank / 7))
        opt.step()
    if step == 11:
        before = [p.detach().clone() for p in net.parameters()]
torch.save({"before": before, "drifts": opt.replica_drifts},
           os.path.join(outdir, f"rank{rank}.pt"))
