"""The ``ctrlmem`` command: one module per group of subcommands; depends on the features, never the
other way round.
"""

from ctrlmem.cli.app import main, make_parser

__all__ = ["main", "make_parser"]
