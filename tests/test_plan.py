"""cm.plan / ctrlmem plan: the memory breakdown adds up and matches an independent computation,
rows marked as fitting fit, more GB never gives a slower best plan, pruning never changes the
answer, the cache saves searches, the shipped replay gives the costs and margins it claims, and
bad input is refused with a clear message."""

from __future__ import annotations

import json
import math

import pytest

import ctrlmem as cm
from ctrlmem.model import paper
from ctrlmem.planner import core
from ctrlmem.planner.model import model_spec, runtime_stage_layers, stage_layers
from ctrlmem.planner.sources import AllocatorMargin, ReplayCosts

# a small model on 8 GPUs: every build is a small pipeline (p <= 8, m <= 32)
SMALL = dict(model="custom", layers=6, hidden=2048, heads=16, vocab=32000, seq_len=1024, gpus=8, global_batch=32,
             tp=(1, 2), microbatch_sizes=(1, 2, 4), progress=False)
GBS = (1.2, 1.5, 2.0, 2.5, 4.0)


@pytest.fixture(scope="module")
def plans():
    return {gb: cm.plan(gpu_memory_gb=gb, **SMALL) for gb in GBS}


def test_memory_breakdown_adds_up(plans):
    for gb, df in plans.items():
        rows = df[df["total_gb"].notna()]
        assert len(rows) > 0
        parts = rows[["params_gb", "grads_gb", "optimizer_gb", "activation_gb", "margin_gb", "reserve_gb"]].sum(axis=1)
        assert ((parts - rows["total_gb"]).abs() < 1e-9).all(), gb
        assert (rows[["params_gb", "grads_gb", "optimizer_gb", "activation_gb", "margin_gb"]] >= 0).all().all()


def test_rows_marked_as_fitting_fit_and_the_others_do_not(plans):
    for gb, df in plans.items():
        fit = df[df["fits"]]
        assert (fit["total_gb"] <= gb + 1e-9).all(), gb
        assert set(fit["status"]) <= {"ok", "bounded"}
        over = df[df["status"] == "does not fit"]
        assert (over["total_gb"] > gb).all(), gb
        assert all("needs" in r or "fewer than one microbatch" in r for r in over["reason"])
        # ranked: the fitting, simulated rows first, best first
        ok = df[df["status"] == "ok"]
        assert list(ok.index) == list(range(len(ok)))
        assert list(ok["rank"]) == list(range(1, len(ok) + 1))
        assert ok["samples_per_s"].is_monotonic_decreasing


def test_more_gb_never_gives_a_slower_best_plan(plans):
    best = [plans[gb].loc[plans[gb]["status"] == "ok", "samples_per_s"].max() for gb in GBS]
    assert math.isnan(best[0]) and not math.isnan(best[1]), "from nothing fitting to something fitting"
    best = best[1:]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(best, best[1:])), best
    assert best[-1] > best[0]  # and memory matters in this range
    # a fixed-memory row that fits keeps fitting with more memory
    key = ["schedule", "dp", "tp", "pp", "microbatch_size"]
    for small, large in zip(GBS, GBS[1:]):
        a = plans[small]
        fixed = a[a["fits"] & ~a["schedule"].isin(["v-shape", "zb"])][key]
        b = plans[large].set_index(key)
        assert all(bool(b.loc[tuple(r)]["fits"]) for r in fixed.itertuples(index=False))


def _independent_memory(row, spec, S, placement):
    """The fullest device's memory from first principles (not the planner's code)."""
    h, V = spec.hidden, spec.vocab
    layers = stage_layers(spec.num_layers, S)
    tp = row["tp"]
    p = row["pp"]
    dev = ([(d, 2 * p - 1 - d) for d in range(p)] if placement == "v-shape" else [(d,) for d in range(p)])
    params = [sum(12 * h * h * layers[x] + (V * h if x in (0, S - 1) else 0) for x in st) / tp for st in dev]
    return params, dev, layers


