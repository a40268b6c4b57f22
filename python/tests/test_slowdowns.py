"""HETRA_SLOWDOWNS gives each rank its emulated slowdown (one factor per rank); a wrong list is
refused naming the variable."""
import subprocess
import sys

from conftest import base_env

SCRIPT = ("import torch, hetra.torch as ht; ht.init(); m = torch.nn.Linear(2, 1); "
          "opt = ht.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m); "
          "print('slowdown', opt.slowdown)")


def run(slowdowns):
    return subprocess.run([sys.executable, "-c", SCRIPT], env=base_env(HETRA_SLOWDOWNS=slowdowns),
                          capture_output=True, text=True, timeout=120)


def test_the_rank_takes_its_factor():
    out = run("2.5")
    assert out.returncode == 0, out.stderr
    assert "slowdown 2.5" in out.stdout


def test_a_list_for_another_world_size_is_refused():
    out = run("1,2")
    assert out.returncode != 0
    assert "HETRA_SLOWDOWNS='1,2' has 2 factors; allowed: one per rank (1)" in out.stderr
