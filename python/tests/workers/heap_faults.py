"""Trains a small MLP in a world of one after hetra.torch.init() and prints the page faults of a step
in the steady state (the mean over 20 steps after 10 of warm-up). Batches of varying sizes, as a
balancer's shares."""
import resource

import torch

import hetra.torch as ht

ht.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(4096, 784), torch.randint(0, 10, (4096,))


def step(i):
    idx = torch.randint(0, len(x), (300 + i % 7,))
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
    opt.step()


def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


for i in range(10):
    step(i)
before = faults()
for i in range(20):
    step(i)
print((faults() - before) / 20)