def test_memory_matches_an_independent_computation(plans):
    """For simulated rows: parameters, gradients and optimizer states from the byte counts, and the
    activation peak of the row's own schedule simulated with 34·h bytes per layer and token (+ the
    LM head's 4·V + 4·h) on the binding device."""
    df = plans[4.0]
    spec = model_spec("custom", layers=6, hidden=2048, heads=16, vocab=32000, seq_len=1024)
    checked = 0
    for i, row in df[df["status"] == "ok"].head(12).iterrows():
        sched, costs = cm.planner.row_schedule(df, i)
        S = sched.num_stages
        params, dev, layers = _independent_memory(row, spec, S, row["placement"])
        d = int(row["device"])
        assert row["params_gb"] == pytest.approx(params[d] * 2 / 1e9)
        assert row["grads_gb"] == pytest.approx(params[d] * 2 / 1e9)
        assert row["optimizer_gb"] == pytest.approx(params[d] * 12 / row["dp"] / 1e9)
        tokens = row["microbatch_size"] * spec.seq_len
        act = [tokens * (layers[x] * 34 * spec.hidden + (4 * spec.vocab + 4 * spec.hidden if x == S - 1 else 0))
               / row["tp"] / 1e9 for x in range(S)]
        r = cm.simulate(sched, costs, cm.MemoryModel(activation=act, release_at_b=2 / 34))
        assert row["activation_gb"] == pytest.approx(r.peak_memory[d], rel=1e-9)
        assert row["pipeline_s"] == pytest.approx(r.makespan / 1e3, rel=1e-9)
        checked += 1
    assert checked >= 5


@pytest.mark.slow  # several seconds of CPU: the full tier (scripts/test.sh) runs it, --fast does not
def test_pruning_never_changes_the_answer(monkeypatch):
    """Bounded skipping and the unit-cost-pattern memory estimate give the same fitting set and the
    same best row per schedule as simulating everything with every schedule built."""
    small = dict(SMALL, tp=(1,), gpu_memory_gb=4.0)
    pruned = cm.plan(**small)
    monkeypatch.setattr(core, "ESTIMATE_TOLERANCE", math.inf)
    full = cm.plan(**small, exhaustive=True)
    key = ["schedule", "dp", "tp", "pp", "microbatch_size"]
    assert "bounded" in set(pruned["status"]) and "bounded" not in set(full["status"])
    fp = pruned.set_index(key)["fits"].sort_index()
    ff = full.set_index(key)["fits"].sort_index()
    assert fp.equals(ff)
    best_p = pruned[pruned["status"] == "ok"].groupby("schedule")["samples_per_s"].max()
    best_f = full[full["status"] == "ok"].groupby("schedule")["samples_per_s"].max()
    assert best_p.to_dict() == pytest.approx(best_f.to_dict())
    # every bounded row really is below its schedule's best
    for _, r in pruned[pruned["status"] == "bounded"].iterrows():
        actual = full.set_index(key).loc[tuple(r[k] for k in key), "samples_per_s"]
        assert actual <= best_f[r["schedule"]] * (1 + 1e-12)
        assert actual <= r["upper_bound_samples_per_s"] * (1 + 1e-9)
    # top=3: each schedule's three best configurations are the exhaustive run's, in order
    top3 = cm.plan(**small, top=3)
    for name, rows in full[full["status"] == "ok"].groupby("schedule", sort=False):
        got = top3[(top3["status"] == "ok") & (top3["schedule"] == name)].head(3)
        assert list(got["samples_per_s"]) == pytest.approx(list(rows.head(3)["samples_per_s"])), name


def test_a_second_plan_reuses_every_build():
    cm.planner.clear_cache()
    small = dict(SMALL, tp=(1,), microbatch_sizes=(2,), gpu_memory_gb=8.0)
    first = cm.plan(**small)
    assert first.attrs["builds"] > 0
    again = cm.plan(**small)
    assert again.attrs["builds"] == 0 and again.attrs["build_hits"] > 0
    assert again["samples_per_s"].equals(first["samples_per_s"])


