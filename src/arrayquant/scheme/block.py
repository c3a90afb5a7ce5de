"""Rectangular N-d block sizes."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..errors import SchemeError, ShapeError

__all__ = ["MAX_BLOCK_DIMS", "BlockSize", "parse_extents"]

MAX_BLOCK_DIMS = 5
_MAX_DIGITS = 18  # any extent a real tensor can have; longer digit strings are typos or attacks


def parse_extents(text: str, what: str) -> tuple[int, ...]:
    """``"32"`` or ``"4x32"`` as a tuple of ints, or a :class:`SchemeError` naming ``what``.

    Only ASCII digits count (``int()`` would also take ``"²"``'s cousins, ``"1_0"`` and spaces).
    """
    parts = text.split("x")
    if not all(p.isascii() and p.isdigit() and len(p) <= _MAX_DIGITS for p in parts):
        msg = f"bad block extents {text[:60]!r} in {what[:120]!r}; write e.g. '32' or '4x32' (ASCII digits only)"
        raise SchemeError(msg)
    return tuple(int(p) for p in parts)


class BlockSize:
    """The extents of one block, canonicalised by dropping leading 1s.

    Blocks are rank-relative: ``[32]`` on a rank-2 tensor is ``[1, 32]``.

    >>> BlockSize((1, 32)) == BlockSize(32)
    True
    >>> BlockSize(32).to_dims(2)
    (1, 32)
    >>> BlockSize((2, 32)).num_blocks((5, 64))
    (3, 2)
    >>> BlockSize("4x32") == BlockSize((4, 32))
    True
    """

    __slots__ = ("_dims",)
    _dims: tuple[int, ...]

    def __init__(self, dims: int | str | Iterable[int] | BlockSize) -> None:
        if isinstance(dims, BlockSize):
            raw: tuple[Any, ...] = dims.dims
        elif isinstance(dims, int) and not isinstance(dims, bool):
            raw = (dims,)
        elif isinstance(dims, str):
            raw = parse_extents(dims.strip().lower(), dims)  # the text form, "32" or "4x32"
        else:
            try:
                raw = tuple(dims)  # type: ignore[arg-type]
            except TypeError:
                msg = f"block size must be an int or a sequence of ints, got {dims!r}"
                raise SchemeError(msg) from None
        for d in raw:
            if isinstance(d, bool) or not isinstance(d, int) or d < 1:
                msg = f"block extents must be integers >= 1, got {list(raw)!r}; use 1 for an unblocked axis"
                raise SchemeError(msg)
        start = 0
        while start < len(raw) - 1 and raw[start] == 1:
            start += 1
        canon = tuple(int(d) for d in raw[start:])
        if not canon:
            msg = "block size needs at least one extent, e.g. BlockSize(32)"
            raise SchemeError(msg)
        if len(canon) > MAX_BLOCK_DIMS:
            msg = (
                f"block {list(raw)!r} has {len(canon)} extents after dropping leading 1s; "
                f"at most {MAX_BLOCK_DIMS} are supported"
            )
            raise SchemeError(msg)
        object.__setattr__(self, "_dims", canon)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("BlockSize is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (BlockSize, (self._dims,))  # pickles rebuild through __init__ (dask workers receive schemes)

    @property
    def dims(self) -> tuple[int, ...]:
        """The canonical extents (no leading 1s)."""
        return self._dims

    @property
    def size(self) -> int:
        """Elements in one full block."""
        return math.prod(self._dims)

    def to_dims(self, rank: int) -> tuple[int, ...]:
        """The extents left-padded with 1s to ``rank``."""
        if len(self._dims) > rank:
            msg = (
                f"block {list(self._dims)} has {len(self._dims)} extents but the data has rank {rank}; "
                "use a block with at most as many extents as the data has axes"
            )
            raise ShapeError(msg)
        return (1,) * (rank - len(self._dims)) + self._dims

    def num_blocks(self, shape: Iterable[int]) -> tuple[int, ...]:
        """The scale-grid shape ``ceil(shape[i] / block[i])`` for data of ``shape``."""
        shape = tuple(shape)
        return tuple(-(-n // b) for n, b in zip(shape, self.to_dims(len(shape)), strict=True))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockSize):
            return self._dims == other._dims
        return NotImplemented

    def __hash__(self) -> int:
        return hash(("BlockSize", self._dims))

    def __repr__(self) -> str:
        return f"BlockSize({self._dims!r})"

    def __str__(self) -> str:
        return "x".join(map(str, self._dims))
