"""The one safetensors reader: the header checked once on open, tensors read one at a time.

:class:`SafetensorsFile` validates the whole header before any tensor is read: the header
length against the file size (and safetensors' own 100 MiB limit), the JSON (depth included),
every entry's dtype (the exact safetensors names, ``F32`` not ``f32``), shape (a list of
non-negative ints, at most NumPy's 64 axes, and an element count NumPy can allocate even when
it is zero) and data offsets (ints that span exactly the bytes the shape needs, inside the data
section, the entries tiling it without overlap or gap, as the safetensors library demands).
Tensors are then read at their offsets into fresh buffers, in file order; there is no memory
map, whose pages would all count against the process once read.

Every safetensors format reads through :class:`SafetensorsFile`: arrayquant's own layout
(:class:`arrayquant.io.arrayquant.layout.Checkpoint` adds its checks), compressed-tensors files
and folders, ``read_nvfp4`` and every ``arrayquant`` command.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import reprlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ...errors import CorruptDataError, DTypeError, ShapeError
from .. import _dtypes
from ..paths import open_regular
from ..regions import write_all

__all__ = [
    "HEADER_LIMIT",
    "NUMPY_MAX_RANK",
    "PLAIN",
    "Entry",
    "Passthrough",
    "SafetensorsFile",
    "ml_dtype",
    "read_header",
]

HEADER_LIMIT = 100 * 2**20  # safetensors' own limit on the JSON header
NUMPY_MAX_RANK = 64  # NumPy's limit on the number of axes
_NUMPY_MAX_BYTES = 2**63 - 1  # NumPy refuses a shape whose nonzero extents times the item size pass this
# safetensors header dtype <-> (numpy dtype of the raw data, TensorSpec dtype name)
PLAIN = {k: (d.numpy, d.name) for k, d in _dtypes.SAFETENSORS.items()}
_ITEMSIZE = {k: d.itemsize for k, d in _dtypes.SAFETENSORS.items()}
_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlist, _short.maxdict = 60, 60, 8, 4


def ml_dtype(name: str) -> Any:
    """The ml_dtypes type ``name`` (``"bfloat16"``, ``"float8_e4m3fn"``), which NumPy itself lacks.

    Raises
    ------
    DTypeError
        ml_dtypes is not installed (the message says how to install it).
    """
    try:
        import ml_dtypes
    except ImportError:
        msg = f"reading {name} arrays into NumPy needs ml_dtypes; pip install ml_dtypes"
        raise DTypeError(msg) from None
    return getattr(ml_dtypes, name)


class _Info(NamedTuple):
    """A well-formed header entry, kept compact while the header is parsed (a dict costs ~4x more)."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    stop: int


_ENTRY_KEYS = frozenset(("dtype", "shape", "data_offsets"))
_DTYPE_NAMES = {k: k for k in PLAIN}  # one shared string per dtype, not one per entry


def _compact(pairs: list[tuple[str, Any]]) -> Any:
    """``json`` object hook: an entry of the expected types as an :class:`_Info`, anything else as a dict.

    Nothing is refused here (the names are not known yet); :func:`_entry` checks both forms.
    """
    obj = dict(pairs)
    if len(obj) != 3 or obj.keys() != _ENTRY_KEYS:
        return obj
    dtype, shape, offsets = obj["dtype"], obj["shape"], obj["data_offsets"]
    kind = _DTYPE_NAMES.get(dtype) if isinstance(dtype, str) else None
    if kind is None or type(shape) is not list or type(offsets) is not list or len(offsets) != 2:
        return obj
    if not all(type(n) is int for n in shape) or not all(type(n) is int for n in offsets):
        return obj
    return _Info(kind, tuple(shape), offsets[0], offsets[1])


