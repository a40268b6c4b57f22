#!/usr/bin/python3
"""A device slows down mid-run: how fast hetra's balancer recovers, against the new ideal.

Each round runs, one after the other under `flock LOCK`:
  - hetra on the config's devices, with device D's slowdown multiplied by FACTOR from step CHANGE on
    (devices.D.slowdown_schedule);
  - each distinct slowdown of the devices after the change alone, the whole global batch as one
    micro-batch (the strict ideal, as bench/compare_training.py's first table);
  - each device alone at the micro-batch it had after the change (benchmarks.md's solo_i: "same
    micro-batch"), accumulating to the same global batch;
  - each distinct slowdown after the change alone at the --curve fractions of the global batch: its time
    curve, from which the balancer-optimal ideal after the change (bench/compare_training.py's
    balancer_optimal: the best split of the global batch over the measured curves, no communication).
--model and --slowdowns replace the config's model and devices (no memory caps); --device -1 is the slowest
device, so `--device -1 --factor 0.5` makes the slowest twice as fast.
Throughput of the cluster run per window of WINDOW steps = global batch x steps / their summed step
times. Reported: before the change (the last 40 steps before it), each window after it, the first
window from which every later window is at or above TARGET of the new ideal, and the steady state
after the change (from CHANGE + 20 on). Medians over rounds (min-max).

  bench/compare_slowdown_change.sh --rounds 3
  bench/compare_slowdown_change.sh --model cnn --slowdowns 1,2,4 --device -1 --factor 0.5 --rounds 5
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from compare_training import balancer_optimal  # noqa: E402  (one implementation of the ideal)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="examples/fashion_mnist_hetero.toml")
    p.add_argument("--device", type=int, default=1, help="index of the device that slows down (-1: the slowest)")
    p.add_argument("--model", default=None, help="hetra model (mlp, cnn, transformer) instead of the config's")
    p.add_argument("--slowdowns", default=None, help="comma list: the devices' slowdowns instead of the config's")
    p.add_argument("--curve", default="0.125,0.25,0.5,0.75",
                   help="global batches of the solo time curves besides B, as fractions of B (comma separated)")
    p.add_argument("--efficiency-from", type=int, default=10,
                   help="the efficiency after the change counts the steps from this many after it on")
    p.add_argument("--factor", type=float, default=3.0, help="its slowdown is multiplied by this")
    p.add_argument("--change", type=int, default=100, help="the step from which it is slower")
    p.add_argument("--steps", type=int, default=220)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--solo-steps", type=int, default=200,
                   help="steps of a solo run at slowdown 1; at slowdown s: max(60, this / s)")
    p.add_argument("--hetra", default=os.path.join(ROOT, "build", "tools", "hetra", "hetra"))
    p.add_argument("--lock", default="/tmp/hetra-measure.lock")
    p.add_argument("--out", default=None)
    p.add_argument("--timeout", type=int, default=600)
    a = p.parse_args()
    a.curve = sorted({float(f) for f in a.curve.split(",") if f.strip()})
    if any(not 0 < f < 1 for f in a.curve):
        p.error("--curve: every fraction must lie strictly between 0 and 1 (B itself is always measured)")
    return a


def log(msg):
    print(f"[slowdown-change {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


BASE_SETS = ["train.eval_every=0", "train.log_every=0", 'train.lr_schedule="constant"', "train.warmup_steps=0"]


def hetra(a, sets, metrics):
    cmd = (["flock", a.lock] if a.lock else []) + [a.hetra, "run", a.config]
    for s in BASE_SETS + a.scenario_sets + sets:
        cmd += ["--set", s]
    cmd += ["--metrics", metrics]
    with open(metrics + ".log", "w") as log_file:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
    if rc != 0:
        raise SystemExit(f"hetra failed ({rc}): see {metrics}.log")
    records = [json.loads(line) for line in open(metrics) if line.strip()]
    return [r for r in records if r["event"] == "step"], next(r for r in records if r["event"] == "final")


def solo(a, slowdown, micro_batch, stem, global_batch=None):
    steps = a.solo_steps if slowdown == 1 else max(60, int(a.solo_steps / slowdown))
    device = f'name="solo", slowdown={slowdown:g}' + (f", max_micro_batch={micro_batch}" if micro_batch else "")
    sets = [f"train.steps={steps}", f"devices=[{{{device}}}]"]
    if global_batch:
        sets.append(f"train.global_batch={global_batch}")
    _, final = hetra(a, sets, stem + ".jsonl")
    return final["samples_per_s"]


def rate(steps, batch):
    return batch * len(steps) / sum(s["step_time_s"] for s in steps) if steps else None


def cell(values, digits=0):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    text = f"{statistics.median(values):.{digits}f}"
    return text + (f" ({min(values):.{digits}f}-{max(values):.{digits}f})" if len(values) > 1 else "")


def main():
    a = parse_args()
    with open(os.path.join(ROOT, a.config), "rb") as f:
        cfg = tomllib.load(f)
    batch = int(cfg.get("train", {}).get("global_batch", 512))
    before = [float(d.get("slowdown", 1)) for d in cfg.get("devices", [{}])]
    a.scenario_sets = [f'model.name="{a.model}"'] if a.model else []
    if a.slowdowns:
        before = [float(x) for x in a.slowdowns.split(",")]
        a.scenario_sets.append("devices=[" + ", ".join(f'{{name="d{i}", slowdown={s:g}}}'
                                                       for i, s in enumerate(before)) + "]")
    if a.device < 0:
        a.device = max(range(len(before)), key=lambda i: before[i])
    after = list(before)
    after[a.device] = before[a.device] * a.factor
    out = a.out or os.path.join(ROOT, "bench", "out", "slowdown-change-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    schedule = f"devices.{a.device}.slowdown_schedule=[[{a.change}, {after[a.device]:g}]]"
    windows = list(range(a.change, a.steps, a.window))
    rounds = []
    for rnd in range(a.rounds):
        steps, _ = hetra(a, [f"train.steps={a.steps}", schedule], os.path.join(out, f"r{rnd}-cluster.jsonl"))
        by_step = {s["step"]: s for s in steps}  # step records count from 1
        tail = [by_step[k] for k in range(a.change + 21, a.steps + 1)]
        micro = [round(statistics.median(s["ranks"][i]["micro_batch"] for s in tail)) for i in range(len(after))]
        strict = {s: solo(a, s, None, os.path.join(out, f"r{rnd}-solo-{s:g}")) for s in sorted(set(after))}
        same = [solo(a, s, m, os.path.join(out, f"r{rnd}-msolo-{i}")) for i, (s, m) in enumerate(zip(after, micro))]
        strict_before = {s: solo(a, s, None, os.path.join(out, f"r{rnd}-solo-{s:g}-before"))
                         for s in sorted(set(before) - set(after))}
        strict_before.update({s: v for s, v in strict.items() if s in before})
        curves = {}
        for s in sorted(set(after)):
            points = [(batch, batch / strict[s])]
            for b in sorted({max(1, round(f * batch)) for f in a.curve} - {batch}):
                rate_b = solo(a, s, None, os.path.join(out, f"r{rnd}-curve-{s:g}-b{b}"), b)
                points.append((b, b / rate_b))
            curves[s] = points
        optimal_after, optimal_split = balancer_optimal([curves[s] for s in after], batch)
        late = [by_step[k] for k in range(a.change + a.efficiency_from + 1, a.steps + 1)]
        r = {"before": rate([by_step[k] for k in range(a.change - 39, a.change + 1)], batch),
             "windows": [rate([by_step[k] for k in range(w + 1, min(w + a.window, a.steps) + 1)], batch)
                         for w in windows],
             "steady": rate(tail, batch), "micro": micro, "late": rate(late, batch),
             "ideal_after_optimal": optimal_after, "optimal_split": optimal_split,
             "median_step_late": batch / statistics.median(s["step_time_s"] for s in late),
             "ideal_before": sum(strict_before[s] for s in before),
             "ideal_after": sum(strict[s] for s in after), "ideal_after_same": sum(same),
             "splits": [[x["batch"] for x in by_step[k]["ranks"]] for k in (a.change, a.steps)]}
        for key in ("ideal_after", "ideal_after_same", "ideal_after_optimal"):
            ok = [w is not None and w >= a.target * r[key] for w in r["windows"]]
            first = next((i for i in range(len(ok)) if all(ok[i:])), None)
            r["recovered_" + key] = None if first is None else windows[first] + a.window - a.change
        rounds.append(r)
        log(f"round {rnd + 1}/{a.rounds}: before {r['before']:.0f}, steady after {r['steady']:.0f}, ideal after "
            f"{r['ideal_after']:.0f} (same micro-batch {r['ideal_after_same']:.0f}), recovered within "
            f"{r['recovered_ideal_after']} / {r['recovered_ideal_after_same']} steps")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"args": vars(a), "rounds": rounds}, f, indent=1)
    col = lambda k: [r[k] for r in rounds]
    lines = [f"Command: `bench/compare_slowdown_change.sh {' '.join(sys.argv[1:])}`  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M')}; {a.config}, device {a.device} slowdown "
             f"{before[a.device]:g} -> {after[a.device]:g} at step {a.change}; {a.rounds} rounds; samples/s, "
             "medians over rounds (min-max).", "",
             "| | before (steps " + f"{a.change - 39}-{a.change})" + " | steady after (from step "
             f"{a.change + 21}) | ideal after: whole batch | efficiency | ideal after: same micro-batch | "
             "efficiency |", "|---|---|---|---|---|---|---|",
             f"| hetra | {cell(col('before'))} | {cell(col('steady'))} | {cell(col('ideal_after'))} | "
             f"{cell([r['steady'] / r['ideal_after'] for r in rounds], 3)} | {cell(col('ideal_after_same'))} | "
             f"{cell([r['steady'] / r['ideal_after_same'] for r in rounds], 3)} |", "",
             f"Balancer-optimal ideal after the change (the best split over each device's measured solo curve, "
             f"no communication): {cell(col('ideal_after_optimal'))} samples/s, split "
             f"{sorted({tuple(r['optimal_split']) for r in rounds})}. From {a.efficiency_from} steps after the change "
             f"on: hetra {cell(col('late'))} samples/s = {cell([r['late'] / r['ideal_after_optimal'] for r in rounds], 3)}"
             f" of it (median step: {cell([r['median_step_late'] / r['ideal_after_optimal'] for r in rounds], 3)}); "
             f"back to >= {a.target} of it for good within "
             f"{[r['recovered_ideal_after_optimal'] for r in rounds]} steps.", "",
             "| steps after the change | " + " | ".join(f"{w - a.change + 1}-{min(w + a.window, a.steps) - a.change}"
                                                      for w in windows) + " |",
             "|---" * (len(windows) + 1) + "|",
             "| samples/s | " + " | ".join(cell([r["windows"][i] for r in rounds]) for i in range(len(windows))) + " |",
             "| ÷ ideal after (whole batch) | " + " | ".join(
                 cell([r["windows"][i] / r["ideal_after"] for r in rounds], 2) for i in range(len(windows))) + " |",
             "", f"Back to >= {a.target} of the new ideal, for good, within (steps after the change): whole-batch "
             f"ideal {[r['recovered_ideal_after'] for r in rounds]}, same-micro-batch ideal "
             f"{[r['recovered_ideal_after_same'] for r in rounds]} (per round; None = not reached). Ideal before: "
             f"{cell(col('ideal_before'))}; micro-batches after the change: {[r['micro'] for r in rounds]}; split at "
             f"the change and at the end: {[r['splits'] for r in rounds]}."]
    report = "\n".join(lines) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(report)
    print(report)


if __name__ == "__main__":
    main()
