"""Ranks that round their updates differently drift apart; DistributedOptimizer(resync_every=N)
gives every rank rank 0's parameters every N steps and reports the drift it found. Each rank r of
three adds eps * r * (1 + i % 7) / 7 to element i in every update (workers/drifting.py), so N
steps drift by N * 2 * eps at the most, on rank 2; the averaged gradients and the momentum are the
same everywhere, so nothing else separates the replicas."""
import pytest
import torch

from conftest import run_ranks

EPS = 1e-5


def train(tmp_path, resync_every):
    run_ranks("drifting.py", 3, [str(resync_every), str(EPS), str(tmp_path)]).check()
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(3)]


def test_resync_every_four_steps_reports_four_steps_of_drift_and_restores_rank_0s(tmp_path):
    results = train(tmp_path, 4)
    for rank, result in enumerate(results):
        steps = [step for step, _ in result["drifts"]]
        assert steps == [3, 7, 11], f"rank {rank}"  # after steps 4, 8 and 12 (0-based 3, 7, 11)
        for step, drift in result["drifts"]:
            assert drift == pytest.approx(8 * EPS, rel=0.01), f"rank {rank}, step {step}"
    # Step 12 ended with a re-synchronisation: bit for bit rank 0's.
    for rank, result in enumerate(results[1:], start=1):
        for a, b in zip(result["before"], results[0]["before"]):
            assert torch.equal(a, b), f"rank {rank}"


def test_without_resync_the_replicas_drift_apart_step_by_step(tmp_path):
    results = train(tmp_path, 0)
    assert all(r["drifts"] == [] for r in results)
    for rank in (1, 2):
        most = max((a - b).abs().max().item()
                   for a, b in zip(results[rank]["before"], results[0]["before"]))
        assert most == pytest.approx(12 * EPS * rank, rel=0.01), f"rank {rank}"


def test_resync_every_must_be_a_count(tmp_path):
    job = run_ranks("drifting.py", 1, ["-1", str(EPS), str(tmp_path)])
    assert job.codes[0] != 0
    assert "ValueError: resync_every=-1; allowed: an int >= 0" in job.outputs[0]
