"""Layout operations on quantized tensors: they move codes, and stay quantized where they can.

Every function returns a :class:`~arrayquant.QuantizedTensor` (``chunk`` and ``split`` a list
of them). On the **exact path** the unpacked codes (``qt.codes()``) and the scale grid are moved
by the same operation and packed again; nothing is dequantized or quantized, the global scale
and table are kept, so ``dequantize(op(qt)) == op(dequantize(qt))`` bit for bit, two-level
schemes included. Where the moved elements keep their blocks whole (permute, reshape, flip on
the exact path) the result also equals ``quantize(op(x))`` for a one-level scheme and MinMax
``qt = quantize(x)``. Where an operation would cut a block or mix blocks under one scale, it
follows Burn's fallback: dequantize, apply the operation to the floats, and quantize again with
the input's scheme (MinMax; :func:`~arrayquant.ops._common.requantize`). :func:`is_exact` says
which path a call takes.

"Blocked axis" below means an axis whose block extent (the scheme's block right-aligned to the
rank, ``b``) is above 1; "per tensor" means a scheme without a block level.

==========================  ===================================================  ===========
op                          exact when                                           otherwise
==========================  ===================================================  ===========
permute_dims, swapaxes,     always: codes and grid permuted, the block dims      --
matrix_transpose            permuted (Burn's ``permute_block_dims``) and the
                            packed axis moved with its data (Burn's cubecl
                            rule: the store dim becomes ``rank-1-new_pos``)
reshape                     per tensor; 1-d blocks when the last dim is          requantize
                            unchanged or old and new last dims are multiples of
                            ``b``; N-d blocks when the trailing dims the block
                            covers are unchanged
getitem, narrow, chunk,     per tensor; else on every blocked axis a step-1      requantize
split                       slice from a multiple of ``b`` to a multiple of
                            ``b`` or the axis end (ints, steps != 1 and negative
                            steps on unblocked axes), and the block still lines
                            up with the same axes after ``None``/int indices
flip                        per tensor; unblocked axes; a blocked axis whose     requantize
                            length is a multiple of ``min(b, length)``
take (Burn select)          per tensor; an unblocked axis                        requantize
take_along_axis (gather)    per tensor                                           requantize
repeat (Array API)          per tensor; an unblocked axis                        requantize
repeat_dim (Burn, tiles)    per tensor; an unblocked axis, or a length that is   requantize
                            a multiple of ``b``
broadcast_to (Burn expand)  always: the grid is broadcast with the codes         --
expand_dims, squeeze        per tensor; else when the block still lines up with  requantize
                            the same axes (axes added or removed left of it)
concat, stack               all inputs share scheme, global scale and table,     requantize
                            and per tensor identical scales, with blocks every   with the
                            input but the last a multiple of ``b`` long on the   first's
                            axis (``stack``: as ``expand_dims`` too)              scheme
==========================  ===================================================  ===========

A packed store follows its axis: where the packed axis moves (permute, ``None``/int indices,
``expand_dims``, ``squeeze``) the store's dim is rewritten so the same data stays packed; where
it disappears or the new rank has no such axis (an int index on it, a reshape to fewer axes) it
packs the last axis (dim 0). Every layout here is supported by :func:`~arrayquant.pack`.
A result with no axes, or with an empty axis, is a :class:`~arrayquant.ShapeError` (a
``QuantizedTensor`` has at least one element on every axis), and so is one past the limits
:func:`~arrayquant.quantize` enforces (more than 32 axes or ``2**62`` elements: a count, a target
shape or many inputs asking for too much), refused before anything is allocated; a result
within them that an eager backend cannot allocate (``repeat(qt, 2**40)``) is one too. Dask arrays
work wherever the backend has the operation lazily; ``take_along_axis`` on Dask raises
:class:`~arrayquant.BackendUnavailableError`. Comparing scales for ``concat``/``stack`` of
per-tensor inputs reads them (a Dask input is computed for that one value).

>>> import numpy as np
>>> import arrayquant as aq
>>> from arrayquant.ops import layout
>>> x = np.arange(-32, 32, dtype=np.float32).reshape(2, 32)
>>> qt = aq.quantize(x, "q8s:block16:f16")
>>> layout.matrix_transpose(qt).scheme.block_size
BlockSize((16, 1))
>>> layout.is_exact("getitem", qt, (slice(None), slice(0, 16))), layout.is_exact("getitem", qt, (0, slice(0, 8)))
(True, False)
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import array_api_compat as compat

from ..errors import BackendUnavailableError, DTypeError, SchemeError, ShapeError
from ..invariants import plan_for
from ..scheme import BlockSize, QuantScheme, QuantStore
from ..storage import pack
from ..tensor import QuantizedTensor
from ._common import check_result_size, floats, positions, requantize, same_place

__all__ = [
    "broadcast_to",
    "chunk",
    "concat",
    "expand_dims",
    "flip",
    "getitem",
    "is_exact",
    "matrix_transpose",
    "narrow",
    "permute_dims",
    "repeat",
    "repeat_dim",
    "reshape",
    "split",
    "squeeze",
    "stack",
    "swapaxes",
    "take",
    "take_along_axis",
]


# -- shared machinery ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Move:
    """One layout operation, planned: whether it is exact, and how it moves data and scales."""

    exact: bool
    data: Callable[[Any], Any]  # the op on an array of the data's shape (codes, or floats)
    grid: Callable[[Any], Any] | None  # the op on the scale grid; None keeps the scales (per tensor)
    scheme: QuantScheme  # the result's scheme on the exact path
    fallback: QuantScheme  # the scheme requantized with otherwise


def _check_qt(qt: Any, name: str = "qt") -> QuantizedTensor:
    if not isinstance(qt, QuantizedTensor):
        msg = f"{name} must be a QuantizedTensor (from aq.quantize), got {type(qt).__name__}"
        raise DTypeError(msg)
    return qt


def _xp(qt: QuantizedTensor) -> Any:
    return compat.array_namespace(qt.values)


def _axis(axis: Any, rank: int, what: str = "axis") -> int:
    """``axis`` as an index in ``[0, rank)`` (negative counts from the end)."""
    try:
        if isinstance(axis, bool):
            raise TypeError
        a = operator.index(axis)
    except TypeError:
        msg = f"{what} must be an integer, got {axis!r}"
        raise ShapeError(msg) from None
    if not -rank <= a < rank:
        msg = f"{what} {a} is out of range for a tensor of rank {rank}; use an axis in [{-rank}, {rank - 1}]"
        raise ShapeError(msg)
    return a % rank


def _int(v: Any, what: str) -> int:
    try:
        if isinstance(v, bool):
            raise TypeError
        return operator.index(v)
    except TypeError:
        msg = f"{what} must be an integer, got {v!r}"
        raise ShapeError(msg) from None


def _block_dims(qt: QuantizedTensor) -> tuple[int, ...] | None:
    """The scheme's block extents right-aligned to the rank (unclamped), or None per tensor."""
    block = qt.scheme.block_size
    return None if block is None else block.to_dims(len(qt.shape))


