"""Dask graphs over chunks cut at whole blocks: the dask fast path of quantization and storage.

Quantization never looks across a block, nor packing across a word, so once a dask array is
rechunked to multiples of the block extent (and of the fields per word along the packed axis)
every chunk is one independent task: ``map_blocks`` over aligned chunks, with small arrays (a
global scale, a lookup table) handed whole to every task. The portable kernels run inside each
task on the chunk's own array library, so results equal the eager path bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import array_api_compat as compat
import numpy as np

__all__ = ["aligned", "handles", "map_chunks", "map_chunks_pair", "offsets", "rechunk", "resolve", "store"]

Chunks = tuple[tuple[int, ...], ...]


def aligned(chunks: Chunks, units: Sequence[int]) -> Chunks:
    """Chunk sizes where every chunk but the last along each axis is a multiple of that axis' unit.

    Axes already aligned keep their chunks; others get uniform chunks near their largest one.

    >>> aligned(((5, 5, 2), (4, 4)), (4, 2))
    ((4, 4, 4), (4, 4))
    >>> aligned(((4, 0, 4), (3,)), (4, 1))
    ((4, 4), (3,))
    """
    out = []
    for all_sizes, unit in zip(chunks, units, strict=True):
        sizes = tuple(n for n in all_sizes if n) or (0,)  # empty chunks (after filtering) hold nothing
        if all(n % unit == 0 for n in sizes[:-1]):
            out.append(tuple(sizes))
            continue
        total = sum(sizes)
        step = max(unit, round(max(sizes) / unit) * unit)
        out.append(tuple(min(step, total - start) for start in range(0, total, step)))
    return tuple(out)


def handles(x: Any) -> bool:
    """Whether ``x`` is a dask array, which quantization runs as a graph of chunk tasks."""
    return bool(compat.is_dask_array(x))


def offsets(sizes: Sequence[int]) -> list[int]:
    """Where each chunk along one axis starts."""
    out, at = [], 0
    for n in sizes:
        out.append(at)
        at += n
    return out


class _Call:
    """``fn`` with its whole arguments restored to their shapes (see :func:`map_chunks`)."""

    def __init__(self, fn: Callable[..., Any], n_blocked: int, shapes: list[tuple[int, ...] | None], pass_id: bool):
        self.fn, self.n_blocked, self.shapes, self.pass_id = fn, n_blocked, shapes, pass_id

    def __call__(self, *args: Any, block_id: tuple[int, ...] = ()) -> Any:
        blocked, whole = args[: self.n_blocked], list(args[self.n_blocked :])
        for i, shape in enumerate(self.shapes):
            if shape is not None:
                whole[i] = whole[i].reshape(shape)
        if self.pass_id:
            return self.fn(*blocked, *whole, block_id=block_id)
        return self.fn(*blocked, *whole)


def map_chunks(
    fn: Callable[..., Any],
    blocked: Sequence[Any],
    whole: Sequence[Any],
    chunks: Chunks,
    dtype: Any,
) -> Any:
    """``fn(*blocks, *whole[, block_id=...])`` per chunk, one task each.

    ``blocked`` arrays have the same number of chunks along every axis (their sizes may differ:
    data, scale grid, packed words); ``whole`` arrays (small: a global scale, a table) reach every
    task entire. ``block_id`` is passed when ``fn`` takes it.
    """
    import dask.array as da
    from dask.utils import has_keyword

    rank = len(chunks)
    shapes: list[tuple[int, ...] | None] = []
    args = []
    for a in whole:
        if isinstance(a, da.Array):
            # one chunk along every axis: map_blocks hands that chunk to every task
            shapes.append(tuple(int(n) for n in a.shape))
            a = a.reshape((1,) * (rank - 1) + (max(int(a.size), 1),)).rechunk(-1)
        else:
            shapes.append(None)
        args.append(a)
    meta = da.utils.meta_from_array(blocked[0]._meta, ndim=rank, dtype=dtype)
    call = _Call(fn, len(blocked), shapes, has_keyword(fn, "block_id"))
    token = "aq-" + getattr(fn, "__name__", "chunks")  # names the graph's layer, e.g. aq-values
    return da.map_blocks(call, *blocked, *args, chunks=chunks, dtype=dtype, meta=meta, token=token)


def map_chunks_pair(
    fn: Callable[..., tuple[Any, Any]],
    blocked: Sequence[Any],
    whole: Sequence[Any],
    first: tuple[Chunks, Any],
    second: tuple[Chunks, Any],
) -> tuple[Any, Any]:
    """Two arrays from one task per chunk: ``fn`` returns a pair; ``first``, ``second``: (chunks, dtype).

    The pair task reads its chunk once; two cheap tasks pick its parts (as dask's own
    multi-output ``apply_gufunc`` does). Computed together, both share the pair task; computed
    alone, dask fuses the pair into the picking task.
    """
    import dask.array as da

    pairs = map_chunks(fn, blocked, whole, first[0], object)
    meta = blocked[0]._meta
    out = []
    for i, (chunks, dtype) in enumerate((first, second)):
        like = da.utils.meta_from_array(meta, ndim=len(chunks), dtype=dtype)
        out.append(pairs.map_blocks(_Pick(i), chunks=chunks, dtype=dtype, meta=like, token=f"{pairs.name}-{i}"))
    return out[0], out[1]


class _Pick:
    def __init__(self, i: int) -> None:
        self.i = i

    def __call__(self, pair: tuple[Any, Any]) -> Any:
        return pair[self.i]


def rechunk(a: Any, chunks: Chunks) -> Any:
    """``a`` with exactly ``chunks`` (itself when it already has them)."""
    return a if tuple(a.chunks) == tuple(chunks) else a.rechunk(chunks)


def resolve(arrays: Sequence[Any], small: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """``arrays`` with the ``small`` dask arrays they depend on computed first and built in.

    A global scale depends on every chunk; left in the graph, the scheduler would keep every
    input chunk alive until the values that need the global are done, which is the whole tensor.
    Computing the small arrays first (one bounded pass) and substituting their results makes each
    chunk of ``arrays`` depend on its own input chunk only. Returns the new arrays and the small
    ones as computed (entries that are not dask arrays come back unchanged).
    """
    import dask
    import dask.array as da
    from dask.optimization import cull

    lazy = [s for s in small if isinstance(s, da.Array)]
    if not lazy:
        return list(arrays), list(small)
    found = dict(zip((s.name for s in lazy), dask.compute(*lazy), strict=True))
    out = []
    for arr in arrays:
        if not isinstance(arr, da.Array):
            out.append(arr)
            continue
        graph = dict(arr.__dask_graph__())
        for s in lazy:
            host = found[s.name]
            starts = [offsets(sizes) for sizes in s.chunks]
            for index in np.ndindex(*s.numblocks):
                key = (s.name, *index)
                if key in graph:
                    graph[key] = host[
                        tuple(slice(starts[a][i], starts[a][i] + s.chunks[a][i]) for a, i in enumerate(index))
                    ]
        graph, _ = cull(graph, list(dask.core.flatten(arr.__dask_keys__())))
        out.append(da.Array(graph, arr.name, arr.chunks, meta=arr._meta))
    return out, [found[s.name] if isinstance(s, da.Array) else s for s in small]


def store(sources: Sequence[Any], targets: Sequence[Any]) -> None:
    """Compute ``sources`` in one graph; each chunk goes to its target (``target[index] = chunk``) when done."""
    import dask.array as da

    da.store(list(sources), list(targets), lock=False)
