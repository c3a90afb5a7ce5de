"""The affine modes fused in Numba: zero point (``x = s * (q - z)``) and offset (``x = d * q + m``).

Quantize reads the data once and writes the stored values, scales and zero points (or offsets)
once; dequantize reads the stored values once and writes f32 once. The f32 steps are those of
the portable path (``affinework.AffineSteps`` driving ``kernels/affine.py``), in the same order,
so every bit is the same:

* the range ``(lo, hi)`` of a block (per tensor: of the whole tensor) is the least and largest
  order key ``b ^ ((b >> 31) & 0x7FFFFFFF)`` of the f32 bit patterns ``b`` (signed: integer order
  is f32 order, so the reduction vectorises); a key at or past infinity's marks NaN or infinity,
  and the caller then runs the portable path, which reports where;
* zero point: ``s = round_up((max(hi, 0) - min(lo, 0)) / (qmax - qmin))`` (the difference, or
  ``hi / n - lo / n`` where it passes the f32 maximum), ``z = round_half_even(clip(qmin - min(lo,
  0) / s, qmin, qmax))`` (0 where ``s`` is 0); codes ``clip(round(x / s), qmin - z, qmax - z) + z``;
* offset: ``m = lo`` rounded down onto the scale dtype (``-round_up(|lo|)`` below 0), ``d =
  round_up((hi - m) / qmax)``; codes ``clip(round((x - m) / d), 0, qmax)``;
* a zero scale divides by infinity (code ``z``, or 0); rounding half to even adds and takes off
  ``1.5 * 2^23``, half away from zero then moves exact ties. Clipping to the integer bounds before
  rounding gives the portable path's codes (it rounds, adds ``z``, then clips);
* the round-up and round-down are ``numba_quantize.round_onto`` (``kernels/roundup.py``'s rule,
  every scale dtype); codes are packed as one little-endian bit stream per line (field ``k`` in
  stream bits ``[k*bits, (k+1)*bits)``, any width 1..8), zero-padded to whole words;
* dequantize: ``float(q - z) * s`` (the difference in integers), or ``float(q) * d + m`` (product
  rounded, then the sum); clipped to ``±F32_MAX`` where the portable path's ``may_overflow`` says
  some code could pass it (it decides per row chunk; clipping a finite value below the maximum
  changes nothing, so deciding once over the whole grid gives the same bits).

Rows run in parallel (``prange``); each row's work is sequential and fixed, so the result does
not depend on the thread count. No ``fastmath``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..invariants import Plan
from ..kernels.affine import may_overflow
from ..scheme import F32_MAX, QuantMode
from ..storage import values_layout
from .numba_dequantize import as_bytes
from .numba_launch import launch, numba, parallel_and_serial
from .numba_quantize import scale_grid

__all__ = ["dequantize", "quantize", "supports"]

_KEY_TOP = 0x7F800000  # order keys from here up: +inf or NaN
_KEY_BOTTOM = -0x7F800001  # the key of -inf (0x807FFFFF as int32); at or below: -inf or NaN
_ROUNDINGS = ("half_even", "half_away")

if numba is not None:
    from .numba_quantize import pack_row, round_onto

    _njit = numba.njit(cache=True, nogil=True)
    # inlined in numba's IR: a call to a compiled helper that takes arrays counts their references
    # (atomic operations) on every call, which costs more than a block's work
    _inline = numba.njit(cache=True, nogil=True, inline="always")

    @_inline
    def _key(i):
        """The order key of f32 bits ``i`` (int32): negative patterns have their magnitude bits flipped."""
        return np.int32(i ^ ((i >> np.int32(31)) & np.int32(0x7FFFFFFF)))

    @_inline
    def _from_key(k):
        """The f32 whose order key is ``k`` (the key map is its own inverse)."""
        return np.int32(k ^ ((k >> np.int32(31)) & np.int32(0x7FFFFFFF))).view(np.float32)

    @_inline
    def _key_range(kr, c0, n):
        """The least and largest order key of ``kr[c0:c0+n]`` (unsigned indices: no wraparound checks)."""
        lo = np.uint64(c0)
        kmin = np.int32(0x7FFFFFFF)
        kmax = np.int32(-0x80000000)
        for t in range(lo, lo + np.uint64(n)):
            k = _key(kr[t])
            kmin = min(kmin, k)
            kmax = max(kmax, k)
        return kmin, kmax

    @_inline
    def _spread(hi, lo, n):
        """``(hi - lo) / n``, or ``hi / n - lo / n`` where the difference passes the f32 maximum."""
        diff = hi - lo
        if np.isinf(diff):
            return hi / n - lo / n
        return diff / n

    @_inline
    def _params(lo, hi, enc, sd):
        """Stored ``(scale, zero point or offset)`` of a finite range, as ``affine_params`` gives them."""
        offset, qmin, qmax, _ = enc
        zero = np.float32(0.0)
        if offset:
            m = -round_onto(abs(lo), sd, True) if lo < zero else round_onto(abs(lo), sd, False)
            return round_onto(_spread(hi, m, qmax), sd, True), m
        lo0 = min(lo, zero)
        hi0 = max(hi, zero)
        s = round_onto(_spread(hi0, lo0, qmax - qmin), sd, True)
        if s == zero:
            return s, zero
        magic = np.float32(12582912.0)  # 1.5 * 2^23: |z| <= 2^22 rounds to the nearest integer, ties even
        z = min(max(qmin - lo0 / s, qmin), qmax)
        return s, (z + magic) - magic

    @_inline
    def _codes(xr, c0, n, sub, div, lo, hi, shift, half_even, dst):
        """Codes ``round(clip((x - sub) / div, lo, hi)) + shift`` of ``xr[c0:c0+n]`` as bytes into ``dst``.

        ``sub`` is 0 for a zero point (``x - 0`` is ``x``, bit for bit) or the offset; ``lo``, ``hi``
        and ``shift`` are integers.
        """
        a = np.uint64(c0)
        b = a + np.uint64(n)
        magic = np.float32(12582912.0)
        half = np.float32(0.5)
        if half_even:
            for t in range(a, b):
                y = min(max((xr[t] - sub) / div, lo), hi)
                dst[t] = np.uint8(np.int32(((y + magic) - magic) + shift) & 255)
        else:
            for t in range(a, b):
                y = min(max((xr[t] - sub) / div, lo), hi)
                q = (y + magic) - magic
                # an exact tie k + 0.5 goes away from zero; y + copysign(0.5, y) is then exact
                away = y + half if y > np.float32(0.0) else y - half
                q = away if abs(y - q) == half else q
                dst[t] = np.uint8(np.int32(q + shift) & 255)

    @_inline
    def _pack_stream(src, cols, bits, out):
        """Fields ``src[:cols]`` (their low ``bits``) as one little-endian bit stream into ``out``, zero-padded."""
        mask = np.int64((1 << bits) - 1)
        acc = np.int64(0)
        n = np.int64(0)
        j = 0
        for c in range(cols):
            acc |= (np.int64(src[c]) & mask) << n
            n += bits
            if n >= 8:  # n was below 8 before the field: at most one whole byte is ready
                out[j] = np.uint8(acc & 255)
                acc >>= 8
                n -= 8
                j += 1
        if n > 0:
            out[j] = np.uint8(acc & 255)
            j += 1
        for t in range(j, out.shape[0]):
            out[t] = np.uint8(0)

    @_njit
    def _quantize_row(r, x, xk, b, static, check, ss, zs, enc, sd, bits, scales, zeros, out, bad):
        """Codes of row ``r`` in blocks of ``b`` along it, written in the stored layout into ``out[r]``.

        ``static``: the stored scales and zero points (or offsets) come from ``ss`` and ``zs`` (grids,
        or ``(1, 1)`` for all); else from each block's range, written to ``scales`` and ``zeros``.
        ``check``: flag a row holding NaN or infinity even when static (it always is otherwise).
        ``enc``: (offset, qmin, qmax, half_even).
        """
        offset, qmin, qmax, half_even = enc
        cols = x.shape[1]
        nb = (cols + b - 1) // b
        xr = x[r]
        kr = xk[r]
        orow = out[r]
        nbytes = orow.shape[0]
        zero = np.float32(0.0)
        inf = np.float32(np.inf)
        # sweeps over the row's blocks (the last reads the row from cache): ranges, then parameters
        # (long chains of dependent scalar steps, which overlap across blocks in a loop of their
        # own), then codes
        s_of = np.empty(nb, dtype=np.float32)
        z_of = np.empty(nb, dtype=np.float32)
        if check or not static:
            top = np.int32(-0x80000000)
            bottom = np.int32(0x7FFFFFFF)
            for g in range(nb):
                c0 = g * b
                kmin, kmax = _key_range(kr, c0, min(b, cols - c0))
                s_of[g] = _from_key(kmin)
                z_of[g] = _from_key(kmax)
                top = max(top, kmax)
                bottom = min(bottom, kmin)
            if top >= np.int32(_KEY_TOP) or bottom <= np.int32(_KEY_BOTTOM):
                bad[r] = True
                return
        if static:
            srow = r if ss.shape[0] > 1 else 0
            scol = ss.shape[1] > 1
            for g in range(nb):
                s_of[g] = ss[srow, g if scol else 0]
                z_of[g] = zs[srow, g if scol else 0]
        else:
            for g in range(nb):
                s, z = _params(s_of[g], z_of[g], enc, sd)
                scales[r, g] = s
                zeros[r, g] = z
                s_of[g] = s
                z_of[g] = z
        # 8-bit fields go straight to the row's bytes; 2 and 4 bits through a zero-padded row of
        # codes packed whole bytes at a time; other widths through a bit stream
        per_byte = 8 // bits if bits in (2, 4) else 1
        if bits == 8:
            dst = orow
        elif per_byte > 1:
            dst = np.zeros(nbytes * per_byte, dtype=np.uint8)
        else:
            dst = np.empty(cols, dtype=np.uint8)
        for g in range(nb):
            c0 = g * b
            n = min(b, cols - c0)
            s = s_of[g]
            z = z_of[g]
            div = inf if s == zero else s
            if offset:
                if s == zero:
                    # given parameters only: x - m past the f32 maximum over d = 0 is inf / inf,
                    # which the portable path casts as NaN; leave that to it
                    for t in range(np.uint64(c0), np.uint64(c0 + n)):
                        if np.isinf(xr[t] - z):
                            bad[r] = True
                            return
                _codes(xr, c0, n, z, div, zero, qmax, zero, half_even, dst)
            else:
                _codes(xr, c0, n, zero, div, qmin - z, qmax - z, z, half_even, dst)
        if bits == 8:
            for t in range(cols, nbytes):
                orow[t] = np.uint8(0)
        elif per_byte > 1:
            pack_row(dst, per_byte, orow)
        else:
            _pack_stream(dst, cols, bits, orow)

    def _quantize_rows(x, xk, b, static, check, ss, zs, enc, sd, bits, scales, zeros, out, bad):
        for r in numba.prange(x.shape[0]):
            _quantize_row(np.int64(r), x, xk, b, static, check, ss, zs, enc, sd, bits, scales, zeros, out, bad)

    _QUANTIZE_ROWS = parallel_and_serial(_quantize_rows)

    def _row_ranges(xk, kmin, kmax):
        """The least and largest order key of each row."""
        for r in numba.prange(xk.shape[0]):
            lo, hi = _key_range(xk[r], 0, xk.shape[1])
            kmin[r] = lo
            kmax[r] = hi

    _ROW_RANGES = parallel_and_serial(_row_ranges)

    @_njit
    def _tensor_params(lo, hi, enc, sd):
        """:func:`_params` for a whole tensor (called from Python)."""
        return _params(lo, hi, enc, sd)

    @_inline
    def _unpack(src, cols, bits, half, buf):
        """The first ``cols`` fields of a row's bit stream as int32 (``(f ^ half) - half``: sign-extended
        when ``half`` is ``2^(bits-1)``, unsigned when 0) into ``buf``."""
        if bits == 8:
            for c in range(cols):
                buf[c] = (np.int32(src[c]) ^ half) - half
        elif bits == 4:
            pairs = cols >> 1
            for j in range(pairs):
                w = np.int32(src[j])
                buf[2 * j] = ((w & np.int32(15)) ^ half) - half
                buf[2 * j + 1] = ((w >> np.int32(4)) ^ half) - half
            if cols & 1:
                buf[cols - 1] = ((np.int32(src[pairs]) & np.int32(15)) ^ half) - half
        else:
            mask = np.int32((1 << bits) - 1)
            for c in range(cols):
                at = c * bits
                j = at >> 3
                sh = at & 7
                w = np.int32(src[j])
                if sh + bits > 8:  # the field runs on into the next byte
                    w |= np.int32(src[j + 1]) << np.int32(8)
                buf[c] = (((w >> np.int32(sh)) & mask) ^ half) - half

    @_njit
    def _dequantize_row(src, dst, s_row, z_row, offset, b, cols, bits, half, clamp):
        """One row: its fields, then per block ``float(q - z) * s`` or ``float(q) * d + m``; clipped if ``clamp``."""
        buf = np.empty(cols, dtype=np.int32)
        _unpack(src, cols, bits, half, buf)
        nb = s_row.shape[0]
        for g in range(nb):
            c0 = g * b
            c1 = min(c0 + b, cols)
            # slices from 0: with an offset index LLVM neither vectorises nor unrolls the loops
            q = buf[c0:c1]
            d = dst[c0:c1]
            s = s_row[g]
            if offset:
                m = z_row[g]
                for i in range(q.shape[0]):
                    d[i] = np.float32(q[i]) * s + m
            else:
                zi = np.int32(z_row[g])
                for i in range(q.shape[0]):
                    d[i] = np.float32(q[i] - zi) * s
        if clamp:
            top = np.float32(F32_MAX)
            low = -top
            for c in range(cols):
                y = dst[c]
                if y > top:
                    dst[c] = top
                elif y < low:
                    dst[c] = low

    def _dequantize_rows(raw, s2, z2, srow, offset, b, cols, bits, half, clamp, out):
        for r in numba.prange(raw.shape[0]):
            _dequantize_row(raw[r], out[r], s2[r * srow], z2[r * srow], offset, b, cols, bits, half, clamp)

    _DEQUANTIZE_ROWS = parallel_and_serial(_dequantize_rows)


def supports(plan: Plan, shape: tuple[int, ...]) -> str:
    """Why :func:`quantize` and :func:`dequantize` do not cover data of ``shape`` under ``plan``; ``""`` when they do.

    Covered: the zero-point and offset modes over every integer value (1 to 8 bits, signed or
    unsigned), every scale dtype the mode allows, per tensor or in blocks along the last axis,
    native or packed along the last axis.

    Parameters
    ----------
    plan : Plan
        The validated scheme.
    shape : tuple of int
        The data's shape.

    Returns
    -------
    str
        ``""`` when covered, else a short reason.

    Examples
    --------
    >>> from arrayquant.invariants import plan_for
    >>> from arrayquant.scheme import QuantScheme
    >>> supports(plan_for(QuantScheme.parse("u4:block32:f16:offset")), (4, 64))
    ''
    >>> supports(plan_for(QuantScheme.parse("q4s:block32:f16")), (4, 64))
    'symmetric mode is not an affine mode'
    """
    if numba is None:
        return "numba is not installed (pip install numba)"
    if sys.byteorder != "little":  # pragma: no cover - the packed words are written as little-endian bytes
        return "the fused kernels write little-endian words; this host is big-endian"
    if not plan.mode.is_affine:
        return f"{plan.mode.value} mode is not an affine mode"
    if plan.value.is_float or plan.two_level:  # pragma: no cover - the plan refuses both for affine modes
        return "affine schemes have integer values and one level of scales"
    if plan.scheme.scale_rule != "round_up":  # pragma: no cover - the only rule affine schemes take
        return f"scale rule {plan.scheme.scale_rule!r} is not fused"
    if not shape:
        return "0-d data is not fused"
    if 0 in shape:
        return "empty data is not fused"
    dims = plan.block_dims(shape)
    if any(d != 1 for d in dims[:-1]):
        return "blocks spanning more than the last axis are not fused"
    try:
        axis = plan.packed_axis(len(shape))
    except Exception:  # the driver reports the missing axis with its own message
        return "the packed axis does not exist for this rank"
    if axis is not None and axis != len(shape) - 1:
        return "packing along an axis other than the last is not fused"
    return ""


def _constants(plan: Plan, rounding: str) -> tuple[bool, np.float32, np.float32, bool]:
    """(offset, qmin, qmax, half_even), as the row kernel reads them."""
    f32 = np.float32
    return (plan.mode is QuantMode.OFFSET, f32(plan.qmin), f32(plan.qmax), rounding == "half_even")


def _field_bits(plan: Plan, shape: tuple[int, ...]) -> int:
    """The width of a stored field: the value's bits when packed, a whole byte in a native store."""
    return plan.bits if plan.packed_axis(len(shape)) is not None else 8