def _with_block(scheme: QuantScheme, dims: tuple[int, ...] | None) -> QuantScheme:
    if dims is None or scheme.block_size is None or BlockSize(dims) == scheme.block_size:
        return scheme
    return scheme.per_block(BlockSize(dims), scheme.block[1])  # type: ignore[index]


def _with_store(scheme: QuantScheme, new_pos: int | None, new_rank: int) -> QuantScheme:
    """The store packing the axis now at ``new_pos`` (the last axis when None or out of range)."""
    store = scheme.store
    if not store.is_packed:
        return scheme
    dim = 0 if new_pos is None else new_rank - 1 - new_pos
    return scheme if dim == store.dim else scheme.with_store(QuantStore(store.kind, dim))


def _old_packed(qt: QuantizedTensor) -> int | None:
    return plan_for(qt.scheme).packed_axis(len(qt.shape))


def _moved_store(qt: QuantizedTensor, sources: Sequence[int | None]) -> QuantScheme:
    """The scheme with its store following the packed axis to its new position (``sources[i]`` = old axis)."""
    old = _old_packed(qt)
    pos = next((i for i, s in enumerate(sources) if s is not None and s == old), None)
    return _with_store(qt.scheme, pos, len(sources))


def _carried_block(qt: QuantizedTensor, sources: Sequence[int | None]) -> tuple[int, ...] | None:
    """Per output axis, the block extent of its source axis (1 for a new axis)."""
    bd = _block_dims(qt)
    if bd is None:
        return None
    return tuple(1 if s is None else bd[s] for s in sources)


