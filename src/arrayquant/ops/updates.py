"""Updates of a quantized tensor's values: Burn's ``mask_fill``, ``scatter``, ``select_assign``, ``slice_assign``.

Burn dequantizes first and returns floats for every one of them: :func:`mask_fill`,
:func:`scatter_add`, :func:`index_add` and :func:`slice_assign` return the input's dequantized
values with the update applied, in the input's dtype, namespace and device. Nothing is written in
place: the updates are built from masks, one-hot sums and ``take``, so they stay lazy on Dask and
traceable on JAX.
"""

from __future__ import annotations

import builtins
from typing import Any

import array_api_compat as compat

from ..backends.shim import quiet
from ..errors import DTypeError, ShapeError
from ..tensor import QuantizedTensor
from ._common import (
    SCALARS,
    allocating,
    as_int,
    broadcast_shape,
    check_elements,
    check_mask,
    check_operands,
    float_args,
    floats,
    one_axis,
    positions,
    require_quantized,
    same_place,
)

__all__ = ["index_add", "mask_fill", "scatter_add", "slice_assign"]


def mask_fill(x: QuantizedTensor, mask: Any, value: Any, /) -> Any:
    """``x``'s dequantized values with ``value`` where ``mask`` holds, as floats (Burn ``mask_fill``).

    Raises DTypeError for a mask that is not bool or a non-scalar ``value``, ShapeError for a mask
    that does not broadcast to ``x``, DeviceError for a mask elsewhere.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([1.0, -2.0]), "q8s:native")
    >>> np.round(mask_fill(qt, np.array([False, True]), 0.0), 4).tolist()
    [1.0079, 0.0]
    """
    qt = require_quantized(x)
    check_mask(mask, "mask")
    if not isinstance(value, SCALARS):
        msg = f"value must be a Python scalar, got {type(value).__name__}"
        raise DTypeError(msg)
    check_operands(("x", "mask"), (qt, mask))
    if broadcast_shape(("x", "mask"), qt, mask) != tuple(qt.shape):
        msg = f"mask {list(mask.shape)} must broadcast to x's shape {list(qt.shape)} without growing it"
        raise ShapeError(msg)
    f, v = float_args((qt, value), qt)
    return compat.array_namespace(f).where(mask, v, f)


# -- indexed updates -------------------------------------------------------------------------------
def _update_values(values: Any, qt: QuantizedTensor, name: str = "values") -> Any:
    """``values`` as floats of ``qt``'s dtype: a quantized tensor dequantized, a real array cast."""
    if isinstance(values, QuantizedTensor):
        same_place(x=qt, **{name: values})
        v = floats(values)
    elif compat.is_array_api_obj(values):
        same_place(x=qt, **{name: values})
        v = values
    else:
        msg = f"{name} must be a QuantizedTensor or an Array API array, got {type(values).__name__}"
        raise DTypeError(msg)
    xp = compat.array_namespace(v)
    if not xp.isdtype(v.dtype, ("real floating", "integral")):
        msg = f"{name} must hold real numbers, got dtype {v.dtype}"
        raise DTypeError(msg)
    ref = floats(qt)
    return xp.astype(v, ref.dtype) if v.dtype != ref.dtype else v


def _one_hot_sum(xp: Any, v: Any, idx: Any, n: int) -> Any:
    """``out[..., j] = sum of v[..., k] where idx[..., k] == j``, shape ``(..., n)``.

    why a comparison sum: the Array API has no scatter and no in-place writes on lazy or traced
    arrays; the one-hot mask costs ``k * n`` per line, fine for the moderate sizes this serves.
    """
    device = compat.device(v)
    hit = xp.equal(xp.expand_dims(idx, axis=-1), xp.arange(n, dtype=idx.dtype, device=device))
    zero = xp.asarray(0, dtype=v.dtype, device=device)
    return xp.sum(xp.where(hit, xp.expand_dims(v, axis=-1), zero), axis=-2, dtype=v.dtype)


def _indexed_operands(
    x: QuantizedTensor, indices: Any, values: Any, axis: int, what: str
) -> tuple[QuantizedTensor, tuple[int, ...], int, Any, Any]:
    """``what``'s operands checked: ``x`` quantized, its shape, the axis, float ``values``, ``indices`` as positions."""
    qt = require_quantized(x)
    shape = tuple(qt.shape)
    ax = one_axis(axis, len(shape))
    v = _update_values(values, qt)
    return qt, shape, ax, v, positions(qt, indices, shape[ax], what)


def _one_hot_add(qt: QuantizedTensor, v: Any, ax: int, idx: Any, what: str) -> Any:
    """``qt``'s floats plus the one-hot sums of ``v`` at ``idx`` (axis last) along ``ax``, the mask checked first."""
    f = floats(qt)
    xp = compat.array_namespace(f)
    n = int(f.shape[ax])
    mask = (*tuple(v.shape), n)  # every value compared with every position on the axis
    check_elements(mask, f"{what}'s one-hot comparison", "add fewer values at a time")

    def run() -> Any:
        with quiet(xp):
            added = _one_hot_sum(xp, xp.moveaxis(v, ax, -1), idx, n)
            return xp.add(f, xp.moveaxis(added, -1, ax))

    return allocating(run, f"{what}'s one-hot comparison {list(mask)}")


