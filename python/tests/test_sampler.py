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


def test_a_dataloader_yields_the_sampler_steps():
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=base_env(), capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "OK"
