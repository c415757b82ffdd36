"""The diagram's copy lanes: one strip per offload and reload, on its device's row at its
simulated times; a schedule without copies draws exactly what it drew before (no copy trace)."""

from __future__ import annotations

import pytest

import ctrlmem as cm
from ctrlmem.plots.figures import host_memory_curve, memory_spec, schedule_spec


def test_every_copy_is_one_strip_on_its_device_at_its_times():
    costs = cm.Costs(1, 1, 1, offload=0.5)
    sched = cm.build("v-min", 4, 8, costs=costs, offload=1.0)
    copies = cm.simulate(sched, costs).copies
    traces = [t for t in schedule_spec(sched, costs=costs)["data"] if t["meta"]["kind"] == "copy"]
    assert {t["meta"]["op"] for t in traces} == {"O", "L"}
    drawn = sorted((round(float(y)), int(cd[0]), int(cd[1]), t["meta"]["op"], float(b), float(b + x))
                   for t in traces for y, cd, b, x in zip(t["y"], t["customdata"], t["base"], t["x"]))
    want = sorted((c.device, c.stage, c.microbatch, c.op, c.start, c.end) for c in copies)
    assert len(drawn) == len(want) > 0
    for got, ref in zip(drawn, want):
        assert got[:4] == ref[:4] and got[4:] == pytest.approx(ref[4:])
    # the strips stay inside their device's row
    half = (1 - 0.15) / 2
    for t in traces:
        for y in t["y"]:
            assert abs(y - round(y)) + t["width"] / 2 <= half + 1e-9


def test_no_copies_no_copy_lane():
    spec = schedule_spec(cm.build("v-min", 4, 8), costs=cm.Costs(1, 1, 1))
    assert not any(t["meta"]["kind"] == "copy" for t in spec["data"])


def test_the_memory_panel_shows_what_is_on_the_host():
    costs = cm.Costs(1, 1, 1, offload=0.5)
    r = cm.simulate(cm.build("v-min", 4, 8, costs=costs, offload=1.0), costs)
    t, v = host_memory_curve(r)
    assert t == sorted(t) and min(v) >= 0 and v[-1] == pytest.approx(0.0)  # every share comes back
    assert max(v) > 0
    host = [d for d in memory_spec(r)["data"] if d["meta"]["kind"] == "host"]
    assert len(host) == 1 and list(host[0]["y"]) == v
    plain = cm.simulate(cm.build("v-min", 4, 8), costs)
    assert host_memory_curve(plain) is None
    assert not any(d["meta"]["kind"] == "host" for d in memory_spec(plain)["data"])
