"""Bit packing of fields into bytes along one axis, in uint8 and int16 arithmetic only.

Each line along the packed axis is one little-endian bit stream: field ``k`` occupies stream bits
``[k*bits, (k+1)*bits)``, stream bit ``i`` being bit ``i % 8`` of byte ``i // 8``. A field of a
width that does not divide 8 (3, 5, 6, 7 bits) crosses byte boundaries. A PackedU32 word is four
such bytes read little-endian, so for 1, 2, 4 and 8 bits field ``k`` of a word sits in bits
``[k*bits, (k+1)*bits)``, Burn's layout, and packing to bytes here then reinterpreting four bytes
as one word (in the backend shim) works on every backend, including those without uint32
arithmetic. Lines are zero-padded to whole storage words (4 bytes for PackedU32, 1 for bytes).
"""

from __future__ import annotations

import math
from typing import Any

from array_api_compat import device as device_of

__all__ = ["pack_fields", "pack_unit", "packed_length", "unpack_fields"]


def packed_length(n: int, bits: int, word_bits: int) -> int:
    """Storage words of a line of ``n`` fields: ``ceil(n * bits / word_bits)``."""
    return -(-n * bits // word_bits)


def pack_unit(bits: int, word_bits: int) -> tuple[int, int]:
    """``(fields, words)``: the shortest run of fields that fills whole words exactly.

    A line cut into runs of whole units packs run by run into the same words as packed whole.
    """
    g = math.gcd(bits, word_bits)
    return word_bits // g, bits // g


def _fields_u8(codes: Any, bits: int, *, xp: Any) -> Any:
    """``codes`` (two's complement or unsigned) truncated to ``bits`` as uint8."""
    mask = xp.asarray((1 << bits) - 1, dtype=xp.int16, device=device_of(codes))
    return xp.astype(xp.bitwise_and(xp.astype(codes, xp.int16), mask), xp.uint8)


def _pad_axis(a: Any, axis: int, total: int, *, xp: Any) -> Any:
    """``a`` zero-padded, or cut, to ``total`` along ``axis``."""
    n = a.shape[axis]
    if total < n:
        return a[(slice(None),) * axis + (slice(0, total), ...)]
    if total > n:
        shape = tuple(a.shape)
        pad = xp.zeros((*shape[:axis], total - n, *shape[axis + 1 :]), dtype=a.dtype, device=device_of(a))
        return xp.concat((a, pad), axis=axis)
    return a


def _shifted(v: Any, shift: int, *, xp: Any) -> Any:
    """int16 ``v`` shifted left by ``shift`` bits (right for a negative ``shift``)."""
    amount = xp.asarray(abs(shift), dtype=xp.int16, device=device_of(v))
    return xp.bitwise_left_shift(v, amount) if shift >= 0 else xp.bitwise_right_shift(v, amount)


def _overlaps(bits: int, n_fields: int, n_bytes: int) -> list[tuple[int, int, int]]:
    """``(field k, byte j, k*bits - 8*j)`` for every field and byte of a unit that share bits."""
    return [
        (k, j, k * bits - 8 * j)
        for k in range(n_fields)
        for j in range(n_bytes)
        if -bits < k * bits - 8 * j < 8  # field k starts below byte j's top and ends above its bottom
    ]


def _split(a: Any, axis: int, per: int, *, xp: Any) -> list[Any]:
    """The ``per`` interleaved parts of ``a`` along ``axis`` (element ``u * per + i`` to part ``i``), as int16."""
    shape = tuple(a.shape)
    grouped = xp.reshape(a, (*shape[:axis], shape[axis] // per, per, *shape[axis + 1 :]))
    lead = (slice(None),) * (axis + 1)
    return [xp.astype(grouped[lead + (i, ...)], xp.int16) for i in range(per)]


def _join(parts: list[Any], axis: int, *, xp: Any) -> Any:
    """Inverse of :func:`_split`: the parts interleaved back along ``axis``, as uint8."""
    stacked = xp.stack([xp.astype(p, xp.uint8) for p in parts], axis=axis + 1)
    shape = tuple(parts[0].shape)
    return xp.reshape(stacked, (*shape[:axis], shape[axis] * len(parts), *shape[axis + 1 :]))


def pack_fields(codes: Any, bits: int, axis: int, word_bits: int, *, xp: Any) -> Any:
    """Pack integer ``codes`` (two's complement, truncated to ``bits``) into uint8 along ``axis``.

    The axis becomes ``packed_length(n, bits, word_bits) * word_bits / 8`` bytes long.
    """
    fields = _fields_u8(codes, bits, xp=xp)
    n = fields.shape[axis]
    n_bytes = packed_length(n, bits, word_bits) * word_bits // 8
    if bits == 8:
        return _pad_axis(fields, axis, n_bytes, xp=xp)
    if 8 % bits == 0:
        return _pack_whole(fields, bits, axis, n_bytes, xp=xp)
    per, unit_bytes = pack_unit(bits, 8)  # e.g. 8 fields of 3 bits in 3 bytes
    wide = _split(_pad_axis(fields, axis, -(-n // per) * per, xp=xp), axis, per, xp=xp)
    acc: list[Any] = [None] * unit_bytes
    for k, j, shift in _overlaps(bits, per, unit_bytes):
        part = _shifted(wide[k], shift, xp=xp)
        acc[j] = part if acc[j] is None else xp.bitwise_or(acc[j], part)
    byte_mask = xp.asarray(0xFF, dtype=xp.int16, device=device_of(codes))
    packed = _join([xp.bitwise_and(a, byte_mask) for a in acc], axis, xp=xp)
    return _pad_axis(packed, axis, n_bytes, xp=xp)


def _pack_whole(fields: Any, bits: int, axis: int, n_bytes: int, *, xp: Any) -> Any:
    """1, 2 or 4 bits: whole fields per byte, shifted in uint8 (the common case, kept cheap)."""
    per = 8 // bits
    fields = _pad_axis(fields, axis, n_bytes * per, xp=xp)
    shape = tuple(fields.shape)
    grouped = xp.reshape(fields, (*shape[:axis], n_bytes, per, *shape[axis + 1 :]))
    lead = (slice(None),) * (axis + 1)
    out = grouped[lead + (0, ...)]
    dev = device_of(fields)
    for k in range(1, per):
        shift = xp.asarray(k * bits, dtype=xp.uint8, device=dev)
        out = xp.bitwise_or(out, xp.bitwise_left_shift(grouped[lead + (k, ...)], shift))
    return out


def _unpack_whole(packed: Any, bits: int, axis: int, *, xp: Any) -> Any:
    per = 8 // bits
    dev = device_of(packed)
    mask = xp.asarray((1 << bits) - 1, dtype=xp.uint8, device=dev)
    parts = [
        xp.bitwise_and(xp.bitwise_right_shift(packed, xp.asarray(k * bits, dtype=xp.uint8, device=dev)), mask)
        for k in range(per)
    ]
    stacked = xp.stack(parts, axis=axis + 1)
    shape = tuple(packed.shape)
    return xp.reshape(stacked, (*shape[:axis], shape[axis] * per, *shape[axis + 1 :]))


def unpack_fields(packed: Any, bits: int, axis: int, n: int, *, signed: bool, xp: Any) -> Any:
    """Inverse of :func:`pack_fields`: the first ``n`` fields along ``axis`` as int8 (or uint8)."""
    dev = device_of(packed)
    if bits == 8:
        fields = packed
    elif 8 % bits == 0:
        fields = _unpack_whole(packed, bits, axis, xp=xp)
    else:
        per, unit_bytes = pack_unit(bits, 8)
        raw = _pad_axis(packed, axis, -(-packed.shape[axis] // unit_bytes) * unit_bytes, xp=xp)
        wide = _split(raw, axis, unit_bytes, xp=xp)
        acc: list[Any] = [None] * per
        for k, j, shift in _overlaps(bits, per, unit_bytes):
            part = _shifted(wide[j], -shift, xp=xp)
            acc[k] = part if acc[k] is None else xp.bitwise_or(acc[k], part)
        mask = xp.asarray((1 << bits) - 1, dtype=xp.int16, device=dev)
        fields = _join([xp.bitwise_and(a, mask) for a in acc], axis, xp=xp)
    if fields.shape[axis] != n:
        fields = fields[(slice(None),) * axis + (slice(0, n), ...)]
    if not signed:
        return fields
    # sign-extend with (f ^ 2^(bits-1)) - 2^(bits-1), in int16 so no step overflows
    half = xp.asarray(1 << (bits - 1), dtype=xp.int16, device=dev)
    wide16 = xp.subtract(xp.bitwise_xor(xp.astype(fields, xp.int16), half), half)
    return xp.astype(wide16, xp.int8)
