"""Dequantization fused in one Numba pass: read the stored (packed) values once, write f32 once.

The same f32 operations as the portable path (``dequantize.py`` driving ``blockwork.Steps.decode``),
so the result is identical bit for bit, not close:

* a field is read from its byte (a PackedU32 word is four such bytes, little-endian), bits
  ``[k*bits, (k+1)*bits)``; integer fields are sign-extended, native int8 values taken as they are;
* its f32 value is the integer as f32 (``astype`` is exact), or the minifloat's ``decode_table``
  entry computed from the field's own bits (as ``minifloat.decode`` masks them);
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
from typing import Any

import numpy as np

from ..invariants import Plan
from ..kernels.minifloat import FORMATS, decode_table
from ..scheme import QuantValue
from ..storage import values_layout
from .coverage import layout_reason
from .numba_launch import launch, numba

__all__ = ["as_bytes", "decode_minifloat", "dequantize", "supports"]

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
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI machine
        return "big-endian machines are not fused"
    return layout_reason(plan, shape)


def _top_code(plan: Plan) -> float:
    """The largest magnitude a code stands for (before the scale), as the portable overflow test."""
    if plan.value.is_float:
        return float(FORMATS[plan.value].max)
    return float(max(-plan.qmin, plan.qmax))


# How a field becomes f32, chosen once per call: the index of the parallel kernel in _KERNELS. Modes
# up to _E2M1 read one field per byte (E2M1 native: the byte's low nibble), _I4 and _P2M1 two, _I2 four.
_I8, _E4M3, _E5M2, _E2M1, _I4, _P2M1, _I2 = range(7)

if numba is not None:
    # Compile time: _row, _fields and _value take ``mode`` as a literal (numba.literally), so each is
    # compiled per mode, on first use, with the other modes' branches pruned; the loops are inlined
    # into _row, while _value stays a call that LLVM inlines. Inlining _value in Numba's IR too copies
    # it into every loop (seven kernels in one function: an 11-minute cold compile; one: 28 s).
    _njit = numba.njit(cache=True, nogil=True)
    _inline = numba.njit(cache=True, nogil=True, inline="always")

    # The minifloat decoders give decode_table's f32 value from the code's bits, without a table
    # lookup (1.5x faster: the loops vectorise). Exact: a normal value is its exponent and
    # mantissa moved into f32's fields (the exponent rebiased), a subnormal is the mantissa field
    # times its unit, NaN is the table's quiet NaN with the code's sign.

    @_inline
    def _f32_bits(u):
        return np.int32(u).view(np.float32)

    @_inline
    def _minifloat(c, ebits, mbits):
        """Code ``c`` of a sign-``ebits``-``mbits`` minifloat: its magnitude field, its sign moved to
        f32's bit 31, and its value read as a normal (mantissa and rebiased exponent moved into f32's
        fields) and as a signed subnormal (the field times the smallest subnormal)."""
        top = np.int32(1 << (ebits + mbits))  # the sign bit
        bias = (1 << (ebits - 1)) - 1
        mag = np.int32(c) & (top - np.int32(1))
        sign = (np.int32(c) & top) << np.int32(31 - ebits - mbits)
        normal = _f32_bits(((mag << np.int32(23 - mbits)) + np.int32((127 - bias) << 23)) | sign)
        sub = np.float32(mag) * _f32_bits(np.int32((128 - bias - mbits) << 23))  # 2^(1 - bias - mbits)
        return mag, sign, normal, (-sub if sign != 0 else sub)

    # (selects, not early returns: a branch in the loop body stops LLVM vectorising it)
    @_inline
    def _e4m3(c):
        mag, sign, normal, sub = _minifloat(c, 4, 3)
        nan = _f32_bits(np.int32(0x7FC00000) | sign)
        return nan if mag == np.int32(0x7F) else (sub if mag < np.int32(8) else normal)

    @_inline
    def _e5m2(c):
        mag, sign, normal, sub = _minifloat(c, 5, 2)
        # infinity at 0x7C, NaN above
        special = _f32_bits((np.int32(0x7F800000) if mag == np.int32(0x7C) else np.int32(0x7FC00000)) | sign)
        return special if mag >= np.int32(0x7C) else (sub if mag < np.int32(4) else normal)

    @_inline
    def _e2m1(c):
        mag, _, normal, sub = _minifloat(c, 2, 1)
        return sub if mag < np.int32(2) else normal

    @_njit
    def _value(f, mode):
        """The f32 value of field ``f``: a sign-extended integer (``(f ^ h) - h``; exact in f32) or a minifloat."""
        numba.literally(mode)
        if mode == _I8:
            return np.float32(np.int8(f))
        if mode == _I4:
            return np.float32(((np.int32(f) & 15) ^ 8) - 8)
        if mode == _I2:
            return np.float32(((np.int32(f) & 3) ^ 2) - 2)
        if mode == _E4M3:
            return _e4m3(f)
        if mode == _E5M2:
            return _e5m2(f)
        return _e2m1(f)

    @_njit
    def _fields(src, dst, c0, c1, lg, bits, mode, s):
        """Fields ``c0 .. c1 - 1`` one at a time: any start and end within a byte."""
        numba.literally(mode)
        pm = (1 << lg) - 1
        mask = (1 << bits) - 1 if lg else 255
        for c in range(c0, c1):
            f = (np.int32(src[c >> lg]) >> ((c & pm) * bits)) & mask
            dst[c] = _value(f, mode) * s

    # Whole bytes ``j0 .. j1 - 1`` holding one, two or four fields each, a fixed body per byte. The
    # loops run over slices from 0: with an offset index LLVM neither vectorises nor unrolls them (5x
    # slower).
    @_inline
    def _bytes1(src, dst, j0, j1, mode, s):
        a = src[j0:j1]
        d = dst[j0:j1]
        for i in range(a.shape[0]):
            d[i] = _value(a[i], mode) * s

    @_inline
    def _bytes2(src, dst, j0, j1, mode, s):
        a = src[j0:j1]
        d = dst[2 * j0 : 2 * j1]
        for i in range(a.shape[0]):
            w = np.int32(a[i])
            d[2 * i] = _value(w & 15, mode) * s
            d[2 * i + 1] = _value(w >> 4, mode) * s

    @_inline
    def _bytes4(src, dst, j0, j1, mode, s):
        a = src[j0:j1]
        d = dst[4 * j0 : 4 * j1]
        for i in range(a.shape[0]):
            w = np.int32(a[i])
            d[4 * i] = _value(w, mode) * s
            d[4 * i + 1] = _value(w >> 2, mode) * s
            d[4 * i + 2] = _value(w >> 4, mode) * s
            d[4 * i + 3] = _value(w >> 6, mode) * s

    @_inline
    def _bytes(src, dst, j0, j1, mode, s):
        """Whole bytes ``j0 .. j1 - 1`` (``mode`` a constant: one branch is left)."""
        if mode <= _E2M1:
            _bytes1(src, dst, j0, j1, mode, s)
        elif mode <= _P2M1:
            _bytes2(src, dst, j0, j1, mode, s)
        else:
            _bytes4(src, dst, j0, j1, mode, s)

    @_inline
    def _eff(stored, g0, two_level):
        """The effective scale: the stored one, or ``min(g * stored, F32_MAX)`` (``effective_scale``)."""
        if not two_level:
            return stored
        top = np.float32(_F32_MAX)
        s = g0 * stored
        return top if s > top else s  # np.minimum: a NaN product would stay NaN

    @_njit
    def _row(src, dst, srow, g0, two_level, b, cols, bits, clamp, mode):
        """One row: per block its effective scale, then its fields; clipped to ``±F32_MAX`` if ``clamp``."""
        numba.literally(mode)
        lg = 0 if mode <= _E2M1 else (1 if mode <= _P2M1 else 2)
        pm = (1 << lg) - 1
        nb = srow.shape[0]
        full = cols // b
        if b & pm == 0:
            # every block starts on a byte: whole blocks with no tail check, then a last partial block
            hb = b >> lg
            for g in range(full):
                _bytes(src, dst, g * hb, g * hb + hb, mode, _eff(srow[g], g0, two_level))
            if full < nb:
                s = _eff(srow[full], g0, two_level)
                j1 = cols >> lg
                _bytes(src, dst, full * hb, j1, mode, s)
                _fields(src, dst, j1 << lg, cols, lg, bits, mode, s)
        else:
            for g in range(nb):  # blocks that may start inside a byte (block7 of 4-bit fields)
                _fields(src, dst, g * b, min(g * b + b, cols), lg, bits, mode, _eff(srow[g], g0, two_level))
        if clamp:
            # the same elements as clipping each product: a separate pass keeps the loops above simple
            top = np.float32(_F32_MAX)
            low = -top
            for c in range(cols):
                y = dst[c]
                if y > top:
                    dst[c] = top
                elif y < low:
                    dst[c] = low

    # Two kernels per decoder, compiled only when first used (seconds each). Each computes
    # ``out[r, c] = value(field(r, c)) * eff(r, c // b)``; ``raw`` holds each row's bytes, field ``c``
    # in byte ``c >> lg`` at bit ``(c & (2^lg - 1)) * bits``; ``scales[r * srow]`` are the stored
    # scales of row ``r``'s blocks (``srow`` 0: the same for every row).
    def _compile(mode: int) -> tuple[Any, Any]:
        """The decoder ``mode``'s kernel, parallel over rows and serial (for one-thread launches).

        ``mode`` is a closure constant, so each decoder is its own compilation (and cache entry).
        """

        def parallel(raw, scales, srow, glob, two_level, b, cols, bits, clamp, out):
            for r in numba.prange(raw.shape[0]):
                _row(raw[r], out[r], scales[r * srow], glob[0], two_level, b, cols, bits, clamp, mode)

        def serial(raw, scales, srow, glob, two_level, b, cols, bits, clamp, out):
            for r in range(raw.shape[0]):
                _row(raw[r], out[r], scales[r * srow], glob[0], two_level, b, cols, bits, clamp, mode)

        return numba.njit(cache=True, nogil=True, parallel=True)(parallel), _njit(serial)

    _KERNELS = tuple(_compile(m) for m in (_I8, _E4M3, _E5M2, _E2M1, _I4, _P2M1, _I2))

    @_njit
    def _decode(codes, mode, out):
        for i in range(codes.shape[0]):
            out[i] = _value(codes[i], mode)


def _mode(value: QuantValue, packed: bool) -> int:
    """The kernel's decoder for ``value``; ``packed``: fields narrower than a byte share bytes."""
    if value is QuantValue.E4M3:
        return _E4M3
    if value is QuantValue.E5M2:
        return _E5M2
    if value is QuantValue.E2M1:
        return _P2M1 if packed else _E2M1
    if not packed:
        return _I8  # native int8 values and 8-bit fields: each byte taken as an int8
    return _I4 if value.bits == 4 else _I2


def as_bytes(values: np.ndarray, plan: Plan, shape: tuple[int, ...]) -> np.ndarray | None:
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
    raw = as_bytes(values, plan, shape)
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
    mode = _mode(plan.value, packed)
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
    launch(_KERNELS[mode], out.size, raw, s2, srow, g, plan.two_level, b, cols, plan.bits, clamp, out)
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
    flat = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1)
    if numba is None:  # pragma: no cover - exercised only without numba
        tab = np.asarray(decode_table(value), dtype=np.float32)
        return tab[flat & (tab.size - 1)].reshape(np.shape(codes))
    out = np.empty(flat.shape, dtype=np.float32)
    _decode(flat, _mode(value, False), out)
    return out.reshape(np.shape(codes))
