"""The paper's published numbers as data, and a paper-scale cost model (docs/theory.md §4–§9).

Two things live here, both pure Python:

1. **The paper's own numbers** (Tables 1, 2, 3, 5, 8, 9, the exact values of docs/theory.md §7 and the known cells
   and ranges of Table 4), each tagged with its docs/theory.md source. A cell that docs/theory.md lists as
   missing is :data:`NOT_RECOVERED`; nothing here is invented.
2. **A cost model for the paper's models on A100 80 GB** (:func:`pass_times`,
   :func:`activation_bytes`, :func:`paper_costs`), used to predict Table 4 and Fig. 9–10 from
   the simulator. Its assumptions, stated once:

   * Per transformer layer and token, forward FLOPs = ``24·h² + 4·s·h`` (QKV, projection, MLP
     matmuls; attention scores and values). ``B`` (input gradient) = ``24·h² + 8·s·h`` (all of the
     attention backward has no weights), ``W`` (weight gradient) = ``24·h²``. ``F + B + W`` is
     Megatron's ``72·h²·(1 + s/6h)`` per layer and token.
   * The LM head adds ``2·h·V`` forward FLOPs per token (``2·h·V`` for B, ``2·h·V`` for W) and the
     embedding none. ``V`` (vocabulary) was not recovered: :data:`ASSUMED_VOCAB` = 50 257 (GPT-2,
     as in the Zero Bubble paper's code) [INF].
   * Time = FLOPs / (:data:`A100_PEAK_FLOPS` · efficiency). The default efficiency
     :data:`DEFAULT_EFFICIENCY` = 0.65 is Table 5's "FBW average MFU ≈ 65 %" [V1-T]. With it the
     model predicts Table 5's 9.6B forward pass of one layer (one V-shape chunk) at microbatch 4,
     8, 12 as 13.1 / 26.3 / 39.4 ms against the paper's 12.96 / 26.30 / 39.45 ms.
   * The paper balances stages by using ``2p − 2`` layers with the embedding and head on the
     first and last stage (docs/theory.md §9.1); we therefore treat every device-stage as ``1/p`` of
     the whole model (layers plus head), so ``Costs`` are single numbers.
   * Activation bytes per layer and token, fp16: ``34·h + 5·heads·s`` (the authors' runtime
     memory model, docs/theory.md §10); ``32·h`` of it waits for ``W``.
   * Sequence length of the pure-PP runs was not recovered; :data:`ASSUMED_SEQ_LEN` = 1024 [INF,
     docs/theory.md §9.1].
   * Communication: ``comm`` = one hop of ``s·b·h`` fp16 values at :data:`ASSUMED_P2P_BYTES_PER_S`
     (25 GB/s, RDMA) [INF].
"""

from __future__ import annotations

from dataclasses import dataclass

from ctrlmem.model.costs import Costs

__all__ = [
    "NOT_RECOVERED",
    "ModelPreset",
    "MODELS",
    "model",
    "A100_PEAK_FLOPS",
    "DEFAULT_EFFICIENCY",
    "ASSUMED_SEQ_LEN",
    "ASSUMED_VOCAB",
    "ASSUMED_P2P_BYTES_PER_S",
    "layer_flops",
    "pass_times",
    "paper_costs",
    "activation_bytes",
    "model_flops",
    "model_state_bytes",
    "tp_efficiency",
    "FIG12_SINGLE_PASS_MFU",
    "A100_MEMORY_BYTES",
    "parameter_count",
    "TABLE1",
    "TABLE3",
    "TABLE5",
    "TABLE8",
    "TABLE9",
    "table_a_memory",
    "table_a_bubble",
    "TABLE_A_RATES",
    "TABLE4_CELLS",
    "TABLE4_RANGES",
    "TABLE4_SETUP",
    "FIG9_CALC",
    "ADAPTIVE_BUBBLE_P8_M32",
    "FIG7_POINTS",
    "FIG7_FRONTIER",
]

NOT_RECOVERED = "not recovered"

A100_PEAK_FLOPS = 312e12
"""A100 dense fp16/bf16 tensor-core peak, FLOP/s."""
DEFAULT_EFFICIENCY = 0.65
"""Fraction of peak a pass reaches: Table 5's FBW average MFU ≈ 65 % [V1-T]."""
ASSUMED_SEQ_LEN = 1024
ASSUMED_VOCAB = 50257
ASSUMED_P2P_BYTES_PER_S = 25e9
A100_MEMORY_BYTES = 80e9


