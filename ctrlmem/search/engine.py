"""The search driver: families produce candidate sets, the engine times them and keeps the best.

A search is asked for the schedule with the shortest longest device span (ties: the shorter
makespan, then the lower peak, then the earlier candidate) among what some *families* produce,
within a memory cap, under given costs; or, with ``objective="makespan"``, the shortest makespan
(ties: the shorter longest span, then the lower peak, then the earlier candidate). A :class:`Family` is a producer of
:class:`~ctrlmem.search.encoding.CandidateSet` s for a :class:`Query`; it keeps whatever does not
depend on the costs in its own caches (per ``p`` and ``m``), so budgets and cost edits reuse it.
The engine times each set once per costs (:mod:`ctrlmem.search.timing`; cached), checks the
winner on the arrays (every pass once, on its stage's device; a finite span rules out deadlock)
and makes a ``Schedule`` only for it.

**Bounds.** A family may skip work that cannot win: :attr:`Query.bound` gives a lower bound on
the longest span of any schedule with a given peak (:mod:`ctrlmem.search.bounds`), and
:attr:`Incumbent.best` the best value of the objective found so far; a producer whose candidates
all peak at ``c`` or more skips them when ``bound(c) > best`` (a makespan is never shorter than
the longest span, so the span bound serves both objectives; strictly: a candidate of equal value
could still win the tie, so results never depend on what was skipped).

**Monotone by construction.** Each family's candidates for a cap contain those for every smaller
cap (the families document how), so a larger budget never gives a slower schedule.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Placement, Schedule
from ctrlmem.search.encoding import CandidateSet, problem, tables
from ctrlmem.search.timing import Timed, durations, time_set
from ctrlmem.search import bounds

__all__ = ["Query", "OBJECTIVES", "Incumbent", "Family", "Found", "search", "timed", "clear_caches", "LRU"]

log = logging.getLogger(__name__)

_EPS = 1e-9


class LRU(OrderedDict):
    """A small least-recently-used cache (``get``/``put``), bounded by ``size`` entries; safe to
    share between threads (two searches at once compute an entry twice at worst)."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size
        self._lock = threading.Lock()
        _CACHES.append(self)

    def get(self, key, default=None):  # type: ignore[override]
        with self._lock:
            if key in self:
                self.move_to_end(key)
                return self[key]
            return default

    def put(self, key, value):
        with self._lock:
            self[key] = value
            self.move_to_end(key)
            while len(self) > self.size:
                self.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            super().clear()


_CACHES: list[LRU] = []


def clear_caches() -> None:
    """Forget every cached candidate, timing and table (for cold-start measurements)."""

    for c in _CACHES:
        c.clear()
    for fn in _CLEARERS:
        fn()
    for fn in (tables, durations, bounds._terms):
        fn.cache_clear()


_CLEARERS: list[Callable[[], None]] = []