def read_header(f: Any, path: Path, size: int, *, _hook: Any = None) -> tuple[int, dict[str, Any]]:
    """The length and JSON header of the safetensors file open as ``f`` (positioned at 0).

    The declared length is checked against the file's ``size`` (and safetensors' 100 MiB limit)
    before anything of that size is read, so a lying header cannot make a small file allocate
    gigabytes.

    Raises
    ------
    CorruptDataError
        The file is too short, declares more header than it has, or the header is not a JSON
        object (too deep, not UTF-8, not JSON).
    """
    head = f.read(8)
    if len(head) < 8:
        msg = f"{path} has {size} bytes, too few for a safetensors header; is it a .safetensors file?"
        raise CorruptDataError(msg)
    header_len = int.from_bytes(head, "little")
    if header_len > size - 8:
        msg = (
            f"{path} declares a {header_len}-byte header but the file has only {size} bytes; "
            "it is truncated or not a .safetensors file"
        )
        raise CorruptDataError(msg)
    if header_len > HEADER_LIMIT:
        msg = f"{path} declares a {header_len}-byte header, beyond safetensors' limit of {HEADER_LIMIT} bytes"
        raise CorruptDataError(msg)
    try:
        header = json.loads(f.read(header_len).decode("utf-8"), object_pairs_hook=_hook)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        msg = f"{path} has an unreadable safetensors header: {_short.repr(str(exc))}"
        raise CorruptDataError(msg) from None
    if not isinstance(header, dict):
        msg = f"{path}: the safetensors header is not a JSON object"
        raise CorruptDataError(msg)
    return header_len, header


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor of a safetensors file: header dtype (``"F32"``), shape and absolute byte range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def nbytes(self) -> int:
        return self.stop - self.start

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def _shape_text(shape: Any) -> str:
    return _short.repr(list(shape) if isinstance(shape, tuple) else shape)  # as the header wrote it


def _is_int(n: object) -> bool:
    return type(n) is int  # JSON gives int, float or bool; a bool is no extent


def _entry(path: Path, name: str, info: Any, base: int, data_len: int) -> Entry:
    """One header entry, checked by itself (the tiling of the data section is checked after)."""
    if isinstance(info, _Info):
        dtype, shape, offsets = info.dtype, info.shape, [info.start, info.stop]
    elif isinstance(info, dict) and info.keys() >= _ENTRY_KEYS:
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    else:
        msg = f"{path}: entry {name!r} is not a safetensors entry (dtype, shape, data_offsets): {_short.repr(info)}"
        raise CorruptDataError(msg)
    if not isinstance(dtype, str) or dtype not in PLAIN:
        msg = (
            f"{path}: entry {name!r} has dtype {_short.repr(dtype)}, expected one of {', '.join(PLAIN)} "
            "(the safetensors names, upper case)"
        )
        raise CorruptDataError(msg)
    if not isinstance(shape, (list, tuple)) or not all(_is_int(n) and n >= 0 for n in shape):
        msg = f"{path}: entry {name!r} has shape {_shape_text(shape)}; a shape is a list of non-negative integers"
        raise CorruptDataError(msg)
    if len(shape) > NUMPY_MAX_RANK:
        msg = (
            f"{path}: entry {name!r} has {len(shape)} axes; NumPy arrays have at most {NUMPY_MAX_RANK}, "
            "so it cannot be read"
        )
        raise ShapeError(msg)
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(n) for n in offsets):
        msg = f"{path}: entry {name!r} has data_offsets {_short.repr(offsets)}; expected two integers [start, end]"
        raise CorruptDataError(msg)
    start, stop = offsets
    need = math.prod(shape) * _ITEMSIZE[dtype]
    if not 0 <= start <= stop or stop - start != need:
        msg = (
            f"{path}: entry {name!r} declares shape {_shape_text(shape)} of {dtype} ({need} bytes) "
            f"but its data_offsets [{start}, {stop}] span {stop - start} bytes"
        )
        raise CorruptDataError(msg)
    if stop > data_len:
        msg = (
            f"{path}: entry {name!r} of shape {_shape_text(shape)} needs {need} bytes at data_offsets "
            f"[{start}, {stop}], beyond the {data_len}-byte data section; the file is truncated or corrupt"
        )
        raise CorruptDataError(msg)
    if math.prod(n for n in shape if n) * _ITEMSIZE[dtype] > _NUMPY_MAX_BYTES:  # only a zero-size shape gets here
        msg = (
            f"{path}: entry {name!r} has shape {_shape_text(shape)}; NumPy refuses shapes whose extents other "
            f"than 0 times the item size exceed {_NUMPY_MAX_BYTES} bytes, so it cannot be read"
        )
        raise ShapeError(msg)
    return Entry(name, dtype, tuple(shape), base + start, base + stop)


