#!/usr/bin/python3
"""ZeRO benchmarks (docs/zero.md): the largest model each sharding trains, its speed, and PyTorch FSDP.

Three parts (--parts, default all):
  largest  On each set of emulated devices with memory caps (--cap-sets, MiB), for data parallelism
           (zero.stage = 0), ZeRO-3 with even shards and ZeRO-3 with memory shards: the widest MLP of the family
           hidden = [W] * --depth that trains --steps steps with Adam (K = 8 optimizer bytes per parameter) at a
           fixed global batch without any rank running out of device memory, found by bisection on W (to a
           multiple of --resolution). Bound by memory accounting, not time: valid on a busy machine. The data are
           synthetic with Fashion-MNIST's shape (784 features, 10 classes) and a small test set, so the final
           evaluation of a large model stays quick; the model is the one fashion-mnist would train.
  speed    On the demo cluster (--speed-config, its devices, slowdowns and caps): samples/s of DP, Z1 (also with
           fixed shards, and with the update overlapped with the reduce-scatters), Z2, Z3 with and without prefetch
           (zero.shards = "memory"; --speed-variants picks some), one after the other in an order that rotates each round, under
           `flock LOCK`; medians (min-max) over rounds of samples/s and of Z1/DP, Z2/DP, Z3/DP computed within each
           round. Needs a quiet machine.
  fsdp     Tries `from torch.distributed.fsdp import FullyShardedDataParallel` with --torch-python; when it
           refuses, prints the refusal and, from FSDP's own formula (flat parameters padded to equal chunks, one
           FSDP unit per Linear layer), each rank's memory for the largest models of part 1 and whether they fit
           the smallest cap.
Prints Markdown for docs/benchmarks.md; results.json, report.md and every run's log go to bench/out/zero-<stamp>/.
See bench/README.md.
"""

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_training import (ROOT, add_output_args, cell, hetra_cmd, hetra_result, locked, machine_facts, rerender,  # noqa: E402
                              run, save_report, warmup_of)

MIB = 1 << 20
BYTES_PER_PARAMETER = 16  # fp32 parameters + gradients + Adam's two moments
FEATURES, CLASSES = 784, 10
VARIANTS = {"dp": ("DP", ["zero.stage=0"]),
            "even": ("ZeRO-3 even", ["zero.stage=3", 'zero.shards="even"']),
            "memory": ("ZeRO-3 memory", ["zero.stage=3", 'zero.shards="memory"'])}
# "fixed": the memory plan's shards kept, not moved to follow the measured optimizer speeds; "overlapped": the
# update and the all-gather group by group as each group's reduce-scatters end, not after all of them.
SPEED = {"DP": ["zero.stage=0"], "Z1": ["zero.stage=1"], "Z1 fixed": ["zero.stage=1", "zero.follow_speed=false"],
         "Z1 overlapped": ["zero.stage=1", "zero.overlap_update=true"],
         "Z2": ["zero.stage=2"],
         "Z3": ["zero.stage=3", "zero.prefetch=true"], "Z3 no prefetch": ["zero.stage=3", "zero.prefetch=false"]}
OUT_OF_MEMORY = ("ran out of device memory", "is out of memory: ", "DeviceOutOfMemoryError",
                 "too small for this model")


