"""The memory levers in the model: recompute passes, activation offload, their memory and time."""

from dataclasses import replace

import pytest

import ctrlmem as cm
from ctrlmem import Op, Pass, Schedule
from ctrlmem.model.ir import Copy
from ctrlmem.model.levers import with_offload, with_recompute

KAPPA = 2 / 34


def _insert(schedule: Schedule, device: int, step: int, ps: Pass) -> Schedule:
    rows = [list(r) for r in schedule.device_passes]
    rows[device].insert(step, ps)
    return replace(schedule, device_passes=tuple(map(tuple, rows)))


def test_recompute_pass_text_and_torch_csv():
    """``3R0`` parses; a schedule with R passes round-trips its text form (mode included) and
    exports the torch CSV of the schedule without them."""
    assert Pass.parse("3R0") == Pass(Op.R, 3, 0)
    base = cm.build("zb-h1", 4, 8)
    for mode in ("full", "selective"):
        rec = with_recompute(base, mode)
        assert rec.recomputes and Schedule.from_text(rec.to_text()) == rec
        assert rec.to_torch_csv() == base.to_torch_csv()
        assert rec.compute_only() == base


def test_offload_text_round_trips():
    """Copy lines (fractions, reload steps) round-trip; bad copy text is refused naming the form."""
    s = with_offload(cm.build("1f1b", 4, 8), 0.5, costs=cm.Costs(offload=0.3))
    assert s.offloads and Schedule.from_text(s.to_text()) == s
    assert Copy.parse("3O0:0.25") == Copy("O", 3, 0, 0.25)
    for bad in ("3O0@2", "3L0", "3X0", "3L0:0.5@1"):
        with pytest.raises(ValueError, match="cannot parse copy"):
            Copy.parse(bad)


def test_levers_never_change_what_is_computed():
    """Every lever keeps each F, B, W, BW on its device in its order (R and copies added only)."""
    for name in ("1f1b", "gpipe", "zb-h1", "zb-v", "interleaved-1f1b"):
        base = cm.build(name, 4, 8)
        for lever in (with_recompute(base), with_offload(base, 1.0), with_recompute(base, "selective")):
            assert lever.compute_only() == base
            cm.validate(lever)


def test_compute_only_keeps_overlapped_pairs_and_model_copies():
    """A schedule without levers is its own compute order: DualPipeV's overlapped F&B pairs and
    DualPipe's two model copies survive, and a pair's position moves back past a dropped R, so a
    real run's predicted step and its simulated trace time the pairs as pairs."""
    for name, p, m in (("dualpipe-v", 2, 4), ("dualpipe", 4, 8)):
        s = cm.build(name, p, m)
        assert s.overlaps and s.compute_only() == s
    s = cm.build("dualpipe-v", 2, 4)
    row0 = s.device_passes[0]
    with_r = replace(s, device_passes=((Pass(Op.R, row0[0].stage, row0[0].microbatch), *row0), *s.device_passes[1:]),
                     overlaps=(tuple(i + 1 for i in s.overlaps[0]), *s.overlaps[1:]))
    assert with_r.compute_only() == s


def test_recompute_without_forward_or_after_backward_is_named():
    """Validation names device, step and pass for an R after its B and an R before its F."""
    base = cm.build("1f1b", 2, 2)  # d0: 0F0 0F1 0BW0 0BW1
    late = _insert(base, 0, 4, Pass(Op.R, 0, 0))
    with pytest.raises(cm.ScheduleError, match=r"device 0, step 4: recompute 0R0 comes after its backward 0BW0") as exc:
        cm.validate(late)
    assert exc.value.device == 0 and exc.value.position == 4
    early = _insert(base, 0, 0, Pass(Op.R, 0, 1))
    with pytest.raises(cm.ScheduleError, match=r"device 0, step 0: recompute 0R1 comes before its forward 0F1"):
        cm.validate(early)


