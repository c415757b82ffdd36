"""The schedule search engine: compact candidates, exact timing, bounds, and the search driver.

Every search in ctrlmem (``v-shape``, ``zb``, the cost-adapted ``v-min`` / ``v-half`` / ``v-zb`` /
``1f1b-v``, and what builds on them) runs here:

* :mod:`.encoding` — candidates as integer arrays (per device: pass keys in order), built for a
  few microbatches and lengthened (periodic stable phase), their peaks computed once;
* :mod:`.timing` — the simulator's as-soon-as-possible run on those arrays, in a compiled loop;
* :mod:`.bounds` — lower bounds on the longest span under a memory cap (what lets a search skip
  caps and families that cannot win);
* :mod:`.engine` — :class:`Family` (a producer of candidates, one small module each, in
  :mod:`ctrlmem.search.families`), :func:`search` (time, keep the best, check the winner on
  the arrays and make a ``Schedule`` only for it) and the caches;
* :mod:`.kernels` — the compiled loops: numba when installed, the same code as Python otherwise.

Nothing here imports the schedule generators: families plug in from :mod:`ctrlmem.schedules`.
"""

from ctrlmem.search.encoding import CandidateSet
from ctrlmem.search.engine import Family, Found, Incumbent, Query, clear_caches, search

__all__ = ["CandidateSet", "Family", "Found", "Incumbent", "Query", "clear_caches", "search"]
