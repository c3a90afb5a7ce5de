"""What every fused kernel covers, whatever the library: one rule, so the kernels agree on it.

Symmetric mode (not lookup tables, not the affine modes) over Burn's value kinds, data of at least
one axis, blocks along the last axis only (or one scale per tensor), and packing, if any, along the
last axis. Each kernel module adds what
is its own (its library installed, the host's byte order, the value kinds it knows).
"""

from __future__ import annotations

from ..invariants import Plan
from ..scheme import QuantMode

__all__ = ["layout_reason", "weight_reason"]


def layout_reason(plan: Plan, shape: tuple[int, ...]) -> str:
    """Why the fused kernels do not cover data of ``shape`` under ``plan``, or ``""`` when they do."""
    if not shape:
        return "0-d data is not fused"
    if plan.scheme.mode is not QuantMode.SYMMETRIC:
        return f"{plan.scheme.mode.value} mode is not fused"
    if not plan.value.is_burn:
        return f"{plan.value.name} values are not fused (Burn's value kinds are)"
    dims = plan.block_dims(shape)
    if any(d != 1 for d in dims[:-1]):
        return "blocks spanning more than the last axis are not fused"
    try:
        axis = plan.packed_axis(len(shape))
    except Exception:  # the driver reports the missing axis with its own message
        return "the packed axis does not exist for this rank"
    if axis is not None and axis != len(shape) - 1:
        return "packing along an axis other than the last is not fused"
    return ""


def weight_reason(plan: Plan, shape: tuple[int, ...]) -> str:
    """Why the fused matrix products (Numba and CuPy) do not cover a weight ``(N, K)``, or ``""``.

    A 2-d weight, no lookup codebook, minifloats symmetric, and one scale per tensor, per row or per
    block along K; each kernel module adds what is its own.
    """
    if len(shape) != 2:
        return f"the fused product needs a 2-d weight (N, K), got shape {tuple(shape)}"
    if plan.scheme.mode is QuantMode.LOOKUP or plan.scheme.codebook is not None:
        return "lookup codebooks are not fused"
    if plan.value.is_float and plan.scheme.mode is not QuantMode.SYMMETRIC:
        return f"{plan.scheme.mode.value} minifloats are not fused"
    dims = plan.block_dims(tuple(shape))
    if dims and dims[0] != 1:
        return "blocks spanning more than the last axis are not fused"
    return ""