def test_full_recompute_memory_and_time_on_one_device():
    """One device, GPipe with full recompute: the forwards keep only their inputs (peak
    ``(m - 1)·κ + 1``: the last recomputed forward full) and each R adds one forward to the time."""
    p, m = 1, 4
    base = cm.build("gpipe", p, m)
    costs = cm.Costs(1, 2, 0)
    plain, rec = cm.simulate(base, costs), cm.simulate(with_recompute(base), costs)
    assert plain.peak_memory == [m]
    assert rec.peak_memory[0] == pytest.approx(1 + (m - 1) * KAPPA)
    assert rec.makespan == plain.makespan + m * 1.0


def test_recompute_cost_and_keep_fraction_come_from_costs():
    """A custom recompute time and input fraction are what the simulation uses."""
    s = with_recompute(cm.build("gpipe", 1, 3))
    r = cm.simulate(s, cm.Costs(1, 1, 1, recompute=0.25, input_fraction=0.5))
    assert r.makespan == 3 * (1 + 2) + 3 * 0.25
    assert r.peak_memory[0] == pytest.approx(2 * 0.5 + 1)


def test_offload_with_zero_copy_cost_frees_memory_at_the_forward_end():
    """GPipe on one device, everything offloaded at no cost: each forward's activation leaves at
    its end, so one microbatch at a time is resident (peak ``a``, not ``m·a``) and time is unchanged."""
    base = cm.build("gpipe", 1, 3)
    off = with_offload(base, 1.0, costs=cm.Costs(offload=0.0))
    r = cm.simulate(off, cm.Costs(offload=0.0))
    assert r.peak_memory == [1.0] and r.makespan == cm.simulate(base).makespan
    times, values = r.memory_curve(0)
    assert values[times.index(1.0)] == 1.0  # F0 left at t = 1 while F1 took its place


def test_late_reload_delays_its_backward():
    """A reload slower than the passes before its B holds the B until the reload ends."""
    costs = cm.Costs(1, 1, 1, offload=5.0)
    r = cm.simulate(with_offload(cm.build("gpipe", 1, 2), 1.0, costs=costs), costs)
    reload0 = next(c for c in r.copies if c.op == "L" and c.microbatch == 0)
    bw0 = next(tp for tp in r.passes if tp.op is Op.BW and tp.microbatch == 0)
    assert bw0.start == reload0.end > 2.0
    assert r.makespan > cm.simulate(cm.build("gpipe", 1, 2), costs).makespan


def test_offloaded_share_stays_resident_while_its_copy_is_in_flight():
    """Memory counts the activation until its copy ends: a slow copy raises the peak above a fast one."""
    base = cm.build("gpipe", 1, 3)
    peaks = [cm.simulate(with_offload(base, 1.0, costs=c), c).max_peak_memory
             for c in (cm.Costs(offload=0.0), cm.Costs(offload=2.0))]
    assert peaks[0] < peaks[1]


def test_reload_after_its_backward_is_named():
    """A reload issued at or after its B's step names device, step and pass."""
    base = cm.build("gpipe", 1, 2)  # 0F0 0F1 0BW0 0BW1
    bad = replace(base, copies=((Copy("O", 0, 0), Copy("L", 0, 0, after=2)),))
    with pytest.raises(cm.ScheduleError, match=r"device 0, step 2: pass 0BW0 needs reload 0L0@2.*after its backward"):
        cm.validate(bad)
    lonely = replace(base, copies=((Copy("O", 0, 0),),))
    with pytest.raises(cm.ScheduleError, match="offload without a reload"):
        cm.validate(lonely)


def test_recompute_and_offload_of_one_forward_is_refused():
    base = cm.build("gpipe", 1, 2)
    both = replace(with_recompute(base), copies=((Copy("O", 0, 0), Copy("L", 0, 0, after=1)),))
    with pytest.raises(cm.ScheduleError, match="both recomputed .* and offloaded"):
        cm.validate(both)


