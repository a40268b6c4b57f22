#!/usr/bin/python3
"""Side-by-side float32 allreduce: hetra vs Open MPI vs torch.distributed (Gloo), paired ratios.

Builds the peers into build-bench/, then for every configuration runs the three implementations
alternately for several rounds (the order rotates each round, so none always runs first or last), with the
same sizes and iteration counts, and prints one Markdown table per configuration plus the machine facts
(date, nproc, CPU, caches, single-thread memcpy bandwidth) so the output can be pasted into docs/benchmarks.md.

Time and busbw cells are medians over rounds of each run's median-over-iterations time; the hetra/peer cells
are hetra's speedup, the median over rounds of t_peer/t_hetra within one round (equal to the busbw ratio),
so > 1 means hetra is faster. See bench/README.md.
Needs only python3 and Debian packages; run it with /usr/bin/python3 (the interpreter that sees python3-torch).
"""

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build-bench")
PEERS = os.path.join(ROOT, "bench", "peers")

# name -> (ranks, hetra transport, Open MPI transport arguments)
CONFIGS = {
    "shm2": (2, "shm", ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"]),
    "tcp2": (2, "tcp", ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]),
    "shm4": (4, "shm", ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"]),
}
IMPLS = ["hetra", "mpi", "torch", "base"]
# "base" is another hetra binary (--base), such as a build of main: before/after pairs of a change.
LABEL = {"hetra": "hetra", "mpi": "MPI", "torch": "gloo", "base": "base"}


def log(msg):
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    suffix = text[-1].lower()
    return int(float(text[:-1]) * units[suffix]) if suffix in units else int(text)


def fmt_size(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="shm2,tcp2,shm4", help="comma list of: " + ",".join(CONFIGS))
    p.add_argument("--impls", default="hetra,mpi,torch", help="comma list of: " + ",".join(IMPLS))
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (5 when time allows: ~8 min)")
    p.add_argument("--no-spread", action="store_true", help="omit the (min-max) over rounds after each ratio")
    p.add_argument("-b", dest="min_bytes", type=parse_size, default=8)
    p.add_argument("-e", dest="max_bytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", dest="factor", type=int, default=2, help="integer size factor")
    p.add_argument("--split", type=parse_size, default=1 << 20,
                   help="sizes below this use the small-message iteration counts")
    p.add_argument("--small-iters", type=int, default=100)
    p.add_argument("--small-warmup", type=int, default=10)
    p.add_argument("--large-iters", type=int, default=20)
    p.add_argument("--large-warmup", type=int, default=3)
    p.add_argument("--hetra", default=os.path.join(ROOT, "build", "tools", "hetra", "hetra"))
    p.add_argument("--base", default=None, help="the hetra binary of impl base (before a change)")
    p.add_argument("--torch-python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
    p.add_argument("--mpi-extra", default="", help="extra mpirun arguments, space separated")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per benchmark process")
    p.add_argument("--report", metavar="DIR", default=None,
                   help="do not run anything: re-render the report of an earlier run from DIR/results.json")
    p.add_argument("--out", default=None, help="directory for raw JSON and the report (default bench/out/<time>)")
    a = p.parse_args()
    a.configs = [c for c in a.configs.split(",") if c]
    a.impls = [i for i in a.impls.split(",") if i]
    for c in a.configs:
        if c not in CONFIGS:
            p.error(f"unknown config {c}")
    for i in a.impls:
        if i not in IMPLS:
            p.error(f"unknown impl {i}")
    if a.factor < 2 or a.min_bytes < 4 or a.max_bytes < a.min_bytes or a.rounds < 1:
        p.error("need -f >= 2, 4 <= -b <= -e, --rounds >= 1")
    return a


def run(cmd, timeout, env=None):
    """Runs cmd in its own process group; returns (rc, stdout, stderr), rc 124 on timeout.

    On timeout the whole group is killed: mpirun and the torch launcher leave rank processes behind otherwise.
    """
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    except OSError as e:
        return 127, "", str(e)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return 124, out, err + f"\ntimed out after {timeout:.0f}s"


def build_peers():
    os.makedirs(BUILD, exist_ok=True)
    steps = [
        ["mpicc", "-O2", "-Wall", "-o", os.path.join(BUILD, "mpi_allreduce"), os.path.join(PEERS, "mpi_allreduce.c")],
        ["cc", "-O2", "-Wall", "-o", os.path.join(BUILD, "memcpy_bw"), os.path.join(PEERS, "memcpy_bw.c")],
    ]
    for cmd in steps:
        rc, out, err = run(cmd, 120)
        if rc != 0:
            sys.exit(f"build failed: {' '.join(cmd)}\n{out}{err}")


def hetra_available(path, timeout):
    if not os.access(path, os.X_OK):
        return False, f"{path} not found"
    rc, out, err = run([path, "bench", "--help"], timeout)
    text = out + err
    # The skeleton binary exits 0 without a word, so also ask that the help talks about the bench flags.
    if rc != 0 or ("allreduce" not in text and "--np" not in text):
        return False, f"`hetra bench --help` exited {rc} without bench usage: {text.strip()[-200:]!r}"
    return True, ""


def sweeps(a):
    """[(min, max, warmup, iters)]: small sizes with many iterations, large ones with few."""
    sizes, s = [], a.min_bytes
    while s <= a.max_bytes:
        sizes.append(s)
        s *= a.factor
    small = [s for s in sizes if s < a.split]
    large = [s for s in sizes if s >= a.split]
    out = []
    if small:
        out.append((small[0], small[-1], a.small_warmup, a.small_iters))
    if large:
        out.append((large[0], large[-1], a.large_warmup, a.large_iters))
    return out


def command(a, impl, config, lo, hi, warmup, iters, json_path):
    ranks, transport, mpi_transport = CONFIGS[config]
    common = ["-b", str(lo), "-e", str(hi), "-f", str(a.factor), "-w", str(warmup), "-n", str(iters), "-c", "1",
              "--dtype", "float32", "--json", json_path]
    if impl in ("hetra", "base"):
        return [a.hetra if impl == "hetra" else a.base, "bench", "allreduce", "--np", str(ranks), "--transport", transport] + common
    if impl == "mpi":
        cmd = ["mpirun", "--allow-run-as-root", "-np", str(ranks)]
        if ranks > (os.cpu_count() or 1):
            cmd += ["--oversubscribe", "--bind-to", "none"]
        cmd += mpi_transport + a.mpi_extra.split()
        return cmd + [os.path.join(BUILD, "mpi_allreduce")] + common
    return [a.torch_python, os.path.join(PEERS, "torch_allreduce.py"), "--np", str(ranks),
            "--timeout", str(int(a.timeout))] + common


def memcpy_line():
    rc, out, err = run([os.path.join(BUILD, "memcpy_bw"), "256", "9"], 120)
    return out.strip() if rc == 0 else f"memcpy_bw failed: {err.strip()}"


def machine_facts():
    facts = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
             "nproc": str(os.cpu_count()), "kernel": platform.release()}
    rc, out, _ = run(["lscpu"], 20)
    for line in out.splitlines() if rc == 0 else []:
        key, _, value = line.partition(":")
        if key.strip() in ("Model name", "L2 cache", "L3 cache", "Hypervisor vendor"):
            facts[key.strip()] = value.strip()
    rc, out, _ = run(["mpirun", "--version"], 20)
    facts["Open MPI"] = out.splitlines()[0] if rc == 0 and out else "?"
    rc, out, _ = run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], 20)
    facts["hetra commit"] = out.strip() if rc == 0 else "?"
    return facts