@dataclass(frozen=True)
class ModelPreset:
    """A GPT model of Table 2 (or a CPU-scale stand-in).

    Args:
        name: the paper's label, e.g. ``"9.6B"``.
        num_layers: transformer layers.
        num_heads: attention heads.
        hidden: hidden size ``h``.
        num_gpus: GPUs the paper used (pure PP: the pipeline size p).
        microbatch_size: the pure-PP microbatch size of Table 4 (``None`` when not used there).
        source: where the numbers come from.
    """

    name: str
    num_layers: int
    num_heads: int
    hidden: int
    num_gpus: int
    microbatch_size: int | None
    source: str


MODELS: dict[str, ModelPreset] = {
    m.name: m
    for m in (
        ModelPreset("9.6B", 30, 40, 5120, 16, 4, "Table 2 [V1-T]; microbatch from Table 4 header"),
        ModelPreset("21B", 46, 48, 6144, 24, 2, "Table 2 [V1-T]; microbatch from Table 4 header"),
        ModelPreset("38.5B", 62, 64, 7168, 32, 1, "Table 2 [V1-T]; microbatch from Table 4 header"),
        ModelPreset("98.5B", 78, 80, 10240, 40, None, "Table 2 [V1-T]; grid-searched microbatch (Table 3)"),
        # CPU-scale stand-ins: same layer rule (2p - 2 layers), runs on this machine.
        ModelPreset("cpu-tiny", 6, 4, 64, 4, 1, "CPU-scale counterpart (ctrlmem), 2p - 2 layers at p = 4"),
        ModelPreset("cpu-small", 14, 4, 128, 8, 1, "CPU-scale counterpart (ctrlmem), 2p - 2 layers at p = 8"),
    )
}


def model(name: str) -> ModelPreset:
    """The preset called ``name``; ``ValueError`` naming the valid presets otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(MODELS)}") from None


def layer_flops(hidden: int, seq_len: int) -> tuple[float, float, float]:
    """FLOPs of (F, B, W) for one transformer layer and one token."""
    h, s = float(hidden), float(seq_len)
    return 24 * h * h + 4 * s * h, 24 * h * h + 8 * s * h, 24 * h * h


def pass_times(
    preset: ModelPreset | str,
    num_layers: float,
    microbatch_size: int,
    seq_len: int = ASSUMED_SEQ_LEN,
    efficiency: float = DEFAULT_EFFICIENCY,
    vocab: int = ASSUMED_VOCAB,
    head_share: float = 0.0,
) -> tuple[float, float, float]:
    """Seconds of (F, B, W) for ``num_layers`` layers of ``preset`` and one microbatch, on one
    A100 at ``efficiency`` of peak; ``head_share`` of the LM head is added (0 … 1)."""
    preset = model(preset) if isinstance(preset, str) else preset
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency is a fraction of peak in (0, 1], got {efficiency!r}")
    if microbatch_size < 1 or seq_len < 1:
        raise ValueError(f"microbatch_size and seq_len must be >= 1, got {microbatch_size}, {seq_len}")
    tokens = microbatch_size * seq_len
    f, b, w = layer_flops(preset.hidden, seq_len)
    head = 2.0 * preset.hidden * vocab * head_share
    rate = A100_PEAK_FLOPS * efficiency
    return tuple(tokens * (num_layers * x + head) / rate for x in (f, b, w))  # type: ignore[return-value]


FIG12_SINGLE_PASS_MFU = {1: 0.69, 2: 0.65, 4: 0.59, 8: 0.51}
"""Single-pass MFU by tensor-parallel degree, midpoints of Fig. 12(a)'s approximate readings
(seq 1024) [V1-T]; only their ratios are used (:func:`tp_efficiency`)."""


def tp_efficiency(tp: int) -> float:
    """Efficiency of a pass under tensor parallelism ``tp``: :data:`DEFAULT_EFFICIENCY` scaled by
    Fig. 12(a)'s single-pass MFU at ``tp`` relative to ``tp = 1``."""
    if tp not in FIG12_SINGLE_PASS_MFU:
        raise ValueError(f"tp must be one of {sorted(FIG12_SINGLE_PASS_MFU)} (Fig. 12), got {tp!r}")
    return DEFAULT_EFFICIENCY * FIG12_SINGLE_PASS_MFU[tp] / FIG12_SINGLE_PASS_MFU[1]


