"""A simulated timeline as Chrome trace-event JSON, for Perfetto (ui.perfetto.dev) and
chrome://tracing (the format: "Trace Event Format", Google, the JSON Object Format).

One process per device (``device d``) with two threads: ``compute`` (one complete event per pass;
an overlapped pair is two events over the same interval, marked ``overlapped``) and ``send`` (each
cross-device transfer, from the sender's end for ``comm`` time units); a flow arrow from each send
to the pass that receives it; a counter track per device, its activation memory in units of ``a``
(:meth:`ctrlmem.SimResult.memory_curve`). Time: one simulated unit is ``us_per_unit``
microseconds (default 1000, so the viewer's milliseconds read as the simulator's units).
"""

from __future__ import annotations

import json
from os import PathLike

from ctrlmem.model.ir import Schedule
from ctrlmem.model.simulate import SimResult, TimedPass, simulate
from ctrlmem.util.fileio import atomic_write

__all__ = ["trace_events", "write_trace", "measured_trace_events", "write_measured_trace"]

COMPUTE, SEND = 0, 1
"""Thread ids of a device's two lanes."""


def _name(tp: TimedPass) -> str:
    return f"{tp.op.value}{tp.microbatch} s{tp.stage}"


def _metadata(num_devices: int, names: list[str] | None = None) -> list[dict]:
    out = []
    for d in range(num_devices):
        name = names[d] if names is not None else f"device {d}"
        out.append({"ph": "M", "name": "process_name", "pid": d, "tid": 0, "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": d, "tid": 0, "args": {"sort_index": d}})
        for tid, lane in ((COMPUTE, "compute"), (SEND, "send")):
            out.append({"ph": "M", "name": "thread_name", "pid": d, "tid": tid, "args": {"name": lane}})
    return out


def _passes(result: SimResult, scale: float) -> list[dict]:
    sched = result.schedule
    out = []
    for d in range(sched.num_devices):
        starts = sched.overlap_starts(d)
        paired = starts | {i + 1 for i in starts}
        for pos, ps in enumerate(sched.device_passes[d]):
            start, end = result.timing(d, pos)
            out.append({"ph": "X", "name": _name(TimedPass(d, ps.op, ps.stage, ps.microbatch, start, end)),
                        "cat": ps.op.value, "pid": d, "tid": COMPUTE, "ts": start * scale,
                        "dur": (end - start) * scale,
                        "args": {"op": ps.op.value, "stage": ps.stage, "microbatch": ps.microbatch,
                                 "position": pos, "overlapped": pos in paired}})
    return out


def _transfers(result: SimResult, scale: float) -> list[dict]:
    comm = float(result.costs.comm)
    out = []
    for i, tr in enumerate(result.transfers()):
        a, b = tr.sender, tr.receiver
        what = "activation" if b.op.value == "F" else "gradient"
        sent = a.end * scale
        out.append({"ph": "X", "name": f"send {what} {_name(a)} -> d{b.device}", "cat": "comm", "pid": a.device,
                    "tid": SEND, "ts": sent, "dur": comm * scale,
                    "args": {"to_device": b.device, "arrives": (a.end + comm) * scale}})
        out.append({"ph": "s", "name": what, "cat": "comm", "id": i, "pid": a.device, "tid": SEND, "ts": sent})
        out.append({"ph": "f", "bp": "e", "name": what, "cat": "comm", "id": i, "pid": b.device, "tid": COMPUTE,
                    "ts": b.start * scale})
    return out


def _counters(result: SimResult, scale: float) -> list[dict]:
    out = []
    for d in range(result.schedule.num_devices):
        times, values = result.memory_curve(d)
        out += [{"ph": "C", "name": "activation memory (a)", "pid": d, "tid": 0, "ts": t * scale,
                 "args": {"a": v}} for t, v in zip(times, values)]
    return out


def trace_events(result: SimResult, us_per_unit: float = 1000.0) -> dict:
    """The trace of ``result`` as a JSON-ready dict (``{"traceEvents": [...], ...}``)."""
    if not isinstance(result, SimResult):
        raise TypeError(f"trace_events takes a ctrlmem SimResult (from cm.simulate), got {type(result).__name__}")
    if not us_per_unit > 0:
        raise ValueError(f"us_per_unit must be > 0, got {us_per_unit!r}")
    sched = result.schedule
    events = (_metadata(sched.num_devices) + _passes(result, us_per_unit) + _transfers(result, us_per_unit)
              + _counters(result, us_per_unit))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": sched.name, "p": sched.num_devices, "m": sched.num_microbatches,
                          "costs": json.dumps(result.costs.to_dict()), "us_per_unit": us_per_unit,
                          "makespan": result.makespan, "bubble_rate": result.bubble_rate}}


