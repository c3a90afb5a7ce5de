"""MSE calibration search of one-level integer schemes, fused in one Numba pass per row.

The same f32 operations in the same order as the portable path (``kernels/search.py`` driven by
``blockwork.Steps``), so codes and stored scales are identical bit for bit, not close:

* per block ``amax = max|x|``; the error unit ``2^K`` is its UE8M0 round-up;
* per candidate ``alpha = amax * f`` (``f`` the f32 factor), the stored scale is the round-up of
  ``alpha / (span / 2)`` onto the scale dtype (the same table steps as ``kernels/roundup.py``);
* codes ``clip(round(x / eff), qmin, qmax)`` (zero scale: code 0), ``deq = code * eff``;
* ``e = min(|x - deq| / 2^K, 255.99)`` (times ``2^-K``: exact, the same bits as the division),
  ``e^p`` as ``e``, ``e * e`` or the table product ``M[j] * P[k]`` whose binade ``k`` and top
  fraction bits ``j`` are read from ``e``'s bits (what the portable path settles by comparisons);
* weights, then the pairwise tree of the block zero-padded to a power of two;
* a later candidate wins only with a strictly smaller error.

Rows run in parallel (``prange``); each block's work is sequential and fixed, so the result does
not depend on the thread count. No ``fastmath``: it would reorder and contract the f32 steps.
"""

from __future__ import annotations

import importlib
import math
import threading
from typing import Any

import numpy as np

from ..invariants import Plan
from ..kernels.roundup import _pow2_tables
from ..kernels.search import _tables
from ..scheme import QuantMode, ScaleDtype

__all__ = ["launch", "mse_codes_and_scales", "norm_tables", "supports"]

_LIMIT = float(np.float32(255.99))


def _load_numba() -> Any:
    """The numba module, or None where it is not installed (then nothing here applies)."""
    try:
        return importlib.import_module("numba")
    except ImportError:  # pragma: no cover - exercised only without numba
        return None


numba = _load_numba()
# why: numba's default "workqueue" threading layer aborts the process when two Python threads launch
# parallel kernels at once (a thread pool or dask's threaded scheduler calling quantize); serialise them
_LAUNCH = threading.Lock()


def launch(kernels: tuple[Any, Any], elements: int, *args: Any) -> None:
    """Run a kernel over ``elements`` values: ``kernels`` is its (parallel, serial) compilation.

    On one thread (:func:`threads.planned`) the serial one runs with no lock: it never touches
    numba's thread pool, so Python threads (dask's threaded scheduler) may run it side by side.
    """
    from .threads import planned

    n = planned(elements)
    if n == 1:
        kernels[1](*args)
        return
    with _LAUNCH:
        numba.set_num_threads(n)
        kernels[0](*args)


def _round_up_tables(dtype: ScaleDtype) -> tuple[np.ndarray, ...]:
    """The f32 tables of ``round_up_scales`` for ``dtype``, and its (max, floor, is-f32) as f32 values."""
    g = dtype.grid
    thr, up_a, up_b, inv_a, inv_b = _pow2_tables(dtype)
    f32 = np.float32
    return (
        np.asarray(thr, dtype=f32),
        np.asarray(up_a, dtype=f32),
        np.asarray(up_b, dtype=f32),
        np.asarray(inv_a, dtype=f32),
        np.asarray(inv_b, dtype=f32),
        np.asarray([g.max, g.floor, 1.0 if dtype is ScaleDtype.F32 else 0.0], dtype=f32),
    )


def norm_tables(norm: float) -> tuple[int, np.ndarray, np.ndarray]:
    """How the kernels raise an error to ``norm``: (mode, mantissa table, binade table).

    Mode 0 for ``norm == 1`` and 1 for ``norm == 2`` (exact products, no tables); mode 2 takes the
    portable search's exact power tables.
    """
    if norm == 1:
        return 0, np.zeros(1, np.float32), np.zeros(1, np.float32)
    if norm == 2:
        return 1, np.zeros(1, np.float32), np.zeros(1, np.float32)
    _, scale_t, mant_t = _tables(float(norm))
    # scale_t is indexed by k + 126 and the biased exponent is k + 127: one slot of offset
    return 2, np.asarray(mant_t, np.float32), np.asarray(scale_t, np.float32)


