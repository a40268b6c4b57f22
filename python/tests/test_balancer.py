"""The balancer moves the split toward the fast devices online (emulated slowdowns 1, 1, 4), every
rank switching at the same announced step, and the weighting stays exact through the changes."""
import sys

import torch

from conftest import WORKERS, run_ranks

sys.path.insert(0, WORKERS)
import problem  # noqa: E402

SAMPLES, FEATURES, HIDDEN, STEPS = 240, 128, 1024, 40


def test_split_follows_the_slow_device_and_training_stays_exact(tmp_path):
    run_ranks("balanced.py", 3, ["1,1,4", str(tmp_path)]).check()
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(3)]
    changes = results[0]["changes"]
    assert all(r["changes"] == changes for r in results), [r["changes"] for r in results]
    assert len(changes) > 1, f"the split never changed: {results[0]['plan']}"
    first_change, final = changes[1][0], changes[-1][1]
    assert first_change > 4  # decided after profiling, announced ahead (lookahead)
    assert final[2] < SAMPLES // 3 and final[2] < min(final[0], final[1]), changes
    for step in range(STEPS):
        taken = [r["indices"][step] for r in results]
        assert sorted(sum(taken, [])) == list(range(SAMPLES))
        shares = [first for first, _ in changes if first <= step]
        assert [len(t) for t in taken] == [c for s, c in changes if s == shares[-1]][0]
    _, want = problem.reference("sgd", SAMPLES, FEATURES, HIDDEN, STEPS)
    for got, expected in zip(results[0]["params"], want):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    for r in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0]["params"], r["params"]))