def test_lever_fields_are_keyword_only_with_defaults():
    """The new Costs and Schedule fields never take a positional slot; bad values are named."""
    assert cm.Costs(1, 2, 3, 0.5) == cm.Costs(f=1, b=2, w=3, comm=0.5)
    with pytest.raises(TypeError):
        cm.Costs(1, 2, 3, 0, None)
    with pytest.raises(ValueError, match="input_fraction"):
        cm.Costs(input_fraction=1.5)
    assert cm.Costs().to_dict() == {"f": 1.0, "b": 1.0, "w": 1.0, "comm": 0.0}
    assert cm.Costs.coerce({"f": 1, "offload": 0.5}).offload == 0.5
    keep, cost = cm.Costs.selective_pair(12288, 96, 2048)
    assert (keep, cost) == pytest.approx(cm.Costs().selective)


def test_gpt_levers_keep_the_input_of_the_whole_layer():
    """A GPT layer saves sbh(34 + 5·heads·s/h) bytes and full recomputation keeps its input 2sbh
    (Korthikanti et al. 2022): 2/74 for the 9.6B at seq 1024; a fused attention kernel saves no
    s x s scores, so 2/34 and selective keeps everything; bad sizes are named."""
    levers = cm.Costs.gpt_levers(5120, 40, 1024)
    assert levers["input_fraction"] == pytest.approx(2 / 74)
    assert levers["selective"] == pytest.approx(cm.Costs.selective_pair(5120, 40, 1024))
    assert cm.Costs(**levers).kept_fraction("full") == pytest.approx(2 / 74)
    flash = cm.Costs.gpt_levers(5120, 40, 1024, flash_attention=True)
    assert flash == {"input_fraction": 2 / 34, "selective": (1.0, 0.0)}
    with pytest.raises(ValueError, match="heads must be a positive integer"):
        cm.Costs.gpt_levers(5120, 0, 1024)


@pytest.mark.parametrize("model,flash", [("9.6B", False), ("38.5B", False), ("9.6B", True)])
def test_paper_costs_recompute_keeps_the_models_own_input_fraction(model, flash):
    """On the A100 cost model of a paper preset, 1F1B-R's device 0 holds one whole microbatch and
    the inputs (2h bytes per layer and token) of the p − 1 others in flight, in the bytes
    activation_bytes counts for that model (34h + 5·heads·s, or 34h with FlashAttention)."""
    from ctrlmem.experiments import simulate_point
    from ctrlmem.model import paper

    pre = paper.model(model)
    p, mb = pre.num_gpus, 1
    r = simulate_point("1f1b-r", p, 2 * p, costs="paper", model=model, microbatch_size=mb, flash_attention=flash)
    layers, tokens = pre.num_layers / p, mb * paper.ASSUMED_SEQ_LEN
    whole = paper.activation_bytes(pre, layers, mb, flash_attention=flash)
    assert r["activation_gb"] * 1e9 == pytest.approx(whole + (p - 1) * layers * tokens * 2 * pre.hidden)


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (8, 32), (8, 4), (3, 7)])
def test_1f1b_r_closed_form(p, m):
    """1F1B-R's makespan is (p−1)(F+c) + m(F+R+B+W) + (p−1)(B+W+c): one recompute per
    microbatch on the critical path (comm 0, and comm no larger than R/2); peak a(1 + (min(p−i, m)−1)κ)."""
    for c in (cm.Costs(1, 1, 1), cm.Costs(1, 2, 0), cm.Costs(2, 1, 1), cm.Costs(1, 2, 1, 0.5),
              cm.Costs(1, 1, 1, recompute=3)):
        r = cm.simulate(cm.build("1f1b-r", p, m), c)
        rec = c.recompute if c.recompute is not None else c.f
        assert r.makespan == pytest.approx((p - 1) * (c.f + c.comm) + m * (c.f + rec + c.b + c.w)
                                           + (p - 1) * (c.b + c.w + c.comm))
        if c.comm == 0:
            assert r.makespan == cm.simulate(cm.build("1f1b", p, m), c).makespan + m * rec
    peaks = cm.simulate(cm.build("1f1b-r", p, m)).peak_memory
    assert peaks == pytest.approx([1 + (min(p - i, m) - 1) * KAPPA for i in range(p)])


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "v-min", "v-half",
                                  "dualpipe", "dualpipe-v"])
