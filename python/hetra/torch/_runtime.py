"""The job this process belongs to: its rank, its store and its communicator.

`init()` reads whichever launcher started the process (hetra._core.rank_from_environment: hetra
launch, torchrun, mpirun, srun, PMI); with none, the process is a world of one, so the same script
runs alone. Under torchrun hetra serves its own store on a free port of rank 0's host and publishes
that address through torch's store (torchrun's agent serves it at MASTER_PORT), so it never competes
with torch for a port.
"""
import atexit
import datetime
import os
import socket

from hetra import _core

_STORE_KEY = "hetra/store_address"


class World:
    """What init() set up; kept alive as long as the process uses hetra."""

    def __init__(self, context, job, comm, keep):
        self.context = context
        self.job = job
        self.comm = comm
        self._keep = keep  # a store server this process serves, and torch's store client


_world = None


def _under_torchrun():
    # torchrun's agent serves torch's store for its workers and says so in this variable.
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("1", "true")


def _connectable(host):
    """`host`, or loopback when it has no resolver entry and every rank runs on this host (a bare
    chroot or container often has no /etc/hosts line for its own name, which torchrun's
    MASTER_ADDR is)."""
    try:
        socket.getaddrinfo(host, None)
        return host
    except socket.gaierror:
        if os.environ.get("LOCAL_WORLD_SIZE") == os.environ.get("WORLD_SIZE"):
            return "127.0.0.1"
        raise


def publish_store(torch_store, context, timeout):
    """Rank 0 serves hetra's store on a free port and publishes host:port in `torch_store`; the
    other ranks read it. Returns (context for connect_job_store, the server or None)."""
    server = None
    if context.rank == 0:
        host = _connectable(_core.listen_address_for(context))
        server = _core.StoreServer(host, 0)
        torch_store.set(_STORE_KEY, f"{host}:{server.port}")
    else:
        torch_store.wait([_STORE_KEY], datetime.timedelta(seconds=timeout))
    context.store_address = torch_store.get(_STORE_KEY).decode()
    context.store_external = True  # every rank connects; rank 0's server lives in `server`
    return context, server


def _torch_store(timeout):
    import torch.distributed as dist

    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                          datetime.timedelta(seconds=timeout))
    # One key per run and restart: a restarted worker group must not read the old address.
    return dist.PrefixStore(f"hetra/{run}/{restart}", store)


def init(timeout=60.0, transport="auto"):
    """Joins the job (idempotent) and keeps this process's heap as hetra run's ranks do
    (hetra._core.keep_host_heap). `timeout`: seconds for the rendezvous and for every operation."""
    global _world
    if _world is not None:
        return _world
    # A training step frees and allocates the same megabytes of tensors every step; with glibc's
    # adaptive thresholds a step can fault them all in again (src/device/host_heap.h). A rank of
    # hetra run keeps its heap; so does a process that joins hetra from Python.
    _core.keep_host_heap()
    context = _core.rank_from_environment()
    keep = []
    if context is None:
        context = _core.RankContext()  # a world of one
    elif context.launcher == "torchrun" and _under_torchrun() and "HETRA_STORE" not in os.environ:
        torch_store = _torch_store(timeout)
        context, server = publish_store(torch_store, context, timeout)
        keep += [torch_store, server]
    if context.world_size > 1 and context.store_address:
        host, port = context.store_address.rsplit(":", 1)
        context.store_address = f"{_connectable(host)}:{port}"
    job = _core.connect_job_store(context, timeout)
    listen = _core.listen_address_for(context) if context.world_size > 1 else ""
    comm = _core.Communicator(job.store, context.rank, context.world_size, transport=transport,
                              timeout=timeout, listen_address=listen)
    _world = World(context, job, comm, keep)
    return _world


def world():
    if _world is None:
        raise RuntimeError("hetra.torch is not initialised: call hetra.torch.init() first")
    return _world


@atexit.register  # the job is left while the interpreter is intact (see backend._live_groups)
def shutdown():
    """Leaves the job: drops the communicator (its operations in flight complete first) and the
    store (a later init() joins again)."""
    global _world
    _world = None


def rank():
    return world().comm.rank


def size():
    return world().comm.size


def local_rank():
    return world().context.local_rank