def scatter_add(x: QuantizedTensor, indices: Any, values: Any, /, *, axis: int) -> Any:
    """``x``'s dequantized values with ``values`` added at ``indices`` along ``axis``, as floats.

    Burn's ``scatter(dim, indices, values, IndexingUpdateOp::Add)`` (``torch.Tensor.scatter_add``):
    ``out[..., indices[..., k, ...], ...] += values[..., k, ...]`` with ``k`` on ``axis``; repeated
    indices accumulate. Burn dequantizes first and returns floats.

    Parameters
    ----------
    x : QuantizedTensor
    indices : integer array
        ``x``'s rank and shape except on ``axis``, values in ``[-n, n)`` (``n = x.shape[axis]``).
        On a lazy or traced array the range cannot be checked; an index out of range adds nothing.
    values : QuantizedTensor or array
        Of ``indices``' shape.
    axis : int
        The axis the indices point along (Burn's ``dim``).

    Returns
    -------
    array
        Floats of ``x``'s shape and dtype.

    Raises
    ------
    ShapeError
        An axis out of range, shapes that do not fit, or indices out of range.
    DTypeError
        ``x`` not quantized, non-integer indices, or values that are no array of real numbers.
    DeviceError
        Operands in different namespaces or on different devices.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.zeros(3, np.float32), "q8s:native")
    >>> scatter_add(qt, np.array([1, 0, 1]), np.array([5.0, 4.0, 3.0], np.float32), axis=0).tolist()
    [4.0, 8.0, 0.0]
    """
    qt, shape, ax, v, idx = _indexed_operands(x, indices, values, axis, "scatter_add")
    if tuple(idx.shape) != tuple(v.shape):
        msg = f"scatter_add indices {list(idx.shape)} and values {list(v.shape)} must have the same shape"
        raise ShapeError(msg)
    if len(idx.shape) != len(shape) or builtins.any(idx.shape[i] != shape[i] for i in range(len(shape)) if i != ax):
        msg = (
            f"scatter_add indices {list(idx.shape)} must have x's shape {list(shape)} on every axis but "
            f"axis {ax} (as Burn's scatter)"
        )
        raise ShapeError(msg)
    return _one_hot_add(qt, v, ax, compat.array_namespace(idx).moveaxis(idx, ax, -1), "scatter_add")


def index_add(x: QuantizedTensor, indices: Any, values: Any, /, *, axis: int) -> Any:
    """``x``'s dequantized values with slice ``k`` of ``values`` added at ``indices[k]`` along ``axis``.

    Burn's ``select_assign(dim, indices, values, IndexingUpdateOp::Add)`` (``torch.Tensor.index_add``);
    repeated indices accumulate. Burn dequantizes first ("select assign is ambiguous for QFloat")
    and returns floats.

    Parameters
    ----------
    x : QuantizedTensor
    indices : integer array
        1-d, values in ``[-n, n)`` (``n = x.shape[axis]``); on a lazy or traced array the range
        cannot be checked and an index out of range adds nothing.
    values : QuantizedTensor or array
        ``x``'s shape with ``len(indices)`` on ``axis``.
    axis : int
        The axis the indices point along (Burn's ``dim``).

    Returns
    -------
    array
        Floats of ``x``'s shape and dtype.

    Raises
    ------
    ShapeError
        An axis out of range, indices not 1-d or out of range, values of another shape.
    DTypeError
        ``x`` not quantized, non-integer indices, or values that are no array of real numbers.
    DeviceError
        Operands in different namespaces or on different devices.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.zeros(3, np.float32), "q8s:native")
    >>> index_add(qt, np.array([1, 1, 0]), np.array([5.0, 4.0, 3.0], np.float32), axis=0).tolist()
    [3.0, 9.0, 0.0]
    """
    qt, shape, ax, v, idx = _indexed_operands(x, indices, values, axis, "index_add")
    if len(idx.shape) != 1:
        msg = f"index_add indices must be 1-d, got shape {list(idx.shape)}"
        raise ShapeError(msg)
    want = tuple(int(idx.shape[0]) if i == ax else n for i, n in enumerate(shape))
    if tuple(v.shape) != want:
        msg = (
            f"index_add values must have shape {list(want)} (x's shape with the number of indices on "
            f"axis {ax}), got {list(v.shape)}"
        )
        raise ShapeError(msg)
    return _one_hot_add(qt, v, ax, idx, "index_add")


