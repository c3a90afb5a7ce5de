"""From a range to scales: ``s = 2 * alpha / (b - a)``, and two-level normalisation."""

from __future__ import annotations

from typing import Any

from array_api_compat import device as device_of

from ..invariants import Plan
from ..scheme import F32_TINY
from .roundup import round_up_scales

__all__ = ["effective_scale", "scales_from_absmax", "scales_from_range", "store_scales"]


def scales_from_absmax(alpha: Any, plan: Plan, *, xp: Any) -> tuple[Any, Any]:
    """Unrounded f32 scales (and the two-level global, else None) from ``alpha = max|x|``."""
    dev = device_of(alpha)
    two = xp.asarray(2.0, dtype=xp.float32, device=dev)
    span = xp.asarray(plan.value.span, dtype=xp.float32, device=dev)
    s = xp.divide(xp.multiply(alpha, two), span)  # multiply first, then divide, as Burn does
    if not plan.two_level:
        return s, None
    block_max = xp.asarray(plan.scale_dtype.max, dtype=xp.float32, device=dev)
    g = xp.divide(xp.reshape(xp.max(s), (1,)), block_max)
    g = xp.maximum(g, xp.asarray(F32_TINY, dtype=xp.float32, device=dev))
    return xp.divide(s, xp.reshape(g, (1,) * s.ndim)), g


def scales_from_range(lo: Any, hi: Any, plan: Plan, *, xp: Any) -> tuple[Any, Any]:
    """Unrounded f32 scales (and global) from a ``(min, max)`` range."""
    alpha = xp.maximum(xp.abs(lo), xp.abs(hi))
    return scales_from_absmax(xp.astype(alpha, xp.float32, copy=False), plan, xp=xp)


def effective_scale(stored: Any, glob: Any, plan: Plan, *, xp: Any) -> Any:
    """What codes are multiplied by: the stored scale, times the global in f32 if two-level."""
    if glob is None:
        return stored
    return xp.multiply(xp.reshape(glob, (1,) * stored.ndim), stored)


def store_scales(s: Any, plan: Plan, *, xp: Any) -> Any:
    """The stored form of unrounded scales: rounded up onto the innermost scale dtype."""
    return round_up_scales(s, plan.scale_dtype, xp=xp)
