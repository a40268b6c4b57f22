"""One rank of the exactness tests: trains problem.py on a fixed uneven split through
hetra.torch's DistributedOptimizer or DDP on backend="hetra" (weighted hook or DDP's default), and
saves its gradients after the first step and its final parameters.

    train_uneven.py MODE OPTIMIZER SHARES OUTDIR
MODE: distopt, distopt-micro (micro-batches of at most 5 samples, the memory cap of every rank),
ddp-weighted, ddp-default; distopt-bf16 and ddp-bf16 compress every bucket to bf16.
"""
import contextlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import problem  # noqa: E402

import hetra.torch as ht  # noqa: E402

mode, opt_name, shares, outdir = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ht.init(timeout=60)
x, y = problem.data()
sampler = ht.HeteroSampler(problem.GLOBAL_BATCH, problem.GLOBAL_BATCH, seed=11,
                           batches=[int(s) for s in shares.split(",")],
                           max_micro_batch=5 if mode == "distopt-micro" else None)
net = problem.model()
if mode.startswith("distopt"):
    opt = ht.DistributedOptimizer(problem.optimizer(opt_name, net.parameters()), net,
                                  sampler=sampler, bucket_bytes=256,  # several buckets
                                  compression="bf16" if mode == "distopt-bf16" else "none",
                                  compression_min_bytes=0)
    ht.broadcast_parameters(net.state_dict())
    ht.broadcast_optimizer_state(opt)
    trained = net
else:
    dist.init_process_group("hetra")
    trained = torch.nn.parallel.DistributedDataParallel(net)
    if mode in ("ddp-weighted", "ddp-bf16"):
        state = ht.WeightedHookState(sampler, compression="bf16" if mode == "ddp-bf16" else "none",
                                     min_bytes=0)
        trained.register_comm_hook(state, ht.weighted_allreduce_hook)
    elif mode != "ddp-default":
        raise SystemExit(f"mode {mode!r}; allowed: distopt, distopt-micro, distopt-bf16, "
                         f"ddp-weighted, ddp-bf16, ddp-default")
    opt = problem.optimizer(opt_name, trained.parameters())

first = None
seen = []
for step in range(problem.STEPS):
    for indices in sampler:  # one pass: exactly one step, since the data set is one global batch
        seen.append(list(indices))
        opt.zero_grad()
        micro = sampler.micro_batches(indices)
        if mode == "distopt-micro" and max(len(m) for m in micro) > 5:
            raise SystemExit(f"a micro-batch above the cap: {[len(m) for m in micro]}")
        for i, part in enumerate(micro):
            last = i == len(micro) - 1
            with contextlib.nullcontext() if last or mode != "distopt-micro" else opt.no_sync():
                (problem.loss(trained, x[part], y[part]) * len(part) / len(indices)).backward()
        opt.step()
        if step == 0:
            first = [p.grad.clone() for p in net.parameters()]

torch.save({"grads": first, "params": [p.detach().clone() for p in net.parameters()],
            "indices": seen}, os.path.join(outdir, f"rank{ht.rank()}.pt"))
if not mode.startswith("distopt"):
    dist.destroy_process_group()
