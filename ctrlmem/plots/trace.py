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
import math
import re
from dataclasses import dataclass
from os import PathLike
from typing import Any, Mapping

from ctrlmem.model.ir import MAX_PASSES, Op, Schedule
from ctrlmem.model.simulate import SimResult, TimedPass, simulate
from ctrlmem.util.fileio import atomic_write
from ctrlmem.util.userfile import parse_json, read_text

__all__ = ["trace_events", "write_trace", "measured_trace_events", "write_measured_trace", "MeasuredRun",
           "read_measured_trace", "MAX_TRACE_BYTES"]

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


MAX_TRACE_BYTES = 256 << 20
"""Largest measured trace read (a p = 32, m = 256 step is about 10 MB)."""

_RANK_NAME = re.compile(r"rank (\d+) \(device (\d+)(?:, replica (\d+))?\)")


@dataclass(frozen=True)
class MeasuredRun:
    """One measured step of a real run (``ctrlmem run``'s ``trace-measured.json``), to draw next
    to its simulation: the schedule's name, ``p``, ``m``, the step's wall time and every pass of
    the first data-parallel replica with its measured start and end, in milliseconds from the
    step's start (``device`` is the pipeline rank); ``source`` names the file."""

    name: str
    num_devices: int
    num_microbatches: int
    step_ms: float
    passes: tuple[TimedPass, ...]
    source: str = ""

    def to_dict(self) -> dict:
        """JSON-ready: the passes as rows ``[device, op, stage, microbatch, start, end]``."""
        return {"name": self.name, "num_devices": self.num_devices, "num_microbatches": self.num_microbatches,
                "step_ms": self.step_ms, "source": self.source,
                "passes": [[tp.device, tp.op.value, tp.stage, tp.microbatch, tp.start, tp.end] for tp in self.passes]}

    @classmethod
    def from_dict(cls, data: Mapping) -> "MeasuredRun":
        """The inverse of :meth:`to_dict` (``ValueError`` naming what is wrong)."""
        try:
            rows = data["passes"]
            if not isinstance(rows, list) or len(rows) > MAX_PASSES:
                raise ValueError("its passes must be a list of at most MAX_PASSES rows")
            passes = tuple(TimedPass(int(d), Op(op), int(st), int(mb), float(a), float(b)) for d, op, st, mb, a, b in rows)
            return cls(str(data["name"])[:80], int(data["num_devices"]), int(data["num_microbatches"]),
                       float(data["step_ms"]), passes, str(data.get("source", ""))[:200])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a measured run's record is malformed ({exc}); load the run's trace-measured.json "
                             "again") from None


def read_measured_trace(source: "str | PathLike | bytes | Mapping[str, Any]", name: str = "") -> MeasuredRun:
    """A measured step from ``ctrlmem run``'s ``trace-measured.json`` (:func:`measured_trace_events`:
    a path, its text or bytes, or its data); ``name``: what to call its source (default the
    path). Raises ``ValueError`` naming what is wrong (not a measured trace, no passes, a pass
    without its op, stage and microbatch)."""
    where = name or (str(source) if isinstance(source, (str, PathLike)) and not str(source).lstrip().startswith("{")
                     else "the trace")
    if isinstance(source, Mapping):
        data = source
    else:
        if isinstance(source, (bytes, bytearray)):
            text = bytes(source).decode("utf-8", errors="strict")
        elif isinstance(source, str) and source.lstrip().startswith("{"):
            text = source
        else:
            text = read_text(source, "measured trace", MAX_TRACE_BYTES,
                             fix="give the trace-measured.json that ctrlmem run wrote")
        data = parse_json(text, "the measured trace")
    other = data.get("otherData") if isinstance(data, Mapping) else None
    if not isinstance(other, Mapping) or not other.get("measured") or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{where}: not a measured trace (ctrlmem run writes one as trace-measured.json beside "
                         "result.json; trace-simulated.json and --trace files are simulations)")
    events = data["traceEvents"]
    if len(events) > 4 * MAX_PASSES:
        raise ValueError(f"{where}: {len(events):,} events, more than any schedule ctrlmem runs")
    device_of: dict[int, int] = {}
    for ev in events:
        if isinstance(ev, Mapping) and ev.get("ph") == "M" and ev.get("name") == "process_name":
            found = _RANK_NAME.match(str((ev.get("args") or {}).get("name", "")))
            if found is not None and int(found.group(3) or 0) == 0:
                device_of[int(ev.get("pid", -1))] = int(found.group(2))
    passes = []
    for ev in events:
        if not isinstance(ev, Mapping) or ev.get("ph") != "X" or ev.get("tid") != COMPUTE:
            continue
        if ev.get("pid") not in device_of:
            continue  # another replica's rank
        args = ev.get("args") or {}
        try:
            start, dur = float(ev["ts"]) / 1e3, float(ev["dur"]) / 1e3
            tp = TimedPass(device_of[ev["pid"]], Op(args["op"]), int(args["stage"]), int(args["microbatch"]),
                           start, start + dur)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: a pass without its op, stage, microbatch, ts and dur ({str(ev)[:120]}); "
                             "give the file ctrlmem run wrote") from None
        if not (math.isfinite(tp.start) and math.isfinite(tp.end)):
            raise ValueError(f"{where}: a pass with a time that is not a number ({str(ev)[:120]})")
        passes.append(tp)
    if not passes:
        raise ValueError(f"{where}: no measured pass in it (a run with --steps 1 or more writes them)")
    passes.sort(key=lambda tp: (tp.device, tp.start))
    try:
        p, m = int(other["p"]), int(other["m"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{where}: its otherData has no p and m; give the file ctrlmem run wrote") from None
    step = other.get("step_s")
    step_ms = float(step) * 1e3 if isinstance(step, (int, float)) else max(tp.end for tp in passes)
    return MeasuredRun(str(other.get("schedule", "run"))[:80], p, m, step_ms, tuple(passes), where[:200])
