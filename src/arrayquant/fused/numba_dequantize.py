"""Dequantization fused in one Numba pass: read the stored (packed) values once, write f32 once.

The same f32 operations as the portable path (``dequantize.py`` driving ``blockwork.Steps.decode``),
so the result is identical bit for bit, not close:

* a field is read from its byte (a PackedU32 word is four such bytes, little-endian), bits
  ``[k*bits, (k+1)*bits)``; integer fields are sign-extended, native int8 values taken as they are;
* its f32 value comes from a table of every field: the integer as f32 (``astype`` is exact), or the
  minifloat's ``decode_table`` entry (the field's own bits only, as ``minifloat.decode`` masks them);
* ``y = value * eff`` in f32, ``eff`` the stored scale, or ``min(g * stored, F32_MAX)`` two-level;
* where the portable path clips to ``±F32_MAX`` (some code times the largest ``eff`` could pass it),
  the kernel clips too. The portable path decides this per row chunk; the decision only changes
  results for E5M2's infinity codes, so a blocked E5M2 tensor that holds one under such scales is
  left to the portable path.

Rows run in parallel (``prange``); every element is computed alone, so the result does not depend
on the thread count. No ``fastmath``.
"""

from __future__ import annotations

import sys

import numpy as np

from ..invariants import Plan
from ..kernels.minifloat import FORMATS, decode_table
from ..scheme import QuantMode, QuantValue
from ..storage import values_layout
from .numba_search import _LAUNCH, numba

__all__ = ["decode_minifloat", "dequantize", "supports"]

_F32_MAX = float(np.finfo(np.float32).max)


def supports(plan: Plan, shape: tuple[int, ...]) -> str:
    """Why :func:`dequantize` does not cover data of ``shape`` under ``plan``; ``""`` when it does.

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
    """
    if numba is None:
        return "numba is not installed"
    if plan.scheme.mode is not QuantMode.SYMMETRIC:
        return "lookup tables are not fused"
    if not shape:
        return "0-d data is not fused"
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI machine
        return "big-endian machines are not fused"
    dims = plan.block_dims(shape)
    if dims and any(d != 1 for d in dims[:-1]):
        return "only 1-d blocks along the last axis are fused"
    axis = plan.packed_axis(len(shape))
    if axis is not None and axis != len(shape) - 1:
        return "only packing along the last axis is fused"
    return ""


def _field_table(plan: Plan, packed: bool) -> np.ndarray:
    """The f32 value of every byte (native store) or every field (packed store)."""
    value = plan.value
    n = 1 << plan.bits if packed else 256
    if value.is_float:
        dec = np.asarray(decode_table(value), dtype=np.float32)
        # the field's own bits index the table (a stray high nibble of a native E2M1 byte is ignored)
        return np.ascontiguousarray(dec[np.arange(n) & (dec.size - 1)])
    if packed:
        half = 1 << (plan.bits - 1)
        return ((np.arange(n) ^ half) - half).astype(np.float32)
    return np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float32)  # native int8, as stored


def _top_code(plan: Plan) -> float:
    """The largest magnitude a code stands for (before the scale), as the portable overflow test."""
    if plan.value.is_float:
        return float(FORMATS[plan.value].max)
    return float(max(-plan.qmin, plan.qmax))


# How a field becomes f32, chosen once per call: integer arithmetic (I) or table lookup (T), for
# 8/4/2-bit fields. The kernel's call sites pass it as a constant, so that each inlined copy of
# _row keeps only its own loop.
_I8, _T8, _I4, _T4, _I2, _T2 = range(6)

