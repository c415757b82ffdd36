"""Real CPU runs with the memory levers: recomputation (a non-reentrant torch.utils.checkpoint around
each stage's layers or attention cores) and activation offload."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import ctrlmem as cm
from ctrlmem.model.levers import with_offload, with_recompute
from ctrlmem.runtime.launch import RunConfig, RunError, prepare, run_many

GRAD_TOL = 1e-5
SAVED_TOL = 0.05

# the runs of each slow test: (schedule, recompute[, memory_fidelity]) and (schedule, offload)
RECOMPUTE_1F1B = (("1f1b", "none"), ("1f1b-r", "none"), ("1f1b", "selective"))
RECOMPUTE_SPLIT = (("zb-h1", "none", True), ("zb-h1", "full", True), ("v-half", "none", True), ("v-half", "full", True),
                   ("zb-h1", "full", False), ("dualpipe-v", "full", True))
OFFLOAD_FRACTIONS = (("1f1b", 0.0), ("1f1b", 0.5), ("1f1b", 1.0), ("zb-h1", 0.5))


def _mixed_levers():
    """A ZB-H1 schedule that recomputes two of rank 0's forwards and offloads half of the other two."""
    return with_offload(with_recompute(cm.build("zb-h1", 2, 4), "full", which=[(0, 0), (0, 2)]), 0.5,
                        which=[(0, 1), (0, 3)])


@pytest.fixture(scope="module")
def lever_runs(tmp_path_factory):
    """The slow tests' runs, every one at p = 2, m = 4 on the tiny model, in one launch, each
    test's runs in its order (a launch's start-up, torch in every process, was most of each
    test's time; run_many's runs are measured as in launches of their own, which
    test_runtime_multiprocess checks): ``{"1f1b" | "split" | "offload": [result, ...]}``."""
    base = tmp_path_factory.mktemp("levers")
    mixed_file = base / "mixed.txt"
    mixed_file.write_text(_mixed_levers().to_text())
    groups = {
        "1f1b": [RunConfig(n, 2, 4, steps=0, out=str(base / f"{n}-{mode}"), timeout_s=280, hang_timeout_s=120,
                           recompute=mode) for n, mode in RECOMPUTE_1F1B],
        "split": [RunConfig(n, 2, 4, steps=0, out=str(base / f"{n}-{mode}-{fid}"), timeout_s=280, hang_timeout_s=120,
                            recompute=mode, memory_fidelity=fid) for n, mode, fid in RECOMPUTE_SPLIT],
        "offload": [RunConfig(n, 2, 4, steps=0, out=str(base / f"run{i}"), timeout_s=280, hang_timeout_s=120, offload=f)
                    for i, (n, f) in enumerate(OFFLOAD_FRACTIONS + ((str(mixed_file), 0.0),))],
    }
    results = iter(run_many([c for configs in groups.values() for c in configs]))
    return {key: [next(results) for _ in configs] for key, configs in groups.items()} | {"mixed_file": str(mixed_file)}


@pytest.mark.slow
def test_1f1b_r_saves_less_and_stays_exact(lever_runs):
    """1F1B and 1F1B-R on 2 gloo processes, tiny model, m = 4: both give the reference's
    gradients; 1F1B-R's measured saved-tensor peak is below 1F1B's on every rank and within 5 %
    of its theory (forwards keep their checkpoint inputs until the backward recomputes them).
    Selective recomputation (the attention core checkpointed) is exact and follows its theory too;
    with a fused attention kernel it saves next to nothing, as there is no s x s tensor to drop."""
    plain, rec, sel = lever_runs["1f1b"]
    for (name, mode), result in zip(RECOMPUTE_1F1B, (plain, rec, sel)):
        assert result["config"]["schedule"] == name and result["config"]["recompute"] == mode
    for result in (plain, rec, sel):
        assert result["status"] == "ok", result.get("failure")
        assert result["grad_rel_diff"] <= GRAD_TOL, result["grad_rel_diff"]
        for rank, ratio in enumerate(result["saved_over_theory"]):
            assert abs(ratio - 1) <= SAVED_TOL, (result["schedule"]["name"], rank, ratio)
    assert all(r < p for r, p in zip(rec["peak_saved_bytes"], plain["peak_saved_bytes"]))
    print("saved peak bytes 1f1b", plain["peak_saved_bytes"], "1f1b-r", rec["peak_saved_bytes"],
          "theory 1f1b-r", rec["theory_peak_bytes"], "grad_rel_diff", plain["grad_rel_diff"], rec["grad_rel_diff"])


