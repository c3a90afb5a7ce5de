"""The bounded GGUF reader: the header walked once, key/values and tensor infos checked, bytes read.

The header is parsed here, once, with every count, length and offset checked against the
file's size before anything is allocated for it; gguf-py's :class:`gguf.GGUFReader` is not used,
as it trusts those numbers and builds one NumPy view per stored item (about 700 bytes each: a
4 MiB array of bytes cost it 2.9 GB). Opening a file (:func:`open_gguf`) steps over the
key/values, checking that every string is UTF-8 so that every reader refuses the same files,
but keeps none of them; :meth:`GGUFFile.fields` decodes them when asked for
(:mod:`arrayquant.io.gguf.metadata`), so metadata costs about its size in memory.

Limits, each a :class:`~arrayquant.errors.CorruptDataError` naming it: at most
:data:`MAX_KEY_VALUES` key/values (models carry a few dozen), keys of at most
:data:`MAX_KEY_BYTES` bytes (the GGUF specification's limit), :data:`MAX_ARRAY_ITEMS` array
items in all (a string array is walked item by item; real vocabularies need well under a
million), no nested arrays (llama.cpp refuses them too), and a ``general.alignment`` that is a
power of two (llama.cpp's rule) of at most :data:`MAX_ALIGNMENT` (a 64 KiB page: each tensor is
padded with up to that many zero bytes). Every problem with a file is a
:class:`~arrayquant.errors.CorruptDataError`.

Tensor data is read with positioned reads into fresh buffers, one tensor at a time, never
through the memory map, so pages already read do not pile up in the process.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...errors import CorruptDataError
from .ggml import MAX_DIMS, gguf_py
from .metadata import ALIGN_KEY, ARRAY, KV, SCALAR_SIZE, STRING, U64, UINT32, decode_value

__all__ = [
    "MAGIC",
    "MAX_ALIGNMENT",
    "MAX_ARRAY_ITEMS",
    "MAX_KEY_BYTES",
    "MAX_KEY_VALUES",
    "NAME",
    "GGUFFile",
    "TensorInfo",
    "open_gguf",
    "sniff",
]

NAME = "gguf"  # the format's name, as arrayquant.io.formats knows it
MAGIC = b"GGUF"
MAX_ARRAY_ITEMS = 1 << 22  # array items over all key/values: a string array is walked item by item
MAX_KEY_VALUES = 1 << 16  # key/values in a file: models carry a few dozen, and llama.cpp's check of them is quadratic
MAX_KEY_BYTES = (1 << 16) - 1  # the GGUF specification's limit on a key
MAX_ALIGNMENT = 1 << 16  # the largest page in use (64 KiB); llama.cpp takes any power of two
_VERSIONS = (2, 3)  # gguf-py reads these; version 1 had 32-bit counts
_DEFAULT_ALIGNMENT = 32
_U32 = struct.Struct("<I")


def sniff(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts with the GGUF magic; False for anything unreadable or short."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except (OSError, ValueError):
        return False


class TensorInfo(NamedTuple):
    """One tensor as the header describes it, checked against the file."""

    name: str
    type_name: str
    shape: tuple[int, ...]  # NumPy order: GGUF's dimensions reversed
    start: int  # absolute offset of the data in the file
    nbytes: int


class _Header(NamedTuple):
    tensors: list[TensorInfo]
    data_start: int
    n_kv: int
    kv_end: int  # the first byte after the key/values


class _Cursor:
    """Bounds-checked little-endian reads over the file's bytes."""

    def __init__(self, buf: Any, path: Path) -> None:
        self.buf, self.pos, self.size, self.path = buf, 0, len(buf), path

    def take(self, n: int, what: str) -> int:
        if n > self.size - self.pos:
            msg = (
                f"{self.path}: truncated or lying GGUF header: {what} at byte {self.pos} needs {n} bytes, "
                f"the file has {self.size - self.pos} left"
            )
            raise CorruptDataError(msg)
        at = self.pos
        self.pos += n
        return at

    def u32(self, what: str) -> int:
        return int(_U32.unpack_from(self.buf, self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(U64.unpack_from(self.buf, self.take(8, what))[0])

    def text(self, what: str, limit: int | None = None) -> str:
        n = self.u64(f"the length of {what}")
        at = self.take(n, what)
        if limit is not None and n > limit:
            msg = (
                f"{self.path}: {what} at byte {at} is {n} bytes long; GGUF keys are at most {limit} bytes "
                "(the GGUF specification's limit)"
            )
            raise CorruptDataError(msg)
        try:
            return str(self.buf[at : at + n], "utf-8")
        except UnicodeDecodeError as e:
            msg = f"{self.path}: {what} at byte {at} is not UTF-8 ({e.reason})"
            raise CorruptDataError(msg) from None


def _scan(fd: int, path: Path) -> _Header:
    """Walk the header once, checking every count and offset.

    Nothing is allocated in proportion to a count before the count has been checked against
    the bytes left in the file, and nothing per array item at all.
    """
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        msg = f"{path} is not a file"
        raise CorruptDataError(msg)
    size = info.st_size
    if size < 24:
        msg = f"{path}: {size} bytes, too short for a GGUF header (24 bytes before any key/value)"
        raise CorruptDataError(msg)
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
        return _walk(_Cursor(buf, path), path)


def _counts(cur: _Cursor, path: Path) -> tuple[int, int]:
    """The header's (tensor count, key/value count), checked; the cursor left on the first key/value."""
    magic = bytes(cur.buf[0:4])
    if magic != MAGIC:
        msg = f"{path}: not a GGUF file (magic {magic!r}, expected {MAGIC!r})"
        raise CorruptDataError(msg)
    cur.pos = 4
    version = cur.u32("the version")
    if version & 0xFFFF == 0 and version:
        msg = f"{path}: a big-endian GGUF file; only little-endian GGUF files are read"
        raise CorruptDataError(msg)
    if version not in _VERSIONS:
        msg = f"{path}: GGUF version {version}; versions {', '.join(map(str, _VERSIONS))} are read"
        raise CorruptDataError(msg)
    n_tensors, n_kv = cur.u64("the tensor count"), cur.u64("the key/value count")
    # a key/value takes at least 13 bytes (key length, type, one-byte value), a tensor info 24
    if n_kv * 13 + n_tensors * 24 > cur.size - cur.pos:
        msg = (
            f"{path}: the header claims {n_kv} key/values and {n_tensors} tensors, more than the "
            f"{cur.size - cur.pos} bytes left in the file can hold"
        )
        raise CorruptDataError(msg)
    if n_kv > MAX_KEY_VALUES:
        msg = (
            f"{path}: the header claims {n_kv} key/values; more than {MAX_KEY_VALUES} "
            "(arrayquant.io.gguf.container.MAX_KEY_VALUES) are refused to bound memory and time. Models carry a few "
            "dozen; for a file that truly has more, raise that limit"
        )
        raise CorruptDataError(msg)
    return n_tensors, n_kv


def _walk(cur: _Cursor, path: Path) -> _Header:
    g = gguf_py()
    n_tensors, n_kv = _counts(cur, path)
    _, alignment = _key_values(cur, n_kv, path)
    kv_end = cur.pos
    infos: list[tuple[str, str, tuple[int, ...], int, int]] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = cur.text(f"the name of tensor {i}")
        if name in names:
            msg = f"{path}: tensor {name!r} appears twice"
            raise CorruptDataError(msg)
        names.add(name)
        n_dims = cur.u32(f"the rank of {name!r}")
        if n_dims > MAX_DIMS:
            msg = f"{path}: tensor {name!r} has {n_dims} dimensions; GGUF tensors have at most {MAX_DIMS}"
            raise CorruptDataError(msg)
        dims = [cur.u64(f"dimension {d} of {name!r}") for d in range(n_dims)]
        raw_type = cur.u32(f"the type of {name!r}")
        try:
            type_name = g.GGMLQuantizationType(raw_type).name
            block, type_size = g.GGML_QUANT_SIZES[g.GGMLQuantizationType(raw_type)]
        except (ValueError, KeyError):
            msg = f"{path}: tensor {name!r} has type id {raw_type}, which is no GGML type gguf-py knows"
            raise CorruptDataError(msg) from None
        offset = cur.u64(f"the data offset of {name!r}")
        row = dims[0] if dims else 1
        if row % block:
            msg = f"{path}: tensor {name!r} ({type_name}) has rows of {row} values, not whole blocks of {block}"
            raise CorruptDataError(msg)
        count = math.prod(dims)
        nbytes = count // block * type_size
        if offset % alignment:
            msg = f"{path}: tensor {name!r} starts at data offset {offset}, not a multiple of the alignment {alignment}"
            raise CorruptDataError(msg)
        infos.append((name, type_name, tuple(reversed(dims)), offset, nbytes))
    data_start = -(-cur.pos // alignment) * alignment
    out: list[TensorInfo] = []
    end = 0
    for name, type_name, shape, offset, nbytes in sorted(infos, key=lambda t: t[3]):
        start = data_start + offset
        if start < end:
            msg = f"{path}: tensor {name!r} overlaps the tensor before it (data offset {offset})"
            raise CorruptDataError(msg)
        end = start + nbytes
        if end > cur.size:
            msg = (
                f"{path}: tensor {name!r} claims bytes {start}..{end} ({nbytes} bytes of {type_name} {list(shape)}), "
                f"past the end of the {cur.size}-byte file"
            )
            raise CorruptDataError(msg)
    for name, type_name, shape, offset, nbytes in infos:
        out.append(TensorInfo(name, type_name, shape, data_start + offset, nbytes))
    return _Header(out, data_start, n_kv, kv_end)


def _key_values(cur: _Cursor, n_kv: int, path: Path) -> tuple[list[KV], int]:
    """Where each of the ``n_kv`` key/values lies, and the alignment; every string checked to be UTF-8.

    Every reader refuses the same files: a string that is not UTF-8 fails ``load`` as it fails
    :func:`~arrayquant.io.gguf.read_metadata`. The walk over an array's strings is the only step per array item;
    numbers are stepped over whole.
    """
    keys: set[str] = set()
    out: list[KV] = []
    alignment = _DEFAULT_ALIGNMENT
    items = 0
    for i in range(n_kv):
        key = cur.text(f"key {i}", MAX_KEY_BYTES)
        if key in keys:
            msg = f"{path}: key {key!r} appears twice"
            raise CorruptDataError(msg)
        keys.add(key)
        vtype = cur.u32(f"the type of {key!r}")
        if key == ALIGN_KEY:
            alignment = _alignment(cur, vtype, path)
            out.append(KV(key, vtype, -1, 1, cur.pos - 4, cur.pos))
            continue
        kv = _value_span(cur, key, vtype, path)
        out.append(kv)
        if kv.vtype == ARRAY:
            items += kv.items
        if items > MAX_ARRAY_ITEMS:
            msg = f"{path}: more than {MAX_ARRAY_ITEMS} array items in the key/values; refused to bound memory"
            raise CorruptDataError(msg)
    return out, alignment


def _alignment(cur: _Cursor, vtype: int, path: Path) -> int:
    """``general.alignment``: a UINT32 power of two, as llama.cpp requires, and at most :data:`MAX_ALIGNMENT`."""
    if vtype != UINT32:
        msg = f"{path}: {ALIGN_KEY} has value type {vtype}, not UINT32 ({UINT32})"
        raise CorruptDataError(msg)
    alignment = cur.u32(ALIGN_KEY)
    if alignment == 0 or alignment & (alignment - 1):
        msg = f"{path}: {ALIGN_KEY} is {alignment}, not a power of two"
        raise CorruptDataError(msg)
    if alignment > MAX_ALIGNMENT:
        msg = (
            f"{path}: {ALIGN_KEY} is {alignment}; arrayquant reads alignments up to {MAX_ALIGNMENT} (a page of "
            "64 KiB, the largest in use), as each tensor would otherwise be padded with that many zero bytes"
        )
        raise CorruptDataError(msg)
    return alignment


def _value_span(cur: _Cursor, key: str, vtype: int, path: Path) -> KV:
    """Step over one value; where it lies."""
    if vtype in SCALAR_SIZE:
        at = cur.take(SCALAR_SIZE[vtype], f"the value of {key!r}")
        return KV(key, vtype, -1, 1, at, cur.pos)
    if vtype == STRING:
        at = cur.take(cur.u64(f"the length of {key!r}"), f"the text of {key!r}")
        _utf8(cur.buf[at : cur.pos], f"the value of {key!r}", at, path)
        return KV(key, vtype, -1, 1, at, cur.pos)
    if vtype != ARRAY:
        msg = f"{path}: key {key!r} has value type {vtype}, which GGUF does not define"
        raise CorruptDataError(msg)
    itype = cur.u32(f"the item type of {key!r}")
    n = cur.u64(f"the length of {key!r}")
    if n > MAX_ARRAY_ITEMS:
        msg = f"{path}: key {key!r} claims {n} items; more than {MAX_ARRAY_ITEMS} are refused to bound memory"
        raise CorruptDataError(msg)
    start = cur.pos
    if itype in SCALAR_SIZE:
        cur.take(n * SCALAR_SIZE[itype], f"the {n} items of {key!r}")
    elif itype == STRING:
        if n * 8 > cur.size - cur.pos:
            cur.take(n * 8, f"the {n} strings of {key!r}")
        _skip_strings(cur, n, key, path)
    elif itype == ARRAY:
        msg = f"{path}: key {key!r} is an array of arrays, which neither llama.cpp nor gguf-py reads"
        raise CorruptDataError(msg)
    else:
        msg = f"{path}: key {key!r} is an array of value type {itype}, which GGUF does not define"
        raise CorruptDataError(msg)
    return KV(key, ARRAY, itype, n, start, cur.pos)


def _utf8(data: Any, what: str, at: int, path: Path) -> None:
    try:
        str(data, "utf-8")
    except UnicodeDecodeError as e:
        msg = f"{path}: {what} at byte {at} is not UTF-8 ({e.reason})"
        raise CorruptDataError(msg) from None


def _skip_strings(cur: _Cursor, n: int, key: str, path: Path) -> None:
    """Step over ``n`` strings, each checked to be UTF-8, in a tight loop: messages only for an item that is wrong."""
    buf, pos, size, unpack = cur.buf, cur.pos, cur.size, U64.unpack_from
    for j in range(n):
        if size - pos < 8:
            cur.pos = pos
            cur.take(8, f"the length of item {j} of {key!r}")
        length = unpack(buf, pos)[0]
        pos += 8
        if length > size - pos:
            cur.pos = pos
            cur.take(length, f"item {j} of {key!r}")
        try:
            str(buf[pos : pos + length], "utf-8")
        except UnicodeDecodeError as e:
            msg = f"{path}: item {j} of {key!r} at byte {pos} is not UTF-8 ({e.reason})"
            raise CorruptDataError(msg) from None
        pos += length
    cur.pos = pos


class GGUFFile:
    """A checked GGUF file: its header walked once, key/values decoded on demand, tensors by positioned reads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            msg = f"cannot open {self.path}: {e.strerror}"
            raise CorruptDataError(msg) from None
        try:
            self.header = _scan(self.fd, self.path)
        except BaseException:
            os.close(self.fd)
            raise
        self.tensors = self.header.tensors

    def close(self) -> None:
        os.close(self.fd)

    def _fill(self, view: memoryview, at: int, what: str) -> None:
        """Fill ``view`` with the file's bytes from ``at``: positioned reads, never the memory map."""
        while len(view):
            done = os.preadv(self.fd, [view], at)
            if done == 0:
                msg = f"{self.path}: the file ended while reading {what} (it changed while being read?)"
                raise CorruptDataError(msg)
            view, at = view[done:], at + done

    def raw(self, t: TensorInfo) -> np.ndarray:
        """The tensor's bytes, read into a fresh buffer."""
        out = np.empty(t.nbytes, np.uint8)
        self._fill(out.data, t.start, repr(t.name))
        return out

    def fields(self) -> dict[str, Any]:
        """Every key/value as a ``gguf.GGUFValue``, in file order."""
        buf = bytearray(self.header.kv_end)  # the header and key/values; tensor infos and data are not read
        self._fill(memoryview(buf), 0, "the key/values")
        cur = _Cursor(buf, self.path)
        cur.pos = 24  # magic, version and the two counts, checked when the file was opened
        kvs, _ = _key_values(cur, self.header.n_kv, self.path)
        if cur.pos != self.header.kv_end:
            msg = f"{self.path}: the file changed while it was being read"
            raise CorruptDataError(msg)
        blob = memoryview(buf)
        return {kv.key: decode_value(kv, blob) for kv in kvs}


@contextmanager
def open_gguf(path: str | os.PathLike[str]) -> Iterator[GGUFFile]:
    """A :class:`GGUFFile` of ``path``, closed on the way out.

    Raises
    ------
    CorruptDataError
        A file that cannot be opened, is not GGUF, is truncated, or whose header lies about sizes
        or offsets (see the limits in this module's description).
    """
    f = GGUFFile(path)
    try:
        yield f
    finally:
        f.close()
