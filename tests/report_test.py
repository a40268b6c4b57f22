"""`hetra report` as a user sees it: the demo's metrics (with each rank's memory) and timeline, and
the same metrics without memory, each turned into a page that headless Chromium renders with every
figure present at a non-zero size and a screenshot that is not blank.

Usage: report_test.py HETRA_BINARY SOURCE_DIR. Exit 77 (skipped) when chromium is missing.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import matplotlib.image

SKIP = 77
# Added to a copy of the page: after it loads, the size of every figure and of its image goes
# into the DOM, which --dump-dom prints.
PROBE = """<script>
window.addEventListener("load", () => {
  const out = [...document.querySelectorAll("figure")].map(f => {
    const box = f.getBoundingClientRect(), img = f.querySelector("img");
    return {id: f.id, width: box.width, height: box.height,
            image: img ? [img.naturalWidth, img.naturalHeight, img.complete] : null};
  });
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def chromium(*args):
    command = [shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu",
               "--hide-scrollbars", "--virtual-time-budget=5000", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def check_page(directory, expected):
    index = os.path.join(directory, "index.html")
    with open(index, encoding="utf-8") as f:
        page = f.read()
    if "http://" in page or "https://" in page:
        fail(f"{index} is not self-contained: it refers to the network")
    probe = os.path.join(directory, "probe.html")
    with open(probe, "w", encoding="utf-8") as f:
        f.write(page.replace("</body>", PROBE + "</body>"))
    dom = chromium("--dump-dom", "file://" + probe).stdout
    start = dom.find('<pre id="probe">')
    if start < 0:
        fail(f"chromium rendered no probe for {probe}")
    figures = json.loads(dom[start + len('<pre id="probe">'):dom.index("</pre>", start)])
    ids = [f["id"] for f in figures]
    if sorted(ids) != sorted("fig-" + name for name in expected):
        fail(f"figures {ids}, expected {expected}")
    for figure in figures:
        width, height, complete = figure["image"] or (0, 0, False)
        if figure["width"] <= 0 or figure["height"] <= 0 or width <= 0 or height <= 0 \
                or not complete:
            fail(f"figure {figure} did not render")
    shot = os.path.join(directory, "screenshot.png")
    chromium("--window-size=1200,3200", "--screenshot=" + shot, "file://" + index)
    if not os.path.isfile(shot):
        fail("chromium wrote no screenshot")
    pixels = matplotlib.image.imread(shot)[:, :, :3]
    ink = (pixels.min(axis=2) < 0.9).mean()  # the share of pixels that are not near-white
    colours = len({tuple(p) for p in (pixels[::7, ::7].reshape(-1, 3) * 255).astype(int)})
    if ink < 0.02 or colours < 16:
        fail(f"the screenshot looks blank: {ink:.3f} of it inked, {colours} colours")
    print(f"ok: {len(figures)} figures rendered ({', '.join(ids)}); screenshot {ink:.2f} inked, "
          f"{colours} colours")


def without_memory(source, target):
    """The real run's metrics without ranks[].memory and peak_bytes, as a run whose ranks are
    threads of one process writes them (no per-rank accounting): the page must leave the memory
    figure out and say why."""
    with open(source) as f, open(target, "w") as out:
        for line in f:
            record = json.loads(line)
            if record.get("event") == "step":
                for rank in record["ranks"]:
                    rank["memory"] = None
                    rank["peak_bytes"] = -1
            out.write(json.dumps(record) + "\n")


def main():
    hetra, source = sys.argv[1], sys.argv[2]
    if shutil.which("chromium") is None:
        print("chromium is missing (Debian package chromium): skipped")
        return SKIP
    work = tempfile.mkdtemp(prefix="hetra-report-test-")
    metrics, trace = os.path.join(work, "m.jsonl"), os.path.join(work, "trace.json")
    # make demo's run, shortened (its evaluation every 100 steps: two of them).
    run = subprocess.run([hetra, "run", os.path.join(source, "examples/fashion_mnist_hetero.toml"),
                          "--set", "train.steps=150", "--metrics", metrics, "--timeline", trace],
                         capture_output=True, text=True, timeout=240)
    if run.returncode != 0:
        fail("hetra run failed:\n" + run.stdout + run.stderr)
    report = subprocess.run([hetra, "report", metrics, "--timeline", trace, "-o",
                             os.path.join(work, "a")], capture_output=True, text=True)
    if report.returncode != 0:
        fail("hetra report failed:\n" + report.stdout + report.stderr)
    # The rank processes' counting allocators put ranks[].memory into the metrics.
    check_page(os.path.join(work, "a"),
               ["throughput", "split", "time", "memory", "quality", "gantt"])
    no_memory = os.path.join(work, "no-memory.jsonl")
    without_memory(metrics, no_memory)
    report = subprocess.run([hetra, "report", no_memory, "-o", os.path.join(work, "b")],
                            capture_output=True, text=True)
    if report.returncode != 0:
        fail("hetra report failed:\n" + report.stdout + report.stderr)
    check_page(os.path.join(work, "b"), ["throughput", "split", "time", "quality"])
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
