"""The one safetensors writer: entries laid out as safetensors orders them, streamed, published atomically.

A format built on safetensors (arrayquant's own layout, a compressed-tensors shard) turns each of
its items into *entries*, ``{key: (data, header dtype, shape)}`` (:data:`Part`), where the data is
bytes, a host array, a :class:`Lazy` array written chunk by chunk or a
:class:`~arrayquant.io.safetensors.reader.Passthrough` copied from its file as stored. This module
lays the entries out (:func:`layout`), writes them (:func:`write_parts`) and publishes the file
through :mod:`arrayquant.io._atomic` (:func:`publish`). :func:`save_stream` does all of it for
items that come one at a time, holding one item's entries at a time; by itself it writes a plain
safetensors file of arrays, and a format passes ``entries`` to write its own layout.
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...backends import dask_graph, shim
from ...errors import DTypeError, ShapeError
from ...tensor import QuantizedTensor, dtype_name
from .. import _atomic
from ..regions import ChunkTarget, write_all
from .reader import PLAIN, Passthrough

__all__ = [
    "Lazy",
    "Part",
    "add_entries",
    "array_entries",
    "header_bytes",
    "header_kind",
    "layout",
    "part_nbytes",
    "plain_entries",
    "publish",
    "save_stream",
    "write_parts",
]

Part = tuple[Any, str, list[int]]  # (bytes, a host array or a lazy source; header dtype; shape)

_BY_NAME = {spec_name: header for header, (_, spec_name) in PLAIN.items()}


@functools.lru_cache(maxsize=64)
def _kind_of(dtype: Any) -> str | None:
    return _BY_NAME.get(dtype_name(dtype))  # str(dtype) is slow beside the rest of a tiny tensor's write


def header_kind(name: str, dtype: Any) -> str:
    """The safetensors header dtype for arrays of ``dtype``.

    Raises
    ------
    DTypeError
        A dtype safetensors has no name for.
    """
    try:
        kind = _kind_of(dtype)
    except TypeError:  # a dtype that cannot be hashed
        kind = _BY_NAME.get(dtype_name(dtype))
    if kind is None:
        msg = f"tensor {name!r} has dtype {dtype}, which a safetensors checkpoint cannot hold"
        raise DTypeError(msg)
    return kind


def _raw(host: np.ndarray, header: str) -> np.ndarray:
    """A host array in the little-endian raw dtype of ``header`` (no copy where it already is one)."""
    raw_dtype = PLAIN[header][0]
    data = host.view(raw_dtype) if host.dtype.itemsize == np.dtype(raw_dtype).itemsize else host
    return np.ascontiguousarray(data).astype(raw_dtype, copy=False).reshape(host.shape)


def _host(arr: Any) -> np.ndarray:
    raw = np.asarray(shim.to_host(arr))
    return np.ascontiguousarray(raw).reshape(raw.shape)  # keeps 0-d arrays 0-d


class _PlainCodec:
    """A chunk of a plain lazy array as raw little-endian bytes."""

    def __init__(self, header: str) -> None:
        self.header = header

    def __call__(self, block: Any) -> bytes:
        return _raw(_host(block), self.header).tobytes()


class Lazy:
    """A lazy array to be written chunk by chunk: the array, bytes per element, and its encoder.

    ``encode`` turns a computed chunk into its bytes; it is a class instance, not a closure, so
    that dask workers can receive it.
    """

    def __init__(self, array: Any, itemsize: int, encode: Any) -> None:
        self.array, self.itemsize, self.encode = array, itemsize, encode

    def __len__(self) -> int:
        return math.prod(int(n) for n in self.array.shape) * self.itemsize


def array_entries(name: str, item: Any) -> dict[str, Part]:
    """The one entry of an array of any backend, a lazy (Dask) array or a :class:`Passthrough`, under ``name``."""
    if isinstance(item, Passthrough):  # copied from its file as stored
        return {name: (item, item.entry.dtype, list(item.entry.shape))}
    if dask_graph.handles(item):
        kind = header_kind(name, item.dtype)
        return {name: (Lazy(item, np.dtype(PLAIN[kind][0]).itemsize, _PlainCodec(kind)), kind, list(item.shape))}
    host = _host(item)
    kind = header_kind(name, host.dtype)
    data = _raw(host, kind)
    return {name: (data, kind, list(data.shape))}


def plain_entries(name: str, item: Any) -> dict[str, Part]:
    """:func:`array_entries` for a plain file: any name but ``""`` and ``__metadata__``, arrays only."""
    if isinstance(item, QuantizedTensor):
        msg = f"tensor {name!r} is quantized; a plain safetensors file holds arrays only"
        raise ShapeError(msg)
    if not isinstance(name, str) or not name or name == "__metadata__":
        msg = f"tensor name {name!r} is not allowed; a safetensors entry has a non-empty name other than '__metadata__'"
        raise ShapeError(msg)
    return array_entries(name, item)


def write_parts(path: str, base: int, parts: dict[str, Part], offsets: dict[str, int], fd: int | None = None) -> None:
    """Write each part at ``base + offsets[key]`` of ``path``; lazy parts chunk by chunk, in one graph.

    ``fd``, when given, is ``path`` already open for writing (and left open).
    """
    sources, targets = [], []
    own = fd is None
    fd = os.open(path, os.O_WRONLY) if fd is None else fd
    try:
        for key, (data, _, shape) in parts.items():
            at = base + offsets[key]
            if isinstance(data, Lazy):
                sources.append(data.array)
                targets.append(ChunkTarget(path, at, tuple(shape), data.itemsize, data.encode))
            elif isinstance(data, Passthrough):
                data.copy_to(fd, at)
            else:
                write_all(fd, data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else data, at)
    finally:
        if own:
            os.close(fd)
    if sources:
        dask_graph.store(sources, targets)


def part_nbytes(data: Any) -> int:
    """The bytes a part's data takes in the file."""
    return int(data.nbytes) if isinstance(data, (np.ndarray, Passthrough)) else len(data)


