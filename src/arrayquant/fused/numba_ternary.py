"""Burn's ternary matmul fused in Numba: float32 activations times a Q2S per-tensor weight.

The same f32 operations in the same order as the portable path (``ops/linalg.py``'s
``_ternary_portable``) and burn-ndarray's ``ternary_matmul``, so the result is identical bit for bit:
per output row, starting from +0.0, for ``k`` ascending, add the activation ``a[i, k]`` where the
code ``t[k, n]`` is 1, its negation where it is -1 and +0.0 where it is 0 (the same as Burn's
skip: the sum never becomes -0.0), then one multiplication by the scale ``gamma``. No multiplication in the
sums: the selection compiles to vector blends.

Rows run in parallel (``prange``); each row's sums are sequential and fixed, so the result does not
depend on the thread count. No ``fastmath``: it would reorder the f32 additions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .numba_launch import launch, numba

__all__ = ["supports", "ternary_matmul"]


if numba is not None:

    @numba.njit(cache=True, nogil=True)
    def _row(a, t, gamma, out, i):
        """Output row ``i``: the k-ordered signed sums of ``a[i]``, then times ``gamma``."""
        zero = np.float32(0.0)
        orow = out[i]
        for k in range(a.shape[1]):
            x = a[i, k]
            nx = -x
            trow = t[k]
            for n in range(t.shape[1]):
                c = trow[n]
                v = x if c == 1 else zero
                v = nx if c == -1 else v
                orow[n] += v
        for n in range(t.shape[1]):
            orow[n] *= gamma

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _rows_parallel(a, t, gamma, out):
        for i in numba.prange(a.shape[0]):
            _row(a, t, gamma, out, i)

    @numba.njit(cache=True, nogil=True)
    def _rows_serial(a, t, gamma, out):
        for i in range(a.shape[0]):
            _row(a, t, gamma, out, i)


def supports(a: Any, t: Any) -> str:
    """Whether :func:`ternary_matmul` covers these operands.

    Parameters
    ----------
    a : array
        The activations ``(..., K)``.
    t : array
        The ternary codes ``(K, N)``.

    Returns
    -------
    str
        ``""`` when covered (NumPy float32 activations, NumPy int8 codes, Numba installed), else
        a short reason why not.
    """
    if numba is None:
        return "numba is not installed (pip install numba)"
    if type(a) is not np.ndarray or a.dtype != np.float32:
        return "the fused ternary kernel takes NumPy float32 activations"
    if type(t) is not np.ndarray or t.dtype != np.int8 or t.ndim != 2:
        return "the fused ternary kernel takes 2-d NumPy int8 codes"
    return ""


def ternary_matmul(a: np.ndarray, t: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """``a @ (t * gamma)`` as Burn's ternary matmul computes it (see the module docstring).

    Parameters
    ----------
    a : numpy.ndarray
        float32 activations ``(..., K)`` (1-d: a row vector).
    t : numpy.ndarray
        int8 codes ``(K, N)`` in {-1, 0, 1}.
    gamma : numpy.ndarray
        The ``(1,)`` float32 scale.

    Returns
    -------
    numpy.ndarray
        float32 ``(..., N)``.
    """
    k, n = t.shape
    lead = a.shape[:-1]
    rows = np.ascontiguousarray(a.reshape(-1, k))
    out = np.zeros((rows.shape[0], n), dtype=np.float32)
    launch(
        (_rows_parallel, _rows_serial), rows.shape[0] * k * n, rows, np.ascontiguousarray(t), np.float32(gamma[0]), out
    )
    return out.reshape((*lead, n))