def _entries(path: Path, header: dict[str, Any], base: int, data_len: int) -> dict[str, Entry]:
    """Every entry, in file order, after checking that they tile the data section as safetensors requires."""
    found = [_entry(path, name, info, base, data_len) for name, info in header.items()]
    found.sort(key=lambda e: (e.start, e.stop))
    at, before = base, None
    for e in found:
        if e.start != at:
            if before is not None and e.start < at:
                what = f"overlaps entry {before.name!r} [{before.start - base}, {before.stop - base}]"
            else:
                what = f"leaves the bytes [{at - base}, {e.start - base}] of the data section to no entry"
            msg = f"{path}: entry {e.name!r} at data_offsets [{e.start - base}, {e.stop - base}] {what}"
            raise CorruptDataError(msg)
        at, before = e.stop, e
    if at - base != data_len:
        last = f"entry {before.name!r} ends at {at - base}" if before is not None else "there are no entries"
        cause = "truncated" if at - base > data_len else "padded or corrupt"
        msg = f"{path}: the data section has {data_len} bytes but {last}; the file is {cause}"
        raise CorruptDataError(msg)
    return {e.name: e for e in found}


def _identity(info: os.stat_result) -> tuple[int, ...]:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


class _OpenFiles:
    """The safetensors files holding a descriptor now, the least recently used released first.

    A model folder may have thousands of shards, more than a process may hold open; readers keep
    every shard's header, and at most :attr:`limit` descriptors, opening a file again when it is
    read after being released.
    """

    limit = 64

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._order: OrderedDict[int, SafetensorsFile] = OrderedDict()

    def opened(self, st: SafetensorsFile) -> None:
        with self.lock:
            self.used(st)

    def used(self, st: SafetensorsFile) -> None:
        self._order[id(st)] = st
        self._order.move_to_end(id(st))
        for key in [k for k, f in self._order.items() if f._users == 0][: max(0, len(self._order) - self.limit)]:
            self._order.pop(key)._release()  # least recent first; a file being read is never released

    def forget(self, st: SafetensorsFile) -> None:
        with self.lock:
            self._order.pop(id(st), None)


_OPEN = _OpenFiles()


