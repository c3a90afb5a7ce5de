"""Utility functions on quantized tensors: any and all (the Array API's category), bool results."""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from ..tensor import QuantizedTensor
from ._common import check_flag, floats, reduce_axes, require_quantized

__all__ = ["all", "any"]


def _truth_reduce(op: str, x: QuantizedTensor, axis: Any, keepdims: bool) -> Any:
    """The namespace's ``op`` (``any`` or ``all``) of ``x``'s dequantized values, the arguments checked."""
    qt = require_quantized(x)
    axes = reduce_axes(axis, len(qt.shape))
    keepdims = check_flag(keepdims, "keepdims")
    f = floats(qt)
    return getattr(compat.array_namespace(f), op)(f, axis=axes, keepdims=keepdims)


def any(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False) -> Any:
    """Whether any dequantized value is non-zero, over ``axis`` (Burn ``any``/``any_dim``), bool.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    return _truth_reduce("any", x, axis, keepdims)


def all(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False) -> Any:
    """Whether every dequantized value is non-zero, over ``axis`` (Burn ``all``/``all_dim``), bool.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    return _truth_reduce("all", x, axis, keepdims)