def paper_costs(
    preset: ModelPreset | str,
    num_devices: int,
    microbatch_size: int,
    seq_len: int = ASSUMED_SEQ_LEN,
    efficiency: float | None = None,
    tp: int = 1,
    flash_attention: bool = False,
) -> Costs:
    """``Costs`` in **milliseconds** of one full device-stage (``1/num_devices`` of the layers and
    the head, split over ``tp`` GPUs at :func:`tp_efficiency`) on A100s, plus the P2P latency of
    one activation hop (sequence-parallel: ``1/tp`` of it per GPU). The recomputation levers are
    the model's own (:meth:`ctrlmem.Costs.gpt_levers`, the same bytes as
    :func:`activation_bytes` with ``flash_attention``): full recomputation keeps ``2h`` of the
    ``34·h + 5·heads·s`` bytes per layer and token (2/74 for the 9.6B at seq 1024)."""
    preset = model(preset) if isinstance(preset, str) else preset
    eff = tp_efficiency(tp) if efficiency is None else efficiency
    f, b, w = pass_times(preset, preset.num_layers / num_devices, microbatch_size, seq_len, eff,
                         head_share=1.0 / num_devices)
    comm = 2.0 * microbatch_size * seq_len * preset.hidden / tp / ASSUMED_P2P_BYTES_PER_S
    return Costs(f=f * 1e3 / tp, b=b * 1e3 / tp, w=w * 1e3 / tp, comm=comm * 1e3,
                 **Costs.gpt_levers(preset.hidden, preset.num_heads, seq_len, flash_attention))


def model_flops(preset: ModelPreset | str, microbatch_size: int, seq_len: int = ASSUMED_SEQ_LEN,
                vocab: int = ASSUMED_VOCAB) -> float:
    """FLOPs of F + B + W of the whole model for one microbatch (MFU numerator)."""
    preset = model(preset) if isinstance(preset, str) else preset
    per_token = preset.num_layers * sum(layer_flops(preset.hidden, seq_len)) + 3 * 2.0 * preset.hidden * vocab
    return microbatch_size * seq_len * per_token


def model_state_bytes(preset: ModelPreset | str, pp: int, tp: int = 1, dp: int = 1) -> float:
    """Bytes per GPU of weights and optimizer state: fp16 weights and gradients (4 B/param) plus
    fp32 master weights and Adam moments (12 B/param) sharded over ``dp`` (distributed optimizer)."""
    return parameter_count(preset) / (pp * tp) * (4 + 12 / dp)


def activation_bytes(preset: ModelPreset | str, num_layers: float, microbatch_size: int,
                     seq_len: int = ASSUMED_SEQ_LEN, tp: int = 1, flash_attention: bool = False) -> float:
    """Bytes of activation ``num_layers`` layers store for one microbatch on one GPU (fp16,
    ``34·h + 5·heads·s`` per layer and token; tensor + sequence parallelism divide it by ``tp``;
    FlashAttention, used in the paper's grid search, stores no ``s × s`` scores: ``34·h``)."""
    preset = model(preset) if isinstance(preset, str) else preset
    per_token = 34 * preset.hidden + (0 if flash_attention else 5 * preset.num_heads * seq_len)
    return float(num_layers * microbatch_size * seq_len * per_token) / tp


def parameter_count(preset: ModelPreset | str, vocab: int = ASSUMED_VOCAB) -> float:
    """``12·L·h² + V·h`` (layers and a tied embedding; biases and norms ignored)."""
    preset = model(preset) if isinstance(preset, str) else preset
    return 12.0 * preset.num_layers * preset.hidden ** 2 + vocab * preset.hidden


# --------------------------------------------------------------------------------------------
# The paper's numbers (docs/theory.md). Keys are stable; tests and tables read them.

TABLE1 = {
    # block: (interval T, l_max in units of d, peak memory as a fraction of M)   [V1-T]
    "1f1b": {"T": 6, "l_max": "6d", "peak_fraction": 1.0},
    "v-min": {"T": 6, "l_max": "4d", "peak_fraction": 1 / 3},
    "v-half": {"T": 6, "l_max": "6d", "peak_fraction": 1 / 2},
    "v-zb": {"T": 6, "l_max": "12d", "peak_fraction": 1.0},
}
"""Table 1: asymptotic peak memory of the V-shape blocks (fraction of 1F1B's M)."""

TABLE3 = {
    # (seq_len, global batch) -> method -> best MFU (%)   [V1-T]
    (1024, 160): {"1F1B": 49.81, "1F1B-R": 37.15, "ZB-1P": 54.52, "V-Half": 52.60, "V-Min": 48.02, "V-ZB": 57.58},
    (3072, 640): {"1F1B": 57.25, "1F1B-R": 45.81, "ZB-1P": 56.55, "V-Half": 60.34, "V-Min": 55.51, "V-ZB": 56.89},
}
"""Table 3: best MFU of each method after the 98.5B grid search on 40 GPUs."""
TABLE3_BEST_1F1B_SETUP = {(1024, 160): {"dp": 2, "tp": 4, "pp": 5, "microbatch": 2}}
"""The only recovered best-parameter tuple of Table 3 (the others: not recovered)."""