def median(xs):
    return statistics.median(xs) if xs else None


def cell(x, digits):
    return "-" if x is None else f"{x:.{digits}f}"


def time_cell(us):
    return "-" if us is None else f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def fmt_ratio(x):
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def paired_ratio(results, impl, peer, size, spread):
    """hetra's speedup over peer at one size: the median over rounds of t_peer / t_hetra within one round.

    Pairing runs that were adjacent in time cancels the slow drift of a shared machine: an A/A test (the
    same binary in both columns) gave a ratio of medians of 2.6 but paired ratios with a median of 1.08.
    At equal size and rank count this is also busbw_hetra / busbw_peer, so one column serves both.
    """
    mine = {r[0]: r[1] for r in results[impl].get(size, [])}
    theirs = {r[0]: r[1] for r in results[peer].get(size, [])}
    ratios = sorted(theirs[k] / mine[k] for k in mine if k in theirs and mine[k] > 0)
    if not ratios:
        return "-"
    text = fmt_ratio(statistics.median(ratios))
    if spread and len(ratios) > 1:
        text += f" ({fmt_ratio(ratios[0])}-{fmt_ratio(ratios[-1])})"
    return text


def report_table(config, impls, results, rounds, spread):
    """Markdown table for one configuration; results[impl][bytes] = [(round, time_us, busbw_gbs), ...]."""
    ranks, transport, _ = CONFIGS[config]
    sizes = sorted({b for impl in impls for b in results[impl]})
    lines = [f"### allreduce float32, {ranks} ranks, hetra transport {transport}, "
             f"MPI {'vader (shm)' if transport == 'shm' else 'tcp over lo'}, gloo tcp over lo "
             f"({rounds} rounds)", ""]
    peers = [i for i in impls if i != "hetra"]
    has_hetra = "hetra" in impls
    head = ["size"] + [f"{LABEL[i]} us" for i in impls] + [f"{LABEL[i]} busbw GB/s" for i in impls]
    if has_hetra:
        head += [f"hetra/{LABEL[p]}" for p in peers]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---:"] * len(head)) + "|")
    for b in sizes:
        us = [median([r[1] for r in results[i].get(b, [])]) for i in impls]
        bw = [median([r[2] for r in results[i].get(b, [])]) for i in impls]
        row = [fmt_size(b)] + [time_cell(x) for x in us] + [cell(x, 3) for x in bw]
        if has_hetra:
            row += [paired_ratio(results, "hetra", p, b, spread) for p in peers]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main():
    a = parse_args()
    if a.report:
        with open(os.path.join(a.report, "results.json")) as f:
            print(render(json.load(f), not a.no_spread), end="")
        return 0
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = os.path.abspath(a.out) if a.out else os.path.join(ROOT, "bench", "out", stamp)
    os.makedirs(out_dir, exist_ok=True)
    t_start = time.monotonic()

    log("building peers into build-bench/")
    build_peers()
    notes = []
    if "hetra" in a.impls:
        ok, why = hetra_available(a.hetra, 30)
        if not ok:
            log(f"hetra skipped: {why}")
            notes.append(f"hetra not run: {why}")
            a.impls.remove("hetra")
    if "base" in a.impls:
        ok, why = hetra_available(a.base or "", 30)
        if not ok:
            sys.exit(f"impl base needs --base, a hetra binary: {why}")
    if "torch" in a.impls:
        rc, _, err = run([a.torch_python, "-c", "import torch.distributed as d; assert d.is_gloo_available()"], 60)
        if rc != 0:
            log(f"torch skipped: {err.strip()[-200:]}")
            notes.append(f"torch/gloo not run with {a.torch_python}: import failed")
            a.impls.remove("torch")

    facts = machine_facts()
    memcpy_before = memcpy_line()
    plan = sweeps(a)
    results = {c: {i: {} for i in a.impls} for c in a.configs}
    failures = []
    for config in a.configs:
        for rnd in range(a.rounds):
            order = a.impls[rnd % len(a.impls):] + a.impls[:rnd % len(a.impls)]
            for impl in order:
                for part, (lo, hi, warmup, iters) in enumerate(plan):
                    path = os.path.join(out_dir, f"{config}-{impl}-r{rnd}-p{part}.json")
                    cmd = command(a, impl, config, lo, hi, warmup, iters, path)
                    t0 = time.monotonic()
                    rc, out, err = run(cmd, a.timeout)
                    with open(path + ".log", "w") as f:
                        f.write(" ".join(cmd) + "\n" + out + err)
                    log(f"{config} round {rnd + 1}/{a.rounds} {impl} {fmt_size(lo)}..{fmt_size(hi)}: rc {rc}, "
                        f"{time.monotonic() - t0:.1f}s")
                    rows = []
                    if os.path.exists(path):
                        try:
                            with open(path) as f:
                                rows = json.load(f)
                        except ValueError as e:
                            err += f"\nbad JSON in {path}: {e}"
                    if rc != 0 or not rows:
                        failures.append(f"{config} round {rnd + 1} {impl}: rc {rc}; see {path}.log")
                        log(f"  FAILED: {(out + err).strip()[-400:]}")
                    for r in rows:
                        if r.get("wrong"):
                            failures.append(f"{config} {impl} {r['bytes']} B: {r['wrong']} wrong elements")
                        results[config][impl].setdefault(int(r["bytes"]), []).append(
                            (rnd, float(r["time_us"]), float(r["busbw_gbs"])))
    memcpy_after = memcpy_line()

    header = ["## allreduce: hetra vs Open MPI vs torch/gloo", "",
              f"Command: `bench/compare_allreduce.sh {' '.join(sys.argv[1:])}`".rstrip() + "  ",
              f"Date: {facts['date']}; nproc {facts['nproc']}; CPU {facts.get('Model name', '?')} "
              f"({facts.get('Hypervisor vendor', 'bare metal')} guest); L2 {facts.get('L2 cache', '?')}, "
              f"L3 {facts.get('L3 cache', '?')}; kernel {facts['kernel']}  ",
              f"{facts['Open MPI']}; hetra commit {facts['hetra commit']}  ",
              f"Physical limit, before: {memcpy_before}  ",
              f"Physical limit, after: {memcpy_after}  ",
              f"Sizes {fmt_size(a.min_bytes)}..{fmt_size(a.max_bytes)} x{a.factor}; below {fmt_size(a.split)}: "
              f"-w {a.small_warmup} -n {a.small_iters}, else -w {a.large_warmup} -n {a.large_iters}; "
              f"{a.rounds} alternating rounds; time = median over iterations of the max over ranks.  ",
              "Time and busbw: median over rounds. hetra/peer: hetra's speedup, the median over rounds of "
              "t_peer/t_hetra within one round (= busbw_hetra/busbw_peer), min-max over rounds in parentheses; "
              "> 1 means hetra is faster.",
              ""] + [f"Note: {n}  " for n in notes]
    shown_out = os.path.relpath(out_dir, ROOT) if out_dir.startswith(ROOT + os.sep) else out_dir
    saved = {"header": header, "configs": a.configs, "impls": a.impls, "rounds": a.rounds, "failures": failures,
             "footer": f"Wall time {time.monotonic() - t_start:.0f} s; raw JSON in {shown_out}/",
             "facts": facts, "memcpy": [memcpy_before, memcpy_after],
             "results": {c: {i: {str(b): v for b, v in results[c][i].items()} for i in results[c]} for c in results}}
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(saved, f, indent=1)
    text = render(saved, not a.no_spread)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(text)
    print(text, end="")
    return 1 if failures else 0


def render(saved, spread):
    """The Markdown report from the saved results (also used by --report to re-render an old run)."""
    lines = list(saved["header"])
    for config in saved["configs"]:
        results = {i: {int(b): [tuple(r) for r in v] for b, v in saved["results"][config][i].items()}
                   for i in saved["impls"]}
        lines += ["", report_table(config, saved["impls"], results, saved["rounds"], spread)]
    if saved["failures"]:
        lines += ["", "Failures:"] + [f"- {f}" for f in saved["failures"]]
    lines += ["", saved["footer"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
