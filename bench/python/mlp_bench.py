"""One rank of the Python comparison (bench/compare_python.sh): the MLP 784-512-512-10 on
Fashion-MNIST, global batch 512, one BLAS thread, in-memory tensors indexed by batch (x[idx]), on
emulated devices (--slowdowns, one factor per rank, default HETRA_SLOWDOWNS as `hetra launch
--slowdowns` sets it; --change STEP:RANK:FACTOR slows a device mid-run). Rank 0 prints one JSON
line: {"variant", "slowdowns", "steps", "seconds", "samples_per_s"}.

Variants:
  ddp-equal         DDP, equal split (what most scripts do)
  ddp-proportional  DDP, a static split proportional to the known speeds, the loss rescaled by
                    b_i * size / B so that DDP's mean gives the full batch's gradient
  hetra             hetra.torch: HeteroSampler + DistributedOptimizer, the balancer moving the split
DDP runs on --backend (gloo or hetra). Every variant applies the emulation's rule
(docs/benchmarks.md) alike, as hetra run does: loading the batch is the host's and not stretched;
the work of forward and backward is stretched to `slowdown` times its CPU time before each
gradient bucket leaves (a bucket leaves when a slow device would have made it), the rest of
backward after the last one, and the optimizer step after it runs. A DDP rank does it in its comm
hook and around opt.step(); hetra.torch's DistributedOptimizer does the same itself.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "python"))
import fashion_mnist  # noqa: E402

import hetra.torch as ht  # noqa: E402
from hetra import _core  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--variant", required=True, choices=["ddp-equal", "ddp-proportional", "hetra"])
parser.add_argument("--backend", default="gloo", choices=["gloo", "hetra"])
parser.add_argument("--slowdowns", default=os.environ.get("HETRA_SLOWDOWNS", ""))
parser.add_argument("--change", default="", help="STEP:RANK:FACTOR")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--warmup", type=int, default=20)
parser.add_argument("--global-batch", type=int, default=512)
parser.add_argument("--label", default="", help="a note for the summary (e.g. the heap's setting)")
parser.add_argument("--optimizer", default="torch", choices=["torch", "hetra"],
                    help="torch.optim.SGD, or hetra.torch.optim.SGD (the same with a one-pass step)")
args = parser.parse_args()
torch.set_num_threads(1)

ht.init()
rank, size = ht.rank(), ht.size()
slowdowns = [float(s) for s in args.slowdowns.split(",")] if args.slowdowns else [1.0] * size
if len(slowdowns) != size:
    sys.exit(f"--slowdowns has {len(slowdowns)} factors for {size} ranks")
change = [float(v) for v in args.change.split(":")] if args.change else None


def slowdown_at(step):
    if change and step >= change[0] and rank == int(change[1]):
        return change[2]
    return slowdowns[rank]


x, y = fashion_mnist.load("train")
torch.manual_seed(0)
model = fashion_mnist.mlp()
B = args.global_batch
SGD = ht.optim.SGD if args.optimizer == "hetra" else torch.optim.SGD

if args.variant == "hetra":
    sampler = ht.HeteroSampler(len(x), B, seed=0)
    opt = ht.DistributedOptimizer(SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  model, sampler=sampler)
    ht.broadcast_parameters(model.state_dict())
    trained = model

    def batches():
        while True:
            yield from sampler
else:
    dist.init_process_group(args.backend)
    trained = torch.nn.parallel.DistributedDataParallel(model)
    opt = SGD(trained.parameters(), lr=0.05, momentum=0.9)
    if args.variant == "ddp-equal":
        shares = [B // size + (1 if r < B % size else 0) for r in range(size)]
    else:
        speeds = [1.0 / s for s in slowdowns]
        shares = [max(1, round(B * v / sum(speeds))) for v in speeds]
        shares[0] += B - sum(shares)
    stream = _core.GlobalSampler(len(x), B, 0)
    emulator = _core.SlowdownEmulator()
    if max(slowdowns[rank], change[2] if change and rank == int(change[1]) else 1.0) > 1.0:
        emulator.tighten_timer_slack()  # as DistributedOptimizer and hetra run do
    phase = {}

    def end_segment():
        # The compute since the last mark, stretched to `slowdown` times its CPU work.
        s = slowdown_at(phase["step"])
        if s > 1.0:
            emulator.end_phase(s, time.perf_counter() - phase["wall"],
                               time.thread_time() - phase["work"])
        phase.update(wall=time.perf_counter(), work=time.thread_time())

    def emulating_allreduce(state, bucket):
        end_segment()  # the work so far, stretched before this bucket leaves
        tensor = bucket.buffer().div_(size)
        work = dist.all_reduce(tensor, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    trained.register_comm_hook(None, emulating_allreduce)

    def batches():
        step = 0
        while True:
            yield stream.indices(step, shares, rank)
            step += 1

start = None
for step, indices in zip(range(args.warmup + args.steps), batches()):
    if step == args.warmup:
        start = time.perf_counter()
    if args.variant == "hetra":
        opt.slowdown = slowdown_at(step)
    opt.zero_grad(set_to_none=True)  # torch >= 2.0's default, for every variant alike
    inputs, targets = x[indices], y[indices]
    if args.variant != "hetra":
        # Loading the batch is the host's work, not stretched (hetra.torch's segment, too, starts
        # at the forward).
        phase.update(step=step, wall=time.perf_counter(), work=time.thread_time())
    loss = torch.nn.functional.cross_entropy(trained(inputs), targets)
    if args.variant == "ddp-proportional":
        loss = loss * (len(indices) * size / B)  # DDP divides by size: this makes it b_i / B
    loss.backward()
    if args.variant == "hetra":
        opt.step()  # stretches its own optimizer step
    else:
        phase.update(wall=time.perf_counter(), work=time.thread_time())
        opt.step()
        end_segment()
seconds = time.perf_counter() - start
if rank == 0:
    print(json.dumps({"variant": args.variant, "backend": args.backend if args.variant != "hetra"
                      else "hetra.torch", "optimizer": args.optimizer,
                      "label": args.label,
                      "slowdowns": ",".join(f"{f:g}" for f in slowdowns), "change": args.change,
                      "steps": args.steps, "seconds": round(seconds, 3),
                      "samples_per_s": round(args.steps * B / seconds, 1),
                      # the split of the last step (the balancer's, for hetra.torch)
                      "split": (sampler.schedule.shares_at(step) if args.variant == "hetra"
                                else shares)}), flush=True)
if args.variant != "hetra":
    # Torch 1.13 races with the interpreter's exit here: after a bucket's future completes, the
    # Gloo worker thread that ran its Python callback still takes the GIL to release it, and a
    # thread asking for the GIL during finalisation is ended by pthread_exit inside a noexcept
    # frame, which aborts the rank after its work is done ("terminate called without an active
    # exception", seen in about one run in four; destroy_process_group() does not help: DDP
    # holds the group). Every operation has completed: leave without finalising.
    sys.stdout.flush()
    os._exit(0)
