"""A dead rank and a mismatched call raise clear typed errors on the other ranks, before the job's
deadline (conftest.JOB_TIMEOUT), never a hang."""
from conftest import run_ranks


def raised(output):
    lines = [line for line in output.splitlines() if line.startswith("RAISED ")]
    assert lines, output
    return lines[0]


def test_killed_rank_is_named_on_the_others():
    job = run_ranks("failures.py", 3, ["killed"])
    assert job.codes[2] != 0  # it was killed
    for rank in (0, 1):
        assert job.codes[rank] == 0, job.outputs[rank]
        line = raised(job.outputs[rank])
        assert line.startswith("RAISED PeerAbortedError rank=2"), line


def test_mismatched_sizes_raise_a_clear_error():
    # Ranks 0 and 1 compare their calls (1000 against 1001 elements) and raise MismatchError;
    # a rank that learns it from a peer's abort gets PeerAbortedError with the same description.
    job = run_ranks("failures.py", 3, ["mismatch"]).check()
    lines = [raised(job.outputs[rank]) for rank in range(3)]
    assert any(line.startswith("RAISED MismatchError") for line in lines), lines
    for line in lines:
        assert line.startswith(("RAISED MismatchError", "RAISED PeerAbortedError")), line
        assert "mismatched collective" in line and "1000 float32" in line, line
