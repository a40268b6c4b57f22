"""`hetra report METRICS.jsonl [--timeline FILE] -o DIR`: one self-contained HTML page of a run.

Reads the metrics file (docs/metrics.md, schema_version 1) and, when given, the run's Chrome trace
(`hetra run --timeline`), and writes DIR/index.html with every figure embedded as a PNG drawn by
matplotlib, plus the same PNGs beside it (for a README or a slide). Each figure is a <figure>
element with an id, so that a test can find it in the rendered page.
"""

import argparse
import base64
import html
import io
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402

SCHEMA_VERSION = 1
DPI = 100
# The lanes of common/timeline.h and the colours of their events in the Gantt chart.
EVENT_COLOURS = {
    "data": "#bbbbbb",
    "forward": "#4c72b0",
    "backward": "#55a868",
    "slowdown sleep": "#f0c05a",
    "wait for gradients": "#c44e52",
    "optimizer step": "#8172b2",
    "evaluate": "#937860",
    "checkpoint": "#da8bc3",
}
COMM_COLOUR = "#dd8452"
COLLECTIVE_COLOURS = {"allreduce": "#dd8452", "allgather": "#e8a87c", "broadcast": "#b35806",
                      "reduce-scatter": "#fdb863", "barrier": "#7f3b08"}


class Run:
    """The records of one metrics file, by event; a step recorded twice (an elastic restart
    repeats the steps after its checkpoint) keeps its last record."""

    def __init__(self, path):
        by_step = {}
        self.balance, self.evals, self.restarts, self.final = [], [], [], None
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise SystemExit(f"hetra report: {path}:{number}: not JSON ({error})")
                if record.get("schema_version") != SCHEMA_VERSION:
                    continue  # a version this reader does not know
                event = record.get("event")
                if event == "step":
                    by_step[record["step"]] = record
                elif event == "balance":
                    self.balance.append(record)
                elif event == "eval":
                    self.evals.append(record)
                elif event == "restart":
                    self.restarts.append(record)
                elif event == "final":
                    self.final = record
        self.steps = [by_step[s] for s in sorted(by_step)]
        if not self.steps:
            raise SystemExit(f"hetra report: {path} has no step records (docs/metrics.md)")
        self.devices = []  # every device that ran, in order of first appearance
        for record in self.steps:
            for rank in record["ranks"]:
                if rank["device"] not in self.devices:
                    self.devices.append(rank["device"])


def memory_of(rank):
    """A rank's peak memory by category in bytes, {} when the metrics carry none
    (docs/metrics.md: `ranks[].memory` is null and `peak_bytes` -1 where the ranks are threads of
    one process)."""
    memory = rank.get("memory")
    if not isinstance(memory, dict):
        return {}
    return {category: value for category, value in memory.items()
            if isinstance(value, (int, float)) and value >= 0}


