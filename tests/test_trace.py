"""`ctrlmem export ... --trace FILE.json`: the simulated timeline as Chrome / Perfetto trace-event JSON."""

import json
from collections import Counter

import pytest

import ctrlmem as cm
from ctrlmem.cli import main
from ctrlmem.plots.trace import COMPUTE, SEND, trace_events

SCALE = 1000.0  # microseconds per simulated unit (the default)


def _load(tmp_path, capsys, *args):
    path = tmp_path / "t.json"
    assert main(["export", *args, "--trace", str(path)]) == 0
    assert "wrote" in capsys.readouterr().out
    return json.loads(path.read_text())


def test_v_half_trace_has_tracks_flows_and_counters(tmp_path, capsys):
    data = _load(tmp_path, capsys, "v-half", "-p", "4", "-m", "8", "--costs", "1,2,1,0.25")
    costs = cm.Costs(1, 2, 1, 0.25)
    r = cm.simulate(cm.build("v-half", 4, 8, costs=costs), costs)  # v-half adapts to the costs, as export does
    ev = data["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {(d, t): n for d in range(4) for t, n in ((COMPUTE, "compute"), (SEND, "send"))}
    assert sorted(e["args"]["name"] for e in ev if e["name"] == "process_name") == [f"device {d}" for d in range(4)]
    # one complete event per pass, on its device, at its simulated times
    got = Counter((e["pid"], e["args"]["op"], e["args"]["stage"], e["args"]["microbatch"], e["ts"], e["ts"] + e["dur"])
                  for e in ev if e["ph"] == "X" and e["tid"] == COMPUTE)
    assert got == Counter((tp.device, tp.op.value, tp.stage, tp.microbatch, tp.start * SCALE, tp.end * SCALE)
                          for tp in r.passes)
    # a send per cross-device dependency, comm long, and one flow arrow from it to its receiver
    transfers = r.transfers()
    sends = [e for e in ev if e["ph"] == "X" and e["tid"] == SEND]
    assert len(sends) == len(transfers) == 96 and all(e["dur"] == 0.25 * SCALE for e in sends)
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert set(starts) == set(ends) == set(range(len(transfers)))
    for i, tr in enumerate(transfers):
        s, f = starts[i], ends[i]
        assert (s["pid"], s["tid"], s["ts"]) == (tr.sender.device, SEND, tr.sender.end * SCALE)
        assert (f["pid"], f["tid"], f["ts"], f["bp"]) == (tr.receiver.device, COMPUTE, tr.receiver.start * SCALE, "e")
        assert tr.receiver.device != tr.sender.device and tr.receiver.start >= tr.sender.end + 0.25 - 1e-9
    # a memory counter per device whose highest value is the simulated peak
    for d in range(4):
        values = [e["args"]["a"] for e in ev if e["ph"] == "C" and e["pid"] == d]
        assert max(values) == r.peak_memory[d] and values[-1] == 0
    assert data["otherData"]["makespan"] == r.makespan


def test_overlapped_pairs_share_their_interval_in_the_trace():
    r = cm.simulate(cm.build("dualpipe-v", 2, 4), cm.Costs(2, 2, 1, fb_overlap=0.75))
    pairs = [e for e in trace_events(r)["traceEvents"] if e["ph"] == "X" and e["args"].get("overlapped")]
    assert len(pairs) == 2 * sum(map(len, r.schedule.overlaps))
    spans = Counter((e["pid"], e["ts"], e["dur"]) for e in pairs)
    assert set(spans.values()) == {2}  # two passes per overlapped interval


def test_trace_option_errors_are_one_line(tmp_path, capsys):
    assert main(["export", "1f1b", "-p", "2", "-m", "2", "--trace", str(tmp_path / "x.csv"), "--torch-csv",
                 str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert "its own file" in err and err.count("\n") == 1 and not (tmp_path / "x.csv").exists()


def _rank(rank, passes, start_clock, host="h"):
    """A worker's ``trace`` record: ``passes`` as ``(op, stage, microbatch, start_s, end_s)``."""
    return {"rank": rank, "pp_rank": rank, "dp_rank": 0, "trace": {
        "step": 0, "host": host, "start_clock": start_clock, "step_s": max(p[4] for p in passes),
        "passes": [{"op": o, "stage": s, "microbatch": mb, "start_s": a, "end_s": b} for o, s, mb, a, b in passes]}}


TWO_RANKS = [  # 1F1B, p = 2, m = 2, as two ranks timed it (seconds from their own barrier exit)
    [("F", 0, 0, 0.0, 1.0), ("F", 0, 1, 1.0, 2.0), ("BW", 0, 0, 4.0, 6.0), ("BW", 0, 1, 6.0, 8.0)],
    [("F", 1, 0, 1.0, 2.0), ("BW", 1, 0, 2.0, 4.0), ("F", 1, 1, 4.0, 5.0), ("BW", 1, 1, 5.0, 7.0)],
]


def test_measured_step_is_put_on_the_host_clock_and_drawn_like_the_simulated_one():
    """Rank 1 left the barrier 0.5 s after rank 0 on the same host: its intervals move 0.5 s later
    (one time line), the skew is reported; across hosts nothing moves. The trace has a process per
    rank, one compute slice per pass at its measured interval (µs), and a flow arrow per transfer of
    the schedule (1F1B p=2 m=2: 2 activations, 2 gradients) from the sender's slice to the receiver's."""
    from ctrlmem.plots.trace import measured_trace_events
    from ctrlmem.runtime.launch import measured_trace

    ranks = [_rank(0, TWO_RANKS[0], 10.0), _rank(1, TWO_RANKS[1], 10.5)]
    mt = measured_trace(ranks)
    assert mt["alignment"] == "host clock" and mt["start_skew_s"] == 0.5
    assert [p["start_s"] for p in mt["ranks"][1]["passes"]] == [1.5, 2.5, 4.5, 5.5]
    apart = measured_trace([_rank(0, TWO_RANKS[0], 10.0, "a"), _rank(1, TWO_RANKS[1], 99.0, "b")])
    assert apart["alignment"] == "barrier" and apart["start_skew_s"] is None
    assert [p["start_s"] for p in apart["ranks"][1]["passes"]] == [1.0, 2.0, 4.0, 5.0]
    assert measured_trace([_rank(0, TWO_RANKS[0], 1.0), {"rank": 1, "trace": None}]) is None

    data = measured_trace_events(cm.build("1f1b", 2, 2), mt)
    ev = data["traceEvents"]
    assert sorted(e["args"]["name"] for e in ev if e["name"] == "process_name") == ["rank 0 (device 0)",
                                                                                     "rank 1 (device 1)"]
    slices = sorted((e["pid"], e["name"], e["ts"], e["dur"]) for e in ev if e["ph"] == "X")
    want = sorted((r, f"{o}{mb} s{s}", a * 1e6, (b - a) * 1e6) for r, rows in enumerate(
        [TWO_RANKS[0], [(o, s, mb, a + 0.5, b + 0.5) for o, s, mb, a, b in TWO_RANKS[1]]]) for o, s, mb, a, b in rows)
    assert slices == want and all(e["tid"] == COMPUTE for e in ev if e["ph"] == "X")
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert set(starts) == set(ends) and len(starts) == 4
    assert sorted((starts[i]["pid"], ends[i]["pid"], ends[i]["ts"]) for i in starts) == [
        (0, 1, 1.5e6), (0, 1, 4.5e6), (1, 0, 4.0e6), (1, 0, 6.0e6)]
    assert data["otherData"]["step_s"] == 8.0 and data["otherData"]["start_skew_s"] == 0.5


def test_measured_trace_refuses_what_is_not_a_measured_step():
    from ctrlmem.plots.trace import measured_trace_events

    with pytest.raises(ValueError, match="--steps 1"):
        measured_trace_events(cm.build("1f1b", 2, 2), None)
    with pytest.raises(TypeError, match="Schedule"):
        measured_trace_events("1f1b", {"ranks": [{}]})


def test_run_writes_both_traces_beside_its_result_and_unit_costs_without_timed_steps(tmp_path):
    """A successful run's result gives trace-measured.json (its measured step) and
    trace-simulated.json (the same schedule at the measured wall pass times, in µs); a run without
    timed steps gives only the simulated one, at unit costs; a failed run gives none."""
    from types import SimpleNamespace

    from ctrlmem.cli.run import _write_traces
    from ctrlmem.runtime.launch import measured_trace

    schedule = cm.build("1f1b", 2, 2)
    wall = {"f": [1.0, 1.0], "b": [2.0, 2.0], "w": [0.0, 0.0], "comm": 0.0}
    result = {"status": "ok", "schedule_text": schedule.to_text(), "measured_wall_costs": wall,
              "measured_trace": measured_trace([_rank(0, TWO_RANKS[0], 0.0), _rank(1, TWO_RANKS[1], 0.0)])}
    config = SimpleNamespace(out=str(tmp_path / "timed"))
    (tmp_path / "timed").mkdir()
    assert _write_traces(config, result) == [str(tmp_path / "timed" / n) for n in ("trace-measured.json",
                                                                                   "trace-simulated.json")]
    measured = json.loads((tmp_path / "timed" / "trace-measured.json").read_text())
    simulated = json.loads((tmp_path / "timed" / "trace-simulated.json").read_text())
    assert measured["otherData"]["measured"] and measured["otherData"]["step_s"] == 8.0
    assert simulated["otherData"]["makespan"] == cm.simulate(schedule, cm.Costs(**wall)).makespan == 9.0
    assert simulated["otherData"]["us_per_unit"] == 1e6
    (tmp_path / "untimed").mkdir()
    untimed = dict(result, measured_trace=None, measured_wall_costs=None)
    assert _write_traces(SimpleNamespace(out=str(tmp_path / "untimed")), untimed) == [
        str(tmp_path / "untimed" / "trace-simulated.json")]
    unit = json.loads((tmp_path / "untimed" / "trace-simulated.json").read_text())["otherData"]
    assert unit["makespan"] == cm.simulate(schedule).makespan and unit["us_per_unit"] == 1000.0
    assert _write_traces(config, {"status": "failed", "failure": "x"}) == []


def _run_of(result, factor: float = 1.2, replicas: int = 1) -> dict:
    """A measured step as `ctrlmem run` records it (its measured_trace), from a simulation whose
    times are milliseconds, each pass stretched by ``factor`` (replica k 1 ms later)."""
    p = result.schedule.num_devices
    ranks = []
    for k in range(replicas):
        for d in range(p):
            rows = [tp for tp in result.passes if tp.device == d]
            ranks.append({"rank": k * p + d, "pp_rank": d, "dp_rank": k, "step_end_s": result.makespan * factor / 1e3,
                          "passes": [{"op": tp.op.value, "stage": tp.stage, "microbatch": tp.microbatch,
                                      "start_s": (tp.start * factor + k) / 1e3, "end_s": (tp.end * factor + k) / 1e3}
                                     for tp in rows]})
    return {"ranks": ranks, "step": 1, "alignment": "barrier", "start_skew_s": None}


def test_a_measured_trace_reads_back_the_passes_of_its_first_replica_in_ms():
    """read_measured_trace gives back what ctrlmem run's trace-measured.json holds: every pass of
    the first data-parallel replica, its device the pipeline rank, its times in ms from the
    step's start; the step's time; and refuses a simulated trace, naming the measured one."""
    from ctrlmem.plots.trace import measured_trace_events, read_measured_trace, trace_events

    r = cm.simulate(cm.build("v-half", 4, 8), cm.Costs(2, 3, 1, 0.2))
    data = measured_trace_events(r.schedule, _run_of(r, replicas=2))
    run = read_measured_trace(json.dumps(data), name="trace-measured.json")
    assert (run.name, run.num_devices, run.num_microbatches, run.source) == ("v-half", 4, 8, "trace-measured.json")
    want = sorted((tp.device, tp.op, tp.stage, tp.microbatch, tp.start * 1.2, tp.end * 1.2) for tp in r.passes)
    got = sorted(tuple(tp) for tp in run.passes)
    assert len(got) == len(want) and all(g[:4] == w[:4] and g[4:] == pytest.approx(w[4:]) for g, w in zip(got, want))
    assert run.step_ms == pytest.approx(r.makespan * 1.2)
    assert type(run).from_dict(json.loads(json.dumps(run.to_dict()))) == run
    with pytest.raises(ValueError, match="not a measured trace.*trace-measured.json"):
        read_measured_trace(json.dumps(trace_events(r)))
