"""Integer values: ``q = clip(round(x / eff), a, b)`` and ``x' = eff * q``."""

from __future__ import annotations

from typing import Any

from array_api_compat import device as device_of

from ..invariants import Plan

__all__ = ["dequantize_int", "quantize_int", "safe_divisor"]


def safe_divisor(eff: Any, *, xp: Any) -> Any:
    """``eff`` with zeros replaced by +inf: finite ``x / inf`` is 0, the zero-scale rule's code."""
    inf = xp.asarray(float("inf"), dtype=xp.float32, device=device_of(eff))
    return xp.where(eff == 0, inf, eff)


def _round_half_away(y: Any, *, xp: Any) -> Any:
    # Rust's f32::round. floor(|y| + 0.5) is wrong near 0.5 (the sum rounds), so fix only exact ties.
    t = xp.trunc(y)
    tie = xp.abs(xp.subtract(y, t)) == 0.5
    return xp.where(tie, xp.add(t, xp.sign(y)), xp.round(y))


def quantize_int(x: Any, divisor: Any, plan: Plan, *, rounding: str, scrub_nan: bool, xp: Any) -> Any:
    """int8 codes of f32 ``x`` divided by a broadcastable ``divisor`` (see :func:`safe_divisor`).

    ``scrub_nan`` maps NaN (from unchecked NaN input, or inf over a zero scale) to code 0; it is
    skipped when the input is known to be finite.
    """
    y = xp.divide(x, divisor)
    r = xp.round(y) if rounding == "half_even" else _round_half_away(y, xp=xp)
    if scrub_nan:
        r = xp.where(xp.isnan(r), xp.asarray(0.0, dtype=r.dtype, device=device_of(r)), r)
    r = xp.clip(r, float(plan.qmin), float(plan.qmax))
    return xp.astype(r, xp.int8)


def dequantize_int(codes: Any, eff: Any, *, xp: Any) -> Any:
    """``eff * code`` in f32."""
    return xp.multiply(xp.astype(codes, xp.float32), eff)
