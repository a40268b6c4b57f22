#!/usr/bin/python3
"""Activation checkpointing's cost and saving (docs/memory.md), on an 8-layer transformer.

Runs `hetra run` alternately with train.activation_checkpointing = "none" and "blocks" (one device,
synthetic data), ROUNDS times each, and prints for each setting the median samples/s of the final
records and the activation peak the counting allocator measured (ranks[0].memory.activations of
the last step record), then the ratios. Alternating keeps a drifting machine from favouring one
setting. Needs a quiet machine: on a shared one the step times say nothing.

  bench/compare_checkpointing.py [--hetra build/tools/hetra/hetra] [--rounds 5] [--steps 60]

The issue's targets: activation peak >= 3x lower, step time overhead <= 40%. The accounting's own
overhead cannot be measured this way yet: the counting allocator has no switch to turn it off.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

CONFIG = """
[model]
name = "transformer"
layers = 8
dim = 64
heads = 4
seq_len = 16
[data]
name = "synthetic"
samples = 8192
test_samples = 256
features = 256
classes = 10
[train]
global_batch = 64
steps = {steps}
optimizer = "adam"
lr = 0.001
log_every = 0
eval_every = 0
activation_checkpointing = "{mode}"
[[devices]]
"""


def run_once(hetra, mode, steps, workdir):
    config = os.path.join(workdir, f"{mode}.toml")
    metrics = os.path.join(workdir, f"{mode}.jsonl")
    with open(config, "w") as f:
        f.write(CONFIG.format(steps=steps, mode=mode))
    if os.path.exists(metrics):
        os.remove(metrics)
    subprocess.run([hetra, "run", config, "--metrics", metrics], check=True,
                   stdout=subprocess.DEVNULL)
    final, last_step = None, None
    with open(metrics) as f:
        for line in f:
            record = json.loads(line)
            if record["event"] == "final":
                final = record
            elif record["event"] == "step":
                last_step = record
    return final["samples_per_s"], last_step["ranks"][0]["memory"]["activations"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hetra", default="build/tools/hetra/hetra")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    results = {"none": [], "blocks": []}
    with tempfile.TemporaryDirectory() as workdir:
        for _ in range(args.rounds):
            for mode in ("none", "blocks"):
                results[mode].append(run_once(args.hetra, mode, args.steps, workdir))
    summary = {}
    for mode, runs in results.items():
        speed = statistics.median(r[0] for r in runs)
        peak = max(r[1] for r in runs)
        summary[mode] = (speed, peak)
        print(f"{mode:7s} {speed:10.0f} samples/s  activation peak {peak / 2**20:.2f} MiB")
    print(f"activation peak {summary['none'][1] / summary['blocks'][1]:.2f}x lower, "
          f"step time {summary['none'][0] / summary['blocks'][0] - 1:+.0%} with checkpointing")


if __name__ == "__main__":
    main()
