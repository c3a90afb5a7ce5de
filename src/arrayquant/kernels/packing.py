"""Bit packing of fields into bytes along one axis, in uint8 only.

Field ``k`` of a group occupies bits ``[k*bits, (k+1)*bits)``, first field lowest. A PackedU32
word is four such bytes read little-endian, so packing to bytes here and reinterpreting four
bytes as one word (in the backend shim) gives Burn's layout on every backend, including those
without uint32 arithmetic.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device as device_of

__all__ = ["pack_fields", "padded_length", "unpack_fields"]


def padded_length(n: int, bits: int, word_bits: int) -> int:
    """Fields per line after padding ``n`` fields to whole words of ``word_bits``."""
    per_word = word_bits // bits
    return -(-n // per_word) * per_word


def pack_fields(codes: Any, bits: int, axis: int, word_bits: int, *, xp: Any) -> Any:
    """Pack integer ``codes`` (two's complement, truncated to ``bits``) into uint8 along ``axis``.

    Each line is zero-padded to whole words of ``word_bits``; the axis becomes
    ``padded_length * bits / 8`` bytes long.
    """
    dev = device_of(codes)
    mask = xp.asarray((1 << bits) - 1, dtype=xp.int16, device=dev)
    fields = xp.astype(xp.bitwise_and(xp.astype(codes, xp.int16), mask), xp.uint8)
    n = fields.shape[axis]
    total = padded_length(n, bits, word_bits)
    if total != n:
        pad_shape = (*tuple(fields.shape[:axis]), total - n, *tuple(fields.shape[axis + 1 :]))
        fields = xp.concat((fields, xp.zeros(pad_shape, dtype=xp.uint8, device=dev)), axis=axis)
    per_byte = 8 // bits
    if per_byte == 1:
        return fields
    shape = tuple(fields.shape)
    grouped = xp.reshape(fields, (*shape[:axis], total // per_byte, per_byte, *shape[axis + 1 :]))
    lead = (slice(None),) * (axis + 1)
    out = grouped[lead + (0, ...)]
    for k in range(1, per_byte):
        shift = xp.asarray(k * bits, dtype=xp.uint8, device=dev)
        out = xp.bitwise_or(out, xp.bitwise_left_shift(grouped[lead + (k, ...)], shift))
    return out


def unpack_fields(packed: Any, bits: int, axis: int, n: int, *, signed: bool, xp: Any) -> Any:
    """Inverse of :func:`pack_fields`: the first ``n`` fields along ``axis`` as int8 (or uint8)."""
    dev = device_of(packed)
    per_byte = 8 // bits
    if per_byte == 1:
        fields = packed
    else:
        mask = xp.asarray((1 << bits) - 1, dtype=xp.uint8, device=dev)
        parts = [
            xp.bitwise_and(xp.bitwise_right_shift(packed, xp.asarray(k * bits, dtype=xp.uint8, device=dev)), mask)
            for k in range(per_byte)
        ]
        stacked = xp.stack(parts, axis=axis + 1)
        shape = tuple(packed.shape)
        fields = xp.reshape(stacked, (*shape[:axis], shape[axis] * per_byte, *shape[axis + 1 :]))
    if fields.shape[axis] != n:
        fields = fields[(slice(None),) * axis + (slice(0, n), ...)]
    if not signed:
        return fields
    # sign-extend with (f ^ 2^(bits-1)) - 2^(bits-1), in int16 so no step overflows
    half = xp.asarray(1 << (bits - 1), dtype=xp.int16, device=dev)
    wide = xp.subtract(xp.bitwise_xor(xp.astype(fields, xp.int16), half), half)
    return xp.astype(wide, xp.int8)