def _basic_index(k: Any, key: Any) -> Any:
    """One entry of a basic key with Python ints throughout (NumPy ints read as layout's ``getitem`` does)."""
    if k is Ellipsis:
        return k
    if isinstance(k, slice):
        raw = (k.start, k.stop, k.step)
        parts = [None if p is None else as_int(p) for p in raw]
        if builtins.any(p is None and r is not None for p, r in zip(parts, raw, strict=True)):
            msg = f"slice_assign slice {k!r} in {key!r} needs integer (or None) start, stop and step"
            raise ShapeError(msg)
        return slice(*parts)
    i = as_int(k)
    if i is None:
        msg = f"slice_assign takes basic indices (ints, slices, Ellipsis), got {k!r} in {key!r}"
        raise ShapeError(msg)
    return i


def _assign_positions(key: Any, shape: tuple[int, ...]) -> tuple[list[list[int]], list[int]]:
    """Per axis the positions ``key`` selects (in selection order) and the axes an int drops."""
    items = tuple(_basic_index(k, key) for k in (key if isinstance(key, tuple) else (key,)))
    if builtins.sum(1 for k in items if k is Ellipsis) > 1:
        msg = f"slice_assign key {key!r} has more than one Ellipsis"
        raise ShapeError(msg)
    named = len(items) - (1 if Ellipsis in items else 0)
    if named > len(shape):
        msg = f"slice_assign key {key!r} indexes {named} axes, but x has only {len(shape)}"
        raise ShapeError(msg)
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = (*items[:at], *(slice(None),) * (len(shape) - named), *items[at + 1 :])
    items = (*items, *(slice(None),) * (len(shape) - len(items)))
    positions: list[list[int]] = []
    dropped: list[int] = []
    for a, (k, n) in enumerate(zip(items, shape, strict=True)):
        if isinstance(k, slice):
            if k.step == 0:
                msg = f"slice_assign slice {k!r} on axis {a} has step 0; use a non-zero step"
                raise ShapeError(msg)
            positions.append(list(range(n))[k])
        else:
            if not -n <= k < n:
                msg = f"slice_assign index {k} is out of range for axis {a} of length {n}"
                raise ShapeError(msg)
            positions.append([k % n])
            dropped.append(a)
    return positions, dropped


def slice_assign(x: QuantizedTensor, key: Any, values: Any, /) -> Any:
    """``x``'s dequantized values with the region ``x[key]`` replaced by ``values``, as floats.

    Burn's ``slice_assign`` (Burn dequantizes first and returns floats). The region is built from
    masks and ``take`` on index grids, without in-place writes, so it stays lazy on Dask and
    traceable on JAX.

    Parameters
    ----------
    x : QuantizedTensor
    key : int, slice, Ellipsis or a tuple of them
        Basic indexing as in ``x[key]`` (any step; slices clamp to each axis as Python's do).
    values : QuantizedTensor or array
        Exactly the region's shape (``x[key]``'s shape), as Burn requires.

    Returns
    -------
    array
        Floats of ``x``'s shape and dtype; ``x``'s values when the region is empty.

    Raises
    ------
    ShapeError
        An index that is not basic, out of range, a step of 0, too many indices, or values of
        another shape than the region.
    DTypeError
        ``x`` not quantized, or values that are no array of real numbers.
    DeviceError
        ``values`` in another namespace or on another device.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.zeros((2, 3), np.float32), "q8s:native")
    >>> slice_assign(qt, (1, slice(0, 2)), np.array([10.0, 5.0], np.float32)).tolist()
    [[0.0, 0.0, 0.0], [10.0, 5.0, 0.0]]
    """
    qt = require_quantized(x)
    shape = tuple(qt.shape)
    positions, dropped = _assign_positions(key, shape)
    region = tuple(len(p) for a, p in enumerate(positions) if a not in dropped)
    v = _update_values(values, qt)
    if tuple(v.shape) != region:
        msg = f"slice_assign values must have the region's shape {list(region)} (x[{key!r}]), got {list(v.shape)}"
        raise ShapeError(msg)
    f = floats(qt)
    xp = compat.array_namespace(f)
    device = compat.device(f)
    if builtins.any(len(p) == 0 for p in positions):
        return f  # an empty region assigns nothing (Burn returns the tensor unchanged)
    for a in dropped:  # ascending, so each int axis comes back at its own position
        v = xp.expand_dims(v, axis=a)
    mask = None
    for a, (sel, n) in enumerate(zip(positions, shape, strict=True)):
        if sel == list(range(n)):
            continue  # the whole axis, in order: nothing to move or mask
        where_in = dict(zip(sel, range(len(sel)), strict=True))  # a repeated position is impossible
        take = xp.asarray([where_in.get(i, 0) for i in range(n)], device=device)
        v = xp.take(v, take, axis=a)
        hit = xp.asarray([i in where_in for i in range(n)], device=device)
        hit = xp.reshape(hit, tuple(n if i == a else 1 for i in range(len(shape))))
        mask = hit if mask is None else xp.logical_and(mask, hit)
    if mask is None:
        return v  # the region is all of x
    return xp.where(mask, v, f)
