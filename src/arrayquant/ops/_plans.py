"""How a layout operation runs once planned: the :class:`Move` record, and the rules every plan shares.

Each layout operation (``manipulation``, ``indexing``) is first planned from the shapes, the scheme
and the arguments alone, as a :class:`Move`; :func:`run` carries the plan out (the exact path: codes
and scale grid moved and packed again; else Burn's fallback through the floats), and
:func:`~arrayquant.ops.is_exact` reads the same plan. Also here: how axis and integer arguments are
read, the block extents right-aligned to the rank, where a packed store's axis goes, and the
checks on a result's shape.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import array_api_compat as compat

from ..errors import DTypeError, ShapeError
from ..invariants import plan_for
from ..scheme import BlockSize, QuantScheme, QuantStore
from ..storage import pack
from ..tensor import QuantizedTensor
from ._common import check_result_size, floats, requantize

__all__ = [
    "Move",
    "block_dims",
    "check_axis",
    "check_int",
    "check_qt",
    "check_result_shape",
    "lines_up",
    "moved_store",
    "namespace_of",
    "own_copy",
    "packed_axis",
    "run",
    "with_block",
    "with_store",
]


@dataclass(frozen=True)
class Move:
    """One layout operation, planned: whether it is exact, and how it moves data and scales."""

    exact: bool
    data: Callable[[Any], Any]  # the op on an array of the data's shape (codes, or floats)
    grid: Callable[[Any], Any] | None  # the op on the scale grid; None keeps the scales (per tensor)
    scheme: QuantScheme  # the result's scheme on the exact path
    fallback: QuantScheme  # the scheme requantized with otherwise


def check_qt(qt: Any, name: str = "qt") -> QuantizedTensor:
    """``qt`` when it is a quantized tensor, else a DTypeError naming the argument."""
    if not isinstance(qt, QuantizedTensor):
        msg = f"{name} must be a QuantizedTensor (from aq.quantize), got {type(qt).__name__}"
        raise DTypeError(msg)
    return qt


def namespace_of(qt: QuantizedTensor) -> Any:
    """The array namespace of ``qt``'s stored values."""
    return compat.array_namespace(qt.values)


def check_axis(axis: Any, rank: int, what: str = "axis") -> int:
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


def check_int(v: Any, what: str) -> int:
    """``v`` as a Python int (NumPy ints too, never a bool), else a ShapeError naming ``what``."""
    try:
        if isinstance(v, bool):
            raise TypeError
        return operator.index(v)
    except TypeError:
        msg = f"{what} must be an integer, got {v!r}"
        raise ShapeError(msg) from None


def block_dims(qt: QuantizedTensor) -> tuple[int, ...] | None:
    """The scheme's block extents right-aligned to the rank (unclamped), or None per tensor."""
    block = qt.scheme.block_size
    return None if block is None else block.to_dims(len(qt.shape))


def with_block(scheme: QuantScheme, dims: tuple[int, ...] | None) -> QuantScheme:
    """``scheme`` with its block extents ``dims`` (a per-tensor scheme, or None, kept as it is)."""
    if dims is None or scheme.block_size is None or BlockSize(dims) == scheme.block_size:
        return scheme
    return scheme.per_block(BlockSize(dims), scheme.block[1])  # type: ignore[index]


def with_store(scheme: QuantScheme, new_pos: int | None, new_rank: int) -> QuantScheme:
    """The store packing the axis now at ``new_pos`` (the last axis when None or out of range)."""
    store = scheme.store
    if not store.is_packed:
        return scheme
    dim = 0 if new_pos is None else new_rank - 1 - new_pos
    return scheme if dim == store.dim else scheme.with_store(QuantStore(store.kind, dim))


def packed_axis(qt: QuantizedTensor) -> int | None:
    """The axis ``qt``'s store packs, or None for an unpacked store."""
    return plan_for(qt.scheme).packed_axis(len(qt.shape))


def moved_store(qt: QuantizedTensor, sources: Sequence[int | None]) -> QuantScheme:
    """The scheme with its store following the packed axis to its new position (``sources[i]`` = old axis)."""
    old = packed_axis(qt)
    pos = next((i for i, s in enumerate(sources) if s is not None and s == old), None)
    return with_store(qt.scheme, pos, len(sources))


def _carried_block(qt: QuantizedTensor, sources: Sequence[int | None]) -> tuple[int, ...] | None:
    """Per output axis, the block extent of its source axis (1 for a new axis)."""
    bd = block_dims(qt)
    if bd is None:
        return None
    return tuple(1 if s is None else bd[s] for s in sources)


def lines_up(qt: QuantizedTensor, sources: Sequence[int | None]) -> bool:
    """Whether the scheme's block, right-aligned to the new rank, still covers the same axes."""
    dims = _carried_block(qt, sources)
    if dims is None:
        return True
    assert qt.scheme.block_size is not None
    return bool(dims) and BlockSize(dims) == qt.scheme.block_size


def own_copy(a: Any, xp: Any) -> Any:
    """A copy that owns its memory (a broadcast view would be read-only and strided)."""
    return xp.asarray(a, copy=True, device=compat.device(a))


def run(qt: QuantizedTensor, m: Move) -> QuantizedTensor:
    """Carry out the plan ``m`` on ``qt``: codes and grid moved on the exact path, else through the floats."""
    if not m.exact:
        like = qt if m.fallback == qt.scheme else replace(qt, scheme=m.fallback)
        return requantize(m.data(floats(qt)), like)
    codes = m.data(qt.codes())
    move = (lambda g: g) if m.grid is None else m.grid
    scales = move(qt.scales)
    shape = tuple(int(n) for n in codes.shape)
    # the zero points or offsets of an affine scheme sit on the scale grid and move with it
    zp = None if qt.zero_point is None else move(qt.zero_point)
    offset = None if qt.offset is None else move(qt.offset)
    return QuantizedTensor(
        m.scheme, shape, qt.dtype, pack(codes, m.scheme), scales, qt.global_scale, qt.table, zp, offset
    )


def check_result_shape(shape: Sequence[int], what: str, fix: str = "ask for a smaller result") -> None:
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
