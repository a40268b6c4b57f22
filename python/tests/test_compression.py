"""Compressed allreduce through hetra.torch: within the codec's bound of the exact sum (u times the
ranks' absolute maxima plus the result's, tests/test_comm_compressed.cc), identical on every rank,
and fewer bytes on the wire than the exact float32 allreduce."""
import torch

from conftest import run_ranks

UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


def test_compressed_allreduce_stays_within_the_bound(tmp_path):
    run_ranks("compressed.py", 3, [str(tmp_path)]).check()
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(3)]
    inputs = []
    for rank in range(3):
        g = torch.Generator().manual_seed(100 + rank)
        inputs.append((torch.randn(150001, generator=g) * (rank + 1)).double())
    exact = sum(inputs)
    scale = sum(float(x.abs().max()) for x in inputs)
    exact_bytes = results[0]["none"][1]
    torch.testing.assert_close(results[0]["none"][0].double(), exact, rtol=1e-6, atol=1e-5)
    for codec, u in UNIT_ROUNDOFF.items():
        got, sent = results[0][codec]
        worst = float((got.double() - exact).abs().max())
        assert 0 < worst <= u * (scale + float(exact.abs().max())) + 1e-6 * scale, (codec, worst)
        assert sent < exact_bytes, (codec, sent, exact_bytes)
        for r in results[1:]:
            assert torch.equal(r[codec][0], got), codec
