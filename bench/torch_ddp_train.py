#!/usr/bin/python3
"""Peer benchmark: PyTorch DistributedDataParallel (Gloo) training on emulated heterogeneous CPU devices.

The same job as `hetra run examples/fashion_mnist_hetero.toml`, the way a PyTorch user runs it: Fashion-MNIST,
an MLP 784-512-512-10 (ReLU), SGD with Nesterov momentum, one rank per device, DistributedDataParallel with its
default buckets over Gloo on 127.0.0.1. Two splits of the global batch (--split):
  equal         what DDP users get: 512 over 3 ranks -> 171, 171, 170, whatever the devices' speeds. DDP
                averages the ranks' gradients, which is the gradient of the global batch only when every
                rank holds the same number of samples.
  proportional  what a careful user hand-rolls: a static split proportional to the known speeds 1/s_i (largest
                remainders, at least one sample each), and each rank's loss multiplied by b_i*N/B, so that
                DDP's average of the ranks' gradients is again the gradient of the global batch.

Emulation, the rule hetra applies (src/device/slowdown.h, docs/benchmarks.md): a device of slowdown s runs its
real compute phase (gather its samples, forward, backward, loss.item()) of CPU time t (capped by the phase's
wall time) and spends (s-1)*t more asleep. hetra sleeps after the phase and before it waits for its gradient
allreduce. DDP all-reduces bucket by bucket inside backward() and returns only when all are done, so the
fair place for the sleep is before the forward (--emulate before-forward, the default): the rank sleeps
(s-1)*t of its previous phase, then runs forward and backward at full speed, so its gradients become ready
when those of a device s times slower would, and its communication is as exposed as hetra's, no more.
Two other placements, for reference only: --emulate bucket applies the rule before each bucket's allreduce
(a comm hook calling DDP's own allreduce_hook), which also delays the buckets launched early, so it is
harsher than the rule; --emulate after-backward sleeps after backward(), whose wall time then includes DDP's
wait for the other ranks, hiding the communication in the sleep. t is the CPU time of the main thread, which
runs the whole computation with one intra-op thread and excludes Gloo's threads (--cpu-clock process counts
them too, i.e. charges communication as compute). Ranks use one intra-op thread
(OpenBLAS/OpenMP limited to one before torch is imported) and are pinned to CPUs as hetra pins emulated
devices: first-fit decreasing by duty cycle 1/s onto the allowed CPUs (1,2,4 on two CPUs: the s=1 rank alone
on the first, the s=2 and s=4 ranks on the second).

Throughput: rank 0 times each whole step (sampling, compute phase, optimizer step). The allreduce inside
backward() is a barrier of all ranks every step, so rank 0's steps follow the slowest rank. samples/s =
global batch x (steps - warm-up) / the summed time of the steps after warm-up (what hetra's metrics call the
final samples_per_s). --solo trains one rank (a plain model, no DDP) on the whole global batch, pinned to the
first allowed CPU: the solo speed of a device with the given slowdown.

Needs the Debian python3-torch, so run it with /usr/bin/python3:
  /usr/bin/python3 bench/torch_ddp_train.py --slowdowns 1,2,4 --steps 200 --json /tmp/ddp.json
  /usr/bin/python3 bench/torch_ddp_train.py --slowdowns 1,2,4 --split proportional --steps 200
  /usr/bin/python3 bench/torch_ddp_train.py --solo --slowdowns 2 --steps 100
"""

