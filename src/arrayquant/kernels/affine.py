"""Affine values: a zero point (``x = s * (q - z)``) or an offset (``x = d * q + m``) per scale.

Both modes calibrate on the block's ``(min, max)``; the arithmetic, step by step in f32:

- zero point: ``s = (max(hi, 0) - min(lo, 0)) / (qmax - qmin)`` rounded up onto the scale dtype
  (the range always holds 0, so that 0 and zero padding are exact), then
  ``z = clip(round_half_even(qmin - min(lo, 0) / s), qmin, qmax)``; codes
  ``q = clip(round(x / s) + z, qmin, qmax)`` (ONNX's QuantizeLinear order: the integer ``z`` is
  added after rounding, so no tie moves); values ``(q - z) * s``, the difference exact in integers.
- offset: ``m = lo`` rounded down onto the scale dtype, ``d = (hi - m) / qmax`` rounded up, codes
  ``q = clip(round((x - m) / d), 0, qmax)``; values ``d * q + m`` (product rounded, then the sum,
  as ggml's ``dequantize_row_q4_1`` and gguf-py compute it).

Where the scale is 0 the zero point is 0 and every code is ``z`` (zero point) or 0 (offset):
the block reads back as 0, or as its offset.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device as device_of

from ..invariants import Plan
from ..scheme import F32_MAX, QuantMode
from .blocks import as_blocks, block_reduce, pad_to_blocks
from .integer import round_codes, safe_divisor
from .roundup import round_down_signed, round_up_scales

__all__ = ["affine_decode", "affine_encode", "affine_params", "affine_range", "may_overflow"]


def affine_range(x: Any, dims: tuple[int, ...], *, xp: Any, finite_only: bool) -> tuple[Any, Any]:
    """``(min, max)`` per block (grid-shaped) or per tensor (``(1,)``), in f32.

    NaN propagates, so a non-finite block shows as a non-finite bound, unless ``finite_only``
    takes the finite values alone (a block with none gives ``(0, 0)``).
    """
    v = xp.astype(x, xp.float32, copy=False)
    lo_src, hi_src = v, v
    if finite_only:
        dev = device_of(v)
        fin = xp.isfinite(v)
        lo_src = xp.where(fin, v, xp.asarray(float("inf"), dtype=xp.float32, device=dev))
        hi_src = xp.where(fin, v, xp.asarray(float("-inf"), dtype=xp.float32, device=dev))
    if not dims:
        lo, hi = xp.reshape(xp.min(lo_src), (1,)), xp.reshape(xp.max(hi_src), (1,))
    else:
        # edge padding repeats each line's last element: a partial block keeps its own min and max
        lo = block_reduce(as_blocks(pad_to_blocks(lo_src, dims, xp=xp, edge=True), dims, xp=xp), xp.minimum, xp=xp)
        hi = block_reduce(as_blocks(pad_to_blocks(hi_src, dims, xp=xp, edge=True), dims, xp=xp), xp.maximum, xp=xp)
    if finite_only:
        empty = lo > hi
        zero = xp.asarray(0.0, dtype=xp.float32, device=device_of(lo))
        lo, hi = xp.where(empty, zero, lo), xp.where(empty, zero, hi)
    return lo, hi


def _spread(hi: Any, lo: Any, n: float, *, xp: Any) -> Any:
    """``(hi - lo) / n`` in f32, or ``hi / n - lo / n`` where the difference passes the f32 maximum."""
    dev = device_of(hi)
    span = xp.asarray(n, dtype=xp.float32, device=dev)
    diff = xp.subtract(hi, lo)
    return xp.where(xp.isinf(diff), xp.subtract(xp.divide(hi, span), xp.divide(lo, span)), xp.divide(diff, span))


def affine_params(lo: Any, hi: Any, plan: Plan, *, xp: Any) -> tuple[Any, Any]:
    """Stored ``(scales, zero)`` from a finite range: zero points as f32 integers, or offsets.

    Both grids are f32 here; the zero points hold integers in ``[qmin, qmax]``.
    """
    dev = device_of(lo)
    f32 = xp.float32
    zero = xp.asarray(0.0, dtype=f32, device=dev)
    if plan.mode is QuantMode.OFFSET:
        m = round_down_signed(lo, plan.scale_dtype, xp=xp)
        d = round_up_scales(_spread(hi, m, float(plan.qmax), xp=xp), plan.scale_dtype, xp=xp)
        return d, m
    lo0, hi0 = xp.minimum(lo, zero), xp.maximum(hi, zero)
    s = round_up_scales(_spread(hi0, lo0, float(plan.qmax - plan.qmin), xp=xp), plan.scale_dtype, xp=xp)
    qmin = xp.asarray(float(plan.qmin), dtype=f32, device=dev)
    z = xp.round(xp.subtract(qmin, xp.divide(lo0, safe_divisor(s, xp=xp))))
    z = xp.clip(z, float(plan.qmin), float(plan.qmax))
    return s, xp.where(s == 0, zero, z)


def affine_encode(x: Any, s: Any, zero: Any, plan: Plan, *, rounding: str, scrub_nan: bool, xp: Any) -> Any:
    """Codes (``plan.code_dtype``) of f32 ``x`` over broadcastable stored scales and zero points or offsets.

    With ``scrub_nan`` (input not verified finite) NaN takes the code nearest 0 (``z``, or the
    code of ``-m``); infinities saturate to the range ends.
    """
    dev = device_of(x)
    div = safe_divisor(s, xp=xp)
    offset = plan.mode is QuantMode.OFFSET
    y = xp.divide(xp.subtract(x, zero), div) if offset else xp.divide(x, div)
    r = round_codes(y, rounding, xp=xp)
    if scrub_nan:
        nearest_zero = round_codes(xp.divide(xp.negative(zero), div), rounding, xp=xp) if offset else 0.0
        r = xp.where(xp.isnan(r), xp.asarray(nearest_zero, dtype=xp.float32, device=dev), r)
    if not offset:
        r = xp.add(r, zero)
    r = xp.clip(r, float(plan.qmin), float(plan.qmax))
    return xp.astype(r, getattr(xp, plan.code_dtype))


def affine_decode(codes: Any, s: Any, zero: Any, plan: Plan, *, xp: Any) -> Any:
    """f32 values of codes: ``(q - z) * s`` (the difference exact, in int16) or ``d * q + m``."""
    if plan.mode is QuantMode.OFFSET:
        return xp.add(xp.multiply(xp.astype(codes, xp.float32), s), zero)
    diff = xp.subtract(xp.astype(codes, xp.int16), xp.astype(zero, xp.int16))
    return xp.multiply(xp.astype(diff, xp.float32), s)


def may_overflow(s: Any, zero: Any, plan: Plan, *, xp: Any) -> bool:
    """Whether some code can decode past the f32 maximum (readable grids only; callers clip then)."""
    top = float(xp.max(s))
    if plan.mode is QuantMode.OFFSET:
        bound = top * plan.qmax + float(xp.max(xp.abs(zero)))
    else:
        bound = top * (plan.qmax - plan.qmin)
    return bound > F32_MAX * (1 - 2.0**-20)
