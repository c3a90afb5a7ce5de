"""Fused kernels beside the portable ones: offered where they apply, bit-exact with the portable path.

A fused kernel is an optimisation only. The drivers ask :mod:`.registry` for one first and fall
back to the portable Array API kernels when it offers none: Numba missing, a case not covered,
``ARRAYQUANT_FUSED=0``, or :func:`fused_kernels` ``(enabled=False)`` around the call. The CuPy
kernels stay off until a GPU run has proven them (``ARRAYQUANT_FUSED_GPU=1`` turns them on).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os
from collections.abc import Iterator

from ..errors import ParamsError
from . import threads as _threads

__all__ = ["available", "fused_kernels", "gpu_available", "gpu_why_not", "why_not"]

# set by fused_kernels(enabled=...) for the current context: None defers to the environment
_ENABLED: contextvars.ContextVar[bool | None] = contextvars.ContextVar("arrayquant_fused", default=None)


@functools.cache  # why: importing numba is slow, and whether it imports does not change in a process
def _numba_problem() -> str:
    try:
        importlib.import_module("numba")
    except ImportError:
        return "numba is not installed (pip install 'arrayquant[fast]')"
    return ""


def _turned_off() -> str:
    chosen = _ENABLED.get()
    if chosen is False:
        return "turned off by fused_kernels(enabled=False)"
    if chosen is None and os.environ.get("ARRAYQUANT_FUSED", "1").strip() == "0":
        return "turned off by ARRAYQUANT_FUSED=0"
    return ""


def why_not() -> str:
    """Why the fused CPU (Numba) kernels are off now, or ``""`` when they are available.

    Returns
    -------
    str
        ``"turned off by ARRAYQUANT_FUSED=0"``, ``"turned off by fused_kernels(enabled=False)"``,
        ``"numba is not installed (pip install 'arrayquant[fast]')"``, or ``""``.
    """
    return _turned_off() or _numba_problem()


def available() -> bool:
    """Whether the fused CPU (Numba) kernels may be used now (see :func:`why_not`)."""
    return not why_not()


def gpu_why_not(verified: bool | None = None) -> str:
    """Why the fused GPU (CuPy) kernels are off now, or ``""`` when they are on.

    They are unverified until ``ci/gpu-check.sh`` has passed on a GPU, so they are off unless
    ``ARRAYQUANT_FUSED_GPU=1``; the switches of :func:`why_not` apply to them too. ``verified``
    is a kernel module's own flag (default: the quantize and dequantize kernels' ``VERIFIED``).
    """
    off = _turned_off()
    if off:
        return off
    if verified is None:
        from .cupy_kernels import VERIFIED as verified

    if not verified and os.environ.get("ARRAYQUANT_FUSED_GPU", "0").strip() != "1":
        return "unverified: off until proven on a GPU (ARRAYQUANT_FUSED_GPU=1 turns them on)"
    try:
        importlib.import_module("cupy")
    except ImportError:
        return "cupy is not installed (pip install 'arrayquant[gpu]')"
    return ""


def gpu_available() -> bool:
    """Whether the fused GPU (CuPy) kernels may be used now (see :func:`gpu_why_not`)."""
    return not gpu_why_not()


@contextlib.contextmanager
def fused_kernels(enabled: bool = True, *, threads: int | None = None) -> Iterator[None]:
    """Turn the fused kernels on or off, and set their CPU thread count, inside a ``with`` block.

    Parameters
    ----------
    enabled : bool
        False runs the portable kernels only (as ``ARRAYQUANT_FUSED=0`` does); True lets the
        fused kernels run where they apply, whatever the environment says.
    threads : int, optional
        Threads of the fused CPU kernels (default: ``ARRAYQUANT_THREADS``, else one per core the
        process may use). Results do not depend on it.

    Raises
    ------
    ParamsError
        ``enabled`` not a bool, or ``threads`` not a positive int.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayquant as aq
    >>> x = np.linspace(-1, 1, 64, dtype=np.float32)
    >>> with aq.fused_kernels(False):
    ...     portable = aq.quantize(x, "q8s:block32:f16")
    >>> with aq.fused_kernels(threads=1):
    ...     fused = aq.quantize(x, "q8s:block32:f16")
    >>> bool((portable.values == fused.values).all())
    True
    """
    if not isinstance(enabled, bool):
        msg = f"enabled must be True or False, got {enabled!r}"
        raise ParamsError(msg)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        msg = f"threads must be a positive int (or None for one per core), got {threads!r}"
        raise ParamsError(msg)
    token = _ENABLED.set(enabled)
    chosen = _threads.CHOSEN.set(threads) if threads is not None else None
    try:
        yield
    finally:
        _ENABLED.reset(token)
        if chosen is not None:
            _threads.CHOSEN.reset(chosen)
