"""HETRA_SLOWDOWNS gives each rank its emulated slowdown (one factor per rank); a wrong list is
refused naming the variable."""
import re
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


STRETCH = """
import time, torch, hetra.torch as ht
ht.init()
torch.set_num_threads(1)
model = torch.nn.Linear(2048, 2048)  # an Adam step of milliseconds: larger than the debt cap
inner = torch.optim.Adam(model.parameters(), lr=1e-3)
work = []
def timed_step(closure=None, step=inner.step):
    start = time.thread_time()
    step(closure)
    work.append(time.thread_time() - start)
inner.step = timed_step
opt = ht.DistributedOptimizer(inner, model, slowdown=4)
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(8, 2048)).sum().backward()
    opt.step()
for cost, cpu in zip(opt.step_cost_seconds, work):
    print(f"step cost {cost:.6f} optimizer cpu {cpu:.6f}")
"""


def test_a_slowed_optimizer_step_is_stretched_and_is_the_step_cost():
    # The optimizer step is a compute segment of its own (docs/benchmarks.md): a device of
    # slowdown 4 sleeps 3 times the segment's CPU work after it, less at most the emulator's debt
    # cap (SlowdownEmulator::kMaxDebtSeconds, 5 ms: an earlier late wake-up repaid), and that
    # stretched time is the step cost the balancer sees. Unstretched, it would be about 1x.
    out = subprocess.run([sys.executable, "-c", STRETCH], env=base_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pairs = [(float(a), float(b)) for a, b in
             re.findall(r"step cost ([0-9.]+) optimizer cpu ([0-9.]+)", out.stdout)]
    assert len(pairs) == 5, out.stdout
    max_debt = 0.005
    for cost, cpu in pairs:
        assert cpu > 0 and cost >= 4 * cpu - max_debt, pairs
    assert sum(cost for cost, _ in pairs) >= 2 * sum(cpu for _, cpu in pairs), pairs


HOST_WORK = """
import time, torch, hetra.torch as ht
ht.init()
torch.set_num_threads(1)
model = torch.nn.Linear(16, 4)
opt = ht.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), MODEL, slowdown=4)
phases = []
class Recording:  # the emulator's input, without its sleeps
    def end_phase(self, slowdown, wall, work):
        phases.append(work)
        return 0.0
opt._emulator = Recording()
for step in range(3):
    phases.clear()
    start = time.thread_time()
    while time.thread_time() - start < 0.05:  # the host loads a batch: 50 ms of CPU
        pass
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    print(f"stretched {sum(phases):.6f} compute {opt.compute_seconds[-1]:.6f}", flush=True)
"""


def host_work(model):
    out = subprocess.run([sys.executable, "-c", HOST_WORK.replace("MODEL", model)],
                         env=base_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pairs = [(float(a), float(b)) for a, b in
             re.findall(r"stretched ([0-9.]+) compute ([0-9.]+)", out.stdout)]
    assert len(pairs) == 3, out.stdout
    return pairs


def test_the_hosts_work_before_the_forward_is_timed_but_not_stretched():
    # With the model, a step's device work starts at its first forward (as hetra run's data
    # loading): the 50 ms of host work before it reach the balancer's compute time but none of
    # the emulator's phases. Without the model the optimizer cannot see the forward begin, and
    # the host's work is stretched with the rest: the contrast shows the hook is what moved it.
    for stretched, compute in host_work("model"):
        assert stretched < 0.025 and compute >= 0.05, (stretched, compute)
    for stretched, compute in host_work("None"):
        assert stretched >= 0.05 and compute >= 0.05, (stretched, compute)
