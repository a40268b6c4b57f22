"""DistributedOptimizer: gradients all-reduced through hetra as backward produces them (Horovod's
shape), weighted exactly by each rank's share of the global batch.

Vocabulary: a *bucket* is a run of parameters (in the reverse of their order, the order backward
produces their gradients; one dtype) whose gradients travel as one flat buffer of at most
`bucket_bytes`; it is *launched* (its allreduce started) once every one of its gradients is in.

Exact weighting: the user writes an ordinary mean loss over the rank's b_i samples, so its gradient
is g_i = (1/b_i) sum of the per-sample gradients; the full batch's is G = (1/B) sum over all
samples = sum_i (b_i / B) g_i. Each rank scales its buffer by b_i / B and the allreduce sums, so
every rank receives the same bytes (and, with the same parameters, takes the same step).
"""
import contextlib
import os
import time

import torch

from hetra import _core
from hetra.torch import _runtime, ops
from hetra.torch.sampler import HeteroSampler


class _Bucket:
    """A packed bucket's gradients live in one flat buffer: each parameter's .grad becomes a view
    of its slice (DDP's gradient_as_bucket_view), so the allreduce runs in place and its result is
    the gradient, with no copy back. A direct bucket (one large parameter) is all-reduced where
    backward left its gradient, with no copy at all (as hetra run's DataParallel)."""

    def __init__(self, params, direct=False):
        self.params = params
        self.direct = direct
        self.flat = None
        self.views = []
        if not direct:
            self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype)
            offset = 0
            for p in params:
                self.views.append(self.flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.numel = sum(p.numel() for p in params)
        self.ready = 0
        self.work = None
        self.residual = None


def _grad_ready_hook(param, callback):
    """Calls callback() once param.grad holds this backward's gradient."""
    if hasattr(param, "register_post_accumulate_grad_hook"):  # torch >= 2.1
        return param.register_post_accumulate_grad_hook(lambda p: callback())
    # torch 1.13: the AccumulateGrad node's hook runs after it wrote param.grad (Horovod's way).
    accumulator = param.expand_as(param).grad_fn.next_functions[0][0]
    handle = accumulator.register_hook(lambda *unused: callback())
    return (accumulator, handle)  # the node must stay alive for its hook to stay registered


def _slowdown_from_environment(comm):
    text = os.environ.get("HETRA_SLOWDOWNS", "")
    if not text:
        return 1.0
    try:
        factors = [float(f) for f in text.split(",")]
    except ValueError:
        raise ValueError(f"HETRA_SLOWDOWNS={text!r} is not a list of numbers") from None
    if len(factors) != comm.size:
        raise ValueError(f"HETRA_SLOWDOWNS={text!r} has {len(factors)} factors; allowed: one per "
                         f"rank ({comm.size})")
    return factors[comm.rank]


class DistributedOptimizer:
    """Wraps `optimizer`: step() first waits for the averaged gradients, then steps.

    `sampler`: the HeteroSampler whose shares weight the gradients (default: the one made last;
    without any, every rank weighs 1/size, as DDP does). `compression`: the wire format of
    float32 gradients (none, fp16, bf16, fp8-e4m3, fp8-e5m2), with error feedback, for buckets of
    at least `compression_min_bytes`. `slowdown`: an
    emulated slow device (docs/benchmarks.md): each compute phase is stretched to `slowdown` times
    its CPU work before this rank's gradients leave, so its peers wait as they would for a slow
    device; without it, this rank's factor in HETRA_SLOWDOWNS (one per rank, e.g. 1,2,4), else 1.
    With `model`, a step's device work begins at its first forward: loading the batch before it
    is the host's, timed for the balancer but not stretched (as in `hetra run`).
    The compute time of every step feeds the sampler's balancer.
    `resync_every`: every that many steps rank 0's parameters (and the model's buffers) replace
    every rank's after the update, and `replica_drifts` gets (step, the largest difference any
    rank's element had from rank 0's): ranks whose devices round differently (a CUDA rank beside
    CPU ranks) take the same gradients but drift apart (`hetra run`'s train.resync_every);
    0 (default) never.
    """

    def __init__(self, optimizer, model=None, sampler=None, bucket_bytes=4 << 20,
                 direct_bytes=256 << 10, compression="none", compression_min_bytes=65536,
                 slowdown=None, comm=None, resync_every=0):
        self.optimizer = optimizer
        self._comm = comm if comm is not None else _runtime.init().comm
        self._sampler = sampler if sampler is not None else HeteroSampler.latest()
        self._compression = compression
        self._compression_min_bytes = compression_min_bytes
        # May change between steps (a device that slows down mid-run).
        self.slowdown = slowdown if slowdown is not None else _slowdown_from_environment(self._comm)
        self._emulator = _core.SlowdownEmulator()
        params = [p for group in optimizer.param_groups for p in group["params"]
                  if p.requires_grad]
        if model is not None:
            known = {id(p) for p in model.parameters()}
            strangers = [i for i, p in enumerate(params) if id(p) not in known]
            if strangers:
                raise ValueError(f"the optimizer's parameters {strangers} are not the model's")
        if not (isinstance(resync_every, int) and resync_every >= 0):
            raise ValueError(f"resync_every={resync_every!r}; allowed: an int >= 0 (0: never)")
        self._resync_every = resync_every
        self._resynced = params + (list(model.buffers()) if model is not None else [])
        self.replica_drifts = []  # (step, drift) of every re-synchronisation
        self._buckets = self._make_buckets(params, bucket_bytes, direct_bytes)
        self._launched = 0  # buckets launched this step, in list order
        self._hooks = []
        self._forward_seen = False  # this step's first forward ran
        if model is not None:
            self._hooks.append(model.register_forward_pre_hook(self._forward_begins))
        for bucket in self._buckets:
            for p in bucket.params:
                self._hooks.append(_grad_ready_hook(p, lambda b=bucket: self._grad_ready(b)))
        self._syncing = True
        self._synchronized = False  # this step's gradients are in (synchronize() ran)
        self._compute_wall = 0.0  # seconds of this step's compute phase, stretched
        self._pending_times = None  # (step, every rank's compute seconds, their allgather)
        self.steps = 0
        self.compute_seconds = []  # this rank's compute time of each step (the balancer's input)
        self.step_cost_seconds = []  # this rank's optimizer step of each step, stretched
        # When this step's compute phase began (the last step() ended).
        self._step_start = self._restart_segment()

    @staticmethod
    def _make_buckets(params, bucket_bytes, direct_bytes):
        # hetra run's layout (src/train/data_parallel.cc). In backward order, a parameter of at
        # least direct_bytes is a bucket of its own, all-reduced the moment backward made it;
        # smaller ones are packed up to bucket_bytes (one dtype), a packed bucket staying open
        # across direct ones. The launch order is the order the buckets complete in, a packed one
        # counted complete only after the parameter that follows its last (a bias comes with its
        # layer's weight): ranks that finished early then wait inside the large operation the last
        # rank has not reached, with their part of it staged, not behind a tiny one.
        drafts, open_draft = [], None  # [params, bytes, closed_at, direct]
        direct_bytes = min(direct_bytes, bucket_bytes)
        for position, p in enumerate(reversed(params)):
            nbytes = p.numel() * p.element_size()
            if nbytes >= direct_bytes:
                drafts.append([[p], nbytes, 2 * position, True])
                continue
            if open_draft is not None and (open_draft[1] + nbytes > bucket_bytes
                                           or open_draft[0][0].dtype != p.dtype):
                open_draft = None
            if open_draft is None:
                open_draft = [[], 0, 0, False]
                drafts.append(open_draft)
            open_draft[0].append(p)
            open_draft[1] += nbytes
            open_draft[2] = 2 * position + 3
        drafts.sort(key=lambda d: d[2])  # stable: equal positions keep the walk's order
        return [_Bucket(d[0], direct=d[3]) for d in drafts]

    @property
    def slowdown(self):
        return self._slowdown

    @slowdown.setter
    def slowdown(self, factor):
        if not factor >= 1.0:
            raise ValueError(f"slowdown={factor}; allowed: >= 1 (1: the real speed)")
        if factor > 1.0 >= getattr(self, "_slowdown", 1.0):  # once, when it first slows down
            # The emulation sleeps in short pieces on this (the training) thread, each up to the
            # kernel's default 50 us timer slack late; hetra run's slowed ranks tighten it too.
            _core.SlowdownEmulator.tighten_timer_slack()
        self._slowdown = float(factor)

    def _restart_segment(self):
        """Marks the start of a compute segment (docs/benchmarks.md, "every compute segment"):
        device work up to the next communication. Returns its wall-clock start."""
        self._segment_wall = time.perf_counter()
        self._segment_work = time.thread_time()
        return self._segment_wall

    def _end_segment(self):
        """An emulated slow device sleeps what the segment's CPU work owes at its slowdown, right
        after the segment and before the communication that follows; the next segment starts."""
        if self._slowdown > 1.0:
            self._emulator.end_phase(self._slowdown, time.perf_counter() - self._segment_wall,
                                     time.thread_time() - self._segment_work)
        return self._restart_segment()

    def _forward_begins(self, module, inputs):
        # The host's work since the last step (the sampler, loading the batch) is not the
        # device's: the emulated device's segment starts here, the step's compute time does not.
        if not self._forward_seen:
            self._forward_seen = True
            self._restart_segment()

    def _weight(self):
        if self._sampler is None:
            return 1.0 / self._comm.size
        return self._sampler.share(self.steps) / self._sampler.global_batch

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate into .grad (micro-batches of one step); the
        first backward after it sends the accumulated gradients (DDP's no_sync)."""
        self._syncing = False
        try:
            yield
        finally:
            self._syncing = True

    def _grad_ready(self, bucket):
        if not self._syncing:
            return
        bucket.ready += 1
        if bucket.ready > len(bucket.params):
            raise RuntimeError("a gradient arrived twice before step(): call step() after each "
                               "backward(), or accumulate micro-batches inside no_sync()")
        self._launch_complete_buckets()

    def _launch_complete_buckets(self):
        # In list order on every rank (the collectives pair up by order), each as soon as it is
        # complete, during backward. A bucket leaves when an emulated slow device would have made
        # its gradients: the work so far is stretched first (docs/benchmarks.md, "every compute
        # segment"; hetra run's DataParallel does the same).
        while (self._launched < len(self._buckets)
               and self._buckets[self._launched].ready == len(self._buckets[self._launched].params)):
            self._end_segment()
            self._launch(self._buckets[self._launched])
            self._launched += 1

    def _launch(self, bucket):
        # This rank's weight multiplies its gradients inside the allreduce (a premultiplied sum,
        # on hetra's communication thread), so the computing thread makes no pass over them.
        with torch.no_grad():
            if bucket.direct:
                p = bucket.params[0]
                if p.grad is None:  # unused in this step's graph: it contributes nothing
                    p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                elif not p.grad.is_contiguous():
                    p.grad = p.grad.contiguous()
                buffer = p.grad
            else:
                # A gradient backward accumulated into its slice (kept from the last step) is in
                # place; one backward made anew (after zero_grad() set it to None) is copied in.
                for p, view in zip(bucket.params, bucket.views):
                    grad = p.grad
                    if grad is None:
                        view.zero_()
                    elif grad.data_ptr() != view.data_ptr():
                        view.copy_(grad)
                    p.grad = view
                buffer = bucket.flat
        if self._compression != "none" and bucket.residual is None:
            bucket.residual = torch.zeros(bucket.numel, dtype=torch.float32)
        residual = bucket.residual if buffer.dtype == torch.float32 else None
        bucket.work = ops.allreduce(buffer, "sum", compression=self._compression,
                                    residual=residual, min_bytes=self._compression_min_bytes,
                                    scale=self._weight(), comm=self._comm)

    def synchronize(self):
        """Ends this step's compute phase (on a slow device, the rest of it is stretched), then
        waits until every bucket's allreduce is done and the gradients hold their results; a later
        step() does not send them again."""
        if self._synchronized:
            return
        # What backward computed after its last bucket left is stretched too.
        self._end_segment()
        self._compute_wall = self._segment_wall - self._step_start
        # A bucket with a parameter this step's graph did not use is incomplete: it leaves now.
        while self._launched < len(self._buckets):
            self._launch(self._buckets[self._launched])
            self._launched += 1
        for bucket in self._buckets:
            bucket.work.wait()
            bucket.ready, bucket.work = 0, None
        self._launched = 0
        self._synchronized = True

    def step(self, closure=None):
        self.synchronize()
        wall = self._compute_wall
        self.compute_seconds.append(wall)
        self._drain_times()
        # The optimizer step is a compute segment of its own, stretched like the others; its time
        # is the rank's step cost, which every share pays alike (the balancer counts it).
        start = self._restart_segment()
        result = self.optimizer.step(closure)
        self._step_start = self._end_segment()
        step_cost = self._step_start - start
        self.step_cost_seconds.append(step_cost)
        if self._sampler is not None and self._sampler.balancing:
            self._share_times(wall, step_cost)
        if self._resync_every and (self.steps + 1) % self._resync_every == 0:
            self.replica_drifts.append((self.steps, self._resynchronize()))
            # Communication, not the device's compute: the next step's segment starts after it.
            self._step_start = self._restart_segment()
        self.steps += 1
        self._synchronized = False
        self._forward_seen = False
        return result

    def _resynchronize(self):
        """Rank 0's parameters and buffers replace this rank's, received into copies first to
        measure how far this rank's had drifted; returns the largest drift over every rank."""
        root = self._comm.rank == 0
        with torch.no_grad():
            received = [t if root else torch.empty_like(t) for t in self._resynced]
            for work in [ops.broadcast(r, 0, comm=self._comm) for r in received]:
                work.wait()
            drift = torch.zeros(1, dtype=torch.float64)
            if not root:
                for own, theirs in zip(self._resynced, received):
                    if own.numel():
                        drift = torch.maximum(drift, (theirs.double() - own.double()).abs().max())
                    own.copy_(theirs)
            ops.allreduce(drift, "max", comm=self._comm).wait()
        return drift.item()

    def _share_times(self, wall, step_cost):
        # All-gathers this step's compute time and step cost in the background; the balancer gets
        # them at the next step (its gradients' allreduces run after it, so it is done by then).
        # Waiting for it here would add a synchronisation of all ranks, with every rank's
        # optimizer step on the critical path, to every step (the C++ trainer shares its timings
        # the same way).
        mine = torch.tensor([wall, step_cost], dtype=torch.float64)
        everyone = torch.empty(2 * self._comm.size, dtype=torch.float64)
        self._pending_times = (self.steps, everyone,
                               ops.allgather(everyone, mine, comm=self._comm))

    def _drain_times(self):
        """Feeds the pending step's all-gathered times to the sampler's balancer."""
        if self._pending_times is None:
            return
        step, everyone, work = self._pending_times
        self._pending_times = None
        work.wait()
        times = everyone.tolist()
        self._sampler.record(step, times[0::2], now=self.steps, step_costs=times[1::2])

    def zero_grad(self, set_to_none=True):
        """As torch >= 2.0's: gradients to None by default, so that backward hands over the
        tensors it makes instead of adding them to zeros (one pass less per step);
        set_to_none=False zeroes them."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state)


def broadcast_parameters(params, root_rank=0, comm=None):
    """Every rank gets root's values, in place: `params` is a state_dict, named_parameters() or
    a list of tensors."""
    if isinstance(params, dict):
        tensors = list(params.values())
    else:
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    with torch.no_grad():
        works = [ops.broadcast(t.data, root_rank, comm) for t in tensors]
        for work in works:
            work.wait()


def broadcast_optimizer_state(optimizer, root_rank=0, comm=None):
    """Every rank's optimizer takes root's state (steps, moments, hyper-parameters)."""
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    state = ops.broadcast_object(inner.state_dict(), root_rank, comm)
    inner.load_state_dict(state)
