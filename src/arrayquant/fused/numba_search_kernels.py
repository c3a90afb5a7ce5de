"""The jitted MSE calibration search (driven by :mod:`.numba_search`): one candidate error routine, its kernels.

The same f32 operations in the same order as the portable path (``kernels/search.py`` driven by
``blockwork.Steps``, ``kernels/minifloat.py``, ``quantize._search_tensor``), so codes, stored scales
and the two-level global are identical bit for bit, not close:

* per block ``amax = max|x|``; the error unit ``2^K`` is its UE8M0 round-up;
* per candidate ``alpha = amax * f`` (``f`` the f32 factor), the stored scale is the round-up of
  ``alpha / (span / 2)`` onto the scale dtype (the table steps of ``kernels/roundup.py``), the OCP
  power of two (``kernels/qparams.py``'s ``_ocp_scales``, then rounded up), or, two-level,
  ``round_up((alpha / (span / 2)) / g)`` under MinMax's global ``g`` with the effective scale
  ``min(g * stored, F32_MAX)``;
* integer codes ``clip(round(x / eff), qmin, qmax)``, ``deq = code * eff``; minifloat codes
  ``encode(min(|x / eff|, max))`` with the sign of ``x`` (E2M1 by the seven midpoint comparisons,
  E4M3/E5M2 by the binade count and ``t = a * 2^(mbits - emin - j)`` rounded half to even),
  ``deq = table[code] * eff``; a zero scale gives code 0;
* ``e = min(|x - deq| / 2^K, 255.99)`` (times ``2^-K``: exact, the same bits as the division; for
  minifloats ``| |x| - |deq| |``, the same bits: ``deq`` has ``x``'s sign), ``e^p`` as ``e``,
  ``e * e`` or the table product ``M[j] * P[k]`` whose binade ``k`` and top fraction bits ``j``
  are read from ``e``'s bits (what the portable path settles by comparisons), times the weight;
* the block's errors laid out row-major (element ``(i, j)`` of a ``b0 x b1`` block at
  ``i * b1 + j``, the gaps of a partial block 0), summed by the pairwise tree zero-padded to a
  power of two; per tensor, each axis-0 row by that tree, then the row sums by it (1-D data: one
  tree over all elements, whose levels run in parallel);
* a later candidate wins only with a strictly smaller error.

Block rows (tensor rows) run in parallel (``prange``); each block's work is sequential and fixed,
so the result does not depend on the thread count. No ``fastmath``: it would reorder and contract
the f32 steps. Every kernel is a (parallel, serial) pair for :func:`.numba_launch.launch`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..scheme import F32_MAX
from .numba_launch import numba, parallel_and_serial

__all__ = ["FLOAT", "INT", "LIMIT"]

LIMIT = float(np.float32(255.99))  # the largest element error, in units of 2^K
# the value encoders of the block search kernels (_compile), a compile-time constant each
INT, FLOAT = 0, 1

if numba is not None:
    import numba.extending

    _njit = numba.njit(cache=True, nogil=True)
    # the hot helpers, inlined in numba's IR (LLVM leaves some out of line: a call per candidate)
    _inline = numba.njit(cache=True, nogil=True, inline="always")

    @_inline
    def _grid_up(s, t):
        """One f32 scale rounded up onto the grid of the tables ``t`` (``numba_search.round_up_tables``):
        the steps of ``round_up_scales``."""
        zero = np.float32(0.0)
        if t[5, 2] != zero:
            return s + zero
        gmax = t[5, 0]
        a = min(s, gmax)
        # searchsorted(thr, a, side="right"): how many thresholds are <= a
        lo, hi = 0, int(t[5, 3])
        while lo < hi:
            mid = (lo + hi) // 2
            if t[0, mid] <= a:
                lo = mid + 1
            else:
                hi = mid
        j = lo
        n = np.float32(math.ceil((a * t[1, j]) * t[2, j]))
        r = (n * t[3, j]) * t[4, j]
        r = min(r, gmax)
        if t[5, 1] > zero:
            r = max(r, t[5, 1])
        return r + zero

    @_inline
    def _scan(x, r, c0, n):
        """``(max|x|, all finite)`` of ``x[r, c0 : c0 + n]``: NaN or inf sends the caller to the portable path.

        The routines here take (row, first column, count) rather than slices: a slice per call in
        the parallel loop costs reference counting on the shared array."""
        inf = np.float32(np.inf)
        amax = np.float32(0.0)
        ok = True
        c = np.uint64(c0)
        for t in range(n):
            a = abs(x[r, c + np.uint64(t)])
            if not a < inf:
                ok = False
            amax = max(amax, a)
        return amax, ok

    @_inline
    def _scale(alpha, sc, sd, u8):
        """(stored, effective) scale of candidate ``alpha``; ``sc`` = (span / 2, global, two-level, ocp, ocp factor).

        Round-up ``alpha / (span / 2)``, over the global two-level (effective ``min(g * s, F32_MAX)``),
        or the OCP power of two rounded up.
        """
        if sc[3]:
            up = _grid_up(alpha, u8)
            fl = up if up == alpha else up * np.float32(0.5)
            s = _grid_up(fl * sc[4], sd)
        elif sc[2]:
            s = _grid_up((alpha / sc[0]) / sc[1], sd)
        else:
            s = _grid_up(alpha / sc[0], sd)
        return s, (min(sc[1] * s, np.float32(F32_MAX)) if sc[2] else s)

    @_inline
    def _powers(buf, bits, lo, hi, mode, mant, ptab, w, woff, has_w):
        """Positions ``lo .. hi - 1`` raised to the norm (``mode`` 0: as is, 1: squared, 2: the exact
        table power), then weighted by ``w[woff + t]``."""
        zero = np.float32(0.0)
        tiny = np.float32(2.0**-126)
        if mode == 2:
            for t in range(lo, hi):
                # branch-free so that the loop vectorises (gathers): e below 2^-126 (zero,
                # subnormal; biased exponent 0) reads slot 0 and is then replaced by 0
                u = bits[t]
                k = max(np.int32(u >> 23), np.int32(1)) - np.int32(1)
                v = mant[np.int32((u >> 9) & 0x3FFF)] * ptab[k]
                buf[t] = v if buf[t] >= tiny else zero
        elif mode == 1:
            for t in range(lo, hi):
                buf[t] = buf[t] * buf[t]
        if has_w:
            for t in range(lo, hi):
                buf[t] = buf[t] * w[woff + t]

    @_inline
    def _tree(buf):
        """The pairwise tree sum of ``buf`` (a power of two long; the tree of the portable search)."""
        h = buf.shape[0] // 2
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

    # The value encoders: element errors and codes of a row segment x[r, c0 : c0 + n]. ``vc`` holds
    # an encoder's scalars, ``tab`` its table rows (built in numba_search). Unsigned indices: a
    # signed x[r, c0 + t] wraps negative indices (c0 is not known to be >= 0), a select per element
    # that stops vectorising; a slice costs reference counting.

    @_inline
    def _int_errors(x, r, c0, n, out, o0, s, div, vc, tab, down):
        """``out[o0 + t] = min(|x - deq| * 2^-K, 255.99)`` of ``x[r, c0 + t]``, ``t < n``, under scale ``s``;
        ``vc`` = (qmin, qmax, half even)."""
        qmin, qmax, half_even = vc
        limit = np.float32(LIMIT)
        c = np.uint64(c0)
        o = np.uint64(o0)
        if half_even:
            magic = np.float32(12582912.0)  # 1.5 * 2^23
            for t in range(n):
                xv = x[r, c + np.uint64(t)]
                # clip then round (the same as round then clip: the bounds are integers); adding
                # and taking off 1.5 * 2^23 rounds |y| <= 128 to the nearest, ties even; vectorises
                y = min(max(xv / div, qmin), qmax)
                q = (y + magic) - magic
                out[o + np.uint64(t)] = min(abs(xv - q * s) * down, limit)
        else:
            for t in range(n):
                xv = x[r, c + np.uint64(t)]
                out[o + np.uint64(t)] = min(abs(xv - _code(xv / div, qmin, qmax, half_even) * s) * down, limit)

    @_inline
    def _int_codes(x, r, c0, n, out, s, div, vc, tab):
        """int8 codes ``out[r, c0 + t]`` of ``x[r, c0 + t]`` under scale ``s`` (``div``: ``s``, or inf for
        a zero scale)."""
        c = np.uint64(c0)
        for t in range(n):
            u = c + np.uint64(t)
            out[r, u] = np.int8(_code(x[r, u] / div, vc[0], vc[1], vc[2]))

    @_inline
    def _magnitude(a, vc, tab):
        """The minifloat magnitude code of ``a = min(|y|, max)`` (``kernels/minifloat.py``'s encode)."""
        e2m1, step, nb = vc[0], vc[2], vc[4]
        if e2m1:
            c = 0
            for k in range(7):
                if tab[1, k] != np.float32(0.0):
                    c += 1 if a >= tab[0, k] else 0
                else:
                    c += 1 if a > tab[0, k] else 0
            return c
        j = 0
        for k in range(nb):
            j += 1 if a >= tab[2, k] else 0
        t = a * tab[3, j]
        magic = np.float32(12582912.0)  # 1.5 * 2^23: t <= 2^(mbits + 1), rounded half to even
        n = (t + magic) - magic
        return int(n) + j * step

    @_inline
    def _float_errors(x, r, c0, n, out, o0, eff, div, vc, tab, down):
        """The minifloat counterpart of :func:`_int_errors`; ``vc`` = (E2M1?, max, 2^mbits, sign bit,
        binade count), ``tab`` the rows E2M1 midpoints, inclusive?, binade thresholds, binade
        scales, magnitudes."""
        limit = np.float32(LIMIT)
        fmax = vc[1]
        c = np.uint64(c0)
        o = np.uint64(o0)
        for t in range(n):
            ax = abs(x[r, c + np.uint64(t)])
            d = tab[4, _magnitude(min(ax / div, fmax), vc, tab)] * eff
            out[o + np.uint64(t)] = min(abs(ax - d) * down, limit)

    @_inline
    def _float_codes(x, r, c0, n, out, eff, div, vc, tab):
        """uint8 minifloat codes (sign in the field's top bit) of a row segment; a zero scale gives code 0."""
        c = np.uint64(c0)
        for t in range(n):
            u = c + np.uint64(t)
            xv = x[r, u]
            if eff == np.float32(0.0):
                out[r, u] = np.uint8(0)
                continue
            m = _magnitude(min(abs(xv) / div, vc[1]), vc, tab)
            # the sign of x / eff is x's (eff > 0), -0.0 included
            neg = 1 if np.float32(np.copysign(np.float32(1.0), xv)) < np.float32(0.0) else 0
            out[r, u] = np.uint8(m | (neg << vc[3]))

    # stubs, typed and compiled by the overloads below (the encoder ``kind`` a compile-time constant)
    def _error(kind, x, r0, c0, n0, n1, b1, eff, div, down, vc, tab, buf, bits, mode, mant, ptab, w, has_w):
        """The error of one candidate on the ``n0 x n1`` block at ``(r0, c0)`` under encoder ``kind``."""

    def _codes(kind, x, r, c0, n, out, eff, div, vc, tab):
        """The codes of encoder ``kind`` of a row segment under the chosen scale."""

    @numba.extending.overload(_error, prefer_literal=True, inline="always")
    def _error_of(kind, x, r0, c0, n0, n1, b1, eff, div, down, vc, tab, buf, bits, mode, mant, ptab, w, has_w):
        """The candidate error routine, with the encoder ``kind`` names (one is compiled in)."""
        errors = _int_errors if getattr(kind, "literal_value", None) == INT else _float_errors

        def error(kind, x, r0, c0, n0, n1, b1, eff, div, down, vc, tab, buf, bits, mode, mant, ptab, w, has_w):
            if n0 == 1:  # one row: a contiguous segment at 0, weights w[c0 + t], the rest of the tree 0
                errors(x, r0, c0, n1, buf, 0, eff, div, vc, tab, down)
                for t in range(n1, buf.shape[0]):
                    buf[t] = np.float32(0.0)
                _powers(buf, bits, 0, n1, mode, mant, ptab, w, c0, has_w)
                return _tree(buf)
            # row i at positions i * b1 .., weights w[c0 + j]; the gaps (right of short rows, past
            # the block) 0 again: the last tree overwrote them
            for i in range(n0):
                o = i * b1
                errors(x, r0 + i, c0, n1, buf, o, eff, div, vc, tab, down)
                for t in range(o + n1, o + b1 if i < n0 - 1 else buf.shape[0]):
                    buf[t] = np.float32(0.0)
            if has_w:
                for i in range(n0):
                    o = i * b1
                    _powers(buf, bits, o, o + n1, mode, mant, ptab, w, c0 - o, True)
            else:  # one pass: the gaps' powers are 0
                _powers(buf, bits, 0, (n0 - 1) * b1 + n1, mode, mant, ptab, w, 0, False)
            return _tree(buf)

        return error

    @numba.extending.overload(_codes, prefer_literal=True, inline="always")
    def _codes_of(kind, x, r, c0, n, out, eff, div, vc, tab):
        codes = _int_codes if getattr(kind, "literal_value", None) == INT else _float_codes
        return lambda kind, x, r, c0, n, out, eff, div, vc, tab: codes(x, r, c0, n, out, eff, div, vc, tab)

    def _compile(kind: int) -> tuple[Any, Any]:
        """The block search kernel of encoder ``kind`` (:data:`INT`, :data:`FLOAT`), for ``launch``.

        ``x`` is 2-d, cut into ``b0 x b1`` blocks (``b0 = 1``: blocks along rows). ``kind`` is a
        closure constant: each encoder is its own compilation and cache entry.
        """

        def search(x, b0, b1, factors, sc, sd, u8, vc, tab, mode, mant, ptab, w, has_w, codes, scales, bad):
            rows, cols = x.shape
            g0 = (rows + b0 - 1) // b0
            g1 = (cols + b1 - 1) // b1
            width = 1
            while width < b0 * b1:
                width *= 2
            zero = np.float32(0.0)
            inf = np.float32(np.inf)
            for gr in numba.prange(g0):
                buf = np.zeros(width, dtype=np.float32)
                bits = buf.view(np.uint32)
                r0 = gr * b0
                n0 = min(b0, rows - r0)
                for gc in range(g1):
                    c0 = gc * b1
                    n1 = min(b1, cols - c0)
                    amax = zero
                    for i in range(n0):
                        a, ok = _scan(x, r0 + i, c0, n1)
                        if not ok:  # NaN or inf: the caller falls back to the checked portable path
                            bad[gr] = True
                        amax = max(amax, a)
                    down = np.float32(1.0) / _grid_up(amax, u8)  # 2^-K: times it is the same bits as / 2^K
                    best_err = zero
                    best_s = zero
                    best_eff = zero
                    prev_s = zero
                    for k in range(factors.shape[0]):
                        s, eff = _scale(amax * factors[k], sc, sd, u8)
                        if k > 0 and s == prev_s:
                            continue  # the same stored scale gives the same error: never strictly smaller
                        prev_s = s
                        div = inf if eff == zero else eff
                        err = _error(
                            kind, x, r0, c0, n0, n1, b1, eff, div, down, vc, tab, buf, bits, mode, mant, ptab, w, has_w
                        )
                        if k == 0 or err < best_err:
                            best_err = err
                            best_s = s
                            best_eff = eff
                    scales[gr, gc] = best_s
                    div = inf if best_eff == zero else best_eff
                    for i in range(n0):
                        _codes(kind, x, r0 + i, c0, n1, codes, best_eff, div, vc, tab)

        return parallel_and_serial(search)

    # the per-tensor search: the stored scales of the candidates are the same for every row

    def _row_errors(x, scales, vc, down, mode, mant, ptab, w, has_w, out):
        """``out[r, i]``: row ``r``'s tree-summed error under candidate ``i``."""
        rows, cols = x.shape
        width = 1
        while width < cols:
            width *= 2
        none = np.zeros((1, 1), np.float32)
        for r in numba.prange(rows):
            buf = np.zeros(width, dtype=np.float32)
            bits = buf.view(np.uint32)
            for i in range(scales.shape[0]):
                s = scales[i]
                if i > 0 and s == scales[i - 1]:
                    out[r, i] = out[r, i - 1]  # the same stored scale: the same error, never strictly smaller
                    continue
                div = np.float32(np.inf) if s == np.float32(0.0) else s
                out[r, i] = _error(
                    INT, x, r, 0, 1, cols, cols, s, div, down, vc, none, buf, bits, mode, mant, ptab, w, has_w
                )

    _CHUNK = 4096

    def _flat_error(x, s, vc, down, mode, mant, ptab, w, has_w, buf):
        """1-D data (``x`` one row): the tree sum of all element errors under ``s``; chunks and tree
        levels run in parallel."""
        n = x.shape[1]
        width = buf.shape[0]
        div = np.float32(np.inf) if s == np.float32(0.0) else s
        bits = buf.view(np.uint32)
        none = np.zeros((1, 1), np.float32)
        for c in numba.prange((width + _CHUNK - 1) // _CHUNK):
            lo = c * _CHUNK
            hi = min(lo + _CHUNK, n)
            if lo < hi:
                _int_errors(x, 0, lo, hi - lo, buf, lo, s, div, vc, none, down)
                _powers(buf, bits, lo, hi, mode, mant, ptab, w, 0, has_w)
            for t in range(max(lo, n), min(lo + _CHUNK, width)):
                buf[t] = np.float32(0.0)
        h = width // 2
        while h >= 1:
            for t in numba.prange(h):
                buf[t] = buf[t] + buf[t + h]
            h //= 2
        return buf[0]

    def _tensor_codes(x, s, vc, codes):
        div = np.float32(np.inf) if s == np.float32(0.0) else s
        none = np.zeros((1, 1), np.float32)
        for r in numba.prange(x.shape[0]):
            _int_codes(x, r, 0, x.shape[1], codes, s, div, vc, none)

    SEARCH = {INT: _compile(INT), FLOAT: _compile(FLOAT)}
    ROW_ERRORS, FLAT_ERROR, TENSOR_CODES = (parallel_and_serial(f) for f in (_row_errors, _flat_error, _tensor_codes))

    @_njit
    def tree_sum(v):
        """The pairwise tree sum of ``v`` zero-padded to a power of two (``calibrate.pairwise_sum``)."""
        width = 1
        while width < v.shape[0]:
            width *= 2
        buf = np.zeros(width, dtype=np.float32)
        buf[: v.shape[0]] = v
        return _tree(buf)

    @_njit
    def candidate_scales(amax, factors, sc, sd, u8):
        """The stored scale of each candidate ``amax * f``, as ``Steps.scale_of`` rounds it."""
        out = np.empty(factors.shape[0], dtype=np.float32)
        for i in range(factors.shape[0]):
            out[i] = _scale(amax * factors[i], sc, sd, u8)[0]  # the portable path multiplies even by 1.0
        return out

    @_njit
    def error_unit(amax, u8):
        """``2^-K``, ``2^K`` the UE8M0 round-up of ``amax``."""
        return np.float32(1.0) / _grid_up(amax, u8)