def on_clear(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` to run in :func:`clear_caches` (for ``lru_cache`` d helpers)."""
    _CLEARERS.append(fn)
    return fn


@dataclass(frozen=True)
class Query:
    """What a search asks of the families.

    Attributes:
        placement: the placement every candidate uses (V-shape or sequential).
        m: microbatches.
        costs: the pass costs the candidates are timed under.
        cap: the memory budget, in ``a`` (the highest peak a candidate may have).
        fused: fused backward (``BW``) instead of ``B`` + ``W``.
        bound: ``bound(peak)`` — a lower bound on the longest span of any schedule of this
            placement, costs and ``m`` whose peak is at most ``peak`` (``a``).
        objective: what the search minimises first: ``"span"`` (the longest device span, the
            paper's bubble-rate basis; ties: makespan) or ``"makespan"`` (the end of the last
            pass, all devices starting together: the iteration time when a global step
            synchronises the devices; ties: span).
    """

    placement: Placement
    m: int
    costs: Costs
    cap: float
    fused: bool = False
    bound: Callable[[float], float] = field(default=lambda peak: 0.0, compare=False, hash=False)
    objective: str = "span"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r} is not one of {', '.join(map(repr, OBJECTIVES))}")

    @property
    def p(self) -> int:
        return self.placement.num_devices

    @property
    def by_makespan(self) -> bool:
        return self.objective == "makespan"

    def key(self, span: float, makespan: float, peak: float) -> tuple[float, float, float]:
        """The ranking key of a candidate under :attr:`objective` (smaller is better)."""
        return (makespan, span, peak) if self.by_makespan else (span, makespan, peak)


#: what a search may minimise first (:attr:`Query.objective`)
OBJECTIVES = ("span", "makespan")


@dataclass
class Incumbent:
    """The best value of the query's objective (longest span or makespan) found so far in a
    running search (``inf`` before the first)."""

    best: float = float("inf")

    def hopeless(self, q: Query, peak: float) -> bool:
        """Whether no candidate peaking at ``peak`` or more can beat what was found (the bound
        is on the longest span, which no makespan is shorter than)."""
        return q.bound(peak) > self.best + _EPS


class Family:
    """A producer of candidates (subclass it; one small module per family).

    ``name`` labels it; :meth:`sets` yields the candidate sets for a query — for ``q.cap``, a
    superset of what it yields for any smaller cap — and may consult ``progress`` to skip work
    (see the module docstring)."""

    name = "family"
    #: whether the candidates depend on the query's objective (families that climb from the best)
    by_objective = False

    def sets(self, q: Query, progress: Incumbent) -> Iterator[CandidateSet]:  # pragma: no cover - interface
        raise NotImplementedError


_TIMED = LRU(512)


def timed(cs: CandidateSet, costs: Costs) -> Timed:
    """``cs`` timed under ``costs`` (cached per set and costs)."""
    key = (cs.uid, costs)
    got = _TIMED.get(key)
    if got is None:
        got = _TIMED.put(key, time_set(cs, costs))
    return got


@dataclass(frozen=True)
class Found:
    """The winner of a search: candidate ``index`` of ``cs``, with its span, makespan and peak."""

    cs: CandidateSet
    index: int
    span: float
    makespan: float
    peak: float

    @property
    def label(self) -> str:
        return self.cs.labels[self.index]

    def schedule(self, name: str, params: dict | None = None) -> Schedule:
        """The winner as a :class:`~ctrlmem.model.ir.Schedule` named ``name``."""
        return self.cs.schedule(self.index, name, params)


def _checked(found: Found) -> Found | None:
    """The winner checked as a complete schedule (every pass once, on its device; its finite
    span already rules out deadlock), on the arrays; ``None`` (logged) if it is not."""
    why = problem(found.cs, found.index)
    if why is not None:  # a family produced an invalid candidate: a bug, not the user's fault
        log.error("search: candidate %r of a family is not a valid schedule (%s); it is skipped", found.label, why)
        return None
    return found


def search(q: Query, producers: Sequence[Family], first: Iterable[CandidateSet] = ()) -> Found | None:
    """The best candidate within ``q.cap`` of ``first`` (tried first: it wins ties) and of every
    family's sets; ``None`` when nothing fits. Only the winner is made a ``Schedule`` and
    checked (should a family ever produce an invalid candidate, it is logged and skipped)."""
    progress = Incumbent()
    pool: list[tuple[Timed, np.ndarray]] = []  # per set: the candidates within the cap

    def consider(cs: CandidateSet) -> None:
        if not len(cs):
            return
        tm = timed(cs, q.costs)
        ok = (cs.peak <= q.cap + _EPS) & np.isfinite(tm.span)
        if ok.any():
            pool.append((tm, ok))
            primary = tm.makespan if q.by_makespan else tm.span
            progress.best = min(progress.best, float(primary[ok].min()))

    for cs in first:
        consider(cs)
    for fam in producers:
        for cs in fam.sets(q, progress):
            consider(cs)
    while True:
        best: Found | None = None
        for tm, ok in pool:
            idx = np.nonzero(ok)[0]
            if not len(idx):
                continue
            first_, second = (tm.makespan, tm.span) if q.by_makespan else (tm.span, tm.makespan)
            order = np.lexsort((idx, tm.cs.peak[idx], second[idx], first_[idx]))
            i = int(idx[order[0]])
            cand = Found(tm.cs, i, float(tm.span[i]), float(tm.makespan[i]), float(tm.cs.peak[i]))
            if best is None or q.key(cand.span, cand.makespan, cand.peak) < q.key(best.span, best.makespan, best.peak):
                best = cand
        if best is None:
            return None
        good = _checked(best)
        if good is not None:
            return good
        for tm, ok in pool:  # drop the invalid candidate and look again
            if tm.cs is best.cs:
                ok[best.index] = False
