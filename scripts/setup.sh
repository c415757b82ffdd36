#!/usr/bin/env bash
# Idempotent set-up: a venv in .venv with the pinned requirements and ctrlmem itself, plus
# Debian's chromium (for plotly/kaleido static export and browser tests) and slurm-wlm + munge (local
# Slurm) when missing and root.
# Usage: bash scripts/setup.sh        (safe to run again; it only installs what is missing)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.ctrlmem-requirements
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements.txt
  .venv/bin/python -m pip install --quiet --no-deps -e .
  # compile the search engine's loops now (numba keeps them in __pycache__), not in a user's first search
  .venv/bin/python -c "from ctrlmem.schedules.warmup import compile_all; print(f'compiled the search kernels in {compile_all():.0f} s')" >&2
  echo "$want" > "$stamp"
fi
# Running a notebook in JupyterLab saves its outputs into the file: strip them on `git add` / `git
# diff` with nbstripout (pinned in requirements.txt), so the committed notebooks stay output-free.
# The command is relative to the worktree root (git runs filters there), so every worktree uses
# its own .venv; where it is missing git warns and takes the file as is.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git config filter.nbstripout.clean ".venv/bin/python -m nbstripout --keep-id --extra-keys metadata.language_info"
  git config filter.nbstripout.smudge cat
  git config diff.ipynb.textconv ".venv/bin/python -m nbstripout --keep-id --extra-keys metadata.language_info -t"
fi
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian chromium (for PNG/SVG export and browser tests)..." >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install chromium; PNG/SVG export and browser tests will be skipped" >&2
  else
    echo "note: chromium not found and not root; PNG/SVG export and browser tests will be skipped" >&2
  fi
fi
# Debian's slurm-wlm and munge for the local one-node Slurm (scripts/slurm-local.sh, the Slurm
# launcher's tests), when missing and root; without them those tests are skipped.
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian slurm-wlm and munge (local Slurm for the Slurm launcher tests)..." >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null) \
      || echo "warning: could not install slurm-wlm/munge; the local-Slurm tests will be skipped" >&2
  else
    echo "note: slurm-wlm/munge not found and not root; the local-Slurm tests will be skipped" >&2
  fi
fi
