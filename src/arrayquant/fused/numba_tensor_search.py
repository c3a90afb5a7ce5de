"""MSE calibration search of per-tensor integer schemes (``"q8s"``, ``"q4s:tensor:f16"``), fused with Numba.

The same f32 operations in the same order as the portable per-tensor search (``quantize._search_tensor``
with ``kernels/search.py``'s ``row_errors`` and ``select``), so codes and the stored scale are
identical bit for bit:

* ``amax = max|x|`` over the tensor; the error unit ``2^K`` is its UE8M0 round-up;
* per candidate ``alpha = amax * f``, stored scale ``round_up(alpha / (span / 2))`` (the steps of
  ``numba_search``), codes ``clip(round(x / s), qmin, qmax)``, ``deq = code * s``;
* element error ``e = min(|x - deq| * 2^-K, 255.99)``, ``e^p`` as in ``numba_search``, times the weight;
* each axis-0 row (the rest of the axes flattened row-major) summed by the pairwise tree zero-padded
  to a power of two, then the row sums by the same tree; 1-D data has one element per row, so its
  total is one tree over all elements, whose levels run in parallel here;
* a later candidate wins only with a strictly smaller total.

Rows run in parallel (``prange``) but every sum has one fixed order, so the result does not depend on
the thread count. No ``fastmath``: it would reorder and contract the f32 steps.
"""

from __future__ import annotations

import math

import numpy as np

from ..invariants import Plan
from ..scheme import QuantMode, ScaleDtype
from .numba_search import _LAUNCH, _LIMIT, _round_up_tables, norm_tables, numba

__all__ = ["mse_tensor_codes_and_scales", "supports"]

