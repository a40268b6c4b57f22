"""hetra.torch.init() keeps the process's heap as hetra run's ranks do (src/device/host_heap.h): the
tensors a step frees stay in glibc's heap for the next step, which then faults almost no page in;
with glibc's adaptive thresholds (HETRA_KEEP_HOST_HEAP=0) a step faults its tensors in again. Each
case is a fresh interpreter: the thresholds and the heap's history are the process's."""
import os
import subprocess
import sys

from conftest import WORKERS, base_env


def step_faults(**env):
    environment = base_env(**env)
    for name in list(environment):  # the user's own malloc tuning would leave glibc alone
        if name.startswith("MALLOC_") or name == "GLIBC_TUNABLES":
            del environment[name]
    out = subprocess.run([sys.executable, os.path.join(WORKERS, "heap_faults.py")],
                         env=environment, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return float(out.stdout)


def test_init_keeps_the_heap_so_a_step_faults_few_pages_in():
    faults = step_faults()
    adaptive_faults = step_faults(HETRA_KEEP_HOST_HEAP="0")
    # A step allocates about 3 MB of tensors (~750 pages); glibc's adaptive heap faults most of
    # them in again every step, a kept heap a few dozen.
    assert faults * 5 < adaptive_faults, (faults, adaptive_faults)
