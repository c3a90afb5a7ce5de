"""Which array libraries are here, which can be used, and on which devices.

Detection uses ``importlib.util.find_spec`` and never imports a library; a backend is imported
only when it is asked for (``get``, ``available``, ``default`` with a GPU library installed).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from ..errors import BackendUnavailableError

__all__ = ["BACKENDS", "BackendInfo", "available", "default", "get", "namespace", "probe"]

BACKENDS = ("numpy", "cupy", "torch", "jax", "dask", "array_api_strict")
ENV_VAR = "ARRAYQUANT_BACKEND"


@dataclass(frozen=True)
class BackendInfo:
    """What arrayquant knows about one array library on this machine."""

    name: str
    installed: bool
    usable: bool
    devices: tuple[str, ...] = ()
    reason: str = ""

    @property
    def namespace(self) -> Any:
        """The Array API namespace of this backend (raises if it is not usable)."""
        return namespace(self.name)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _devices(name: str) -> tuple[str, ...]:
    if name == "cupy":
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        if count < 1:
            raise RuntimeError("CUDA reports no GPU")
        return tuple(f"cuda:{i}" for i in range(count))
    if name == "torch":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return ("cpu", *tuple(f"cuda:{i}" for i in range(gpus)))
    if name == "jax":
        import jax

        # jax.devices() lists the default platform only; the host is always there as well
        return ("cpu", *tuple(f"cuda:{d.id}" for d in jax.devices() if d.platform == "gpu"))
    if name == "array_api_strict":
        import array_api_strict

        names = (str(d).split("'")[1] for d in array_api_strict.__array_namespace_info__().devices())
        return tuple("cpu" if n == "CPU_DEVICE" else n for n in names)
    importlib.import_module("numpy" if name == "numpy" else "dask.array")
    return ("cpu",)


@functools.cache
def probe(name: str) -> BackendInfo:
    """Import ``name`` if installed and find out whether it can run and on which devices."""
    if name not in BACKENDS:
        msg = f"unknown backend {name!r}; known backends are {', '.join(BACKENDS)}"
        raise BackendUnavailableError(msg)
    if not _installed(name):
        extra = {"cupy": "gpu", "dask": "dask"}.get(name)
        hint = f"pip install 'arrayquant[{extra}]'" if extra else f"pip install {name.replace('_', '-')}"
        return BackendInfo(name, False, False, (), f"{name} is not installed; {hint}")
    try:
        devices = _devices(name)
    except Exception as exc:  # a driver or runtime problem makes the backend unusable, not fatal
        reason = f"{name} is installed but unusable: {type(exc).__name__}: {exc}"
        return BackendInfo(name, True, False, (), reason)
    return BackendInfo(name, True, True, devices, "")


def available() -> list[BackendInfo]:
    """Every known backend with whether it is installed and usable, and why not."""
    return [probe(name) for name in BACKENDS]


def get(name: str) -> BackendInfo:
    """The usable backend ``name``, or :class:`~arrayquant.BackendUnavailableError` with the reason."""
    info = probe(str(name).strip().lower())
    if not info.usable:
        raise BackendUnavailableError(info.reason)
    return info


def default() -> BackendInfo:
    """``$ARRAYQUANT_BACKEND`` if set, else a usable GPU backend (cupy), else numpy."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        try:
            return get(env)
        except BackendUnavailableError as exc:
            msg = f"{ENV_VAR}={env!r} cannot be used: {exc}; unset it or install the backend"
            raise BackendUnavailableError(msg) from None
    if _installed("cupy") and probe("cupy").usable:
        return probe("cupy")
    return get("numpy")


def namespace(name: str) -> Any:
    """The Array API namespace for backend ``name``."""
    name = str(name).strip().lower()
    get(name)
    module = {
        "numpy": "array_api_compat.numpy",
        "cupy": "array_api_compat.cupy",
        "torch": "array_api_compat.torch",
        "jax": "jax.numpy",
        "dask": "array_api_compat.dask.array",
        "array_api_strict": "array_api_strict",
    }[name]
    return importlib.import_module(module)
