"""Searching functions on quantized tensors: argmax, argmin and where (the Array API's category).

:func:`argmax` and :func:`argmin` return integer indices into the dequantized values;
:func:`where` returns floats whatever the propagation (Burn's ``mask_where`` dequantizes first).
"""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from ..tensor import QuantizedTensor
from ._common import (
    BROADCAST_RESULT,
    allocating,
    check_flag,
    check_mask,
    check_operands,
    float_args,
    floats,
    one_axis,
    require_quantized,
)

__all__ = ["argmax", "argmin", "where"]


def _arg_reduce(op: str, x: QuantizedTensor, axis: int | None, keepdims: bool) -> Any:
    """The namespace's ``op`` (``argmax`` or ``argmin``) of ``x``'s dequantized values, the arguments checked."""
    qt = require_quantized(x)
    ax = None if axis is None else one_axis(axis, len(qt.shape))
    keepdims = check_flag(keepdims, "keepdims")
    f = floats(qt)
    return getattr(compat.array_namespace(f), op)(f, axis=ax, keepdims=keepdims)


def argmax(x: QuantizedTensor, /, *, axis: int | None = None, keepdims: bool = False) -> Any:
    """Index of the largest dequantized value (first on ties), an integer array.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    return _arg_reduce("argmax", x, axis, keepdims)


def argmin(x: QuantizedTensor, /, *, axis: int | None = None, keepdims: bool = False) -> Any:
    """Index of the smallest dequantized value (first on ties), an integer array.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    return _arg_reduce("argmin", x, axis, keepdims)


def where(condition: Any, x1: Any, x2: Any, /) -> Any:
    """``x1`` where ``condition`` holds, else ``x2``, as floats (Burn ``mask_where``).

    Burn's ``t.mask_where(mask, value)`` is ``where(mask, value, t)``.

    Parameters
    ----------
    condition : bool array
    x1, x2 : QuantizedTensor, array or Python scalar
        At least one quantized; all three broadcast together.

    Returns
    -------
    array

    Raises
    ------
    DTypeError
        ``condition`` not a bool array, or no quantized operand.
    ShapeError
        Operands that do not broadcast.
    DeviceError
        Operands in different namespaces or on different devices.
    """
    check_mask(condition, "condition")
    quantized = check_operands(("condition", "x1", "x2"), (condition, x1, x2))
    a, b = float_args((x1, x2), quantized[0])
    return allocating(lambda: compat.array_namespace(a).where(condition, a, b), BROADCAST_RESULT)
