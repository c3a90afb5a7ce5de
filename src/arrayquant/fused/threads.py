"""How many threads the fused CPU kernels use: one per core the process may run on, unless set.

``ARRAYQUANT_THREADS=n`` or :func:`arrayquant.fused_kernels` (``threads=n``) choose another count.
Results never depend on it: each row's work is sequential and fixed, only rows are shared out.
"""

from __future__ import annotations

import contextvars
import os

__all__ = ["apply", "count", "default", "planned"]

# set by arrayquant.fused_kernels(threads=...) for the current context (thread or task)
CHOSEN: contextvars.ContextVar[int | None] = contextvars.ContextVar("arrayquant_threads", default=None)


def default() -> int:
    """One thread per core this process may use (its CPU affinity, where the OS has one)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - macOS, Windows
        return max(os.cpu_count() or 1, 1)


def count() -> int:
    """The thread count for the next launch: the context's choice, ``ARRAYQUANT_THREADS``, or :func:`default`."""
    chosen = CHOSEN.get()
    if chosen is not None:
        return chosen
    text = os.environ.get("ARRAYQUANT_THREADS", "").strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    return default()


# below this many elements per thread, waking another thread costs more than it saves
MIN_ELEMENTS_PER_THREAD = 1 << 16


def planned(elements: int | None = None) -> int:
    """The thread count of the next launch over ``elements`` values.

    At most :func:`count`, at most the size of numba's pool, and one thread per
    ``MIN_ELEMENTS_PER_THREAD`` values, so a small tensor runs on the calling thread alone.
    """
    import numba

    n = min(count(), numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    if elements is not None:
        n = min(n, elements // MIN_ELEMENTS_PER_THREAD + 1)
    return max(1, n)


def apply(elements: int | None = None) -> None:
    """Set numba's thread count for the next parallel launch over ``elements`` values (:func:`planned`)."""
    import numba

    numba.set_num_threads(planned(elements))