def test_v_memory_saving_buys_a_larger_microbatch_and_the_notes_say_so():
    """9.6B on 8 × 40 GB from the H200 replay at PP 8: 1F1B cannot hold microbatch 4, V-Half can,
    and the larger microbatch's measured per-sample speed makes V-Half first."""
    df = cm.plan("9.6b", 8, 40, costs="h200", tp=[1], pp=[8], microbatch_sizes=[2, 4],
                 schedules=["1f1b", "v-half"], progress=False)
    win = df.iloc[0]
    assert (win["schedule"], win["microbatch_size"], win["status"]) == ("v-half", 4, "ok")
    one = df[(df["schedule"] == "1f1b") & (df["microbatch_size"] == 4)].iloc[0]
    assert one["status"] == "does not fit"
    assert any("buys microbatch 4" in n for n in df.attrs["notes"])
    assert any("H200" in a for a in df.attrs["assumptions"])


def test_every_assumption_is_stated():
    df = cm.plan(gpu_memory_gb=8.0, **dict(SMALL, tp=(1,), microbatch_sizes=(2,)))
    text = " ".join(df.attrs["assumptions"])
    for needle in ("A100 cost model", "2 B/param", "12 B/param", "allocator margin", "reserve 0 GB", "34·h",
                   "not overlapped", "Fig. 12", "torchtitan's split"):
        assert needle in text, needle
    s = df.attrs["settings"]
    assert s["gpus"] == 8 and s["global_batch"] == 32 and s["costs"]["kind"] == "a100"
    json.dumps(s)  # the settings are JSON


# -- the shipped H200 replay ------------------------------------------------------------------------

def test_allocator_margin_covers_every_replayed_device():
    """The margin fitted on the shipped replay predicts an allocator peak at least the measured one
    on every one of its devices (it is the largest of each term), and not more than 1.6× it."""
    from ctrlmem.model.replayfile import default_replay_path

    m = AllocatorMargin.from_replay()
    assert 1.0 < m.ratio < 1.2 and m.bytes_per_logit > 0 and m.bytes_per_embedding_param > 0
    data = json.loads(default_replay_path().read_text())
    for row in data["rows"]:
        S = (2 if row["schedule"].startswith("v-") else 1) * row["p"]
        mb = row.get("microbatch_size") or int(data["models"][row["model"]].rsplit("mb ", 1)[1])
        h = int(data["models"][row["model"]].split("h=")[1].split(",")[0])
        pred = m.ratio * row["theory_peak_bytes"]
        if S - 1 in row["stages"]:
            pred += m.bytes_per_logit * mb * 1024 * 50304
        if 0 in row["stages"]:
            pred += m.bytes_per_embedding_param * 50304 * h
        assert pred >= row["peak_alloc_bytes"] * (1 - 1e-9), row
        assert pred <= 1.6 * row["peak_alloc_bytes"], row


def test_replay_costs_are_the_replayed_medians():
    """The per-layer F of 9.6B at microbatch 8 is the median of the replayed interior stages' F per
    layer; microbatch 16 (not replayed) scales microbatch 8 linearly; activation ≈ 32·h."""
    src = ReplayCosts()
    spec = model_spec("9.6b")
    from ctrlmem.model.replayfile import default_replay_path

    rows = [r for r in json.loads(default_replay_path().read_text())["rows"]
            if r["model"] == "9.6b" and r.get("microbatch_size") == 8]
    fs = []
    for r in rows:
        S = (2 if r["schedule"].startswith("v-") else 1) * 16
        lay = runtime_stage_layers(30, S)
        for st, passes in r["pass_times_s"].items():
            if 0 < int(st) < S - 1:
                fs.append(passes["F"]["median"] / lay[int(st)])
    import statistics

    assert src.layer(spec, 8, 1)[0] == pytest.approx(statistics.median(fs))
    assert src.layer(spec, 16, 1)[0] == pytest.approx(2 * statistics.median(fs))
    assert 31 < src.layer_activation(spec, True) / spec.hidden < 33
    assert src.microbatch_sizes(spec) == (1, 2, 4, 8)
    # the LM head's kept bytes (4·V + 4·h per token) match the replayed last 1F1B stage within 1 %
    data = src.data
    last = next(r for r in data["rows"] if r["model"] == "9.6b" and r["schedule"] == "1f1b" and r["device"] == 15
                and r["tag"] == "paper-p")
    per_layer = src.layer_activation(spec, True)
    head = last["theory_peak_bytes"] / (4 * 1024) - 1 * per_layer  # one microbatch in flight, one layer
    assert head == pytest.approx(4 * 50304 + 4 * 5120, rel=0.01)
    assert src.peak_flops() == 989e12


