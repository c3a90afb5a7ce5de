"""Sorting functions on quantized tensors: argsort, sort and topk (the Array API's category and Burn's ``topk``).

:func:`argsort` returns integer indices into the dequantized values. :func:`sort` and :func:`topk`
are always quantized, as Burn's: on a per-tensor scheme the codes themselves are reordered (exact,
the same scale); block schemes requantize the sorted values with the input's scheme.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as compat

from ..errors import ShapeError
from ..tensor import QuantizedTensor
from ._common import (
    as_int,
    check_flag,
    floats,
    gather_along,
    one_axis,
    per_tensor,
    requantize,
    require_quantized,
    with_codes,
)

__all__ = ["argsort", "sort", "topk"]


def _sort_operands(
    x: QuantizedTensor, axis: int, descending: bool, stable: bool
) -> tuple[QuantizedTensor, int, bool, bool, Any]:
    """argsort's and sort's arguments checked, and ``x``'s dequantized values."""
    qt = require_quantized(x)
    ax = one_axis(axis, len(qt.shape))
    descending, stable = check_flag(descending, "descending"), check_flag(stable, "stable")
    return qt, ax, descending, stable, floats(qt)


def argsort(x: QuantizedTensor, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Any:
    """Indices that sort the dequantized values along ``axis``, an integer array.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    _, ax, descending, stable, f = _sort_operands(x, axis, descending, stable)
    return compat.array_namespace(f).argsort(f, axis=ax, descending=descending, stable=stable)


def sort(x: QuantizedTensor, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> QuantizedTensor:
    """The values sorted along ``axis``, always quantized (Burn ``sort``/``sort_descending``).

    Per tensor the codes are reordered (exact, same scale); block schemes requantize the sorted
    values with ``x``'s scheme.

    Raises ShapeError for an axis that is no int or out of range, ParamsError for a flag neither True nor
    False, DTypeError when ``x`` is not quantized.
    """
    qt, ax, descending, stable, f = _sort_operands(x, axis, descending, stable)
    xp = compat.array_namespace(f)
    if not per_tensor(qt):
        return requantize(xp.sort(f, axis=ax, descending=descending, stable=stable), qt)
    idx = xp.argsort(f, axis=ax, descending=descending, stable=stable)
    return with_codes(qt, gather_along(xp, qt.codes(), idx, ax))


def topk(x: QuantizedTensor, k: int, /, *, axis: int = -1, largest: bool = True) -> QuantizedTensor:
    """The ``k`` largest (or smallest) values along ``axis``, in that order, always quantized.

    Burn's ``topk`` (largest first); per tensor the selected codes keep ``x``'s scale (exact),
    block schemes requantize the selected values.

    Parameters
    ----------
    x : QuantizedTensor
    k : int
        How many values, ``1 <= k <= x.shape[axis]``.
    axis : int
        The axis to select along.
    largest : bool
        True: the largest, descending; False: the smallest, ascending.

    Returns
    -------
    QuantizedTensor
        ``x``'s shape with ``k`` on ``axis``.

    Raises
    ------
    ShapeError
        ``axis`` not an int or out of range, ``k`` not an int or outside ``1..x.shape[axis]``.
    ParamsError
        ``largest`` neither True nor False.
    DTypeError
        ``x`` is not quantized.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([1.0, -2.0, 4.0]), "q8s:native")
    >>> np.round(aq.dequantize(topk(qt, 2)), 4).tolist()
    [4.0, 1.0079]
    """
    qt = require_quantized(x)
    ax = one_axis(axis, len(qt.shape))
    largest = check_flag(largest, "largest")
    n = qt.shape[ax]
    count = as_int(k)  # NumPy ints count, as layout's counts do; a bool does not
    if count is None or not 1 <= count <= n:
        msg = f"k must be an int in 1..{n} (the extent of axis {ax}), got {k!r}"
        raise ShapeError(msg)
    k = count
    f = floats(qt)
    xp = compat.array_namespace(f)
    first = (*(slice(None),) * ax, slice(0, k), ...)
    idx = xp.argsort(f, axis=ax, descending=largest, stable=True)[first]
    if not per_tensor(qt):
        return requantize(gather_along(xp, f, idx, ax), qt)
    return with_codes(qt, gather_along(xp, qt.codes(), idx, ax))
