"""Shared test helpers."""

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

from ctrlmem.experiments.papermill_cli import without_iri_grammars

# The test processes import papermill (and so jsonschema) as the sweep's processes do, without
# jsonschema's optional IRI checker: its import compiles Lark grammars, 1.5 s of every worker's
# collection, for a check no test makes.
without_iri_grammars()

settings.register_profile(
    "ctrlmem", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
# scripts/test.sh --fast: a third of the examples (the full tier, what CI runs, draws all 60)
settings.register_profile("ctrlmem-fast", parent=settings.get_profile("ctrlmem"), max_examples=20)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ctrlmem"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def python_exe():
    return sys.executable


def pytest_collection_modifyitems(config, items):
    """Test files with more slow tests run first, each file's tests in their own order (files of
    equal count keep theirs). With scripts/test.sh's workers (xdist --dist loadfile
    --no-loadscope-reorder: whole files handed out in this order) the long files start early and
    the many short fast-only files even out the end, instead of a long file (the browser's, the
    Slurm one) starting last while the other worker idles."""
    slow: dict[str, int] = {}
    for item in items:
        slow[str(item.path)] = slow.get(str(item.path), 0) + (item.get_closest_marker("slow") is not None)
    rank = {path: i for i, path in enumerate(dict.fromkeys(str(item.path) for item in items))}
    items.sort(key=lambda item: (-slow[str(item.path)], rank[str(item.path)]))


# ---------------------------------------------------------------- where the suite's CPU time goes

_CPU_LOG = os.environ.get("CTRLMEM_TEST_CPU_LOG")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``CTRLMEM_TEST_CPU_LOG=FILE``: one line per test appended to ``FILE`` (every worker
    appends): the CPU seconds of the test's process, of the processes it started and waited for,
    the wall seconds (set-up and tear-down included), and the test's id, tab-separated. On 2 cores
    the suite's wall time follows its CPU time, so this is where to look when it grows
    (``sort -rn FILE | head``)."""
    if not _CPU_LOG:
        yield
        return
    import resource
    import time

    def cpu(who):
        r = resource.getrusage(who)
        return r.ru_utime + r.ru_stime

    own, kids, t0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    yield
    line = (f"{cpu(resource.RUSAGE_SELF) - own:.2f}\t{cpu(resource.RUSAGE_CHILDREN) - kids:.2f}\t"
            f"{time.perf_counter() - t0:.2f}\t{item.nodeid}\n")
    with open(_CPU_LOG, "a", encoding="utf-8") as fh:
        fh.write(line)


# ---------------------------------------------------------------- the suite leaves the checkout untouched

# Created by running the tests themselves (bytecode, pytest's and hypothesis's caches) or by the
# set-up: expected, and not what the product writes.
_EXPECTED = (".venv", ".git", "__pycache__", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints", "ctrlmem.egg-info")


def checkout_state(root: str = ROOT) -> set[str] | None:
    """What the tests could have written: ``git status --porcelain --ignored`` lines for
    untracked and ignored paths, plus every untracked file (path, size, mtime) outside the
    expected folders, so a write inside an already-ignored folder counts too. (Tracked files are
    left to ``git diff``: editing the sources while the tests run is no fault of the tests.)
    ``None`` outside a git checkout."""
    import subprocess

    try:
        proc = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=root, capture_output=True,
                              text=True, timeout=60)
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or tracked.returncode != 0:
        return None
    known = set(tracked.stdout.split("\0"))
    state = {ln for ln in proc.stdout.splitlines()
             if ln[:2] in ("??", "!!") and not any(part in ln for part in _EXPECTED)}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _EXPECTED]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel in known or name.endswith(".pyc"):
                continue
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            state.add(f"file {rel} {st.st_size} {st.st_mtime_ns}")
    return state


@pytest.fixture(scope="session", autouse=True)
def checkout_untouched():
    """The whole test session writes nothing into the checkout (compared before and after)."""
    before = checkout_state()
    yield
    after = checkout_state()
    if before is None or after is None:
        return
    changed = sorted(after ^ before)
    assert not changed, f"the tests changed the checkout: {changed[:10]}"
