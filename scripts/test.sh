#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. Usage:
#   bash scripts/test.sh           # everything, slow tests included (what CI runs)
#   bash scripts/test.sh --fast    # skip tests marked slow (real multi-process runs, browser)
#   bash scripts/test.sh -k sim    # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
marker="slow or not slow"
if [ "${1:-}" = "--fast" ]; then marker="not slow"; shift; fi
exec .venv/bin/python -m pytest -m "$marker" "$@"
