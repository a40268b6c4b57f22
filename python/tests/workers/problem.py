"""The training problem the exactness tests share: a small MLP, a fixed data set of exactly one
global batch (so every step's global batch is the whole data set whatever the sampler's order),
and the optimizers. The single-process reference trains on it with plain torch."""
import torch

GLOBAL_BATCH = 44
STEPS = 20


def data(samples=GLOBAL_BATCH, features=8):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(samples, features, generator=g)
    y = torch.randint(0, 3, (samples,), generator=g)
    return x, y


def model(features=8, hidden=16):
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 3))


def optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=0.01)
    raise ValueError(f"optimizer {name!r}; allowed: sgd, adam")


def loss(net, x, y):
    return torch.nn.functional.cross_entropy(net(x), y)  # a mean over the samples given


def reference(name, samples=GLOBAL_BATCH, features=8, hidden=16, steps=STEPS):
    """Full-batch training in one process: (gradients after the first step, final parameters)."""
    x, y = data(samples, features)
    net = model(features, hidden)
    opt = optimizer(name, net.parameters())
    first = None
    for step in range(steps):
        opt.zero_grad()
        loss(net, x, y).backward()
        if step == 0:
            first = [p.grad.clone() for p in net.parameters()]
        opt.step()
    return first, [p.detach().clone() for p in net.parameters()]
