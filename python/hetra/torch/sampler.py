"""HeteroSampler: this rank's balanced share of every global step, as a DataLoader batch_sampler.

Vocabulary (src/train/sampler.h): the *stream* is one seeded permutation of the dataset per epoch;
global step s takes stream positions [s*B, (s+1)*B) and rank i the contiguous slice after ranks
0..i-1's shares, so every sample is used once per epoch whatever the split. The *split* (each rank's
share b_i, sum B, each >= 1) comes from a schedule of changes, each taking effect at a step all
ranks know in advance: a change decided after step t applies from step t + 1 + lookahead, and
`lookahead` must cover the loader's prefetch depth, so that batches already handed to the loader
stay valid (a change that would invalidate one raises instead).
"""

import bisect

from hetra import _core
from hetra.torch import _runtime, ops

_NO_CAP = 1 << 62  # "no memory cap" for the balancer


class SplitSchedule:
    """Each rank's share from a step on: a list of (first step, shares), steps increasing."""

    def __init__(self, shares):
        self._changes = [(0, list(shares))]
        # The first steps alone, for a binary search: a long run's balancer changes the split
        # hundreds of times, and every step looks its shares up several times.
        self._firsts = [0]

    def shares_at(self, step):
        # The last change that starts at or before `step` (a step before 0 has the first split).
        return self._changes[max(bisect.bisect_right(self._firsts, step) - 1, 0)][1]

    def change(self, first_step, shares):
        if first_step <= self._firsts[-1]:
            raise ValueError(f"a split change at step {first_step} must follow the last one "
                             f"(step {self._firsts[-1]})")
        self._changes.append((first_step, list(shares)))
        self._firsts.append(first_step)

    @property
    def changes(self):
        return list(self._changes)