def log(msg):
    print(f"[zero {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="largest,speed,fsdp", help="comma list of largest, speed, fsdp")
    p.add_argument("--cap-sets", default="512,128,128/256,256,64",
                   help="slash list of comma lists of device memory caps in MiB, one device per cap")
    p.add_argument("--variants", default="dp,even,memory", help="comma list of " + ", ".join(VARIANTS))
    p.add_argument("--depth", type=int, default=3, help="hidden layers of the MLP family hidden = [W] * depth")
    p.add_argument("--resolution", type=int, default=16, help="bisect W to a multiple of this")
    p.add_argument("--steps", type=int, default=5, help="steps of each largest-model run")
    p.add_argument("--global-batch", type=int, default=64, help="global batch of the largest-model runs")
    p.add_argument("--speed-config", default="examples/fashion_mnist_hetero.toml")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the speed part")
    p.add_argument("--speed-variants", default=",".join(SPEED),
                   help="comma list of the speed part's variants (DP always runs): " + ", ".join(SPEED))
    p.add_argument("--speed-steps", type=int, default=200, help="steps of each speed run")
    p.add_argument("--speed-devices", type=int, default=0,
                   help="keep only the first N [[devices]] of --speed-config (0: all); e.g. 2 on the demo "
                        "cluster leaves no more ranks than this machine's two cores")
    p.add_argument("--hetra", default=os.path.join(ROOT, "build", "tools", "hetra", "hetra"))
    p.add_argument("--torch-python",
                   default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
    p.add_argument("--lock", default="/tmp/hetra-measure.lock",
                   help="flock this file around every speed run; '' = none (the largest-model runs take no lock)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    add_output_args(p, "zero")
    a = p.parse_args()
    a.parts = [x for x in a.parts.split(",") if x]
    if any(x not in ("largest", "speed", "fsdp") for x in a.parts):
        p.error("--parts: a comma list of largest, speed, fsdp")
    a.speed_variants = ["DP"] + [x for x in a.speed_variants.split(",") if x and x != "DP"]
    if any(x not in SPEED for x in a.speed_variants):
        p.error("--speed-variants: a comma list of " + ", ".join(SPEED))
    a.variants = [x for x in a.variants.split(",") if x]
    if any(x not in VARIANTS for x in a.variants):
        p.error("--variants: a comma list of " + ", ".join(VARIANTS))
    try:
        a.cap_sets = [[int(x) for x in group.split(",")] for group in a.cap_sets.split("/") if group]
    except ValueError:
        p.error("--cap-sets: comma lists of MiB separated by '/', e.g. 512,128,128/256,256,64")
    if any(c <= 0 for group in a.cap_sets for c in group) or any(len(g) < 2 for g in a.cap_sets):
        p.error("--cap-sets: at least two devices per set, every cap > 0")
    if a.depth < 1 or a.resolution < 1:
        p.error("--depth and --resolution must be >= 1")
    return a


def layers_of(hidden):
    """(in, out) of each Linear layer of hetra's mlp (src/train/models.cc): hidden layers, then the output."""
    widths = [FEATURES] + list(hidden) + [CLASSES]
    return list(zip(widths[:-1], widths[1:]))


def parameters_of(hidden):
    return sum(i * o + o for i, o in layers_of(hidden))


def hidden_of(a, width):
    return [width] * a.depth


def physical_width(a, caps_mib):
    """The least W whose 16 bytes per parameter pass the sum of the caps: no sharding can train it."""
    budget = sum(caps_mib) * MIB
    w = a.resolution
    while parameters_of(hidden_of(a, w)) * BYTES_PER_PARAMETER <= budget:
        w += a.resolution
    return w


def largest_sets(a, caps_mib, variant, width):
    devices = ", ".join(f'{{name="d{i}", memory="{c}MiB"}}' for i, c in enumerate(caps_mib))
    # Synthetic data of Fashion-MNIST's shape: the same model, without the 10,000-sample final evaluation.
    return ["data.name=\"synthetic\"", f"data.features={FEATURES}", f"data.classes={CLASSES}", "data.samples=1024",
            "data.test_samples=64", f"model.hidden={json.dumps(hidden_of(a, width))}", 'model.name="mlp"',
            'train.optimizer="adam"', "train.momentum=0", "train.nesterov=false", "train.lr=0.001", f"train.steps={a.steps}",
            f"train.global_batch={a.global_batch}", "train.eval_every=0", "train.log_every=0",
            'train.lr_schedule="constant"', "train.warmup_steps=0", "train.checkpoint_every=0",
            f"devices=[{devices}]"] + VARIANTS[variant][1]


def peaks_of(path):
    """Each rank's largest peak_bytes over the steps of a metrics file."""
    steps = [json.loads(line) for line in open(path) if line.strip()]
    steps = [r for r in steps if r.get("event") == "step"]
    return [max(s["ranks"][i].get("peak_bytes", -1) for s in steps) for i in range(len(steps[0]["ranks"]))]


def try_width(a, out, caps_mib, variant, width, tag):
    """Trains one model: 'fits' with each rank's peak, 'oom', or raises on any other failure."""
    stem = os.path.join(out, f"{tag}-{variant}-w{width}")
    cmd = hetra_cmd(a, os.path.join(ROOT, a.speed_config), largest_sets(a, caps_mib, variant, width), stem + ".jsonl")
    t0 = time.monotonic()
    rc = run(cmd, a.timeout, stem + ".log")
    text = open(stem + ".log", errors="replace").read()
    if rc == 0:
        result = {"fits": True, "peaks": peaks_of(stem + ".jsonl")}
    elif any(m in text for m in OUT_OF_MEMORY):
        result = {"fits": False}
    else:
        # Not a fit either, but not memory's verdict: the report lists it and the exit status says so.
        said = [x for x in text.splitlines() if x.startswith("hetra run: FAILED")]
        result = {"fits": False, "error": (said[-1] if said else f"exit status {rc}") + f" ({stem}.log)"}
    log(f"{tag} {VARIANTS[variant][0]} W={width} ({parameters_of(hidden_of(a, width)) / 1e6:.2f}M parameters): "
        f"{'trains' if result['fits'] else result.get('error', 'out of memory')} ({time.monotonic() - t0:.1f}s)")
    return result


def bisect(a, out, caps_mib, variant, tag):
    """The widest W (a multiple of --resolution) that trains, between one that trains and the physical limit,
    which cannot (its state alone passes the sum of the caps, so it is not run)."""
    tries = []
    lo, hi = a.resolution, physical_width(a, caps_mib)
    first = try_width(a, out, caps_mib, variant, lo, tag)
    tries.append((lo, first["fits"]))
    errors = [first["error"]] if "error" in first else []
    if not first["fits"]:
        return {"width": None, "tries": tries, "errors": errors}
    best = first
    while hi - lo > a.resolution:
        mid = (lo + hi) // 2 // a.resolution * a.resolution
        mid = mid if mid > lo else lo + a.resolution
        res = try_width(a, out, caps_mib, variant, mid, tag)
        tries.append((mid, res["fits"]))
        errors += [res["error"]] if "error" in res else []
        if res["fits"]:
            lo, best = mid, res
        else:
            hi = mid
    return {"width": lo, "parameters": parameters_of(hidden_of(a, lo)), "peaks": best["peaks"], "tries": tries, "errors": errors,
            "first_failing_width": hi, "first_failing_parameters": parameters_of(hidden_of(a, hi))}


def run_largest(a, out):
    results = []
    for caps in a.cap_sets:
        tag = "caps-" + "-".join(map(str, caps))
        entry = {"caps_mib": caps, "physical_parameters": sum(caps) * MIB // BYTES_PER_PARAMETER, "variants": {}}
        for v in a.variants:
            entry["variants"][v] = bisect(a, out, caps, v, tag)
        results.append(entry)
    return results


def devices_kept(config_path, keep, out):
    """A copy of the config in `out` with its first `keep` [[devices]] only (0: the config itself)."""
    if keep <= 0:
        return config_path
    with open(os.path.join(ROOT, config_path)) as f:
        parts = f.read().split("[[devices]]")
    if len(parts) - 1 < keep:
        raise SystemExit(f"--speed-devices {keep}: {config_path} has {len(parts) - 1} [[devices]]")
    path = os.path.join(out, f"speed-config-{keep}-devices.toml")
    with open(path, "w") as f:
        f.write("[[devices]]".join(parts[:keep + 1]))
    return path


def run_speed(a, out):
    keys = a.speed_variants
    config = devices_kept(a.speed_config, a.speed_devices, out)
    results = {k: [None] * a.rounds for k in keys}
    failures = 0
    warmup = warmup_of(a.speed_steps, 5)
    for rnd in range(a.rounds):
        for key in keys[rnd % len(keys):] + keys[:rnd % len(keys)]:
            stem = os.path.join(out, f"speed-r{rnd}-{key.replace(' ', '-')}")
            sets = SPEED[key] + ['zero.shards="memory"', f"train.steps={a.speed_steps}", "train.eval_every=0",
                                 "train.log_every=0", 'train.lr_schedule="constant"', "train.warmup_steps=0"]
            t0 = time.monotonic()
            rc = run(locked(a, hetra_cmd(a, config, sets, stem + ".jsonl")), a.timeout, stem + ".log")
            try:
                if rc != 0:
                    raise RuntimeError(f"exit status {rc}")
                results[key][rnd] = hetra_result(stem + ".jsonl", warmup)
                log(f"speed round {rnd + 1}/{a.rounds} {key}: {results[key][rnd]['samples_per_s']:.0f} samples/s "
                    f"({time.monotonic() - t0:.1f}s)")
            except (RuntimeError, OSError, ValueError, StopIteration, KeyError, IndexError) as e:
                log(f"speed round {rnd + 1}/{a.rounds} {key}: FAILED ({e}); see {stem}.log")
                failures += 1
    return {"results": results, "failures": failures, "warmup": warmup}


def try_fsdp(a):
    """FSDP's import on this interpreter: 'ok' or the refusal's last line, verbatim."""
    code = "import torch; print(torch.__version__, flush=True); from torch.distributed.fsdp import FullyShardedDataParallel"
    p = subprocess.run([a.torch_python, "-c", code], capture_output=True, text=True, timeout=120)
    lines = [x for x in p.stderr.strip().splitlines() if x.strip()]
    return {"imports": p.returncode == 0, "torch": p.stdout.strip(),
            "refusal": lines[-1] if p.returncode != 0 and lines else "",
            "python": subprocess.run([a.torch_python, "--version"], capture_output=True, text=True).stdout.strip()}


def fsdp_rank_bytes(hidden, ranks):
    """FSDP (even shards), one unit per Linear layer: each unit's flat parameter padded to `ranks` equal chunks,
    a rank holding one chunk of parameters, gradients and Adam's two moments (16 bytes an element), plus the
    unsharded parameters of the largest unit while it runs (4 bytes an element)."""
    units = [i * o + o for i, o in layers_of(hidden)]
    return sum(math.ceil(u / ranks) for u in units) * BYTES_PER_PARAMETER + 4 * max(units)


def main():
    a = parse_args()
    if a.report:
        return rerender(a.report, render, not a.no_spread)
    if ("largest" in a.parts or "speed" in a.parts) and not os.access(a.hetra, os.X_OK):
        raise SystemExit(f"no hetra binary at {a.hetra} (ninja -C build hetra)")
    out = a.out or os.path.join(ROOT, "bench", "out", "zero-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    log(f"parts {', '.join(a.parts)}; output in {out}")
    facts = machine_facts(a.torch_python)
    started = time.monotonic()
    saved = {"command": "bench/compare_zero.sh " + shlex.join(sys.argv[1:]), "facts": facts, "depth": a.depth,
             "steps": a.steps, "global_batch": a.global_batch, "resolution": a.resolution,
             "speed_config": a.speed_config, "speed_devices": a.speed_devices, "rounds": a.rounds, "speed_steps": a.speed_steps, "failures": 0}
    if "largest" in a.parts:
        saved["largest"] = run_largest(a, out)
        saved["failures"] += sum(len(v["errors"]) for e in saved["largest"] for v in e["variants"].values())
    if "speed" in a.parts:
        saved["speed"] = run_speed(a, out)
        saved["failures"] += saved["speed"]["failures"]
    if "fsdp" in a.parts:
        saved["fsdp"] = try_fsdp(a)
    facts["elapsed_s"] = round(time.monotonic() - started)
    save_report(out, saved, render, not a.no_spread)
    return 0 if saved["failures"] == 0 else 1


def millions(n):
    return f"{n / 1e6:.2f}M" if n is not None else "-"


def failing(v):
    """The least width tried that ran out, or the physical bracket when every width tried trained."""
    w = v.get("first_failing_width")
    if w is None:
        return "-"
    return str(w) if any(t == w and not fits for t, fits in v["tries"]) else f"{w} (physical limit, not run)"


def render_largest(saved):
    d = saved["depth"]
    lines = [f"Largest trainable model: MLP 784-[W]x{d}-10 (hidden = [W] * {d}), Adam (16 bytes a parameter: fp32 "
             f"parameters, gradients, two moments), global batch {saved['global_batch']}, {saved['steps']} steps; W "
             f"bisected to a multiple of {saved['resolution']}: the widest that trains without "
             "DeviceOutOfMemoryError on any device (the next width tried ran out). Physical limit = sum of caps / 16 "
             "bytes. Peaks: each device's accounted peak (metrics peak_bytes) at the largest model, MiB.", "",
             "| caps (MiB) | variant | largest W | parameters | / ZeRO-3 even | / DP | / physical limit | first failing "
             "W | peak per device (MiB) |", "|---|---|---|---|---|---|---|---|---|"]
    for entry in saved["largest"]:
        caps, vs = entry["caps_mib"], entry["variants"]
        phys = entry["physical_parameters"]
        for key, v in vs.items():
            p = v.get("parameters")
            even, dp = vs.get("even", {}).get("parameters"), vs.get("dp", {}).get("parameters")
            ratio = lambda base: f"{p / base:.2f}x" if p and base else "-"  # noqa: E731
            peaks = "/".join(f"{x / MIB:.0f}" for x in v.get("peaks", [])) or "-"
            lines.append("| " + " | ".join([
                "/".join(map(str, caps)), VARIANTS[key][0], str(v["width"] or "-"), millions(p), ratio(even),
                ratio(dp), f"{p / phys:.1%}" if p else "-", failing(v), peaks]) + " |")
        lines.append("| " + "/".join(map(str, caps)) + " | physical limit | - | " + millions(phys) +
                     " | - | - | 100% | - | - |")
    errors = [(e["caps_mib"], k, x) for e in saved["largest"] for k, v in e["variants"].items()
              for x in v.get("errors", [])]
    if errors:
        lines += ["", "Runs that failed otherwise than out of memory (counted as not training, and as failures):"]
        lines += [f"- {'/'.join(map(str, caps))} {VARIANTS[k][0]}: `{x}`" for caps, k, x in errors]
    return lines


def render_fsdp(saved):
    f = saved["fsdp"]
    lines = ["", f"PyTorch FSDP ({f['python']}, torch {f['torch'] or '?'}): `from torch.distributed.fsdp import "
             "FullyShardedDataParallel` " + ("imports" if f["imports"] else f"fails: `{f['refusal']}`") + ".", ""]
    if "largest" not in saved:
        return lines
    lines += ["FSDP's even shards from its own formula (one FSDP unit per Linear layer, each flat parameter padded "
              "to n equal chunks; per rank: 16 bytes x the sum of ceil(unit / n) + the largest unit's unsharded "
              "parameters, 4 bytes each, while it runs; activations not counted) for the largest models found "
              "above:", "", "| caps (MiB) | model (largest of) | parameters | FSDP per rank (MiB) | fits the "
              "smallest cap? |", "|---|---|---|---|---|"]
    for entry in saved["largest"]:
        caps = entry["caps_mib"]
        for key, v in entry["variants"].items():
            if not v["width"]:
                continue
            hidden = [v["width"]] * saved["depth"]
            need = fsdp_rank_bytes(hidden, len(caps))
            lines.append(f"| {'/'.join(map(str, caps))} | {VARIANTS[key][0]} (W={v['width']}) | "
                         f"{millions(parameters_of(hidden))} | {need / MIB:.1f} | "
                         f"{'yes' if need <= min(caps) * MIB else 'no'} ({min(caps)} MiB) |")
        w = saved["resolution"]
        while fsdp_rank_bytes([w + saved["resolution"]] * saved["depth"], len(caps)) <= min(caps) * MIB:
            w += saved["resolution"]
        hidden = [w] * saved["depth"]
        lines.append(f"| {'/'.join(map(str, caps))} | FSDP's own largest by this formula (W={w}) | "
                     f"{millions(parameters_of(hidden))} | {fsdp_rank_bytes(hidden, len(caps)) / MIB:.1f} | "
                     f"yes ({min(caps)} MiB) |")
    return lines


def render_speed(saved, spread):
    sp = saved["speed"]
    res = sp["results"]

    def sps(key, rnd):
        return res[key][rnd]["samples_per_s"]

    def vals(fn):
        out = []
        for rnd in range(saved["rounds"]):
            try:
                out.append(fn(rnd))
            except (TypeError, KeyError, ZeroDivisionError):
                pass
        return out

    kept = saved.get("speed_devices", 0)
    devices = f"its first {kept} devices" if kept else "its devices"
    lines = ["", f"Speed on the demo cluster (`{saved['speed_config']}`, {devices}, slowdowns and caps; "
             f"zero.shards = \"memory\"): {saved['rounds']} rounds of {saved['speed_steps']} steps, order rotated "
             f"each round; samples/s = the final record's mean after the warm-up ({sp['warmup']} steps); ratios "
             "within each round, then the median (min-max).", "",
             "| variant | samples/s | / DP | step (ms) |", "|---|---|---|---|"]
    for key in res:
        lines.append("| " + " | ".join([
            key, cell(vals(lambda r: sps(key, r)), 0, spread),
            cell(vals(lambda r: sps(key, r) / sps("DP", r)), 3, spread, "x") if key != "DP" else "1",
            cell(vals(lambda r: res[key][r]["step_time_s"] * 1e3), 2, spread)]) + " |")
    if sp["failures"]:
        lines.append(f"\n**{sp['failures']} speed run(s) failed**: see the logs next to results.json.")
    return lines


def render(saved, spread):
    facts = saved["facts"]
    lines = [f"Command: `{saved['command']}`  ", f"Date: {facts['date']}; machine: nproc {facts['nproc']} "
             f"({facts['affinity']} usable), {facts['cpu']}; hetra {facts['hetra_commit']}; "
             f"{facts.get('elapsed_s', '?')} s in all.", ""]
    if "largest" in saved:
        lines += render_largest(saved)
    if "speed" in saved:
        lines += render_speed(saved, spread)
    if "fsdp" in saved:
        lines += render_fsdp(saved)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