def test_replay_vocab_is_the_runtime_presets():
    models = pytest.importorskip("ctrlmem.runtime.models")
    from ctrlmem.planner.sources import REPLAY_VOCAB

    assert {models.PRESETS[n].vocab for n in ("9.6b", "21b", "38.5b", "98.5b")} == {REPLAY_VOCAB}


@pytest.mark.parametrize("L,S", [(30, 16), (30, 32), (78, 5), (78, 10), (78, 40), (78, 80), (46, 24), (6, 4)])
def test_stage_split_is_the_papers_rule_and_the_runtimes(L, S):
    got = stage_layers(L, S)
    assert sum(got) == L and len(got) == S
    if (L + 2) % S == 0:
        k = (L + 2) // S
        assert got == [k - 1] + [k] * (S - 2) + [k - 1]
        models = pytest.importorskip("ctrlmem.runtime.models")
        if L % S:
            assert got == models.layers_per_stage(L, S)


def test_a100_costs_equal_the_paper_cost_model():
    """Per-stage costs of the A100 source sum to the paper's (ctrlmem.model.paper.paper_costs × p) for an
    even model."""
    from ctrlmem.planner.sources import A100Costs

    spec = model_spec("9.6b")
    src = A100Costs()
    for tp in (1, 2):
        f, b, w = src.layer(spec, 4, tp)
        hf, hb, hw = src.head(spec, 4, tp)
        ref = paper.paper_costs("9.6B", 1, 4, tp=tp)  # one stage = the whole model, in ms
        assert (30 * f + hf) * 1e3 == pytest.approx(ref.f, rel=1e-9)
        assert (30 * b + hb) * 1e3 == pytest.approx(ref.b, rel=1e-9)
        assert (30 * w + hw) * 1e3 == pytest.approx(ref.w, rel=1e-9)
        assert src.hop(spec, 4, tp) * 1e3 == pytest.approx(ref.comm, rel=1e-9)


# -- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,needle", [
    (dict(model="9.7b"), "unknown model '9.7b'"),
    (dict(model="custom"), "custom model needs layers, hidden, heads"),
    (dict(gpus=0), "gpus must be a positive integer"),
    (dict(gpu_memory_gb=-1), "gpu_memory_gb must be > 0"),
    (dict(schedules=["v-haf"]), "unknown schedule 'v-haf'"),
    (dict(schedules=["v-half@0.5"]), "takes no @LIMIT"),
    (dict(schedules=["zb@x"]), "must be a number"),
    (dict(tp=[3]), "tp [3]"),
    (dict(costs="nofile.json"), "no such file"),
    (dict(costs="1,x,1"), "per-layer costs"),
    (dict(distributed_optimizer="maybe"), "True, False or 'both'"),
    (dict(microbatch_sizes="1,a"), "microbatch_sizes"),
])
def test_bad_input_names_the_problem(kwargs, needle):
    args = dict(model="98.5b", gpus=40, gpu_memory_gb=80, global_batch=160, progress=False, schedules=["1f1b"],
                microbatch_sizes=[1], tp=[4], pp=[5])
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        cm.plan(**args)
    assert needle in str(err.value)


def test_replay_without_the_model_says_what_it_has():
    with pytest.raises(ValueError, match="no rows for model 'custom'.*9.6b"):
        cm.plan("custom", 8, 80, 32, layers=6, hidden=2048, heads=16, costs="h200", progress=False)


@pytest.mark.slow
def test_a_progress_bar_appears_only_when_the_search_takes_over_a_second(monkeypatch, capsys):
    """tqdm's bar (delay 1 s) is drawn on stderr when the search is slow, never when it is quick or
    progress=False."""
    import time as _time

    kw = dict(SMALL, tp=(1,), microbatch_sizes=(1, 2, 4), schedules=["1f1b"], gpu_memory_gb=8.0, exhaustive=True)
    cm.planner.clear_cache()
    cm.plan(**{**kw, "progress": True})
    assert "plan:" not in capsys.readouterr().err  # fast: no bar
    real = core.simulate

    def slow(*a, **k):
        _time.sleep(0.25)
        return real(*a, **k)

    monkeypatch.setattr(core, "simulate", slow)
    cm.planner.clear_cache()
    cm.plan(**{**kw, "progress": True})
    assert "plan:" in capsys.readouterr().err
    assert isinstance(core._progress(100, False), core._NoBar)  # progress=False never makes a bar


