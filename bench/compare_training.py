#!/usr/bin/python3
"""Side-by-side training throughput on emulated heterogeneous devices: hetra vs PyTorch DDP, against ideal.

For each scenario (a hetra config and its devices' slowdowns) and in every round, runs one after the other,
in an order that rotates from round to round:
  - hetra solo runs: the scenario's config with one device of slowdown s (each distinct s), same model, data
    and optimizer, one micro-batch (no memory cap), at the whole global batch B and at smaller global batches
    b (--curve, fractions of B): the device's time curve t_s(b) = b / its samples/s at b;
  - hetra on the scenario's devices (its metrics' final samples_per_s, and the balancer's own prediction
    ideal_samples_per_s of its step records);
  - bench/torch_ddp_train.py on the same devices (DDP, Gloo), the slow devices' extra time slept before
    their forward: with the equal split (DDP-equal), and for scenarios with unequal slowdowns also with a
    static split proportional to the speeds 1/s_i and the losses rescaled by b_i*N/B (DDP-proportional);
  - a PyTorch solo run at slowdown 1, to compare the two stacks' per-sample speed.
The two ideals of docs/benchmarks.md, computed within each round:
  - whole-batch ideal = sum over devices of solo_i, device i alone with the whole global batch;
  - balancer-optimal ideal = B / min over integer splits sum b_i = B of max_i t_i(b_i), with t_i linear
    between the measured points (and from t_i(0) = 0 to the smallest one).
efficiency = hetra samples/s / ideal; hetra/DDP-equal and hetra/DDP-proportional are speed ratios.
--models and --slowdown-sets turn each scenario into one per (model, slowdowns), the config's model and devices
replaced (no memory caps): e.g. --models mlp,cnn,transformer --slowdown-sets 1,2,4/1,3,3. The DDP peer trains
the MLP 784-512-512-10 only: its runs are left out for the other models, and everywhere with --no-ddp.
Runs whose effective hetra configs are equal (--print-config) are measured once per round and shared.
Every measuring process runs under `flock LOCK` (--lock), so it never overlaps another measurement that
takes the same lock. The tables show medians over rounds with (min-max). Prints Markdown for
docs/benchmarks.md; raw metrics, logs, results.json and report.md go to bench/out/train-<stamp>/.
See bench/README.md.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "bench", "torch_ddp_train.py")
SCENARIOS = {
    "hetero": "examples/fashion_mnist_hetero.toml",
    "equal": "examples/two_equal_devices.toml",
}
# hetra's defaults for keys a config may omit (src/train/config.h).
DEFAULTS = {"lr": 0.1, "momentum": 0.0, "nesterov": False, "seed": 1, "profile_steps": 5}


def log(msg):
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def add_output_args(p, stem):
    """The options every compare_* script of this folder shares: --no-spread, --report DIR, --out DIR."""
    p.add_argument("--no-spread", action="store_true", help="omit the (min-max) over rounds")
    p.add_argument("--report", metavar="DIR", default=None, help="re-render DIR/results.json, run nothing")
    p.add_argument("--out", default=None, help=f"directory for raw results (default bench/out/{stem}-<time>)")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default="hetero,equal",
                   help="comma list of " + ", ".join(SCENARIOS) + " or NAME=CONFIG.toml")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200, help="steps of each multi-device run")
    p.add_argument("--solo-steps", type=int, default=200,
                   help="steps of a solo run at slowdown 1; at slowdown s: max(60, this / s)")
    p.add_argument("--curve", default="0.0625,0.125,0.25,0.5,0.75",
                   help="global batches of the solo time curves besides B, as fractions of B (comma separated)")
    p.add_argument("--no-torch-solo", dest="torch_solo", action="store_false")
    p.add_argument("--models", default="", help="comma list of hetra models (mlp, cnn, transformer) to run each "
                   "scenario with, instead of its config's")
    p.add_argument("--slowdown-sets", default="", help="slash list of comma lists of slowdowns, e.g. 1,2,4/1,3,3: "
                   "each scenario's devices replaced by these (one device per slowdown)")
    p.add_argument("--no-ddp", dest="ddp", action="store_false", help="leave out the PyTorch DDP runs")
    p.add_argument("--hetra", default=os.path.join(ROOT, "build", "tools", "hetra", "hetra"))
    p.add_argument("--torch-python",
                   default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
    p.add_argument("--lock", default="/tmp/hetra-measure.lock", help="flock this file around every run; '' = none")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run, waiting for the lock included")
    add_output_args(p, "train")
    a = p.parse_args()
    a.scenarios = [s for s in a.scenarios.split(",") if s]
    a.models = [m for m in a.models.split(",") if m]
    try:
        a.slowdown_sets = [[float(x) for x in group.split(",")] for group in a.slowdown_sets.split("/") if group]
    except ValueError:
        p.error("--slowdown-sets: comma lists of numbers separated by '/', e.g. 1,2,4/1,3,3")
    if any(x < 1 for group in a.slowdown_sets for x in group):
        p.error("--slowdown-sets: every slowdown must be >= 1")
    try:
        a.curve = sorted({float(f) for f in a.curve.split(",") if f.strip()})
    except ValueError:
        p.error("--curve: comma separated fractions of the global batch, e.g. 0.125,0.25,0.5")
    if any(not 0 < f < 1 for f in a.curve):
        p.error("--curve: every fraction must lie strictly between 0 and 1 (B itself is always measured)")
    return a


def run(cmd, timeout, log_path):
    """Runs cmd in its own session (so a timeout kills flock and what it started), output to log_path."""
    with open(log_path, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            f.write(f"\n[compare] killed after {timeout:.0f}s\n")
            return 124


def locked(a, cmd):
    return (["flock", a.lock] if a.lock else []) + cmd


def load_scenario(name, spec):
    path = spec.split("=", 1)[1] if "=" in spec else SCENARIOS[spec]
    with open(os.path.join(ROOT, path), "rb") as f:
        cfg = tomllib.load(f)
    train, devices = cfg.get("train", {}), cfg.get("devices", [{}])
    if any(int(d.get("threads", 1)) != 1 for d in devices):
        raise SystemExit(f"{path}: the DDP peer runs one thread per rank; every device needs threads = 1")
    model = cfg.get("model", {})
    mlp = model.get("name", "mlp") == "mlp" and model.get("hidden", [512, 512]) == [512, 512]
    return {"name": name, "config": path, "slowdowns": [float(d.get("slowdown", 1)) for d in devices],
            "sets": [], "ddp": mlp,
            "global_batch": int(train.get("global_batch", 512)), "lr": float(train.get("lr", DEFAULTS["lr"])),
            "momentum": float(train.get("momentum", DEFAULTS["momentum"])),
            "nesterov": bool(train.get("nesterov", DEFAULTS["nesterov"])),
            "seed": int(train.get("seed", DEFAULTS["seed"])),
            "profile_steps": int(cfg.get("balance", {}).get("profile_steps", DEFAULTS["profile_steps"]))}


def expand(a, scenarios):
    """One scenario per (scenario, model, slowdown set) of --models x --slowdown-sets (each defaulting to the
    scenario's own)."""
    out = []
    for sc in scenarios:
        for model in a.models or [None]:
            for slowdowns in a.slowdown_sets or [None]:
                x = dict(sc, sets=list(sc["sets"]))
                if model:
                    x["name"] += f"-{model}"
                    x["sets"].append(f'model.name="{model}"')
                    x["ddp"] = sc["ddp"] and model == "mlp"
                if slowdowns:
                    x["name"] += "-" + "-".join(f"{s:g}" for s in slowdowns)
                    x["slowdowns"] = slowdowns
                    x["sets"].append("devices=[" + ", ".join(f'{{name="d{i}", slowdown={s:g}}}'
                                                             for i, s in enumerate(slowdowns)) + "]")
                x["ddp"] = x["ddp"] and a.ddp
                out.append(x)
    return out


def warmup_of(steps, profile_steps):
    # hetra's (src/train/trainer.cc): the mean after a warm-up that covers the balancer's profiling.
    return min(max(10, profile_steps + 5), steps // 3)


def hetra_sets(steps, solo_slowdown=None, global_batch=None):
    # Throughput runs: no evaluation, no console lines, a constant learning rate (the peer's).
    sets = [f"train.steps={steps}", "train.eval_every=0", "train.log_every=0", 'train.lr_schedule="constant"',
            "train.warmup_steps=0"]
    if solo_slowdown is not None:
        sets.append(f'devices=[{{name="solo", slowdown={solo_slowdown:g}}}]')
    if global_batch is not None:
        sets.append(f"train.global_batch={global_batch}")
    return sets


def curve_batches(a, global_batch):
    """The global batches of a solo time curve: the --curve fractions of B (at least 1 sample), then B."""
    return sorted({max(1, round(f * global_batch)) for f in a.curve} | {global_batch})


def hetra_cmd(a, config, sets, metrics=None):
    cmd = [a.hetra, "run", config]
    for s in sets:
        cmd += ["--set", s]
    return cmd + (["--metrics", metrics] if metrics else [])


def effective_config(a, config, sets):
    out = subprocess.run(hetra_cmd(a, config, sets) + ["--print-config"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    if out.returncode != 0:
        raise SystemExit(f"hetra --print-config failed for {config}: {out.stderr.strip()}")
    return out.stdout


def plan_runs(a, scenarios):
    """The runs of one round: (key, kind, description). Solo runs with equal effective configs are shared."""
    runs, solo_key = {}, {}
    for sc in scenarios:
        for s in sorted(set(sc["slowdowns"])):
            steps = a.solo_steps if s == 1 else max(60, int(a.solo_steps / s))
            for b in curve_batches(a, sc["global_batch"]):
                whole = b == sc["global_batch"]
                sets = sc["sets"] + hetra_sets(steps, s, None if whole else b)
                text = effective_config(a, sc["config"], sets)
                key = next((k for k, r in runs.items() if r.get("text") == text), None)
                if key is None:
                    key = f"solo-{s:g}" + ("" if whole else f"-b{b}")
                    key = key if key not in runs else f"{key}-{sc['name']}"
                    runs[key] = {"kind": "hetra", "config": sc["config"], "sets": sets, "text": text,
                                 "batch": b, "warmup": warmup_of(steps, sc["profile_steps"])}
                solo_key[(sc["name"], s, b)] = key
        runs[f"hetra-{sc['name']}"] = {"kind": "hetra", "config": sc["config"],
                                       "sets": sc["sets"] + hetra_sets(a.steps),
                                       "warmup": warmup_of(a.steps, sc["profile_steps"])}
        splits = (["equal"] + (["proportional"] if len(set(sc["slowdowns"])) > 1 else [])) if sc["ddp"] else []
        for split in splits:
            runs[f"ddp-{sc['name']}" + ("" if split == "equal" else "-prop")] = {
                "kind": "torch", "scenario": sc, "split": split, "steps": a.steps,
                "warmup": warmup_of(a.steps, sc["profile_steps"])}
    ddp_scenarios = [sc for sc in scenarios if sc["ddp"]]
    if a.torch_solo and ddp_scenarios:
        sc = ddp_scenarios[0]
        runs["torch-solo-1"] = {"kind": "torch", "scenario": sc, "solo": 1.0, "steps": a.solo_steps,
                                "warmup": warmup_of(a.solo_steps, sc["profile_steps"])}
    for r in runs.values():
        r.pop("text", None)
    return runs, {f"{k[0]}:{k[1]:g}:{k[2]}": v for k, v in solo_key.items()}


def measure(a, cmd, stem, parse, label):
    """Runs cmd under the lock (output to STEM.log) and returns parse(), or None after logging the failure."""
    t0 = time.monotonic()
    rc = run(locked(a, cmd), a.timeout, stem + ".log")
    try:
        if rc != 0:
            raise RuntimeError(f"exit status {rc}")
        res = parse()
    except (RuntimeError, OSError, ValueError, StopIteration, KeyError, IndexError) as e:
        log(f"{label}: FAILED ({e}); see {stem}.log")
        return None
    log(f"{label}: {res['samples_per_s']:.0f} samples/s ({time.monotonic() - t0:.1f}s)")
    return res


def torch_cmd(a, r, json_path):
    sc = r["scenario"]
    cmd = [a.torch_python, PEER, "--global-batch", str(sc["global_batch"]), "--steps", str(r["steps"]),
           "--warmup", str(r["warmup"]), "--lr", str(sc["lr"]), "--momentum", str(sc["momentum"]),
           "--seed", str(sc["seed"]), "--json", json_path, "--quiet"]
    if not sc["nesterov"]:
        cmd.append("--no-nesterov")
    if "solo" in r:
        return cmd + ["--solo", "--slowdowns", f"{r['solo']:g}"]
    return cmd + ["--slowdowns", ",".join(f"{s:g}" for s in sc["slowdowns"]), "--emulate", "before-forward",
                  "--split", r["split"]]


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def hetra_result(path, warmup):
    """The final samples_per_s, the balancer's own prediction (median over the measured steps that have one)
    and the medians over the measured steps of step time and per-rank stats."""
    records = [json.loads(line) for line in open(path) if line.strip()]
    final = next(r for r in records if r["event"] == "final")
    steps = [r for r in records if r["event"] == "step" and r["step"] > warmup]
    ranks = []
    for i, rank in enumerate(steps[-1]["ranks"]):
        ranks.append({"device": rank["device"], "batch": rank["batch"], "micro_batch": rank["micro_batch"],
                      "accum": rank["accum"],
                      "compute_s": median(s["ranks"][i]["compute_s"] for s in steps),
                      "comm_s": median(s["ranks"][i]["comm_s"] for s in steps)})
    return {"samples_per_s": final["samples_per_s"], "step_time_s": median(s["step_time_s"] for s in steps),
            "ideal_samples_per_s": median(s.get("ideal_samples_per_s") for s in steps),
            "median_step_samples_per_s": median(s["samples"] / s["step_time_s"] for s in steps),
            "regret": median(s.get("balance_regret") for s in steps),
            "plan_versions": len({s.get("plan_version") for s in steps}), "ranks": ranks}


def torch_result(path):
    r = json.load(open(path))
    steps = r["step_records"][r["warmup"]:]
    return {"samples_per_s": r["samples_per_s"], "step_time_s": median(s["step_time_s"] for s in steps),
            "batches": r["batches"], "ranks": r["ranks"]}


def machine_facts(torch_python):
    facts = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "nproc": os.cpu_count(),
             "affinity": len(os.sched_getaffinity(0)), "cpu": platform.processor() or "?"}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=20).stdout.splitlines():
            if line.startswith("Model name:"):
                facts["cpu"] = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=20).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "src", "tools"],
                               capture_output=True, text=True, timeout=20).stdout.strip()
        facts["hetra_commit"] = head + (" + uncommitted changes in src/ tools/" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        facts["hetra_commit"] = "?"
    try:
        facts["torch"] = subprocess.run([torch_python, "-c",
                                         "import torch; print(torch.__version__)"], capture_output=True,
                                        text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        facts["torch"] = "?"
    return facts


def output_dir(a, stem, log):
    """OUT (a.out, else bench/out/<stem>-<time>), made, once the hetra binary is there to run."""
    if not os.access(a.hetra, os.X_OK):
        raise SystemExit(f"no hetra binary at {a.hetra} (ninja -C build hetra)")
    out = a.out or os.path.join(ROOT, "bench", "out", stem + "-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    log(f"output in {out}")
    return out


def run_config_rounds(a, out, configs, parse, log):
    """Runs `hetra run` on each of `configs` ({variant: TOML text}, written to OUT/<variant>.toml) once per round
    (a.rounds), in an order rotated each round, under `flock a.lock`, each with its metrics in OUT/r<round>-<variant>
    .jsonl and its output in .log; parse(stem) reads a run's result (a dict with samples_per_s). Returns
    ({variant: [result or None per round]}, failures)."""
    variants = list(configs)
    for v, text in configs.items():
        with open(os.path.join(out, f"{v}.toml"), "w") as f:
            f.write(text)
    results, failures = {v: [None] * a.rounds for v in variants}, 0
    for rnd in range(a.rounds):
        for v in variants[rnd % len(variants):] + variants[:rnd % len(variants)]:
            stem = os.path.join(out, f"r{rnd}-{v}")
            cmd = [a.hetra, "run", os.path.join(out, f"{v}.toml"), "--metrics", stem + ".jsonl"]
            t0 = time.monotonic()
            rc = run(locked(a, cmd), a.timeout, stem + ".log")
            try:
                if rc != 0:
                    raise RuntimeError(f"exit status {rc}")
                results[v][rnd] = parse(stem)
                log(f"round {rnd + 1}/{a.rounds} {v}: {results[v][rnd]['samples_per_s']:.1f} samples/s "
                    f"({time.monotonic() - t0:.0f}s)")
            except (RuntimeError, OSError, ValueError, StopIteration, KeyError, IndexError) as e:
                log(f"round {rnd + 1}/{a.rounds} {v}: FAILED ({e}); see {stem}.log")
                failures += 1
    return results, failures


def report_header(saved):
    """The lines every report of this folder starts with: the command, the date, the machine, hetra's commit."""
    f = saved["facts"]
    return [f"Command: `{saved['command']}`  ",
            f"Date: {f['date']}; machine: nproc {f['nproc']} ({f['affinity']} usable), {f['cpu']}; "
            f"hetra {f.get('hetra_commit', '?')}; {f.get('elapsed_s', '?')} s in all.", ""]


def rerender(directory, render, spread):
    """--report: prints render() of DIR/results.json; the exit status is 1 if any of its runs failed."""
    saved = json.load(open(os.path.join(directory, "results.json")))
    print(render(saved, spread))
    return 0 if saved.get("failures", 0) == 0 else 1


def save_report(out, saved, render, spread):
    """Writes OUT/results.json and OUT/report.md (render() of it) and prints the report."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(saved, f, indent=1)
    report = render(saved, spread)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(report)
    print(report)


def main():
    a = parse_args()
    if a.report:
        return rerender(a.report, render, not a.no_spread)
    if not os.access(a.hetra, os.X_OK):
        raise SystemExit(f"no hetra binary at {a.hetra} (ninja -C build hetra)")
    unknown = [s for s in a.scenarios if "=" not in s and s not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}: use {', '.join(SCENARIOS)} or NAME=CONFIG.toml")
    scenarios = expand(a, [load_scenario(s.split("=", 1)[0], s) for s in a.scenarios])
    out = a.out or os.path.join(ROOT, "bench", "out", "train-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    runs, solo_key = plan_runs(a, scenarios)
    keys = list(runs)
    log(f"{len(keys)} runs per round, {a.rounds} rounds: {', '.join(keys)}; output in {out}")
    facts = machine_facts(a.torch_python)
    results = {k: [None] * a.rounds for k in keys}
    failures = 0
    started = time.monotonic()
    for rnd in range(a.rounds):
        order = keys[rnd % len(keys):] + keys[:rnd % len(keys)]
        for key in order:
            r = runs[key]
            stem = os.path.join(out, f"r{rnd}-{key}")
            if r["kind"] == "hetra":
                cmd = hetra_cmd(a, r["config"], r["sets"], stem + ".jsonl")
            else:
                cmd = torch_cmd(a, r, stem + ".json")
            if r["kind"] == "hetra":
                parse = lambda stem=stem, r=r: hetra_result(stem + ".jsonl", r["warmup"])
            else:
                parse = lambda stem=stem: torch_result(stem + ".json")
            results[key][rnd] = measure(a, cmd, stem, parse, f"round {rnd + 1}/{a.rounds} {key}")
            if results[key][rnd] is None:
                failures += 1
    facts["elapsed_s"] = round(time.monotonic() - started)
    saved = {"command": "bench/compare_training.sh " + shlex.join(sys.argv[1:]), "facts": facts,
             "rounds": a.rounds, "steps": a.steps, "solo_steps": a.solo_steps, "lock": a.lock,
             "scenarios": scenarios, "solo_key": solo_key,
             "runs": {k: {kk: vv for kk, vv in v.items() if kk != "scenario"} for k, v in runs.items()},
             "results": results, "failures": failures}
    save_report(out, saved, render, not a.no_spread)
    return 0 if failures == 0 else 1


def per_round(saved, fn):
    vals = []
    for rnd in range(saved["rounds"]):
        try:
            vals.append(fn(rnd))
        except (TypeError, KeyError, ZeroDivisionError):
            vals.append(None)
    return [v for v in vals if v is not None]


def cell(vals, digits, spread, suffix=""):
    if not vals:
        return "-"
    text = f"{statistics.median(vals):.{digits}f}{suffix}"
    if spread and len(vals) > 1:
        text += f" ({min(vals):.{digits}f}-{max(vals):.{digits}f})"
    return text


def balancer_optimal(curves, global_batch):
    """(B / the least max_i t_i(b_i) over integer splits sum b_i = B, the split). curves: per device the
    measured (b, seconds) points; t_i is linear between them and from t_i(0) = 0 to the first, made
    nondecreasing (more samples never take less time). The least max is the B-th smallest of the
    values t_i(b), b >= 1, over all devices (hand out samples one at a time to the device that ends its
    next one soonest); a rank may get none."""
    times = []
    for points in curves:
        pts = [(0, 0.0)] + sorted(points)
        row, worst = [0.0], 0.0
        for b in range(1, global_batch + 1):
            j = next(k for k in range(1, len(pts)) if pts[k][0] >= b or k == len(pts) - 1)
            (b0, t0), (b1, t1) = pts[j - 1], pts[j]
            worst = max(worst, t0 + (t1 - t0) * (b - b0) / (b1 - b0))
            row.append(worst)
        times.append(row)
    step = sorted(t for row in times for t in row[1:])[global_batch - 1]
    split = [max(b for b in range(global_batch + 1) if row[b] <= step) for row in times]
    while sum(split) > global_batch:  # ties at the level: take back from the highest rank first
        r = max(i for i in range(len(split)) if split[i] > 0 and times[i][split[i]] == step)
        split[r] -= 1
    return global_batch / step, split


def render(saved, spread):
    res, facts = saved["results"], saved["facts"]

    def sps(key, rnd):
        return res[key][rnd]["samples_per_s"]

    def solo(sc, s, b=None):
        return saved["solo_key"][f"{sc['name']}:{s:g}:{b or sc['global_batch']}"]

    def whole_ideal(sc, rnd):
        return sum(sps(solo(sc, s), rnd) for s in sc["slowdowns"])

    def curve_of(sc, s, rnd):
        keys = {k for kk, k in saved["solo_key"].items() if kk.startswith(f"{sc['name']}:{s:g}:")}
        return [(saved["runs"][k]["batch"], saved["runs"][k]["batch"] / sps(k, rnd)) for k in keys]

    def optimal(sc, rnd):
        return balancer_optimal([curve_of(sc, s, rnd) for s in sc["slowdowns"]], sc["global_batch"])

    lines = [f"Command: `{saved['command']}`  ", f"Date: {facts['date']}; machine: nproc {facts['nproc']} "
             f"({facts['affinity']} usable), {facts['cpu']}; hetra {facts['hetra_commit']}; PyTorch "
             f"{facts['torch']} (Gloo); {saved['rounds']} rounds, {saved['steps']} steps per multi-device run, "
             f"{facts.get('elapsed_s', '?')} s in all.", "",
             "samples/s: medians over rounds (min-max); ideals, efficiencies and ratios computed within each "
             "round, then the median. Whole-batch ideal = sum of solo_i, each device alone (hetra) with the "
             "whole global batch. Balancer-optimal ideal = B / min over splits of max_i t_i(b_i), from each "
             "device's solo time curve (below), no communication. Balancer's prediction = hetra's "
             "ideal_samples_per_s (its fitted curves). DDP = PyTorch DistributedDataParallel over Gloo, the slow "
             "devices' extra time slept before their forward; -equal: equal split; -proportional: static split "
             "proportional to the speeds 1/s_i, losses rescaled by b_i*N/B.", "",
             "| scenario | slowdowns | whole-batch ideal | balancer-optimal ideal (split) | balancer's prediction "
             "| hetra | efficiency vs whole-batch | efficiency vs balancer-optimal |", "|---|---|---|---|---|---|---|---|"]
    for sc in saved["scenarios"]:
        name, sl, hk = sc["name"], sc["slowdowns"], f"hetra-{sc['name']}"
        splits = {tuple(v[1]) for v in per_round(saved, lambda r: optimal(sc, r))}
        lines.append("| " + " | ".join([
            name, ",".join(f"{s:g}" for s in sl),
            cell(per_round(saved, lambda r: whole_ideal(sc, r)), 0, spread),
            cell(per_round(saved, lambda r: optimal(sc, r)[0]), 0, spread) + " (" +
            ", ".join("/".join(map(str, x)) for x in sorted(splits)) + ")",
            cell(per_round(saved, lambda r: res[hk][r]["ideal_samples_per_s"]), 0, spread),
            cell(per_round(saved, lambda r: sps(hk, r)), 0, spread),
            cell(per_round(saved, lambda r: sps(hk, r) / whole_ideal(sc, r)), 3, spread),
            cell(per_round(saved, lambda r: sps(hk, r) / optimal(sc, r)[0]), 3, spread)]) + " |")
    lines += ["", "Balancer quality: hetra's median step as samples/s (B / the median step time over the measured "
              "steps) against the balancer-optimal ideal of its round; min = the worst round. The balancer's regret "
              "= its own prediction of how far its split is from its ideal (balance_regret, median over the "
              "measured steps).", "",
              "| scenario | balancer-optimal ideal | hetra median step | ÷ balancer-optimal | balancer's regret | "
              "plan versions after warm-up |", "|---|---|---|---|---|---|"]
    for sc in saved["scenarios"]:
        hk = f"hetra-{sc['name']}"
        lines.append("| " + " | ".join([
            sc["name"], cell(per_round(saved, lambda r: optimal(sc, r)[0]), 0, spread),
            cell(per_round(saved, lambda r: res[hk][r]["median_step_samples_per_s"]), 0, spread),
            cell(per_round(saved, lambda r: res[hk][r]["median_step_samples_per_s"] / optimal(sc, r)[0]), 3, spread),
            cell(per_round(saved, lambda r: res[hk][r]["regret"] * 100), 1, spread, "%"),
            cell(per_round(saved, lambda r: res[hk][r]["plan_versions"]), 0, spread)]) + " |")
    ddp_scenarios = [sc for sc in saved["scenarios"] if sc.get("ddp", True)]
    lines += ["", "| scenario | hetra | DDP-equal | hetra/DDP-equal | DDP-proportional (split) | "
              "hetra/DDP-proportional |", "|---|---|---|---|---|---|"] if ddp_scenarios else []
    for sc in ddp_scenarios:
        name = sc["name"]
        hk, dk, pk = f"hetra-{name}", f"ddp-{name}", f"ddp-{name}-prop"
        has_prop = pk in res
        psplit = {"/".join(map(str, x["batches"])) for x in res.get(pk, []) if x}
        lines.append("| " + " | ".join([
            name, cell(per_round(saved, lambda r: sps(hk, r)), 0, spread),
            cell(per_round(saved, lambda r: sps(dk, r)), 0, spread),
            cell(per_round(saved, lambda r: sps(hk, r) / sps(dk, r)), 2, spread, "x"),
            cell(per_round(saved, lambda r: sps(pk, r)), 0, spread) + f" ({', '.join(sorted(psplit))})"
            if has_prop else "= DDP-equal (equal speeds)",
            cell(per_round(saved, lambda r: sps(hk, r) / sps(pk, r)), 2, spread, "x") if has_prop else "-"]) + " |")
    lines += ["", "Solo time curves t_s(b): hetra alone at slowdown s with global batch b as one micro-batch, "
              "ms per step (b / samples/s), medians over rounds:", ""]
    for sc in saved["scenarios"]:
        batches = sorted({saved["runs"][k]["batch"] for kk, k in saved["solo_key"].items()
                          if kk.startswith(sc["name"] + ":")})
        lines += [f"{sc['name']}:", "", "| slowdown | " + " | ".join(f"b={b}" for b in batches) + " |",
                  "|---" * (len(batches) + 1) + "|"]
        for s in sorted(set(sc["slowdowns"])):
            lines.append(f"| {s:g} | " + " | ".join(
                cell(per_round(saved, lambda r, b=b: b / sps(solo(sc, s, b), r) * 1e3), 2, False)
                for b in batches) + " |")
        lines.append("")
    bounds = []
    for sc in ddp_scenarios:
        sl = sc["slowdowns"]
        bounds.append(f"{sc['name']} {sum(1 / s for s in sl) / (len(sl) / max(sl)):.2f}x")
    if bounds:
        lines.append("Upper bound of hetra/DDP-equal if hetra reached the whole-batch ideal and DDP its own bound "
                     "(N x the slowest solo, same per-sample speed): sum(1/s_i) / (N / max s_i) = " +
                     ", ".join(bounds) + ".")
    k1 = next((v for kk, v in saved["solo_key"].items() if kk.split(":")[1] == "1" and
               int(kk.split(":")[2]) == next(sc["global_batch"] for sc in saved["scenarios"]
                                              if sc["name"] == kk.split(":")[0])), None)
    if "torch-solo-1" in res and k1:
        lines.append("Per-sample speed of the stacks, solo at slowdown 1: hetra " +
                     cell(per_round(saved, lambda r: sps(k1, r)), 0, spread) + ", PyTorch " +
                     cell(per_round(saved, lambda r: sps("torch-solo-1", r)), 0, spread) + " samples/s; "
                     "hetra/PyTorch " + cell(per_round(saved, lambda r: sps(k1, r) / sps("torch-solo-1", r)),
                                             2, spread, "x") + ".")
    lines += ["", "Where the time goes (medians over rounds of each run's median over the measured steps; "
              "ms per step; DDP = DDP-equal):", ""] if ddp_scenarios else []
    for sc in ddp_scenarios:
        name = sc["name"]
        ideal_vals = per_round(saved, lambda r: optimal(sc, r)[0])
        ideal_step = sc["global_batch"] / statistics.median(ideal_vals) * 1e3 if ideal_vals else None
        runs = [x for x in res[f"hetra-{name}"] if x]
        druns = [x for x in res[f"ddp-{name}"] if x]
        step = median(x["step_time_s"] for x in runs)
        dstep = median(x["step_time_s"] for x in druns)
        lines.append(f"{name}: hetra step {step * 1e3:.2f} ms, DDP step {dstep * 1e3:.2f} ms, balancer-optimal "
                     f"step {ideal_step:.2f} ms" if step and dstep and ideal_step else f"{name}: no complete run")
        lines += ["", "| rank | slowdown | hetra batch | micro x accum | compute | comm | rest | DDP batch | "
                  "DDP compute (cpu) | DDP wait+comm | DDP sleep |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for i, s in enumerate(sc["slowdowns"]):
            if not runs or not druns:
                break
            h = [x["ranks"][i] for x in runs]
            d = [x["ranks"][i] for x in druns]
            batch = [x["batch"] for x in h]
            micro = [x["micro_batch"] for x in h]
            compute, comm = median(x["compute_s"] for x in h), median(x["comm_s"] for x in h)
            dcpu, dwait = median(x["cpu_s"] for x in d), median(x["wall_s"] - x["cpu_s"] for x in d)
            lines.append(
                f"| {i} | {s:g} | {min(batch)}-{max(batch)} | {min(micro)}-{max(micro)} x "
                f"{max(x['accum'] for x in h)} | {compute * 1e3:.2f} | {comm * 1e3:.2f} | "
                f"{(step - compute - comm) * 1e3:.2f} | {d[0]['batch']} | {dcpu * 1e3:.2f} | {dwait * 1e3:.2f} | "
                f"{median(x['sleep_s'] for x in d) * 1e3:.2f} |")
        lines.append("")
    if ddp_scenarios:
        lines.append("hetra batch, micro x accum: range over rounds of the last step's plan. compute = the rank's "
                     "compute phases incl. the emulation's sleep; comm = waiting for the gradient allreduce after "
                     "them; rest = step time - compute - comm (optimizer step, per-step stats allgather, sampling: "
                     "real work, not slowed by the emulation). DDP compute (cpu) = main-thread CPU time of the "
                     "phase; wait+comm = the rest of its wall time, sleeps excluded (waiting for the other ranks, "
                     "for a CPU, and for the allreduce); DDP sleep = the emulation's sleep before the forward.")
    if saved.get("failures"):
        lines.append(f"\n**{saved['failures']} run(s) failed**: see the logs next to results.json.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