def _lines_up(qt: QuantizedTensor, sources: Sequence[int | None]) -> bool:
    """Whether the scheme's block, right-aligned to the new rank, still covers the same axes."""
    dims = _carried_block(qt, sources)
    if dims is None:
        return True
    assert qt.scheme.block_size is not None
    return bool(dims) and BlockSize(dims) == qt.scheme.block_size


def _own(a: Any, xp: Any) -> Any:
    """A copy that owns its memory (a broadcast view would be read-only and strided)."""
    return xp.asarray(a, copy=True, device=compat.device(a))


def _run(qt: QuantizedTensor, m: _Move) -> QuantizedTensor:
    if not m.exact:
        like = qt if m.fallback == qt.scheme else replace(qt, scheme=m.fallback)
        return requantize(m.data(floats(qt)), like)
    codes = m.data(qt.codes())
    scales = qt.scales if m.grid is None else m.grid(qt.scales)
    shape = tuple(int(n) for n in codes.shape)
    return QuantizedTensor(m.scheme, shape, qt.dtype, pack(codes, m.scheme), scales, qt.global_scale, qt.table)


def _allocating(run: Callable[[], QuantizedTensor], what: str) -> QuantizedTensor:
    """``run()`` for an operation whose result an argument sizes (a count, a shape, many inputs).

    Within the element limit a result can still be far beyond memory (``repeat(qt, 2**40)``); the
    backend then refuses that one allocation, and this says so as a ShapeError. Only eager
    backends allocate here: a Dask result is built lazily, chunk by chunk.
    """
    try:
        return run()
    except MemoryError as exc:  # NumPy's and CuPy's name the size they could not allocate
        msg = f"{what} could not be allocated ({exc or 'out of memory'}); ask for a smaller result"
        raise ShapeError(msg) from exc


def _check_result_shape(shape: Sequence[int], what: str, fix: str = "ask for a smaller result") -> None:
    """A result must have an axis, no empty axis, and stay within quantize's limits (checked before it is built)."""
    if not shape:
        msg = f"{what} would have no axes, but a QuantizedTensor has at least one; keep an axis (e.g. qt[i:i+1])"
        raise ShapeError(msg)
    if min(shape) < 1:
        msg = (
            f"{what} would have shape {tuple(shape)} with an empty axis; "
            "a QuantizedTensor has at least one element per axis"
        )
        raise ShapeError(msg)
    check_result_size(tuple(shape), what, fix)


# -- permute / transpose ------------------------------------------------------------------------
def _plan_permute(qt: QuantizedTensor, axes: Any) -> _Move:
    rank = len(qt.shape)
    try:
        raw = tuple(axes)
    except TypeError:
        msg = f"axes must be a sequence of integers, got {axes!r}"
        raise ShapeError(msg) from None
    norm = tuple(_axis(a, rank, "axes entry") for a in raw)
    if sorted(norm) != list(range(rank)):
        msg = f"axes {raw!r} must name each of the {rank} axes exactly once (a permutation of 0..{rank - 1})"
        raise ShapeError(msg)
    xp = _xp(qt)
    old = _old_packed(qt)
    # Burn's cubecl rule: the store keeps packing the same data, now at rank - 1 - new position
    scheme = qt.scheme if old is None else _with_store(qt.scheme, norm.index(old), rank)
    bd = _block_dims(qt)
    scheme = _with_block(scheme, None if bd is None else tuple(bd[a] for a in norm))
    data = lambda a: xp.permute_dims(a, norm)
    return _Move(True, data, None if bd is None else data, scheme, scheme)


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
    qt = _check_qt(qt)
    return _run(qt, _plan_permute(qt, axes))


def _plan_swapaxes(qt: QuantizedTensor, axis1: Any, axis2: Any) -> _Move:
    rank = len(qt.shape)
    a, b = _axis(axis1, rank, "axis1"), _axis(axis2, rank, "axis2")
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
    qt = _check_qt(qt)
    return _run(qt, _plan_swapaxes(qt, axis1, axis2))


def _plan_matrix_transpose(qt: QuantizedTensor) -> _Move:
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
    qt = _check_qt(qt)
    return _run(qt, _plan_matrix_transpose(qt))


