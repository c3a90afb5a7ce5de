"""Indexing on quantized tensors: basic indexing, pieces, take, gather and mask selection.

:func:`getitem` (``qt[key]``), :func:`narrow`, :func:`split`, :func:`chunk`, :func:`take` and
:func:`take_along_axis` (the Array API's indexing functions, Burn's ``slice``, ``narrow``,
``select`` and ``gather``) and :func:`mask_select` (Burn's) return a
:class:`~arrayquant.QuantizedTensor` (``split`` and ``chunk`` a list of them). On the **exact path**
the selected codes (``qt.codes()``) and the matching part of the scale grid are moved and packed
again; nothing is dequantized or quantized, the global scale and table are kept, so
``dequantize(op(qt)) == op(dequantize(qt))`` bit for bit. Where a selection would cut a block, it
follows Burn's fallback: dequantize, select from the floats, and quantize again with the input's
scheme (MinMax; :func:`~arrayquant.ops._common.requantize`). :func:`~arrayquant.ops.is_exact`
says which path a call takes (``mask_select`` aside: exact for one scale per tensor only);
``ops.exact`` has the table of when each operation is exact and the rules they all follow.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import array_api_compat as compat

from ..errors import BackendUnavailableError, ShapeError
from ..tensor import QuantizedTensor
from ._common import check_mask, floats, per_tensor, positions, requantize, require_quantized, same_place
from ._plans import (
    Move,
    block_dims,
    check_axis,
    check_int,
    check_qt,
    check_result_shape,
    lines_up,
    moved_store,
    namespace_of,
    run,
)
from .manipulation import reshape

__all__ = ["chunk", "getitem", "mask_select", "narrow", "split", "take", "take_along_axis"]


# -- basic indexing -----------------------------------------------------------------------------
_Item = tuple[Any, ...] | None  # None (new axis), ("i", axis, index), ("s", axis, start, stop, step, length)


def _parse_key(key: Any, shape: tuple[int, ...]) -> list[_Item]:
    rank = len(shape)
    items = key if isinstance(key, tuple) else (key,)
    if sum(1 for k in items if k is Ellipsis) > 1:
        msg = "an index may hold at most one Ellipsis (...)"
        raise ShapeError(msg)
    used = sum(1 for k in items if k is not None and k is not Ellipsis)
    if used > rank:
        msg = f"too many indices ({used}) for a tensor of rank {rank} (shape {shape})"
        raise ShapeError(msg)
    if any(k is Ellipsis for k in items):
        at = next(i for i, k in enumerate(items) if k is Ellipsis)
        items = (*items[:at], *(slice(None),) * (rank - used), *items[at + 1 :])
    else:
        items = (*items, *(slice(None),) * (rank - used))
    out: list[_Item] = []
    axis = 0
    for k in items:
        if k is None:
            out.append(None)
            continue
        n = shape[axis]
        if isinstance(k, slice):
            try:
                start, stop, step = k.indices(n)
            except (TypeError, ValueError) as exc:
                msg = f"bad slice {k!r} for axis {axis}: {exc}"
                raise ShapeError(msg) from None
            length = len(range(start, stop, step))
            if length == 0:
                msg = f"slice {k!r} selects nothing on axis {axis} of length {n}; a QuantizedTensor cannot be empty"
                raise ShapeError(msg)
            if length == 1:
                stop, step = start + 1, 1
            out.append(("s", axis, start, stop, step, length))
        else:
            if isinstance(k, bool) or _is_arraylike(k) or not hasattr(type(k), "__index__"):
                msg = (
                    f"basic indexing takes integers, slices, None and Ellipsis, not {type(k).__name__}; "
                    "use take or take_along_axis for index arrays"
                )
                raise ShapeError(msg)
            i = operator.index(k)
            if not -n <= i < n:
                msg = f"index {i} is out of range for axis {axis} of length {n}"
                raise ShapeError(msg)
            out.append(("i", axis, i % n))
        axis += 1
    return out


def _is_arraylike(k: Any) -> bool:
    return (compat.is_array_api_obj(k) and getattr(k, "ndim", 0) != 0) or isinstance(k, (list, tuple))


def _index(a: Any, sel: Sequence[_Item], xp: Any) -> Any:
    """Apply parsed items to ``a``; a negative step becomes a flip and a positive step (torch has none)."""
    key: list[Any] = []
    for it in sel:
        if it is None:
            key.append(None)
        elif it[0] == "i":
            key.append(it[2])
        else:
            _, ax, start, stop, step, length = it
            if step < 0:
                a = xp.flip(a, axis=ax)
                start = int(a.shape[ax]) - 1 - start
                step = -step
                stop = start + (length - 1) * step + 1
            key.append(slice(start, stop, step))
    return a[tuple(key)]


def _plan_getitem(qt: QuantizedTensor, key: Any) -> Move:
    sel = _parse_key(key, qt.shape)
    new_shape = [1 if it is None else it[5] for it in sel if it is None or it[0] == "s"]
    check_result_shape(new_shape, f"qt[{key!r}]")
    sources = [None if it is None else it[1] for it in sel if it is None or it[0] == "s"]
    xp = namespace_of(qt)
    scheme = moved_store(qt, sources)
    data = lambda a: _index(a, sel, xp)
    bd = block_dims(qt)
    if bd is None:
        return Move(True, data, None, scheme, scheme)
    exact = lines_up(qt, sources)
    grid_sel: list[_Item] = []
    for it in sel:
        if it is None or bd[it[1]] == 1:
            grid_sel.append(it)
            continue
        b = bd[it[1]]
        if it[0] == "i":
            exact = False
            break
        _, ax, start, stop, step, _length = it
        n = qt.shape[ax]
        if step != 1 or start % b or (stop % b and stop != n):
            exact = False
            break
        grid_sel.append(("s", ax, start // b, -(-stop // b), 1, -(-stop // b) - start // b))
    return Move(exact, data, lambda g: _index(g, grid_sel, xp), scheme, scheme)


def getitem(qt: QuantizedTensor, key: Any) -> QuantizedTensor:
    """Basic indexing ``qt[key]`` (Burn's ``slice``): integers, slices of any step, ``None``, ``...``.

    Parameters
    ----------
    qt : QuantizedTensor
        The tensor.
    key : int, slice, None, Ellipsis or a tuple of them
        As in NumPy's basic indexing: slices clamp to the axis, an integer out of range is an
        error, missing trailing axes are taken whole.

    Returns
    -------
    QuantizedTensor
        Exact when every blocked axis is cut by a step-1 slice from a multiple of the block
        extent to a multiple of it or the axis end (integers, other steps only on unblocked
        axes) and the block still lines up with the same axes; else requantized.

    Raises
    ------
    ShapeError
        An integer out of range, a slice selecting nothing, a result with no axes, too many
        indices, two Ellipses, or an index array (use :func:`take`).

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.arange(12, dtype=np.float32).reshape(3, 4), "q8s")
    >>> getitem(qt, (slice(None), slice(None, None, -2))).codes().tolist()
    [[35, 12], [81, 58], [127, 104]]
    """
    qt = check_qt(qt)
    return run(qt, _plan_getitem(qt, key))


def _plan_narrow(qt: QuantizedTensor, axis: Any, start: Any, length: Any) -> Move:
    rank = len(qt.shape)
    ax = check_axis(axis, rank)
    n = qt.shape[ax]
    s, ln = check_int(start, "start"), check_int(length, "length")
    if not -n <= s < n:
        msg = f"start {s} is out of range for axis {ax} of length {n}"
        raise ShapeError(msg)
    s %= n
    if ln < 1 or s + ln > n:
        msg = f"length {ln} from start {s} does not fit axis {ax} of length {n}; use 1 <= length <= {n - s}"
        raise ShapeError(msg)
    key = tuple(slice(s, s + ln) if i == ax else slice(None) for i in range(rank))
    return _plan_getitem(qt, key)


def narrow(qt: QuantizedTensor, axis: int, start: int, length: int) -> QuantizedTensor:
    """``length`` elements of ``axis`` from ``start`` (Burn's ``narrow``); exactness as :func:`getitem`.

    Raises
    ------
    ShapeError
        An axis or start out of range, or a length below 1 or past the axis end.
    """
    qt = check_qt(qt)
    return run(qt, _plan_narrow(qt, axis, start, length))


def _split_sizes(qt: QuantizedTensor, sizes: Any, axis: Any) -> tuple[int, list[int]]:
    ax = check_axis(axis, len(qt.shape))
    n = qt.shape[ax]
    if isinstance(sizes, int) and not isinstance(sizes, bool):
        if sizes < 1:
            msg = f"split size must be >= 1, got {sizes}"
            raise ShapeError(msg)
        return ax, [min(sizes, n - i) for i in range(0, n, sizes)]
    try:
        parts = [check_int(s, "split size") for s in sizes]
    except TypeError:
        msg = f"sizes must be an integer or a sequence of integers, got {sizes!r}"
        raise ShapeError(msg) from None
    if not parts or min(parts) < 1 or sum(parts) != n:
        msg = f"sizes {parts} must be >= 1 each and add up to the length {n} of axis {ax}"
        raise ShapeError(msg)
    return ax, parts


def _chunk_sizes(qt: QuantizedTensor, chunks: Any, axis: Any) -> tuple[int, list[int]]:
    c = check_int(chunks, "chunks")
    if c < 1:
        msg = f"chunks must be >= 1, got {c}"
        raise ShapeError(msg)
    ax = check_axis(axis, len(qt.shape))
    return _split_sizes(qt, -(-qt.shape[ax] // c), ax)


def _pieces(qt: QuantizedTensor, ax: int, sizes: list[int]) -> list[Move]:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [_plan_narrow(qt, ax, s, n) for s, n in zip(starts, sizes, strict=True)]


def split(qt: QuantizedTensor, sizes: int | Sequence[int], axis: int = 0) -> list[QuantizedTensor]:
    """Split along ``axis`` into pieces of ``sizes`` (an int: that size, the last piece smaller).

    Burn's ``split`` (an int) and ``split_with_sizes`` (a sequence); each piece as :func:`narrow`.

    Raises
    ------
    ShapeError
        A size below 1, sizes that do not add up to the axis length, an axis out of range.
    """
    qt = check_qt(qt)
    ax, parts = _split_sizes(qt, sizes, axis)
    return [run(qt, m) for m in _pieces(qt, ax, parts)]


def chunk(qt: QuantizedTensor, chunks: int, axis: int = 0) -> list[QuantizedTensor]:
    """At most ``chunks`` pieces of ``ceil(n / chunks)`` along ``axis``, the last smaller (Burn's, torch's ``chunk``).

    Raises
    ------
    ShapeError
        ``chunks`` below 1, an axis out of range.
    """
    qt = check_qt(qt)
    ax, parts = _chunk_sizes(qt, chunks, axis)
    return [run(qt, m) for m in _pieces(qt, ax, parts)]


# -- take / gather ---------------------------------------------------------------------------------
def _plan_take(qt: QuantizedTensor, indices: Any, axis: Any = None) -> Move:
    rank = len(qt.shape)
    if axis is None:
        if rank != 1:
            msg = f"take needs an axis for a tensor of rank {rank}"
            raise ShapeError(msg)
        axis = 0
    ax = check_axis(axis, rank)
    idx = positions(qt, indices, qt.shape[ax], "take")
    if idx.ndim != 1 or idx.shape[0] == 0:
        msg = f"take indices must be a non-empty 1-d array, got shape {tuple(idx.shape)}"
        raise ShapeError(msg)
    out = (*qt.shape[:ax], int(idx.shape[0]), *qt.shape[ax + 1 :])
    check_result_shape(out, "the result of take", "take fewer indices")
    xp = namespace_of(qt)
    data = lambda a: xp.take(a, idx, axis=ax)
    bd = block_dims(qt)
    exact = bd is None or bd[ax] == 1
    return Move(exact, data, None if bd is None else data, qt.scheme, qt.scheme)


def take(qt: QuantizedTensor, indices: Any, axis: int | None = None) -> QuantizedTensor:
    """Elements at ``indices`` along ``axis`` (Burn's ``select``); exact per tensor or on an unblocked axis.

    Parameters
    ----------
    qt : QuantizedTensor
        The tensor.
    indices : array of int
        A non-empty 1-d integer array of ``qt``'s namespace (or a list), in ``[-n, n)``.
    axis : int, optional
        The axis; may be omitted for a 1-d tensor.

    Raises
    ------
    ShapeError
        Indices out of range, not 1-d or empty; an axis out of range or missing; a result past the limits.
    DTypeError
        Non-integer indices.
    DeviceError
        Indices in another namespace or on another device.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([0.0, 1.0, 2.0], np.float32), "q8s")
    >>> take(qt, np.array([2, 0, -1])).codes().tolist()
    [127, 0, 127]
    """
    qt = check_qt(qt)
    return run(qt, _plan_take(qt, indices, axis))


def _plan_take_along_axis(qt: QuantizedTensor, indices: Any, axis: Any = -1) -> Move:
    rank = len(qt.shape)
    ax = check_axis(axis, rank)
    xp = namespace_of(qt)
    if compat.is_dask_namespace(xp):
        msg = "take_along_axis (Burn's gather) has no lazy form on Dask; compute the tensor first (to_backend('numpy'))"
        raise BackendUnavailableError(msg)
    idx = positions(qt, indices, qt.shape[ax], "take_along_axis")
    if idx.ndim != rank:
        msg = f"take_along_axis indices must have the tensor's rank {rank}, got shape {tuple(idx.shape)}"
        raise ShapeError(msg)
    for d in range(rank):  # every other axis broadcasts against the tensor's
        if d != ax and idx.shape[d] not in (1, qt.shape[d]):
            msg = (
                f"take_along_axis indices of shape {tuple(idx.shape)} do not fit a tensor of shape {qt.shape}: "
                f"axis {d} must have length 1 or {qt.shape[d]}"
            )
            raise ShapeError(msg)
    out = tuple(int(idx.shape[d]) if d == ax else qt.shape[d] for d in range(rank))  # broadcast off the axis
    check_result_shape(out, "the result of take_along_axis", "take fewer indices")
    data = lambda a: xp.take_along_axis(a, idx, axis=ax)
    bd = block_dims(qt)
    return Move(bd is None, data, None, qt.scheme, qt.scheme)


def take_along_axis(qt: QuantizedTensor, indices: Any, axis: int = -1) -> QuantizedTensor:
    """Gather along ``axis`` with indices of the tensor's rank (Burn's ``gather``); exact per tensor only.

    Raises
    ------
    ShapeError
        Indices of another rank, empty, or out of range; an axis out of range; a result past the limits.
    DTypeError
        Non-integer indices.
    BackendUnavailableError
        A Dask tensor (no lazy gather).
    """
    qt = check_qt(qt)
    return run(qt, _plan_take_along_axis(qt, indices, axis))


# -- mask selection -------------------------------------------------------------------------------
def mask_select(x: QuantizedTensor, mask: Any, /) -> QuantizedTensor:
    """The elements of ``x`` where ``mask`` holds, row-major, as a 1-d quantized tensor.

    Burn's ``mask_select``, which keeps the data quantized (``argwhere`` + ``q_select``). One scale
    per tensor: the selected codes keep ``x``'s scale (exact, nothing dequantized). A block scheme:
    the selected values are quantized again with ``x``'s scheme as 1-d data (MinMax scales), which
    needs a block of one extent.

    Parameters
    ----------
    x : QuantizedTensor
    mask : bool array
        Of ``x``'s shape.

    Returns
    -------
    QuantizedTensor
        Shape ``(count,)``.

    Raises
    ------
    ShapeError
        A mask of another shape; a mask that selects nothing (Burn returns an empty tensor, but a
        QuantizedTensor has at least one element).
    DTypeError
        ``x`` not quantized, or a mask that is not a bool array.
    DeviceError
        ``mask`` in another namespace or on another device.
    BackendUnavailableError
        A Dask tensor: the result's length depends on the mask's values, which has no lazy form.

    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([[1.0, 7.0], [2.0, 3.0]], np.float32), "q8s:native")
    >>> mask_select(qt, np.array([[True, False], [False, True]])).codes().tolist()
    [18, 54]
    """
    qt = require_quantized(x)
    check_mask(mask, "mask")
    same_place(x=qt, mask=mask)
    if tuple(mask.shape) != tuple(qt.shape):
        msg = f"mask_select mask {list(mask.shape)} must have x's shape {list(qt.shape)}"
        raise ShapeError(msg)
    xp = compat.array_namespace(qt.values)
    if compat.is_dask_namespace(xp):
        msg = (
            "mask_select has no lazy form on Dask (the result's length depends on the mask's values); "
            "compute the tensor and mask first (qt.to_backend('numpy'))"
        )
        raise BackendUnavailableError(msg)
    n = math.prod(qt.shape)
    (idx,) = xp.nonzero(xp.reshape(mask, (n,)))
    if int(idx.shape[0]) == 0:
        msg = (
            "mask_select: the mask selects no element, and a QuantizedTensor has at least one "
            "(Burn returns an empty tensor here); check xp.any(mask) first"
        )
        raise ShapeError(msg)
    if per_tensor(qt):
        # Burn's route, exact here: a row-major reshape and a take keep the codes and the scale
        return take(reshape(qt, (n,)), idx, axis=0)
    # blocks: the 1-d selection quantized again, the scheme fitted to one axis (its last extent)
    return requantize(xp.take(xp.reshape(floats(qt), (n,)), idx, axis=0), qt)


# -- which path ---------------------------------------------------------------------------------
def _exact_pieces(sizes_of: Callable[..., tuple[int, list[int]]]) -> Callable[..., bool]:
    def exact(qt: QuantizedTensor, arg: Any, axis: Any = 0) -> bool:
        ax, parts = sizes_of(qt, arg, axis)
        return all(m.exact for m in _pieces(qt, ax, parts))

    return exact


# which path each operation takes (read by ops.exact.is_exact): its plan, or for split and chunk,
# whose result is a list of moves, the check itself
PLANS: dict[str, Callable[..., Move]] = {
    "getitem": _plan_getitem,
    "narrow": _plan_narrow,
    "take": _plan_take,
    "take_along_axis": _plan_take_along_axis,
}
EXACT_CHECKS: dict[str, Callable[..., bool]] = {
    "chunk": _exact_pieces(_chunk_sizes),
    "split": _exact_pieces(_split_sizes),
}
