#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. Usage:
#   bash scripts/test.sh           # everything, slow tests included (what CI runs)
#   bash scripts/test.sh --fast    # skip tests marked slow (real multi-process runs, browser)
#   bash scripts/test.sh -k sim    # extra arguments go to pytest
# The whole suite runs in 3 pytest-xdist worker processes on a CI machine's 2 cores: about 140 s
# of its 11 minutes wait on timeouts, sleeps, servers and launches, and a third worker fills them
# (measured here: 680 s with 2 workers, 616 s with 3, the same CPU). --fast, all CPU, runs in 2. Each test file stays on one worker (--dist loadfile),
# so a module-scoped fixture (the local Slurm, a shared multi-process launch) starts once and a
# file's tests never run beside each other; files are handed out in tests/conftest.py's order (the
# files with most slow tests first; --no-loadscope-reorder keeps xdist from putting the files with
# most tests first). CTRLMEM_TEST_WORKERS=0 runs everything in this process (needed for --pdb);
# another number sets the workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Bytecode: an image that sets PYTHONDONTWRITEBYTECODE (this one does) makes every test process,
# and every CLI, rank and kernel the tests start, compile ctrlmem and rewrite the tests' asserts
# again: 15 s of collection per worker instead of 6. The caches go to the __pycache__ folders git
# ignores (the suite's own check of the checkout ignores them too).
unset PYTHONDONTWRITEBYTECODE
marker="slow or not slow"
workers="${CTRLMEM_TEST_WORKERS:-3}"
if [ "${1:-}" = "--fast" ]; then
  marker="not slow"; shift
  workers="${CTRLMEM_TEST_WORKERS:-2}"
  export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ctrlmem-fast}"  # 20 examples per property, not 60
fi
exec .venv/bin/python -m pytest -m "$marker" -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
