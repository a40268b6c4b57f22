"""An ordinary PyTorch training script with the four hetra lines (marked). Run it alone, or:

    hetra launch -np 3 -- /usr/bin/python3 examples/python/train_fashion_mnist.py --slowdowns 1,2,4
    torchrun --nproc_per_node 3 examples/python/train_fashion_mnist.py

Each rank trains on its balanced share of every global batch of 512; the gradients are weighted
by the shares, so the model trains exactly as one process on the full batch would.
"""
import argparse
import time

import torch

import fashion_mnist
import hetra.torch as ht

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--global-batch", type=int, default=512)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--slowdowns", default="", help="emulated slow devices, one factor per rank")
args = parser.parse_args()
torch.set_num_threads(1)  # one BLAS thread per rank

ht.init()                                                                          # hetra 1/4
x, y = fashion_mnist.load("train")
torch.manual_seed(0)
model = fashion_mnist.mlp()
sampler = ht.HeteroSampler(len(x), args.global_batch, seed=0)                      # hetra 2/4
slowdown = float(args.slowdowns.split(",")[ht.rank()]) if args.slowdowns else None  # HETRA_SLOWDOWNS
optimizer = ht.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr,   # 3/4
                                                    momentum=0.9), model, slowdown=slowdown)
ht.broadcast_parameters(model.state_dict()); ht.broadcast_optimizer_state(optimizer)  # 4/4

start, step = time.perf_counter(), 0
while step < args.steps:
    for indices in sampler:  # this rank's share of one global batch
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[indices]), y[indices])
        loss.backward()
        optimizer.step()
        step += 1
        if ht.rank() == 0 and step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f} split {sampler.schedule.shares_at(step)}",
                  flush=True)
        if step == args.steps:
            break
if ht.rank() == 0:
    seconds = time.perf_counter() - start
    test_x, test_y = fashion_mnist.load("test")
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    print(f"{step} steps in {seconds:.1f} s, {step * args.global_batch / seconds:.0f} samples/s, "
          f"test accuracy {accuracy:.3f}", flush=True)
