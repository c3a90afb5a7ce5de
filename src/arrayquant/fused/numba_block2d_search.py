"""MSE calibration search of one-level integer schemes with 2-D blocks on 2-D data, fused in Numba.

The companion of :mod:`.numba_search` (blocks along the last axis only) for blocks such as
``block8x32``: the same f32 steps in the same order as the portable path, so codes and stored
scales are identical bit for bit. What differs is the block's layout in the error sum: the
portable path zero-pads the data to whole blocks on both axes, lays each ``b0 x b1`` block out
row-major (element ``(i, j)`` at ``i * b1 + j``) and sums it with the pairwise tree zero-padded to
a power of two. Here each block's errors are written at those same positions, padding positions
(past the bottom or right edge) hold 0, and the same tree runs, so every partial sum is the same.

Block rows run in parallel (``prange``); each block's work is sequential and fixed, so the result
does not depend on the thread count. No ``fastmath``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..invariants import Plan
from ..scheme import QuantMode, ScaleDtype
from .numba_search import _LAUNCH, _LIMIT, _round_up_tables, norm_tables, numba

__all__ = ["mse_block2d_codes_and_scales", "supports"]


if numba is not None:
    from .numba_search import _code, _round_up

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _search2d(
        x,
        b0,
        b1,
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
        g0 = (rows + b0 - 1) // b0
        g1 = (cols + b1 - 1) // b1
        size = b0 * b1
        width = 1
        while width < size:
            width *= 2
        zero = np.float32(0.0)
        one = np.float32(1.0)
        inf = np.float32(np.inf)
        limit = np.float32(_LIMIT)
        tiny = np.float32(2.0**-126)
        nf = factors.shape[0]
        magic = np.float32(12582912.0)  # 1.5 * 2^23
        for gr in numba.prange(g0):
            buf = np.zeros(width, dtype=np.float32)
            bits = buf.view(np.uint32)
            wbuf = np.zeros(width, dtype=np.float32)
            r0 = gr * b0
            n0 = min(b0, rows - r0)
            for gc in range(g1):
                c0 = gc * b1
                n1 = min(b1, cols - c0)
                amax = zero
                for i in range(n0):
                    for j in range(n1):
                        a = abs(x[r0 + i, c0 + j])
                        if not a < inf:  # NaN or inf: the caller falls back to the checked portable path
                            bad[gr] = True
                        amax = max(amax, a)
                if has_w:
                    # the weight of each block position; padding weighs 0 (its error is 0 anyway)
                    for t in range(width):
                        wbuf[t] = zero
                    for i in range(n0):
                        for j in range(n1):
                            wbuf[i * b1 + j] = w[c0 + j]
                unit = _round_up(amax, u8[0], u8[1], u8[2], u8[3], u8[4], u8[5])
                down = one / unit  # a power of two: times it is the same bits as / unit
                best_err = zero
                best_s = zero
                prev_s = zero
                for k in range(nf):
                    f = factors[k]
                    alpha = amax if f == one else amax * f
                    s = _round_up(alpha / half_span, sd[0], sd[1], sd[2], sd[3], sd[4], sd[5])
                    div = inf if s == zero else s
                    if k > 0 and s == prev_s:
                        continue  # the same stored scale gives the same error: never strictly smaller
                    prev_s = s
                    if n0 < b0 or n1 < b1 or size < width:
                        for t in range(width):
                            buf[t] = zero
                    for i in range(n0):
                        xr = x[r0 + i, c0 : c0 + n1]
                        base = i * b1
                        if half_even:
                            for j in range(n1):
                                xv = xr[j]
                                # clip then round (the bounds are integers); adding and taking off
                                # 1.5 * 2^23 rounds |y| <= 128 to the nearest, ties even
                                y = min(max(xv / div, qmin), qmax)
                                q = (y + magic) - magic
                                buf[base + j] = min(abs(xv - q * s) * down, limit)
                        else:
                            for j in range(n1):
                                xv = xr[j]
                                q = _code(xv / div, qmin, qmax, half_even)
                                buf[base + j] = min(abs(xv - q * s) * down, limit)
                    if mode == 2:
                        for t in range(width):
                            # e below 2^-126 (zero, subnormal, padding) reads slot 0 and is replaced by 0
                            u = bits[t]
                            kk = max(np.int32(u >> 23), np.int32(1)) - np.int32(1)
                            v = mant[np.int32((u >> 9) & 0x3FFF)] * ptab[kk]
                            buf[t] = v if buf[t] >= tiny else zero
                    elif mode == 1:
                        for t in range(width):
                            buf[t] = buf[t] * buf[t]
                    if has_w:
                        for t in range(width):
                            buf[t] = buf[t] * wbuf[t]
                    h = width // 2
                    while h >= 1:
                        for t in range(h):
                            buf[t] = buf[t] + buf[t + h]
                        h //= 2
                    err = buf[0]
                    if k == 0 or err < best_err:
                        best_err = err
                        best_s = s
                scales[gr, gc] = best_s
                div = inf if best_s == zero else best_s
                for i in range(n0):
                    for j in range(n1):
                        codes[r0 + i, c0 + j] = np.int8(_code(x[r0 + i, c0 + j] / div, qmin, qmax, half_even))


def supports(plan: Plan, shape: tuple[int, ...]) -> bool:
    """Whether :func:`mse_block2d_codes_and_scales` covers data of ``shape`` under ``plan``.

    One-level integer values in symmetric (not lookup) mode with round-up scales of any dtype, on
    2-D data whose blocks span more than one row (one-row blocks are :mod:`.numba_search`'s).
    """
    scheme = plan.scheme
    if numba is None or plan.two_level or plan.value.is_float or scheme.scale_rule != "round_up":
        return False
    if scheme.mode is not QuantMode.SYMMETRIC:  # lookup mode: codes index a table, not integers
        return False
    if len(shape) != 2:
        return False
    dims = plan.block_dims(shape)
    return len(dims) == 2 and dims[0] > 1


def mse_block2d_codes_and_scales(
    x: np.ndarray,
    plan: Plan,
    factors: tuple[float, ...],
    norm: float,
    importance: np.ndarray | None = None,
    *,
    rounding: str = "half_even",
) -> tuple[np.ndarray, np.ndarray, None] | None:
    """int8 codes (``x``'s shape), stored f32 scales (the scale grid) and no global, or None.

    Parameters
    ----------
    x : numpy.ndarray
        2-d float32 or float16 data.
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
    (codes, scales, None) or None
        None where the kernel does not apply (see :func:`supports`, other dtypes) or the data holds
        NaN or infinity: the caller then runs the portable path, which reports it.
    """
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float16):
        return None
    shape = tuple(int(n) for n in x.shape)
    if not supports(plan, shape):
        return None
    b0, b1 = plan.block_dims(shape)
    x2 = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = shape
    g0, g1 = -(-rows // b0), -(-cols // b1)
    mode: int
    mode, mant, ptab = norm_tables(norm)
    has_w = importance is not None
    w = np.ascontiguousarray(importance, dtype=np.float32) if has_w else np.ones(1, np.float32)
    codes = np.empty((rows, cols), dtype=np.int8)
    scales = np.empty((g0, g1), dtype=np.float32)
    bad = np.zeros(g0, dtype=np.bool_)
    kernel: Any = _search2d
    with _LAUNCH:
        kernel(
            x2,
            b0,
            b1,
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
    return codes, scales, None