# -- reshape ------------------------------------------------------------------------------------
def _target_shape(shape: Any, size: int, old: tuple[int, ...]) -> tuple[int, ...]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = [_int(n, "shape entry") for n in shape]
    except TypeError:
        msg = f"shape must be an integer or a sequence of integers, got {shape!r}"
        raise ShapeError(msg) from None
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


def _plan_reshape(qt: QuantizedTensor, shape: Any) -> _Move:
    new = _target_shape(shape, math.prod(qt.shape), qt.shape)
    _check_result_shape(new, "the result of reshape", "reshape to fewer axes")
    xp = _xp(qt)
    scheme = _with_store(qt.scheme, None, len(new)) if (qt.scheme.store.dim >= len(new)) else qt.scheme
    block = qt.scheme.block_size
    data = lambda a: xp.reshape(_flat_if_dask(a, xp), new)
    if block is None:
        return _Move(True, data, None, scheme, scheme)
    k = len(block.dims)
    if k == 1:
        b = block.dims[0]
        exact = qt.shape[-1] == new[-1] or (qt.shape[-1] % b == 0 and new[-1] % b == 0)
    else:
        exact = len(new) >= k and qt.shape[-k:] == new[-k:]
    grid_shape = plan_for(scheme).grid_shape(new) if exact else ()
    return _Move(exact, data, lambda g: xp.reshape(_flat_if_dask(g, xp), grid_shape), scheme, scheme)


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
    >>> qt = aq.quantize(np.arange(64, dtype=np.float32).reshape(2, 32), "q8s:block16:f16")
    >>> reshape(qt, (4, 16)).scales.shape, is_exact("reshape", qt, (4, 16)), is_exact("reshape", qt, (8, 8))
    ((4, 1), True, False)
    """
    qt = _check_qt(qt)
    return _run(qt, _plan_reshape(qt, shape))


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


def _plan_getitem(qt: QuantizedTensor, key: Any) -> _Move:
    sel = _parse_key(key, qt.shape)
    new_shape = [1 if it is None else it[5] for it in sel if it is None or it[0] == "s"]
    _check_result_shape(new_shape, f"qt[{key!r}]")
    sources = [None if it is None else it[1] for it in sel if it is None or it[0] == "s"]
    xp = _xp(qt)
    scheme = _moved_store(qt, sources)
    data = lambda a: _index(a, sel, xp)
    bd = _block_dims(qt)
    if bd is None:
        return _Move(True, data, None, scheme, scheme)
    exact = _lines_up(qt, sources)
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
    return _Move(exact, data, lambda g: _index(g, grid_sel, xp), scheme, scheme)


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
    qt = _check_qt(qt)
    return _run(qt, _plan_getitem(qt, key))


def _plan_narrow(qt: QuantizedTensor, axis: Any, start: Any, length: Any) -> _Move:
    rank = len(qt.shape)
    ax = _axis(axis, rank)
    n = qt.shape[ax]
    s, ln = _int(start, "start"), _int(length, "length")
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
    qt = _check_qt(qt)
    return _run(qt, _plan_narrow(qt, axis, start, length))


def _split_sizes(qt: QuantizedTensor, sizes: Any, axis: Any) -> tuple[int, list[int]]:
    ax = _axis(axis, len(qt.shape))
    n = qt.shape[ax]
    if isinstance(sizes, int) and not isinstance(sizes, bool):
        if sizes < 1:
            msg = f"split size must be >= 1, got {sizes}"
            raise ShapeError(msg)
        return ax, [min(sizes, n - i) for i in range(0, n, sizes)]
    try:
        parts = [_int(s, "split size") for s in sizes]
    except TypeError:
        msg = f"sizes must be an integer or a sequence of integers, got {sizes!r}"
        raise ShapeError(msg) from None
    if not parts or min(parts) < 1 or sum(parts) != n:
        msg = f"sizes {parts} must be >= 1 each and add up to the length {n} of axis {ax}"
        raise ShapeError(msg)
    return ax, parts


def _chunk_sizes(qt: QuantizedTensor, chunks: Any, axis: Any) -> tuple[int, list[int]]:
    c = _int(chunks, "chunks")
    if c < 1:
        msg = f"chunks must be >= 1, got {c}"
        raise ShapeError(msg)
    ax = _axis(axis, len(qt.shape))
    return _split_sizes(qt, -(-qt.shape[ax] // c), ax)


def _pieces(qt: QuantizedTensor, ax: int, sizes: list[int]) -> list[_Move]:
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
    qt = _check_qt(qt)
    ax, parts = _split_sizes(qt, sizes, axis)
    return [_run(qt, m) for m in _pieces(qt, ax, parts)]


def chunk(qt: QuantizedTensor, chunks: int, axis: int = 0) -> list[QuantizedTensor]:
    """At most ``chunks`` pieces of ``ceil(n / chunks)`` along ``axis``, the last smaller (Burn's, torch's ``chunk``).

    Raises
    ------
    ShapeError
        ``chunks`` below 1, an axis out of range.
    """
    qt = _check_qt(qt)
    ax, parts = _chunk_sizes(qt, chunks, axis)
    return [_run(qt, m) for m in _pieces(qt, ax, parts)]


# -- flip ---------------------------------------------------------------------------------------
def _axes(axis: Any, rank: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(rank))
    raw = (axis,) if isinstance(axis, int) or not hasattr(axis, "__iter__") else tuple(axis)
    norm = tuple(_axis(a, rank) for a in raw)
    if len(set(norm)) != len(norm):
        msg = f"axis {axis!r} names an axis twice"
        raise ShapeError(msg)
    return norm


def _plan_flip(qt: QuantizedTensor, axis: Any = None) -> _Move:
    axes = _axes(axis, len(qt.shape))
    xp = _xp(qt)
    data = lambda a: xp.flip(a, axis=axes) if axes else a
    bd = _block_dims(qt)
    if bd is None:
        return _Move(True, data, None, qt.scheme, qt.scheme)
    exact = all(qt.shape[a] % min(bd[a], qt.shape[a]) == 0 for a in axes)
    return _Move(exact, data, data, qt.scheme, qt.scheme)


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
    >>> qt = aq.quantize(np.arange(4, dtype=np.float32), "q8s:block2")
    >>> flip(qt).codes().tolist(), flip(qt).scales.tolist() == qt.scales[::-1].tolist(), is_exact("flip", qt)
    ([127, 85, 127, 0], True, True)
    """
    qt = _check_qt(qt)
    return _run(qt, _plan_flip(qt, axis))


