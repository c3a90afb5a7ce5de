"""Test fixtures shared by the whole suite: the ``xp`` fixture over every installed backend.

``ARRAYQUANT_TEST_BACKENDS=numpy,dask`` selects a subset. Missing libraries skip; CuPy runs only
where a GPU is usable.
"""

from __future__ import annotations

import enum
import os
from typing import Any

import pytest


class Backend(enum.Enum):
    NUMPY = "numpy"
    ARRAY_API_STRICT = "array_api_strict"
    ARRAY_API_STRICT_DEVICE1 = "array_api_strict:device1"
    DASK = "dask"
    TORCH = "torch"
    JAX = "jax"
    CUPY = "cupy"

    @property
    def library(self) -> str:
        return self.value.split(":")[0]


def _selected() -> list[Backend]:
    env = os.environ.get("ARRAYQUANT_TEST_BACKENDS", "").strip()
    if not env:
        return list(Backend)
    names = {n.strip() for n in env.split(",") if n.strip()}
    return [b for b in Backend if b.value in names or b.library in names]


class XP:
    """A backend under test: its namespace, the device to create arrays on, and helpers."""

    def __init__(self, backend: Backend, xp: Any, device: Any) -> None:
        self.backend = backend
        self.xp = xp
        self.device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(self.xp, name)

    def asarray(self, obj: Any, dtype: Any = None) -> Any:
        """Put host data (NumPy or Python) on this backend and device."""
        import numpy as np

        host = np.asarray(obj)
        if self.backend is Backend.DASK:
            import dask.array as da

            arr = da.from_array(host, chunks=tuple(max(1, n // 2) for n in host.shape) or ())
            return arr if dtype is None else arr.astype(dtype)
        if self.backend is Backend.TORCH and host.dtype == np.uint32:
            import torch

            return torch.from_numpy(host.view(np.int32).copy()).view(torch.uint32)
        return self.xp.asarray(host, dtype=dtype, device=self.device)

    def __repr__(self) -> str:
        return self.backend.value


def _make(backend: Backend) -> XP:
    if backend is Backend.NUMPY:
        import array_api_compat.numpy as xp

        return XP(backend, xp, "cpu")
    if backend in (Backend.ARRAY_API_STRICT, Backend.ARRAY_API_STRICT_DEVICE1):
        xp = pytest.importorskip("array_api_strict")
        dev = xp.Device("device1") if backend is Backend.ARRAY_API_STRICT_DEVICE1 else xp.Device()
        return XP(backend, xp, dev)
    if backend is Backend.DASK:
        pytest.importorskip("dask.array")
        import array_api_compat.dask.array as xp

        return XP(backend, xp, None)
    if backend is Backend.TORCH:
        pytest.importorskip("torch")
        import array_api_compat.torch as xp

        return XP(backend, xp, "cpu")
    if backend is Backend.JAX:
        jax = pytest.importorskip("jax")
        jax.config.update("jax_enable_x64", False)
        import jax.numpy as xp

        return XP(backend, xp, None)
    cupy = pytest.importorskip("cupy")
    if not cupy.cuda.is_available():
        pytest.skip("cupy is installed but no GPU is usable")
    import array_api_compat.cupy as xp

    return XP(backend, xp, None)


@pytest.fixture(params=_selected(), ids=lambda b: b.value)
def xp(request: pytest.FixtureRequest) -> XP:
    """Each selected, installed backend in turn."""
    return _make(request.param)


@pytest.fixture
def np_xp() -> XP:
    """NumPy only, for tests of backend-independent behaviour."""
    return _make(Backend.NUMPY)


def _skip_reason(report: pytest.TestReport) -> str:
    """The reason a skip report gives, without pytest's ``Skipped: `` prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Summarise skips as one line per distinct reason with a count.

    pytest's ``-rs`` lists one line per test file and line, which on an install without the
    optional backends is hundreds of lines that hide a failure. This hook runs inside the
    terminal reporter's summary, before its "short test summary info", so the failures stay
    last; it takes the skip lines over from ``-r`` and prints one line per reason instead.
    ``--no-fold-skipped`` keeps pytest's own per-test listing.
    """
    reporter = terminalreporter
    if not getattr(reporter, "foldskipped", True):
        return
    reporter.reportchars = reporter.reportchars.replace("s", "")
    skipped = reporter.stats.get("skipped", [])
    if not skipped:
        return
    counts: dict[str, int] = {}
    for report in skipped:
        reason = _skip_reason(report)
        counts[reason] = counts.get(reason, 0) + 1
    reporter.write_sep("=", f"{len(skipped)} skipped, by reason", yellow=True)
    for reason, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        reporter.write_line(f"SKIPPED [{count}] {reason}")
