"""`ctrlmem plan --emit` writes what torchtitan 0.3.0 loads: every override it writes is a field of
torchtitan 0.3.0's config, activation checkpointing is 0.3.0's subcommand, CUDA graphs are off under
PP, the layer split reaches torchtitan (layers_per_stage or a config function setting
module_fqns_per_model_part) and Megatron (--pipeline-model-parallel-layout), and the version is
written in the files. No torchtitan is installed here: the key list below is taken from
torchtitan's source (pytorch/torchtitan, torchtitan/config/configs.py ParallelismConfig and
TrainingConfig of the 0.3.0 line, training.disable_cuda_graphs from torchtitan/config/training.py,
the activation-checkpoint:<mode> subcommands from its tyro subcommand union)."""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

import pytest

import ctrlmem as cm
from ctrlmem.planner.emit import TORCHTITAN_VERSION, emit
from ctrlmem.planner.model import model_spec, stage_layers
from ctrlmem.planner.split import megatron_layout, parse_split_text

DATA = Path(__file__).parent / "data" / "hf_configs"

TORCHTITAN_030_KEYS = {
    "parallelism": {
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
        "enable_fsdp_symm_mem", "tensor_parallel_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
        "enable_sequence_parallel", "full_dtensor", "pipeline_parallel_degree", "module_fqns_per_model_part",
        "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
        "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
        "pipeline_parallel_microbatch_size", "context_parallel_degree", "context_parallel_load_balancer",
        "context_parallel_rotate_method", "expert_parallel_degree",
    },
    "training": {
        "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps", "enable_cpu_offload", "dtype",
        "mixed_precision_param", "mixed_precision_reduce", "gc_freq", "gc_debug", "disable_cuda_graphs",
    },
}
AC_SUBCOMMANDS = {"activation-checkpoint:none", "activation-checkpoint:selective", "activation-checkpoint:full"}


def _launch(path: str) -> list[str]:
    text = Path(path).read_text()
    joined = text.replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if ln.startswith("torchrun "))
    return shlex.split(line)


def _overrides(argv: list[str]) -> dict[str, str | None]:
    start = argv.index("torchtitan.train") + 1
    out: dict[str, str | None] = {}
    i = start
    while i < len(argv):
        a = argv[i]
        if a in ("--module", "--config"):
            out[a] = argv[i + 1]
            i += 2
            continue
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and not nxt.startswith("--") and not nxt.startswith("activation-checkpoint:"):
                out[a[2:]] = nxt
                i += 2
            else:
                out[a[2:]] = None
                i += 1
            continue
        out["_positional"] = a
        i += 1
    return out


def _megatron(paths) -> dict[str, str | None]:
    argv = shlex.split(next(ln for ln in Path(paths["megatron"]).read_text().splitlines() if ln.startswith("--")))
    return {a: (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None)
            for i, a in enumerate(argv) if a.startswith("--")}


def _check_keys(over: dict) -> None:
    for key in over:
        if key.startswith("--") or key == "_positional":
            continue
        section, _, field = key.partition(".")
        assert field in TORCHTITAN_030_KEYS.get(section, set()), f"{key} is not a torchtitan 0.3.0 config field"


CUSTOM = dict(layers=6, hidden=256, heads=4, seq_len=64, vocab=512)


