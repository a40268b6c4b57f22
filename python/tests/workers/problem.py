"""The training problem the exactness tests share: a small MLP, a fixed data set of exactly one
global batch (so every step's global batch is the whole data set whatever the sampler's order),
and the optimizers. The single-process reference trains on it with plain torch."""
import torch

GLOBAL_BATCH = 44
STEPS = 20


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(GLOBAL_BATCH, 8, generator=g)
    y = torch.randint(0, 3, (GLOBAL_BATCH,), generator=g)
    return x, y


def model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=0.01)
    raise ValueError(f"optimizer {name!r}; allowed: sgd, adam")


def loss(net, x, y):
    return torch.nn.functional.cross_entropy(net(x), y)  # a mean over the samples given


def reference(name):
    """Full-batch training in one process: (gradients after the first step, final parameters)."""
    x, y = data()
    net = model()
    opt = optimizer(name, net.parameters())
    first = None
    for step in range(STEPS):
        opt.zero_grad()
        loss(net, x, y).backward()
        if step == 0:
            first = [p.grad.clone() for p in net.parameters()]
        opt.step()
    return first, [p.detach().clone() for p in net.parameters()]
