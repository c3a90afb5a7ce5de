"""Minifloat codes (E4M3, E5M2, E2M1), exact with standard operations only.

Encoding places ``|y|`` in its binade by comparison with exact powers of two, scales it by an
exact power of two so that one step of the grid is 1, rounds half to even and adds the binade
back as ``j << mbits``: a carry into the next binade falls out of the addition. No ``log2``,
``pow`` or bitcast. Decoding is a table lookup. E2M1, with eight magnitudes, is encoded by seven
threshold comparisons instead, which is equal bit for bit and several times faster.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

from array_api_compat import device as device_of

from ..scheme import QuantValue

__all__ = ["E2M1_STEPS", "FORMATS", "MinifloatFormat", "decode", "decode_table", "encode"]


class MinifloatFormat(NamedTuple):
    """An unsigned-magnitude minifloat with a sign bit on top."""

    bits: int
    mbits: int  # fraction bits
    emin: int  # exponent of the smallest normal binade
    emax: int  # exponent of the largest binade
    max: float
    nan_code: int | None  # the positive NaN code encoding writes, or None when NaN encodes as 0
    nan_from: int | None  # magnitudes from here up decode as NaN
    inf_code: int | None  # the +inf code, if the format has one (decoding only: encoding saturates)

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)


FORMATS = {
    QuantValue.E4M3: MinifloatFormat(8, 3, -6, 8, 448.0, 0x7F, 0x7F, None),
    QuantValue.E5M2: MinifloatFormat(8, 2, -14, 15, 57344.0, 0x7E, 0x7D, 0x7C),
    QuantValue.E2M1: MinifloatFormat(4, 1, 0, 2, 6.0, None, None, None),
}

# E2M1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6: midpoints with their tie direction (ties go to the
# even code, so the comparison is ">" where the lower code is even and ">=" where it is odd)
E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


@functools.cache
def decode_table(value: QuantValue) -> tuple[float, ...]:
    """The f32 value of every code of ``value`` (NaN and inf where the format has them)."""
    fmt = FORMATS[value]
    out = []
    for code in range(1 << fmt.bits):
        mag = code & (fmt.sign_bit - 1)
        field, frac = mag >> fmt.mbits, mag & ((1 << fmt.mbits) - 1)
        if fmt.nan_from is not None and mag >= fmt.nan_from:
            v = math.nan
        elif fmt.inf_code is not None and mag == fmt.inf_code:
            v = math.inf
        elif field == 0:
            v = math.ldexp(frac, fmt.emin - fmt.mbits)
        else:
            v = math.ldexp((1 << fmt.mbits) + frac, fmt.emin + field - 1 - fmt.mbits)
        out.append(-v if code & fmt.sign_bit else v)
    return tuple(out)


def _magnitude_code_e2m1(a: Any, *, xp: Any) -> Any:
    code = xp.zeros(a.shape, dtype=xp.uint8, device=device_of(a))
    for threshold, inclusive in E2M1_STEPS:
        hit = a >= threshold if inclusive else a > threshold
        code = xp.add(code, xp.astype(hit, xp.uint8))
    return code


def _magnitude_code_binade(a: Any, fmt: MinifloatFormat, *, xp: Any) -> Any:
    dev = device_of(a)
    # uint8 throughout (binade index <= 29, code <= 127): a quarter of int32's memory traffic
    j = xp.zeros(a.shape, dtype=xp.uint8, device=dev)
    for e in range(fmt.emin + 1, fmt.emax + 1):
        j = xp.add(j, xp.astype(a >= 2.0**e, xp.uint8))
    scale = xp.asarray(
        [2.0 ** (fmt.mbits - fmt.emin - k) for k in range(fmt.emax - fmt.emin + 1)], dtype=xp.float32, device=dev
    )
    t = xp.multiply(a, xp.reshape(xp.take(scale, xp.reshape(xp.astype(j, xp.int32), (-1,))), a.shape))
    n = xp.astype(xp.round(t), xp.uint8)  # at most 2^(mbits + 1): in range, no clip needed
    return xp.add(n, xp.multiply(j, xp.asarray(1 << fmt.mbits, dtype=xp.uint8, device=dev)))


def encode(y: Any, value: QuantValue, *, xp: Any) -> Any:
    """uint8 codes of f32 ``y``: round to nearest even, saturate at ±max, keep -0.0.

    NaN gives the format's NaN code with the input's sign (E4M3 0x7F/0xFF, E5M2 0x7E/0xFE), or
    0 for E2M1, as ml_dtypes does after clipping to ±max.
    """
    fmt = FORMATS[value]
    dev = device_of(y)
    nan = xp.isnan(y)
    a = xp.minimum(xp.abs(y), xp.asarray(fmt.max, dtype=xp.float32, device=dev))
    a = xp.where(nan, xp.asarray(0.0, dtype=xp.float32, device=dev), a)  # code math on a number
    mag = _magnitude_code_e2m1(a, xp=xp) if value is QuantValue.E2M1 else _magnitude_code_binade(a, fmt, xp=xp)
    sign = xp.astype(xp.signbit(y), xp.uint8)
    if fmt.nan_code is None:
        sign = xp.where(nan, xp.asarray(0, dtype=xp.uint8, device=dev), sign)
    else:
        mag = xp.where(nan, xp.asarray(fmt.nan_code, dtype=xp.uint8, device=dev), mag)
    shift = xp.asarray(fmt.bits - 1, dtype=xp.uint8, device=dev)
    return xp.bitwise_or(mag, xp.bitwise_left_shift(sign, shift))


def decode(codes: Any, value: QuantValue, *, xp: Any) -> Any:
    """f32 values of uint8 ``codes`` (fields of ``value``), by table lookup.

    Only the field's own bits index the table, so a stray high nibble in a hand-built native E2M1
    tensor cannot index past it (the readers refuse such bytes outright).
    """
    dev = device_of(codes)
    table = xp.asarray(decode_table(value), dtype=xp.float32, device=dev)
    field = xp.bitwise_and(codes, xp.asarray((1 << FORMATS[value].bits) - 1, dtype=codes.dtype, device=dev))
    flat = xp.astype(xp.reshape(field, (-1,)), xp.int32)
    return xp.reshape(xp.take(table, flat), tuple(codes.shape))
