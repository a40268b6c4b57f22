#!/usr/bin/python3
"""Pipeline parallelism (docs/architecture.md, train/pipeline/): balanced against even partitions, the 1F1B
step model, and data parallelism on the same devices.

The model is the issue's: a 14-block transformer (embed, 12 layers of dim 128 with 4 heads, head) on Fashion-MNIST
(28 tokens of 28 features; 512 test samples for the final evaluation), Adam, global batch 512 in --chunks micro-batches per step. Each round runs, one after
the other under `flock LOCK`, in an order rotated each round:
  on the unequal devices (--slowdowns, default 1,2,4):
    balanced   parallel.partition = "balanced" (from the start-up profile of every block on every device)
    even       parallel.partition = "even" (equal block counts, the leftover on the last stages)
    DP         parallel.pipeline = 1: data parallelism with the balancer, every device holding the whole model
  on equal devices (--equal-slowdown, default 2, on each of the three):
    equal      the balanced partition, where every stage should compute alike: its measured idle fraction
               against the 1F1B bubble (P-1)/(M+P-1)
Per run: samples/s (the final record's mean after the trainer's warm-up), the median step, and for the pipeline
runs each stage's median compute per step (stage_s, its forwards, backwards and optimizer step) and idle
fraction. The 1F1B model: with w_i = stage_s_i / M, a step takes sum_i w_i + (M - 1) max_i w_i; the report puts
the measured median step beside it. Needs a quiet machine.
Prints Markdown for docs/benchmarks.md; results.json, report.md and every run's log go to
bench/out/pipeline-<stamp>/.
"""

import argparse
import json
import os
import shlex
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_training import (ROOT, add_output_args, cell, output_dir, machine_facts, per_round, report_header,  # noqa: E402
                              rerender, run_config_rounds, save_report)

MODEL = """[model]
name = "transformer"
layers = 12
dim = 128
heads = 4
seq_len = 28

[data]
name = "fashion-mnist"
test_samples = 512

[train]
global_batch = 512
optimizer = "adam"
lr = 0.001
lr_schedule = "constant"
warmup_steps = 0
eval_every = 0
log_every = 0
"""