TABLE5 = {
    # (model, microbatch size) -> F pass ms   [V1-T]; all other cells not recovered
    ("9.6B", 4): 12.96,
    ("9.6B", 8): 26.30,
    ("9.6B", 12): 39.45,
}
"""Table 5's known cells: forward-pass time (ms) of the 9.6B model's V-shape chunk."""
TABLE5_FBW_MFU = 0.65

TABLE8 = {
    # d mod 3 -> offsets of V-Min   [V1-T]
    0: {"dF0": 1, "dF1": 1, "dB1": 1, "dB0": 1, "turn_F": 1, "loss_F1_B1": 3, "turn_B": 1},
    1: {"dF0": 1, "dF1": 1, "dB1": 1, "dB0": 1, "turn_F": 1, "loss_F1_B1": 1, "turn_B": 1},
    2: {"dF0": 1, "dF1": 1, "dB1": 1, "dB0": 1, "turn_F": 1, "loss_F1_B1": 1, "turn_B": 1},
}
"""Table 8: V-Min offsets by d mod 3."""

TABLE9 = {
    # d mod 2 -> offsets of V-Half (paper's turn gaps; the code mirrors them, docs/theory.md §7)
    0: {"dF0": 2, "dF1": 1, "dB1": 2, "dB0": 1, "turn_F": 2, "loss_F1_B1": 4, "turn_B": 1},
    1: {"dF0": 2, "dF1": 1, "dB1": 2, "dB0": 1, "turn_F": 2, "loss_F1_B1": 1, "turn_B": 1},
}
"""Table 9: V-Half offsets by d mod 2."""


