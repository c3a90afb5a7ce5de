"""Test fixtures shared by the whole suite: the ``xp`` fixture over every installed backend.

``ARRAYQUANT_TEST_BACKENDS=numpy,dask`` selects a subset. Missing libraries skip; CuPy runs only
where a GPU is usable.

``ARRAYQUANT_REQUIRE=torch,jax,hf,gguf,burn,numba,onnx`` (any of these groups, comma-separated; ci/test.sh
sets them all) turns the skip of a ``pytest.importorskip`` of a group's module into a failure, so
the interop tests cannot vanish with the run still green when an install quietly failed.
"""

from __future__ import annotations

import enum
import functools
import os
from collections.abc import Callable
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


# the groups ARRAYQUANT_REQUIRE may name, and the modules (top-level names) each one requires
REQUIRE_GROUPS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "jax": ("jax",),
    "hf": ("transformers", "compressed_tensors"),
    "gguf": ("gguf",),
    "burn": ("cbor2",),
    "numba": ("numba",),
    "onnx": ("onnx", "onnxruntime", "onnx_ir"),
}

_ORIGINAL_IMPORTORSKIP = pytest.StashKey[Callable[..., Any]]()


def required_modules(env: str | None = None) -> dict[str, str]:
    """The modules ``ARRAYQUANT_REQUIRE`` (or ``env``) requires, each mapped to its group's name."""
    text = os.environ.get("ARRAYQUANT_REQUIRE", "") if env is None else env
    groups = [g.strip() for g in text.split(",") if g.strip()]
    unknown = [g for g in groups if g not in REQUIRE_GROUPS]
    if unknown:
        known = ", ".join(REQUIRE_GROUPS)
        raise pytest.UsageError(f"ARRAYQUANT_REQUIRE names unknown groups {unknown}; the groups are {known}")
    return {module: group for group in groups for module in REQUIRE_GROUPS[group]}


def _failing_importorskip(original: Callable[..., Any], required: dict[str, str]) -> Callable[..., Any]:
    """``pytest.importorskip`` that fails, instead of skipping, for a module of a required group."""

    @functools.wraps(original)
    def importorskip(modname: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(modname, *args, **kwargs)
        except pytest.skip.Exception as skip:
            group = required.get(modname.split(".")[0])
            if group is None:
                raise
            reason = skip.msg
        # outside the except block, so the report shows this one message, not the skip before it
        pytest.fail(f"ARRAYQUANT_REQUIRE names {group!r}, but {modname!r} is not usable here: {reason}", pytrace=False)

    return importorskip


def pytest_configure(config: pytest.Config) -> None:
    """Under ``ARRAYQUANT_REQUIRE``, put the failing ``pytest.importorskip`` in place for this run."""
    required = required_modules()
    if required:
        config.stash[_ORIGINAL_IMPORTORSKIP] = pytest.importorskip
        pytest.importorskip = _failing_importorskip(pytest.importorskip, required)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Put pytest's own ``importorskip`` back (a run inside this process starts from it)."""
    original = config.stash.get(_ORIGINAL_IMPORTORSKIP, None)
    if original is not None:
        pytest.importorskip = original


def pytest_report_header(config: pytest.Config) -> str | None:
    required = required_modules()
    if not required:
        return None
    return f"ARRAYQUANT_REQUIRE: {', '.join(sorted(required))} must import (a skip for one missing is a failure)"


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