def write_trace(result: SimResult, path: str | PathLike, us_per_unit: float = 1000.0) -> None:
    """Write :func:`trace_events` to ``path`` (atomically: a failed write keeps the old file)."""

    atomic_write(path, json.dumps(trace_events(result, us_per_unit)))


def _rank_passes(rank: dict, overlapped: frozenset[int]) -> list[dict]:
    out = []
    for pos, ps in enumerate(rank["passes"]):
        start, end = ps["start_s"] * 1e6, ps["end_s"] * 1e6
        out.append({"ph": "X", "name": f"{ps['op']}{ps['microbatch']} s{ps['stage']}", "cat": ps["op"],
                    "pid": rank["rank"], "tid": COMPUTE, "ts": start, "dur": end - start,
                    "args": {"op": ps["op"], "stage": ps["stage"], "microbatch": ps["microbatch"],
                             "position": pos, "overlapped": pos in overlapped}})
    return out


def _measured_flows(schedule: Schedule, ranks: list[dict]) -> list[dict]:
    """A flow arrow per cross-device transfer of the schedule, inside each data-parallel replica:
    from the sending pass's measured slice to the receiving one's."""
    p = schedule.num_devices
    where = {(r["dp_rank"], ps["op"], ps["stage"], ps["microbatch"]): (r["rank"], ps)
             for r in ranks for ps in r["passes"]}
    out: list[dict] = []
    for tr in simulate(schedule).transfers():
        a, b = tr.sender, tr.receiver
        what = "activation" if b.op.value == "F" else "gradient"
        for replica in range(len(ranks) // p):
            src = where.get((replica, a.op.value, a.stage, a.microbatch))
            dst = where.get((replica, b.op.value, b.stage, b.microbatch))
            if src is None or dst is None:
                continue
            i = len(out) // 2
            out.append({"ph": "s", "name": what, "cat": "comm", "id": i, "pid": src[0], "tid": COMPUTE,
                        "ts": src[1]["start_s"] * 1e6})
            out.append({"ph": "f", "bp": "e", "name": what, "cat": "comm", "id": i, "pid": dst[0], "tid": COMPUTE,
                        "ts": dst[1]["start_s"] * 1e6})
    return out


def measured_trace_events(schedule: Schedule, measured: dict) -> dict:
    """A measured step (``result.json``'s ``measured_trace`` from ``ctrlmem run``) as trace-event
    JSON like :func:`trace_events`: one process per rank with its compute lane (one complete
    event per pass, its measured wall interval from the step's start) and a flow arrow per
    cross-device transfer; no send lane and no memory counter (neither is timed per pass)."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"measured_trace_events takes a ctrlmem Schedule, got {type(schedule).__name__}")
    if not isinstance(measured, dict) or not isinstance(measured.get("ranks"), list) or not measured["ranks"]:
        raise ValueError("measured_trace_events needs a result's measured_trace (ctrlmem run with --steps 1 or more)")
    ranks = sorted(measured["ranks"], key=lambda r: r["rank"])
    dp = len(ranks) > schedule.num_devices
    names = [f"rank {r['rank']} (device {r['pp_rank']}" + (f", replica {r['dp_rank']})" if dp else ")") for r in ranks]
    events = _metadata(len(ranks), names)
    for r in ranks:
        starts = schedule.overlap_starts(r["pp_rank"])
        events += _rank_passes(r, starts | {i + 1 for i in starts})
    events += _measured_flows(schedule, ranks)
    step = max(r["step_end_s"] for r in ranks)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": schedule.name, "p": schedule.num_devices, "m": schedule.num_microbatches,
                          "measured": True, "step": measured.get("step"), "step_s": step,
                          "alignment": measured.get("alignment"),
                          "start_skew_s": measured.get("start_skew_s")}}


def write_measured_trace(schedule: Schedule, measured: dict, path: str | PathLike) -> None:
    """Write :func:`measured_trace_events` to ``path`` (atomically)."""

    atomic_write(path, json.dumps(measured_trace_events(schedule, measured)))
