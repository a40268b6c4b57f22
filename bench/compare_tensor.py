#!/usr/bin/python3
"""Tensor parallelism (train/tensor_parallel.h): heads and MLP units split by measured speed against an even
split, and data parallelism on the same devices.

The model: a transformer of --layers layers, dim 96 and 6 heads (so that speeds 1 : 1/2 split 4 : 2 heads), on
Fashion-MNIST (28 tokens of 28 features; 512 test samples for the final evaluation), Adam, global batch
--global-batch. Each round runs, one after the other under `flock LOCK`, in an order rotated each round, on the
devices of --slowdowns (default 1,2):
  speed   parallel.tensor = number of devices, parallel.tensor_split = "speed"
  even    the same with tensor_split = "even" (3 and 3 heads: the slow device holds half of every layer)
  DP      data parallelism with the balancer, every device holding the whole model
samples/s is the final record's mean after the trainer's warm-up; ratios within a round, then the median
(min-max). The ideal speed / even ratio, from the split alone: max_i(even_i / speed_i) / max_i(split_i / speed_i)
(heads; the MLP units split alike). Needs a quiet machine.
Prints Markdown for docs/benchmarks.md; results.json, report.md and every run's log go to
bench/out/tensor-<stamp>/.
"""

import argparse
import os
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_training import (ROOT, add_output_args, cell, output_dir, hetra_result, machine_facts, per_round,  # noqa: E402
                              report_header, rerender, run_config_rounds, save_report, warmup_of)

VARIANTS = ("speed", "even", "DP")


def log(msg):
    print(f"[tensor {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="steps of each run")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--slowdowns", default="1,2")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    p.add_argument("--hetra", default=os.path.join(ROOT, "build", "tools", "hetra", "hetra"))
    p.add_argument("--lock", default="/tmp/hetra-measure.lock", help="flock this file around every run; '' = none")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    add_output_args(p, "tensor")
    a = p.parse_args()
    a.slowdowns = [float(s) for s in a.slowdowns.split(",")]
    a.variants = [v for v in a.variants.split(",") if v]
    if any(v not in VARIANTS for v in a.variants):
        p.error("--variants: a comma list of " + ", ".join(VARIANTS))
    if a.steps < 10 or len(a.slowdowns) < 2 or len(a.slowdowns) > 6:
        p.error("--steps >= 10 and 2 to 6 --slowdowns (6 heads)")
    return a


def config_text(a, variant):
    text = f"""[model]
name = "transformer"
layers = {a.layers}
dim = 96
heads = 6
seq_len = 28

[data]
name = "fashion-mnist"
test_samples = 512

[train]
global_batch = {a.global_batch}
steps = {a.steps}
optimizer = "adam"
lr = 0.001
lr_schedule = "constant"
warmup_steps = 0
eval_every = 0
log_every = 0
"""
    if variant != "DP":
        text += f'\n[parallel]\ntensor = {len(a.slowdowns)}\ntensor_split = "{variant}"\n'
    for i, s in enumerate(a.slowdowns):
        text += f'\n[[devices]]\nname = "d{i}"\nslowdown = {s:g}\n'
    return text


def split_of(log_path):
    """The heads per device that hetra run printed ("tensor parallel: ... heads 4/2, ...")."""
    for line in open(log_path):
        if line.startswith("tensor parallel:"):
            return line.split("heads ", 1)[1].split(",", 1)[0].strip()
    return None


def main():
    a = parse_args()
    if a.report:
        return rerender(a.report, render, not a.no_spread)
    out = output_dir(a, "tensor", log)
    facts = machine_facts("/usr/bin/python3")
    started = time.monotonic()
    saved = {"command": "bench/compare_tensor.sh " + shlex.join(sys.argv[1:]), "facts": facts, "rounds": a.rounds,
             "steps": a.steps, "layers": a.layers, "global_batch": a.global_batch, "slowdowns": a.slowdowns}
    warmup = warmup_of(a.steps, 5)

    def parse(stem):
        return dict(hetra_result(stem + ".jsonl", warmup), heads=split_of(stem + ".log"))
    saved["results"], saved["failures"] = run_config_rounds(a, out, {v: config_text(a, v) for v in a.variants},
                                                            parse, log)
    facts["elapsed_s"] = round(time.monotonic() - started)
    save_report(out, saved, render, not a.no_spread)
    return 1 if saved["failures"] else 0


def render(saved, spread):
    res, rounds = saved["results"], saved["rounds"]

    def vals(fn):
        return per_round(saved, fn)

    slow = ", ".join(f"{s:g}" for s in saved["slowdowns"])
    lines = report_header(saved) + [
             f"Transformer ({saved['layers']} layers, dim 96, 6 heads, seq_len 28) on Fashion-MNIST, Adam, global batch "
             f"{saved['global_batch']}, devices of slowdowns {slow}; {saved['steps']} steps a run, {rounds} rounds, "
             "order rotated each round; ratios within a round, then the median (min-max).", "",
             "| variant | heads per device | samples/s | / even | / DP | step (ms) |", "|---|---|---|---|---|---|"]
    for v in VARIANTS:
        if v not in res:
            continue
        rows = res[v]
        first = next((x for x in rows if x), None)
        heads = (first or {}).get("heads") or ("whole model each" if v == "DP" else "-")

        def ratio(other):
            if other not in res or other == v:
                return "1" if other == v else "-"
            return cell(vals(lambda r: rows[r]["samples_per_s"] / res[other][r]["samples_per_s"]), 2, spread, "x")
        lines.append("| " + " | ".join([v, heads, cell(vals(lambda r: rows[r]["samples_per_s"]), 1, spread),
                                         ratio("even"), ratio("DP"),
                                         cell(vals(lambda r: rows[r]["step_time_s"] * 1e3), 1, spread)]) + " |")
    if saved["failures"]:
        lines.append(f"\n**{saved['failures']} run(s) failed**: see the logs next to results.json.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