# -- take / gather / repeat ---------------------------------------------------------------------
def _plan_take(qt: QuantizedTensor, indices: Any, axis: Any = None) -> _Move:
    rank = len(qt.shape)
    if axis is None:
        if rank != 1:
            msg = f"take needs an axis for a tensor of rank {rank}"
            raise ShapeError(msg)
        axis = 0
    ax = _axis(axis, rank)
    idx = positions(qt, indices, qt.shape[ax], "take")
    if idx.ndim != 1 or idx.shape[0] == 0:
        msg = f"take indices must be a non-empty 1-d array, got shape {tuple(idx.shape)}"
        raise ShapeError(msg)
    out = (*qt.shape[:ax], int(idx.shape[0]), *qt.shape[ax + 1 :])
    _check_result_shape(out, "the result of take", "take fewer indices")
    xp = _xp(qt)
    data = lambda a: xp.take(a, idx, axis=ax)
    bd = _block_dims(qt)
    exact = bd is None or bd[ax] == 1
    return _Move(exact, data, None if bd is None else data, qt.scheme, qt.scheme)


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
    qt = _check_qt(qt)
    return _run(qt, _plan_take(qt, indices, axis))


def _plan_take_along_axis(qt: QuantizedTensor, indices: Any, axis: Any = -1) -> _Move:
    rank = len(qt.shape)
    ax = _axis(axis, rank)
    xp = _xp(qt)
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
    _check_result_shape(out, "the result of take_along_axis", "take fewer indices")
    data = lambda a: xp.take_along_axis(a, idx, axis=ax)
    bd = _block_dims(qt)
    return _Move(bd is None, data, None, qt.scheme, qt.scheme)


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
    qt = _check_qt(qt)
    return _run(qt, _plan_take_along_axis(qt, indices, axis))


