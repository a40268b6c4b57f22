"""torchrun and hetra launch both start the same hetra.torch script (which also initialises
torch.distributed from the environment, as a torchrun script does)."""
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from conftest import JOB_TIMEOUT, WORKERS, base_env, free_port

SCRIPT = os.path.join(WORKERS, "launched.py")


def hetra_binary():
    if os.environ.get("HETRA_BINARY"):
        return os.environ["HETRA_BINARY"]
    build_python = os.environ.get("HETRA_PYTHON_PATH")
    if build_python:  # the build tree the module came from: <build>/python
        candidate = os.path.join(os.path.dirname(build_python), "tools", "hetra", "hetra")
        if os.path.exists(candidate):
            return candidate
    found = shutil.which("hetra")
    if not found:
        pytest.skip("no hetra binary: set HETRA_BINARY (make test-python does)")
    return found


def ranks_reported(output, launcher):
    # Ranks' lines reach mpirun's output through separate pipes and may run into each other.
    lines = re.findall(r"launcher=([a-z]+) rank=(\d) size=(\d) local=(\d) hetra_sum=([0-9.]+) "
                       r"dist_sum=([0-9.]+)", output)
    assert len(lines) == 3, output
    assert sorted(int(line[1]) for line in lines) == [0, 1, 2]
    for found, rank, size, local, hetra_sum, dist_sum in lines:
        assert (found, size, local, hetra_sum, dist_sum) == (launcher, "3", rank, "6", "6"), output


def run(argv):
    out = subprocess.run(argv, env=base_env(), capture_output=True, text=True,
                         timeout=JOB_TIMEOUT)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_torchrun_starts_the_script(tmp_path):
    # torchrun gives its workers this host's name as MASTER_ADDR: where it does not resolve (a bare
    # chroot without an /etc/hosts line) torch.distributed's own rendezvous cannot connect.
    try:
        socket.getaddrinfo(socket.getfqdn(), None)
    except socket.gaierror:
        pytest.skip(f"this host's name {socket.getfqdn()!r} does not resolve: torchrun cannot work")
    # --redirects 1 --tee 1: torch 1.13's torchrun on Python 3.11 cannot parse its default "0"
    # (Std.from_str finds no IntFlag member for 0 there and returns None).
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "3", "--redirects", "1", "--tee", "1",
                "--log_dir", str(tmp_path)]
    ranks_reported(run(torchrun + [SCRIPT]), "torchrun")


def test_hetra_launch_starts_the_same_script():
    ranks_reported(run([hetra_binary(), "launch", "-np", "3", "--", sys.executable, SCRIPT]),
                   "hetra")


def test_hetra_launch_on_hosts_starts_the_same_script():
    # -H runs mpirun: the ranks get torchrun's variables from Open MPI's, so the script's
    # torch.distributed rendezvous (env://) and hetra.torch both find their places.
    if not shutil.which("mpirun"):
        pytest.skip("no mpirun (Debian openmpi-bin)")
    try:  # MASTER_ADDR is the first host, which torch's own rendezvous must resolve
        socket.getaddrinfo("localhost", None)
    except socket.gaierror:
        pytest.skip("'localhost' does not resolve here (no /etc/hosts): torch cannot rendezvous")
    argv = [hetra_binary(), "launch", "-np", "3", "-H", "localhost:3", "--mpi-arg=-x",
            "--mpi-arg=PYTHONPATH"]
    if os.geteuid() == 0:
        argv.append("--mpi-arg=--allow-run-as-root")
    out = subprocess.run(argv + ["--", sys.executable, SCRIPT], capture_output=True, text=True,
                         env=base_env(MASTER_PORT=free_port()), timeout=JOB_TIMEOUT)
    assert out.returncode == 0, out.stdout + out.stderr
    ranks_reported(out.stdout, "torchrun")


def test_mpirun_starts_a_hetra_torch_script():
    # Open MPI's variables describe the rank; hetra's store is at MASTER_PORT + 1 (MASTER_PORT
    # itself is torch's), served by rank 0.
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("no mpirun (Debian openmpi-bin)")
    script = ("import torch, hetra.torch as ht; w = ht.init(timeout=60); "
              "t = torch.tensor([ht.rank() + 1.0]); ht.allreduce(t).wait(); "
              "print(f'launcher={w.context.launcher} rank={ht.rank()} size={ht.size()} "
              "local={ht.local_rank()} hetra_sum={t.item():g} dist_sum=6', flush=True)")
    env = base_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    argv = [mpirun, "-np", "3", "--oversubscribe", "-x", "MASTER_ADDR", "-x", "MASTER_PORT",
            "-x", "PYTHONPATH"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    out = subprocess.run(argv + [sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=JOB_TIMEOUT)
    assert out.returncode == 0, out.stdout + out.stderr
    ranks_reported(out.stdout, "openmpi")


def test_hetra_launch_gives_each_rank_its_slowdown():
    script = ("import torch, hetra.torch as ht; ht.init(); m = torch.nn.Linear(2, 1); "
              "o = ht.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m); "
              "print(f'rank {ht.rank()} slowdown {o.slowdown:g}', flush=True)")
    out = run([hetra_binary(), "launch", "-np", "3", "--slowdowns", "1,2,4", "--", sys.executable,
               "-c", script])
    assert sorted(re.findall(r"rank \d slowdown [0-9.]+", out)) == [
        "rank 0 slowdown 1", "rank 1 slowdown 2", "rank 2 slowdown 4"], out


def cpus_by_rank(extra_env):
    script = ("import os; print(f'rank {os.environ[\"RANK\"]} cpus "
              "{sorted(os.sched_getaffinity(0))}', flush=True)")
    out = subprocess.run([hetra_binary(), "launch", "-np", "3", "--slowdowns", "1,2,4", "--",
                          sys.executable, "-c", script], env=base_env(**extra_env),
                         capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert out.returncode == 0, out.stdout + out.stderr
    found = dict(re.findall(r"rank (\d) cpus (\[[0-9, ]*\])", out.stdout))
    assert sorted(found) == ["0", "1", "2"], out.stdout
    return [set(eval(found[str(r)])) for r in range(3)]  # noqa: S307 (lists of ints we printed)


def test_hetra_launch_binds_slowed_ranks_to_cores_by_duty_cycle():
    # As hetra run does: duty cycles 1, 1/2 and 1/4 (one thread each) fit two cores, the fast rank
    # on a core of its own, each slowed one on a core whose duties add up to at most one.
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("one CPU: duty cycles 1 + 1/2 + 1/4 do not fit, nothing is bound")
    fast, half, quarter = cpus_by_rank({})
    assert all(len(cpus) == 1 and cpus <= allowed for cpus in (fast, half, quarter))
    assert not fast & (half | quarter), (fast, half, quarter)
    assert cpus_by_rank({"HETRA_PIN": "0"}) == [allowed] * 3
