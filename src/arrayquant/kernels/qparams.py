"""From a range to scales: ``s = 2 * alpha / (b - a)``, and two-level normalisation."""

from __future__ import annotations

from typing import Any

from array_api_compat import device as device_of

from ..invariants import Plan
from ..scheme import F32_MAX, F32_TINY, ScaleDtype
from .minifloat import FORMATS
from .roundup import round_up_scales

__all__ = [
    "block_scales",
    "effective_scale",
    "global_scale",
    "normalise_scales",
    "scales_from_absmax",
    "scales_from_range",
    "store_scales",
]


def scales_from_absmax(alpha: Any, plan: Plan, *, xp: Any, table: Any = None) -> tuple[Any, Any]:
    """Unrounded f32 scales (and the two-level global, else None) from ``alpha = max|x|``.

    In lookup mode ``alpha`` maps to the table's largest magnitude: ``s = alpha / max|table|``.
    """
    if plan.scheme.scale_rule == "ocp":
        return _ocp_scales(alpha, plan, xp=xp), None
    s = block_scales(alpha, plan, xp=xp, table=table)
    if not plan.two_level:
        return s, None
    g = global_scale(xp.reshape(xp.max(s), (1,)), plan, xp=xp)
    return normalise_scales(s, g, xp=xp), g


def block_scales(alpha: Any, plan: Plan, *, xp: Any, table: Any = None) -> Any:
    """One-level scales ``2 * alpha / (b - a)`` (or ``alpha / max|table|``), before two-level normalisation.

    Computed as ``alpha / ((b - a) / 2)``: halving ``b - a`` and doubling ``alpha`` are both exact,
    so the correctly rounded quotient is the same bits as Burn's multiply-then-divide, except that
    ``2 * alpha`` no longer overflows for data in the top binade of f32.
    """
    if table is not None:
        return xp.divide(alpha, xp.max(xp.abs(table)))
    half_span = xp.asarray(plan.value.span / 2, dtype=xp.float32, device=device_of(alpha))
    return xp.divide(alpha, half_span)


def global_scale(s_max: Any, plan: Plan, *, xp: Any) -> Any:
    """The ``(1,)`` two-level per-tensor scale from the largest block scale: block scales then fit their dtype."""
    dev = device_of(s_max)
    block_max = xp.asarray(plan.scale_dtype.max, dtype=xp.float32, device=dev)
    g = xp.divide(s_max, block_max)
    return xp.maximum(g, xp.asarray(F32_TINY, dtype=xp.float32, device=dev))


def normalise_scales(s: Any, g: Any, *, xp: Any) -> Any:
    """Block scales relative to the two-level global ``g``."""
    return xp.divide(s, xp.reshape(g, (1,) * s.ndim))


def _ocp_scales(alpha: Any, plan: Plan, *, xp: Any) -> Any:
    """OCP MX: ``2^(floor(log2 alpha) - emax)`` with ``emax`` the element format's largest exponent.

    ``floor(log2 alpha)`` comes exactly from the UE8M0 round-up (the smallest power of two not
    below alpha, halved unless alpha is that power); zero maps to the smallest scale, 2^-127.
    """
    dev = device_of(alpha)
    up = round_up_scales(alpha, ScaleDtype.UE8M0, xp=xp)
    half = xp.asarray(0.5, dtype=xp.float32, device=dev)
    floor = xp.where(up == alpha, up, xp.multiply(up, half))
    emax = FORMATS[plan.value].emax
    return xp.multiply(floor, xp.asarray(2.0**-emax, dtype=xp.float32, device=dev))


def scales_from_range(lo: Any, hi: Any, plan: Plan, *, xp: Any, table: Any = None) -> tuple[Any, Any]:
    """Unrounded f32 scales (and global) from a ``(min, max)`` range."""
    alpha = xp.maximum(xp.abs(lo), xp.abs(hi))
    return scales_from_absmax(xp.astype(alpha, xp.float32, copy=False), plan, xp=xp, table=table)


def effective_scale(stored: Any, glob: Any, plan: Plan, *, xp: Any) -> Any:
    """What codes are multiplied by: the stored scale, times the global in f32 if two-level.

    The product saturates at the f32 maximum: rounding the global down and the block scale up can
    carry it just past it when the data reaches the top of f32 (Q2S, whose scale is ``max|x|``).
    """
    if glob is None:
        return stored
    eff = xp.multiply(xp.reshape(glob, (1,) * stored.ndim), stored)
    return xp.minimum(eff, xp.asarray(F32_MAX, dtype=xp.float32, device=device_of(eff)))


def store_scales(s: Any, plan: Plan, *, xp: Any) -> Any:
    """The stored form of unrounded scales: rounded up onto the innermost scale dtype."""
    return round_up_scales(s, plan.scale_dtype, xp=xp)
