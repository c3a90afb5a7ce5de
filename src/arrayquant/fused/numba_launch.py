"""How the fused CPU kernels run: the numba module (None without it), their compilation in pairs, :func:`launch`.

Every Numba kernel comes as a pair, compiled parallel over its ``prange`` and serial, and runs
through :func:`launch`, which picks one for the planned thread count (:mod:`.threads`), so
``fused_kernels(threads=...)`` and ``ARRAYQUANT_THREADS`` reach every kernel.
"""

from __future__ import annotations

import importlib
import threading
import types
from typing import Any

from . import threads

__all__ = ["LOCK", "launch", "numba", "parallel_and_serial"]


def _load_numba() -> Any:
    """The numba module, or None where it is not installed (then no fused CPU kernel applies)."""
    try:
        return importlib.import_module("numba")
    except ImportError:  # pragma: no cover - exercised only without numba
        return None


numba = _load_numba()
# why: numba's default "workqueue" threading layer aborts the process when two Python threads launch
# parallel kernels at once (a thread pool or dask's threaded scheduler calling quantize); serialise them
LOCK = threading.Lock()


def launch(kernels: tuple[Any, Any], elements: int, *args: Any) -> Any:
    """Run a kernel over ``elements`` values: ``kernels`` is its (parallel, serial) compilation; its result.

    On one thread (:func:`threads.planned`) the serial one runs with no lock: it never touches
    numba's thread pool, so Python threads (dask's threaded scheduler) may run it side by side.
    """
    n = threads.planned(elements)
    if n == 1:
        return kernels[1](*args)
    with LOCK:
        numba.set_num_threads(n)
        return kernels[0](*args)


def parallel_and_serial(fn: Any, **options: Any) -> tuple[Any, Any]:
    """``fn`` compiled parallel over its ``prange`` and serial (a plain loop), for :func:`launch`.

    The serial one compiles a copy of ``fn`` under another name. Numba's on-disk cache keys an
    entry by the function's name, code and closure, not by ``parallel``: compiled under one name,
    whichever of the two ran first would be loaded for the other in every later process (the
    parallel kernel then runs on one thread, or a one-thread launch uses the pool). ``options`` go to
    both compilations (``error_model="numpy"``: a float division by zero gives infinity, as in C).
    """
    serial = types.FunctionType(fn.__code__, fn.__globals__, f"{fn.__name__}_serial", fn.__defaults__, fn.__closure__)
    serial.__qualname__ = f"{fn.__qualname__}_serial"
    serial.__doc__ = fn.__doc__
    opts = {"cache": True, "nogil": True, **options}
    return numba.njit(parallel=True, **opts)(fn), numba.njit(**opts)(serial)