def _plan_repeat(qt: QuantizedTensor, repeats: Any, axis: Any = None) -> _Move:
    r = _int(repeats, "repeats")
    if r < 1:
        msg = f"repeats must be >= 1, got {r}"
        raise ShapeError(msg)
    ax = None if axis is None else _axis(axis, len(qt.shape))
    out = (r * math.prod(qt.shape),) if ax is None else (*qt.shape[:ax], r * qt.shape[ax], *qt.shape[ax + 1 :])
    _check_result_shape(out, f"the result of repeat(qt, {r}, axis={ax})", "use fewer repeats")
    xp = _xp(qt)
    bd = _block_dims(qt)
    if ax is None:  # the Array API flattens first
        scheme = _with_store(qt.scheme, None, 1)
        data = lambda a: xp.repeat(xp.reshape(a, (-1,)), r, axis=0)
        return _Move(bd is None, data, None, scheme, scheme)
    data = lambda a: xp.repeat(a, r, axis=ax)
    return _Move(bd is None or bd[ax] == 1, data, None if bd is None else data, qt.scheme, qt.scheme)


def repeat(qt: QuantizedTensor, repeats: int, axis: int | None = None) -> QuantizedTensor:
    """Repeat each element ``repeats`` times along ``axis`` (the Array API's ``repeat``; None flattens first).

    Exact per tensor or on an unblocked axis. Burn's ``repeat_dim`` (which tiles) is :func:`repeat_dim`.

    Raises
    ------
    ShapeError
        ``repeats`` below 1, an axis out of range, a result past the limits.
    """
    qt = _check_qt(qt)
    m = _plan_repeat(qt, repeats, axis)
    return _allocating(lambda: _run(qt, m), f"the result of repeat(qt, {repeats!r}, axis={axis!r})")


def _plan_repeat_dim(qt: QuantizedTensor, axis: Any, times: Any) -> _Move:
    ax = _axis(axis, len(qt.shape))
    t = _int(times, "times")
    if t < 1:
        msg = f"times must be >= 1, got {t}"
        raise ShapeError(msg)
    out = (*qt.shape[:ax], t * qt.shape[ax], *qt.shape[ax + 1 :])
    _check_result_shape(out, f"the result of repeat_dim(qt, {ax}, {t})", "use fewer times")
    xp = _xp(qt)
    reps = tuple(t if d == ax else 1 for d in range(len(qt.shape)))
    data = lambda a: xp.tile(a, reps)  # one call: a list of t references would outgrow the result
    bd = _block_dims(qt)
    exact = bd is None or bd[ax] == 1 or qt.shape[ax] % bd[ax] == 0
    return _Move(exact, data, None if bd is None else data, qt.scheme, qt.scheme)


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
    qt = _check_qt(qt)
    m = _plan_repeat_dim(qt, axis, times)
    return _allocating(lambda: _run(qt, m), f"the result of repeat_dim(qt, {axis!r}, {times!r})")


# -- broadcast / expand_dims / squeeze ----------------------------------------------------------
def _plan_broadcast_to(qt: QuantizedTensor, shape: Any) -> _Move:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = [_int(n, "shape entry") for n in shape]
    except TypeError:
        msg = f"shape must be a sequence of integers, got {shape!r}"
        raise ShapeError(msg) from None
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
    _check_result_shape(new, "the result of broadcast_to", "broadcast to a smaller shape")
    xp = _xp(qt)
    old = _old_packed(qt)
    scheme = _with_store(qt.scheme, None if old is None else lead + old, len(new))
    data = lambda a: _own(xp.broadcast_to(a, new), xp)
    if qt.scheme.block_size is None:
        return _Move(True, data, None, scheme, scheme)
    grid = plan_for(scheme).grid_shape(new)
    gridded = lambda g: _own(xp.broadcast_to(xp.reshape(g, (1,) * lead + tuple(g.shape)), grid), xp)
    return _Move(True, data, gridded, scheme, scheme)


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
    qt = _check_qt(qt)
    m = _plan_broadcast_to(qt, shape)
    return _allocating(lambda: _run(qt, m), f"the result of broadcast_to(qt, {shape!r})")


def _plan_expand_dims(qt: QuantizedTensor, axis: Any = 0) -> _Move:
    rank = len(qt.shape)
    ax = _axis(axis, rank + 1)
    sources: list[int | None] = [*range(ax), None, *range(ax, rank)]
    _check_result_shape((*qt.shape[:ax], 1, *qt.shape[ax:]), "the result of expand_dims", "squeeze an axis first")
    xp = _xp(qt)
    scheme = _moved_store(qt, sources)
    data = lambda a: xp.expand_dims(a, axis=ax)
    bd = _block_dims(qt)
    if bd is None:
        return _Move(True, data, None, scheme, scheme)
    return _Move(_lines_up(qt, sources), data, data, scheme, scheme)


