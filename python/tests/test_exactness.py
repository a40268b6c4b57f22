"""Uneven splits train exactly what one process trains on the full batch: the same gradients after
one step, the same parameters (rtol 1e-4) after 20 steps, bitwise identical on every rank; through
DistributedOptimizer and through DDP on backend="hetra" with the weighted hook. DDP's default
weighting (a mean of the ranks' means) fails the same comparison: the test detects the bias."""
import sys

import pytest
import torch

from conftest import WORKERS, run_ranks

sys.path.insert(0, WORKERS)
import problem  # noqa: E402

SPLITS = ["29,11,4", "42,1,1"]


def train(tmp_path, mode, opt_name, shares):
    run_ranks("train_uneven.py", 3, [mode, opt_name, shares, str(tmp_path)],
              torch_env=mode.startswith("ddp")).check()
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(3)]


def assert_bitwise_equal_on_every_rank(results, key):
    for rank, result in enumerate(results[1:], start=1):
        for a, b in zip(results[0][key], result[key]):
            assert torch.equal(a, b), f"rank {rank}'s {key} differ from rank 0's"


def assert_every_step_used_every_sample(results, shares):
    sizes = [int(s) for s in shares.split(",")]
    for step in range(problem.STEPS):
        taken = [r["indices"][step] for r in results]
        assert [len(t) for t in taken] == sizes
        assert sorted(sum(taken, [])) == list(range(problem.GLOBAL_BATCH))


@pytest.mark.parametrize("mode", ["distopt", "ddp-weighted"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("shares", SPLITS)
def test_uneven_split_trains_the_full_batch(tmp_path, mode, opt_name, shares):
    results = train(tmp_path, mode, opt_name, shares)
    first, final = problem.reference(opt_name)
    assert_every_step_used_every_sample(results, shares)
    for got, want in zip(results[0]["grads"], first):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    for got, want in zip(results[0]["params"], final):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert_bitwise_equal_on_every_rank(results, "grads")
    assert_bitwise_equal_on_every_rank(results, "params")


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_micro_batches_under_a_memory_cap_train_the_full_batch(tmp_path, opt_name):
    # Every rank's cap is 5 samples: rank 0's 29 run as 6 micro-batches, accumulated in one step.
    results = train(tmp_path, "distopt-micro", opt_name, "29,11,4")
    first, final = problem.reference(opt_name)
    for got, want in zip(results[0]["grads"], first):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    for got, want in zip(results[0]["params"], final):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert_bitwise_equal_on_every_rank(results, "params")


@pytest.mark.parametrize("mode", ["distopt-bf16", "ddp-bf16"])
def test_bf16_compressed_gradients_stay_near_the_full_batch(tmp_path, mode):
    # bf16 keeps 8 bits of mantissa (unit roundoff 2^-8): the gradients are the full batch's to
    # that precision, the parameters after 20 steps close to it, and alike on every rank.
    results = train(tmp_path, mode, "sgd", "29,11,4")
    first, final = problem.reference("sgd")
    for got, want in zip(results[0]["grads"], first):
        scale = float(want.abs().max())
        error = float((got - want).abs().max())
        # Within bf16's bound, and beyond float32's rounding: the codec really ran.
        assert 1e-5 * scale < error <= 4 * 2.0 ** -8 * scale, (error, scale)
    for got, want in zip(results[0]["params"], final):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)
    assert_bitwise_equal_on_every_rank(results, "params")


@pytest.mark.parametrize("shares", SPLITS)
def test_ddp_default_weighting_is_detected_as_biased(tmp_path, shares):
    results = train(tmp_path, "ddp-default", "sgd", shares)
    first, final = problem.reference("sgd")
    assert_bitwise_equal_on_every_rank(results, "params")  # consistent, but not the full batch's
    grads_close = all(torch.allclose(g, w, rtol=1e-5, atol=1e-7)
                      for g, w in zip(results[0]["grads"], first))
    params_close = all(torch.allclose(g, w, rtol=1e-4, atol=1e-6)
                       for g, w in zip(results[0]["params"], final))
    assert not grads_close and not params_close
