"""hetra for PyTorch: `import hetra.torch as ht`.

    ht.init()                                   # hetra launch, torchrun, mpirun, srun, or alone
    sampler = ht.HeteroSampler(len(data), global_batch=512, seed=0)
    loader = DataLoader(data, batch_sampler=sampler)
    opt = ht.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    # or ht.optim.SGD / Adam / AdamW: torch's classes with hetra's one-pass step
    ht.broadcast_parameters(model.state_dict()); ht.broadcast_optimizer_state(opt)

Importing it also registers the `hetra` backend of torch.distributed (once).
"""
from hetra._core import (ConfigError, Error, IoError, MismatchError, PeerAbortedError,
                         TimeoutError)
from hetra.torch import backend, optim
from hetra.torch._runtime import init, local_rank, rank, shutdown, size, world
from hetra.torch.backend import WeightedHookState, weighted_allreduce_hook
from hetra.torch.ops import (allgather, allreduce, broadcast, broadcast_object, recv,
                             reduce_scatter, send)
from hetra.torch.optimizer import (DistributedOptimizer, broadcast_optimizer_state,
                                   broadcast_parameters)
from hetra.torch.sampler import HeteroSampler

__all__ = [
    "init", "shutdown", "world", "rank", "size", "local_rank",
    "HeteroSampler", "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "allreduce", "allgather", "broadcast", "broadcast_object", "reduce_scatter", "send", "recv",
    "WeightedHookState", "weighted_allreduce_hook", "optim",
    "Error", "ConfigError", "IoError", "MismatchError", "PeerAbortedError", "TimeoutError",
]

backend.register()
