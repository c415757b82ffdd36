"""``python -m ctrlmem.experiments.papermill_cli ARGS``: papermill's command line, started lighter.

A sweep runs each point's notebook in a papermill process of its own (:func:`.sweep.
execute_with_papermill`). Importing papermill imports nbformat and so jsonschema, whose optional
``iri`` / ``iri-reference`` format checker, ``rfc3987_syntax`` (installed with jupyter-events'
``jsonschema[format-nongpl]``), compiles some 35 Lark grammars when it is imported: 1.7 s of the
2.4 s of CPU papermill's command line takes to start here, in every point, for a checker that no
notebook validation uses (nbformat's schemas name no ``format``; papermill validates nothing
else). Here that optional module counts as not installed, a set-up jsonschema supports (it then
checks no ``iri`` format); the rest is papermill's own command line, unchanged.
"""

from __future__ import annotations

import sys

__all__ = ["without_iri_grammars", "main"]


def without_iri_grammars() -> None:
    """Let jsonschema, when this process imports it, find its optional IRI checker
    (``rfc3987_syntax``) not installed, so the import does not compile its grammars. Only for
    processes ctrlmem runs itself (this command line, ``ctrlmem sweep``), never from library
    code; nothing happens once jsonschema is imported."""
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)


def main() -> None:
    without_iri_grammars()
    from papermill.cli import papermill  # noqa: PLC0415 - after the line above, which must come first

    papermill(prog_name="papermill")


if __name__ == "__main__":
    main()
