"""The torch releases ctrlmem's real runs support, checked without importing torch.

``ctrlmem run`` (and ``--emit-sbatch``) checks the installed torch before it launches anything;
reading the version from the installed distribution's metadata spares the launcher the seconds
of importing torch and ``torch.distributed.pipelining`` it otherwise never needs (the ranks
import them, and check their torch again). :mod:`.adapter` re-exports these names.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import sys

__all__ = ["SUPPORTED_TORCH", "ALLOW_ENV", "UnsupportedTorch", "installed_torch_version", "check_torch_version"]

log = logging.getLogger(__name__)

SUPPORTED_TORCH = ((2, 11), (2, 13))
"""Oldest and newest supported ``(major, minor)`` of torch, both included."""

ALLOW_ENV = "CTRLMEM_ALLOW_UNSUPPORTED_TORCH"


class UnsupportedTorch(RuntimeError):
    """The installed torch is outside :data:`SUPPORTED_TORCH`."""


def installed_torch_version() -> str:
    """The version of the torch this process runs (``torch.__version__``) once torch is
    imported; before, that of the installed ``torch`` distribution (the same string), without
    importing it. A torch without distribution metadata is imported and asked; no torch at all
    raises ``ModuleNotFoundError`` as ``import torch`` would."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "__version__"):
        return str(torch.__version__)
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        import torch  # noqa: PLC0415 - torch takes seconds to import; only a torch without metadata needs it

        return str(torch.__version__)


def check_torch_version(version: str | None = None) -> str:
    """Return ``version`` (default: the installed torch's, :func:`installed_torch_version`) if it
    is supported; raise :class:`UnsupportedTorch` naming the supported range and the fix
    otherwise. Setting ``CTRLMEM_ALLOW_UNSUPPORTED_TORCH=1`` turns the refusal into a warning."""
    version = installed_torch_version() if version is None else str(version)
    match = re.match(r"(\d+)\.(\d+)", version)
    (lo, hi) = SUPPORTED_TORCH
    rng = f"{lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}"
    if match and lo <= (int(match[1]), int(match[2])) <= hi:
        return version
    msg = (f"torch {version} is not supported by ctrlmem's real runs (supported: torch {rng}; they rely on "
           f"torch.distributed.pipelining internals that change between releases); install a supported "
           f"version, e.g. pip install torch=={hi[0]}.{hi[1]}.0, or set {ALLOW_ENV}=1 to try anyway")
    if os.environ.get(ALLOW_ENV, "") not in ("", "0"):
        log.warning("%s (continuing: %s is set)", msg, ALLOW_ENV)
        return version
    raise UnsupportedTorch(msg)