def expand_dims(qt: QuantizedTensor, axis: int = 0) -> QuantizedTensor:
    """Insert an axis of length 1 at ``axis``; exact when the block still covers the same axes.

    Raises
    ------
    ShapeError
        An axis outside ``[-rank-1, rank]``, a result of more than 32 axes.
    """
    qt = _check_qt(qt)
    return _run(qt, _plan_expand_dims(qt, axis))


def _plan_squeeze(qt: QuantizedTensor, axis: Any) -> _Move:
    rank = len(qt.shape)
    axes = _axes(axis, rank)
    for a in axes:
        if qt.shape[a] != 1:
            msg = f"cannot squeeze axis {a} of length {qt.shape[a]}; only axes of length 1 can be removed"
            raise ShapeError(msg)
    sources: list[int | None] = [a for a in range(rank) if a not in axes]
    _check_result_shape([qt.shape[a] for a in sources if a is not None], "squeeze")
    xp = _xp(qt)
    scheme = _moved_store(qt, sources)
    data = lambda a: xp.squeeze(a, axis=axes)
    bd = _block_dims(qt)
    if bd is None:
        return _Move(True, data, None, scheme, scheme)
    return _Move(_lines_up(qt, sources), data, data, scheme, scheme)


def squeeze(qt: QuantizedTensor, axis: int | Sequence[int]) -> QuantizedTensor:
    """Remove axes of length 1; exact when the block still covers the same axes.

    Raises
    ------
    ShapeError
        An axis out of range, of length above 1, or removing every axis.
    """
    qt = _check_qt(qt)
    return _run(qt, _plan_squeeze(qt, axis))


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
    items = [_check_qt(q, f"qts[{i}]") for i, q in enumerate(qts)]
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
        if first.scheme.block_size is None and not _same(q.scales, first.scales, xp):
            return False
    return True


def _concat_exact(qts: list[QuantizedTensor], ax: int) -> bool:
    xp = _xp(qts[0])
    if not _shareable(qts, xp):
        return False
    bd = _block_dims(qts[0])
    return bd is None or all(q.shape[ax] % bd[ax] == 0 for q in qts[:-1])


def _check_concat(qts: Any, axis: Any) -> tuple[list[QuantizedTensor], int]:
    items = _check_list(qts)
    rank = len(items[0].shape)
    ax = _axis(axis, rank)
    for i, q in enumerate(items):
        if len(q.shape) != rank or any(q.shape[d] != items[0].shape[d] for d in range(rank) if d != ax):
            msg = f"qts[{i}] has shape {q.shape} but concat along axis {ax} needs {items[0].shape} on every other axis"
            raise ShapeError(msg)
    first = items[0].shape
    out = (*first[:ax], sum(q.shape[ax] for q in items), *first[ax + 1 :])
    _check_result_shape(out, "the result of concat", "join fewer or smaller tensors")
    return items, ax


