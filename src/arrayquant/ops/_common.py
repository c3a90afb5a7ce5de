"""What every operation on quantized tensors shares: propagation, the float view, requantization.

Burn decides per operation whether a quantized input stays quantized. Operations that go through
floats compute on the dequantized values; where Burn requantizes at all, ``propagation`` chooses:
``"inhibit"`` (Burn's default) returns the float result, ``"propagate"`` quantizes it again with the
input's scheme (the left operand's for two operands), its scales found afresh by MinMax.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import array_api_compat as compat

from ..dequantize import dequantize
from ..errors import DTypeError, SchemeError, ShapeError
from ..invariants.data import can_read, check_same_place, check_shape
from ..quantize import quantize
from ..scheme import BlockSize, QuantScheme
from ..tensor import QuantizedTensor

__all__ = [
    "PROPAGATIONS",
    "check_propagation",
    "check_result_size",
    "fit_scheme",
    "floats",
    "operand",
    "positions",
    "requantize",
    "same_place",
]

PROPAGATIONS = ("inhibit", "propagate")


def check_propagation(propagation: object) -> str:
    """``propagation`` as one of :data:`PROPAGATIONS`, else a :class:`SchemeError` saying which exist."""
    if isinstance(propagation, str) and propagation in PROPAGATIONS:
        return propagation
    msg = (
        f"propagation must be 'inhibit' (return floats, Burn's default) or 'propagate' (quantize the "
        f"result again with the input's scheme), got {propagation!r}"
    )
    raise SchemeError(msg)


def check_result_size(shape: tuple[int, ...], what: str, fix: str) -> None:
    """Refuse a result past the limits :func:`~arrayquant.quantize` enforces (axes, elements), before it is built.

    An operation that grows its input from an argument (a count, a target shape, many inputs) checks
    here first, so an absurd size is a :class:`ShapeError` saying ``fix``, not a MemoryError, an
    overflow or a crash inside the backend.
    """
    try:
        check_shape(shape, what)
    except ShapeError as exc:
        raise ShapeError(f"{exc}; {fix}") from None


def floats(qt: QuantizedTensor) -> Any:
    """The float array ``qt`` stands for, in its own dtype, namespace and device."""
    return dequantize(qt)


def operand(v: Any) -> Any:
    """A float view of an operand: a quantized tensor dequantized; arrays and Python scalars as they are."""
    return floats(v) if isinstance(v, QuantizedTensor) else v


def fit_scheme(scheme: QuantScheme, rank: int) -> QuantScheme:
    """``scheme`` for data of ``rank`` axes: the block's leading extents beyond the rank dropped,
    and a store packing an axis the data lacks packing the last one instead.

    A result can have fewer axes than its input (``qt[0]``, a reduction, a matrix-vector product);
    the nearest scheme keeps the value, the scale dtypes and the block along the remaining axes.
    """
    out = scheme
    block = scheme.block_size
    if block is not None and len(block.dims) > rank and scheme.block_scale is not None:
        out = out.per_block(BlockSize(block.dims[len(block.dims) - rank :]), scheme.block_scale)
    if out.store.is_packed and out.store.dim >= rank:
        out = out.with_store(dataclasses.replace(out.store, dim=0))
    return out


def requantize(y: Any, like: QuantizedTensor) -> QuantizedTensor:
    """``y`` quantized with ``like``'s scheme (and table), its scales found by MinMax, as Burn does.

    A 0-d ``y`` becomes shape ``(1,)`` (Burn's full reductions); the scheme is fitted to ``y``'s rank
    (:func:`fit_scheme`).
    """
    if y.ndim == 0:
        y = compat.array_namespace(y).reshape(y, (1,))
    return quantize(y, fit_scheme(like.scheme, y.ndim), table=like.table)


def same_place(**operands: Any) -> None:
    """Every array or quantized operand must share one namespace and device (a typed DeviceError if not)."""
    arrays = {k: (v.values if isinstance(v, QuantizedTensor) else v) for k, v in operands.items()}
    first = next((a for a in arrays.values() if a is not None and compat.is_array_api_obj(a)), None)
    if first is None:
        return
    check_same_place(compat.array_namespace(first), compat.device(first), **arrays)


def positions(qt: QuantizedTensor, indices: Any, n: int, what: str) -> Any:
    """Integer ``indices`` into an axis of length ``n``, in ``[-n, n)``, as non-negative positions.

    A list is taken into ``qt``'s namespace; the range is checked where the indices can be read now.
    """
    xp = compat.array_namespace(qt.values)
    if isinstance(indices, QuantizedTensor):
        msg = f"{what} indices must be an integer array, got a QuantizedTensor"
        raise DTypeError(msg)
    if not compat.is_array_api_obj(indices):
        try:
            indices = xp.asarray(indices, device=qt.device)
        except (ValueError, TypeError) as e:  # ragged lists, objects
            msg = f"{what} indices must be an integer array or a nested list of ints of one shape: {e}"
            raise ShapeError(msg) from None
    same_place(qt=qt, indices=indices)
    if not xp.isdtype(indices.dtype, "integral"):
        msg = f"{what} indices must be an integer array, got dtype {indices.dtype}"
        raise DTypeError(msg)
    if can_read(indices) and math.prod(indices.shape) and bool(xp.any((indices < -n) | (indices >= n))):
        msg = f"{what} indices must lie in [{-n}, {n}) for an axis of length {n}"
        raise ShapeError(msg)
    idx = xp.astype(
        indices, xp.asarray(0, device=qt.device).dtype
    )  # the default int: int64, or int32 on JAX without x64
    return xp.where(idx < 0, idx + n, idx)
