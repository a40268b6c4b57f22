"""A script may end with its process group alive and operations in flight (most never call
destroy_process_group or shutdown()): every rank must still exit with status 0, quietly, every
time. The crash this guards against showed once in many runs, so each case runs several jobs."""
import pytest

from conftest import run_ranks

JOBS = 4  # per case: a race at exit shows in some runs only


@pytest.mark.parametrize("case", ["ddp", "pending", "ht"])
def test_exit_with_a_live_group_and_work_in_flight(case):
    for job in range(JOBS):
        result = run_ranks("exit_live.py", 2, [case], torch_env=case != "ht").check()
        for rank, out in enumerate(result.outputs):
            assert "DONE" in out, f"job {job}, rank {rank}:\n{out}"
            for sign in ("terminate called", "Fatal Python error", "Segmentation fault"):
                assert sign not in out, f"job {job}, rank {rank}:\n{out}"