if numba is not None:
    _inline = numba.njit(cache=True, nogil=True, inline="always")

    @_inline
    def _fields(src, dst, c0, c1, lg, bits, tab, s):
        """Fields ``c0 .. c1 - 1`` one at a time, through the table: any start and end within a byte."""
        pm = (1 << lg) - 1
        mask = (1 << bits) - 1 if lg else 255
        for c in range(c0, c1):
            f = (np.int32(src[c >> lg]) >> ((c & pm) * bits)) & mask
            dst[c] = tab[f] * s

    @_inline
    def _bytes(src, dst, j0, j1, mode, tab, s):
        """Whole bytes ``j0 .. j1 - 1``, a fixed body per byte. The loops run over slices from 0: with an
        offset index LLVM neither vectorises nor unrolls them (5x slower). Integer fields are
        sign-extended with ``(f ^ h) - h`` and converted (exact: the same f32 as the table's)."""
        a = src[j0:j1]
        n = a.shape[0]
        if mode == _I8:
            d = dst[j0:j1]
            for i in range(n):
                d[i] = np.float32(np.int8(a[i])) * s
        elif mode == _T8:
            d = dst[j0:j1]
            for i in range(n):
                d[i] = tab[a[i]] * s
        elif mode == _I4:
            d = dst[2 * j0 : 2 * j1]
            for i in range(n):
                w = np.int32(a[i])
                d[2 * i] = np.float32(((w & 15) ^ 8) - 8) * s
                d[2 * i + 1] = np.float32(((w >> 4) ^ 8) - 8) * s
        elif mode == _T4:
            d = dst[2 * j0 : 2 * j1]
            for i in range(n):
                w = np.int32(a[i])
                d[2 * i] = tab[w & 15] * s
                d[2 * i + 1] = tab[w >> 4] * s
        elif mode == _I2:
            d = dst[4 * j0 : 4 * j1]
            for i in range(n):
                w = np.int32(a[i])
                d[4 * i] = np.float32(((w & 3) ^ 2) - 2) * s
                d[4 * i + 1] = np.float32((((w >> 2) & 3) ^ 2) - 2) * s
                d[4 * i + 2] = np.float32((((w >> 4) & 3) ^ 2) - 2) * s
                d[4 * i + 3] = np.float32(((w >> 6) ^ 2) - 2) * s
        else:
            d = dst[4 * j0 : 4 * j1]
            for i in range(n):
                w = np.int32(a[i])
                d[4 * i] = tab[w & 3] * s
                d[4 * i + 1] = tab[(w >> 2) & 3] * s
                d[4 * i + 2] = tab[(w >> 4) & 3] * s
                d[4 * i + 3] = tab[w >> 6] * s

    @_inline
    def _eff(stored, g0, two_level):
        """The effective scale: the stored one, or ``min(g * stored, F32_MAX)`` (``effective_scale``)."""
        if not two_level:
            return stored
        top = np.float32(_F32_MAX)
        s = g0 * stored
        return top if s > top else s  # np.minimum: a NaN product would stay NaN

    @_inline
    def _row(src, dst, srow, g0, two_level, b, cols, bits, tab, mode):
        """One row: per block its effective scale, then its fields."""
        lg = 0 if mode <= _T8 else (1 if mode <= _T4 else 2)
        pm = (1 << lg) - 1
        nb = srow.shape[0]
        full = cols // b
        if b & pm == 0:
            # every block starts on a byte: whole blocks with no tail check (the common case, and
            # the fast one for blocks of 16 or 32), then a last partial block
            hb = b >> lg
            for g in range(full):
                _bytes(src, dst, g * hb, g * hb + hb, mode, tab, _eff(srow[g], g0, two_level))
            if full < nb:
                s = _eff(srow[full], g0, two_level)
                j1 = cols >> lg
                _bytes(src, dst, full * hb, j1, mode, tab, s)
                _fields(src, dst, j1 << lg, cols, lg, bits, tab, s)
        else:
            for g in range(nb):  # blocks that may start inside a byte (block7 of 4-bit fields)
                _fields(src, dst, g * b, min(g * b + b, cols), lg, bits, tab, _eff(srow[g], g0, two_level))

    @numba.njit(cache=True, nogil=True, parallel=True)
    def _dequantize_rows(raw, mode, bits, tab, scales, srow, glob, two_level, b, cols, clamp, out):
        """``out[r, c] = value(field(r, c)) * eff(r, c // b)``, clipped to ``±F32_MAX`` if ``clamp``.

        ``raw`` holds each row's bytes; field ``c`` sits in byte ``c >> lg`` at bit ``(c & (2^lg - 1)) * bits``.
        ``scales[r * srow]`` are the stored scales of row ``r``'s blocks (``srow`` 0: the same for every row).
        """
        rows = raw.shape[0]
        top = np.float32(_F32_MAX)
        low = -top
        g0 = glob[0]
        for r in numba.prange(rows):
            src = raw[r]
            dst = out[r]
            sr = scales[r * srow]
            # each call site inlines _row with a constant mode: six specialised loops, no per-element branch
            if mode == _I8:
                _row(src, dst, sr, g0, two_level, b, cols, bits, tab, _I8)
            elif mode == _T8:
                _row(src, dst, sr, g0, two_level, b, cols, bits, tab, _T8)
            elif mode == _I4:
                _row(src, dst, sr, g0, two_level, b, cols, bits, tab, _I4)
            elif mode == _T4:
                _row(src, dst, sr, g0, two_level, b, cols, bits, tab, _T4)
            elif mode == _I2:
                _row(src, dst, sr, g0, two_level, b, cols, bits, tab, _I2)
            else:
                _row(src, dst, sr, g0, two_level, b, cols, bits, tab, _T2)
            if clamp:
                # the same elements as clipping each product: a separate pass keeps the loops above simple
                for c in range(cols):
                    y = dst[c]
                    if y > top:
                        dst[c] = top
                    elif y < low:
                        dst[c] = low

    @numba.njit(cache=True, nogil=True)
    def _lookup(codes, tab, mask, out):
        for i in range(codes.shape[0]):
            out[i] = tab[np.int32(codes[i]) & mask]


