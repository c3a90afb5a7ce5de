"""The round-up storage rule on arrays, exact with standard operations only.

Each value is placed in its binade by comparison against a table of exact powers of two, scaled
by an exact power of two so one grid step becomes 1, rounded up with ``ceil`` and scaled back.
No ``log2`` or ``pow``: those are wrong for thousands of f32 inputs.
"""

from __future__ import annotations

import functools
from typing import Any

from array_api_compat import device as device_of

from ..scheme import ScaleDtype

__all__ = ["pow2_tables", "round_down_signed", "round_up_scales"]


@functools.cache  # why: built in Python for every row slab otherwise
def pow2_tables(dtype: ScaleDtype) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    """The binade thresholds of ``dtype``'s grid and the power-of-two factors (up and inverse, each
    split in two normal f32 factors) that round a scale up onto it; the fused kernels take the same."""
    g = dtype.grid
    thresholds = [2.0**e for e in range(g.emin + 1, g.emax + 1)]
    # j binades above emin scale by 2^(mbits - emin - j); split in two factors so that each
    # fits in f32 (2^133 for BF16 subnormals does not) and every product stays exact.
    up_a, up_b = [], []
    for j in range(len(thresholds) + 1):
        k = g.mbits - g.emin - j
        up_a.append(2.0 ** -(-k // 2))
        up_b.append(2.0 ** (k // 2))
    return thresholds, up_a, up_b, [1.0 / v for v in up_a], [1.0 / v for v in up_b]


def round_up_scales(s: Any, dtype: ScaleDtype, *, xp: Any) -> Any:
    """Round non-negative f32 scales up onto ``dtype``'s grid; NaN stays NaN, large saturate.

    >>> import array_api_strict as xp
    >>> s = xp.asarray([0.3, 1e-3, 500.0, 0.0], dtype=xp.float32)
    >>> [float(v) for v in round_up_scales(s, ScaleDtype.UE4M3, xp=xp)] == [0.3125, 2.0**-9, 448.0, 0.0]
    True
    """
    return _round_onto(s, dtype, xp.ceil, xp=xp)


def round_down_signed(m: Any, dtype: ScaleDtype, *, xp: Any) -> Any:
    """Round f32 values of either sign down (toward -inf) onto ``dtype``'s grid (F32, F16 or BF16).

    Offsets are stored this way, so that an offset never passes the smallest value it stands
    for. Beyond the dtype's range values saturate at its largest magnitude.

    >>> import array_api_strict as xp
    >>> m = xp.asarray([0.1, -0.1, 2.0, -70000.0], dtype=xp.float32)
    >>> [float(v) for v in round_down_signed(m, ScaleDtype.F16, xp=xp)]
    [0.0999755859375, -0.10003662109375, 2.0, -65504.0]
    """
    mag = xp.abs(m)  # both roundings of |m|: no branch sees a negative value (no overflow, lazily either)
    up = _round_onto(mag, dtype, xp.ceil, xp=xp)
    down = _round_onto(mag, dtype, xp.floor, xp=xp)
    return xp.where(m < 0, xp.negative(up), down)


def _round_onto(s: Any, dtype: ScaleDtype, step: Any, *, xp: Any) -> Any:
    """Non-negative f32 ``s`` onto ``dtype``'s grid with ``step`` (``ceil`` up, ``floor`` down)."""
    dev = device_of(s)
    if dtype is ScaleDtype.F32:
        return xp.add(s, xp.asarray(0.0, dtype=s.dtype, device=dev))  # -0.0 -> +0.0
    g = dtype.grid
    shape = tuple(s.shape)
    thresholds, up_a, up_b, inv_a, inv_b = pow2_tables(dtype)
    f32 = xp.float32
    a = xp.minimum(xp.reshape(s, (-1,)), xp.asarray(g.max, dtype=f32, device=dev))
    j = xp.searchsorted(xp.asarray(thresholds, dtype=f32, device=dev), a, side="right")
    pa = xp.take(xp.asarray(up_a, dtype=f32, device=dev), j)
    pb = xp.take(xp.asarray(up_b, dtype=f32, device=dev), j)
    n = step(xp.multiply(xp.multiply(a, pa), pb))
    down_a = xp.asarray(inv_a, dtype=f32, device=dev)
    down_b = xp.asarray(inv_b, dtype=f32, device=dev)
    r = xp.multiply(xp.multiply(n, xp.take(down_a, j)), xp.take(down_b, j))
    r = xp.minimum(r, xp.asarray(g.max, dtype=f32, device=dev))
    if g.floor > 0:
        r = xp.maximum(r, xp.asarray(g.floor, dtype=f32, device=dev))
    r = xp.add(r, xp.asarray(0.0, dtype=f32, device=dev))  # -0.0 -> +0.0
    return xp.reshape(r, shape)
