"""`ctrlmem export ... --trace FILE.json`: the simulated timeline as Chrome / Perfetto trace-event JSON."""

import json
from collections import Counter

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
