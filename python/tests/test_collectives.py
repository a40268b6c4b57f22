"""Every collective through hetra.torch and through torch.distributed on backend="hetra", on 3
real processes; a world of one without any launcher."""
import subprocess
import sys

from conftest import base_env, run_ranks


def test_collectives_on_three_ranks():
    job = run_ranks("collectives.py", 3, torch_env=True).check()
    assert all(out.strip().endswith("OK") for out in job.outputs), job.outputs


def test_alone_is_a_world_of_one():
    script = ("import torch, hetra.torch as ht; ht.init(); "
              "t = torch.arange(5.); ht.allreduce(t).wait(timeout=30); "
              "print(ht.rank(), ht.size(), ht.local_rank(), t.tolist())")
    out = subprocess.run([sys.executable, "-c", script], env=base_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "0 1 0 [0.0, 1.0, 2.0, 3.0, 4.0]"