def layout(kinds: dict[str, tuple[str, list[int], int]]) -> tuple[dict[str, Any], dict[str, int]]:
    """Header entries and data offsets for ``{key: (dtype, shape, nbytes)}``.

    Entries go widest dtype first, then by name, as safetensors orders them: with the data
    starting 8-aligned, every entry then starts at a multiple of its element size.
    """
    order = sorted(kinds, key=lambda k: (-np.dtype(PLAIN[kinds[k][0]][0]).itemsize, k))
    header, offsets, at = {}, {}, 0
    for key in order:
        kind, shape, size = kinds[key]
        header[key] = {"dtype": kind, "shape": [int(n) for n in shape], "data_offsets": [at, at + size]}
        offsets[key] = at
        at += size
    return header, offsets


def add_entries(into: dict[str, Any], parts: dict[str, Any]) -> None:
    """Add one item's entries, refusing a name that is already there (a lookup per entry, not a scan)."""
    clash = [k for k in parts if k in into]
    if clash:
        msg = f"tensor names {sorted(clash)} appear twice; each name (and its .scales siblings) must be unique"
        raise ShapeError(msg)
    into.update(parts)


def header_bytes(meta: Mapping[str, str], header: dict[str, Any]) -> bytes:
    """The length prefix and JSON header of a file with metadata ``meta`` and these entries."""
    text = json.dumps({"__metadata__": meta, **header}, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # pad as safetensors does, so the data starts 8-aligned
    return len(text).to_bytes(8, "little") + text


def publish(target: Path, head: bytes, fill: Callable[[Any, str], None]) -> None:
    """Write ``head``, then ``fill(file, its path)``, to a temporary file renamed over the target at the end.

    The one publish rule of :mod:`arrayquant.io._atomic`: the temporary beside ``target``, fsynced,
    renamed, the folder fsynced; on any error it is removed and ``target`` is left as it was.
    """
    with _atomic.publishing(target) as (f, tmp):
        f.write(head)
        f.flush()
        fill(f, str(tmp))


def _copy_range(src: Any, dst: Any, start: int, length: int) -> None:
    src.seek(start)
    while length:
        buf = src.read(min(length, 1 << 20))
        dst.write(buf)
        length -= len(buf)


def save_stream(
    path: str | os.PathLike[str],
    items: Iterable[tuple[str, Any]],
    *,
    metadata: Mapping[str, str] | None = None,
    entries: Callable[[str, Any], dict[str, Part]] = plain_entries,
) -> None:
    """Write ``(name, item)`` pairs to a safetensors file as they come, holding one item at a time.

    By default the file is a plain safetensors file (a model folder's shard): arrays of any
    backend, lazy arrays (written chunk by chunk) and :class:`Passthrough` entries (copied as
    stored, a chunk at a time), under any non-empty names. ``entries`` turns one item into its
    entries instead (a format's own layout; see :func:`array_entries`); it may add to
    ``metadata``, which is read once the last item is written.

    ``items`` may be a generator: each item is written and dropped before the next is asked for,
    so memory stays near the largest one. The data goes to a spool file next to the target while
    the header (which precedes the data in the format and needs every size) is built; then header
    and data are copied to a temporary file that is renamed over the target. A failure anywhere,
    in ``items`` included, leaves the target as it was.

    Raises
    ------
    ShapeError
        A name that appears twice, or one ``entries`` refuses (by default: an empty name,
        ``__metadata__``, a quantized tensor).
    DTypeError
        An array of a dtype safetensors cannot hold.

    >>> import numpy as np, tempfile, os
    >>> from arrayquant.io.safetensors.reader import SafetensorsFile
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> save_stream(path, ((f"w{i}", np.full((2, 3), i, np.float32)) for i in range(3)), metadata={"format": "pt"})
    >>> with SafetensorsFile(path) as st:
    ...     sorted(st.entries), st.metadata, st.array("w2")[0, 0]
    (['w0', 'w1', 'w2'], {'format': 'pt'}, np.float32(2.0))
    """
    meta = {} if metadata is None else metadata
    for key, value in meta.items():
        if not isinstance(key, str) or not isinstance(value, str):
            msg = f"metadata entry {key!r}: {value!r} is not allowed; safetensors metadata maps strings to strings"
            raise ShapeError(msg)
    target = Path(path)
    folder = target.parent or Path(".")
    # named, so lazy tensors can be written into it chunk by chunk (by dask workers too)
    spool = tempfile.NamedTemporaryFile(dir=folder, prefix=f".{target.name}.", suffix=".spool")  # noqa: SIM115
    try:
        # constant work per entry (no scan of what came before), so the whole is linear in the entries
        kinds: dict[str, tuple[str, list[int], int]] = {}
        spooled: dict[str, int] = {}  # where each entry's bytes are in the spool, in arrival order
        names: set[str] = set()
        at = 0
        for name, item in items:
            if name in names:
                msg = f"tensor name {name!r} appears twice; each name must be unique"
                raise ShapeError(msg)
            parts = entries(name, item)
            names.add(name)
            add_entries(kinds, {k: (kind, shape, part_nbytes(data)) for k, (data, kind, shape) in parts.items()})
            offsets, part = {}, None
            for key, part in parts.items():
                offsets[key] = at
                at += part_nbytes(part[0])
            spooled.update(offsets)
            write_parts(spool.name, 0, parts, offsets, spool.fileno())
            del parts, part, item  # nothing of this tensor is held while the next one is made
        header, _ = layout(kinds)

        def copy(f: Any, _: str) -> None:
            for key, entry in header.items():  # the file's order: widest dtype first
                _copy_range(spool, f, spooled[key], entry["data_offsets"][1] - entry["data_offsets"][0])

        publish(target, header_bytes(meta, header), copy)
    finally:
        spool.close()
