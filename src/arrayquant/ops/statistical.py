"""Statistical functions on quantized tensors: reductions and running scans (the Array API's category).

:func:`sum`, :func:`prod`, :func:`mean` and the ``cumulative_*`` scans compute on the dequantized
values and follow ``propagation`` (``"inhibit"``, Burn's default, returns floats; ``"propagate"``
quantizes the result again with the input's scheme, MinMax scales). :func:`max` and :func:`min`
are always quantized, as Burn's: on a per-tensor scheme they select the stored codes themselves
(one positive scale orders the codes as it orders the values), so the result is exact and keeps
the input's scale; block schemes requantize the selected floats.

An ``axis`` is an int (NumPy ints too) or a tuple of them; ``keepdims`` and ``include_initial`` are
True or False (a :class:`~arrayquant.ParamsError` otherwise, never truthiness). A quantized result
is at least 1-d: a reduction to a 0-d value gives shape ``(1,)``, as Burn's.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat as compat

from ..backends.shim import quiet
from ..errors import ShapeError
from ..tensor import QuantizedTensor
from ._common import (
    check_flag,
    check_propagation,
    document,
    finish,
    floats,
    gather_along,
    one_axis,
    per_tensor,
    reduce_axes,
    requantize,
    require_quantized,
    with_codes,
)

__all__ = [
    "cumulative_max",
    "cumulative_min",
    "cumulative_prod",
    "cumulative_sum",
    "max",
    "mean",
    "min",
    "prod",
    "sum",
]


# -- reductions -----------------------------------------------------------------------------------
def _reduce(name: str, x: QuantizedTensor, axis: Any, keepdims: bool, propagation: str) -> Any:
    mode = check_propagation(propagation)
    qt = require_quantized(x)
    axes = reduce_axes(axis, len(qt.shape))
    keepdims = check_flag(keepdims, "keepdims")
    f = floats(qt)
    xp = compat.array_namespace(f)
    kwargs: dict[str, Any] = {"axis": axes, "keepdims": keepdims}
    if name != "mean":
        kwargs["dtype"] = f.dtype  # why: default accumulation dtypes differ between libraries
    with quiet(xp):
        out = getattr(xp, name)(f, **kwargs)
    return finish(out, qt, mode)


_REDUCE_DOC = """

    Parameters
    ----------
    x : QuantizedTensor
    axis : int, tuple of ints or None
        The axes to reduce; None reduces all.
    keepdims : bool
        Keep the reduced axes with extent 1.
    propagation : {"inhibit", "propagate"}
        ``"inhibit"`` returns the float array (0-d for a full reduction), ``"propagate"`` requantizes
        it with ``x``'s scheme (shape ``(1,)`` for a full reduction).

    Returns
    -------
    array or QuantizedTensor

    Raises
    ------
    ShapeError
        An axis that is no int (or tuple of ints), out of range or named twice.
    ParamsError
        ``keepdims`` neither True nor False.
    SchemeError
        An unknown ``propagation``.
    DTypeError
        ``x`` is not quantized.
    """


def sum(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False, propagation: str = "inhibit") -> Any:
    """Sum of the dequantized values (Burn ``sum``/``sum_dim``).

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([[1.0, -2.0], [4.0, 0.5]]), "q8s:native")
    >>> np.round(sum(qt, axis=1), 4).tolist()
    [-1.0079, 4.5039]
    """
    return _reduce("sum", x, axis, keepdims, propagation)


def prod(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False, propagation: str = "inhibit") -> Any:
    """Product of the dequantized values (Burn ``prod``/``prod_dim``)."""
    return _reduce("prod", x, axis, keepdims, propagation)


def mean(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False, propagation: str = "inhibit") -> Any:
    """Mean of the dequantized values (Burn ``mean``/``mean_dim``)."""
    return _reduce("mean", x, axis, keepdims, propagation)


document((sum, prod, mean), _REDUCE_DOC)


def _scan_axis(qt: QuantizedTensor, axis: Any) -> int:
    if axis is None:
        if len(qt.shape) != 1:
            msg = f"axis is required for a {len(qt.shape)}-d tensor; pass axis=... (as Burn's dim)"
            raise ShapeError(msg)
        return 0
    return one_axis(axis, len(qt.shape))


def _scan(name: str, x: QuantizedTensor, axis: Any, include_initial: bool, propagation: str) -> Any:
    mode = check_propagation(propagation)
    qt = require_quantized(x)
    ax = _scan_axis(qt, axis)
    f = floats(qt)
    xp = compat.array_namespace(f)
    kwargs: dict[str, Any] = {"axis": ax, "dtype": f.dtype}
    if check_flag(include_initial, "include_initial"):
        kwargs["include_initial"] = True
    with quiet(xp):
        out = getattr(xp, name)(f, **kwargs)
    return finish(out, qt, mode)


def _running(x: QuantizedTensor, axis: Any, propagation: str, pick: str) -> Any:
    mode = check_propagation(propagation)
    qt = require_quantized(x)
    ax = _scan_axis(qt, axis)
    y = floats(qt)
    xp = compat.array_namespace(y)
    device = compat.device(y)
    n = qt.shape[ax]
    fill = -math.inf if pick == "maximum" else math.inf
    op = getattr(xp, pick)
    lead = (slice(None),) * ax
    # why a doubling scan: the Array API has no cumulative max/min; log2(n) shifted maxima use only
    # concat, slicing and maximum, so it stays lazy on dask and traceable on jax
    shift = 1
    while shift < n:
        pad_shape = tuple(shift if i == ax else s for i, s in enumerate(qt.shape))
        pad = xp.full(pad_shape, fill, dtype=y.dtype, device=device)
        head = (*lead, slice(0, n - shift), ...)
        shifted = xp.concat([pad, y[head]], axis=ax)
        y = op(y, shifted)
        shift *= 2
    return finish(y, qt, mode)


_SCAN_DOC = """

    Parameters
    ----------
    x : QuantizedTensor
    axis : int, optional
        The axis to scan (Burn's ``dim``); may be omitted for 1-d data only.
    propagation : {"inhibit", "propagate"}
        Floats, or requantized with ``x``'s scheme.

    Returns
    -------
    array or QuantizedTensor
        Of ``x``'s shape.

    Raises
    ------
    ShapeError
        ``axis`` not an int, out of range, or missing for data of more than one axis.
    ParamsError
        ``include_initial`` neither True nor False.
    SchemeError
        An unknown ``propagation``.
    DTypeError
        ``x`` is not quantized.
    """


def cumulative_sum(
    x: QuantizedTensor, /, *, axis: int | None = None, include_initial: bool = False, propagation: str = "inhibit"
) -> Any:
    """Running sum of the dequantized values (Burn ``cumsum``); ``include_initial`` as in the Array API."""
    return _scan("cumulative_sum", x, axis, include_initial, propagation)


def cumulative_prod(
    x: QuantizedTensor, /, *, axis: int | None = None, include_initial: bool = False, propagation: str = "inhibit"
) -> Any:
    """Running product of the dequantized values (Burn ``cumprod``)."""
    return _scan("cumulative_prod", x, axis, include_initial, propagation)


def cumulative_max(x: QuantizedTensor, /, *, axis: int | None = None, propagation: str = "inhibit") -> Any:
    """Running maximum of the dequantized values (Burn ``cummax``; not in the Array API)."""
    return _running(x, axis, propagation, "maximum")


def cumulative_min(x: QuantizedTensor, /, *, axis: int | None = None, propagation: str = "inhibit") -> Any:
    """Running minimum of the dequantized values (Burn ``cummin``; not in the Array API)."""
    return _running(x, axis, propagation, "minimum")


document((cumulative_sum, cumulative_prod, cumulative_max, cumulative_min), _SCAN_DOC)


# -- always quantized -----------------------------------------------------------------------------
def _extreme(x: QuantizedTensor, axis: Any, keepdims: bool, largest: bool) -> QuantizedTensor:
    qt = require_quantized(x)
    shape = tuple(qt.shape)
    axes = reduce_axes(axis, len(shape))
    keepdims = check_flag(keepdims, "keepdims")
    reduced = tuple(range(len(shape))) if axes is None else tuple(sorted(axes))
    kept = tuple(i for i in range(len(shape)) if i not in reduced)
    if keepdims:
        out_shape = tuple(1 if i in reduced else n for i, n in enumerate(shape))
    else:
        out_shape = tuple(shape[i] for i in kept) or (1,)
    f = floats(qt)
    xp = compat.array_namespace(f)
    if not per_tensor(qt):
        y = (xp.max if largest else xp.min)(f, axis=reduced, keepdims=keepdims)
        return requantize(xp.reshape(y, out_shape), qt)
    # per tensor: find the winner on the floats, then take its code (the scale stays the same)
    flat = (*(shape[i] for i in kept), math.prod(shape[i] for i in reduced))
    perm = (*kept, *reduced)
    f2 = xp.reshape(xp.permute_dims(f, perm), flat)
    c2 = xp.reshape(xp.permute_dims(qt.codes(), perm), flat)
    idx = (xp.argmax if largest else xp.argmin)(f2, axis=-1, keepdims=True)
    return with_codes(qt, xp.reshape(gather_along(xp, c2, idx, -1), out_shape))


_EXTREME_DOC = """

    Always quantized, as Burn's. Per tensor the result holds the selected codes and the input's
    scale (exact); a block scheme requantizes the selected values with the input's scheme.

    Parameters
    ----------
    x : QuantizedTensor
    axis : int, tuple of ints or None
        The axes to reduce; None reduces all (result shape ``(1,)`` unless ``keepdims``).
    keepdims : bool
        Keep the reduced axes with extent 1.

    Returns
    -------
    QuantizedTensor

    Raises
    ------
    ShapeError
        An axis that is no int (or tuple of ints), out of range or named twice, or a result a block
        scheme cannot hold.
    ParamsError
        ``keepdims`` neither True nor False.
    DTypeError
        ``x`` is not quantized.
    """


def max(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False) -> QuantizedTensor:
    """Largest dequantized value over ``axis`` (Burn ``max``/``max_dim``).

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([[1.0, -2.0], [4.0, 0.5]], dtype=np.float32), "q8s:native")
    >>> max(qt, axis=1).codes().tolist()
    [32, 127]
    """
    return _extreme(x, axis, keepdims, largest=True)


def min(x: QuantizedTensor, /, *, axis: Any = None, keepdims: bool = False) -> QuantizedTensor:
    """Smallest dequantized value over ``axis`` (Burn ``min``/``min_dim``)."""
    return _extreme(x, axis, keepdims, largest=False)


document((max, min), _EXTREME_DOC)
