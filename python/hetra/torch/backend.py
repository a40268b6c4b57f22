"""The `hetra` backend of torch.distributed: dist.init_process_group("hetra") runs all_reduce,
all_gather, broadcast, reduce_scatter, barrier, send/recv and DistributedDataParallel over hetra's
transports (CPU tensors).

torch 1.13 takes a ProcessGroup subclass from the backend's creator; torch 2.x a Backend subclass
and the devices it serves (register_backend's `devices`). Both are feature-detected; only 1.13 has
run here. Each operation runs to completion before it returns (its Work is already done), so DDP
gets no overlap of communication with backward from this backend; hetra.torch's
DistributedOptimizer has it.
"""
import datetime
import inspect
import os

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from hetra import _core
from hetra.torch import _runtime, ops

BACKEND_NAME = "hetra"

_TORCH2_BACKEND = getattr(c10d, "Backend", None)  # torch 2.x: the C++ backend's Python base
_Base = _TORCH2_BACKEND if _TORCH2_BACKEND is not None else c10d.ProcessGroup

_REDUCE_OPS = {"SUM": "sum", "AVG": "avg", "MIN": "min", "MAX": "max"}


def _reduce_op(op):
    for name, ours in _REDUCE_OPS.items():
        if hasattr(dist.ReduceOp, name) and op == getattr(dist.ReduceOp, name):
            return ours
    raise ValueError(f"the hetra backend reduces with {', '.join(_REDUCE_OPS)}; got {op}")


def _done(result):
    future = torch.futures.Future()
    future.set_result(result)
    return c10d._create_work_from_future(future)


class ProcessGroupHetra(_Base):
    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        context = _core.RankContext()
        context.rank, context.world_size = rank, size
        context.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        # Only its host matters: rank 0 serves hetra's store on the address that reaches it.
        context.store_address = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:0"
        self._server = None
        if size > 1:
            context, self._server = _runtime.publish_store(store, context, seconds)
            self._job = _core.connect_job_store(context, seconds)
            listen = _core.listen_address_for(context)
        else:
            self._job = None
        group_store = self._job.store if self._job is not None else _core.memory_store()
        self.comm = _core.Communicator(group_store, rank, size, timeout=seconds,
                                       listen_address=listen if size > 1 else "")

    def getBackendName(self):
        return BACKEND_NAME

    def allreduce(self, tensors, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else "sum"
        for tensor in tensors:
            ops.allreduce(tensor, op, comm=self.comm).wait()
        return _done(tensors)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        for tensor in tensors:
            ops.broadcast(tensor, root, comm=self.comm).wait()
        return _done(tensors)

    def allgather(self, output_lists, inputs, opts=None):
        for outputs, tensor in zip(output_lists, inputs):
            gathered = torch.empty(tensor.numel() * self.comm.size, dtype=tensor.dtype)
            ops.allgather(gathered, tensor.contiguous(), comm=self.comm).wait()
            for out, part in zip(outputs, gathered.chunk(self.comm.size)):
                out.copy_(part.view_as(out))
        return _done(output_lists)

    def _allgather_base(self, output, tensor, opts=None):
        ops.allgather(output, tensor, comm=self.comm).wait()
        return _done([output])

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else "sum"
        for out, parts in zip(outputs, input_lists):
            flat = torch.cat([p.reshape(-1) for p in parts])
            ops.reduce_scatter(out, flat, counts=[p.numel() for p in parts], op=op,
                               comm=self.comm).wait()
        return _done(outputs)

    def _reduce_scatter_base(self, output, tensor, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else "sum"
        ops.reduce_scatter(output, tensor, op=op, comm=self.comm).wait()
        return _done([output])

    def barrier(self, opts=None):
        self.comm.barrier().wait()
        return _done([])

    def send(self, tensors, dst, tag=0):
        for tensor in tensors:
            ops.send(tensor, dst, tag, comm=self.comm).wait()
        return _done(tensors)

    def recv(self, tensors, src, tag=0):
        for tensor in tensors:
            ops.recv(tensor, src, tag, comm=self.comm).wait()
        return _done(tensors)


def _create(store, rank, size, timeout):
    return ProcessGroupHetra(store, rank, size, timeout)


def register():
    """Registers the backend with torch.distributed, once per process (a second import, a reload
    or a second call finds it registered)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return False
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu"])
    else:
        dist.Backend.register_backend(BACKEND_NAME, _create)
    return True


class WeightedHookState:
    """State of `weighted_allreduce_hook`: the sampler whose shares weight each rank's gradients
    (b_i / B) and the step DDP is at (counted by the hook, one per backward). `compression` (fp16,
    bf16, fp8-e4m3, fp8-e5m2; the process group must be hetra's) puts float32 buckets of at least
    `min_bytes` on the wire encoded, with error feedback kept per bucket."""

    def __init__(self, sampler, process_group=None, compression="none", min_bytes=65536):
        self.sampler = sampler
        self.process_group = process_group
        self.compression = compression
        self.min_bytes = min_bytes
        self.residuals = {}  # bucket index -> error feedback state
        self.step = 0

    def hetra_group(self):
        group = self.process_group or dist.distributed_c10d._get_default_group()
        if not isinstance(group, ProcessGroupHetra):
            raise ValueError(f"compression={self.compression!r} needs the process group of "
                             f"backend 'hetra', not {type(group).__name__}")
        return group


def weighted_allreduce_hook(state, bucket):
    """DDP comm hook for exact weighting: the full batch's mean gradient while each rank writes a
    mean loss over its own share (DDP's default divides by the world size, which biases uneven
    splits). ddp.register_comm_hook(WeightedHookState(sampler), weighted_allreduce_hook)."""
    tensor = bucket.buffer()
    tensor.mul_(state.sampler.share(state.step) / state.sampler.global_batch)
    if bucket.is_last():
        state.step += 1
    if state.compression != "none" and tensor.dtype == torch.float32:
        residual = state.residuals.setdefault(bucket.index(), torch.zeros_like(tensor))
        ops.allreduce(tensor, "sum", compression=state.compression, residual=residual,
                      min_bytes=state.min_bytes, comm=state.hetra_group().comm).wait()
        future = torch.futures.Future()
        future.set_result(tensor)
        return future
    work = dist.all_reduce(tensor, group=state.process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
