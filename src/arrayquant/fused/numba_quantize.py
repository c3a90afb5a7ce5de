"""MinMax quantization fused in Numba: read the data once, write the stored values and scales directly.

The same f32 operations in the same order as the portable path (``quantize.py``'s ``_quantize``
driving ``blockwork.Steps`` and ``kernels/``), so values, stored scales and the two-level global
are identical bit for bit, not close:

* ``alpha = max|x|`` per block (per tensor: over the whole tensor), taken as the largest of the
  sign-cleared f32 bit patterns: their integer order is the order of ``|x|``, the maximum
  vectorises, and a pattern at or past infinity's marks NaN or infinity (the caller then runs
  the portable path, which reports where);
* the stored scale is ``round_up(alpha / (span / 2))`` onto the scale dtype (two-level:
  ``round_up((alpha / (span / 2)) / g)`` with ``g = max(max(alpha) / (span / 2) / dtype_max,
  F32_TINY)``, the effective scale ``min(g * stored, F32_MAX)``; OCP rule: ``kernels/qparams.py``'s
  ``_ocp_scales`` then the round-up);
* integer codes ``clip(round(x / eff), qmin, qmax)`` (clipping first is the same: the bounds are
  integers), rounded half to even by adding and taking off ``1.5 * 2^23`` (half away from zero:
  exact ties then move away); zero scale: ``x / inf``, code 0;
* minifloat codes ``encode(min(|x / eff|, max))`` with ``x``'s sign bit, by the binade ``j`` (read
  from the exponent bits: the same count as the portable comparisons with powers of two) and
  ``t = a * 2^(mbits - emin - j)`` rounded half to even, ``n + j * 2^mbits``; for E2M1 too, where
  the portable kernel takes the equal seven midpoint comparisons (the sweeps compare the two);
  zero scale: code 0;
* codes packed along the last axis, field ``k`` of a byte in bits ``[k*bits, (k+1)*bits)``, each
  line zero-padded to whole words (a little-endian u32 word is four such bytes).

Rows run in parallel (``prange``); each row's work is sequential and fixed, so the result does not
depend on the thread count. No ``fastmath``: it would reorder and contract the f32 steps.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..invariants import Plan
from ..kernels.minifloat import FORMATS
from ..scheme import F32_MAX, F32_TINY, QuantValue, ScaleDtype
from ..storage import values_layout
from .coverage import layout_reason
from .numba_launch import LOCK, launch, numba

__all__ = [
    "absmax",
    "encode",
    "encode_minifloat",
    "pack_row",
    "quantize",
    "quantize_under",
    "round_onto",
    "round_up",
    "scale_grid",
    "supports",
]

_INTS = (QuantValue.Q8F, QuantValue.Q8S, QuantValue.Q4F, QuantValue.Q4S, QuantValue.Q2F, QuantValue.Q2S)
_FLOATS = (QuantValue.E4M3, QuantValue.E5M2, QuantValue.E2M1)
_FINITE_LIMIT = 0x7F800000  # sign-cleared bit patterns from here up are infinity or NaN


if numba is not None:
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    def _bitcast(src: Any, dst: Any) -> Any:
        """An intrinsic reinterpreting a 32-bit ``src`` as ``dst`` (a register bitcast: vectorises,
        unlike a view of a scratch array)."""
        target = ir.FloatType() if dst == types.float32 else ir.IntType(32)

        def typer(typingctx: Any, v: Any) -> Any:
            def codegen(context, builder, signature, args):
                return builder.bitcast(args[0], target)

            return dst(src), codegen

        typer.__name__ = typer.__qualname__ = f"bitcast_{src}_{dst}"
        return intrinsic(typer)

    _bits: Any = _bitcast(types.float32, types.uint32)  # the bit pattern of an f32
    _ibits: Any = _bitcast(types.float32, types.int32)  # as a signed int32 (negative for a set sign bit)
    _from_ibits: Any = _bitcast(types.int32, types.float32)  # the f32 of a signed int32 bit pattern
    _from_bits: Any = _bitcast(types.uint32, types.float32)  # the f32 of a bit pattern

    # inlined in numba's IR: a call to a compiled helper that takes arrays counts their references
    # (atomic operations) on every call, which costs more than a block's encoding
    _inline = numba.njit(cache=True, nogil=True, inline="always")
    _njit = numba.njit(cache=True, nogil=True)

    @_inline
    def _pow2(e):
        """``2^e`` for a normal exponent, from its exponent field."""
        return _from_ibits(np.int32((e + 127) << 23))

    @_inline
    def round_onto(s, grid, up):
        """One non-negative f32 value onto a grid ``(max, floor, emin, emax - emin, mbits, is_f32)``:
        rounded up (``up``) or down.

        The steps of ``kernels/roundup.py``'s ``_round_onto`` (``ceil`` or ``floor``) with its tables
        computed instead of read (the same exact powers of two): the binade ``j``, the count of
        ``2^(emin+1) .. 2^emax`` not above ``a``, comes from ``a``'s exponent field (0 for negative
        ``a``, whose signed pattern is negative). Scalar arguments only: the search's table round-up
        (``numba_search_kernels._grid_up``) takes a table array, and reference counting it per call
        costs more than a block's encoding.
        """
        gmax, gfloor, emin, jmax, mbits, is_f32 = grid
        zero = np.float32(0.0)
        if is_f32:
            return s + zero
        a = min(s, gmax)
        j = min(max((_ibits(a) >> np.int32(23)) - np.int32(127 + emin), np.int32(0)), np.int32(jmax))
        k = mbits - emin - j
        ka = -((-k) // 2)  # split in two factors so that each is a normal f32 (as pow2_tables does)
        kb = k // 2
        t = (a * _pow2(ka)) * _pow2(kb)
        n = np.float32(np.ceil(t)) if up else np.float32(np.floor(t))
        r = (n * _pow2(-ka)) * _pow2(-kb)
        r = min(r, gmax)
        if gfloor > zero:
            r = max(r, gfloor)
        return r + zero

    @_inline
    def _round_up(s, grid):
        """One f32 scale rounded up onto a grid (``kernels/roundup.py``'s ``round_up_scales``)."""
        return round_onto(s, grid, True)

    @_inline
    def _scale(alpha, half_span, glob, two_level, ocp, ocp_mul, sd, u8):
        """The stored scale of a block from its ``alpha = max|x|`` (``scales_from_absmax`` + ``store_scales``)."""
        if ocp:
            up = _round_up(alpha, u8)
            fl = up if up == alpha else up * np.float32(0.5)
            return _round_up(fl * ocp_mul, sd)
        s = alpha / half_span
        if two_level:
            s = s / glob
        return _round_up(s, sd)

    @_inline
    def _int_codes(xr, c0, n, div, qmin, qmax, half_even, dst):
        """int codes of ``xr[c0:c0+n] / div`` as bytes (two's complement) into ``dst[c0:c0+n]``.

        Unsigned indices: numba then adds no negative-index wraparound, and the loops vectorise
        (slicing instead costs two atomic reference counts per view, per block).
        """
        lo = np.uint64(c0)
        hi = lo + np.uint64(n)
        magic = np.float32(12582912.0)  # 1.5 * 2^23: |y| <= 128 rounds to the nearest integer, ties even
        half = np.float32(0.5)
        if half_even:
            for t in range(lo, hi):
                y = min(max(xr[t] / div, qmin), qmax)
                dst[t] = np.uint8(np.int32((y + magic) - magic) & 255)
        else:
            for t in range(lo, hi):
                y = min(max(xr[t] / div, qmin), qmax)
                q = (y + magic) - magic
                # an exact tie k + 0.5 goes away from zero; y + copysign(0.5, y) is then exact
                away = y + half if y > np.float32(0.0) else y - half
                q = away if abs(y - q) == half else q
                dst[t] = np.uint8(np.int32(q) & 255)

    @_inline
    def _float_codes(xr, ur, c0, n, div, fmax, emin, jmax, mbits, sign_shift, dst):
        """Minifloat codes of ``xr[c0:c0+n] / div`` (``kernels/minifloat.py``'s encode; ``ur``: ``xr``'s
        bits) into ``dst[c0:c0+n]``.

        Integer steps are truncated to 32 bits at once: numba widens integer arithmetic to 64
        bits, which halves the vector width where LLVM cannot narrow it back.
        """
        magic = np.float32(12582912.0)
        lo = np.uint64(c0)
        hi = lo + np.uint64(n)
        sbit = np.uint32(1 << sign_shift)
        lo_p = _pow2(emin)  # the binade 2^E of a, clamped to [2^emin, 2^emax]
        hi_p = _pow2(emin + jmax)
        lo_bits = _bits(lo_p)
        # 2^(mbits - E) has the exponent field (127 + mbits) + 127 - field(2^E)
        top = np.uint32((254 + mbits) << 23)
        jshift = np.uint32(23 - mbits)
        for t in range(lo, hi):
            a = min(abs(xr[t]) / div, fmax)  # |x| / eff is |x / eff|: f32 division is sign-symmetric
            p = min(max(_from_bits(np.uint32(_bits(a) & np.uint32(0x7F800000))), lo_p), hi_p)
            pb = _bits(p)
            # j = E - emin binades above the lowest, times 2^mbits: the exponent fields' difference, shifted
            jstep = np.uint32(np.uint32(pb - lo_bits) >> jshift)
            tq = (a * _from_bits(np.uint32(top - pb)) + magic) - magic  # <= 2^(mbits+1): half to even
            m = np.uint32(np.uint32(np.int32(tq)) + jstep)
            dst[t] = np.uint8(m | np.uint32(np.uint32(ur[t] >> np.uint32(31)) * sbit))

    @_inline
    def pack_row(src, per_byte, out):
        """``per_byte`` fields of ``src`` (zero-padded to whole bytes) into each byte of ``out``.

        The fields of one byte are read as one little-endian u16 (two 4-bit fields) or u32 (four
        2-bit fields) and shifted into place: contiguous loads, so the loop vectorises.
        """
        if per_byte == 2:
            w16 = src.view(np.uint16)
            for i in range(np.uint64(out.shape[0])):
                v = w16[i]
                out[i] = np.uint8((v & np.uint16(0x0F)) | ((v >> np.uint16(4)) & np.uint16(0xF0)))
        else:
            w32 = src.view(np.uint32)
            for i in range(np.uint64(out.shape[0])):
                v = w32[i]
                out[i] = np.uint8(
                    (v & np.uint32(0x03))
                    | ((v >> np.uint32(6)) & np.uint32(0x0C))
                    | ((v >> np.uint32(12)) & np.uint32(0x30))
                    | ((v >> np.uint32(18)) & np.uint32(0xC0))
                )

    @_njit
    def _max_bits(ur):
        """The largest sign-cleared bit pattern of a row (its ``max|x|`` as bits)."""
        low = np.uint32(0x7FFFFFFF)
        m = np.uint32(0)
        for t in range(ur.shape[0]):
            m = max(m, ur[t] & low)
        return m

    # each kernel twice: parallel over rows (prange), and serial for one-thread launches (no pool)
    @numba.njit(cache=True, nogil=True, parallel=True)
    def _row_max_parallel(xu, out):
        for r in numba.prange(xu.shape[0]):
            out[r] = _max_bits(xu[r])

    @_njit
    def _row_max_serial(xu, out):
        for r in range(xu.shape[0]):
            out[r] = _max_bits(xu[r])

    _ROW_MAX = (_row_max_parallel, _row_max_serial)

    @_njit
    def _quantize_row(r, x, xu, b, static, check, stored, glob, lvl, sd, u8, enc, per_byte, scales, out, bad):
        """Codes of row ``r`` in blocks of ``b`` along it, written packed into ``out[r]``'s bytes.

        ``static``: the stored scales come from ``stored`` (a grid, or ``(1, 1)`` for all), else from
        each block's ``max|x|``, written to ``scales``. ``check``: flag rows holding NaN or infinity.
        ``lvl``: (two_level, ocp, ocp_mul, half_span); ``enc``: the value kind's constants.
        A function of its own, not the body of the ``prange`` loop: numba's parallel lowering of
        the same code runs markedly slower on one thread.
        """
        two_level, ocp, ocp_mul, half_span = lvl
        is_float, qmin, qmax, half_even, fmax, emin, jmax, mbits, sign_shift = enc
        cols = x.shape[1]
        nb = (cols + b - 1) // b
        nbytes = out.shape[1]
        low = np.uint32(0x7FFFFFFF)
        limit = np.uint32(_FINITE_LIMIT)
        zero = np.float32(0.0)
        inf = np.float32(np.inf)
        fmax32 = np.float32(F32_MAX)
        srow = r if stored.shape[0] > 1 else 0
        scol = stored.shape[1] > 1
        xr = x[r]
        ur = xu[r]
        orow = out[r]
        # fields narrower than a byte go through one zero-padded row of codes, then are packed
        dst = orow if per_byte == 1 else np.zeros(nbytes * per_byte, dtype=np.uint8)
        # sweeps over the row's blocks (the last reads the row from cache): block maxima, then
        # scales, then codes. The scale of one block is a long chain of dependent scalar steps;
        # in a loop of their own the chains of consecutive blocks are independent, and overlap
        effs = np.empty(nb, dtype=np.float32)
        if check or not static:
            top = np.uint32(0)
            for g in range(nb):
                c0 = g * b
                lo = np.uint64(c0)
                m = np.uint32(0)
                for t in range(lo, lo + np.uint64(min(b, cols - c0))):
                    m = max(m, ur[t] & low)
                effs[g] = _from_bits(m)  # max|x| of the block: the sign-cleared pattern is |x|'s
                top = max(top, m)
            if top >= limit:
                bad[r] = True
        if static:
            for g in range(nb):
                s = stored[srow, g if scol else 0]
                effs[g] = min(glob * s, fmax32) if two_level else s
        else:
            for g in range(nb):
                s = _scale(effs[g], half_span, glob, two_level, ocp, ocp_mul, sd, u8)
                scales[r, g] = s
                effs[g] = min(glob * s, fmax32) if two_level else s
        for g in range(nb):
            c0 = g * b
            n = min(b, cols - c0)
            eff = effs[g]
            if is_float:
                if eff == zero:
                    lo = np.uint64(c0)
                    for t in range(lo, lo + np.uint64(n)):
                        dst[t] = np.uint8(0)
                else:
                    _float_codes(xr, ur, c0, n, eff, fmax, emin, jmax, mbits, sign_shift, dst)
            else:
                _int_codes(xr, c0, n, inf if eff == zero else eff, qmin, qmax, half_even, dst)
        if per_byte == 1:
            orow[cols:] = np.uint8(0)
        else:
            pack_row(dst, per_byte, orow)

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _quantize_rows_parallel(x, xu, b, static, check, stored, glob, lvl, sd, u8, enc, per_byte, scales, out, bad):
        for r in numba.prange(x.shape[0]):
            _quantize_row(
                np.int64(r), x, xu, b, static, check, stored, glob, lvl, sd, u8, enc, per_byte, scales, out, bad
            )

    @_njit
    def _quantize_rows_serial(x, xu, b, static, check, stored, glob, lvl, sd, u8, enc, per_byte, scales, out, bad):
        for r in range(x.shape[0]):
            _quantize_row(
                np.int64(r), x, xu, b, static, check, stored, glob, lvl, sd, u8, enc, per_byte, scales, out, bad
            )

    _QUANTIZE_ROWS = (_quantize_rows_parallel, _quantize_rows_serial)

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _encode_flat(y, yu, fmax, emin, jmax, mbits, sign_shift, nan_code, out):
        """Minifloat codes of ``y`` at scale 1, NaN included (``kernels/minifloat.py``'s encode)."""
        n = y.shape[0]
        chunk = 1 << 16
        low = np.uint32(0x7FFFFFFF)
        limit = np.uint32(_FINITE_LIMIT)
        for c in numba.prange((n + chunk - 1) // chunk):
            lo = c * chunk
            hi = min(n, lo + chunk)
            _float_codes(y, yu, lo, hi - lo, np.float32(1.0), fmax, emin, jmax, mbits, sign_shift, out)
            for t in range(np.uint64(lo), np.uint64(hi)):
                if (yu[t] & low) > limit:  # NaN: the NaN code with the sign, or +0 for E2M1
                    out[t] = np.uint8(0) if nan_code < 0 else np.uint8(nan_code | (out[t] & np.uint8(0x80)))

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _round_up_flat(s, sd, out):
        n = s.shape[0]
        for i in numba.prange(n):
            out[i] = _round_up(s[i], sd)


def supports(plan: Plan, shape: tuple[int, ...]) -> str:
    """Whether :func:`quantize` and :func:`encode` cover data of ``shape`` under ``plan``.

    Parameters
    ----------
    plan : Plan
        The validated scheme.
    shape : tuple of int
        The data's shape.

    Returns
    -------
    str
        ``""`` when covered, else a short reason why not.
    """
    if numba is None:
        return "numba is not installed (pip install numba)"
    if sys.byteorder != "little":  # pragma: no cover - the packed words are written as little-endian bytes
        return "the fused kernels write little-endian words; this host is big-endian"
    scheme = plan.scheme
    if plan.value not in _INTS and plan.value not in _FLOATS:  # pragma: no cover - every value is one of these
        return f"{plan.value.name} values are not fused"
    if scheme.scale_rule not in ("round_up", "ocp"):  # pragma: no cover - the only rules
        return f"scale rule {scheme.scale_rule!r} is not fused"
    return layout_reason(plan, shape)


def scale_grid(dtype: ScaleDtype) -> tuple[np.float32, np.float32, int, int, int, bool]:
    """A scale dtype's grid as :func:`round_onto` reads it: (max, floor, emin, emax - emin, mbits, is-f32)."""
    g = dtype.grid
    # the binade thresholds 2^(emin+1) .. must be normal f32 for the exponent-field count
    assert dtype is ScaleDtype.F32 or g.emin + 1 >= -126, dtype
    return (np.float32(g.max), np.float32(g.floor), int(g.emin), int(g.emax - g.emin), int(g.mbits),
            dtype is ScaleDtype.F32)  # fmt: skip


def _constants(plan: Plan, rounding: str) -> tuple[object, ...]:
    """The value kind's encoding constants: (is_float, qmin, qmax, half_even, fmax, emin, jmax, mbits, sign_shift)."""
    f32 = np.float32
    if plan.value.is_float:
        fmt = FORMATS[plan.value]
        return (True, f32(0), f32(0), True, f32(fmt.max), fmt.emin, fmt.emax - fmt.emin, fmt.mbits, fmt.bits - 1)
    return (False, f32(plan.qmin), f32(plan.qmax), rounding == "half_even", f32(0), 0, 0, 0, 0)


def _ocp_mul(plan: Plan) -> np.float32:
    return np.float32(2.0 ** -FORMATS[plan.value].emax) if plan.value.is_float else np.float32(1.0)


def _run(
    x: np.ndarray,
    plan: Plan,
    rounding: str,
    stored: np.ndarray | None,
    glob: np.float32,
    check: bool,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Launch the row kernel: (values in their stored layout, scales grid, whether NaN/inf was seen)."""
    shape = tuple(int(n) for n in x.shape)
    cols = shape[-1]
    dims = plan.block_dims(shape)
    b = dims[-1] if dims else cols
    x2 = np.ascontiguousarray(x).reshape(-1, cols)
    rows = x2.shape[0]
    nb = -(-cols // b)
    vshape, vdtype = values_layout(plan, shape)
    values = np.empty(vshape, dtype=vdtype)
    out = values.reshape(rows, -1).view(np.uint8)
    per_byte = 8 // plan.bits if plan.packed_axis(len(shape)) is not None else 1
    scales = np.empty((rows, nb) if stored is None else (1, 1), dtype=np.float32)
    st = np.zeros((1, 1), np.float32) if stored is None else np.ascontiguousarray(stored, np.float32)
    bad = np.zeros(rows, dtype=np.bool_)
    launch(
        _QUANTIZE_ROWS,
        x2.size,
        x2,
        x2.view(np.uint32),
        b,
        stored is not None,
        check,
        st,
        glob,
        (bool(plan.two_level), plan.scheme.scale_rule == "ocp", _ocp_mul(plan), np.float32(plan.value.span / 2)),
        scale_grid(plan.scale_dtype),
        scale_grid(ScaleDtype.UE8M0),
        _constants(plan, rounding),
        per_byte,
        scales,
        out,
        bad,
    )
    return values, scales, bool(bad.any())


def _covered(x: object, plan: Plan) -> bool:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim < 1 or x.size == 0:
        return False
    return not supports(plan, tuple(int(n) for n in x.shape))


def _absmax(x: np.ndarray) -> np.float32 | None:
    """``max|x|`` over the whole tensor (parallel over rows), or None when it holds NaN or infinity."""
    x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    rowmax = np.empty(x2.shape[0], dtype=np.uint32)
    launch(_ROW_MAX, x2.size, x2.view(np.uint32), rowmax)
    top = rowmax.max()
    if top >= _FINITE_LIMIT:
        return None
    return np.asarray(top, dtype=np.uint32).reshape(1).view(np.float32)[0]


def quantize(x: np.ndarray, plan: Plan, rounding: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """MinMax quantization with dynamic scales: (values, stored scales, global), or None.

    Parameters
    ----------
    x : numpy.ndarray
        float32 data, at least 1-d (C-contiguous or not).
    plan : Plan
        The validated scheme (see :func:`supports`).
    rounding : {"half_even", "half_away"}
        The integer rounding.

    Returns
    -------
    (values, scales, global) or None
        The values in their stored form and layout (``storage.values_layout``), the stored f32
        scales shaped as the scale grid, and the ``(1,)`` f32 global of a two-level scheme (else
        None), equal bit for bit to the portable path. None where not covered (other dtypes, see
        :func:`supports`) or when ``x`` holds NaN or infinity: the caller then runs the portable
        path, which reports it.
    """
    if not _covered(x, plan):
        return None
    x = np.ascontiguousarray(x)  # a strided view is copied once here, not once per pass
    shape = tuple(int(n) for n in x.shape)
    f32 = np.float32
    if not plan.block_dims(shape):
        alpha = _absmax(x)
        if alpha is None:
            return None
        u8 = scale_grid(ScaleDtype.UE8M0)
        s = _scale(alpha, f32(plan.value.span / 2), f32(1), False, False, _ocp_mul(plan),
                   scale_grid(plan.scale_dtype), u8)  # fmt: skip
        stored = np.full((1, 1), s, dtype=f32)
        values, _, _ = _run(x, plan, rounding, stored, f32(1), False)
        return values, stored.reshape(1), None
    glob = None
    if plan.two_level:
        alpha = _absmax(x)
        if alpha is None:
            return None
        # the largest block scale is max|x| / (span / 2): division by a positive constant is monotone
        s_max = f32(alpha / f32(plan.value.span / 2))
        glob = np.full(1, max(f32(s_max / f32(plan.scale_dtype.max)), f32(F32_TINY)), dtype=f32)
    hit = _under(x, plan, glob, rounding)
    return None if hit is None else (*hit, glob)


def absmax(x: np.ndarray) -> np.ndarray | None:
    """``max|x|`` of float32 ``x`` as a ``(1,)`` f32 array, or None when ``x`` holds NaN or infinity."""
    alpha = _absmax(x)
    return None if alpha is None else np.full(1, alpha, dtype=np.float32)


def quantize_under(
    x: np.ndarray, plan: Plan, glob: np.ndarray | None, rounding: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """MinMax block quantization under a given two-level global: (values, stored scales), or None.

    What :func:`quantize` does once it has the global, for a part of a tensor (a dask chunk) whose
    global was taken over the whole. ``glob`` is the ``(1,)`` f32 global of a two-level scheme, None
    for a one-level one. None where not covered or when ``x`` holds NaN or infinity.
    """
    if not _covered(x, plan) or plan.two_level != (glob is not None):
        return None
    return _under(x, plan, glob, rounding)


def _under(x: np.ndarray, plan: Plan, glob: np.ndarray | None, rounding: str) -> tuple[np.ndarray, np.ndarray] | None:
    shape = tuple(int(n) for n in x.shape)
    if not plan.block_dims(shape):
        return None
    g = np.float32(1) if glob is None else np.float32(np.asarray(glob, dtype=np.float32).reshape(-1)[0])
    values, scales, bad = _run(x, plan, rounding, None, g, False)
    return None if bad else (values, scales.reshape(plan.grid_shape(shape)))


def encode(x: np.ndarray, plan: Plan, stored: np.ndarray, glob: np.ndarray | None, rounding: str) -> np.ndarray | None:
    """Stored values of ``x`` under given stored scales (and the two-level global), or None.

    Parameters
    ----------
    x : numpy.ndarray
        float32 data, at least 1-d.
    plan : Plan
        The validated scheme (see :func:`supports`).
    stored : numpy.ndarray
        The stored f32 scales (already on the scale dtype's grid), shaped as the scale grid.
    glob : numpy.ndarray or None
        The ``(1,)`` f32 global of a two-level scheme; the effective scale is then
        ``min(glob * stored, F32_MAX)``.
    rounding : {"half_even", "half_away"}
        The integer rounding.

    Returns
    -------
    numpy.ndarray or None
        The values in their stored form and layout, equal bit for bit to the portable path; None
        where not covered or when ``x`` holds NaN or infinity.
    """
    if not _covered(x, plan):
        return None
    shape = tuple(int(n) for n in x.shape)
    f32 = np.float32
    st = np.asarray(stored, dtype=f32)
    st = st.reshape(-1, st.shape[-1]) if plan.block_dims(shape) else st.reshape(1, 1)
    if plan.two_level != (glob is not None):
        return None
    g = f32(1) if glob is None else f32(np.asarray(glob, dtype=f32).reshape(-1)[0])
    values, _, bad = _run(x, plan, rounding, st, g, True)
    return None if bad else values


def encode_minifloat(y: np.ndarray, value: QuantValue) -> np.ndarray:
    """uint8 codes of f32 ``y`` at scale 1, exactly ``kernels.minifloat.encode`` (saturating; NaN as it says).

    Parameters
    ----------
    y : numpy.ndarray
        float32 values, any shape.
    value : QuantValue
        E4M3, E5M2 or E2M1.

    Returns
    -------
    numpy.ndarray
        uint8 codes of ``y``'s shape.
    """
    fmt = FORMATS[value]
    flat = np.ascontiguousarray(y, dtype=np.float32).reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.uint8)
    from .threads import apply

    with LOCK:
        apply(flat.size)
        _encode_flat(
            flat,
            flat.view(np.uint32),
            np.float32(fmt.max),
            fmt.emin,
            fmt.emax - fmt.emin,
            fmt.mbits,
            fmt.bits - 1,
            -1 if fmt.nan_code is None else fmt.nan_code,
            out,
        )
    return out.reshape(np.shape(y))


def round_up(s: np.ndarray, dtype: ScaleDtype) -> np.ndarray:
    """f32 scales rounded up onto ``dtype``'s grid, exactly ``kernels.roundup.round_up_scales``.

    Parameters
    ----------
    s : numpy.ndarray
        float32 scales, any shape.
    dtype : ScaleDtype
        The scale dtype.

    Returns
    -------
    numpy.ndarray
        f32 of ``s``'s shape.
    """
    flat = np.ascontiguousarray(s, dtype=np.float32).reshape(-1)
    out = np.empty_like(flat)
    from .threads import apply

    with LOCK:
        apply(flat.size)
        _round_up_flat(flat, scale_grid(dtype), out)
    return out.reshape(np.shape(s))
