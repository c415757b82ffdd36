"""``python -m ctrlmem.cli``: the ``ctrlmem`` command."""

from ctrlmem.cli.app import main

raise SystemExit(main())
