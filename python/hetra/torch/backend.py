"""The `hetra` backend of torch.distributed: dist.init_process_group("hetra") runs all_reduce,
all_gather, broadcast, reduce_scatter, barrier, send/recv and DistributedDataParallel over hetra's
transports (CPU tensors).

torch 1.13 takes a ProcessGroup subclass from the backend's creator; torch 2.x a Backend subclass
and the devices it serves (register_backend's `devices`). Both are feature-detected; only 1.13 has
run here. Operations return at once; their Work completes when hetra's does (a completer
thread waits for them in order), so DDP overlaps its gradient allreduces with backward.
"""
import atexit
import datetime
import inspect
import os
import weakref

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


def _future_when_done(completer, work, result, then=None):
    """A torch future of hetra's `work`: it gets `result` once `then()` (if any) ran after hetra
    completed, or the operation's error."""
    future = torch.futures.Future()

    def finish(error):
        if error is None and then is not None:
            try:
                then()
            except BaseException as e:
                error = e
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    completer.on_complete(work, finish)
    return future


class ProcessGroupHetra(_Base):
    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        _core.keep_host_heap()  # as init() does: a step's freed tensors stay for the next
        context = _core.RankContext()
        context.rank, context.world_size = rank, size
        context.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        # Only its host matters: rank 0 serves hetra's store on the address that reaches it
        # (MASTER_ADDR, as env:// and torchrun give it; without it, this host's loopback).
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
        self._completer = ops.Completer(seconds)
        _live_groups.add(self)

    def shutdown(self):
        """Completes what was issued, then releases the group's threads, transport and store
        (idempotent; the group is unusable afterwards). Called for every live group when the
        interpreter exits, before it starts tearing itself down."""
        self._completer.close()
        self.comm = self._job = self._server = None

    def _started(self, works, result, then=None):
        # hetra runs a group's operations in order: the last one done means all are.
        for work in works[:-1]:
            self._completer.on_complete(work, lambda error: None)
        if not works:
            return _done(result)
        return c10d._create_work_from_future(
            _future_when_done(self._completer, works[-1], result, then))

    def getBackendName(self):
        return BACKEND_NAME

    def allreduce(self, tensors, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else "sum"
        return self._started([ops.allreduce(t, op, comm=self.comm) for t in tensors], tensors)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        return self._started([ops.broadcast(t, root, comm=self.comm) for t in tensors], tensors)

    def allgather(self, output_lists, inputs, opts=None):
        works, copies = [], []
        for outputs, tensor in zip(output_lists, inputs):
            gathered = torch.empty(tensor.numel() * self.comm.size, dtype=tensor.dtype)
            works.append(ops.allgather(gathered, tensor.contiguous(), comm=self.comm))
            copies.append((outputs, gathered))

        def scatter_to_outputs():
            for outputs, gathered in copies:
                for out, part in zip(outputs, gathered.chunk(self.comm.size)):
                    out.copy_(part.view_as(out))
        return self._started(works, output_lists, scatter_to_outputs)

    def _allgather_base(self, output, tensor, opts=None):
        return self._started([ops.allgather(output, tensor, comm=self.comm)], [output])

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else "sum"
        works = []
        for out, parts in zip(outputs, input_lists):
            flat = torch.cat([p.reshape(-1) for p in parts])
            works.append(ops.reduce_scatter(out, flat, counts=[p.numel() for p in parts], op=op,
                                            comm=self.comm))
        return self._started(works, outputs)

    def _reduce_scatter_base(self, output, tensor, opts=None):
        op = _reduce_op(opts.reduceOp) if opts is not None else "sum"
        return self._started([ops.reduce_scatter(output, tensor, op=op, comm=self.comm)],
                             [output])

    def barrier(self, opts=None):
        return self._started([self.comm.barrier()], [])

    def send(self, tensors, dst, tag=0):
        return self._started([ops.send(t, dst, tag, comm=self.comm) for t in tensors], tensors)

    def recv(self, tensors, src, tag=0):
        return self._started([ops.recv(t, src, tag, comm=self.comm) for t in tensors], tensors)


# Every group not yet shut down. Scripts rarely call destroy_process_group(), and torch 1.13 keeps
# the default group until the interpreter tears its modules down: the groups are shut down at exit
# first, while the interpreter is intact, so that none of their completion callbacks, progress
# threads or transports runs on into the teardown (a thread that wants the GIL then is ended in
# the middle of C++ frames, which aborts the process).
_live_groups = weakref.WeakSet()


@atexit.register  # registered at import: runs after the atexit handlers of any later group
def _shutdown_live_groups():
    for group in list(_live_groups):
        group.shutdown()


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
        group = state.hetra_group()
        work = ops.allreduce(tensor, "sum", compression=state.compression, residual=residual,
                             min_bytes=state.min_bytes, comm=group.comm)
        return _future_when_done(group._completer, work, tensor)
    work = dist.all_reduce(tensor, group=state.process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