if numba is not None:
    from .numba_search import _code, _round_up

    _njit = numba.njit(cache=True, nogil=True)
    _pjit = numba.njit(cache=True, nogil=True, parallel=True)

    @_pjit
    def _absmax(x, bad):
        """``max|x|`` (exact in any order); rows holding NaN or inf are marked in ``bad``."""
        rows, cols = x.shape
        part = np.zeros(rows, dtype=np.float32)
        inf = np.float32(np.inf)
        for r in numba.prange(rows):
            m = np.float32(0.0)
            for t in range(cols):
                a = abs(x[r, t])
                if not a < inf:
                    bad[r] = True
                m = max(m, a)
            part[r] = m
        out = np.float32(0.0)
        for r in range(rows):
            out = max(out, part[r])
        return out

    @_njit
    def _candidate_scales(amax, factors, half_span, sd):
        """The stored scale of each candidate ``amax * f``, as ``Steps.scale_of`` rounds it."""
        nf = factors.shape[0]
        out = np.empty(nf, dtype=np.float32)
        for i in range(nf):
            alpha = amax * factors[i]  # the portable path multiplies even by 1.0 (exact)
            out[i] = _round_up(alpha / half_span, sd[0], sd[1], sd[2], sd[3], sd[4], sd[5])
        return out

    @_njit
    def _element(xv, s, div, qmin, qmax, half_even, down, limit):
        """``min(|x - deq| * 2^-K, 255.99)`` of one element under stored scale ``s``."""
        q = _code(xv / div, qmin, qmax, half_even)
        return min(abs(xv - q * s) * down, limit)

    @_pjit
    def _row_errors(x, scales, qmin, qmax, half_even, down, mode, mant, ptab, w, has_w, out):
        """``out[r, i]``: row ``r``'s tree-summed error under candidate ``i`` (rows in parallel)."""
        rows, cols = x.shape
        width = 1
        while width < cols:
            width *= 2
        limit = np.float32(_LIMIT)
        zero = np.float32(0.0)
        inf = np.float32(np.inf)
        nf = scales.shape[0]
        magic = np.float32(12582912.0)  # 1.5 * 2^23
        for r in numba.prange(rows):
            buf = np.zeros(width, dtype=np.float32)
            bits = buf.view(np.uint32)
            for i in range(nf):
                s = scales[i]
                if i > 0 and s == scales[i - 1]:
                    out[r, i] = out[r, i - 1]  # the same stored scale: the same error, never strictly smaller
                    continue
                div = inf if s == zero else s
                if half_even:
                    xr = x[r]
                    for t in range(cols):
                        xv = xr[t]
                        # clip then round (the same as round then clip: the bounds are integers); adding
                        # and taking off 1.5 * 2^23 rounds |y| <= 128 to the nearest, ties even; vectorises
                        y = min(max(xv / div, qmin), qmax)
                        q = (y + magic) - magic
                        buf[t] = min(abs(xv - q * s) * down, limit)
                else:
                    for t in range(cols):
                        buf[t] = _element(x[r, t], s, div, qmin, qmax, half_even, down, limit)
                if mode == 2:
                    for t in range(cols):
                        # e below 2^-126 (biased exponent 0) reads slot 0 and is then replaced by 0
                        u = bits[t]
                        k = max(np.int32(u >> 23), np.int32(1)) - np.int32(1)
                        v = mant[np.int32((u >> 9) & 0x3FFF)] * ptab[k]
                        buf[t] = v if buf[t] >= np.float32(2.0**-126) else zero
                elif mode == 1:
                    for t in range(cols):
                        buf[t] = buf[t] * buf[t]
                if has_w:
                    for t in range(cols):
                        buf[t] = buf[t] * w[t]
                for t in range(cols, width):
                    buf[t] = zero
                h = width // 2
                while h >= 1:
                    for t in range(h):
                        buf[t] = buf[t] + buf[t + h]
                    h //= 2
                out[r, i] = buf[0]

    @_pjit
    def _flat_error(x, s, qmin, qmax, half_even, down, mode, mant, ptab, w, has_w, buf):
        """1-D data: the tree sum of all element errors under ``s``; each tree level runs in parallel."""
        n = x.shape[0]
        width = buf.shape[0]
        limit = np.float32(_LIMIT)
        zero = np.float32(0.0)
        div = np.float32(np.inf) if s == zero else s
        bits = buf.view(np.uint32)
        for t in numba.prange(width):
            buf[t] = _element(x[t], s, div, qmin, qmax, half_even, down, limit) if t < n else zero
        if mode == 2:
            for t in numba.prange(n):
                u = bits[t]
                k = max(np.int32(u >> 23), np.int32(1)) - np.int32(1)
                v = mant[np.int32((u >> 9) & 0x3FFF)] * ptab[k]
                buf[t] = v if buf[t] >= np.float32(2.0**-126) else zero
        elif mode == 1:
            for t in numba.prange(n):
                buf[t] = buf[t] * buf[t]
        if has_w:
            for t in numba.prange(n):
                buf[t] = buf[t] * w[t]
        h = width // 2
        while h >= 1:
            for t in numba.prange(h):
                buf[t] = buf[t] + buf[t + h]
            h //= 2
        return buf[0]

    @_njit
    def _tree(v):
        """The pairwise tree sum of ``v`` zero-padded to a power of two (``calibrate._pairwise_sum``)."""
        n = v.shape[0]
        width = 1
        while width < n:
            width *= 2
        buf = np.zeros(width, dtype=np.float32)
        buf[:n] = v
        h = width // 2
        while h >= 1:
            for t in range(h):
                buf[t] = buf[t] + buf[t + h]
            h //= 2
        return buf[0]

    @_pjit
    def _codes(x, s, qmin, qmax, half_even, codes):
        rows, cols = x.shape
        div = np.float32(np.inf) if s == np.float32(0.0) else s
        for r in numba.prange(rows):
            for t in range(cols):
                codes[r, t] = np.int8(_code(x[r, t] / div, qmin, qmax, half_even))


def supports(plan: Plan, shape: tuple[int, ...]) -> bool:
    """Whether :func:`mse_tensor_codes_and_scales` covers data of ``shape`` under ``plan``.

    Per-tensor (no blocks) one-level integer values in symmetric (not lookup) mode with round-up
    scales of any dtype, data of any rank from 1.
    """
    scheme = plan.scheme
    if numba is None or plan.two_level or plan.value.is_float or scheme.scale_rule != "round_up":
        return False
    if scheme.mode is not QuantMode.SYMMETRIC:  # lookup mode: codes index a table, not integers
        return False
    return bool(shape) and not plan.block_dims(shape)


