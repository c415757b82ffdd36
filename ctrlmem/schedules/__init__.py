"""Schedule generators, registered by name in :data:`SCHEDULES` (see :func:`build`).

Modules: :mod:`.classic` (GPipe, 1F1B, interleaved 1F1B) and :mod:`.zero_bubble` (ZB-H1, ZB-H2,
ZB-V). Importing this package registers them all.
"""

from ctrlmem.schedules import classic, zero_bubble  # noqa: F401  (registration side effect)
from ctrlmem.schedules import budgeted as adaptive, v_shape  # noqa: F401  (registration side effect)
from ctrlmem.schedules import dualpipe  # noqa: F401  (registration side effect)
from ctrlmem.schedules.registry import SCHEDULES, ScheduleSpec, build, register

__all__ = ["SCHEDULES", "ScheduleSpec", "build", "register"]