if numba is not None:
    _njit = numba.njit(cache=True, nogil=True)

    @_njit
    def _round_up(s, thr, up_a, up_b, inv_a, inv_b, lim):
        """One f32 scale rounded up onto the dtype's grid: the steps of ``round_up_scales``."""
        zero = np.float32(0.0)
        if lim[2] != zero:
            return s + zero
        gmax = lim[0]
        a = min(s, gmax)
        # searchsorted(thr, a, side="right"): how many thresholds are <= a
        lo, hi = 0, thr.shape[0]
        while lo < hi:
            mid = (lo + hi) // 2
            if thr[mid] <= a:
                lo = mid + 1
            else:
                hi = mid
        j = lo
        n = np.float32(math.ceil((a * up_a[j]) * up_b[j]))
        r = (n * inv_a[j]) * inv_b[j]
        r = min(r, gmax)
        if lim[1] > zero:
            r = max(r, lim[1])
        return r + zero

    @_njit
    def _block_error(buf, bits, n, mode, mant, ptab, w, c0, has_w):
        """The block's error from its ``n`` scaled differences in ``buf`` (its bits in ``bits``):
        each raised to the norm (``mode`` 0: as is, 1: squared, 2: the exact table power),
        weighted, then summed by the zero-padded pairwise tree of the portable search."""
        zero = np.float32(0.0)
        tiny = np.float32(2.0**-126)
        width = buf.shape[0]
        for t in range(n, width):
            buf[t] = zero
        if mode == 2:
            for t in range(n):
                # branch-free so that the loop vectorises (gathers): e below 2^-126 (zero,
                # subnormal; biased exponent 0) reads slot 0 and is then replaced by 0
                u = bits[t]
                k = max(np.int32(u >> 23), np.int32(1)) - np.int32(1)
                v = mant[np.int32((u >> 9) & 0x3FFF)] * ptab[k]
                buf[t] = v if buf[t] >= tiny else zero
        elif mode == 1:
            for t in range(n):
                buf[t] = buf[t] * buf[t]
        if has_w:
            for t in range(n):
                buf[t] = buf[t] * w[c0 + t]
        h = width // 2
        while h >= 1:
            for t in range(h):
                buf[t] = buf[t] + buf[t + h]
            h //= 2
        return buf[0]

    @_njit
    def _code(y, qmin, qmax, half_even):
        """``clip(round(y), qmin, qmax)`` with ties to even (or away from zero)."""
        if y >= qmax:
            return qmax
        if y <= qmin:
            return qmin
        f = np.float32(math.floor(y))
        d = y - f  # exact: |y| < 2^23
        half = np.float32(0.5)
        if d > half:
            return f + np.float32(1.0)
        if d < half:
            return f
        if half_even:
            return f if math.floor(f * half) * 2 == f else f + np.float32(1.0)
        return f + np.float32(1.0) if y > np.float32(0.0) else f

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _search(
        x,
        b,
        factors,
        half_span,
        qmin,
        qmax,
        half_even,
        sd,
        u8,
        mode,
        mant,
        ptab,
        w,
        has_w,
        codes,
        scales,
        bad,
    ):
        rows, cols = x.shape
        nb = (cols + b - 1) // b
        width = 1
        while width < b:
            width *= 2
        zero = np.float32(0.0)
        inf = np.float32(np.inf)
        limit = np.float32(_LIMIT)
        nf = factors.shape[0]
        magic = np.float32(12582912.0)  # 1.5 * 2^23
        for r in numba.prange(rows):
            buf = np.zeros(width, dtype=np.float32)
            bits = buf.view(np.uint32)
            for g in range(nb):
                c0 = g * b
                n = min(b, cols - c0)
                amax = zero
                for t in range(n):
                    a = abs(x[r, c0 + t])
                    if not a < inf:  # NaN or inf: the caller falls back to the checked portable path
                        bad[r] = True
                    amax = max(amax, a)
                unit = _round_up(amax, u8[0], u8[1], u8[2], u8[3], u8[4], u8[5])
                down = np.float32(1.0) / unit  # a power of two: times it is the same bits as / unit
                best_err = zero
                best_s = zero
                prev_s = zero
                for i in range(nf):
                    f = factors[i]
                    alpha = amax if f == np.float32(1.0) else amax * f
                    s = _round_up(alpha / half_span, sd[0], sd[1], sd[2], sd[3], sd[4], sd[5])
                    div = inf if s == zero else s
                    if i > 0 and s == prev_s:
                        continue  # the same stored scale gives the same error: never strictly smaller
                    prev_s = s
                    if half_even:
                        xr = x[r, c0 : c0 + n]
                        for t in range(n):
                            xv = xr[t]
                            # clip then round (the same as round then clip: the bounds are integers);
                            # adding and taking off 1.5 * 2^23 rounds |y| <= 128 to the nearest, ties even
                            y = min(max(xv / div, qmin), qmax)
                            q = (y + magic) - magic
                            buf[t] = min(abs(xv - q * s) * down, limit)
                    else:
                        for t in range(n):
                            xv = x[r, c0 + t]
                            q = _code(xv / div, qmin, qmax, half_even)
                            buf[t] = min(abs(xv - q * s) * down, limit)
                    err = _block_error(buf, bits, n, mode, mant, ptab, w, c0, has_w)
                    if i == 0 or err < best_err:
                        best_err = err
                        best_s = s
                scales[r, g] = best_s
                div = inf if best_s == zero else best_s
                for t in range(n):
                    codes[r, c0 + t] = np.int8(_code(x[r, c0 + t] / div, qmin, qmax, half_even))


