"""HeteroSampler as a DataLoader's batch_sampler (with worker processes prefetching), in a world of
one: the loader yields exactly the sampler's steps, every sample once per epoch."""
import subprocess
import sys

from conftest import base_env

SCRIPT = """
import torch
from torch.utils.data import DataLoader, TensorDataset
import hetra.torch as ht
ht.init()
data = TensorDataset(torch.arange(100))
sampler = ht.HeteroSampler(len(data), 10, seed=3, lookahead=5)
loader = DataLoader(data, batch_sampler=sampler, num_workers=2, prefetch_factor=2)
epoch = []
for step, (batch,) in enumerate(loader):
    assert batch.tolist() == sampler.indices(step), (step, batch.tolist())
    epoch += batch.tolist()
assert len(sampler) == 10 and step == 9
assert sorted(epoch) == list(range(100))
second = [b.tolist() for (b,) in loader]  # the stream goes on with steps 10..19
assert second[0] == sampler.indices(10) and sorted(sum(second, [])) == list(range(100))
assert epoch != sum(second, [])  # a new permutation
print("OK")
"""


def _runs_to_ok(script, timeout):
    """Runs `script` alone (a world of one) and checks that it got to its last line."""
    out = subprocess.run([sys.executable, "-c", script], env=base_env(), capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "OK"


def test_a_dataloader_yields_the_sampler_steps():
    _runs_to_ok(SCRIPT, timeout=180)


SCHEDULE = """
import random
from hetra.torch.sampler import SplitSchedule
rng = random.Random(7)
schedule = SplitSchedule([5, 3, 2])
firsts, step = [0], 0
for i in range(300):  # a long run's balancer: hundreds of changes, at uneven gaps
    step += rng.randint(1, 9)
    schedule.change(step, [i, 300 - i, 1])
    firsts.append(step)
# Each change's shares cover the steps up to the next change's first, by expansion.
splits = [[5, 3, 2]] + [[i, 300 - i, 1] for i in range(300)]
expected = {}
for k, first in enumerate(firsts):
    end = firsts[k + 1] if k + 1 < len(firsts) else first + 20
    for s in range(first, end):
        expected[s] = splits[k]
for s in range(-3, firsts[-1] + 20):
    assert schedule.shares_at(s) == expected.get(s, [5, 3, 2]), s
for bad in (firsts[-1], firsts[-1] - 4):
    try:
        schedule.change(bad, [1, 1, 1])
    except ValueError as e:
        assert "must follow the last one" in str(e), e
    else:
        raise AssertionError(f"a change at step {bad} was accepted")
print("OK")
"""


def test_the_split_schedule_finds_each_steps_shares_among_hundreds_of_changes():
    _runs_to_ok(SCHEDULE, timeout=60)