@pytest.mark.parametrize("schedule,chunks", [("1f1b", 1), ("v-half", 2), ("interleaved-1f1b", 2)])
def test_emitted_launch_has_only_torchtitan_030_keys(schedule, chunks, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    df = cm.plan("custom", 4, 80.0, 16, **CUSTOM, schedules=[schedule], tp=[1], pp=[2], microbatch_sizes=[2],
                 progress=False)
    paths = emit(df, "em")
    argv = _launch(paths["torchtitan"])
    over = _overrides(argv)
    _check_keys(over)
    assert over["_positional"] in AC_SUBCOMMANDS and argv[-1] == over["_positional"]   # last, after every flag
    assert "training.disable_cuda_graphs" in over and over["training.disable_cuda_graphs"] is None
    assert int(over["parallelism.pipeline_parallel_degree"]) == 2
    text = Path(paths["torchtitan"]).read_text()
    assert f"torchtitan {TORCHTITAN_VERSION}" in text and "toml" not in paths
    S = 2 * chunks
    if chunks != 2:   # a rank holding other than two stages needs layers_per_stage
        assert int(over["parallelism.pipeline_parallel_layers_per_stage"]) == (6 + 2) // S
    else:
        assert "parallelism.pipeline_parallel_layers_per_stage" not in over
    from torch.distributed.pipelining.schedules import get_schedule_class

    get_schedule_class(over["parallelism.pipeline_parallel_schedule"])  # a name torch (and torchtitan) know
    assert _megatron(paths)["--pipeline-model-parallel-layout"] == megatron_layout(stage_layers(6, S))


def test_a_balanced_split_reaches_torchtitan_through_a_config_function(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    df = cm.plan(DATA / "llama-3-8b.json", gpus=8, gpu_memory_gb=80, global_batch=32, schedules=["1f1b"], tp=[1],
                 pp=[4], microbatch_sizes=[1], recompute="full", progress=False)
    row = df.iloc[0]
    layers = parse_split_text(row["layer_split"])
    assert layers != stage_layers(32, 4) and row["recompute"] == "full"
    paths = emit(df, "em", tt_module="llama3", tt_config="llama3_8b")
    over = _overrides(_launch(paths["torchtitan"]))
    _check_keys(over)
    assert over["--module"] == "ctrlmem_torchtitan" and over["--config"] == "plan"
    assert over["_positional"] == "activation-checkpoint:full"
    src = Path(paths["torchtitan_config"]).read_text()
    tree = ast.parse(src)
    fqns = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                and n.targets[0].id == "MODULE_FQNS_PER_MODEL_PART")
    assert [sum(m.startswith("layers.") for m in part) for part in fqns] == layers
    assert "module_fqns_per_model_part" in TORCHTITAN_030_KEYS["parallelism"]
    assert f"TORCHTITAN_VERSION = '{TORCHTITAN_VERSION}'" in src
    meg = _megatron(paths)
    assert meg["--pipeline-model-parallel-layout"] == megatron_layout(layers) and meg["--recompute-granularity"] == "full"


def test_expert_parallelism_is_emitted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    df = cm.plan(DATA / "mixtral-8x7b.json", gpus=32, gpu_memory_gb=80, global_batch=128, schedules=["1f1b"],
                 tp=[1], pp=[4], ep=[8], microbatch_sizes=[1], recompute="none", progress=False)
    paths = emit(df, "em")
    over = _overrides(_launch(paths["torchtitan"]))
    _check_keys(over)
    assert over["parallelism.expert_parallel_degree"] == "8"
    assert _megatron(paths)["--expert-model-parallel-size"] == "8"
    assert model_spec(DATA / "mixtral-8x7b.json").experts % 8 == 0


def test_the_02_toml_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    df = cm.plan("custom", 2, 80.0, 8, **CUSTOM, schedules=["1f1b"], tp=[1], pp=[2], microbatch_sizes=[2],
                 progress=False)
    assert "toml" not in emit(df, "a")
    paths = emit(df, "b", torchtitan="0.2")
    assert "torchtitan 0.2" in Path(paths["toml"]).read_text()
    with pytest.raises(ValueError, match="0.3.0"):
        emit(df, "c", torchtitan="0.4")


def test_the_torchtitan_config_function_follows_the_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kw = dict(gpus=8, gpu_memory_gb=80, global_batch=32, schedules=["1f1b"], tp=[4], pp=[2], microbatch_sizes=[1],
              recompute="none", progress=False)
    big = emit(cm.plan(DATA / "llama-3-70b.json", **{**kw, "gpus": 64, "tp": [8], "pp": [8]}), "a")
    assert "TT_CONFIG=${TT_CONFIG:-llama3_70b}" in Path(big["torchtitan"]).read_text()
    other = Path(emit(cm.plan(DATA / "qwen2-7b.json", **kw), "b")["torchtitan"]).read_text()
    assert "is a stand-in" in other   # a model torchtitan's Llama 3 configs do not describe says so
    mine = Path(emit(cm.plan(DATA / "qwen2-7b.json", **kw), "c", tt_module="qwen3", tt_config="x")["torchtitan"])
    assert "TT_MODULE=${TT_MODULE:-qwen3}" in mine.read_text() and "stand-in" not in mine.read_text()
