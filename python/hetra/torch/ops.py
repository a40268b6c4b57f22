"""Collectives on CPU tensors through hetra, in place where torch.distributed works in place.

Each call returns hetra's Work (`.wait(timeout=None)` raises the operation's typed error); the
Work holds the tensors until it completes. `comm` defaults to the job's (init()).
"""
import atexit
import pickle
import queue
import threading

import torch

from hetra import _core
from hetra.torch import _runtime
from hetra.torch._tensors import check_buffer, dtype_name

_OPS = {"sum": "sum", "avg": "avg", "mean": "avg", "min": "min", "max": "max"}


def _comm(comm):
    return comm if comm is not None else _runtime.world().comm


def _op_name(op):
    try:
        return _OPS[op]
    except KeyError:
        raise ValueError(f"op={op!r}; allowed: {', '.join(_OPS)}") from None


def allreduce(tensor, op="sum", compression="none", residual=None, min_bytes=65536, scale=1.0,
              comm=None):
    """Reduces `tensor` over every rank, in place. `compression` (fp16, bf16, fp8-e4m3, fp8-e5m2)
    applies to float32 sums and averages of at least `min_bytes`; `residual` (a float32 tensor of
    the same size, zero at first) keeps error feedback between calls. `scale`: this rank's values
    count `scale` times in a float sum or avg (NCCL's premultiplied sum), multiplied in by
    hetra's communication thread as it first reads them."""
    check_buffer(tensor)
    keep = [tensor]
    residual_address = 0
    if residual is not None:
        check_buffer(residual, "residual")
        if residual.dtype != torch.float32 or residual.numel() != tensor.numel():
            raise ValueError("residual must be a float32 tensor with as many elements as tensor")
        residual_address = residual.data_ptr()
        keep.append(residual)
    return _comm(comm).allreduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                 dtype_name(tensor), _op_name(op), compression=compression,
                                 min_bytes=min_bytes, residual=residual_address,
                                 scale=float(scale), keep=keep)


def broadcast(tensor, root=0, comm=None):
    check_buffer(tensor)
    return _comm(comm).broadcast(tensor.data_ptr(), tensor.numel(), dtype_name(tensor), root,
                                 keep=[tensor])


def allgather(output, tensor, counts=None, comm=None):
    """`output` (numel = sum of counts) receives every rank's `tensor` in rank order; `counts` (one
    element count per rank) defaults to tensor.numel() on every rank."""
    check_buffer(tensor)
    check_buffer(output, "output")
    c = _comm(comm)
    counts = counts if counts is not None else [tensor.numel()] * c.size
    return c.allgather(tensor.data_ptr(), output.data_ptr(), counts, dtype_name(tensor),
                       keep=[tensor, output])


def reduce_scatter(output, tensor, counts=None, op="sum", comm=None):
    check_buffer(tensor)
    check_buffer(output, "output")
    c = _comm(comm)
    counts = counts if counts is not None else [output.numel()] * c.size
    return c.reduce_scatter(tensor.data_ptr(), output.data_ptr(), counts, dtype_name(tensor),
                            _op_name(op), keep=[tensor, output])


def send(tensor, dst, tag=0, comm=None):
    check_buffer(tensor)
    return _comm(comm).send(tensor.data_ptr(), tensor.numel(), dtype_name(tensor), dst, tag,
                            keep=[tensor])


def recv(tensor, src, tag=0, comm=None):
    check_buffer(tensor)
    return _comm(comm).recv(tensor.data_ptr(), tensor.numel(), dtype_name(tensor), src, tag,
                            keep=[tensor])


def broadcast_object(obj, root=0, comm=None):
    """Any picklable object from `root` to every rank (its size first, then its bytes)."""
    c = _comm(comm)
    payload = pickle.dumps(obj) if c.rank == root else b""
    length = torch.tensor([len(payload)], dtype=torch.int64)
    broadcast(length, root, c).wait()
    buffer = torch.empty(int(length.item()), dtype=torch.uint8)
    if c.rank == root:
        buffer.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    broadcast(buffer, root, c).wait()
    return obj if c.rank == root else pickle.loads(buffer.numpy().tobytes())


def allgather_floats(values, comm=None):
    """Every rank's list of floats (all of the same length), as a list per rank."""
    c = _comm(comm)
    mine = torch.tensor(values, dtype=torch.float64)
    everyone = torch.empty(mine.numel() * c.size, dtype=torch.float64)
    allgather(everyone, mine, comm=c).wait()
    return everyone.view(c.size, -1).tolist()


class Completer:
    """Completion callbacks for one communicator's operations: a thread waits for each Work in
    the order they were issued (the order they run in) and then calls its callback with None or
    the operation's exception. Callbacks run on that thread: keep them short."""

    def __init__(self, timeout):
        self._timeout = timeout  # the operations' deadline: a wait never lasts longer
        self._pending = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="hetra-completer", daemon=True)
        self._thread.start()
        # Before the interpreter ends: a daemon thread frozen in a callback would keep its
        # communicator alive, and its threads running, into the process's exit.
        atexit.register(self.close)

    def on_complete(self, work, callback):
        self._pending.put((work, callback))

    def close(self):
        """Completes what was issued, then stops the thread."""
        if self._thread.is_alive():
            self._pending.put(None)
            self._thread.join(timeout=self._timeout + 10)

    def _run(self):
        while True:
            item = self._pending.get()
            if item is None:
                return
            work, callback = item
            try:
                work.wait()  # the GIL is released while it waits
                error = None
            except BaseException as e:  # handed to the callback, which owns it
                error = e
            callback(error)
            item = work = callback = error = None  # holds nothing between operations


Error = _core.Error