def _concat_run(items: list[QuantizedTensor], ax: int, exact: bool) -> QuantizedTensor:
    first = items[0]
    xp = _xp(first)
    if not exact:
        return requantize(xp.concat([floats(q) for q in items], axis=ax), first)
    codes = xp.concat([q.codes() for q in items], axis=ax)
    blocked = first.scheme.block_size is not None
    scales = xp.concat([q.scales for q in items], axis=ax) if blocked else first.scales
    shape = tuple(int(n) for n in codes.shape)
    return QuantizedTensor(
        first.scheme, shape, first.dtype, pack(codes, first.scheme), scales, first.global_scale, first.table
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
    >>> s = aq.QuantScheme.parse("q8s:block2")
    >>> a, b = aq.quantize(np.array([1.0, 2.0], np.float32), s), aq.quantize(np.array([4.0], np.float32), s)
    >>> concat([a, b]).codes().tolist(), is_exact("concat", [a, b])
    ([64, 127, 127], True)
    """
    items, ax = _check_concat(qts, axis)
    return _allocating(lambda: _concat_run(items, ax, _concat_exact(items, ax)), "the result of concat")


def _check_stack(qts: Any, axis: Any) -> tuple[list[QuantizedTensor], int]:
    items = _check_list(qts)
    for i, q in enumerate(items):
        if q.shape != items[0].shape:
            msg = f"qts[{i}] has shape {q.shape} but stack needs every shape equal to {items[0].shape}"
            raise ShapeError(msg)
    first = items[0].shape
    ax = _axis(axis, len(first) + 1)
    _check_result_shape((*first[:ax], len(items), *first[ax:]), "the result of stack", "join fewer or smaller tensors")
    return items, ax


def _stack_exact(items: list[QuantizedTensor], ax: int) -> bool:
    return _plan_expand_dims(items[0], ax).exact and _shareable(items, _xp(items[0]))


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
    return _allocating(lambda: _stack_run(items, ax), "the result of stack")


def _stack_run(items: list[QuantizedTensor], ax: int) -> QuantizedTensor:
    if _stack_exact(items, ax):
        return _concat_run([_run(q, _plan_expand_dims(q, ax)) for q in items], ax, True)
    xp = _xp(items[0])
    return requantize(xp.stack([floats(q) for q in items], axis=ax), items[0])


# -- which path ---------------------------------------------------------------------------------
def _exact_concat(qts: Any, axis: Any = 0) -> bool:
    return _concat_exact(*_check_concat(qts, axis))


def _exact_stack(qts: Any, axis: Any = 0) -> bool:
    return _stack_exact(*_check_stack(qts, axis))


def _exact_pieces(sizes_of: Callable[..., tuple[int, list[int]]]) -> Callable[..., bool]:
    def exact(qt: QuantizedTensor, arg: Any, axis: Any = 0) -> bool:
        ax, parts = sizes_of(qt, arg, axis)
        return all(m.exact for m in _pieces(qt, ax, parts))

    return exact


_PLANS: dict[str, Callable[..., _Move]] = {
    "broadcast_to": _plan_broadcast_to,
    "expand_dims": _plan_expand_dims,
    "flip": _plan_flip,
    "getitem": _plan_getitem,
    "matrix_transpose": _plan_matrix_transpose,
    "narrow": _plan_narrow,
    "permute_dims": _plan_permute,
    "repeat": _plan_repeat,
    "repeat_dim": _plan_repeat_dim,
    "reshape": _plan_reshape,
    "squeeze": _plan_squeeze,
    "swapaxes": _plan_swapaxes,
    "take": _plan_take,
    "take_along_axis": _plan_take_along_axis,
}
_OTHERS: dict[str, Callable[..., bool]] = {
    "chunk": _exact_pieces(_chunk_sizes),
    "concat": _exact_concat,
    "split": _exact_pieces(_split_sizes),
    "stack": _exact_stack,
}


def is_exact(name: str, qt: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether ``name(qt, *args, **kwargs)`` takes the exact path (codes moved, nothing requantized).

    Parameters
    ----------
    name : str
        A function of this module (``"getitem"``, ``"reshape"``, ``"concat"``, ...).
    qt : QuantizedTensor or sequence of QuantizedTensor
        Its first argument (the list of tensors for ``concat`` and ``stack``).
    *args, **kwargs
        Its other arguments.

    Returns
    -------
    bool
        True on the exact path, False where the call would requantize.

    Raises
    ------
    SchemeError
        An unknown operation name.
    ShapeError, DTypeError
        Arguments the operation itself would reject.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.ones((4, 64), np.float32), "q4s:block32:f16")
    >>> is_exact("narrow", qt, 1, 32, 32), is_exact("narrow", qt, 1, 16, 32), is_exact("take", qt, [0], 1)
    (True, False, False)
    """
    if name not in _PLANS and name not in _OTHERS:
        msg = f"unknown layout operation {name!r}; use one of {', '.join(sorted([*_PLANS, *_OTHERS]))}"
        raise SchemeError(msg)
    plan = _OTHERS[name] if name in _OTHERS else lambda q, *a, **k: _PLANS[name](_check_qt(q), *a, **k).exact
    try:
        inspect.signature(plan if name in _OTHERS else _PLANS[name]).bind(qt, *args, **kwargs)
    except TypeError as e:
        msg = f"is_exact({name!r}, ...) got arguments {name} does not take: {e}"
        raise ShapeError(msg) from None
    return bool(plan(qt, *args, **kwargs))
