"""ctrlmem.runtime.recompute in one process: a stage's layers under a non-reentrant checkpoint,
with ctrlmem's split backward (B a full backward with deferred weights, W from the stash) and
torch's (autograd.grad of the inputs, then of the weights): exact gradients, how often the
region is recomputed, and what the saved-tensor meter counts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ctrlmem.runtime.adapter import ObservedSavedTensors  # noqa: E402 - after the torch skip
from ctrlmem.runtime.measure import SavedTensorMeter  # noqa: E402 - after the torch skip
from ctrlmem.runtime.models import build_stages, get_preset  # noqa: E402 - after the torch skip

CFG = get_preset("tiny", num_layers=4)  # 2 layers per stage


def _stage(mode):
    mod = build_stages(CFG, 2, stages=[1], seed=3)[1]  # the last stage: layers, final norm, head
    mod.set_recompute(mode)
    return mod


def _inputs():
    g = torch.Generator().manual_seed(5)
    x = torch.randn((CFG.microbatch_size, CFG.seq_len, CFG.hidden), generator=g)
    target = torch.randint(0, CFG.vocab, (CFG.microbatch_size, CFG.seq_len), generator=g)
    return x, target


def _loss(mod, x, target):
    logits = mod(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, CFG.vocab), target.reshape(-1))


def _ctrlmem_split(mod, meter=None, deferred=True):
    """ctrlmem's B then W: a full backward with the linear layers deferred, then the stash
    (``deferred=False``: one fused backward)."""
    x, target = _inputs()
    x.requires_grad_()
    mod.zero_grad(set_to_none=True)
    mod.stash.active, mod.stash.meter = deferred, meter
    mod.recomputation.reset()
    with meter if meter is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        loss = _loss(mod, x, target)
        after_forward = meter.current if meter is not None else None
        loss.backward()
        mod.stash.take()()
    mod.stash.active, mod.stash.meter = False, None
    return [x.grad] + [p.grad for p in mod.parameters()], after_forward


def _torch_split(mod):
    """torch's B then W: autograd.grad of the stage input (graph retained), then of the weights."""
    x, target = _inputs()
    x.requires_grad_()
    mod.recomputation.reset()
    loss = _loss(mod, x, target)
    (gx,) = torch.autograd.grad(loss, [x], retain_graph=True)
    gw = torch.autograd.grad(loss, list(mod.parameters()))
    return [gx, *gw]


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_split_backward_recomputes_once_and_matches_the_plain_stage(mode):
    """ctrlmem's split backward on a checkpointed stage gives exactly the plain stage's input and
    weight gradients, and recomputes each checkpointed region once (the schedule's one R): in B,
    not again in W."""
    plain, _ = _ctrlmem_split(_stage(None))
    mod = _stage(mode)
    got, _ = _ctrlmem_split(mod)
    for a, b in zip(plain, got, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    regions = 1 if mode == "full" else len(mod.blocks)
    assert mod.recomputation.regions == regions
    assert mod.recomputation.recomputes == regions


def test_torchs_split_backward_is_exact_but_recomputes_for_each_graph_task():
    """torch's input-only backward (autograd.grad, which a reentrant checkpoint refuses) runs the
    non-reentrant checkpoint exactly, but the weights' autograd.grad is a second graph task that
    recomputes the region again (torch's pipelining W takes one per parameter group)."""
    plain = _torch_split(_stage(None))
    mod = _stage("full")
    got = _torch_split(mod)
    for a, b in zip(plain, got, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert (mod.recomputation.regions, mod.recomputation.recomputes) == (1, 2)


def test_meter_counts_the_checkpoint_inputs_then_the_recomputed_tensors():
    """Under full recomputation the meter holds only the checkpointed region's input (and what
    the head outside the region saves) after the forward, and in the backward counts the
    recomputed region, whole at once once the head's backward has freed the head's tensors: the
    peak is the plain stage's layers' bytes exactly, and nothing is left after the backward (a
    fused one: no stash; without counting the recomputed tensors the peak would stay at the
    forward's kept bytes)."""
    def measured(mode, drop_layers=False):
        mod = _stage(mode)
        if drop_layers:
            mod.blocks = torch.nn.ModuleList()  # the stage without its layers: final norm, head
        meter = SavedTensorMeter().exclude(mod.parameters())
        _, kept = _ctrlmem_split(mod, meter, deferred=False)
        assert meter.current == 0
        return kept, meter.peak

    plain_kept, plain_peak = measured(None)
    kept, peak = measured("full")
    head_kept, _ = measured(None, drop_layers=True)
    x_bytes = CFG.microbatch_size * CFG.seq_len * CFG.hidden * 4
    assert kept == x_bytes + head_kept < plain_kept / 2
    assert plain_peak == plain_kept
    assert peak == plain_kept - head_kept


def test_observed_hooks_see_every_saved_tensor_and_keep_the_hooks_below():
    """Hooks entered inside another pair show each saved tensor to the observer and still pack it
    with the pair below (autograd alone would apply only the innermost pair)."""
    below, seen = [], []

    def pack(t):
        below.append(t.shape)
        return ("packed", t)

    def unpack(obj):
        assert obj[0] == "packed"
        return obj[1]

    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        with ObservedSavedTensors(lambda t: seen.append(t.shape) or t):
            y = torch.tanh(x @ w).sum()
    y.backward()
    assert seen and seen == below
    ref_x, ref_w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.tanh(ref_x @ ref_w).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=0, atol=0)
    torch.testing.assert_close(w.grad, ref_w.grad, rtol=0, atol=0)


def test_count_until_freed_counts_while_the_alias_lives_and_skips_parameters():
    meter = SavedTensorMeter()
    p = torch.nn.Parameter(torch.randn(16))
    meter.exclude([p])
    t = torch.randn(32)
    alias = meter.count_until_freed(t)
    assert meter.current == 32 * 4 and alias.data_ptr() == t.data_ptr()
    assert meter.count_until_freed(p) is p and meter.current == 32 * 4
    del alias
    assert meter.current == 0 and meter.peak == 32 * 4