def table_a_memory(name: str, p: int) -> int:
    """Exact peak activation memory in ``a`` (F = B = W, m >= 2p) [HF, CALC]."""
    formulas = {"v-min": (p + 4) // 3, "v-half": (p + 2) // 2, "v-zb": p, "1f1b": p, "zb-v": p, "zb-h1": p}
    if name not in formulas:
        raise ValueError(f"docs/theory.md §7 has no memory formula for {name!r}; valid: {', '.join(formulas)}")
    return formulas[name]


def table_a_bubble(name: str, p: int) -> int:
    """Exact bubble per device in unit passes τ (half-stage passes; F = B = W) [CALC]."""
    formulas = {
        "v-min": 4 * p - 7 if p % 3 == 0 else 4 * p - 5,
        "v-half": 3 * p - 7 if p % 2 == 0 else 3 * p - 4,
        "v-zb": 0,
        "zb-v": 0,
        "1f1b": 6 * (p - 1),
    }
    if name not in formulas:
        raise ValueError(f"docs/theory.md §7 has no bubble formula for {name!r}; valid: {', '.join(formulas)}")
    return formulas[name]


TABLE_A_RATES = {
    # (p, m) -> bubble rates printed in the exact values of docs/theory.md §7 (4 decimals)   [CALC]
    (16, 32): {"1f1b": 0.3191, "v-min": 0.2351, "v-half": 0.1760, "v-zb": 0.0},
    (16, 64): {"1f1b": 0.1899, "v-min": 0.1332, "v-half": 0.0965, "v-zb": 0.0},
    (16, 128): {"1f1b": 0.1049, "v-min": 0.0713, "v-half": 0.0507, "v-zb": 0.0},
    (16, 256): {"1f1b": 0.0554, "v-min": 0.0370, "v-half": 0.0260, "v-zb": 0.0},
    (24, 48): {"1f1b": 0.3239, "v-min": 0.2361, "v-half": 0.1841, "v-zb": 0.0},
    (24, 384): {"1f1b": 0.0565, "v-min": 0.0372, "v-half": 0.0274, "v-zb": 0.0},
    (32, 64): {"1f1b": 0.3263, "v-min": 0.2426, "v-half": 0.1882, "v-zb": 0.0},
    (32, 512): {"1f1b": 0.0571, "v-min": 0.0385, "v-half": 0.0282, "v-zb": 0.0},
}

TABLE4_SETUP = {
    # model -> (GPUs = p, microbatch size, #microbatches)   [V1-T]
    "9.6B": (16, 4, (16, 32, 64, 128, 256)),
    "21B": (24, 2, (24, 48, 96, 192, 384)),
    "38.5B": (32, 1, (32, 64, 128, 256, 512)),
}

TABLE4_CELLS = {
    # (model, m, method, metric) -> value   [V1-T]; every other cell is not recovered
    ("38.5B", 512, "V-ZB", "mfu_percent"): 53.2,
    ("38.5B", 512, "V-Half", "mfu_percent"): 51.8,
    ("38.5B", 512, "1F1B", "mfu_percent"): 47.1,
    ("38.5B", 512, "V-Min", "mfu_percent"): 43.7,
    ("38.5B", 512, "1F1B-R", "mfu_percent"): 37.2,
}

TABLE4_RANGES = {
    # (method, metric) -> (low, high) over all models and m   [V1-T]
    ("V-Min", "activation_gb"): (14, 19),
    ("V-Half", "activation_gb"): (19, 28),
    ("ZB-1P", "activation_gb"): (36, 48),
    ("V-ZB", "activation_gb"): (35, 56),
    ("1F1B", "activation_gb"): (35, 56),
    ("1F1B-R", "activation_gb"): (1, 1),
    ("V-ZB", "bubble_percent"): (1.09, 8.61),
    ("V-Min", "bubble_percent"): (20.1, 36.5),
    ("1F1B", "bubble_percent"): (8.76, 34.6),
    ("1F1B-R", "bubble_percent"): (8.44, 50.7),
    ("V-Min", "total_memory_gb"): (29, 33),
    ("1F1B-R", "total_memory_gb"): (14, 24),
}

FIG9_CALC = {
    # docs/theory.md §9.6 [CALC]: the authors' adaptive V scheduler (v_auto_schedule.py), p = 16, m = 64.
    # costs are ctrlmem full device-stage times (the authors' per-chunk F, B, W doubled; comm as is).
    # memory limit (fraction of 1F1B) -> bubble rate
    (16, 64, (9918, 10434, 7038, 213)): {0.375: 0.2641, 0.4375: 0.2481, 0.5: 0.2275, 0.5625: 0.1312,
                                         0.75: 0.0922, 1.0: 0.0382},
    (16, 64, (2, 2, 2, 0)): {0.375: 0.1332, 0.4375: 0.1213, 0.5: 0.1090, 0.5625: 0.0965, 0.75: 0.0565, 1.0: 0.0},
}
"""Fig. 9's shape reproduced with the authors' adaptive scheduler (docs/theory.md §9.6; the paper's own
curves use profiled costs that were not recovered)."""

ADAPTIVE_BUBBLE_P8_M32 = {0.5: 23, 0.5625: 20, 0.75: 11, 1.0: 0}
"""docs/theory.md §6 [CALC]: adaptive scheduler, p = 8, m = 32, F = B = W: bubble per device in τ at
memory k = 8 / 9 / 12 / 16 half-stage units (limit k / 2p); it meets the bound 6p − 1 − 3k."""

FIG7_POINTS = {
    # docs/theory.md §9.3 [V1-T, read from the plot, approximate]: (model, p, m, microbatch) ->
    # method -> (MFU %, activation GB); a method missing from a panel was not plotted (ZB-2P OOM in (c)).
    ("9.6B", 16, 64, 2): {"1F1B-R": (32, 4), "V-Min": (40.5, 10), "V-Half": (46.5, 14), "V-ZB": (51, 23),
                          "ZB-2P": (52.5, 48), "1F1B": (43.5, 23), "ZB-1P": (48.5, 25), "Interleaved 1F1B": (48.5, 36)},
    ("21B", 24, 96, 1): {"1F1B-R": (32, 4), "V-Min": (40.5, 8), "V-Half": (45.5, 12), "V-ZB": (50, 21),
                         "ZB-2P": (52, 42), "1F1B": (42, 20), "ZB-1P": (47.5, 22), "Interleaved 1F1B": (47, 30)},
    ("38.5B", 32, 128, 1): {"1F1B-R": (32, 4), "V-Min": (41, 15), "V-Half": (46.5, 20), "V-ZB": (51.5, 35),
                            "1F1B": (43, 35), "ZB-1P": (47.5, 36), "Interleaved 1F1B": (47.5, 46)},
}
"""Fig. 7: MFU against activation memory per method (approximate plot readings, docs/theory.md §9.3)."""
FIG7_FRONTIER = {
    ("9.6B", 16, 64, 2): ("1F1B-R", "V-Min", "V-Half", "V-ZB", "ZB-2P"),
    ("21B", 24, 96, 1): ("1F1B-R", "V-Min", "V-Half", "V-ZB", "ZB-2P"),
}
"""Fig. 7 (a), (b): the methods on the paper's Pareto frontier, by memory (docs/theory.md §9.3)."""