def _as_bytes(values: np.ndarray, plan: Plan, shape: tuple[int, ...]) -> np.ndarray | None:
    """The stored values as a C-contiguous ``(rows, bytes per row)`` uint8 array, or None if they do not fit."""
    want_shape, want_dtype = values_layout(plan, shape)
    if not isinstance(values, np.ndarray) or tuple(values.shape) != want_shape:
        return None
    if values.dtype.kind != np.dtype(want_dtype).kind or values.dtype.itemsize != np.dtype(want_dtype).itemsize:
        return None
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    if want_dtype == "uint32":
        # little-endian words: byte j of a word holds its fields j * (8 / bits) onwards
        words = np.ascontiguousarray(values, dtype=np.dtype("<u4"))
        return words.reshape(rows, -1).view(np.uint8)
    return np.ascontiguousarray(values).reshape(rows, -1).view(np.uint8)


def dequantize(
    values: np.ndarray, scales: np.ndarray, glob: np.ndarray | None, plan: Plan, shape: tuple[int, ...]
) -> np.ndarray | None:
    """The f32 data the stored values stand for, as the portable path computes it, or None.

    Parameters
    ----------
    values : numpy.ndarray
        The stored values (``QuantizedTensor.values``), of ``storage.values_layout(plan, shape)``.
    scales : numpy.ndarray
        The stored scales as f32 values, shaped ``plan.grid_shape(shape)``.
    glob : numpy.ndarray or None
        The ``(1,)`` f32 global scale of a two-level scheme, else None.
    plan : Plan
        The validated scheme (see :func:`supports`).
    shape : tuple of int
        The data's shape.

    Returns
    -------
    numpy.ndarray or None
        float32 of ``shape``, bit-identical to the portable path's f32 result; None where the kernel
        does not apply (:func:`supports`, values or scales not NumPy arrays of the stored layout,
        or a blocked E5M2 tensor holding infinity codes under scales that may overflow f32).
    """
    shape = tuple(int(n) for n in shape)
    if supports(plan, shape) or not isinstance(scales, np.ndarray):
        return None
    if plan.two_level != (glob is not None) or (glob is not None and not isinstance(glob, np.ndarray)):
        return None
    raw = _as_bytes(values, plan, shape)
    if raw is None:
        return None
    dims = plan.block_dims(shape)
    cols = shape[-1]
    rows = raw.shape[0]
    stored = np.asarray(scales, dtype=np.float32)
    if dims:
        b = dims[-1]
        nb = -(-cols // b)
        if stored.size != rows * nb:
            return None
        s2 = np.ascontiguousarray(stored.reshape(rows, nb))
        srow = 1
    else:
        if stored.size != 1:
            return None
        b = cols
        s2 = np.ascontiguousarray(stored.reshape(1, 1))
        srow = 0
    g = (
        np.ascontiguousarray(np.asarray(glob, dtype=np.float32).reshape(1))
        if glob is not None
        else np.ones(1, np.float32)
    )
    packed = plan.packed_axis(len(shape)) is not None and plan.bits < 8
    if plan.value.is_float:
        mode = {8: _T8, 4: _T4 if packed else _T8}[plan.bits]
    elif not packed:
        mode = _I8  # native int8 values: each taken as it is stored
    else:
        mode = {8: _I8, 4: _I4, 2: _I2}[plan.bits]
    # the portable overflow test, on the largest effective scale (the same f32 steps as effective_scale)
    emax = np.float32(s2.max()) if s2.size else np.float32(0)
    if glob is not None:
        with np.errstate(over="ignore"):  # an inf product saturates, as np.minimum does in effective_scale
            emax = min(g[0] * emax, np.float32(_F32_MAX))
    clamp = bool(float(emax) * _top_code(plan) > _F32_MAX * (1 - 2.0**-20))
    if clamp and plan.value is QuantValue.E5M2 and dims and bool(np.any((raw & 0x7F) == 0x7C)):
        # the portable path clips row chunk by row chunk: an infinity code stays inf in a chunk whose
        # scales cannot overflow and saturates in one whose can; leave that to it
        return None
    out = np.empty((rows, cols), dtype=np.float32)
    tab = _field_table(plan, packed)
    from .threads import apply

    with _LAUNCH:
        apply()
        _dequantize_rows(raw, mode, plan.bits, tab, s2, srow, g, plan.two_level, b, cols, clamp, out)
    return out.reshape(shape)


def decode_minifloat(codes: np.ndarray, value: QuantValue) -> np.ndarray:
    """f32 values of uint8 ``codes`` of ``value`` (E4M3, E5M2, E2M1) at scale 1, as ``minifloat.decode``.

    Parameters
    ----------
    codes : numpy.ndarray
        uint8 codes (only the field's own bits are read).
    value : QuantValue
        A minifloat value kind.

    Returns
    -------
    numpy.ndarray
        float32 of ``codes``' shape.
    """
    tab = np.asarray(decode_table(value), dtype=np.float32)
    flat = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1)
    out = np.empty(flat.shape, dtype=np.float32)
    if numba is None:  # pragma: no cover - exercised only without numba
        out[...] = tab[flat & (tab.size - 1)]
    else:
        _lookup(flat, tab, tab.size - 1, out)
    return out.reshape(np.shape(codes))