import argparse
import datetime
import gzip
import json
import os
import socket
import struct
import subprocess
import sys
import time

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # hetra's Fashion-MNIST normalisation


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slowdowns", default="1,2,4", help="one slowdown per rank (per device), comma separated")
    p.add_argument("--solo", action="store_true", help="one rank, no DDP, the whole global batch")
    p.add_argument("--global-batch", type=int, default=512)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the mean samples/s")
    p.add_argument("--lr", type=float, default=0.08)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--no-nesterov", dest="nesterov", action="store_false")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default=DATA, help="folder of the Fashion-MNIST IDX .gz files")
    p.add_argument("--cpu-clock", choices=["thread", "process"], default="thread",
                   help="CPU time t of the emulation: main thread (default) or whole process / threads")
    p.add_argument("--emulate", choices=["before-forward", "bucket", "after-backward"], default="before-forward",
                   help="DDP: sleep before the forward (default, the fair peer), before each bucket's allreduce "
                        "or after backward")
    p.add_argument("--split", choices=["equal", "proportional"], default="equal",
                   help="equal shares, or shares proportional to the speeds 1/s with the loss rescaled by b_i*N/B")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin ranks to CPUs")
    p.add_argument("--json", default=None, help="write the result (steps, per-rank stats) to this path")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before the launcher gives up")
    # Internal: set by the launcher for each worker.
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        a.slowdowns = [float(s) for s in a.slowdowns.split(",") if s.strip()]
    except ValueError:
        p.error("--slowdowns: comma separated numbers, e.g. 1,2,4")
    if not a.slowdowns or min(a.slowdowns) < 1:
        p.error("--slowdowns: at least one, each >= 1")
    if a.solo and len(a.slowdowns) != 1:
        p.error("--solo takes exactly one slowdown")
    if a.global_batch < len(a.slowdowns) or a.steps < 1 or not 0 <= a.warmup < a.steps:
        p.error("need --global-batch >= ranks, --steps >= 1 and 0 <= --warmup < --steps")
    return a


def equal_split(batch, n):
    """DDP's way: sizes differ by at most one, the larger ones first (512/3 -> 171, 171, 170)."""
    return [batch // n + (1 if r < batch % n else 0) for r in range(n)]


def proportional_split(batch, slowdowns):
    """Shares proportional to the speeds 1/s_i: the floors, then the remainder one each to the largest
    fractional parts (lower rank first on ties); every rank keeps at least one sample."""
    speeds = [1.0 / s for s in slowdowns]
    exact = [batch * v / sum(speeds) for v in speeds]
    shares = [max(1, int(x)) for x in exact]
    order = sorted(range(len(shares)), key=lambda r: (-(exact[r] - int(exact[r])), r))
    i = 0
    while sum(shares) < batch:
        shares[order[i % len(order)]] += 1
        i += 1
    while sum(shares) > batch:  # only when the floor of 1 pushed it over: take from the largest share
        shares[max(range(len(shares)), key=lambda r: shares[r])] -= 1
    return shares


def pack_by_duty(slowdowns, cpus):
    """hetra's packByDuty (tools/hetra/launch.cc), one thread per rank: ranks in decreasing duty 1/s, each
    onto the least loaded CPU (lowest first on ties); None when some CPU would exceed a full core."""
    duty = [1.0 / s for s in slowdowns]
    load = [0.0] * len(cpus)
    sets = [None] * len(duty)
    for r in sorted(range(len(duty)), key=lambda r: -duty[r]):  # sorted() is stable, as std::stable_sort
        c = min(range(len(cpus)), key=lambda c: load[c])
        load[c] += duty[r]
        if load[c] > 1.0 + 1e-9:
            return None
        sets[r] = [cpus[c]]
    return sets


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, = struct.unpack(">i", raw[:4])
    dims = struct.unpack(">" + "i" * (magic & 0xFF), raw[4:4 + 4 * (magic & 0xFF)])
    return raw[4 + 4 * len(dims):], dims


def load_fashion_mnist(torch, folder):
    pixels, dims = read_idx(os.path.join(folder, "train-images-idx3-ubyte.gz"))
    labels, _ = read_idx(os.path.join(folder, "train-labels-idx1-ubyte.gz"))
    x = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).reshape(dims[0], dims[1] * dims[2])
    x = ((x.float() / 255.0) - MEAN) / STD
    y = torch.frombuffer(bytearray(labels), dtype=torch.uint8).long()
    return x.contiguous(), y