def _equal_split(total, ranks):
    # The remainder goes to the lowest ranks, as the balancer's equal plan does.
    return [total // ranks + (1 if r < total % ranks else 0) for r in range(ranks)]


def _at_least_one(shares):
    """The balancer may plan no samples for a very slow rank; hetra.torch keeps every rank in every
    step (its step() and collectives run anyway), with one sample from the largest share."""
    shares = list(shares)
    for r, share in enumerate(shares):
        if share < 1:
            largest = max(range(len(shares)), key=lambda i: shares[i])
            shares[largest] -= 1 - share
            shares[r] = 1
    return shares


class HeteroSampler:
    """Yields one list of dataset indices per global step: this rank's share of it.

    `batches`: a fixed split (one share per rank, summing to `global_batch`); without it hetra's
    balancer moves the split from the compute times DistributedOptimizer measures (mode from
    `balance` or HETRA_BALANCE_MODE: dynamic, static, equal). One pass over the sampler is
    len(sampler) = dataset_len // global_batch steps; the stream continues across passes, so a
    second `for batch in loader` goes on with the next steps. Making one is a collective (it
    all-gathers the memory caps): every rank makes its samplers in the same order.
    """

    _latest = None  # DistributedOptimizer's default sampler: the one made last

    def __init__(self, dataset_len, global_batch, seed=0, batches=None, lookahead=4,
                 balance=None, max_micro_batch=None, comm=None):
        self._comm = comm if comm is not None else _runtime.init().comm
        size = self._comm.size
        if global_batch < size:
            raise ValueError(f"global_batch={global_batch} is below the world size {size}: every "
                             f"rank needs at least one sample per step")
        if dataset_len < global_batch:
            raise ValueError(f"dataset_len={dataset_len} is below global_batch={global_batch}")
        if lookahead < 1:
            raise ValueError(f"lookahead={lookahead}; allowed: >= 1 (the loader's prefetch "
                             f"depth, at least)")
        self.global_batch = int(global_batch)
        self.lookahead = int(lookahead)
        self._stream = _core.GlobalSampler(int(dataset_len), self.global_batch, int(seed))
        # Every rank's memory cap (most samples per micro-batch), known to all: the balancer plans
        # with them, and micro_batches() cuts this rank's share by its own.
        mine = float(max_micro_batch) if max_micro_batch is not None else float(_NO_CAP)
        if max_micro_batch is not None and max_micro_batch < 1:
            raise ValueError(f"max_micro_batch={max_micro_batch}; allowed: >= 1 or None (no cap)")
        self.max_micro_batches = [int(row[0]) for row in ops.allgather_floats([mine], self._comm)]
        self._balancer = None
        if batches is not None:
            batches = [int(b) for b in batches]
            if len(batches) != size or sum(batches) != global_batch or min(batches) < 1:
                raise ValueError(f"batches={batches}: allowed: {size} shares (one per rank), "
                                 f"each >= 1, summing to global_batch={global_batch}")
            initial = batches
        else:
            # "" leaves the mode to HETRA_BALANCE_MODE, which the balancer reads (its one reader).
            mode = balance if balance is not None else ""
            self._balancer = _core.Balancer(self.global_batch, self.max_micro_batches, mode)
            initial = [r.batch for r in self._balancer.plan.ranks]
            if initial != _equal_split(self.global_batch, size):  # the balancer's own contract
                raise RuntimeError(f"the balancer's first plan {initial} is not the equal split")
        self.schedule = SplitSchedule(initial)
        self._next_step = 0  # the next step this sampler hands out
        HeteroSampler._latest = self

    @classmethod
    def latest(cls):
        return cls._latest

    @property
    def balancing(self):
        return self._balancer is not None

    def __len__(self):
        return self._stream.dataset_size // self.global_batch

    def __iter__(self):
        for _ in range(len(self)):
            yield self.indices(self._next_step)
            self._next_step += 1

    def indices(self, step):
        """This rank's dataset indices at global `step`."""
        return self._stream.indices(step, self.schedule.shares_at(step), self._comm.rank)

    def micro_batches(self, indices):
        """`indices` (one step's share) cut into micro-batches of at most this rank's cap (the
        balancer's micro-batch when it plans one). Accumulate them in one step:

            for i, micro in enumerate(batches := sampler.micro_batches(indices)):
                with opt.no_sync() if i < len(batches) - 1 else contextlib.nullcontext():
                    (loss(x[micro], y[micro]) * len(micro) / len(indices)).backward()
            opt.step()

        Scaling each micro-batch's mean loss by its part of the share keeps the sum the share's
        mean loss, so the weighting stays exact."""
        cap = self.max_micro_batches[self._comm.rank]
        if self._balancer is not None:
            cap = min(cap, self._balancer.plan.ranks[self._comm.rank].micro_batch)
        indices = list(indices)
        return [indices[i:i + cap] for i in range(0, len(indices), cap)]

    def share(self, step):
        """This rank's share of global `step` (its weight in the gradient is share / global_batch)."""
        return self.schedule.shares_at(step)[self._comm.rank]

    def record(self, step, seconds_per_rank, now=None, step_costs=None):
        """Every rank's compute seconds of `step` (alike on every rank): the balancer's input.
        `step_costs`: every rank's seconds outside its samples that any share pays alike (its
        optimizer step), if measured. `now`: the step being taken when they arrive (default:
        `step`; DistributedOptimizer hands them over one step later). A new split applies from
        now + 1 + lookahead."""
        if self._balancer is None:
            return
        shares = self.schedule.shares_at(step)
        for r, seconds in enumerate(seconds_per_rank):
            self._balancer.observe(r, shares[r], float(seconds))
        for r, seconds in enumerate(step_costs or []):
            self._balancer.observe_step_cost(r, float(seconds))
        if self._balancer.end_step(step):
            first = (step if now is None else now) + 1 + self.lookahead
            if first < self._next_step:
                raise RuntimeError(f"the split changes at step {first} but the loader already "
                                   f"took step {self._next_step - 1}: make lookahead (now "
                                   f"{self.lookahead}) at least the loader's prefetch depth")
            self.schedule.change(first, _at_least_one([r.batch for r in self._balancer.plan.ranks]))

    @property
    def plan(self):
        """The balancer's current plan (None with a fixed split)."""
        return self._balancer.plan if self._balancer is not None else None
