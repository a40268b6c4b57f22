#!/usr/bin/python3
"""Peer benchmark: torch.distributed all_reduce with the Gloo backend (float32, sum), nccl-tests style.

Same flags, table and JSON as `hetra bench allreduce` and bench/peers/mpi_allreduce.c, so the three can be
compared side by side. The launcher spawns --np worker processes of this script on 127.0.0.1 (Gloo always
talks TCP, also between processes of one host), each with one intra-op thread.

Vocabulary: size = bytes of one rank's buffer; count = size / 4 floats; algbw = size / time;
busbw = algbw * 2(n-1)/n. Before the sweep, -w warm-up calls at the largest and the smallest size (as
nccl-tests does). Timing: before every iteration the buffer is refilled (untimed, because Gloo
reduces in place) and all ranks meet in a barrier; each rank then times its own all_reduce; the iteration's
time is the max over ranks and the reported time is the median over the -n iterations.
Check (-c 1): inputs are small integers distinct per rank and element, so the sum is exact in any order;
the result of the first iteration is compared element by element.

Needs the Debian python3-torch, so run it with /usr/bin/python3:
  /usr/bin/python3 bench/peers/torch_allreduce.py --np 2 -b 8 -e 64M -f 2 -w 5 -n 20 -c 1 --json out.json
"""

import argparse
import datetime
import os
import socket
import subprocess
import sys
import time


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip()
    mult = units.get(text[-1].lower(), 1)
    value = float(text[:-1] if text[-1].lower() in units else text)
    return int(value * mult)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="number of ranks (processes)")
    p.add_argument("-b", dest="min_bytes", type=parse_size, default=8)
    p.add_argument("-e", dest="max_bytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", dest="factor", type=float, default=2.0)
    p.add_argument("-w", dest="warmup", type=int, default=5)
    p.add_argument("-n", dest="iters", type=int, default=20)
    p.add_argument("-c", dest="check", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=["float32"])
    p.add_argument("--json", default=None, help="write the rows as a JSON list to this path")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before the launcher gives up")
    # Internal: set by the launcher for each worker.
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.factor <= 1 or a.iters < 1 or a.warmup < 0 or a.min_bytes < 4 or a.max_bytes < a.min_bytes or a.np < 1:
        p.error("need -f > 1, -n >= 1, -w >= 0, 4 <= -b <= -e, --np >= 1")
    return a


def sizes(a):
    out, s = [], float(a.min_bytes)
    while s <= a.max_bytes * (1 + 1e-9):
        out.append((int(s) // 4) * 4)
        s *= a.factor
    return out


def input_values(torch, count, rank):
    # Small integers in [-30, 30], the same formula as the MPI peer.
    idx = torch.arange(count, dtype=torch.int64)
    return ((idx * 7 + rank * 13) % 61 - 30).to(torch.float32)


def worker(a):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = a.rank, a.np
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{a.port}",
        rank=rank,
        world_size=n,
        timeout=datetime.timedelta(seconds=a.timeout),
    )
    max_count = a.max_bytes // 4
    src = input_values(torch, max_count, rank)
    buf = torch.zeros(max_count, dtype=torch.float32)  # touch pages outside the timed loop
    bus_factor = 2.0 * (n - 1) / n
    rows, total_wrong = [], 0
    if rank == 0:
        print(f"# torch.distributed gloo all_reduce float32 sum, {n} ranks, warmup {a.warmup}, "
              f"iters {a.iters}, check {a.check}, torch {torch.__version__}")
        print("#%12s %12s %8s %12s %12s %12s %8s" %
              ("size(B)", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"))
        sys.stdout.flush()
    # Like nccl-tests, warm up at the largest and the smallest size before the sweep, so the first row does
    # not pay for TCP slow start, first-touch faults and Gloo's lazy buffer setup.
    for count in (max_count, sizes(a)[0] // 4):
        for _ in range(a.warmup):
            dist.all_reduce(buf[:count])
    for nbytes in sizes(a):
        count = nbytes // 4
        view, s = buf[:count], src[:count]
        times = torch.zeros(a.iters, dtype=torch.float64)
        wrong = None
        for it in range(a.warmup + a.iters):
            view.copy_(s)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(view, op=dist.ReduceOp.SUM)
            t1 = time.perf_counter()
            if it >= a.warmup:
                times[it - a.warmup] = t1 - t0
            if it == 0 and a.check:
                expect = sum(input_values(torch, count, r) for r in range(n))
                w = torch.tensor([int((view != expect).sum())], dtype=torch.int64)
                dist.all_reduce(w, op=dist.ReduceOp.SUM)
                wrong = int(w[0])
                total_wrong += wrong
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if rank == 0:
            t = float(times.median()) if a.iters % 2 else float(times.sort().values[a.iters // 2 - 1:a.iters // 2 + 1].mean())
            algbw = nbytes / t / 1e9
            busbw = algbw * bus_factor
            print(" %12d %12d %8s %12.2f %12.3f %12.3f %8s" %
                  (nbytes, count, "float32", t * 1e6, algbw, busbw, "N/A" if wrong is None else wrong))
            sys.stdout.flush()
            rows.append({"bytes": nbytes, "count": count, "dtype": "float32", "time_us": round(t * 1e6, 3),
                         "algbw_gbs": algbw, "busbw_gbs": busbw, "wrong": wrong})
    if rank == 0 and a.json:
        import json
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
            f.write("\n")
    dist.destroy_process_group()
    return 1 if total_wrong else 0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv, a):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv, "--rank", str(r), "--port", str(port)],
                              env=env) for r in range(a.np)]
    deadline = time.monotonic() + a.timeout
    rc = 0
    try:
        for p in procs:
            remaining = max(0.0, deadline - time.monotonic())
            code = p.wait(timeout=remaining)
            if code != 0:
                rc = rc or code
                break  # one rank failed: do not wait for the others to time out
    except subprocess.TimeoutExpired:
        print(f"torch_allreduce: timed out after {a.timeout:.0f}s", file=sys.stderr)
        rc = 124
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
                rc = rc or 1
    return rc


def main():
    argv = sys.argv[1:]
    a = parse_args(argv)
    if a.rank is not None:
        return worker(a)
    return launch(argv, a)


if __name__ == "__main__":
    sys.exit(main())