class Emulator:
    """hetra's slowdown rule for one compute phase: with t the phase's CPU time (capped by its wall time),
    sleep (s-1)*t, less what earlier sleeps overran (hetra's src/device/slowdown.h). With before_forward,
    begin() sleeps (s-1)*t of the previous phase and end() sleeps nothing. Otherwise catch_up() applies the
    rule mid-phase, before DDP launches a bucket's allreduce; end() applies it to the rest of the phase,
    whose wall time includes DDP's wait for the allreduce, so only its CPU time is stretched."""

    MAX_DEBT_S = 0.005  # as hetra's device::SlowdownEmulator: late sleeps are paid back, up to this

    def __init__(self, slowdown, cpu_clock, before_forward=False):
        self.s, self.clock, self.before_forward = slowdown, cpu_clock, before_forward
        self.debt, self.last_t = 0.0, 0.0
        if slowdown > 1:  # as hetra: 1 ns timer slack on the thread that sleeps (PR_SET_TIMERSLACK)
            import ctypes
            ctypes.CDLL(None).prctl(29, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                                    ctypes.c_ulong(0))

    def begin(self):
        self.start, self.cpu_start = time.perf_counter(), self.clock()
        self.mark, self.slept, self.wall, self.cpu = None, 0.0, 0.0, 0.0
        if self.before_forward:  # the first phase has no previous one: no sleep (a warm-up step)
            self._sleep((self.s - 1) * self.last_t)

    def _sleep(self, seconds):
        if self.s <= 1 or seconds <= 0:
            return
        ask = seconds - self.debt
        if ask <= 0:
            self.debt = -ask
            return
        start = time.perf_counter()
        time.sleep(ask)
        actual = time.perf_counter() - start
        self.slept += actual
        self.debt = min(self.MAX_DEBT_S, max(0.0, actual - ask))

    def catch_up(self):
        wall = time.perf_counter() - self.start
        self._sleep(self.s * min(wall - self.slept, self.clock() - self.cpu_start) - wall)
        self.mark = self.clock()

    def end(self):
        now = self.clock()
        self.wall = time.perf_counter() - self.start - self.slept
        self.cpu = now - self.cpu_start
        self.last_t = min(self.wall, self.cpu)
        if self.before_forward:
            return
        if self.mark is None:  # no catch_up: the plain rule, as hetra applies it
            self._sleep(self.s * min(self.wall, self.cpu) - self.wall)
        else:
            self._sleep((self.s - 1) * (now - self.mark))

    def record(self):
        return {"phase_s": self.wall + self.slept, "wall_s": self.wall, "cpu_s": self.cpu, "sleep_s": self.slept}


