"""Manipulation functions on quantized tensors (the Array API's category): they move codes, quantized where they can.

Every function returns a :class:`~arrayquant.QuantizedTensor`: :func:`permute_dims`,
:func:`swapaxes`, :func:`matrix_transpose`, :func:`reshape`, :func:`flip`, :func:`repeat`,
:func:`repeat_dim`, :func:`broadcast_to`, :func:`expand_dims`, :func:`squeeze`, :func:`concat` and
:func:`stack`. On the **exact path** the unpacked codes (``qt.codes()``) and the scale grid are
moved by the same operation and packed again; nothing is dequantized or quantized, the global
scale and table are kept, so ``dequantize(op(qt)) == op(dequantize(qt))`` bit for bit, two-level
schemes included. Where the moved elements keep their blocks whole (permute, reshape, flip on the
exact path) the result also equals ``quantize(op(x))`` for a one-level scheme and MinMax
``qt = quantize(x)``. Where an operation would cut a block or mix blocks under one scale, it
follows Burn's fallback: dequantize, apply the operation to the floats, and quantize again with
the input's scheme (MinMax; :func:`~arrayquant.ops._common.requantize`).
:func:`~arrayquant.ops.is_exact` says which path a call takes; ``ops.exact`` has the table of when
each layout operation is exact and the rules they all follow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import array_api_compat as compat

from ..errors import ShapeError
from ..invariants import plan_for
from ..storage import pack
from ..tensor import QuantizedTensor
from ._common import allocating, floats, requantize, same_place
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
    own_copy,
    packed_axis,
    run,
    with_block,
    with_store,
)

__all__ = [
    "broadcast_to",
    "concat",
    "expand_dims",
    "flip",
    "matrix_transpose",
    "permute_dims",
    "repeat",
    "repeat_dim",
    "reshape",
    "squeeze",
    "stack",
    "swapaxes",
]


# -- permute / transpose ------------------------------------------------------------------------
def _plan_permute(qt: QuantizedTensor, axes: Any) -> Move:
    rank = len(qt.shape)
    try:
        raw = tuple(axes)
    except TypeError:
        msg = f"axes must be a sequence of integers, got {axes!r}"
        raise ShapeError(msg) from None
    norm = tuple(check_axis(a, rank, "axes entry") for a in raw)
    if sorted(norm) != list(range(rank)):
        msg = f"axes {raw!r} must name each of the {rank} axes exactly once (a permutation of 0..{rank - 1})"
        raise ShapeError(msg)
    xp = namespace_of(qt)
    old = packed_axis(qt)
    # Burn's cubecl rule: the store keeps packing the same data, now at rank - 1 - new position
    scheme = qt.scheme if old is None else with_store(qt.scheme, norm.index(old), rank)
    bd = block_dims(qt)
    scheme = with_block(scheme, None if bd is None else tuple(bd[a] for a in norm))
    data = lambda a: xp.permute_dims(a, norm)
    return Move(True, data, None if bd is None else data, scheme, scheme)


def permute_dims(qt: QuantizedTensor, axes: Sequence[int]) -> QuantizedTensor:
    """Permute the axes; always exact (codes, scale grid, block dims and packed axis move together).

    Parameters
    ----------
    qt : QuantizedTensor
        The tensor.
    axes : sequence of int
        A permutation of ``0..rank-1`` (negative entries count from the end).

    Returns
    -------
    QuantizedTensor
        Of shape ``[qt.shape[a] for a in axes]``; a block scheme's block dims permuted as Burn's
        ``permute_block_dims`` does, a packed store packing the same (moved) axis.

    Raises
    ------
    ShapeError
        ``axes`` not a permutation of the axes.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.ones((2, 3, 4), np.float32), "q4s")
    >>> t = permute_dims(qt, (2, 0, 1))
    >>> t.shape, str(t.scheme.store)
    ((4, 2, 3), 'packed_u32:2')
    """
    qt = check_qt(qt)
    return run(qt, _plan_permute(qt, axes))


def _plan_swapaxes(qt: QuantizedTensor, axis1: Any, axis2: Any) -> Move:
    rank = len(qt.shape)
    a, b = check_axis(axis1, rank, "axis1"), check_axis(axis2, rank, "axis2")
    axes = list(range(rank))
    axes[a], axes[b] = b, a
    return _plan_permute(qt, axes)


def swapaxes(qt: QuantizedTensor, axis1: int, axis2: int) -> QuantizedTensor:
    """Swap two axes (Burn's ``swap_dims``); always exact, see :func:`permute_dims`.

    Raises
    ------
    ShapeError
        An axis out of range.
    """
    qt = check_qt(qt)
    return run(qt, _plan_swapaxes(qt, axis1, axis2))


def _plan_matrix_transpose(qt: QuantizedTensor) -> Move:
    if len(qt.shape) < 2:
        msg = f"matrix_transpose needs at least 2 axes, got shape {qt.shape}; use reshape or expand_dims first"
        raise ShapeError(msg)
    return _plan_swapaxes(qt, -1, -2)


def matrix_transpose(qt: QuantizedTensor) -> QuantizedTensor:
    """Swap the last two axes (Burn's ``transpose``); always exact, see :func:`permute_dims`.

    Raises
    ------
    ShapeError
        Fewer than two axes.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.arange(8, dtype=np.float32).reshape(2, 4), "q8s")
    >>> matrix_transpose(qt).codes().tolist()
    [[0, 73], [18, 91], [36, 109], [54, 127]]
    """
    qt = check_qt(qt)
    return run(qt, _plan_matrix_transpose(qt))


# -- reshape ------------------------------------------------------------------------------------
def _shape_entries(shape: Any, expected: str) -> list[int]:
    """``shape``'s entries as ints (a bare int is one entry); else a ShapeError: shape must be ``expected``."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        return [check_int(n, "shape entry") for n in shape]
    except TypeError:
        msg = f"shape must be {expected}, got {shape!r}"
        raise ShapeError(msg) from None


def _target_shape(shape: Any, size: int, old: tuple[int, ...]) -> tuple[int, ...]:
    dims = _shape_entries(shape, "an integer or a sequence of integers")
    if not dims:
        msg = "shape () has no axes, but a QuantizedTensor has at least one; use (1,)"
        raise ShapeError(msg)
    if dims.count(-1) > 1 or any(n < 1 and n != -1 for n in dims):
        msg = f"shape {tuple(dims)} must have extents >= 1 and at most one -1 (inferred)"
        raise ShapeError(msg)
    known = math.prod(n for n in dims if n != -1)
    if -1 in dims:
        if size % known:
            msg = f"cannot reshape {size} elements (shape {old}) into {tuple(dims)}: not a multiple of {known}"
            raise ShapeError(msg)
        dims[dims.index(-1)] = size // known
    if math.prod(dims) != size:
        msg = f"cannot reshape shape {old} ({size} elements) into {tuple(dims)} ({math.prod(dims)} elements)"
        raise ShapeError(msg)
    return tuple(dims)


def _flat_if_dask(a: Any, xp: Any) -> Any:
    # why: dask reshapes only by merging or splitting whole axes; through 1-d every reshape is both
    return xp.reshape(a, (-1,)) if compat.is_dask_array(a) else a


def _plan_reshape(qt: QuantizedTensor, shape: Any) -> Move:
    new = _target_shape(shape, math.prod(qt.shape), qt.shape)
    check_result_shape(new, "the result of reshape", "reshape to fewer axes")
    xp = namespace_of(qt)
    scheme = with_store(qt.scheme, None, len(new)) if (qt.scheme.store.dim >= len(new)) else qt.scheme
    block = qt.scheme.block_size
    data = lambda a: xp.reshape(_flat_if_dask(a, xp), new)
    if block is None:
        return Move(True, data, None, scheme, scheme)
    k = len(block.dims)
    if k == 1:
        b = block.dims[0]
        exact = qt.shape[-1] == new[-1] or (qt.shape[-1] % b == 0 and new[-1] % b == 0)
    else:
        exact = len(new) >= k and qt.shape[-k:] == new[-k:]
    grid_shape = plan_for(scheme).grid_shape(new) if exact else ()
    return Move(exact, data, lambda g: xp.reshape(_flat_if_dask(g, xp), grid_shape), scheme, scheme)


def reshape(qt: QuantizedTensor, shape: int | Sequence[int]) -> QuantizedTensor:
    """Reshape in row-major order; exact when the row-major sequence of blocks is kept.

    Parameters
    ----------
    qt : QuantizedTensor
        The tensor.
    shape : int or sequence of int
        The new shape, with the same number of elements; one entry may be ``-1`` (inferred).

    Returns
    -------
    QuantizedTensor
        The same scheme (a packed store whose dim the new rank lacks packs the last axis).
        Exact per tensor; for 1-d blocks of ``b`` when the last dim is unchanged or old and new
        last dims are multiples of ``b``; for N-d blocks when the dims the block covers are
        unchanged. Otherwise requantized (Burn's fallback).

    Raises
    ------
    ShapeError
        A shape with another element count, no axes, an extent below 1 or two ``-1``.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> from arrayquant.ops import is_exact
    >>> qt = aq.quantize(np.arange(64, dtype=np.float32).reshape(2, 32), "q8s:block16:f16")
    >>> reshape(qt, (4, 16)).scales.shape, is_exact("reshape", qt, (4, 16)), is_exact("reshape", qt, (8, 8))
    ((4, 1), True, False)
    """
    qt = check_qt(qt)
    return run(qt, _plan_reshape(qt, shape))


# -- flip ---------------------------------------------------------------------------------------
def _axes(axis: Any, rank: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(rank))
    raw = (axis,) if isinstance(axis, int) or not hasattr(axis, "__iter__") else tuple(axis)
    norm = tuple(check_axis(a, rank) for a in raw)
    if len(set(norm)) != len(norm):
        msg = f"axis {axis!r} names an axis twice"
        raise ShapeError(msg)
    return norm


def _plan_flip(qt: QuantizedTensor, axis: Any = None) -> Move:
    axes = _axes(axis, len(qt.shape))
    xp = namespace_of(qt)
    data = lambda a: xp.flip(a, axis=axes) if axes else a
    bd = block_dims(qt)
    if bd is None:
        return Move(True, data, None, qt.scheme, qt.scheme)
    exact = all(qt.shape[a] % min(bd[a], qt.shape[a]) == 0 for a in axes)
    return Move(exact, data, data, qt.scheme, qt.scheme)


def flip(qt: QuantizedTensor, axis: int | Sequence[int] | None = None) -> QuantizedTensor:
    """Reverse the order along ``axis`` (all axes when None).

    Exact per tensor and on every axis whose length is a multiple of its (clamped) block extent.

    Raises
    ------
    ShapeError
        An axis out of range or named twice.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> from arrayquant.ops import is_exact
    >>> qt = aq.quantize(np.arange(4, dtype=np.float32), "q8s:block2")
    >>> flip(qt).codes().tolist(), flip(qt).scales.tolist() == qt.scales[::-1].tolist(), is_exact("flip", qt)
    ([127, 85, 127, 0], True, True)
    """
    qt = check_qt(qt)
    return run(qt, _plan_flip(qt, axis))


# -- repeat -------------------------------------------------------------------------------------
def _plan_repeat(qt: QuantizedTensor, repeats: Any, axis: Any = None) -> Move:
    r = check_int(repeats, "repeats")
    if r < 1:
        msg = f"repeats must be >= 1, got {r}"
        raise ShapeError(msg)
    ax = None if axis is None else check_axis(axis, len(qt.shape))
    out = (r * math.prod(qt.shape),) if ax is None else (*qt.shape[:ax], r * qt.shape[ax], *qt.shape[ax + 1 :])
    check_result_shape(out, f"the result of repeat(qt, {r}, axis={ax})", "use fewer repeats")
    xp = namespace_of(qt)
    bd = block_dims(qt)
    if ax is None:  # the Array API flattens first
        scheme = with_store(qt.scheme, None, 1)
        data = lambda a: xp.repeat(xp.reshape(a, (-1,)), r, axis=0)
        return Move(bd is None, data, None, scheme, scheme)
    data = lambda a: xp.repeat(a, r, axis=ax)
    return Move(bd is None or bd[ax] == 1, data, None if bd is None else data, qt.scheme, qt.scheme)


def repeat(qt: QuantizedTensor, repeats: int, axis: int | None = None) -> QuantizedTensor:
    """Repeat each element ``repeats`` times along ``axis`` (the Array API's ``repeat``; None flattens first).

    Exact per tensor or on an unblocked axis. Burn's ``repeat_dim`` (which tiles) is :func:`repeat_dim`.

    Raises
    ------
    ShapeError
        ``repeats`` below 1, an axis out of range, a result past the limits.
    """
    qt = check_qt(qt)
    m = _plan_repeat(qt, repeats, axis)
    return allocating(lambda: run(qt, m), f"the result of repeat(qt, {repeats!r}, axis={axis!r})")


def _plan_repeat_dim(qt: QuantizedTensor, axis: Any, times: Any) -> Move:
    ax = check_axis(axis, len(qt.shape))
    t = check_int(times, "times")
    if t < 1:
        msg = f"times must be >= 1, got {t}"
        raise ShapeError(msg)
    out = (*qt.shape[:ax], t * qt.shape[ax], *qt.shape[ax + 1 :])
    check_result_shape(out, f"the result of repeat_dim(qt, {ax}, {t})", "use fewer times")
    xp = namespace_of(qt)
    reps = tuple(t if d == ax else 1 for d in range(len(qt.shape)))
    data = lambda a: xp.tile(a, reps)  # one call: a list of t references would outgrow the result
    bd = block_dims(qt)
    exact = bd is None or bd[ax] == 1 or qt.shape[ax] % bd[ax] == 0
    return Move(exact, data, None if bd is None else data, qt.scheme, qt.scheme)


def repeat_dim(qt: QuantizedTensor, axis: int, times: int) -> QuantizedTensor:
    """The whole tensor ``times`` times along ``axis`` (Burn's ``repeat_dim``, a tile).

    Exact per tensor, on an unblocked axis, or when the axis length is a multiple of the block
    extent (the grid is tiled too).

    Raises
    ------
    ShapeError
        ``times`` below 1, an axis out of range, a result past the limits.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([[0.0, 1.0]], np.float32), "q8s")
    >>> repeat_dim(qt, 0, 2).codes().tolist()
    [[0, 127], [0, 127]]
    """
    qt = check_qt(qt)
    m = _plan_repeat_dim(qt, axis, times)
    return allocating(lambda: run(qt, m), f"the result of repeat_dim(qt, {axis!r}, {times!r})")


# -- broadcast / expand_dims / squeeze ----------------------------------------------------------
def _plan_broadcast_to(qt: QuantizedTensor, shape: Any) -> Move:
    dims = _shape_entries(shape, "a sequence of integers")
    lead = len(dims) - len(qt.shape)
    if lead < 0:
        msg = f"cannot broadcast shape {qt.shape} to {tuple(dims)}, which has fewer axes"
        raise ShapeError(msg)
    for i, n in enumerate(dims):
        old = qt.shape[i - lead] if i >= lead else None
        if n == -1 and old is not None:
            dims[i] = n = old
        if n < 1 or (old is not None and old not in (1, n)):
            msg = (
                f"cannot broadcast shape {qt.shape} to {tuple(dims)}: axis {i} must be {old} or, from 1, any extent "
                "(-1 keeps an existing axis)"
                if old is not None
                else f"cannot broadcast shape {qt.shape} to {tuple(dims)}: new axis {i} needs an extent >= 1"
            )
            raise ShapeError(msg)
    new = tuple(dims)
    check_result_shape(new, "the result of broadcast_to", "broadcast to a smaller shape")
    xp = namespace_of(qt)
    old = packed_axis(qt)
    scheme = with_store(qt.scheme, None if old is None else lead + old, len(new))
    data = lambda a: own_copy(xp.broadcast_to(a, new), xp)
    if qt.scheme.block_size is None:
        return Move(True, data, None, scheme, scheme)
    grid = plan_for(scheme).grid_shape(new)
    gridded = lambda g: own_copy(xp.broadcast_to(xp.reshape(g, (1,) * lead + tuple(g.shape)), grid), xp)
    return Move(True, data, gridded, scheme, scheme)


def broadcast_to(qt: QuantizedTensor, shape: Sequence[int]) -> QuantizedTensor:
    """Broadcast to ``shape`` (Burn's ``expand``; ``-1`` keeps an existing axis); always exact.

    The scale grid is broadcast with the codes: a block over copies of one value has that
    value's scale.

    Raises
    ------
    ShapeError
        A shape the tensor does not broadcast to, or one past the limits.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([1.0, 2.0, 3.0], np.float32), "q8s")
    >>> broadcast_to(qt, (2, -1)).codes().tolist()
    [[42, 85, 127], [42, 85, 127]]
    """
    qt = check_qt(qt)
    m = _plan_broadcast_to(qt, shape)
    return allocating(lambda: run(qt, m), f"the result of broadcast_to(qt, {shape!r})")


def _plan_expand_dims(qt: QuantizedTensor, axis: Any = 0) -> Move:
    rank = len(qt.shape)
    ax = check_axis(axis, rank + 1)
    sources: list[int | None] = [*range(ax), None, *range(ax, rank)]
    check_result_shape((*qt.shape[:ax], 1, *qt.shape[ax:]), "the result of expand_dims", "squeeze an axis first")
    xp = namespace_of(qt)
    scheme = moved_store(qt, sources)
    data = lambda a: xp.expand_dims(a, axis=ax)
    bd = block_dims(qt)
    if bd is None:
        return Move(True, data, None, scheme, scheme)
    return Move(lines_up(qt, sources), data, data, scheme, scheme)


def expand_dims(qt: QuantizedTensor, axis: int = 0) -> QuantizedTensor:
    """Insert an axis of length 1 at ``axis``; exact when the block still covers the same axes.

    Raises
    ------
    ShapeError
        An axis outside ``[-rank-1, rank]``, a result of more than 32 axes.
    """
    qt = check_qt(qt)
    return run(qt, _plan_expand_dims(qt, axis))


def _plan_squeeze(qt: QuantizedTensor, axis: Any) -> Move:
    rank = len(qt.shape)
    axes = _axes(axis, rank)
    for a in axes:
        if qt.shape[a] != 1:
            msg = f"cannot squeeze axis {a} of length {qt.shape[a]}; only axes of length 1 can be removed"
            raise ShapeError(msg)
    sources: list[int | None] = [a for a in range(rank) if a not in axes]
    check_result_shape([qt.shape[a] for a in sources if a is not None], "squeeze")
    xp = namespace_of(qt)
    scheme = moved_store(qt, sources)
    data = lambda a: xp.squeeze(a, axis=axes)
    bd = block_dims(qt)
    if bd is None:
        return Move(True, data, None, scheme, scheme)
    return Move(lines_up(qt, sources), data, data, scheme, scheme)


def squeeze(qt: QuantizedTensor, axis: int | Sequence[int]) -> QuantizedTensor:
    """Remove axes of length 1; exact when the block still covers the same axes.

    Raises
    ------
    ShapeError
        An axis out of range, of length above 1, or removing every axis.
    """
    qt = check_qt(qt)
    return run(qt, _plan_squeeze(qt, axis))


# -- concat / stack -----------------------------------------------------------------------------
def _same(a: Any, b: Any, xp: Any) -> bool:
    if a is b:
        return True
    if a is None or b is None or tuple(a.shape) != tuple(b.shape):
        return False
    return bool(xp.all(a == b))


def _check_list(qts: Any) -> list[QuantizedTensor]:
    if isinstance(qts, QuantizedTensor) or not isinstance(qts, Sequence) or not qts:
        msg = f"expected a non-empty list of QuantizedTensors, got {type(qts).__name__}"
        raise ShapeError(msg)
    items = [check_qt(q, f"qts[{i}]") for i, q in enumerate(qts)]
    same_place(**{f"qts[{i}]": q for i, q in enumerate(items)})
    return items


def _shareable(qts: list[QuantizedTensor], xp: Any) -> bool:
    """Same scheme, global scale, table (and, per tensor, the same scale) across the inputs."""
    first = qts[0]
    for q in qts[1:]:
        if q.scheme != first.scheme or not _same(q.global_scale, first.global_scale, xp):
            return False
        if q.dtype != first.dtype:  # the floats stood for differ: the fallback promotes them
            return False
        if not _same(q.table, first.table, xp):
            return False
        if first.scheme.block_size is None and not all(
            _same(getattr(q, part), getattr(first, part), xp) for part in ("scales", "zero_point", "offset")
        ):
            return False
    return True


def _concat_exact(qts: list[QuantizedTensor], ax: int) -> bool:
    xp = namespace_of(qts[0])
    if not _shareable(qts, xp):
        return False
    bd = block_dims(qts[0])
    return bd is None or all(q.shape[ax] % bd[ax] == 0 for q in qts[:-1])


def _check_concat(qts: Any, axis: Any) -> tuple[list[QuantizedTensor], int]:
    items = _check_list(qts)
    rank = len(items[0].shape)
    ax = check_axis(axis, rank)
    for i, q in enumerate(items):
        if len(q.shape) != rank or any(q.shape[d] != items[0].shape[d] for d in range(rank) if d != ax):
            msg = f"qts[{i}] has shape {q.shape} but concat along axis {ax} needs {items[0].shape} on every other axis"
            raise ShapeError(msg)
    first = items[0].shape
    out = (*first[:ax], sum(q.shape[ax] for q in items), *first[ax + 1 :])
    check_result_shape(out, "the result of concat", "join fewer or smaller tensors")
    return items, ax


def _concat_run(items: list[QuantizedTensor], ax: int, exact: bool) -> QuantizedTensor:
    first = items[0]
    xp = namespace_of(first)
    if not exact:
        return requantize(xp.concat([floats(q) for q in items], axis=ax), first)
    codes = xp.concat([q.codes() for q in items], axis=ax)
    blocked = first.scheme.block_size is not None
    grids = {}
    for part in ("scales", "zero_point", "offset"):
        own = getattr(first, part)
        grids[part] = own if own is None or not blocked else xp.concat([getattr(q, part) for q in items], axis=ax)
    shape = tuple(int(n) for n in codes.shape)
    return QuantizedTensor(
        first.scheme,
        shape,
        first.dtype,
        pack(codes, first.scheme),
        grids["scales"],
        first.global_scale,
        first.table,
        grids["zero_point"],
        grids["offset"],
    )


def concat(qts: Sequence[QuantizedTensor], axis: int = 0) -> QuantizedTensor:
    """Join tensors along an existing axis (Burn's ``cat``).

    Exact when all share scheme, global scale and table, per tensor with identical scales, and
    with blocks every input but the last is a multiple of the block extent long on ``axis``.
    Otherwise (always, in Burn) the floats are joined and quantized with the first's scheme.

    Raises
    ------
    ShapeError
        An empty list, an axis out of range, shapes that differ off ``axis``, a result past the limits.
    DTypeError
        An entry that is not a QuantizedTensor.
    DeviceError
        Tensors in different namespaces or on different devices.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> from arrayquant.ops import is_exact
    >>> s = aq.QuantScheme.parse("q8s:block2")
    >>> a, b = aq.quantize(np.array([1.0, 2.0], np.float32), s), aq.quantize(np.array([4.0], np.float32), s)
    >>> concat([a, b]).codes().tolist(), is_exact("concat", [a, b])
    ([64, 127, 127], True)
    """
    items, ax = _check_concat(qts, axis)
    return allocating(lambda: _concat_run(items, ax, _concat_exact(items, ax)), "the result of concat")


def _check_stack(qts: Any, axis: Any) -> tuple[list[QuantizedTensor], int]:
    items = _check_list(qts)
    for i, q in enumerate(items):
        if q.shape != items[0].shape:
            msg = f"qts[{i}] has shape {q.shape} but stack needs every shape equal to {items[0].shape}"
            raise ShapeError(msg)
    first = items[0].shape
    ax = check_axis(axis, len(first) + 1)
    check_result_shape((*first[:ax], len(items), *first[ax:]), "the result of stack", "join fewer or smaller tensors")
    return items, ax


def _stack_exact(items: list[QuantizedTensor], ax: int) -> bool:
    return _plan_expand_dims(items[0], ax).exact and _shareable(items, namespace_of(items[0]))


def stack(qts: Sequence[QuantizedTensor], axis: int = 0) -> QuantizedTensor:
    """Join equal-shaped tensors along a new axis (Burn's ``stack``).

    Exact as :func:`concat` of :func:`expand_dims` (the new axis must leave the block on the
    same axes); otherwise the floats are stacked and quantized with the first's scheme.

    Raises
    ------
    ShapeError
        An empty list, shapes that differ, an axis outside ``[-rank-1, rank]``, a result past the limits.
    """
    items, ax = _check_stack(qts, axis)
    return allocating(lambda: _stack_run(items, ax), "the result of stack")


def _stack_run(items: list[QuantizedTensor], ax: int) -> QuantizedTensor:
    if _stack_exact(items, ax):
        return _concat_run([run(q, _plan_expand_dims(q, ax)) for q in items], ax, True)
    xp = namespace_of(items[0])
    return requantize(xp.stack([floats(q) for q in items], axis=ax), items[0])


# -- which path ---------------------------------------------------------------------------------
def _exact_concat(qts: Any, axis: Any = 0) -> bool:
    return _concat_exact(*_check_concat(qts, axis))


def _exact_stack(qts: Any, axis: Any = 0) -> bool:
    return _stack_exact(*_check_stack(qts, axis))


# which path each operation takes (read by ops.exact.is_exact): its plan, or for concat and stack,
# whose result is not one move, the check itself
PLANS: dict[str, Callable[..., Move]] = {
    "broadcast_to": _plan_broadcast_to,
    "expand_dims": _plan_expand_dims,
    "flip": _plan_flip,
    "matrix_transpose": _plan_matrix_transpose,
    "permute_dims": _plan_permute,
    "repeat": _plan_repeat,
    "repeat_dim": _plan_repeat_dim,
    "reshape": _plan_reshape,
    "squeeze": _plan_squeeze,
    "swapaxes": _plan_swapaxes,
}
EXACT_CHECKS: dict[str, Callable[..., bool]] = {"concat": _exact_concat, "stack": _exact_stack}