def supports(plan: Plan, shape: tuple[int, ...]) -> bool:
    """Whether :func:`mse_codes_and_scales` covers data of ``shape`` under ``plan``.

    One-level integer values in symmetric (not lookup) mode with round-up scales of any dtype, and
    1-D blocks along the last axis.
    """
    scheme = plan.scheme
    if numba is None or plan.two_level or plan.value.is_float or scheme.scale_rule != "round_up":
        return False
    if scheme.mode is not QuantMode.SYMMETRIC:  # lookup mode: codes index a table, not integers
        return False
    if not shape:
        return False
    dims = plan.block_dims(shape)
    return bool(dims) and all(d == 1 for d in dims[:-1])


def mse_codes_and_scales(
    x: np.ndarray,
    plan: Plan,
    factors: tuple[float, ...],
    norm: float,
    importance: np.ndarray | None = None,
    *,
    rounding: str = "half_even",
) -> tuple[np.ndarray, np.ndarray] | None:
    """int8 codes (``x``'s shape) and stored f32 scales (the scale grid) of an MSE search, or None.

    Parameters
    ----------
    x : numpy.ndarray
        float32 or float16 data, at least 1-d.
    plan : Plan
        The validated scheme (see :func:`supports`).
    factors : tuple of float
        The candidates as f32 multipliers of ``max|x|`` (``CalSpec.factors``), in order of preference.
    norm : float
        The error exponent ``p`` (``CalSpec.norm``).
    importance : numpy.ndarray, optional
        The f32 per-column weights as the invariant layer returns them (scaled to a maximum of 1).
    rounding : {"half_even", "half_away"}
        The integer rounding.

    Returns
    -------
    (codes, scales) or None
        None where the kernel does not apply (see :func:`supports`, other dtypes) or the data holds
        NaN or infinity: the caller then runs the portable path, which reports it.
    """
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float16):
        return None
    shape = tuple(int(n) for n in x.shape)
    if not supports(plan, shape):
        return None
    b = plan.block_dims(shape)[-1]
    x2 = np.ascontiguousarray(x.reshape(-1, shape[-1]), dtype=np.float32)
    rows, cols = x2.shape
    nb = -(-cols // b)
    mode, mant, ptab = norm_tables(norm)
    has_w = importance is not None
    w = np.ascontiguousarray(importance, dtype=np.float32) if has_w else np.ones(1, np.float32)
    codes = np.empty((rows, cols), dtype=np.int8)
    scales = np.empty((rows, nb), dtype=np.float32)
    bad = np.zeros(rows, dtype=np.bool_)
    with _LAUNCH:
        _search(
            x2,
            b,
            np.asarray(factors, dtype=np.float32),
            np.float32(plan.value.span / 2),
            np.float32(plan.qmin),
            np.float32(plan.qmax),
            rounding == "half_even",
            _round_up_tables(plan.scale_dtype),
            _round_up_tables(ScaleDtype.UE8M0),
            mode,
            mant,
            ptab,
            w,
            has_w,
            codes,
            scales,
            bad,
        )
    if bad.any():
        return None
    return codes.reshape(shape), scales.reshape((*shape[:-1], nb))
