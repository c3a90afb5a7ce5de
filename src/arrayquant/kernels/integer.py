"""Integer values: ``q = clip(round(x / eff), a, b)`` and ``x' = eff * q``."""

from __future__ import annotations

from typing import Any

from array_api_compat import device as device_of

from ..invariants import Plan

__all__ = ["dequantize_int", "quantize_int", "round_codes", "safe_divisor"]


def safe_divisor(eff: Any, *, xp: Any) -> Any:
    """``eff`` with zeros replaced by +inf: finite ``x / inf`` is 0, the zero-scale rule's code."""
    inf = xp.asarray(float("inf"), dtype=xp.float32, device=device_of(eff))
    return xp.where(eff == 0, inf, eff)


def _round_half_away(y: Any, *, xp: Any) -> Any:
    # Rust's f32::round. floor(|y| + 0.5) is wrong near 0.5 (the sum rounds), so fix only exact ties.
    t = xp.trunc(y)
    tie = xp.abs(xp.subtract(y, t)) == 0.5
    return xp.where(tie, xp.add(t, xp.sign(y)), xp.round(y))


def round_codes(y: Any, rounding: str, *, xp: Any) -> Any:
    """``y`` rounded to integers (still f32): ties to even, or away from zero for ``"half_away"``."""
    return xp.round(y) if rounding == "half_even" else _round_half_away(y, xp=xp)


def quantize_int(x: Any, eff: Any, plan: Plan, *, rounding: str, scrub_nan: bool, xp: Any) -> Any:
    """int8 codes of f32 ``x`` over a broadcastable effective scale ``eff``.

    Finite input over a zero scale divides by +inf and gives code 0 with no extra pass. With
    ``scrub_nan`` (input not known to be finite) NaN maps to 0 and zero scales are masked instead,
    so that inf over a zero scale never forms inf/inf.
    """
    if not scrub_nan:
        r = round_codes(xp.divide(x, safe_divisor(eff, xp=xp)), rounding, xp=xp)
    else:
        dev = device_of(eff)
        zero = eff == 0
        r = round_codes(
            xp.divide(x, xp.where(zero, xp.asarray(1.0, dtype=eff.dtype, device=dev), eff)), rounding, xp=xp
        )
        r = xp.where(xp.logical_or(xp.isnan(r), zero), xp.asarray(0.0, dtype=r.dtype, device=dev), r)
    r = xp.clip(r, float(plan.qmin), float(plan.qmax))
    return xp.astype(r, xp.int8)


def dequantize_int(codes: Any, eff: Any, *, xp: Any) -> Any:
    """``eff * code`` in f32."""
    return xp.multiply(xp.astype(codes, xp.float32), eff)
