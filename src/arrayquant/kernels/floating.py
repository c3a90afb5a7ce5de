"""Float values: ``code = encode(clip(x / eff, -max, max))`` and ``x' = eff * decode(code)``."""

from __future__ import annotations

from typing import Any

from array_api_compat import device as device_of

from ..invariants import Plan
from .minifloat import decode, encode

__all__ = ["dequantize_float", "quantize_float"]


def quantize_float(x: Any, eff: Any, plan: Plan, *, scrub_nan: bool, xp: Any) -> Any:
    """uint8 minifloat codes of f32 ``x`` over a broadcastable effective scale ``eff``.

    Where ``eff == 0`` every code is +0 (not -0, not NaN). Encoding saturates at ±max and maps
    NaN as :func:`encode` says; with ``scrub_nan`` off the input is known to be finite.
    """
    dev = device_of(eff)
    zero = eff == 0
    fill = float("inf") if not scrub_nan else 1.0  # finite x / inf is ±0; with NaN about, avoid inf/inf
    y = xp.divide(x, xp.where(zero, xp.asarray(fill, dtype=eff.dtype, device=dev), eff))
    codes = encode(y, plan.value, xp=xp)
    return xp.where(zero, xp.asarray(0, dtype=xp.uint8, device=dev), codes)


def dequantize_float(codes: Any, eff: Any, plan: Plan, *, xp: Any) -> Any:
    """``eff * decode(code)`` in f32."""
    return xp.multiply(decode(codes, plan.value, xp=xp), eff)
