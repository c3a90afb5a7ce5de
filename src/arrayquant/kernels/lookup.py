"""Lookup mode: the field is an unsigned index into a ``2**bits``-entry table (e.g. NF4).

``x' = table[field] * eff``; quantization picks the nearest entry of ``x / eff``, ties to the
lower index. The field is stored like any other code of its width (two's complement in int8,
truncated to ``bits`` when packed), so storage and packing need no special case.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device as device_of

from ..invariants import Plan

__all__ = ["dequantize_lookup", "quantize_lookup"]

_GROUP = 16


def quantize_lookup(x: Any, eff: Any, table: Any, plan: Plan, *, scrub_nan: bool, xp: Any) -> Any:
    """int8 codes holding the index of the table entry nearest to ``x / eff``."""
    dev = device_of(eff)
    zero = eff == 0
    fill = float("inf") if not scrub_nan else 1.0
    y = xp.divide(x, xp.where(zero, xp.asarray(fill, dtype=eff.dtype, device=dev), eff))
    shape = tuple(y.shape)
    y = xp.reshape(y, (-1,))  # flat: the entries axis added below must not pass NumPy's 64 axes
    # nearest entry in groups of 16: an argmin over a small stacked axis (first occurrence on ties)
    # keeps both the temporaries and a lazy graph shallow even for 256-entry tables
    best: Any = None
    best_d: Any = None
    n = table.shape[0]
    for start in range(0, n, _GROUP):
        group = table[start : min(start + _GROUP, n)]
        d = xp.abs(xp.subtract(xp.expand_dims(y, axis=-1), group))
        k = xp.add(xp.astype(xp.argmin(d, axis=-1), xp.int16), xp.asarray(start, dtype=xp.int16, device=dev))
        dk = xp.min(d, axis=-1)
        if best is None:
            best, best_d = k, dk
        else:
            closer = dk < best_d  # strict: a tie keeps the lower index
            best = xp.where(closer, k, best)
            best_d = xp.where(closer, dk, best_d)
    half = xp.asarray(1 << (plan.bits - 1), dtype=xp.int16, device=dev)
    codes = xp.reshape(xp.astype(xp.subtract(xp.bitwise_xor(best, half), half), xp.int8), shape)
    return xp.where(zero, xp.asarray(0, dtype=xp.int8, device=dev), codes)


def dequantize_lookup(codes: Any, eff: Any, table: Any, plan: Plan, *, xp: Any) -> Any:
    """``table[field] * eff`` in f32, the field being the code's low ``bits`` bits."""
    mask = xp.asarray((1 << plan.bits) - 1, dtype=xp.int16, device=device_of(codes))
    field = xp.astype(xp.bitwise_and(xp.astype(codes, xp.int16), mask), xp.int32)
    values = xp.reshape(xp.take(table, xp.reshape(field, (-1,))), tuple(codes.shape))
    return xp.multiply(values, eff)