def log(msg):
    print(f"[pipeline {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12, help="steps of each run")
    p.add_argument("--chunks", type=int, default=8, help="micro-batches per step (M)")
    p.add_argument("--slowdowns", default="1,2,4", help="the unequal devices")
    p.add_argument("--equal-slowdown", type=float, default=2.0, help="each of the three equal devices")
    p.add_argument("--variants", default="balanced,even,DP,equal", help="comma list of balanced, even, DP, equal")
    p.add_argument("--hetra", default=os.path.join(ROOT, "build", "tools", "hetra", "hetra"))
    p.add_argument("--lock", default="/tmp/hetra-measure.lock", help="flock this file around every run; '' = none")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    add_output_args(p, "pipeline")
    a = p.parse_args()
    a.slowdowns = [float(s) for s in a.slowdowns.split(",")]
    a.variants = [v for v in a.variants.split(",") if v]
    if any(v not in ("balanced", "even", "DP", "equal") for v in a.variants):
        p.error("--variants: a comma list of balanced, even, DP, equal")
    if a.steps < 4 or a.chunks < 1 or len(a.slowdowns) < 2:
        p.error("--steps >= 4, --chunks >= 1, at least two --slowdowns")
    return a


def config_text(a, slowdowns, partition):
    stages = len(slowdowns) if partition else 1
    text = MODEL + f"steps = {a.steps}\n\n[parallel]\npipeline = {stages}\nchunks = {a.chunks}\n"
    if partition:
        text += f'partition = "{partition}"\n'
    for i, s in enumerate(slowdowns):
        text += f'\n[[devices]]\nname = "d{i}"\nslowdown = {s:g}\n'
    return text


def variant_config(a, variant):
    if variant == "equal":
        return [a.equal_slowdown] * 3, "balanced"
    return a.slowdowns, (None if variant == "DP" else variant)


def result_of(path):
    """samples/s of the final record; medians over the measured steps (after the first third) of the step and,
    for a pipeline, of each stage's stage_s and idle fraction, with the partition the run chose."""
    records = [json.loads(line) for line in open(path) if line.strip()]
    final = next(r for r in records if r["event"] == "final")
    out = {"samples_per_s": final["samples_per_s"]}
    pipeline = next((r for r in records if r["event"] == "pipeline"), None)
    kind = "pipeline_step" if pipeline else "step"
    steps = [r for r in records if r["event"] == kind]
    steps = steps[len(steps) // 3:]
    out["step_s"] = statistics.median(r["step_time_s"] for r in steps)
    if pipeline:
        out["partition"] = [s["blocks"] for s in pipeline["stages"]]
        out["predicted_step_s"] = pipeline["predicted_step_s"]
        n = len(steps[0]["stages"])
        out["stage_s"] = [statistics.median(r["stages"][i]["stage_s"] for r in steps) for i in range(n)]
        out["idle"] = [statistics.median(r["stages"][i]["idle_fraction"] for r in steps) for i in range(n)]
    else:
        out["batches"] = [r["batch"] for r in steps[-1]["ranks"]]
    return out


def main():
    a = parse_args()
    if a.report:
        return rerender(a.report, render, not a.no_spread)
    out = output_dir(a, "pipeline", log)
    facts = machine_facts("/usr/bin/python3")
    started = time.monotonic()
    saved = {"command": "bench/compare_pipeline.sh " + shlex.join(sys.argv[1:]), "facts": facts,
             "rounds": a.rounds, "steps": a.steps, "chunks": a.chunks, "slowdowns": a.slowdowns,
             "equal_slowdown": a.equal_slowdown}
    configs = {v: config_text(a, *variant_config(a, v)) for v in a.variants}
    saved["results"], saved["failures"] = run_config_rounds(a, out, configs, lambda stem: result_of(stem + ".jsonl"),
                                                            log)
    facts["elapsed_s"] = round(time.monotonic() - started)
    save_report(out, saved, render, not a.no_spread)
    return 1 if saved["failures"] else 0


def model_step(stage_s, chunks):
    w = [s / chunks for s in stage_s]
    return sum(w) + (chunks - 1) * max(w)


def render(saved, spread):
    res, rounds, m = saved["results"], saved["rounds"], saved["chunks"]

    def vals(fn):
        return per_round(saved, fn)

    slow = ", ".join(f"{s:g}" for s in saved["slowdowns"])
    lines = report_header(saved) + [
             f"14-block transformer (12 layers, dim 128, 4 heads, seq_len 28) on Fashion-MNIST, Adam, global batch "
             f"512 in M = {m} chunks, {saved['steps']} steps a run, medians over the last two thirds; "
             f"{rounds} rounds, order rotated each round; ratios within a round, then the median (min-max).", "",
             f"Unequal devices (slowdowns {slow}):", "",
             "| variant | partition (blocks per stage) | samples/s | / even | step (s) | 1F1B model (s) | "
             "model / measured | idle per stage |", "|---|---|---|---|---|---|---|---|"]
    for v in ("balanced", "even", "DP"):
        if v not in res:
            continue
        rows = res[v]
        first = next((x for x in rows if x), None)
        part = "/".join(map(str, first["partition"])) if first and "partition" in first else \
            ("data parallel, batches " + "/".join(map(str, first["batches"])) if first else "-")
        ratio = cell(vals(lambda r: rows[r]["samples_per_s"] / res["even"][r]["samples_per_s"]), 2, spread, "x") \
            if "even" in res else "-"
        pipe = first is not None and "stage_s" in first
        lines.append("| " + " | ".join([
            v, part, cell(vals(lambda r: rows[r]["samples_per_s"]), 1, spread), ratio,
            cell(vals(lambda r: rows[r]["step_s"]), 3, spread),
            cell(vals(lambda r: model_step(rows[r]["stage_s"], m)), 3, spread) if pipe else "-",
            cell(vals(lambda r: model_step(rows[r]["stage_s"], m) / rows[r]["step_s"]), 3, spread) if pipe else "-",
            " / ".join(cell(vals(lambda r, i=i: 100 * rows[r]["idle"][i]), 1, False, "%")
                       for i in range(len(first["idle"]))) if pipe else "-"]) + " |")
    if "equal" in res:
        rows = res["equal"]
        first = next((x for x in rows if x), None)
        bubble = 2 / (m + 2)
        lines += ["", f"Three equal devices (slowdown {saved['equal_slowdown']:g} each), the balanced partition: the "
                  f"1F1B bubble (P-1)/(M+P-1) = {100 * bubble:.1f}%.", "",
                  "| partition | samples/s | step (s) | 1F1B model (s) | idle per stage | mean idle - bubble |",
                  "|---|---|---|---|---|---|"]
        if first:
            lines.append("| " + " | ".join([
                "/".join(map(str, first["partition"])), cell(vals(lambda r: rows[r]["samples_per_s"]), 1, spread),
                cell(vals(lambda r: rows[r]["step_s"]), 3, spread),
                cell(vals(lambda r: model_step(rows[r]["stage_s"], m)), 3, spread),
                " / ".join(cell(vals(lambda r, i=i: 100 * rows[r]["idle"][i]), 1, False, "%")
                           for i in range(len(first["idle"]))),
                cell(vals(lambda r: 100 * (statistics.mean(rows[r]["idle"]) - bubble)), 1, spread, " points")])
                + " |")
    if saved["failures"]:
        lines.append(f"\n**{saved['failures']} run(s) failed**: see the logs next to results.json.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
