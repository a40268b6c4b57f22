"""Runs ranks as real processes on 127.0.0.1, each call with a deadline.

The module under test is the build tree's (HETRA_PYTHON_PATH, set by `make test-python`: the build's
python/ directory, where hetra/_core*.so lies) next to the sources in python/; without it, the
installed hetra (pip install .).
"""
import os
import random
import socket
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
SOURCES = os.path.dirname(TESTS)
WORKERS = os.path.join(TESTS, "workers")
# Seconds a whole job may take: generous for 2 busy cores, and still below pytest's patience.
JOB_TIMEOUT = 240


def python_path():
    parts = [p for p in (os.environ.get("HETRA_PYTHON_PATH"), SOURCES) if p]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


sys.path[:0] = [p for p in python_path().split(os.pathsep)[:2] if p]


def free_port():
    """A port free now, from below the kernel's ephemeral range (ip_local_port_range, 32768 up on
    Linux): a port from that range (bind to 0) can be handed to another process's outgoing
    connection, mpirun's for one, between this call and the server's listen."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32767 on 127.0.0.1")


def base_env(**extra):
    env = dict(os.environ)
    env.update({"PYTHONPATH": python_path(), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    for name in list(env):  # a launcher's variables around pytest must not leak into the ranks
        if name.startswith(("HETRA_", "TORCHELASTIC_")) or name in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT"):
            del env[name]
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Job:
    def __init__(self, codes, outputs):
        self.codes = codes
        self.outputs = outputs

    def check(self):
        for rank, (code, out) in enumerate(zip(self.codes, self.outputs)):
            assert code == 0, f"rank {rank} exited with {code}:\n{out}"
        return self


def run_ranks(script, size, args=(), timeout=JOB_TIMEOUT, torch_env=False):
    """Starts `size` ranks of workers/<script> as hetra launch describes them (HETRA_RANK, ...;
    rank 0 serves the store), with torchrun's variables too when `torch_env`; waits for all."""
    store_port = free_port()
    common = {"HETRA_STORE": f"127.0.0.1:{store_port}", "HETRA_WORLD_SIZE": size}
    if torch_env:
        common.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port(),
                       "WORLD_SIZE": size})
    procs = []
    for rank in range(size):
        env = base_env(HETRA_RANK=rank, HETRA_LOCAL_RANK=rank, **common)
        if torch_env:
            env.update({"RANK": str(rank), "LOCAL_RANK": str(rank)})
        procs.append(subprocess.Popen([sys.executable, os.path.join(WORKERS, script), *args],
                                      env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return wait_all(procs, timeout)


def wait_all(procs, timeout):
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"job did not finish in {timeout} s: " +
                    "\n".join(p.communicate()[0] or "" for p in procs))
    return Job([p.returncode for p in procs], outputs)
