"""The planner for models read from Hugging Face config.json files: exact parameter counts against
the published ones, the balanced layer-to-stage split, expert parallelism, recomputation, the
memory breakdown, the Korthikanti et al. cross-check, and hostile config files."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

import ctrlmem as cm
from ctrlmem.cli.app import main
from ctrlmem.planner import arch
from ctrlmem.planner.hf import MAX_CONFIG_BYTES
from ctrlmem.planner.model import ModelSpec, model_spec, stage_layers
from ctrlmem.planner.split import (balanced_split, device_loads, megatron_layout, parse_split_text, split_text,
                                   torchtitan_modules)

DATA = Path(__file__).parent / "data" / "hf_configs"

# Published totals: each model's safetensors weights on the Hugging Face hub (bf16, total_size / 2 bytes), as
# the model pages list them; Mixtral's and Qwen-MoE's active counts as their authors give them (12.9B, 2.7B).
PUBLISHED = {
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
    "qwen2-7b": 7_615_616_512,
    "qwen2-0.5b": 494_032_768,
    "mixtral-8x7b": 46_702_792_704,
    "qwen1.5-moe-a2.7b": 14_315_784_192,
}


@pytest.mark.parametrize("name,total", sorted(PUBLISHED.items()))
def test_parameter_counts_equal_the_published_ones(name, total):
    spec = model_spec(DATA / f"{name}.json")
    assert spec.num_params == total
    if not spec.experts:
        assert spec.num_active_params == total


def test_active_parameters_of_the_moe_configs():
    mixtral = model_spec(DATA / "mixtral-8x7b.json")
    assert round(mixtral.num_active_params / 1e8) == 129          # "12.9B active"
    qwen = model_spec(DATA / "qwen1.5-moe-a2.7b.json")
    assert round(qwen.num_active_params / 1e8) == 27              # "A2.7B"
    ds = model_spec(DATA / "deepseek-v2-lite.json")
    assert round(ds.num_params / 1e8) == 157                      # "15.7B total"
    # "2.4B activated": the active parameters without the input embedding (a lookup, no multiply)
    assert 2.4e9 <= ds.num_active_params - ds.vocab * ds.hidden < 2.5e9
    # active = total minus the routed experts a token does not use
    unused = sum(sh.expert * (1 - ds.top_k / ds.experts) for sh in ds.layer_shapes())
    assert ds.num_active_params == pytest.approx(ds.num_params - unused)


def test_tied_embeddings_are_counted_once_and_held_twice_in_a_pipeline():
    spec = model_spec(DATA / "qwen2-0.5b.json")
    assert spec.tied
    untied = ModelSpec(**{**spec.__dict__, "tied": False})
    assert untied.num_params - spec.num_params == spec.vocab * spec.hidden
    one = cm.planner.model.stage_bytes(spec, 1, 1, 1, 0.0)
    two = cm.planner.model.stage_bytes(spec, 2, 1, 1, 0.0)
    assert one.params[0] == spec.num_params                       # one stage: the shared matrix once
    assert sum(two.params) == spec.num_params + spec.vocab * spec.hidden  # the last stage holds a copy


def test_korthikanti_activation_formula_exactly_for_a_gpt_shape():
    """A GPT-shaped decoder (MHA, 4h GELU MLP, LayerNorm, dropout) keeps s·b·h·(34 + 5·a·s/h) bytes per
    layer (Korthikanti et al. 2022, Table 2) without FlashAttention, and its parameters are
    12·L·h² + 13·L·h plus the embedding and the final norm (Narayanan et al. 2021 without the position
    embedding)."""
    for L, h, a, s in ((24, 2048, 16, 2048), (96, 12288, 96, 2048), (40, 5120, 40, 1024)):
        gpt = ModelSpec("gpt", L, h, a, 51200, s, arch="decoder", ffn=4 * h, gated=False, qkv_bias=True, o_bias=True,
                        mlp_bias=True, norm_params=2 * h, dropout=True, tied=True)
        sh = gpt.layer_shapes()[0]
        assert arch.activation_per_token(gpt, sh, flash_attention=False) == 34 * h + 5 * a * s
        assert arch.activation_per_token(gpt, sh, flash_attention=False, recompute="selective") == 34 * h
        assert arch.activation_per_token(gpt, sh, flash_attention=False, recompute="full") == 2 * h
        assert gpt.num_params == 12 * L * h * h + 13 * L * h + 51200 * h + 2 * h


def test_bad_config_files_are_one_clear_line(tmp_path):
    good = json.loads((DATA / "llama-3-8b.json").read_text())
    cases = {
        "huge.json": None,
        "notjson.json": "{ this is not json",
        "array.json": "[1, 2, 3]",
        "missing.json": json.dumps({k: v for k, v in good.items() if k != "hidden_size"}),
        "negative.json": json.dumps({**good, "num_hidden_layers": -4}),
        "boolean.json": json.dumps({**good, "vocab_size": True}),
        "absurd.json": json.dumps({**good, "hidden_size": 10 ** 12}),
        "gqa.json": json.dumps({**good, "num_key_value_heads": 7}),
        "family.json": json.dumps({**good, "model_type": "bert"}),
        "binary.json": b"\xff\xfe\x00garbage",
        "deep.json": "[" * 200000 + "]" * 200000,
        "digits.json": '{"hidden_size": ' + "9" * 5000 + "}",
    }
    needles = {"huge.json": "bytes", "notjson.json": "not JSON", "array.json": "not an object",
               "missing.json": "'hidden_size' is missing", "negative.json": "num_hidden_layers must be an integer >= 1",
               "boolean.json": "vocab_size must be an integer", "absurd.json": "larger than any model",
               "gqa.json": "not a multiple of num_key_value_heads", "family.json": "model_type 'bert'",
               "binary.json": "not JSON", "deep.json": "nests deeper", "digits.json": "not JSON"}
    for name, text in cases.items():
        p = tmp_path / name
        if text is None:
            with open(p, "wb") as fh:
                fh.truncate(MAX_CONFIG_BYTES + 1)
        elif isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)
        with pytest.raises(ValueError) as e:
            model_spec(str(p))
        msg = str(e.value)
        assert "\n" not in msg and needles[name] in msg, (name, msg)
    with pytest.raises(ValueError, match="no such file"):
        model_spec(str(tmp_path / "absent.json"))
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        model_spec(str(tmp_path / "dir.json"))


def test_cli_refuses_a_bad_config_in_one_line(tmp_path, capsys):
    p = tmp_path / "c.json"
    p.write_text('{"model_type": "llama", "hidden_size": -1}')
    assert main(["plan", "--model", str(p), "--gpus", "8", "--gpu-memory-gb", "80", "--global-batch", "8",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ctrlmem plan: error:") and "hidden_size" in err[0], err


# -- the layer-to-stage split -------------------------------------------------------------------------

def _brute(costs, first, last, S, dev):
    L = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, L), S - 1):
        bounds = (0, *cuts, L)
        layers = [bounds[i + 1] - bounds[i] for i in range(S)]
        x = max(device_loads(layers, costs, first, last, dev))
        best = x if best is None else min(best, x)
    return best


@pytest.mark.parametrize("S,kind", [(4, "seq"), (3, "seq"), (4, "v")])
def test_balanced_split_is_optimal_on_small_cases(S, kind):
    costs = [1.0, 1.0, 1.3, 1.0, 0.7, 1.0, 1.0, 1.0, 1.2]
    first, last = 0.4, 2.5
    dev = [[s] for s in range(S)] if kind == "seq" else [[d, S - 1 - d] for d in range(S // 2)]
    got = balanced_split(costs, first, last, S, dev)
    assert sum(got) == len(costs) and min(got) >= 1 and len(got) == S
    opt = _brute(costs, first, last, S, dev)
    mine = max(device_loads(got, costs, first, last, dev))
    if kind == "seq":
        assert mine == pytest.approx(opt)
    else:  # V pairs: the boundary moves come within one layer of the optimum
        assert mine <= opt + max(costs) + 1e-9


def test_a_heavy_head_gives_the_last_stage_fewer_layers_and_never_loses_to_the_even_rule():
    spec = model_spec(DATA / "llama-3-8b.json")
    df = cm.plan(DATA / "llama-3-8b.json", gpus=8, gpu_memory_gb=80, global_batch=32, schedules=["1f1b"], tp=[1],
                 pp=[4], microbatch_sizes=[1], recompute="none", progress=False)
    split = parse_split_text(df.iloc[0]["layer_split"])
    assert sum(split) == spec.num_layers and split[-1] < split[1]   # the 128k-vocabulary head weighs ~2.4 layers
    even = cm.plan(DATA / "llama-3-8b.json", gpus=8, gpu_memory_gb=80, global_batch=32, schedules=["1f1b"], tp=[1],
                   pp=[4], microbatch_sizes=[1], recompute="none", layer_split="even", progress=False)
    assert parse_split_text(even.iloc[0]["layer_split"]) == stage_layers(spec.num_layers, 4)
    assert df.iloc[0]["pipeline_s"] <= even.iloc[0]["pipeline_s"] + 1e-12


def test_layout_strings_name_every_layer_once_in_order():
    layers = [3, 4, 4, 2]
    text = megatron_layout(layers)
    parts = text.split("|")
    assert parts[0].startswith("E") and parts[-1].endswith("L") and [p.count("t") for p in parts] == layers
    mods = torchtitan_modules(layers)
    flat = [m for part in mods for m in part if m.startswith("layers.")]
    assert flat == [f"layers.{i}" for i in range(sum(layers))]
    assert mods[0][0] == "tok_embeddings" and mods[-1][-2:] == ["norm", "output"]
    assert parse_split_text(split_text(layers)) == layers


# -- expert parallelism, recomputation, memory ------------------------------------------------------------

@pytest.fixture(scope="module")
def mixtral_plan():
    return cm.plan(DATA / "mixtral-8x7b.json", gpus=32, gpu_memory_gb=80, global_batch=128,
                   schedules=["1f1b", "v-half"], tp=[1, 2], microbatch_sizes=[1], allocator=None, progress=False)


def test_expert_parallelism_divides_the_experts_per_gpu(mixtral_plan):
    df = mixtral_plan
    spec = model_spec(DATA / "mixtral-8x7b.json")
    expert_total = sum(sh.expert for sh in spec.layer_shapes())
    assert set(df["ep"].dropna().astype(int)) >= {1, 2, 4, 8}
    for _, r in df[df["total_gb"].notna() & (df["placement"] == "sequential")].iterrows():
        # sequential placement: the busiest device holds at most its stage's share of the experts, over EP
        assert r["expert_params_gb"] <= 2 * expert_total / r["ep"] / 1e9 * (max(parse_split_text(r["layer_split"]))
                                                                           / spec.num_layers) + 1e-9
    one = df[(df["ep"] == 1) & df["a2a_s"].notna()]
    assert (one["a2a_s"] == 0).all()
    many = df[(df["ep"] > 1) & (df["status"] == "ok")]
    assert len(many) and (many["a2a_s"] > 0).all()
    assert (many["a2a_hidden_samples_per_s"] > many["samples_per_s"]).all()
    assert (df[df["status"] == "ok"]["ep"] > 1).any()


def test_all_to_all_crosses_nodes_at_the_inter_node_bandwidth():
    spec = model_spec(DATA / "mixtral-8x7b.json")
    kw = dict(model=spec, gpus=16, gpu_memory_gb=80, global_batch=16, source=cm.planner.cost_source("a100"),
              schedules=[], microbatch_sizes=[1], tp=[1], pp=None, min_pp=2, distributed_optimizer=True,
              flash_attention=True, margin=cm.planner.AllocatorMargin(), reserve_gb=0.0, dp_gbs=25.0,
              gpus_per_node=8, nvlink_gbs=200.0, ib_gbs=20.0)
    p = cm.planner.Planner(**kw)
    tokens_bytes = spec.seq_len * spec.top_k * spec.hidden * 2.0
    assert p.a2a_ms(1, 1, 8) == pytest.approx(2 * tokens_bytes * 7 / 8 / 200e9 * 1e3)
    assert p.a2a_ms(1, 1, 16) == pytest.approx(2 * tokens_bytes * 15 / 16 / 20e9 * 1e3)
    assert p.a2a_ms(1, 1, 1) == 0.0


def test_memory_breakdown_adds_up_with_receive_buffers_and_experts(mixtral_plan):
    rows = mixtral_plan[mixtral_plan["total_gb"].notna()]
    parts = rows[["params_gb", "grads_gb", "optimizer_gb", "activation_gb", "recv_gb", "margin_gb",
                  "reserve_gb"]].sum(axis=1)
    assert ((parts - rows["total_gb"]).abs() < 1e-9).all()
    assert (rows["expert_params_gb"] <= rows["params_gb"] + 1e-12).all() and (rows["recv_gb"] > 0).all()


def test_full_recomputation_trades_activation_for_a_forward():
    df = cm.plan(DATA / "llama-3-8b.json", gpus=8, gpu_memory_gb=80, global_batch=32, schedules=["1f1b"], tp=[1],
                 pp=[4], microbatch_sizes=[1], recompute="none,full", allocator=None, exhaustive=True, progress=False)
    none = df[df["recompute"] == "none"].iloc[0]
    full = df[df["recompute"] == "full"].iloc[0]
    assert "full recompute" in full["method"] and full["layer_split"]
    assert full["activation_gb"] < 0.3 * none["activation_gb"]
    assert full["pipeline_s"] > none["pipeline_s"]
    # one more forward of the layers per microbatch: the bubble-free work grows by F / (F + B + W) of the layers
    assert full["pipeline_s"] < none["pipeline_s"] * 1.5


def test_split_backward_schedules_are_planned_with_recomputation_as_r_passes():
    """A config model's split-backward rows recompute with an R before every B (tests/
    test_plan_recompute.py has the memory model); the layers per stage are balanced with the R's
    time, and the bytes without the lever are counted on that same split."""
    from ctrlmem.planner.core import row_memory, row_schedule

    df = cm.plan(DATA / "qwen2-0.5b.json", gpus=4, gpu_memory_gb=80, global_batch=16, schedules=["zb-h1", "1f1b"],
                 tp=[1], pp=[4], microbatch_sizes=[1], recompute="none,full", exhaustive=True, progress=False)
    assert set(df[df["schedule"] == "zb-h1"]["recompute"]) == {"none", "full"}
    assert set(df[df["schedule"] == "1f1b"]["recompute"]) == {"none", "full"}
    assert not any("recomputation" in s for s in df.attrs["skipped"])
    i = df.index[(df["schedule"] == "zb-h1") & (df["recompute"] == "full")][0]
    full, plain = df.loc[i], df[(df["schedule"] == "zb-h1") & (df["recompute"] == "none")].iloc[0]
    # (the split balanced with the R's time moves layers onto the LM head's stage here, so the fullest
    # device, the head's, holds more than without the lever: the split balances time, not memory)
    assert full["pipeline_s"] > plain["pipeline_s"] and full["recompute_saved_gb"] >= 0
    sched, costs = row_schedule(df, i)
    memory, extra = row_memory(df, i)
    assert sched.recompute_mode == "full" and extra == 0 and len(costs.recompute) == 4
    assert all(k < a for k, a in zip(memory.kept, memory.activation))
    r = cm.simulate(sched, costs, memory)
    assert full["activation_gb"] == pytest.approx(r.peak_memory[int(full["device"])], rel=1e-12)
    fused = df[(df["schedule"] == "1f1b") & (df["recompute"] == "full")].iloc[0]
    assert fused["layer_split"] == full["layer_split"]  # the same split: both balanced with the recompute


def test_dense_model_refuses_expert_parallelism():
    with pytest.raises(ValueError, match="no experts"):
        cm.plan(DATA / "llama-3-8b.json", gpus=8, gpu_memory_gb=80, global_batch=32, ep=[2], progress=False)


def test_the_notebook_form_plans_a_config_file():
    from ctrlmem.planner.views import PlanForm

    form = PlanForm(str(DATA / "qwen2-0.5b.json"), 4, 80.0, 16, "a100", tp=[1], microbatch_sizes=[1],
                    schedules=["1f1b"], progress=False)
    df = form.run()
    assert df is not None and df.attrs["settings"]["model_params"] == PUBLISHED["qwen2-0.5b"]
    assert "layer_split" in form.table.value or "layers" in form.table.value


def test_dualpipe_v_pairs_hide_the_moe_all_to_all_in_the_plan():
    """DualPipeV's overlapped pairs take the all-to-all they hide off their time (fb_overlap < 1
    with expert parallelism, exactly 1 without), so on an MoE model it plans faster than without
    the overlap, and never faster than the all-to-all hidden entirely; bidirectional DualPipe, whose
    two model copies the memory model does not count, is refused with the name to use."""
    import dataclasses

    from ctrlmem.planner import core

    cfg = str(DATA / "mixtral-8x7b.json")
    df = cm.plan(cfg, 32, 80.0, 256, schedules=["dualpipe-v"], progress=False, top=3, ep=[1, 8])
    ok = df[df.status == "ok"]
    overlapped = 0
    for i in ok.index[ok["ep"] == 8][:2]:
        row = df.loc[i]
        sched, costs = core.row_schedule(df, int(i))
        if int(row["ep"]) == 1:
            assert costs.fb_overlap == 1.0
            continue
        assert 0.5 <= costs.fb_overlap < 1.0
        overlapped += 1
        plain = cm.simulate(sched, dataclasses.replace(costs, fb_overlap=1.0)).makespan
        assert cm.simulate(sched, costs).makespan < plain
        assert row["samples_per_s"] <= row["a2a_hidden_samples_per_s"] * (1 + 1e-9)
    assert overlapped == 2
    dense = cm.plan(str(DATA / "llama-3-8b.json"), 8, 80.0, 64, schedules=["dualpipe-v"], progress=False, top=3)
    i = int(dense.index[dense.status == "ok"][0])
    assert core.row_schedule(dense, i)[1].fb_overlap == 1.0  # no all-to-all: nothing to hide
    with pytest.raises(ValueError, match="dualpipe-v"):
        cm.plan(cfg, 32, 80.0, 256, schedules=["dualpipe"], progress=False)
