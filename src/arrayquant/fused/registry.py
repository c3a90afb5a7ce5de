"""Which fused kernel, if any, serves an operation on given data: the drivers ask here first.

Each entry answers for one backend and one operation with a kernel or with nothing; nothing means
the portable Array API path runs. A kernel may still decline at run time (it returns None): data
holding NaN or infinity goes to the portable path, which reports where.

=========== =================================================== ==================================
operation   CPU (NumPy arrays, Numba)                           GPU (CuPy arrays)
=========== =================================================== ==================================
quantize    MinMax, dynamic scales: :mod:`.numba_quantize`      :mod:`.cupy_kernels` (unverified)
encode      given stored scales: :mod:`.numba_quantize`         -
chunks      two-level, a chunk at a time: :mod:`.numba_quantize` -
dequantize  :mod:`.numba_dequantize`                            :mod:`.cupy_kernels` (unverified)
mse         MSE calibration search: :mod:`.numba_search`        -
affine      zero-point / offset quantize and dequantize:        -
            :mod:`.numba_affine`
=========== =================================================== ==================================
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import array_api_compat as compat
import numpy as np

from ..invariants import Plan
from . import available, gpu_available, gpu_why_not, why_not

__all__ = [
    "affine_dequantize_kernel",
    "affine_quantize_kernel",
    "chunk_kernels",
    "dequantize_kernel",
    "describe",
    "encode_kernel",
    "mse_kernel",
    "quantize_kernel",
]

_CPU_MODULES = {
    "quantize": "numba_quantize",
    "encode": "numba_quantize",
    "chunks": "numba_quantize",
    "dequantize": "numba_dequantize",
    "mse": "numba_search",
    "affine": "numba_affine",
}


def _module(name: str) -> Any:
    return importlib.import_module(f"{__package__}.{name}")


def _cpu(op: str, plan: Plan, shape: tuple[int, ...]) -> Any:
    """The Numba module serving ``op`` for this scheme and shape, or None."""
    if not available():
        return None
    mod = _module(_CPU_MODULES[op])
    return mod if not mod.supports(plan, shape) else None


def _gpu(plan: Plan, shape: tuple[int, ...]) -> Any:
    if not gpu_available():
        return None
    mod = _module("cupy_kernels")
    return mod if not mod.supports(plan, shape) else None


def quantize_kernel(x: Any, plan: Plan, shape: tuple[int, ...]) -> Callable[..., Any] | None:
    """``fn(x, plan, rounding) -> (values, stored, global) | None`` for MinMax quantization of ``x``, or None."""
    if isinstance(x, np.ndarray):
        mod = _cpu("quantize", plan, shape) if x.dtype == np.float32 else None
    elif compat.is_cupy_array(x):
        mod = _gpu(plan, shape)
    else:
        mod = None
    return None if mod is None else mod.quantize


def encode_kernel(x: Any, plan: Plan, shape: tuple[int, ...]) -> Callable[..., Any] | None:
    """``fn(x, plan, stored, global, rounding) -> values | None`` for given scales, or None."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        return None
    mod = _cpu("encode", plan, shape)
    return None if mod is None else mod.encode


def chunk_kernels(x: Any, plan: Plan, shape: tuple[int, ...]) -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """MinMax quantization of one chunk of a larger tensor, in two steps, or None.

    ``(absmax, quantize_under)``: ``absmax(x) -> (1,) f32 | None`` for each chunk, then, with the
    global taken over all of them, ``quantize_under(x, plan, glob, rounding) -> (values, stored) |
    None``. None from either means NaN or infinity: the portable path reports it.
    """
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        return None
    mod = _cpu("chunks", plan, shape)
    return None if mod is None else (mod.absmax, mod.quantize_under)


def dequantize_kernel(values: Any, plan: Plan, shape: tuple[int, ...]) -> Callable[..., Any] | None:
    """``fn(values, scales, global, plan, shape) -> f32 data | None``, or None."""
    if isinstance(values, np.ndarray):
        mod = _cpu("dequantize", plan, shape)
    elif compat.is_cupy_array(values):
        mod = _gpu(plan, shape)
    else:
        mod = None
    return None if mod is None else mod.dequantize


def mse_kernel(x: Any, plan: Plan, shape: tuple[int, ...]) -> Callable[..., Any] | None:
    """``fn(x, plan, factors, norm, importance, rounding) -> (codes, scales, global) | None``, or None.

    The MSE calibration search of ``x`` (float32 or float16) under ``plan``.
    """
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float16):
        return None
    mod = _cpu("mse", plan, shape)
    return None if mod is None else mod.mse


def affine_quantize_kernel(x: Any, plan: Plan, shape: tuple[int, ...]) -> Callable[..., Any] | None:
    """``fn(x, plan, given, rounding) -> (values, scales, zero) | None`` for an affine scheme, or None.

    ``given`` is None (MinMax) or the static ``(scales, zero)`` f32 grids as stored; ``zero`` comes
    back as the stored zero points (the codes' dtype) or offsets (f32).
    """
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        return None
    mod = _cpu("affine", plan, shape)
    return None if mod is None else mod.quantize


def affine_dequantize_kernel(values: Any, plan: Plan, shape: tuple[int, ...]) -> Callable[..., Any] | None:
    """``fn(values, scales, zero, plan, shape) -> f32 data | None`` for an affine scheme, or None."""
    if not isinstance(values, np.ndarray):
        return None
    mod = _cpu("affine", plan, shape)
    return None if mod is None else mod.dequantize


def describe() -> list[tuple[str, str]]:
    """``(kernels, state)`` lines for ``arrayquant backends``: what is on, and why not."""
    from . import threads

    cpu = why_not()
    if not cpu:
        numba = importlib.import_module("numba")
        cpu = (
            f"on (numba {numba.__version__}, {threads.count()} threads): quantize, encode and dequantize of "
            "integer and minifloat values per tensor and in 1-d blocks (MX, NVFP4 included); MSE search"
        )
    else:
        cpu = f"off: {cpu}"
    gpu = gpu_why_not()
    gpu = "on (unverified): quantize and dequantize" if not gpu else f"off: {gpu}"
    return [("numba (CPU)", cpu), ("cupy (GPU)", gpu)]