def figure_throughput(run, ax):
    steps = [r["step"] for r in run.steps]
    rates = [r["samples_per_s"] for r in run.steps]
    ax.plot(steps, rates, lw=0.8, alpha=0.35, color="#4c72b0", label="samples/s, each step")
    window = max(1, min(15, len(rates) // 10))  # a median: single slow steps do not pull it
    smooth = [statistics.median(rates[max(0, i - window + 1):i + 1]) for i in range(len(rates))]
    ax.plot(steps, smooth, lw=1.8, color="#4c72b0", label=f"samples/s, median of {window} steps")
    ideal = [(r["step"], r["ideal_samples_per_s"]) for r in run.steps
             if r.get("ideal_samples_per_s") is not None]
    if ideal:
        ax.plot(*zip(*ideal), lw=1.5, ls="--", color="k",
                label="ideal_samples_per_s (balancer's best split)")
    ax.set_xlabel("step")
    ax.set_ylabel("samples/s")
    ax.set_title("Throughput against the balancer's ideal")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")


def mark_balance(run, ax):
    for i, change in enumerate(run.balance):
        ax.axvline(change["step"], color="k", ls=":", lw=0.8, alpha=0.6,
                   label="balancer decision" if i == 0 else None)
    for i, restart in enumerate(run.restarts):
        ax.axvline(max(restart.get("resume_step", 0), 0), color="r", lw=1.5,
                   label="elastic restart" if i == 0 else None)


def figure_split(run, ax):
    steps = [r["step"] for r in run.steps]
    shares = {d: [0.0] * len(steps) for d in run.devices}
    for i, record in enumerate(run.steps):
        for rank in record["ranks"]:
            shares[rank["device"]][i] = rank["batch"] / record["samples"]
    ax.stackplot(steps, *shares.values(), labels=list(shares), step="post", alpha=0.85)
    mark_balance(run, ax)
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("share of the global batch")
    ax.set_title("Each device's share of the batch, with the balancer's decisions")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")


def time_breakdown(run):
    """Per device, mean seconds per step: its compute, its wait for the gradients, and the rest
    of rank 0's step time (idle: the optimizer, the wait for the slowest rank's step to begin).
    Idle is taken over the means: a rank's step is not rank 0's window (it may wait in one step
    for a slower rank's previous one), so per step the difference can be negative."""
    totals = {d: [0.0, 0.0, 0.0, 0] for d in run.devices}
    for record in run.steps:
        for rank in record["ranks"]:
            t = totals[rank["device"]]
            t[0] += rank["compute_s"]
            t[1] += rank["comm_s"]
            t[2] += record["step_time_s"]
            t[3] += 1
    means = {d: [v / max(1, t[3]) for v in t[:3]] for d, t in totals.items()}
    return {d: [c, m, max(0.0, step - c - m)] for d, (c, m, step) in means.items()}


def figure_time(run, ax):
    breakdown = time_breakdown(run)
    devices = list(breakdown)
    left = [0.0] * len(devices)
    for index, (label, colour) in enumerate(
            [("compute", "#4c72b0"), ("communication", COMM_COLOUR), ("idle", "#cccccc")]):
        widths = [breakdown[d][index] * 1e3 for d in devices]
        ax.barh(devices, widths, left=left, label=label, color=colour)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (mean over the steps)")
    ax.set_title("Where each device's step time went")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")


def peak_memory(run):
    peaks = {}
    for record in run.steps:
        for rank in record["ranks"]:
            for category, value in memory_of(rank).items():
                key = (rank["device"], category)
                peaks[key] = max(peaks.get(key, 0), value)
    return peaks


def figure_memory(run, ax):
    peaks = peak_memory(run)
    devices = [d for d in run.devices if any(k[0] == d for k in peaks)]
    categories = sorted({k[1] for k in peaks})
    bottom = [0.0] * len(devices)
    for category in categories:
        heights = [peaks.get((d, category), 0) / 2**20 for d in devices]
        ax.bar(devices, heights, bottom=bottom, label=category)
        bottom = [a + b for a, b in zip(bottom, heights)]
    ax.set_ylabel("peak MiB")
    ax.set_title("Peak memory per device, by category")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")


def figure_quality(run, ax):
    ax.plot([r["step"] for r in run.steps], [r["loss"] for r in run.steps], lw=1,
            label="training loss")
    if run.evals:
        ax.plot([e["step"] for e in run.evals], [e["test_loss"] for e in run.evals], "o-",
                label="test loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title("Loss and test accuracy")
    handles, labels = ax.get_legend_handles_labels()
    if run.evals:
        right = ax.twinx()
        right.plot([e["step"] for e in run.evals], [e["test_accuracy"] for e in run.evals],
                   "s-", color="#55a868", label="test accuracy")
        right.set_ylim(0, 1)
        right.set_ylabel("test accuracy")
        more_handles, more_labels = right.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    ax.legend(handles, labels, loc="center right")


def read_trace(path):
    """The events of a Chrome trace: a merged file ({"traceEvents": [...]}), or one rank's file
    (a JSON array, whose "]" a killed rank never wrote)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
        return data["traceEvents"] if isinstance(data, dict) else data
    except json.JSONDecodeError:
        events = []
        for line in text.splitlines():
            line = line.strip().rstrip(",")
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # the cut last line of a killed rank
        return events


def gantt_window(events, steps=3):
    """The start and end (us) of a few steps of the lowest rank in the trace (rank 0 in a merged
    one): the last `steps` whole steps but the very last, where the split has settled."""
    step_spans = [e for e in events if e.get("ph") == "X" and e.get("name") == "step"]
    if not step_spans:
        return None
    first = min(e["pid"] for e in step_spans)
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in step_spans if e["pid"] == first)
    if not spans:
        return None
    chosen = spans[-steps - 1:-1] if len(spans) > steps else spans
    return chosen[0][0], chosen[-1][1]


def figure_gantt(events, ax):
    window = gantt_window(events)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    if window is None:
        raise SystemExit("hetra report: the timeline has no step events")
    start, end = window
    rows = []  # (pid, tid) in order
    for e in events:
        if e.get("ph") == "X" and e.get("name") != "step" and e["ts"] < end \
                and e["ts"] + e["dur"] > start and (e["pid"], e["tid"]) not in rows:
            rows.append((e["pid"], e["tid"]))
    rows.sort()
    seen = set()
    for e in events:
        if e.get("ph") != "X" or e.get("name") == "step" or (e["pid"], e["tid"]) not in rows:
            continue
        left, right = max(e["ts"], start), min(e["ts"] + e["dur"], end)
        if right <= left:
            continue
        row = rows.index((e["pid"], e["tid"]))
        if e["tid"] == 2:  # the communication lane: the collectives
            label, colour = e["name"], COLLECTIVE_COLOURS.get(e["name"], COMM_COLOUR)
        else:
            label, colour = e["name"], EVENT_COLOURS.get(e["name"], "#999999")
        ax.broken_barh([((left - start) / 1e3, (right - left) / 1e3)], (row - 0.4, 0.8),
                       color=colour, label=None if label in seen else label)
        seen.add(label)
    lane = {1: "compute", 2: "comm", 3: "balancer"}
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{names.get(p, p)} {lane.get(t, t)}" for p, t in rows],
                       fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("ms from the first step shown (one clock: rank 0's in a merged trace)")
    ax.set_title("A few steps of the timeline")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")


def render(draw, *args, width=9.0, height=3.6):
    fig, ax = plt.subplots(figsize=(width, height), dpi=DPI)
    draw(*args, ax)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def summary_html(run):
    final = run.final or {}
    items = [("steps", run.steps[-1]["step"]), ("devices", ", ".join(run.devices)),
             ("global batch", run.steps[-1]["samples"])]
    if "samples_per_s" in final:
        items.append(("samples/s after warm-up", f"{final['samples_per_s']:.0f}"))
    ideal = [r["ideal_samples_per_s"] for r in run.steps if r.get("ideal_samples_per_s")]
    if ideal:
        items.append(("last ideal samples/s", f"{ideal[-1]:.0f}"))
    if "test_accuracy" in final:
        items.append(("test accuracy", f"{final['test_accuracy']:.4f}"))
    items.append(("balancer decisions", len(run.balance)))
    if run.restarts:
        items.append(("elastic restarts", len(run.restarts)))
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in items)
    return f"<table>{rows}</table>"


def build(metrics, timeline, out_dir):
    run = Run(metrics)
    figures = [("throughput", "Samples per second over the steps, against ideal_samples_per_s",
                render(figure_throughput, run)),
               ("split", "Each device's share of the global batch", render(figure_split, run)),
               ("time", "Compute, communication and idle time per device",
                render(figure_time, run, height=0.6 * len(run.devices) + 1.6))]
    notes = []
    if peak_memory(run):
        figures.append(("memory", "Peak memory per device and category",
                        render(figure_memory, run)))
    else:
        notes.append("The metrics carry no memory per device (ranks[].memory), so there is no "
                     "memory figure.")
    figures.append(("quality", "Training loss, test loss and test accuracy",
                    render(figure_quality, run)))
    if timeline:
        events = read_trace(timeline)
        rows = len({(e.get("pid"), e.get("tid")) for e in events if e.get("ph") == "X"})
        figures.append(("gantt", "The timeline of a few steps (hetra run --timeline)",
                        render(figure_gantt, events, width=10, height=0.45 * rows + 1.6)))
    else:
        notes.append("No timeline given (hetra report --timeline FILE), so there is no Gantt "
                     "chart.")
    os.makedirs(out_dir, exist_ok=True)
    parts = []
    for name, caption, png in figures:
        with open(os.path.join(out_dir, f"{name}.png"), "wb") as f:
            f.write(png)
        data = base64.b64encode(png).decode("ascii")
        parts.append(f'<figure id="fig-{name}"><img alt="{html.escape(caption)}" '
                     f'src="data:image/png;base64,{data}"><figcaption>{html.escape(caption)}'
                     f"</figcaption></figure>")
    note_html = "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>hetra run report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; background: #fff; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }}
th, td {{ text-align: left; padding: 2px 12px 2px 0; }}
figure {{ margin: 1.5em 0; }} img {{ max-width: 100%; }} .note {{ color: #666; }}
</style></head><body>
<h1>hetra run report</h1>
<p>{html.escape(os.path.basename(metrics))}{' and ' + html.escape(os.path.basename(timeline)) if timeline else ''}</p>
{summary_html(run)}
{note_html}
{''.join(parts)}
</body></html>
"""
    index = os.path.join(out_dir, "index.html")
    with open(index, "w", encoding="utf-8") as f:
        f.write(page)
    return index, [name for name, _, _ in figures]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="hetra report", description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="the metrics file of hetra run --metrics")
    parser.add_argument("--timeline", help="the trace of hetra run --timeline")
    parser.add_argument("-o", "--output", required=True, help="directory for index.html")
    args = parser.parse_args(argv)
    for path in [args.metrics] + ([args.timeline] if args.timeline else []):
        if not os.path.isfile(path):
            print(f"hetra report: cannot read '{path}'", file=sys.stderr)
            return 2
    index, names = build(args.metrics, args.timeline, args.output)
    print(f"hetra report: wrote {index} ({len(names)} figures: {', '.join(names)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
