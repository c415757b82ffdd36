"""The layer-to-stage split: which transformer layers each pipeline stage runs, and how to tell
Megatron and torchtitan.

:func:`balanced_split` searches the contiguous partition of the layers over ``S`` stages that
minimises the busiest **device**'s time (a device holds one stage, or two — stages ``r`` and
``2p − 1 − r`` in the V-shape placement — or ``v`` looped ones), with the embedding's time on
stage 0 and the LM head's on stage ``S − 1``: first the partition with the smallest largest
stage (exact, by bisection on the bottleneck with a greedy packing from the head end), then
moves of single boundaries while they lower the busiest device's time.

:func:`megatron_layout` writes the split as Megatron-LM's ``--pipeline-model-parallel-layout``
(``E`` the embedding, ``t`` a transformer layer, ``L`` the loss / LM head, ``|`` between stages,
stages in order); :func:`torchtitan_modules` as torchtitan's ``module_fqns_per_model_part``
(``tok_embeddings``, ``layers.i``, ``norm``, ``output``).
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["balanced_split", "even_split_cost", "device_loads", "megatron_layout", "torchtitan_modules",
           "split_text"]


def _pack_from_head(costs: Sequence[float], first: float, last: float, limit: float) -> list[int] | None:
    """Fewest stages of cost <= ``limit`` (layers packed greedily from the head end, each stage
    at least one layer), as layers per stage in order; ``None`` if impossible."""
    out: list[int] = []
    cur, n = last, 0
    for c in reversed(costs):
        if n and cur + c > limit:
            out.append(n)
            cur, n = 0.0, 0
        cur += c
        n += 1
        if cur > limit:
            return None
    if cur + first > limit:
        return None
    out.append(n)
    return out[::-1]


def _refine_count(layers: list[int], costs: Sequence[float], first: float, last: float, S: int) -> list[int]:
    """Split the costliest multi-layer stage in two until there are ``S`` stages."""
    while len(layers) < S:
        starts = [sum(layers[:i]) for i in range(len(layers))]
        cost = [sum(costs[a:a + n]) + (first if i == 0 else 0) + (last if i == len(layers) - 1 else 0)
                for i, (a, n) in enumerate(zip(starts, layers))]
        i = max((j for j in range(len(layers)) if layers[j] > 1), key=lambda j: cost[j])
        n = layers[i]
        layers[i:i + 1] = [n // 2, n - n // 2]
    return layers


def device_loads(layers: Sequence[int], costs: Sequence[float], first: float, last: float,
                 device_stages: Sequence[Sequence[int]]) -> list[float]:
    """Time of every device: the sum of its stages' layer costs and extras."""
    S = len(layers)
    stage = []
    a = 0
    for i, n in enumerate(layers):
        stage.append(sum(costs[a:a + n]) + (first if i == 0 else 0.0) + (last if i == S - 1 else 0.0))
        a += n
    return [sum(stage[s] for s in ss) for ss in device_stages]


def even_split_cost(layers: Sequence[int], costs, first, last, device_stages) -> float:
    return max(device_loads(layers, costs, first, last, device_stages))


def balanced_split(costs: Sequence[float], first: float, last: float, S: int,
                   device_stages: Sequence[Sequence[int]] | None = None) -> list[int]:
    """Layers per stage (each >= 1) minimising the busiest device's time (see the module doc).
    ``costs``: every layer's time; ``first`` / ``last``: the embedding's and the LM head's;
    ``device_stages``: the stages of each device (default one per device). ``ValueError`` when
    there are more stages than layers."""
    L = len(costs)
    if not 1 <= S <= L:
        raise ValueError(f"{S} stages cannot each hold one of {L} layers; use at most {L} stages")
    if any(c < 0 for c in costs) or first < 0 or last < 0:
        raise ValueError("layer costs must be >= 0")
    dev = [list(ss) for ss in device_stages] if device_stages is not None else [[s] for s in range(S)]
    lo = max(max(costs), costs[0] + first, costs[-1] + last)
    hi = sum(costs) + first + last
    best = _pack_from_head(costs, first, last, hi)
    for _ in range(60):
        if hi - lo <= 1e-9 * max(hi, 1e-30):
            break
        mid = (lo + hi) / 2
        got = _pack_from_head(costs, first, last, mid)
        if got is not None and len(got) <= S:
            hi, best = mid, got
        else:
            lo = mid
    layers = _refine_count(list(best), costs, first, last, S)
    if all(len(ss) == 1 for ss in dev):
        return layers
    return _climb(layers, costs, first, last, dev)


def _climb(layers: list[int], costs, first, last, dev) -> list[int]:
    """Move one stage boundary at a time (a layer from a stage of the busiest device to its
    neighbour) while the busiest device's time falls."""
    S = len(layers)
    device_of = {s: d for d, ss in enumerate(dev) for s in ss}

    def score(ls):
        loads = device_loads(ls, costs, first, last, dev)
        return (max(loads), sum(x * x for x in loads))

    cur = score(layers)
    for _ in range(4 * S + 16):
        loads = device_loads(layers, costs, first, last, dev)
        busy = max(range(len(dev)), key=lambda d: loads[d])
        moved = False
        for s in dev[busy]:
            for t in (s - 1, s + 1):
                if not 0 <= t < S or layers[s] <= 1 or device_of[t] == busy:
                    continue
                trial = list(layers)
                trial[s] -= 1
                trial[t] += 1
                sc = score(trial)
                if sc < cur:
                    layers, cur, moved = trial, sc, True
                    break
            if moved:
                break
        if not moved:
            break
    return layers


def megatron_layout(layers: Sequence[int]) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout`` for a split (stages in order)."""
    S = len(layers)
    parts = []
    for s, n in enumerate(layers):
        parts.append(("E" if s == 0 else "") + "t" * n + ("L" if s == S - 1 else ""))
    return "|".join(parts)


def torchtitan_modules(layers: Sequence[int]) -> list[list[str]]:
    """torchtitan's ``module_fqns_per_model_part`` for a split."""
    out, a = [], 0
    S = len(layers)
    for s, n in enumerate(layers):
        part = (["tok_embeddings"] if s == 0 else []) + [f"layers.{i}" for i in range(a, a + n)]
        if s == S - 1:
            part += ["norm", "output"]
        out.append(part)
        a += n
    return out


def split_text(layers: Sequence[int]) -> str:
    """Short form: ``E+3|4|4|3+H``."""
    S = len(layers)
    return "|".join(("E+" if s == 0 else "") + str(n) + ("+H" if s == S - 1 else "") for s, n in enumerate(layers))


def parse_split_text(text: str) -> list[int]:
    """The layers per stage of :func:`split_text`'s form (``E+3|4|4|3+H``)."""
    out = []
    for part in str(text).split("|"):
        core = part.removeprefix("E+").removesuffix("+H")
        if not core.isdigit():
            raise ValueError(f"layer split {text!r}: stage {part!r} is not E+N, N or N+H")
        out.append(int(core))
    return out
