"""torch.optim.SGD, Adam and AdamW whose step is hetra's one-pass loop (src/train/one_pass_update.h).

torch's own step chains tensor operations, each a pass over the parameter's memory (momentum SGD:
scale the buffer, add the gradient, add into the parameter); these update each element in one pass,
with the GIL released, the same loops `hetra run` trains with. They are the torch classes: the
same options, the same state (`momentum_buffer`; `step`, `exp_avg`, `exp_avg_sq`) and state_dict,
so a checkpoint moves between them and torch's; the results agree with torch's to float rounding.
What the loop does not take (a parameter or gradient that is not a contiguous float32 CPU tensor,
sparse gradients, `maximize`, `amsgrad`, `differentiable`, `capturable`) is left to torch's step.
"""
import torch

from hetra import _core


def _fusable(t):
    return (t.device.type == "cpu" and t.dtype == torch.float32 and t.layout == torch.strided
            and t.is_contiguous())


def _all_fusable(optimizer, refused_options):
    for group in optimizer.param_groups:
        if any(group.get(name) for name in refused_options):
            return False
        for p in group["params"]:
            if p.grad is None:
                continue
            if not (_fusable(p) and _fusable(p.grad) and p.grad.shape == p.shape):
                return False
            # State loaded from a checkpoint must be laid out as the loop reads it too.
            for value in optimizer.state.get(p, {}).values():
                if torch.is_tensor(value) and value.dim() > 0 and not (
                        _fusable(value) and value.shape == p.shape):
                    return False
    return True


def _evaluate(closure):
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class SGD(torch.optim.SGD):
    """torch.optim.SGD (momentum, dampening, Nesterov, weight decay) with a one-pass step."""

    @torch.no_grad()
    def step(self, closure=None):
        if not _all_fusable(self, ("maximize", "differentiable")):
            return super().step(closure)
        loss = _evaluate(closure)
        for group in self.param_groups:
            momentum = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                buffer, first = state.get("momentum_buffer"), False
                if momentum != 0 and buffer is None:
                    # torch starts the buffer as a copy of the first update: the loop writes it
                    buffer = torch.empty_like(p, memory_format=torch.preserve_format)
                    first = True
                state["momentum_buffer"] = buffer
                _core.sgd_update(p.data_ptr(), p.grad.data_ptr(),
                                 buffer.data_ptr() if buffer is not None else 0, p.numel(),
                                 lr=group["lr"], weight_decay=group["weight_decay"],
                                 momentum=momentum, dampening=group["dampening"],
                                 nesterov=group["nesterov"], first_step=first)
        return loss


class _OnePassAdam:
    """Adam's and AdamW's one-pass step (mixed into the torch classes)."""

    _decoupled = False

    @torch.no_grad()
    def step(self, closure=None):
        if not _all_fusable(self, ("maximize", "amsgrad", "differentiable", "capturable",
                                   "fused")):
            return super().step(closure)
        loss = _evaluate(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:  # torch's fresh state: step 0 (a tensor, as torch keeps it), zeros
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                _core.adam_update(p.data_ptr(), p.grad.data_ptr(), state["exp_avg"].data_ptr(),
                                  state["exp_avg_sq"].data_ptr(), p.numel(), lr=group["lr"],
                                  weight_decay=group["weight_decay"], beta1=beta1, beta2=beta2,
                                  eps=group["eps"], step=int(state["step"].item()),
                                  decoupled=self._decoupled)
        return loss


class Adam(_OnePassAdam, torch.optim.Adam):
    """torch.optim.Adam (L2 weight decay added to the gradient) with a one-pass step."""


class AdamW(_OnePassAdam, torch.optim.AdamW):
    """torch.optim.AdamW (decoupled weight decay) with a one-pass step."""

    _decoupled = True