def mse_tensor_codes_and_scales(
    x: np.ndarray,
    plan: Plan,
    factors: tuple[float, ...],
    norm: float,
    importance: np.ndarray | None = None,
    *,
    rounding: str = "half_even",
) -> tuple[np.ndarray, np.ndarray, None] | None:
    """int8 codes (``x``'s shape), the stored f32 scale (shape ``(1,)``) and None, or None.

    Parameters
    ----------
    x : numpy.ndarray
        float32 or float16 data, at least 1-d.
    plan : Plan
        The validated per-tensor scheme (see :func:`supports`).
    factors : tuple of float
        The candidates as f32 multipliers of ``max|x|`` (``CalSpec.factors``), in order of preference.
    norm : float
        The error exponent ``p`` (``CalSpec.norm``).
    importance : numpy.ndarray, optional
        The f32 per-column (last-axis) weights as the invariant layer returns them.
    rounding : {"half_even", "half_away"}
        The integer rounding.

    Returns
    -------
    (codes, scale, None) or None
        None where the kernel does not apply (see :func:`supports`, other dtypes or namespaces) or
        the data holds NaN or infinity: the caller then runs the portable path, which reports it.
    """
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float16):
        return None
    shape = tuple(int(n) for n in x.shape)
    if not supports(plan, shape):
        return None
    rows = shape[0]
    cols = math.prod(shape[1:])
    x2 = np.ascontiguousarray(x.reshape(rows, cols), dtype=np.float32)
    mode, mant, ptab = norm_tables(norm)
    has_w = importance is not None
    if has_w:
        imp = np.ascontiguousarray(importance, dtype=np.float32).reshape(-1)
        # per element: its last-axis column's weight (1-D data: the element's own)
        w = imp if len(shape) == 1 else np.tile(imp, cols // shape[-1])
    else:
        w = np.ones(1, np.float32)
    half_even = rounding == "half_even"
    qmin, qmax = np.float32(plan.qmin), np.float32(plan.qmax)
    bad = np.zeros(rows, dtype=np.bool_)
    with _LAUNCH:
        amax = np.float32(_absmax(x2, bad))  # numba hands back a Python float: f32 again for the f32 steps
        if bad.any():
            return None
        unit = np.float32(_round_up(amax, *_round_up_tables(ScaleDtype.UE8M0)))
        down = np.float32(np.float32(1.0) / unit)  # a power of two: times it is the same bits as / unit
        scales = _candidate_scales(
            amax,
            np.asarray(factors, dtype=np.float32),
            np.float32(plan.value.span / 2),
            _round_up_tables(plan.scale_dtype),
        )
        if len(shape) == 1:
            width = 1 << max(rows - 1, 0).bit_length()
            buf = np.empty(width, dtype=np.float32)
            best_i, best = 0, None
            for i in range(len(scales)):
                if i > 0 and scales[i] == scales[i - 1]:
                    continue
                err = np.float32(
                    _flat_error(x2[:, 0], scales[i], qmin, qmax, half_even, down, mode, mant, ptab, w, has_w, buf)
                )
                if best is None or err < best:
                    best_i, best = i, err
        else:
            errs = np.empty((rows, len(scales)), dtype=np.float32)
            _row_errors(x2, scales, qmin, qmax, half_even, down, mode, mant, ptab, w, has_w, errs)
            best_i, best = 0, None
            for i in range(len(scales)):
                total = np.float32(_tree(np.ascontiguousarray(errs[:, i])))
                if best is None or total < best:
                    best_i, best = i, total
        s = scales[best_i]
        codes = np.empty((rows, cols), dtype=np.int8)
        _codes(x2, s, qmin, qmax, half_even, codes)
    return codes.reshape(shape), np.asarray([s], dtype=np.float32), None