def worker(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    world = 1 if a.solo else len(a.slowdowns)
    rank = a.rank
    slowdown = a.slowdowns[rank]
    dist = None
    if not a.solo:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=a.timeout))

    x_all, y_all = load_fashion_mnist(torch, a.data)
    torch.manual_seed(a.seed)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    if not a.solo:
        model = nn.parallel.DistributedDataParallel(model)  # default bucket_cap_mb (25) and first bucket
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, nesterov=a.nesterov)

    if a.solo:
        batches = [a.global_batch]
    elif a.split == "proportional":
        batches = proportional_split(a.global_batch, a.slowdowns)
    else:
        batches = equal_split(a.global_batch, world)
    begin = sum(batches[:rank])
    mine = batches[rank]
    # DDP divides the sum of the ranks' gradients by N; b_i*N/B makes it the global batch's mean gradient.
    # The equal split runs as plain DDP, unscaled.
    loss_scale = mine * world / a.global_batch if a.split == "proportional" and not a.solo else 1.0
    per_epoch = x_all.shape[0] // a.global_batch
    emu = Emulator(slowdown, time.thread_time if a.cpu_clock == "thread" else time.process_time,
                   before_forward=not a.solo and a.emulate == "before-forward")
    if not a.solo and a.emulate == "bucket":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def slowed_allreduce(state, bucket):
            emu.catch_up()
            return allreduce_hook(state, bucket)  # DDP's own path: divide by world size, allreduce

        model.register_comm_hook(None, slowed_allreduce)

    steps, loss_value = [], 0.0
    perm, perm_epoch = None, -1
    if dist:
        dist.barrier()
    for step in range(a.steps):
        step_start = time.perf_counter()
        epoch = step // per_epoch
        if epoch != perm_epoch:  # every rank draws the same permutation, then takes its own slice
            perm = torch.randperm(x_all.shape[0], generator=torch.Generator().manual_seed(a.seed * 1000 + epoch))
            perm_epoch = epoch
        first = (step % per_epoch) * a.global_batch + begin
        index = perm[first:first + mine]

        emu.begin()
        x = x_all.index_select(0, index)
        y = y_all.index_select(0, index)
        loss = F.cross_entropy(model(x), y)
        (loss * loss_scale if loss_scale != 1 else loss).backward()  # DDP all-reduces the buckets in here
        loss_value = loss.item()
        emu.end()

        opt.step()
        opt.zero_grad()
        steps.append({"step": step + 1, "step_time_s": time.perf_counter() - step_start, "loss": loss_value,
                      **emu.record()})

    measured = steps[a.warmup:]

    def mean(key):
        return sum(s[key] for s in measured) / len(measured)

    mine_stats = {"rank": rank, "slowdown": slowdown, "batch": mine, "cpus": sorted(os.sched_getaffinity(0)),
                  "phase_s": mean("phase_s"), "wall_s": mean("wall_s"), "cpu_s": mean("cpu_s"),
                  "sleep_s": mean("sleep_s"), "step_time_s": mean("step_time_s")}
    ranks = [mine_stats]
    if dist:
        ranks = [None] * world
        dist.all_gather_object(ranks, mine_stats)
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return 0

    total = sum(s["step_time_s"] for s in measured)
    samples_per_s = a.global_batch * len(measured) / total
    if not a.quiet:
        for s in steps:
            print(f"step {s['step']:5d}  loss {s['loss']:.4f}  step_time {s['step_time_s'] * 1e3:8.2f} ms  "
                  f"samples/s {a.global_batch / s['step_time_s']:10.0f}")
    for r in ranks:
        print(f"rank {r['rank']} slowdown {r['slowdown']:g} batch {r['batch']} cpus {r['cpus']}: compute "
              f"{r['wall_s'] * 1e3:.2f} ms wall ({r['cpu_s'] * 1e3:.2f} ms cpu) + sleep {r['sleep_s'] * 1e3:.2f} ms, "
              f"step {r['step_time_s'] * 1e3:.2f} ms")
    mode = "solo" if a.solo else f"DDP x{world} {a.split} split ({','.join(map(str, batches))})"
    print(f"{mode} slowdowns {','.join(f'{s:g}' for s in a.slowdowns)} global batch {a.global_batch}: "
          f"samples/s {samples_per_s:.0f} (mean over steps {a.warmup + 1}-{a.steps})", flush=True)
    if a.json:
        result = {"impl": "torch-solo" if a.solo else "torch-ddp", "torch": torch.__version__,
                  "slowdowns": a.slowdowns, "global_batch": a.global_batch, "batches": batches, "steps": a.steps,
                  "warmup": a.warmup, "lr": a.lr, "cpu_clock": a.cpu_clock, "split": "solo" if a.solo else a.split,
                  "emulate": "after-backward" if a.solo else a.emulate, "samples_per_s": samples_per_s,
                  "ranks": ranks, "step_records": steps}
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv, a):
    world = 1 if a.solo else len(a.slowdowns)
    cpus = sorted(os.sched_getaffinity(0))
    sets = pack_by_duty(a.slowdowns, cpus) if a.pin else None
    if a.pin and sets is None:
        print(f"torch_ddp_train: duty cycles {sum(1 / s for s in a.slowdowns):.2f} do not fit {len(cpus)} CPUs; "
              "not pinning (the numbers mean little)", file=sys.stderr)
    # Set before torch is imported in the child, so OpenBLAS and OpenMP size their pools to one thread.
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo")
    port = free_port()
    procs = []
    for r in range(world):
        pin = (lambda cpu_set: (lambda: os.sched_setaffinity(0, cpu_set)))(sets[r]) if sets else None
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv, "--rank", str(r),
                                       "--port", str(port)], env=env, preexec_fn=pin))
    deadline = time.monotonic() + a.timeout
    failed = 0
    try:
        # Poll them all: when one rank fails, the others would only notice at the Gloo timeout.
        while not failed and any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                print(f"torch_ddp_train: timed out after {a.timeout:.0f}s", file=sys.stderr)
                failed = 124
            time.sleep(0.05)
            for r, p in enumerate(procs):
                if p.poll() not in (None, 0) and not failed:
                    print(f"torch_ddp_train: rank {r} exited with status {p.returncode}", file=sys.stderr)
                    failed = p.returncode if p.returncode > 0 else 1
        if not failed:
            failed = next((p.returncode if p.returncode > 0 else 1 for p in procs if p.returncode), 0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return failed


def main():
    argv = sys.argv[1:]
    a = parse_args(argv)
    if a.rank is None:
        return launch(argv, a)
    return worker(a)


if __name__ == "__main__":
    sys.exit(main())
