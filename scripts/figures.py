#!/usr/bin/env python
"""Regenerate the paper's schedule figures (Fig. 4, Fig. 5, the Fig. 18 gallery) into figures/.

    .venv/bin/python scripts/figures.py                 # PNG and SVG into figures/
    .venv/bin/python scripts/figures.py --format html   # interactive, offline pages
    .venv/bin/python scripts/figures.py --format pdf --only fig04   # vector PDF for a paper

The same as ``ctrlmem figures`` (see ``ctrlmem figures --help``); figures/schedule_figures.md
lists what was drawn and what could not be (schedules not available yet).
"""

import sys

from ctrlmem.cli import main

if __name__ == "__main__":
    sys.exit(main(["figures", *sys.argv[1:]]))
