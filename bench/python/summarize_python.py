"""Summarises bench/compare_python.sh's JSON lines: each variant's median samples/s over rounds
(min-max), then the ratios the issue's targets name, taken within each round and summarised the
same way."""
import json
import statistics
import sys


def key(r):
    name = r["variant"] if r["variant"] in ("hetra", "hetra run") else f"{r['variant']} {r['backend']}"
    name = "hetra.torch" if name == "hetra" else name
    if r.get("optimizer") == "hetra":
        name += " + ht.optim"
    if r.get("label"):
        name += f", {r['label']}"
    return (r["slowdowns"], r["change"], name)


def spread(values):
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def ratio_spread(values):
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


rows = [json.loads(line) for line in open(sys.argv[1])]
by_round = {}
for r in rows:
    by_round.setdefault(r["round"], {})[key(r)] = r["samples_per_s"]
keys = sorted({key(r) for r in rows})
print(f"rounds: {len(by_round)}")
for k in keys:
    values = [found[k] for found in by_round.values() if k in found]
    print(f"{k[0]:6} {k[1] or '-':9} {k[2]:24} {spread(values)} samples/s")
ratios = [("1,2,4", "", "hetra.torch", "ddp-equal gloo"),
          ("1,2,4", "", "hetra.torch", "ddp-proportional gloo"),
          ("1,2,4", "", "hetra.torch", "hetra run"),
          ("1,2,4", "", "hetra.torch + ht.optim", "hetra run"),
          ("1,2,4", "", "hetra.torch + ht.optim", "ddp-equal gloo"),
          ("1,2,4", "", "hetra.torch + ht.optim", "ddp-proportional gloo, heap kept"),
          ("1,2,4", "", "ddp-proportional hetra", "ddp-proportional gloo"),
          ("1,2,4", "", "ddp-proportional hetra", "ddp-proportional gloo, heap kept"),
          ("1,2,4", "", "ddp-proportional gloo, heap kept", "ddp-proportional gloo"),
          ("1,1", "", "hetra.torch", "ddp-equal gloo")]
changes = sorted({r["change"] for r in rows if r["change"]})
ratios += [("1,2,4", c, "hetra.torch", "ddp-proportional gloo") for c in changes]
for slowdowns, change, a, b in ratios:
    values = [found[(slowdowns, change, a)] / found[(slowdowns, change, b)]
              for found in by_round.values()
              if (slowdowns, change, a) in found and (slowdowns, change, b) in found]
    if values:
        print(f"{slowdowns:6} {change or '-':9} {a} / {b}: {ratio_spread(values)}")
