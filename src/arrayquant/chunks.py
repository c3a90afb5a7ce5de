"""Row chunks for eager backends: bounded temporaries, and caches that stay warm.

Eager, writeable host arrays are processed a slab of rows at a time into preallocated outputs, so
the working set beyond input and output stays a few MiB whatever the tensor size. Lazy or
immutable arrays (dask, jax) and GPU arrays get one chunk: their own engines fuse and schedule
the work, and slabs would only multiply kernel launches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["CHUNK_ELEMENTS", "Chunk", "Sink", "row_chunks"]

# 1 MiB of f32 per slab: temporaries stay in L2/L3; why not 512 KiB: per-slab calls cost ~15% there
CHUNK_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class Chunk:
    """Rows ``[r0, r1)`` of the data, with the matching rows of the scale grid and the values."""

    rows: slice
    grid: slice
    stored: slice


def row_chunks(
    shape: tuple[int, ...], block0: int, packed_axis: int | None, pack: tuple[int, int], chunked: bool
) -> list[Chunk]:
    """Split axis 0 into slabs aligned to whole blocks (and whole packing units when packing axis 0).

    ``pack`` is ``(fields, words)``: the packed axis's smallest run of fields filling whole words.
    """
    n0 = shape[0]
    unit = block0
    per, words = pack
    if packed_axis == 0:
        unit = math.lcm(unit, per)
    row = math.prod(shape[1:])
    step = max(unit, (CHUNK_ELEMENTS // max(row, 1)) // unit * unit) if chunked else n0
    out = []
    for r0 in range(0, n0, step):
        r1 = min(r0 + step, n0)
        grid = slice(r0 // block0, -(-r1 // block0))
        stored = slice(r0 // per * words, -(-r1 * words // per)) if packed_axis == 0 else slice(r0, r1)
        out.append(Chunk(slice(r0, r1), grid, stored))
    return out


class Sink:
    """Where row slabs of one result go: straight into a preallocated array as they are made.

    With a single chunk (lazy or immutable backends) the slab itself is the result, so nothing is
    allocated or copied; otherwise each slab is written and dropped at once, keeping the working
    set to one slab.
    """

    def __init__(self, n_parts: int, shape: tuple[int, ...], dtype: Any, xp: Any, device: Any) -> None:
        self._out = xp.empty(shape, dtype=dtype, device=device) if n_parts > 1 else None
        self._only: Any = None

    def put(self, rows: slice, part: Any) -> None:
        """Store the slab for ``rows`` of the result."""
        if self._out is None:
            self._only = part
        else:
            self._out[rows, ...] = part

    @property
    def result(self) -> Any:
        """The assembled array."""
        return self._only if self._out is None else self._out
