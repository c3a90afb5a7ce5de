"""Utility functions on quantized tensors: any and all (the Array API's category), bool results."""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from ..tensor import QuantizedTensor
from ._common import check_flag, floats, reduce_axes, require_quantized

__all__ = ["all", "any"]


def any(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False) -> Any:
    """Whether any dequantized value is non-zero, over ``axis`` (Burn ``any``/``any_dim``), bool.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    qt = require_quantized(x)
    axes = reduce_axes(axis, len(qt.shape))
    keepdims = check_flag(keepdims, "keepdims")
    f = floats(qt)
    return compat.array_namespace(f).any(f, axis=axes, keepdims=keepdims)


def all(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False) -> Any:
    """Whether every dequantized value is non-zero, over ``axis`` (Burn ``all``/``all_dim``), bool.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    qt = require_quantized(x)
    axes = reduce_axes(axis, len(qt.shape))
    keepdims = check_flag(keepdims, "keepdims")
    f = floats(qt)
    return compat.array_namespace(f).all(f, axis=axes, keepdims=keepdims)