def test_every_schedule_takes_the_levers(name):
    """build(recompute=..., offload=...) adds levers to any schedule without changing its
    computation (DualPipe's overlapped pairs included: ``compute_only`` compares them), and lowers
    (never raises) its peak; bad lever values are refused by name."""
    base = cm.build(name, 4, 8)
    peak = cm.simulate(base).max_peak_memory
    for kw in ({"recompute": "full"}, {"recompute": "selective"}, {"offload": 1.0}, {"offload": "0.5"}):
        s = cm.build(name, 4, 8, **kw)
        assert s.compute_only() == base and (s.recomputes or s.offloads)
        assert cm.simulate(s).max_peak_memory <= peak
    with pytest.raises(ValueError, match="recompute must be one of"):
        cm.build(name, 4, 8, recompute="yes")
    with pytest.raises(ValueError, match="offload must be none, auto or a fraction"):
        cm.build(name, 4, 8, offload=1.5)
    with pytest.raises(ValueError, match="memory budget"):
        cm.build(name, 4, 8, recompute="auto")


def test_a_recomputed_backward_of_an_overlapped_pair_recomputes_before_the_pair():
    """DualPipe overlaps a forward with a backward as one unit: the R of that backward runs right
    before the unit (R between the two would split the pair; it was refused as an invalid pair),
    and the pairs still start where the passes of each are."""
    for name in ("dualpipe", "dualpipe-v"):
        base = cm.build(name, 4, 8)
        s = cm.build(name, 4, 8, recompute="full")
        assert sum(len(x) for x in s.overlaps) == sum(len(x) for x in base.overlaps) > 0
        for d in range(s.num_devices):
            units = s.units(d)
            for k, unit in enumerate(units):
                backs = [ps for ps in unit if ps.op in (Op.B, Op.BW)]
                for b in backs:  # the unit before a backward's unit is its R
                    assert units[k - 1] == (Pass(Op.R, b.stage, b.microbatch),), (name, d, unit)
                if len(unit) == 2:
                    assert {ps.op for ps in unit} & {Op.F} and backs, (name, d, unit)
        r = cm.simulate(s)
        assert r.max_peak_memory < cm.simulate(base).max_peak_memory