class SafetensorsFile:
    """A safetensors file opened for reading one tensor at a time; the whole header validated on open.

    ``entries`` maps names to :class:`Entry` in file order; ``metadata`` is the ``__metadata__``
    (strings to strings). Use as a context manager, or call :meth:`close`.

    Raises
    ------
    CorruptDataError
        Anything in the header that the safetensors format does not allow (see the module notes).
    ShapeError
        An entry NumPy cannot hold: more than 64 axes, or a zero-size shape too large to allocate.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: BinaryIO | None = open_regular(self.path)
        self._closed, self._users = False, 0
        try:
            info = os.fstat(self._file.fileno())
            self._identity = _identity(info)
            header_len, header = read_header(self._file, self.path, info.st_size, _hook=_compact)
            meta = header.pop("__metadata__", None) or {}
            if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
                msg = f"{self.path}: the metadata must map strings to strings"
                raise CorruptDataError(msg)
            self.metadata: dict[str, str] = meta
            self.entries = _entries(self.path, header, 8 + header_len, info.st_size - 8 - header_len)
            del header
        except BaseException:
            self._file.close()
            raise
        _OPEN.opened(self)

    def close(self) -> None:
        self._closed = True
        _OPEN.forget(self)
        self._release()

    def _release(self) -> None:
        """Close the file descriptor; the next read opens the file again (see :class:`_OpenFiles`)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    @contextlib.contextmanager
    def descriptor(self) -> Iterator[int]:
        """The file's open descriptor while the block runs (opened again if it was released)."""
        if self._closed:
            msg = f"{self.path} was closed"
            raise ValueError(msg)
        with _OPEN.lock:
            if self._file is None:
                f = open_regular(self.path)
                if _identity(os.fstat(f.fileno())) != self._identity:
                    f.close()
                    msg = f"{self.path} changed while it was read; read it again"
                    raise CorruptDataError(msg)
                self._file = f
            self._users += 1
            _OPEN.used(self)
            fd = self._file.fileno()
        try:
            yield fd
        finally:
            with _OPEN.lock:
                self._users -= 1

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _read(self, name: str, buf: np.ndarray, offset: int) -> None:
        """Fill ``buf`` with the file's bytes from ``offset`` on."""
        view = buf.data
        with self.descriptor() as fd:
            while len(view):
                got = os.preadv(fd, [view], offset)
                if not got:
                    msg = f"{self.path}: entry {name!r} is cut short; the file was truncated while it was read"
                    raise CorruptDataError(msg)
                view, offset = view[got:], offset + got

    def raw(self, name: str) -> np.ndarray:
        """The entry's data in its raw little-endian dtype (``uint16`` for BF16), shaped, in a fresh buffer."""
        e = self.entries[name]
        raw_dtype = PLAIN[e.dtype][0]
        if not e.nbytes:
            return np.empty(e.shape, raw_dtype)
        buf = np.empty(e.nbytes, np.uint8)
        self._read(name, buf, e.start)
        return buf.view(raw_dtype).reshape(e.shape)

    def array(self, name: str) -> np.ndarray:
        """The entry as a NumPy array of its own dtype (BF16 and F8 through ml_dtypes), no copy."""
        return self.raw(name).view(self.array_dtype(name))

    def passthrough(self, name: str) -> Passthrough:
        """The entry as it is stored, for a writer to copy byte for byte without reading it whole."""
        return Passthrough(self, self.entries[name])

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of an entry of at least one axis, as :meth:`array` types them.

        Rows are contiguous in the file, so a slab is one read: a large tensor can be worked on
        a slab at a time without ever being whole in memory.
        """
        e = self.entries[name]
        if not e.shape:
            msg = f"{self.path}: entry {name!r} is 0-d; it has no rows"
            raise ShapeError(msg)
        start, stop = max(0, start), min(stop, e.shape[0])
        shape = (max(0, stop - start), *e.shape[1:])
        dtype = self.array_dtype(name)
        row_bytes = math.prod(e.shape[1:]) * dtype.itemsize
        buf = np.empty(shape[0] * row_bytes, np.uint8)
        if buf.size:
            self._read(name, buf, e.start + start * row_bytes)
        raw = buf.view(PLAIN[e.dtype][0]).reshape(shape)
        return raw.view(dtype)

    def array_dtype(self, name: str) -> np.dtype[Any]:
        """The NumPy dtype :meth:`array` gives the entry, without reading it."""
        kind = self.entries[name].dtype
        if kind == "BF16" or kind.startswith("F8"):
            return np.dtype(ml_dtype(PLAIN[kind][1]))
        return np.dtype(np.bool_ if kind == "BOOL" else PLAIN[kind][0])


class Passthrough(NamedTuple):
    """An entry of an open :class:`SafetensorsFile` that a writer copies as it is stored.

    :func:`arrayquant.io.safetensors.writer.save_stream` takes it in place of an array and copies its
    bytes a chunk at a time, so tensors that pass through unchanged (a model's embeddings, norms,
    biases) never sit in memory; the source must stay open until the writer is done.
    """

    source: SafetensorsFile
    entry: Entry

    @property
    def nbytes(self) -> int:
        return self.entry.nbytes

    def copy_to(self, fd: int, offset: int, chunk: int = 1 << 20) -> None:
        """Write the entry's bytes at ``offset`` of the open file ``fd``."""
        at, stop = self.entry.start, self.entry.stop
        with self.source.descriptor() as src:
            while at < stop:
                data = os.pread(src, min(chunk, stop - at), at)
                if not data:
                    msg = f"{self.source.path}: entry {self.entry.name!r} is cut short; the file was truncated"
                    raise CorruptDataError(msg)
                write_all(fd, data, offset)
                at, offset = at + len(data), offset + len(data)
