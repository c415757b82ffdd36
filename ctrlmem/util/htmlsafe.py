"""The one escaping rule for everything ctrlmem embeds in HTML.

Names in a report come from the user (a schedule file's header, a state file, a replay): a name
such as ``</script><script>alert(1)</script>`` must stay text wherever it lands.

* :func:`text` ``(value)`` — for element content and quoted attribute values: ``&``, ``<``, ``>``,
  ``"`` and ``'`` become character references (``html.escape`` with quotes).
* :func:`script_json` ``(obj, **json_kw)`` — JSON for inside a ``<script>`` element (a plot's
  data, an embedded state). The HTML parser ends a script element at the first ``</script``
  whatever JavaScript thinks of it, and ``<!--`` changes how it looks for that end; so every
  ``<``, ``>`` and ``&`` is written as its JSON escape (``\\u003c`` ...), as are U+2028 / U+2029
  (line ends to older JavaScript). The result is still the same JSON: these characters can only
  occur inside JSON strings, where the escape means the same character, so ``json.loads`` (or
  ``JSON.parse``) gives back exactly ``obj``.
* :func:`is_script_safe` ``(body)`` — whether a text can sit inside a ``<script>`` element
  without ending it (what the tests assert of every script a writer emits).
"""

from __future__ import annotations

import html
import json
from typing import Any

__all__ = ["text", "script_json", "is_script_safe"]

_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_TABLE = str.maketrans(_SCRIPT_ESCAPES)


def text(value: Any) -> str:
    """``str(value)`` escaped for HTML element content and quoted attributes."""
    return html.escape(str(value), quote=True)


def script_json(obj: Any, **json_kw: Any) -> str:
    """``json.dumps(obj, **json_kw)`` safe to place inside a ``<script>`` element (see the module
    doc); ``allow_nan`` defaults to ``False`` (NaN is not JSON)."""
    json_kw.setdefault("allow_nan", False)
    return json.dumps(obj, **json_kw).translate(_TABLE)


def is_script_safe(body: str) -> bool:
    """``True`` when ``body`` holds nothing that ends or reshapes a script element (``</``,
    ``<!--``, ``<script``), compared without regard to case."""
    low = body.lower()
    return "</" not in low and "<!--" not in low and "<script" not in low
