"""ctrlmem.runtime.offload in one process: saved tensors to host memory and back, exact."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ctrlmem.runtime.measure import SavedTensorMeter  # noqa: E402 - after the torch skip
from ctrlmem.runtime.offload import HostLedger, OffloadForward  # noqa: E402 - after the torch skip


class Chain(torch.nn.Module):
    """Layers whose temporaries are freed inside the forward, so their memory is reused by later
    tensors of the same shape: an offload that forgets the device tensor once it is copied would
    match a later tensor's address to an earlier host copy."""

    def __init__(self, width: int = 32, depth: int = 6) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x)) * 0.5 + torch.sigmoid(x)
        return x


def _grads(mod, x, ctx):
    mod.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    with ctx:
        out = mod(x)
    out.square().sum().backward()
    return [p.grad.clone() for p in mod.parameters()] + [x.grad.clone()]


@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0])
def test_offloaded_forward_gives_the_same_gradients_and_frees_the_host(fraction):
    torch.manual_seed(0)
    mod, x = Chain(), torch.randn(16, 32)
    ref = _grads(mod, x, torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    ledger = HostLedger()
    meter = SavedTensorMeter().exclude(mod.parameters())
    total = 6 * 5 * 16 * 32 * 4  # an upper bound of what the forward saves
    got = _grads(mod, x, OffloadForward(fraction * total, ledger, meter, exclude=mod.parameters()))
    for a, b in zip(ref, got):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert ledger.total > 0 and ledger.peak > 0
    assert ledger.current == 0, "host copies outlived the backward"
    assert meter.current == 0


def test_the_budget_bounds_what_goes_to_the_host_and_the_rest_is_metered():
    torch.manual_seed(0)
    mod, x = Chain(), torch.randn(16, 32, requires_grad=True)
    meter = SavedTensorMeter().exclude(mod.parameters())
    with meter:
        kept = mod(x)  # held, so that what autograd saved stays
    everything = meter.current
    assert everything > 0 and kept.requires_grad
    one = 16 * 32 * 4
    for budget in (0, 3 * one, everything / 2):
        ledger, meter = HostLedger(), SavedTensorMeter().exclude(mod.parameters())
        with OffloadForward(budget, ledger, meter, exclude=mod.parameters()):
            out = mod(x)
        # the last tensor taken may overshoot the budget by at most its own size
        assert budget <= ledger.current < budget + one or budget == ledger.current == 0
        assert ledger.current + meter.current == pytest.approx(everything, rel=0.05), (budget, ledger.current, meter.current)
        del out
