"""The fused quantized matrix product ``y = x @ W.T`` on CuPy (CUDA), beside the Numba one.

**Off by default, unverified**, as :mod:`.cupy_kernels` is: ``VERIFIED`` stays False until
``ci/gpu-check.sh`` has run ``tests/test_fused_cupy_matmul.py`` on a GPU; until then CuPy arrays
take the reference path unless ``ARRAYQUANT_FUSED_GPU=1``.

One thread per output ``y[m, n]`` walks K in order: each weight is its dequantized f32 value, the
level (a 256-entry table indexed by the code's byte: integer codes of every width, E4M3, E5M2,
E2M1) times the block's effective scale, the zero point taken off first or the offset added after
(``__fmul_rn`` / ``__fsub_rn`` / ``__fadd_rn``: the dequantizer's f32 steps, bit for bit); then
``acc = acc + w * x`` rounded at each step (no FMA, ``--fmad=false``). So the result is the
sequential f32 dot product of ``aq.dequantize(W)`` and ``x``, which the tests compare exactly, and
differs from a float64 product by the f32 dot-product bound. The weight's codes are unpacked to a
byte each once per weight (kept while the weight lives). Simple rather than fast: a correct
GPU path to build faster ones on, once a device has proven it.

CuPy is imported inside the functions: this module imports without it.
"""

from __future__ import annotations

import functools
import importlib
import weakref
from typing import Any

import numpy as np

from ..invariants import Plan
from ..kernels.minifloat import FORMATS, decode_table
from ..scheme import F32_MAX, QuantMode
from .coverage import weight_reason
from .cupy_kernels import OPTIONS

__all__ = ["SOURCE", "VERIFIED", "levels", "matmul_t", "supports"]

VERIFIED = False  # set True only after ci/gpu-check.sh has passed with ARRAYQUANT_FUSED_GPU=1 on a GPU

_THREADS = 128

# affine: 0 symmetric (level * s), 1 zero point ((level - z) * s), 2 offset (level * s + m)
SOURCE = r"""
extern "C" __global__ void aq_matmul_t(const unsigned char* codes, const float* eff, const float* aux,
                                       const float* table, const float* x, float* out, int m_rows,
                                       int n_rows, int k, int groups, int block, int affine) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m_rows * n_rows) return;
    int m = t / n_rows;
    int n = t - m * n_rows;
    const unsigned char* row = codes + (long long)n * k;
    const float* xr = x + (long long)m * k;
    const float* sr = eff + (long long)n * groups;
    const float* zr = aux + (long long)n * groups;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
        int g = j / block;
        float lev = table[row[j]];
        float w;
        if (affine == 0) {
            w = __fmul_rn(lev, sr[g]);
        } else if (affine == 1) {
            w = __fmul_rn(__fsub_rn(lev, zr[g]), sr[g]);
        } else {
            w = __fadd_rn(__fmul_rn(lev, sr[g]), zr[g]);
        }
        acc = __fadd_rn(acc, __fmul_rn(w, xr[j]));
    }
    out[t] = acc;
}
"""


def _cupy() -> Any:
    return importlib.import_module("cupy")


@functools.cache  # why: one compilation per process (CuPy also caches the binary on disk)
def _kernel() -> Any:
    return _cupy().RawKernel(SOURCE, "aq_matmul_t", options=OPTIONS)


def supports(plan: Plan, shape: tuple[int, ...]) -> str:
    """Why :func:`matmul_t` does not cover a weight of ``shape`` under ``plan``; ``""`` when it does.

    Parameters
    ----------
    plan : Plan
        The weight's validated scheme.
    shape : tuple of int
        The weight's shape, ``(N, K)``.

    Returns
    -------
    str
        ``""`` when covered, else a short reason.
    """
    return weight_reason(plan, tuple(shape))


def levels(plan: Plan) -> np.ndarray:
    """The f32 level of each code byte 0..255: the integer it is (as int8 or uint8), or the minifloat's value."""
    if plan.value.is_float:
        table = np.asarray(decode_table(plan.value), np.float32)
        return table[np.arange(256) & (table.size - 1)]
    kind = np.int8 if plan.qmin < 0 else np.uint8
    return np.arange(256, dtype=np.uint8).view(kind).astype(np.float32)


# the unpacked codes of each weight, a byte per code, while the weight lives
_CODES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def matmul_t(x: Any, qt: Any, plan: Plan) -> Any:
    """``x @ W.T`` for a float32 CuPy ``(M, K)`` ``x`` and a quantized ``(N, K)`` CuPy weight ``qt``, or None.

    Parameters
    ----------
    x : cupy.ndarray
        float32 activations ``(M, K)``.
    qt : QuantizedTensor
        The weight ``(N, K)`` on the same device.
    plan : Plan
        ``qt``'s validated scheme.

    Returns
    -------
    cupy.ndarray or None
        float32 ``(M, N)``; None where the kernel does not apply (:func:`supports`, other arrays,
        or scales whose products could pass the f32 maximum, which the reference path clips).
    """
    cp = _cupy()
    n, k = (int(v) for v in qt.shape)
    if supports(plan, (n, k)) or not isinstance(x, cp.ndarray) or x.dtype != cp.float32 or x.shape[-1] != k:
        return None
    if qt not in _CODES:
        _CODES[qt] = cp.ascontiguousarray(qt.codes()).view(cp.uint8).reshape(n, k)
    codes = _CODES[qt]
    scales = cp.asarray(qt.scales, dtype=cp.float32)
    eff = cp.broadcast_to(scales.reshape(1, 1), (n, 1)) if scales.size == 1 else scales.reshape(n, -1)
    if plan.two_level:
        eff = cp.minimum(cp.asarray(qt.global_scale, dtype=cp.float32).reshape(1, 1) * eff, cp.float32(F32_MAX))
    eff = cp.ascontiguousarray(eff, dtype=cp.float32)
    second = qt.zero_point if qt.zero_point is not None else qt.offset
    aux = cp.zeros(eff.shape, cp.float32) if second is None else cp.asarray(second, dtype=cp.float32).reshape(eff.shape)
    aux = cp.ascontiguousarray(aux)
    top = float(FORMATS[plan.value].max) if plan.value.is_float else float(plan.qmax - min(plan.qmin, 0))
    bound = float(cp.max(cp.abs(eff))) * top + (
        float(cp.max(cp.abs(aux))) if plan.scheme.mode is QuantMode.OFFSET else 0.0
    )
    if not np.isfinite(bound) or bound > F32_MAX * (1 - 2.0**-20):
        return None
    affine = {QuantMode.ZERO_POINT: 1, QuantMode.OFFSET: 2}.get(plan.scheme.mode, 0)
    groups = eff.shape[1]
    dims = plan.block_dims((n, k))
    block = dims[-1] if dims else k
    m = x.shape[0]
    out = cp.empty((m, n), dtype=cp.float32)
    table = cp.asarray(levels(plan))
    args = (codes, eff, aux, table, cp.ascontiguousarray(x), out, np.int32(m), np.int32(n), np.int32(k))
    _kernel()(
        (max(-(-m * n // _THREADS), 1),), (_THREADS,), (*args, np.int32(groups), np.int32(block), np.int32(affine))
    )
    return out