def test_cli_levers(capsys):
    """simulate/export take --recompute/--offload/--offload-cost; export's CSV drops the levers
    with a note; a bad fraction is one error line, exit 2."""
    from ctrlmem.cli import main

    assert main(["simulate", "1f1b", "-p", "8", "-m", "32", "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    assert "makespan      149 " in out and "recompute full on 256 of 256 forwards" in out
    assert main(["export", "1f1b", "-p", "2", "-m", "2", "--recompute", "full", "--torch-csv", "-"]) == 0
    got = capsys.readouterr()
    assert got.out.startswith("0F0,0F1,0B0,0B1") and "torch.utils.checkpoint" in got.err
    assert main(["simulate", "1f1b", "--offload", "1", "--offload-cost", "0"]) == 0
    assert "peak memory   1 a" in capsys.readouterr().out
    assert main(["simulate", "1f1b", "--offload", "3"]) == 2
    assert "error: offload must be" in capsys.readouterr().err


@pytest.mark.parametrize("name,limit", [("v-shape", 0.25), ("v-shape", 0.4), ("zb", 0.5)])
def test_auto_levers_stay_within_budget_and_beat_reordering(name, limit):
    """recompute/offload="auto" on a budgeted search: the peak never exceeds the budget, the
    schedule is valid (every pass once, R before its B, every reload before its B), and the makespan is never above the
    reordering-only schedule's at that budget."""
    p, m = 4, 8
    costs = cm.Costs(1, 1, 1, offload=0.5)
    plain = cm.simulate(cm.build(name, p, m, costs=costs, memory_limit=limit), costs)
    for kw in ({"offload": "auto"}, {"recompute": "auto"}, {"offload": "auto", "recompute": "auto"}):
        s = cm.build(name, p, m, costs=costs, memory_limit=limit, **kw)
        r = cm.simulate(cm.validate(s), costs)
        assert r.max_peak_memory <= limit * p + 1e-9
        assert r.makespan <= plain.makespan + 1e-9


def test_fit_with_levers_meets_a_cap_below_reordering():
    """The greedy brings 1F1B (peak p·a) under a cap of 1.5 a with recompute, never above it,
    and gives up (None) when only offload is allowed and nothing can hide a copy."""
    from ctrlmem.schedules.auto_levers import fit_with_levers

    base = cm.build("1f1b", 4, 8)
    fitted = fit_with_levers(base, 1.5, cm.Costs(), "full", None)
    assert fitted is not None and cm.simulate(fitted).max_peak_memory <= 1.5
    assert fitted.compute_only() == base
    assert fit_with_levers(cm.build("1f1b", 1, 4), 0.5, cm.Costs(offload=1.0), None, 1.0) is None


def test_recompute_after_offload_keeps_each_reload_after_its_pass():
    """Recomputing some forwards of an already offloaded schedule inserts R passes: every reload
    stays issued after the same pass it was (its step moves with it), so the schedule stays
    valid and its offloads keep their timing."""
    costs = cm.Costs(1, 1, 1, offload=0.25)
    base = cm.build("1f1b", 4, 16)
    off = with_offload(base, 1.0, which=[(0, mb) for mb in range(0, 16, 2)], costs=costs)
    both = with_recompute(off, "full", which=[(0, mb) for mb in range(1, 16, 2)])
    cm.validate(both)
    for c_before, c_after in zip(off.copies[0], both.copies[0]):
        if c_before.kind == "L":
            assert off.device_passes[0][c_before.after] == both.device_passes[0][c_after.after]
    assert sum(ps.op is Op.R for ps in both.device_passes[0]) == 8
    assert both.compute_only() == base


def test_auto_levers_that_offload_then_recompute_give_a_valid_schedule():
    """A budget where fitting a looser seed offloads, then recomputes on the same schedule (a copy
    of 4 per a stops paying): cm.build returns a valid schedule within the budget, never slower
    than reordering alone (it raised a ScheduleError naming a reload issued before its forward
    when the R passes shifted the steps)."""
    costs = cm.Costs(2, 3, 1, 0.2, offload=4.0)
    s = cm.build("v-shape", 4, 16, costs=costs, memory_limit=0.375, recompute="auto", offload="auto")
    r = cm.simulate(cm.validate(s), costs)
    assert r.max_peak_memory <= 0.375 * 4 + 1e-9
    plain = cm.simulate(cm.build("v-shape", 4, 16, costs=costs, memory_limit=0.375), costs)
    assert r.makespan <= plain.makespan + 1e-9


def test_improve_keeps_the_copies():
    """cm.improve takes an offloaded schedule and keeps its copies: the same forwards offloaded,
    the same shares (tests/test_improve_offload.py has the rest)."""
    costs = cm.Costs(1, 1, 1, 0, offload=0.5)
    s = cm.build("1f1b", 2, 4, costs=costs, offload=0.5)
    r = cm.improve(s, costs, time_limit=1)
    offs = lambda x: sorted((c.stage, c.microbatch, c.fraction) for row in x.copies for c in row if c.kind == "O")  # noqa: E731
    assert offs(r.schedule) == offs(s) and r.makespan <= cm.simulate(s, costs).makespan + 1e-9


@pytest.mark.parametrize("name,p,m,limit,costs", [
    ("zb", 6, 12, 0.3, (2, 3, 1, 0.2)),      # the looser zb seeds defer W passes: nothing fitted (396)
    ("zb", 8, 16, 0.2, (1, 1, 1, 0)),
    ("v-shape", 4, 8, 0.3, (1, 1, 1, 0)),    # offload first, recompute after, was 50.5 against 36
    ("v-shape", 8, 16, 0.2, (2, 3, 1, 0.2)),
])
def test_auto_levers_are_at_least_each_lever_alone_and_one_f1b_r(name, p, m, limit, costs):
    """The lever search is never slower than 1F1B-R when 1F1B-R fits the budget (1F1B, every
    forward recomputed, is one of the schedules it brings under the budget), and with both levers
    allowed never slower than with either alone (it raised neither: 396 and 50.5 where 1F1B-R
    took 128 and recompute alone 36)."""
    costs = cm.Costs(*costs, offload=0.5 * costs[0])
    got = {}
    for rec, off in (("auto", "none"), ("none", "auto"), ("auto", "auto")):
        try:
            s = cm.build(name, p, m, costs=costs, memory_limit=limit, recompute=rec, offload=off)
        except ValueError:
            continue
        r = cm.simulate(cm.validate(s), costs)
        assert r.max_peak_memory <= limit * p + 1e-9
        got[rec, off] = r.makespan
    assert got["auto", "auto"] <= min(got.values()) + 1e-9
    ref = cm.simulate(cm.build("1f1b-r", p, m), costs)
    if name == "zb" and ref.max_peak_memory <= limit * p + 1e-9:
        assert got["auto", "none"] <= ref.makespan + 1e-9


def test_recompute_reaches_below_one_microbatch_per_device_on_the_v_placement():
    """Below 1/p of 1F1B's memory no V order fits and the V patterns defer W passes (a recomputed
    stage holds its whole activation from its R to its W); with every W right after its B
    (w_after_b) a device holds one stage's whole activation at a time, so the lever search fits
    there (it raised 'no schedule fits' before), within the budget and valid."""
    from ctrlmem.schedules.auto_levers import w_after_b

    vm = cm.build("v-min", 4, 8)
    tight = w_after_b(vm)
    cm.validate(tight)
    assert tight.compute_only() != vm and sorted(map(sorted, tight.device_passes)) == sorted(map(sorted, vm.device_passes))
    for row in tight.device_passes:
        for i, ps in enumerate(row):
            if ps.op is Op.W:
                assert row[i - 1].op is Op.B and row[i - 1].stage == ps.stage and row[i - 1].microbatch == ps.microbatch
    assert w_after_b(tight) is tight
    limit = 0.75 / 4
    with pytest.raises(ValueError):
        cm.build("v-shape", 4, 8, memory_limit=limit)
    s = cm.build("v-shape", 4, 8, memory_limit=limit, recompute="auto")
    r = cm.simulate(cm.validate(s))
    assert s.recomputes and r.max_peak_memory <= limit * 4 + 1e-9


def test_the_lever_search_tries_its_looser_seeds_with_every_w_after_its_b():
    """A looser seed's deferred W keeps a recomputed stage whole: with its W after its B the seed
    fits better. ZB at p = 4, m = 8, F = B = W and 0.4 of 1F1B's memory: 34 (39 from the seeds as
    they are), no slower than every forward selectively recomputed (34.2)."""
    costs = cm.Costs(1, 1, 1, 0)
    s = cm.validate(cm.build("zb", 4, 8, costs=costs, memory_limit=0.4, recompute="auto"))
    r = cm.simulate(s, costs)
    assert r.max_peak_memory <= 0.4 * 4 + 1e-9
    assert r.makespan <= 34 + 1e-9
    fixed = cm.simulate(cm.build("zb", 4, 8, costs=costs, memory_limit=0.4, recompute="selective"), costs)
    assert r.makespan <= fixed.makespan + 1e-9


@pytest.mark.parametrize("name,p,m", [("zb-h1", 4, 8), ("v-half", 4, 8), ("v-zb", 4, 8), ("1f1b", 4, 6),
                                      ("zb-v", 3, 6)])
def test_what_waits_for_w_bounds_the_peak_under_any_levers(name, p, m):
    """held_for_w is a lower bound of every device's simulated peak, whatever levers are put on
    the order (levers act between a forward and its backward; from B to W the whole activation
    is there): the plain schedule, every forward recomputed, every forward with a backward more
    than a pass away offloaded whole, a mix, with copies slow or free. A bound above the cap makes
    fit_with_levers give up at once; it is reached by the plain schedule of 1F1B (no W)."""
    from ctrlmem.schedules.auto_levers import fit_with_levers, held_for_w

    base = cm.build(name, p, m)
    bound = held_for_w(base)
    for copy in (0.0, 0.5, 3.0):
        costs = cm.Costs(1, 1, 1, 0.1, offload=copy)
        half = [(s, k) for s in range(base.num_stages) for k in range(0, m, 2)]
        for levered in (base, with_recompute(base), with_recompute(base, "selective"), with_offload(base, 1.0, costs=costs),
                        with_recompute(with_offload(base, 1.0, which=half, costs=costs), "full")):
            peaks = cm.simulate(levered, costs).peak_memory
            assert all(b <= pk + 1e-9 for b, pk in zip(bound, peaks)), (levered.to_text(), bound, peaks)
    assert held_for_w(with_recompute(base)) == bound
    assert fit_with_levers(base, max(bound) - 0.01, cm.Costs(offload=0.5), "full", 1.0) is None
    if name == "1f1b":
        assert bound == [1.0] * p  # one BW at a time, nothing deferred


def test_forward_windows_are_the_timed_passes_f_end_and_b_start():
    """SimResult.forward_windows gives each forward's device, its F's end and its backward's start,
    as the timed passes say."""
    costs = cm.Costs(1, 2, 1, 0.3, offload=0.5)
    r = cm.simulate(cm.build("v-half", 4, 8, costs=costs, offload=0.5), costs)
    f_end = {(tp.stage, tp.microbatch): (tp.device, tp.end) for tp in r.passes if tp.op is Op.F}
    b_start = {(tp.stage, tp.microbatch): tp.start for tp in r.passes if tp.op in (Op.B, Op.BW)}
    windows = r.forward_windows()
    assert len(windows) == len(f_end) == 8 * 8
    for dev, stage, mb, end, start in windows:
        assert (dev, end) == f_end[(stage, mb)] and start == b_start[(stage, mb)]


def test_memory_model_kept_bytes_are_what_a_recomputed_forward_holds_until_its_r():
    """MemoryModel.kept (per stage, in the activation's units) replaces Costs.kept_fraction for the
    simulator: GPipe on one device, m forwards recomputed, stage activation 3 keeping 1 until
    its R: peak m·1 + (3 − 1) while the last R and its B run; kept above the activation is capped."""
    s = with_recompute(cm.build("gpipe", 1, 3))
    costs = cm.Costs(1, 1, 1)
    assert cm.simulate(s, costs, cm.MemoryModel(activation=3.0, kept=1.0)).peak_memory == [pytest.approx(3 * 1 + 2)]
    assert cm.simulate(s, costs, cm.MemoryModel(activation=3.0)).peak_memory == [pytest.approx(3 * 3 * KAPPA + 3 * (1 - KAPPA))]
    assert cm.simulate(s, costs, cm.MemoryModel(activation=3.0, kept=9.0)).peak_memory == [pytest.approx(9.0)]
    # per stage: ZB-H1's two stages keep different shares (an LM head's logits are never recomputed)
    zb = with_recompute(cm.build("zb-h1", 2, 4))
    both = cm.simulate(zb, costs, cm.MemoryModel(activation=[1.0, 1.0], kept=[0.25, 1.0])).peak_memory
    assert both[1] == pytest.approx(cm.simulate(cm.build("zb-h1", 2, 4), costs).peak_memory[1])
    assert both[0] < cm.simulate(cm.build("zb-h1", 2, 4), costs).peak_memory[0]
    assert cm.MemoryModel(kept=[0.5, 0.25]).stage_kept(2, 2) == [0.5, 0.25]


def test_a_given_recompute_time_is_the_r_pass_time_in_both_modes():
    """Costs.recompute, when given, times every R (per stage too), full or selective; without it
    selective takes selective[1] of the forward."""
    for mode in ("full", "selective"):
        s = with_recompute(cm.build("gpipe", 1, 3), mode)
        assert cm.simulate(s, cm.Costs(1, 1, 1, recompute=0.25)).makespan == pytest.approx(3 * 3 + 3 * 0.25)
    s = with_recompute(cm.build("gpipe", 1, 3), "selective")
    assert cm.simulate(s, cm.Costs(1, 1, 1, selective=(0.5, 0.1))).makespan == pytest.approx(3 * 3 + 3 * 0.1)
    assert cm.Costs(2, 1, 1, recompute=[0.5, 0.25]).recompute_times(2, 1, "selective") == [0.5, 0.25]
