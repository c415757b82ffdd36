#!/usr/bin/env bash
# Set up (idempotent) and regenerate the paper's tables next to its numbers under figures/,
# with figures/REPRODUCTION.md summarising artifact -> what was done -> agreement. Usage:
#   bash scripts/reproduce.sh                 # full grids
#   bash scripts/reproduce.sh --quick         # CI-sized grids (minutes)
#   bash scripts/reproduce.sh --only table-a  # one artifact (repeatable); --out DIR to write elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/ctrlmem reproduce "$@"
