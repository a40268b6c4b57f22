"""hetra.torch.optim: torch's SGD, Adam and AdamW with hetra's one-pass step. The reference is
torch's own optimizer on a copy of the same parameters fed the same gradients; the two must agree
to float rounding, share their state_dict, and leave to torch what the loop does not take."""
import copy
import types

import pytest
import torch

from hetra.torch import optim

STEPS = 20


def parameters(seed=0):
    g = torch.Generator().manual_seed(seed)
    # Odd sizes; a matrix, a vector and a scalar-like tensor.
    return [torch.nn.Parameter(torch.randn(37, 23, generator=g)),
            torch.nn.Parameter(torch.randn(23, generator=g)),
            torch.nn.Parameter(torch.randn(1, generator=g))]


def train(make, params, steps=STEPS, seed=1, start=None):
    """`steps` updates with gradients drawn from `seed` (a different value per element and step)."""
    opt = make(params)
    if start is not None:
        opt.load_state_dict(start)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return opt


CASES = {
    "sgd": (optim.SGD, torch.optim.SGD, dict(lr=0.05)),
    "sgd-momentum": (optim.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
    "sgd-nesterov-decay": (optim.SGD, torch.optim.SGD,
                           dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    "sgd-dampening": (optim.SGD, torch.optim.SGD,
                      dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=1e-2)),
    "adam": (optim.Adam, torch.optim.Adam, dict(lr=1e-2)),
    "adam-decay": (optim.Adam, torch.optim.Adam, dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1)),
    "adamw": (optim.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, eps=1e-6)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_one_pass_step_matches_torchs(case):
    ours, theirs, options = CASES[case]
    mine, reference = parameters(), parameters()
    opt = train(lambda ps: ours(ps, **options), mine)
    expected = train(lambda ps: theirs(ps, **options), reference)
    for p, q, start in zip(mine, reference, parameters()):
        assert not torch.equal(p, start)  # it trained
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    for p, q in zip(mine, reference):  # the same state, under the same names
        ours_state, their_state = opt.state[p], expected.state[q]
        assert sorted(ours_state) == sorted(their_state)
        for name, value in their_state.items():
            if torch.is_tensor(value):
                torch.testing.assert_close(ours_state[name], value, rtol=1e-5, atol=1e-6)
            else:
                assert ours_state[name] == value


@pytest.mark.parametrize("case", ["sgd-nesterov-decay", "adamw"])
def test_a_checkpoint_moves_between_torchs_optimizer_and_ours(case):
    ours, theirs, options = CASES[case]

    def two_halves(first, second):
        # Ten steps with `first`, then ten with `second` started from first's state_dict.
        params = parameters()
        opt = train(lambda ps: first(ps, **options), params, steps=10, seed=1)
        train(lambda ps: second(ps, **options), params, steps=10, seed=2,
              start=copy.deepcopy(opt.state_dict()))
        return params

    reference = two_halves(theirs, theirs)
    for mixed in (two_halves(ours, theirs), two_halves(theirs, ours)):
        for p, q in zip(mixed, reference):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_the_loop_runs_where_it_can(monkeypatch):
    calls = []
    real = optim._core
    spy = types.SimpleNamespace(
        sgd_update=lambda *a, **k: (calls.append("sgd"), real.sgd_update(*a, **k)),
        adam_update=lambda *a, **k: (calls.append("adam"), real.adam_update(*a, **k)))
    monkeypatch.setattr(optim, "_core", spy)
    train(lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), parameters(), steps=2)
    train(lambda ps: optim.AdamW(ps, lr=0.1), parameters(), steps=2)
    assert calls == ["sgd"] * 6 + ["adam"] * 6


@pytest.mark.parametrize("make, theirs", [
    (lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, maximize=True),
     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, maximize=True)),
    (lambda ps: optim.Adam(ps, lr=0.1, amsgrad=True),
     lambda ps: torch.optim.Adam(ps, lr=0.1, amsgrad=True)),
    (lambda ps: optim.Adam([torch.nn.Parameter(p.detach().t()) for p in ps[:1]], lr=0.1),
     lambda ps: torch.optim.Adam([torch.nn.Parameter(p.detach().t()) for p in ps[:1]], lr=0.1)),
])
def test_what_the_loop_does_not_take_is_torchs_step(monkeypatch, make, theirs):
    # maximize, AMSGrad, a non-contiguous parameter: torch's own step, bit for bit.
    def refuse(*args, **kwargs):
        raise AssertionError("the one-pass loop ran where torch's step must")
    monkeypatch.setattr(optim, "_core", types.SimpleNamespace(sgd_update=refuse,
                                                              adam_update=refuse))
    opt = make(parameters())
    expected = theirs(parameters())
    for group_a, group_b in zip(opt.param_groups, expected.param_groups):
        g = torch.Generator().manual_seed(3)
        for p in group_a["params"]:
            p.grad = torch.randn(p.shape, generator=g)
        g = torch.Generator().manual_seed(3)
        for p in group_b["params"]:
            p.grad = torch.randn(p.shape, generator=g)
    for _ in range(3):
        opt.step()
        expected.step()
    for p, q in zip(opt.param_groups[0]["params"], expected.param_groups[0]["params"]):
        assert torch.equal(p, q)