@pytest.mark.slow
def test_split_backward_schedules_recompute_once_and_stay_exact(lever_runs):
    """ZB-H1 and V-Half with full recomputation on 2 gloo processes, tiny model, m = 4: the
    reference's gradients; every checkpointed region is recomputed exactly once (in B: W takes
    the stashed inputs), so the measured saved-tensor peak is within 5 % of the schedule's theory
    on every rank and below the plain run's on rank 0. torch's own split backward
    (memory_fidelity off) is exact too, but recomputes the region for each of its W's graph
    tasks on the stage that runs its B (rank 1; rank 0's first stage runs no B there). DualPipeV
    with full recomputation (each R before the overlapped F&B pair of its backward) is exact and
    recomputes each region once as well."""
    specs = RECOMPUTE_SPLIT
    results = lever_runs["split"]
    for (name, mode, fid), result in zip(specs, results):
        assert result["status"] == "ok", result.get("failure")
        assert (result["config"]["schedule"], result["config"]["recompute"], result["config"]["memory_fidelity"]) == \
            (name, mode, fid)
        assert result["grad_rel_diff"] <= GRAD_TOL, (name, mode, fid, result["grad_rel_diff"])
        if not fid:
            continue
        for rank, ratio in enumerate(result["saved_over_theory"]):
            assert abs(ratio - 1) <= SAVED_TOL, (name, mode, rank, ratio)
        if mode == "full":
            assert result["recompute"]["per_region"] == [1.0, 1.0], (name, result["recompute"])
        else:
            assert result["recompute"] is None
    for plain, rec in ((results[0], results[1]), (results[2], results[3])):
        assert rec["peak_saved_bytes"][0] < plain["peak_saved_bytes"][0]
    torch_own = results[4]["recompute"]
    assert torch_own["per_region"][0] == 1.0 and torch_own["per_region"][1] > 2, torch_own
    print("saved peaks zb-h1", results[0]["peak_saved_bytes"], "->", results[1]["peak_saved_bytes"],
          "v-half", results[2]["peak_saved_bytes"], "->", results[3]["peak_saved_bytes"],
          "torch's own split: recomputes per region", torch_own["per_region"])


def test_recompute_run_config_is_checked():
    """A split-backward schedule with recompute is prepared with its R passes; a bad recompute
    value is refused by name."""
    schedule, _ = prepare(RunConfig("zb-h1", 2, 4, recompute="full"))
    assert schedule.split_backward and schedule.recomputes
    with pytest.raises(RunError, match="recompute must be none, selective or full"):
        prepare(RunConfig("1f1b", 2, 4, recompute="yes"))


@pytest.mark.slow
def test_offloaded_runs_are_exact_and_keep_less_on_the_device(lever_runs):
    """1F1B with half and all of every early forward offloaded (and ZB-H1, whose split backward
    keeps the reloaded W inputs until W) on 2 gloo processes: the reference's gradients; rank 0,
    whose forwards wait for their backward, keeps less on the device the more is offloaded; the
    measured host peak is its theory exactly, and the resident peak is within [-10 %, +5 %] of its
    theory (which reloads a forward's whole share before its backward; the run reloads each tensor
    as autograd asks for it, so it may stay below). A ZB-H1 schedule file that recomputes two of
    rank 0's forwards and offloads the other two runs each forward with its own lever: only the
    two are checkpointed (once each), the others are copied, within the same bounds."""
    mixed_file = lever_runs["mixed_file"]
    specs = OFFLOAD_FRACTIONS + ((mixed_file, 0.0),)
    results = lever_runs["offload"]
    for (name, frac), result in zip(specs, results):
        assert result["status"] == "ok", result.get("failure")
        assert (result["config"]["schedule"], result["config"]["offload"]) == (name, frac)
        assert result["grad_rel_diff"] <= GRAD_TOL, (name, frac, result["grad_rel_diff"])
        for rank, ratio in enumerate(result["saved_over_theory"]):
            assert -0.10 <= ratio - 1 <= SAVED_TOL, (name, frac, rank, ratio)
        off = result["offload"]
        if frac or name == str(mixed_file):
            assert off["offloaded_bytes"][0] > 0
            assert off["peak_host_bytes"] == pytest.approx(off["theory_host_peak_bytes"], rel=1e-9)
        else:
            assert off is None
    peaks = [r["peak_saved_bytes"][0] for r in results[:3]]
    assert peaks[0] > peaks[1] > peaks[2], peaks
    rec = results[4]["recompute"]
    assert rec["regions"] == [2, 0] and rec["recomputes"] == [2, 0], rec
    print("rank 0 saved peak by offload fraction 0 / 0.5 / 1:", peaks)


def test_offload_run_config_is_checked():
    """An offload share outside [0, 1] is refused by name, and so is an offload with recompute
    (a forward is recomputed or offloaded, not both: together nothing would be offloaded)."""
    with pytest.raises(RunError, match="offload"):
        prepare(RunConfig("1f1b", 2, 4, offload=1.5))
    with pytest.raises(RunError, match="offload"):
        prepare(RunConfig("1f1b", 2, 4, offload=-0.1))
    for mode in ("full", "selective"):
        with pytest.raises(RunError, match="recomputed or offloaded, not both.*--recompute auto --offload auto"):
            prepare(RunConfig("1f1b", 2, 4, recompute=mode, offload=0.5))