def _stored_zero(zero: np.ndarray, plan: Plan) -> np.ndarray:
    """The second grid as a tensor holds it: zero points in the codes' dtype, offsets f32."""
    if plan.mode is QuantMode.ZERO_POINT:
        return zero.astype(plan.code_dtype)
    return zero


def _run(
    x2: np.ndarray,
    plan: Plan,
    shape: tuple[int, ...],
    rounding: str,
    stored: tuple[np.ndarray, np.ndarray] | None,
    check: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Launch the row kernel on ``(rows, cols)`` data: (values, scales, zero grid, whether to decline)."""
    rows, cols = x2.shape
    dims = plan.block_dims(shape)
    b = dims[-1] if dims else cols
    nb = -(-cols // b)
    vshape, vdtype = values_layout(plan, shape)
    values = np.empty(vshape, dtype=vdtype)
    out = values.reshape(rows, -1).view(np.uint8)
    f32 = np.float32
    scales = np.empty((rows, nb) if stored is None else (1, 1), dtype=f32)
    zeros = np.empty_like(scales)
    ss, zs = (np.zeros((1, 1), f32), np.zeros((1, 1), f32)) if stored is None else stored
    bad = np.zeros(rows, dtype=np.bool_)
    launch(
        _QUANTIZE_ROWS,
        x2.size,
        x2,
        x2.view(np.int32),
        b,
        stored is not None,
        check,
        ss,
        zs,
        _constants(plan, rounding),
        scale_grid(plan.scale_dtype),
        _field_bits(plan, shape),
        scales,
        zeros,
        out,
        bad,
    )
    return values, scales, zeros, bool(bad.any())


def _tensor_range(x2: np.ndarray) -> tuple[np.float32, np.float32] | None:
    """``(min, max)`` of the whole tensor, or None when it holds NaN or infinity."""
    kmin = np.empty(x2.shape[0], dtype=np.int32)
    kmax = np.empty(x2.shape[0], dtype=np.int32)
    launch(_ROW_RANGES, x2.size, x2.view(np.int32), kmin, kmax)
    lo, hi = int(kmin.min()), int(kmax.max())
    if hi >= _KEY_TOP or lo <= _KEY_BOTTOM:
        return None
    keys = np.asarray([lo, hi], dtype=np.int32)
    bits = keys ^ ((keys >> 31) & np.int32(0x7FFFFFFF))
    lo_f, hi_f = bits.view(np.float32)
    return np.float32(lo_f), np.float32(hi_f)


def quantize(
    x: np.ndarray, plan: Plan, given: tuple[Any, Any] | None, rounding: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Affine quantization, MinMax or under given parameters: (values, scales, zero), or None.

    Parameters
    ----------
    x : numpy.ndarray
        float32 data, at least 1-d (C-contiguous or not).
    plan : Plan
        The validated affine scheme (see :func:`supports`).
    given : (scales, zero) or None
        None for MinMax; else the static f32 grids as stored (scales rounded up, offsets rounded
        down, zero points as f32 integers), each shaped as the scale grid.
    rounding : {"half_even", "half_away"}
        The integer rounding.

    Returns
    -------
    (values, scales, zero) or None
        The values in their stored layout (``storage.values_layout``), the f32 scale grid, and the
        zero points (in ``plan.code_dtype``) or the f32 offsets, equal bit for bit to the portable
        path; None where not covered or when ``x`` holds NaN or infinity (the caller then runs the
        portable path, which reports it).

    Examples
    --------
    >>> from arrayquant.invariants import plan_for
    >>> from arrayquant.scheme import QuantScheme
    >>> plan = plan_for(QuantScheme.parse("u4:block4:f32:zero_point:native"))
    >>> values, scales, zero = quantize(np.asarray([[-1.0, 0.0, 0.5, 2.0]], np.float32), plan, None, "half_even")
    >>> values.tolist(), zero.tolist()
    ([[0, 5, 7, 15]], [[5]])
    """
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or rounding not in _ROUNDINGS:
        return None
    shape = tuple(int(n) for n in x.shape)
    if supports(plan, shape):
        return None
    x2 = np.ascontiguousarray(x).reshape(-1, shape[-1])  # a strided view is copied once here
    grid = plan.grid_shape(shape)
    dims = plan.block_dims(shape)
    f32 = np.float32
    if given is not None:
        s_in = np.asarray(given[0], dtype=f32)
        z_in = np.asarray(given[1], dtype=f32)
        if s_in.shape != grid or z_in.shape != grid:
            return None
        as_rows = (lambda a: a.reshape(x2.shape[0], -1)) if dims else (lambda a: a.reshape(1, 1))
        stored = (np.ascontiguousarray(as_rows(s_in)), np.ascontiguousarray(as_rows(z_in)))
        values, _, _, bad = _run(x2, plan, shape, rounding, stored, True)
        return None if bad else (values, s_in, _stored_zero(z_in, plan))
    if not dims:
        rng = _tensor_range(x2)
        if rng is None:
            return None
        s, z = _tensor_params(rng[0], rng[1], _constants(plan, rounding), scale_grid(plan.scale_dtype))
        stored = (np.full((1, 1), s, dtype=f32), np.full((1, 1), z, dtype=f32))
        values, _, _, _ = _run(x2, plan, shape, rounding, stored, False)
        return values, stored[0].reshape(1), _stored_zero(stored[1].reshape(1), plan)
    values, scales, zeros, bad = _run(x2, plan, shape, rounding, None, False)
    if bad:
        return None
    return values, scales.reshape(grid), _stored_zero(zeros.reshape(grid), plan)


def dequantize(values: np.ndarray, scales: Any, zero: Any, plan: Plan, shape: tuple[int, ...]) -> np.ndarray | None:
    """The f32 data stored affine values stand for, as the portable path computes it, or None.

    Parameters
    ----------
    values : numpy.ndarray
        The stored values, of ``storage.values_layout(plan, shape)``.
    scales : numpy.ndarray
        The stored scales as f32, shaped ``plan.grid_shape(shape)``.
    zero : numpy.ndarray
        The zero points as f32 integers, or the f32 offsets, shaped as ``scales``.
    plan : Plan
        The validated affine scheme (see :func:`supports`).
    shape : tuple of int
        The data's shape.

    Returns
    -------
    numpy.ndarray or None
        float32 of ``shape``, bit-identical to the portable path; None where not covered (values
        or grids not NumPy arrays of the stored layout, scales negative or not finite, offsets not
        finite).
    """
    shape = tuple(int(n) for n in shape)
    if supports(plan, shape) or not isinstance(scales, np.ndarray) or not isinstance(zero, np.ndarray):
        return None
    raw = as_bytes(values, plan, shape)
    if raw is None:
        return None
    grid = plan.grid_shape(shape)
    s = np.asarray(scales, dtype=np.float32)
    z = np.asarray(zero, dtype=np.float32)
    if s.shape != grid or z.shape != grid:
        return None
    if not (np.isfinite(s).all() and np.isfinite(z).all() and (s >= 0).all()):
        return None
    rows, cols = raw.shape[0], shape[-1]
    if plan.block_dims(shape):
        b, srow = plan.block_dims(shape)[-1], 1
        s2, z2 = np.ascontiguousarray(s.reshape(rows, -1)), np.ascontiguousarray(z.reshape(rows, -1))
    else:
        b, srow = cols, 0
        s2, z2 = s.reshape(1, 1), z.reshape(1, 1)
    clamp = may_overflow(s, z, plan, xp=np)
    bits = _field_bits(plan, shape)
    half = 1 << (bits - 1) if plan.code_dtype == "int8" else 0
    out = np.empty((rows, cols), dtype=np.float32)
    offset = plan.mode is QuantMode.OFFSET
    launch(_DEQUANTIZE_ROWS, out.size, raw, s2, z2, srow, offset, b, cols, bits, half, clamp, out)
    return out.reshape(shape)
