"""Fused kernels beside the portable ones: offered where they apply, bit-exact with the portable path.

A fused kernel is an optimisation only: callers ask :func:`available` first and fall back to the
portable Array API kernels when it says no (Numba missing, or ``ARRAYQUANT_FUSED=0``).
"""

from __future__ import annotations

import functools
import importlib
import os

__all__ = ["available", "why_not"]


@functools.cache  # why: importing numba is slow, and whether it imports does not change in a process
def _numba_problem() -> str:
    try:
        importlib.import_module("numba")
    except ImportError:
        return "numba is not installed (pip install numba)"
    return ""


def why_not() -> str:
    """Why the fused CPU kernels are off now, or ``""`` when they are available.

    Returns
    -------
    str
        ``"turned off by ARRAYQUANT_FUSED=0"``, ``"numba is not installed (pip install numba)"``, or ``""``.
    """
    if os.environ.get("ARRAYQUANT_FUSED", "1").strip() == "0":
        return "turned off by ARRAYQUANT_FUSED=0"
    return _numba_problem()


def available() -> bool:
    """Whether the fused CPU (Numba) kernels may be used now (see :func:`why_not`)."""
    return not why_not()