def test_pareto_front_is_the_non_dominated_rows(plans):
    from ctrlmem.planner.views import pareto_front, throughput_memory_figure

    df = plans[4.0]
    ok = df[df["status"] == "ok"]
    front = pareto_front(df)
    assert len(front) >= 2
    for _, r in ok.iterrows():
        dominated = ((ok["total_gb"] <= r["total_gb"]) & (ok["samples_per_s"] > r["samples_per_s"])).any()
        assert dominated != (r.name in front.index) or (
            # equal memory, equal speed: only the first of equals is kept
            ((front["total_gb"] == r["total_gb"]) & (front["samples_per_s"] == r["samples_per_s"])).any())
    fig = throughput_memory_figure(df)
    names = [t.name for t in fig.data]
    assert "Pareto front" in names and len(fig.data[names.index("Pareto front")].x) == len(front)


def test_with_and_without_a_distributed_optimizer():
    """'both' plans each DP > 1 configuration twice: without the distributed optimizer every replica
    holds all optimizer states (DP × the sharded amount); at DP 1 there is one row."""
    df = cm.plan(**dict(SMALL, tp=(1,), microbatch_sizes=(1,), schedules=["1f1b"], gpu_memory_gb=64.0,
                        distributed_optimizer="both", exhaustive=True))
    key = ["dp", "tp", "pp", "microbatch_size"]
    for cfg, rows in df.groupby(key):
        dp = cfg[0]
        assert len(rows) == (2 if dp > 1 else 1)
        if dp > 1:
            on, off = rows[rows["dist_opt"]].iloc[0], rows[~rows["dist_opt"]].iloc[0]
            assert off["optimizer_gb"] == pytest.approx(dp * on["optimizer_gb"])
            assert off["params_gb"] == on["params_gb"] and off["samples_per_s"] == pytest.approx(on["samples_per_s"])


def test_explicit_per_layer_costs():
    """F,B,W[,HOP] seconds per layer and sequence: linear in the microbatch, the hop as given, MFU
    only with a GPU peak; a 1F1B row's step is the simulation of those per-stage costs."""
    from ctrlmem.planner.sources import LayerCosts, cost_source

    src = cost_source("0.001,0.002,0.001,0.0005")
    spec = model_spec("custom", layers=6, hidden=2048, heads=16, vocab=32000)
    assert src.layer(spec, 4, 1) == pytest.approx((0.004, 0.008, 0.004)) and src.hop(spec, 4, 1) == 0.0005
    kw = dict(SMALL, tp=(1,), microbatch_sizes=(2,), schedules=["1f1b"], gpu_memory_gb=64.0, pp=[2])
    df = cm.plan(**kw, costs=src)
    row = df.iloc[0]
    assert math.isnan(row["mfu"]) and any("no GPU peak given" in a for a in df.attrs["assumptions"])
    layers = stage_layers(6, 2)
    head = 2 * 2048 * 32000
    f_l, b_l, w_l = (x / y for x, y in zip((0.002, 0.004, 0.002), paper.layer_flops(2048, 1024)))
    costs = cm.Costs([1e3 * (n * 0.002 + (head * f_l if s == 1 else 0)) for s, n in enumerate(layers)],
                     [1e3 * (n * 0.004 + (head * b_l if s == 1 else 0)) for s, n in enumerate(layers)],
                     [1e3 * (n * 0.002 + (head * w_l if s == 1 else 0)) for s, n in enumerate(layers)], comm=0.5)
    m = int(row["m"])
    assert row["pipeline_s"] == pytest.approx(cm.simulate(cm.build("1f1b", 2, m), costs).makespan / 1e3)
    peak = cm.plan(**kw, costs=LayerCosts(0.001, 0.002, 0.001, 0.0005, peak_tflops=100))
    assert peak.iloc[0]["mfu"] > 0
