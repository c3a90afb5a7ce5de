"""GGUF files (llama.cpp, ollama, LM Studio): read here, written through gguf-py, re-quantized.

The header is parsed here, once, with every count, length and offset checked against the
file's size before anything is allocated for it; gguf-py's :class:`gguf.GGUFReader` is not used,
as it trusts those numbers and builds one NumPy view per stored item (about 700 bytes each: a
4 MiB array of bytes cost it 2.9 GB). Reading tensors steps over the key/values, checking
that every string is UTF-8 so that every reader refuses the same files, but keeps none of them;
:func:`read_metadata` decodes scalars and strings and gives each array as a
:class:`GGUFArray`, a view of its stored bytes, so metadata costs about its size in memory.
:class:`gguf.GGUFWriter` writes files, arrays read from a file going back byte for byte.

Limits, each a :class:`~arrayquant.errors.CorruptDataError` naming it (and a
:class:`~arrayquant.errors.ParamsError` when writing): at most :data:`MAX_KEY_VALUES`
key/values (models carry a few dozen), keys of at most :data:`MAX_KEY_BYTES` bytes (the GGUF
specification's limit), :data:`MAX_ARRAY_ITEMS` array items in all (a string array is walked
item by item; real vocabularies need well under a million), no nested arrays (llama.cpp refuses
them too), and a ``general.alignment`` that is a power of two (llama.cpp's rule) of at most
:data:`MAX_ALIGNMENT` (a 64 KiB page: each tensor is padded with up to that many zero bytes).
Every problem with a file is a :class:`~arrayquant.errors.CorruptDataError`; a failed write is
the system's ``OSError`` naming the file being written, which is left as it was.

Tensor data is read with positioned reads into fresh buffers, one tensor at a time, never
through the memory map, so pages already read do not pile up in the process. Types map as
follows (the exact block maps live in :mod:`arrayquant.io.gguf_types`):

- ``F32``, ``F16``, ``F64``, ``I8`` ... ``I64``: arrays of that dtype; ``BF16``: a bfloat16
  array through ml_dtypes (float32 values, with a note, where ml_dtypes is missing);
- a type whose blocks are exactly an arrayquant scheme (``Q8_0``, ``Q4_0``, ``MXFP4``, ...): a
  :class:`~arrayquant.QuantizedTensor`, bit for bit;
- ``NVFP4`` with its per-tensor scale as llama.cpp's converter writes it (the F32 tensor
  ``<name>.scale``, ``.weight`` replaced, shape (1,)): one two-level ``nvfp4`` QuantizedTensor;
- every other type (K-quants, IQ-quants, ``Q4_1``, ``Q5_0``, ``Q5_1``, ``TQ1_0``, ...) and an
  exact type whose particular blocks are not exact: float32 values through
  ``gguf.quants.dequantize``, with a note naming the type and why.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import itertools
import math
import mmap
import operator
import os
import stat
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, overload

import numpy as np

from ..backends import default, shim
from ..errors import (
    BackendUnavailableError,
    CorruptDataError,
    DTypeError,
    ParamsError,
    QuantizationError,
    SchemeError,
    ShapeError,
)
from ..quantize import quantize
from ..scheme import QuantScheme
from ..tensor import QuantizedTensor
from . import _atomic, _dtypes, gguf_types
from .importance import search_arguments

__all__ = [
    "MAGIC",
    "MAX_ALIGNMENT",
    "MAX_ARRAY_ITEMS",
    "MAX_KEY_BYTES",
    "MAX_KEY_VALUES",
    "NAME",
    "GGUFArray",
    "GGUFSummary",
    "iter_tensors",
    "load",
    "quantize_file",
    "read_metadata",
    "save",
    "sniff",
]

NAME = "gguf"
MAGIC = b"GGUF"
MAX_ARRAY_ITEMS = 1 << 22  # array items over all key/values: a string array is walked item by item
MAX_KEY_VALUES = 1 << 16  # key/values in a file: models carry a few dozen, and llama.cpp's check of them is quadratic
MAX_KEY_BYTES = (1 << 16) - 1  # the GGUF specification's limit on a key
MAX_ALIGNMENT = 1 << 16  # the largest page in use (64 KiB); llama.cpp takes any power of two
_VERSIONS = (2, 3)  # gguf-py reads these; version 1 had 32-bit counts
_MAX_DIMS = 4  # GGML_MAX_DIMS
_DEFAULT_ALIGNMENT = 32
_QNT_VERSION = 2  # GGML_QNT_VERSION, which llama-quantize writes as general.quantization_version
_ARCH_KEY = "general.architecture"
_ALIGN_KEY = "general.alignment"
_FTYPE_KEY = "general.file_type"
_QVERSION_KEY = "general.quantization_version"
# GGUF value type ids (gguf.GGUFValueType) -> bytes of one value; 8: string, 9: array
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32, _BOOL = 8, 9, 4, 7
# GGUF value type ids -> the struct format of one value, the NumPy dtype of an array's items
_SCALAR_FORMAT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_ITEM_DTYPE = {
    0: "u1",
    1: "i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "u1",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_PLAIN = {k: d.numpy for k, d in _dtypes.GGUF.items() if d.native}  # viewed as NumPy arrays as they are
_FLOAT_SOURCES = _dtypes.GGUF_FLOATS  # what quantize_file quantizes from
_ARRAY_TYPES = {d.name: k for k, d in _dtypes.GGUF.items()}
# Substrings of the 2-d weights llama-quantize leaves unquantized (llama-quant.cpp, as read in 2025):
# MoE routers, Gemma 3n's small altup/laurel/per-layer projections, BERT's position and token-type
# embeddings, Mamba/LFM2 convolutions, RWKV's time-mix weights, T5's relative bias, vision position
# embeddings. Norms are caught by "_norm.weight"; 1-d tensors by their rank.
_KEPT = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "position_embd.weight",
    "token_types.weight",
    "ssm_conv1d.weight",
    "shortconv.conv.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd.",
)


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - gguf is a test dependency
        msg = "GGUF files need the gguf package (gguf-py, from llama.cpp); pip install gguf"
        raise BackendUnavailableError(msg) from e
    return gguf


def _sizes(type_name: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a GGUF type."""
    g = _gguf()
    return g.GGML_QUANT_SIZES[g.GGMLQuantizationType[type_name]]


def _row_bytes(type_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The byte shape gguf-py gives a tensor: rows of whole blocks."""
    block, size = _sizes(type_name)
    return (*shape[:-1], shape[-1] // block * size)


def sniff(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts with the GGUF magic; False for anything unreadable or short."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except (OSError, ValueError):
        return False


class _Info(NamedTuple):
    name: str
    type_name: str
    shape: tuple[int, ...]  # NumPy order: GGUF's dimensions reversed
    start: int  # absolute offset of the data in the file
    nbytes: int


class _KV(NamedTuple):
    """Where one key/value lies in the file; its value is decoded only when asked for."""

    key: str
    vtype: int
    itype: int  # an array's item type, else -1
    items: int  # an array's length, else 1
    start: int  # the value's first byte: a string's text, an array's first item
    end: int


class _Header(NamedTuple):
    tensors: list[_Info]
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
        return int(_U64.unpack_from(self.buf, self.take(8, what))[0])

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
            "(arrayquant.io.gguf.MAX_KEY_VALUES) are refused to bound memory and time. Models carry a few "
            "dozen; for a file that truly has more, raise that limit"
        )
        raise CorruptDataError(msg)
    return n_tensors, n_kv


def _walk(cur: _Cursor, path: Path) -> _Header:
    g = _gguf()
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
        if n_dims > _MAX_DIMS:
            msg = f"{path}: tensor {name!r} has {n_dims} dimensions; GGUF tensors have at most {_MAX_DIMS}"
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
    out: list[_Info] = []
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
        out.append(_Info(name, type_name, shape, data_start + offset, nbytes))
    return _Header(out, data_start, n_kv, kv_end)


def _key_values(cur: _Cursor, n_kv: int, path: Path) -> tuple[list[_KV], int]:
    """Where each of the ``n_kv`` key/values lies, and the alignment; every string checked to be UTF-8.

    Every reader refuses the same files: a string that is not UTF-8 fails ``load`` as it fails
    :func:`read_metadata`. The walk over an array's strings is the only step per array item;
    numbers are stepped over whole.
    """
    keys: set[str] = set()
    out: list[_KV] = []
    alignment = _DEFAULT_ALIGNMENT
    items = 0
    for i in range(n_kv):
        key = cur.text(f"key {i}", MAX_KEY_BYTES)
        if key in keys:
            msg = f"{path}: key {key!r} appears twice"
            raise CorruptDataError(msg)
        keys.add(key)
        vtype = cur.u32(f"the type of {key!r}")
        if key == _ALIGN_KEY:
            alignment = _alignment(cur, vtype, path)
            out.append(_KV(key, vtype, -1, 1, cur.pos - 4, cur.pos))
            continue
        kv = _value_span(cur, key, vtype, path)
        out.append(kv)
        if kv.vtype == _ARRAY:
            items += kv.items
        if items > MAX_ARRAY_ITEMS:
            msg = f"{path}: more than {MAX_ARRAY_ITEMS} array items in the key/values; refused to bound memory"
            raise CorruptDataError(msg)
    return out, alignment


def _alignment(cur: _Cursor, vtype: int, path: Path) -> int:
    """``general.alignment``: a UINT32 power of two, as llama.cpp requires, and at most :data:`MAX_ALIGNMENT`."""
    if vtype != _UINT32:
        msg = f"{path}: {_ALIGN_KEY} has value type {vtype}, not UINT32 ({_UINT32})"
        raise CorruptDataError(msg)
    alignment = cur.u32(_ALIGN_KEY)
    if alignment == 0 or alignment & (alignment - 1):
        msg = f"{path}: {_ALIGN_KEY} is {alignment}, not a power of two"
        raise CorruptDataError(msg)
    if alignment > MAX_ALIGNMENT:
        msg = (
            f"{path}: {_ALIGN_KEY} is {alignment}; arrayquant reads alignments up to {MAX_ALIGNMENT} (a page of "
            "64 KiB, the largest in use), as each tensor would otherwise be padded with that many zero bytes"
        )
        raise CorruptDataError(msg)
    return alignment


def _value_span(cur: _Cursor, key: str, vtype: int, path: Path) -> _KV:
    """Step over one value; where it lies."""
    if vtype in _SCALAR_SIZE:
        at = cur.take(_SCALAR_SIZE[vtype], f"the value of {key!r}")
        return _KV(key, vtype, -1, 1, at, cur.pos)
    if vtype == _STRING:
        at = cur.take(cur.u64(f"the length of {key!r}"), f"the text of {key!r}")
        _utf8(cur.buf[at : cur.pos], f"the value of {key!r}", at, path)
        return _KV(key, vtype, -1, 1, at, cur.pos)
    if vtype != _ARRAY:
        msg = f"{path}: key {key!r} has value type {vtype}, which GGUF does not define"
        raise CorruptDataError(msg)
    itype = cur.u32(f"the item type of {key!r}")
    n = cur.u64(f"the length of {key!r}")
    if n > MAX_ARRAY_ITEMS:
        msg = f"{path}: key {key!r} claims {n} items; more than {MAX_ARRAY_ITEMS} are refused to bound memory"
        raise CorruptDataError(msg)
    start = cur.pos
    if itype in _SCALAR_SIZE:
        cur.take(n * _SCALAR_SIZE[itype], f"the {n} items of {key!r}")
    elif itype == _STRING:
        if n * 8 > cur.size - cur.pos:
            cur.take(n * 8, f"the {n} strings of {key!r}")
        _skip_strings(cur, n, key, path)
    elif itype == _ARRAY:
        msg = f"{path}: key {key!r} is an array of arrays, which neither llama.cpp nor gguf-py reads"
        raise CorruptDataError(msg)
    else:
        msg = f"{path}: key {key!r} is an array of value type {itype}, which GGUF does not define"
        raise CorruptDataError(msg)
    return _KV(key, _ARRAY, itype, n, start, cur.pos)


def _utf8(data: Any, what: str, at: int, path: Path) -> None:
    try:
        str(data, "utf-8")
    except UnicodeDecodeError as e:
        msg = f"{path}: {what} at byte {at} is not UTF-8 ({e.reason})"
        raise CorruptDataError(msg) from None


def _skip_strings(cur: _Cursor, n: int, key: str, path: Path) -> None:
    """Step over ``n`` strings, each checked to be UTF-8, in a tight loop: messages only for an item that is wrong."""
    buf, pos, size, unpack = cur.buf, cur.pos, cur.size, _U64.unpack_from
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


class GGUFArray(Sequence[Any]):
    """A GGUF metadata array as stored: its bytes, with items decoded only when asked for.

    :func:`read_metadata` gives arrays as this read-only sequence, so that a file's metadata costs
    about its size in memory whatever it holds (a Python list costs 8 to 60 bytes per item). It
    behaves as the list it stands for: ``len``, indexing and slicing (Python ints, floats, bools
    or strs), iteration, and ``==`` with a list; ``tolist()`` gives that list, and for numbers
    ``np.asarray(a)`` is a read-only NumPy view of the stored little-endian items (for bools, a
    bool array: nonzero bytes are true, as in llama.cpp). :func:`save` and :func:`quantize_file`
    write it back byte for byte.
    """

    __slots__ = ("_len", "_raw", "_starts", "item_type")

    def __init__(self, raw: bytes | bytearray | memoryview, item_type: int, count: int) -> None:
        self._raw, self.item_type, self._len = bytes(raw), int(item_type), int(count)
        self._starts: np.ndarray | None = None  # where each string's length is, built on first indexing

    @property
    def raw(self) -> bytes:
        """The items as stored in the file (for strings: each one's u64 length, then its UTF-8 bytes)."""
        return self._raw

    def __len__(self) -> int:
        return self._len

    def _view(self) -> np.ndarray:
        return np.frombuffer(self._raw, _ITEM_DTYPE[self.item_type], self._len)

    def _numbers(self) -> np.ndarray:
        """The items as a NumPy array: a view of the stored bytes; bools a bool array (nonzero is true)."""
        view = self._view()
        return view != 0 if self.item_type == _BOOL else view

    def _text(self, at: int) -> str:
        n = _U64.unpack_from(self._raw, at)[0]
        return str(self._raw[at + 8 : at + 8 + n], "utf-8")

    def _string_starts(self) -> np.ndarray:
        if self._starts is None:
            starts, at, unpack = np.empty(self._len, np.int64), 0, _U64.unpack_from
            for j in range(self._len):
                starts[j] = at
                at += 8 + unpack(self._raw, at)[0]
            self._starts = starts
        return self._starts

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        i = operator.index(index)
        if not -self._len <= i < self._len:
            msg = f"GGUFArray index {index} out of range for {self._len} items"
            raise IndexError(msg)
        i %= self._len
        if self.item_type == _STRING:
            return self._text(int(self._string_starts()[i]))
        item = self._view()[i]
        return bool(item) if self.item_type == _BOOL else item.item()

    def __iter__(self) -> Iterator[Any]:
        if self.item_type != _STRING:
            numbers = self._numbers()
            for start in range(0, self._len, 1 << 16):  # a chunk of Python objects at a time
                yield from numbers[start : start + (1 << 16)].tolist()
            return
        at = 0
        for _ in range(self._len):
            text = self._text(at)
            at += 8 + _U64.unpack_from(self._raw, at)[0]
            yield text

    def tolist(self) -> list[Any]:
        """The items as a Python list, as gguf-py's ``ReaderField.contents()`` gives them."""
        return self._numbers().tolist() if self.item_type != _STRING else list(self)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self._numbers() if self.item_type != _STRING else np.array(self.tolist(), dtype=object)
        return np.array(out, dtype) if copy or (dtype is not None and out.dtype != dtype) else out

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GGUFArray):
            if self.item_type == other.item_type and self._raw == other._raw:
                return True
            return self.tolist() == other.tolist()
        if isinstance(other, list):
            return len(other) == self._len and self.tolist() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        shown = list(itertools.islice(self, 8))
        more = f", ... ({self._len} items)" if self._len > 8 else ""
        return f"GGUFArray({_gguf().GGUFValueType(self.item_type).name}, {shown!r}{more})"


def _decoded(kv: _KV, blob: memoryview) -> Any:
    """One key/value as a ``gguf.GGUFValue``: scalars and strings decoded, arrays as :class:`GGUFArray`."""
    g = _gguf()
    vtype = g.GGUFValueType(kv.vtype)
    if kv.vtype == _ARRAY:
        items = GGUFArray(blob[kv.start : kv.end], kv.itype, kv.items)
        return g.GGUFValue(items, vtype, g.GGUFValueType(kv.itype))
    if kv.vtype == _STRING:  # checked to be UTF-8 by the walk
        return g.GGUFValue(str(blob[kv.start : kv.end], "utf-8"), vtype)
    return g.GGUFValue(struct.unpack_from(_SCALAR_FORMAT[kv.vtype], blob, kv.start)[0], vtype)


class _File:
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

    def raw(self, t: _Info) -> np.ndarray:
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
        return {kv.key: _decoded(kv, blob) for kv in kvs}


@contextmanager
def _opened(path: str | os.PathLike[str]) -> Iterator[_File]:
    f = _File(path)
    try:
        yield f
    finally:
        f.close()


def _ml_dtypes() -> Any:
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
        return None
    return ml_dtypes


def _value(raw: np.ndarray, t: _Info, backend: str | None, device: Any) -> tuple[QuantizedTensor | np.ndarray, str]:
    """The tensor as arrayquant holds it, and a note ("" unless it was turned into floats)."""
    try:
        return _shaped(raw, t, backend, device)
    except ValueError as exc:  # NumPy's own refusal of an empty shape no array can take
        if isinstance(exc, QuantizationError):
            raise
        msg = f"tensor {t.name!r} has shape {list(t.shape)}, which no array can take ({exc})"
        raise ShapeError(msg) from None


def _shaped(raw: np.ndarray, t: _Info, backend: str | None, device: Any) -> tuple[QuantizedTensor | np.ndarray, str]:
    if t.type_name in _PLAIN:
        return raw.view(_PLAIN[t.type_name]).reshape(t.shape), ""
    if t.type_name == "BF16":
        md = _ml_dtypes()
        if md is not None:
            return raw.view(md.bfloat16).reshape(t.shape), ""
        floats = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
        return floats, "BF16 read as float32 values (ml_dtypes, which holds bfloat16 arrays, is not installed)"
    data = raw.reshape(_row_bytes(t.type_name, t.shape))
    if t.type_name in gguf_types.EXACT:
        qt, why = _decode(data, t, backend, device)
        if qt is not None:
            return qt, ""
    else:
        why = "its blocks are not an arrayquant scheme"
    g = _gguf()
    try:
        with np.errstate(all="ignore"):  # scales of inf or NaN give inf or NaN values, as in llama.cpp
            floats = g.quants.dequantize(data, g.GGMLQuantizationType[t.type_name])
    except NotImplementedError:
        msg = f"tensor {t.name!r} is {t.type_name}, which gguf-py cannot dequantize and arrayquant does not hold"
        raise SchemeError(msg) from None
    return np.asarray(floats, np.float32).reshape(t.shape), f"{t.type_name} read as float32 values: {why}"


def _decode(data: np.ndarray, t: _Info, backend: str | None, device: Any, glob: Any = None) -> tuple[Any, str]:
    """:func:`gguf_types.decode` of tensor ``t``, whose errors name the tensor."""
    try:
        return gguf_types.decode(data, t.type_name, t.shape, backend=backend, device=device, global_scale=glob)
    except ShapeError as e:
        msg = f"tensor {t.name!r}: {e}"
        if 0 in t.shape:  # GGUF allows it, a QuantizedTensor does not
            msg += (
                f"; this {t.type_name} tensor holds no values, and a quantized tensor holds at least one per axis: "
                "store it as F32, or leave it out"
            )
        raise ShapeError(msg) from None


def _scale_name(name: str) -> str:
    """The F32 tensor that holds an NVFP4 weight's per-tensor scale, named as llama.cpp names it.

    llama.cpp's converter (``conversion/base.py``, ``_repack_nvfp4``) writes ModelOpt's
    ``weight_scale_2`` as ``name.replace(".weight", ".scale")`` (``blk.0.attn_q.weight`` ->
    ``blk.0.attn_q.scale``), shape ``{1}``, and its graph multiplies the matmul by it
    (``ggml_mul`` in ``build_lora_mm``). A name without the ``.weight`` suffix gets ``.scale`` added.
    """
    return name[: -len(".weight")] + ".scale" if name.endswith(".weight") else name + ".scale"


class _Pairs(NamedTuple):
    scales: dict[str, tuple[str, np.ndarray]]  # NVFP4 weight -> (its scale tensor, the f32 scale, shape (1,))
    taken: set[str]  # scale tensors read into their weight, not yielded on their own
    notes: dict[str, str]  # why a scale tensor that is there was not applied (on the weight and the scale)


def _pairs(f: _File) -> _Pairs:
    """NVFP4 tensors with their per-tensor scale tensor; each scale read (4 bytes) and checked."""
    by_name = {t.name: t for t in f.tensors}
    out = _Pairs({}, set(), {})
    for t in f.tensors:
        if t.type_name != "NVFP4":
            continue
        sname = _scale_name(t.name)
        s = by_name.get(sname)
        if s is None or s is t or sname in out.taken:
            continue
        why = ""
        if s.type_name != "F32" or len(s.shape) > 1 or math.prod(s.shape) != 1:
            why = f"is {s.type_name} of shape {list(s.shape)}, not one F32 value"
        else:
            g = f.raw(s).view("<f4").astype(np.float32).reshape(1)
            if not (np.isfinite(g[0]) and g[0] > 0):
                why = f"holds {float(g[0])!r}, not a finite positive float32"
            else:
                out.scales[t.name] = (sname, g)
                out.taken.add(sname)
        if why:
            out.notes[t.name] = f"NVFP4 read single-level: its per-tensor scale tensor {sname!r} {why}, not applied"
            out.notes[sname] = f"read as a plain array: not applied as {t.name!r}'s NVFP4 per-tensor scale, it {why}"
    return out


def _read(f: _File, t: _Info, pairs: _Pairs, backend: str | None, device: Any) -> tuple[Any, str]:
    """One tensor as :func:`_value` gives it, an NVFP4 one with its per-tensor scale where it has one."""
    raw = f.raw(t)
    paired = pairs.scales.get(t.name)
    if paired is None:
        value, note = _value(raw, t, backend, device)
        extra = pairs.notes.get(t.name, "")
        return value, f"{note}; {extra}" if note and extra else note or extra
    sname, g = paired
    data = raw.reshape(_row_bytes(t.type_name, t.shape))
    qt, _ = _decode(data, t, backend, device, g)
    if qt is not None:
        return qt, f"NVFP4 with its per-tensor scale {sname} (llama.cpp layout)"
    floats, note = _value(raw, t, backend, device)  # blocks that are not exact: llama.cpp's values, scaled
    with np.errstate(all="ignore"):  # overflow gives inf, as ggml_mul does
        scaled = np.asarray(floats, np.float32) * g[0]
    return scaled, f"{note}; times its per-tensor scale {sname} (llama.cpp layout)"


def iter_tensors(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any, str]]:
    """Each tensor of a GGUF file in file order, one at a time, as NumPy data.

    Parameters
    ----------
    path : str or path-like
        The GGUF file.

    Yields
    ------
    tuple of (str, QuantizedTensor or numpy.ndarray, str)
        The name, the tensor (a QuantizedTensor where its type is exactly an arrayquant scheme,
        else an array) and a note: ``""``, or e.g. ``"Q4_K read as float32 values: ..."``.
        An NVFP4 tensor whose per-tensor scale is in the file as llama.cpp writes it (the F32
        tensor ``<name>.scale``, ``.weight`` replaced, holding one finite positive value) comes
        as one two-level ``nvfp4`` QuantizedTensor, and the scale tensor is not yielded on its
        own; a scale tensor that is not one such value is applied to nothing, and both notes say so.

    Raises
    ------
    CorruptDataError
        A file that is not GGUF, is truncated, or whose header lies about sizes or offsets.
    SchemeError
        A tensor of a type neither arrayquant nor gguf-py can turn into values (``Q8_1``, ...).
    """
    with _opened(path) as f:
        pairs = _pairs(f)
        for t in f.tensors:
            if t.name in pairs.taken:
                continue
            value, note = _read(f, t, pairs, "numpy", None)
            yield t.name, value, note


def load(path: str | os.PathLike[str], *, backend: str | None = None, device: Any = None) -> dict[str, Any]:
    """Every tensor of a GGUF file: QuantizedTensors where the type is exact, arrays for the rest.

    Parameters
    ----------
    path : str or path-like
        The GGUF file.
    backend, device
        Where the arrays go (default: the default backend, its default device).

    Returns
    -------
    dict of str to QuantizedTensor or array
        In file order. Types that are no arrayquant scheme come as float32 values (see
        :func:`iter_tensors` for the notes saying which); an NVFP4 tensor and its per-tensor
        scale tensor come as one two-level QuantizedTensor, as :func:`iter_tensors` says.

    Raises
    ------
    CorruptDataError, SchemeError
        As :func:`iter_tensors`.
    """
    name_ = backend or default().name
    same = name_.strip().lower() == "numpy" and device is None
    out: dict[str, Any] = {}
    with _opened(path) as f:
        pairs = _pairs(f)
        for t in f.tensors:
            if t.name in pairs.taken:
                continue
            value, _ = _read(f, t, pairs, name_, device)
            if not isinstance(value, QuantizedTensor) and not same:
                value = shim.convert(value, name_, device)
            out[t.name] = value
    return out


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Every key/value of a GGUF file as ``gguf.GGUFValue`` (value, type, item type), in file order.

    Scalars come as Python values and strings as ``str``; an array comes as a :class:`GGUFArray`,
    which reads as the list of its items (``==`` with a list, indexing, iteration, ``tolist()``)
    and, for numbers, ``np.asarray`` of it is a view of the stored items. Passed back to
    :func:`save` as ``metadata``, every value is written as it was read.

    Raises
    ------
    CorruptDataError
        As :func:`iter_tensors`, and a string that is not UTF-8.
    """
    with _opened(path) as f:
        return f.fields()


# ---------------------------------------------------------------------------------------------
# writing


def _writer_class() -> Any:
    g = _gguf()

    class Writer(g.GGUFWriter):  # type: ignore[name-defined]
        """gguf-py's writer, plus empty arrays (which GGUF allows and gguf-py refuses to write),
        :class:`GGUFArray` values written back as stored, and write errors that name the file."""

        target = Path()  # the file being written, for the messages

        def _pack_val(self, val: Any, vtype: Any, add_vtype: bool, sub_type: Any = None) -> bytes:
            if vtype == g.GGUFValueType.ARRAY and isinstance(val, GGUFArray) and sub_type in (None, val.item_type):
                head = self._pack("I", vtype) if add_vtype else b""
                return bytes(head + self._pack("I", val.item_type) + self._pack("Q", len(val))) + val.raw
            if vtype == g.GGUFValueType.ARRAY and sub_type is not None and len(val) == 0:
                head = self._pack("I", vtype) if add_vtype else b""
                return bytes(head + self._pack("I", sub_type) + self._pack("Q", 0))
            return bytes(super()._pack_val(val, vtype, add_vtype, sub_type))

        def write_tensor_data(self, tensor: np.ndarray, tensor_endianess: Any = None) -> None:
            with _named(self.target):  # the bytes are little-endian already: no byte swap
                super().write_tensor_data(_Chunk(tensor), self.endianess)

    return Writer


class _Chunk:
    """A tensor's bytes for gguf-py's ``write_tensor_data``, written with ``file.write``.

    gguf-py writes with ``ndarray.tofile``, whose error on a full disk has no errno and names no
    file ("1114112 requested and 887712 written"); ``file.write`` raises the system's error.
    """

    def __init__(self, data: np.ndarray) -> None:
        self.data, self.nbytes = np.ascontiguousarray(data), data.nbytes

    def tofile(self, f: Any) -> None:
        f.write(self.data.data.cast("B"))


def _write_error(e: OSError, target: Path) -> OSError:
    """The OSError of a failed write, naming ``target``; a full disk says so and what to do."""
    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
    what = os.strerror(e.errno) if e.errno else str(e)
    hint = "; free some space or write it elsewhere" if full else ""
    msg = f"{what} while writing this GGUF file, which was left as it was (the partial copy is removed){hint}"
    return OSError(e.errno, msg, str(target))


@contextmanager
def _named(target: Path) -> Iterator[None]:
    """Turn an OSError of writing ``target``'s temporary file, which names no file, into one naming ``target``."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        raise _write_error(e, target) from None


class _Out(NamedTuple):
    name: str
    type_name: str
    shape: tuple[int, ...]
    nbytes: int


def _nbytes(type_name: str, shape: tuple[int, ...]) -> int:
    block, size = _sizes(type_name)
    return math.prod(shape) // block * size


@contextmanager
def _writing(target: Path, arch: str, fields: Mapping[str, Any], plan: Sequence[_Out]) -> Iterator[Any]:
    """A gguf-py writer on a temporary file beside ``target`` with the header written; renamed at the end.

    ``fields`` are written in their order and are the only key/values (gguf-py's own
    ``general.architecture`` is replaced by the one in ``fields``, or dropped if it has none).
    The caller writes each tensor of ``plan`` in order with ``write_tensor_data``.
    """
    g = _gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    writer = None
    with _atomic.publishing(target) as (_, tmp):  # gguf-py opens the file by its path itself
        try:
            writer = _writer_class()(str(tmp), arch)
            writer.target = target
            kv = writer.kv_data[0]
            kv.clear()
            for key, v in fields.items():
                kv[key] = g.GGUFValue(v.value, v.type, v.sub_type)
            align = fields.get(_ALIGN_KEY)
            if align is not None:
                writer.data_alignment = int(align.value)
            for o in plan:
                kind = g.GGMLQuantizationType[o.type_name]
                writer.add_tensor_info(o.name, o.shape, np.dtype(np.float32), o.nbytes, kind)
            with _named(target):
                writer.write_header_to_file()
                try:
                    writer.write_kv_data_to_file()
                except (struct.error, ValueError, TypeError) as e:  # a value that does not fit its GGUF type
                    msg = f"the metadata cannot be written as GGUF: {e}"
                    raise ParamsError(msg) from None
                writer.write_ti_data_to_file()
            yield writer
            with _named(target):
                for out in writer.fout:
                    _atomic.sync(out)
                writer.close()
        except BaseException:
            if writer is not None:
                with contextlib.suppress(OSError):  # closing flushes, and on a full disk fails again
                    writer.close()
            raise


def _check_alignment(align: Any) -> None:
    """Refuse a ``general.alignment`` that llama.cpp (a power of two) or arrayquant (at most 64 KiB) does not read."""
    if align is None:
        return
    g = _gguf()
    if (
        align.type != g.GGUFValueType.UINT32
        or not isinstance(align.value, int)
        or align.value <= 0
        or align.value & (align.value - 1)
    ):
        msg = f"metadata {_ALIGN_KEY!r} must be a UINT32 power of two, got {align.value!r}"
        raise ParamsError(msg)
    if align.value > MAX_ALIGNMENT:
        msg = (
            f"metadata {_ALIGN_KEY!r} is {align.value}; alignments up to {MAX_ALIGNMENT} (a 64 KiB page) are written "
            f"and read, as every tensor is padded with up to that many zero bytes; use {MAX_ALIGNMENT} or less"
        )
        raise ParamsError(msg)


def _metadata_value(key: str, value: Any) -> Any:
    """A GGUFValue for a metadata value: as given, or typed the way llama.cpp's converters type it."""
    g = _gguf()
    t = g.GGUFValueType
    if isinstance(value, g.GGUFValue):
        return value
    if isinstance(value, GGUFArray):  # an array from read_metadata, without its GGUFValue
        return g.GGUFValue(value, t.ARRAY, t(value.item_type))
    if isinstance(value, (bool, np.bool_)):
        return g.GGUFValue(bool(value), t.BOOL)
    if isinstance(value, np.generic) and value.dtype.kind in "iuf":
        by_dtype = {
            "int8": t.INT8,
            "uint8": t.UINT8,
            "int16": t.INT16,
            "uint16": t.UINT16,
            "int32": t.INT32,
            "uint32": t.UINT32,
            "int64": t.INT64,
            "uint64": t.UINT64,
            "float32": t.FLOAT32,
            "float64": t.FLOAT64,
        }
        if value.dtype.name in by_dtype:
            return g.GGUFValue(value.item(), by_dtype[value.dtype.name])
    if isinstance(value, int):
        return g.GGUFValue(value, _int_type(key, [value]))
    if isinstance(value, float):
        return g.GGUFValue(value, t.FLOAT32)  # llama.cpp reads float hyperparameters as FLOAT32
    if isinstance(value, str):
        return g.GGUFValue(value, t.STRING)
    if isinstance(value, (list, tuple)):
        items = list(value)
        if not items:
            msg = f"metadata {key!r}: an empty list has no item type; give a gguf.GGUFValue with sub_type"
            raise ParamsError(msg)
        if all(isinstance(v, str) for v in items):
            return g.GGUFValue(items, t.ARRAY, t.STRING)
        if all(isinstance(v, bool) for v in items):
            return g.GGUFValue(items, t.ARRAY, t.BOOL)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            return g.GGUFValue(items, t.ARRAY, _int_type(key, items, signed=True))
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
            return g.GGUFValue([float(v) for v in items], t.ARRAY, t.FLOAT32)
        msg = f"metadata {key!r}: a list must hold only str, only bool, only int or only numbers"
        raise ParamsError(msg)
    msg = (
        f"metadata {key!r}: {type(value).__name__} has no GGUF value type; "
        "use str, bool, int, float, a list of one of those, or a gguf.GGUFValue"
    )
    raise ParamsError(msg)


def _int_type(key: str, values: Sequence[int], signed: bool = False) -> Any:
    """UINT32 as llama.cpp's converters write counts (INT32 for lists, like token types), wider if needed."""
    t = _gguf().GGUFValueType
    lo, hi = min(values), max(values)
    if signed and lo >= -(2**31) and hi < 2**31:
        return t.INT32
    if not signed and lo >= 0 and hi < 2**32:
        return t.UINT32
    if lo >= -(2**31) and hi < 2**31:
        return t.INT32
    if lo >= -(2**63) and hi < 2**63:
        return t.INT64
    if lo >= 0 and hi < 2**64:
        return t.UINT64
    msg = f"metadata {key!r}: {lo if lo < 0 else hi} does not fit a 64-bit integer"
    raise ParamsError(msg)


def _exact_list() -> str:
    rows = []
    for name in gguf_types.EXACT:
        scheme = gguf_types.scheme_of(name)
        rows.append(f"{name} ({scheme})" if scheme is not None else name)
    return ", ".join(rows)


def _folds(qt: QuantizedTensor) -> bool:
    """Whether a two-level nvfp4 tensor's per-tensor scale folds exactly into its UE4M3 block scales.

    The same check :func:`gguf_types.encode` makes, on the scales alone (1/16 of the values).
    """
    glob = np.asarray(shim.to_host(qt.global_scale)).astype(np.float32).reshape(1)
    try:
        gguf_types._fold(np.asarray(shim.to_host(qt.scales)).astype(np.float32), float(glob[0]))
    except SchemeError:
        return False
    return True


def _tensor_out(name: str, value: Any) -> list[tuple[_Out, Callable[[], np.ndarray]]]:
    """What one tensor becomes in the file, and how to get its bytes when its turn comes.

    One entry, or two for a two-level nvfp4 tensor whose per-tensor scale does not fold into
    its block scales: the NVFP4 blocks, then the scale as the F32 tensor llama.cpp names for it.
    """
    if not isinstance(name, str) or not name:
        msg = f"GGUF tensor names are non-empty strings, got {name!r}"
        raise ShapeError(msg)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        msg = f"tensor name {name!r} is not valid Unicode text (a lone surrogate), which GGUF cannot hold; rename it"
        raise ShapeError(msg) from None
    if isinstance(value, QuantizedTensor):
        type_name = gguf_types.type_of(value.scheme)
        if type_name is None:
            msg = f"tensor {name!r}: scheme {value.scheme} has no GGUF type; GGUF holds exactly {_exact_list()}"
            raise SchemeError(msg)
        shape = tuple(int(n) for n in value.shape)
        block = _sizes(type_name)[0]
        if not shape or shape[-1] % block:
            msg = f"tensor {name!r}: {type_name} needs rows of whole {block}-value blocks, the shape is {list(shape)}"
            raise ShapeError(msg)

        out = _Out(name, type_name, shape, _nbytes(type_name, shape))
        if type_name == "NVFP4" and value.global_scale is not None and not _folds(value):
            glob = np.asarray(shim.to_host(value.global_scale)).astype("<f4").reshape(1)

            def blocks() -> np.ndarray:
                _, data, _ = gguf_types.encode_split(value)
                return np.ascontiguousarray(np.asarray(data, np.uint8))

            return [(out, blocks), (_Out(_scale_name(name), "F32", (1,), 4), lambda: glob.view(np.uint8))]

        def encoded() -> np.ndarray:
            _, data = gguf_types.encode(value)
            return np.ascontiguousarray(np.asarray(data, np.uint8))

        return [(out, encoded)]
    arr = shim.to_host(value) if not isinstance(value, np.ndarray) else value
    type_name_ = _ARRAY_TYPES.get(arr.dtype.name)
    if type_name_ is None:
        msg = (
            f"tensor {name!r}: GGUF holds arrays of {', '.join(sorted(_ARRAY_TYPES))}, not {arr.dtype.name}; "
            "convert it first"
        )
        raise DTypeError(msg)
    if arr.ndim > _MAX_DIMS:
        msg = f"tensor {name!r} has {arr.ndim} dimensions; GGUF tensors have at most {_MAX_DIMS}"
        raise ShapeError(msg)
    little = arr.astype(arr.dtype.newbyteorder("<"), copy=False) if arr.dtype.byteorder == ">" else arr
    return [(_Out(name, type_name_, tuple(arr.shape), arr.nbytes), lambda: np.ascontiguousarray(little).view(np.uint8))]


def save(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    *,
    metadata: Mapping[str, Any] | None = None,
    arch: str | None = None,
) -> None:
    """Write tensors to a GGUF file, atomically (a temporary file renamed into place).

    Parameters
    ----------
    path : str or path-like
        The output file; replaced if it exists.
    tensors : mapping of str to QuantizedTensor or array
        QuantizedTensors of a scheme GGUF holds exactly (``Q8_0``, ``Q4_0``, ``MXFP4``, ...: see
        :mod:`arrayquant.io.gguf_types`), written as that type; arrays of float32, float16,
        bfloat16, float64 or int8 ... int64, written as ``F32``, ``F16``, ``BF16``, ...
        A two-level ``nvfp4`` tensor is ``NVFP4`` with its per-tensor scale folded into the
        block scales where that is exact; otherwise, as llama.cpp stores it, ``NVFP4`` followed
        by the per-tensor scale as the F32 tensor of shape (1,) ``<name>.scale`` (``.weight``
        replaced: ``blk.0.attn_q.weight`` -> ``blk.0.attn_q.scale``), which :func:`iter_tensors`
        and :func:`load` read back into the one two-level tensor.
    metadata : mapping of str to value, optional
        Key/values, in order after ``general.architecture``. A ``gguf.GGUFValue`` is written
        with its type; a Python value is typed as llama.cpp's converters do: int as UINT32
        (INT32/INT64/UINT64 where it does not fit), float as FLOAT32, str, bool, and lists of
        one of those (int lists as INT32).
    arch : str, optional
        ``general.architecture``; default: the one in ``metadata``, else ``"arrayquant"``.

    Raises
    ------
    SchemeError
        A QuantizedTensor whose scheme has no GGUF type (the message lists those that have one).
    DTypeError
        An array of another dtype (bool, uint8, fp8, ...).
    ShapeError
        More than four dimensions, rows that are not whole blocks of the GGUF type, a tensor
        name that is not valid Unicode, or an nvfp4 per-tensor scale tensor whose name is that
        of another tensor.
    ParamsError
        A metadata value with no GGUF type, a key gguf-py reserves (``GGUF.*``) or longer than
        :data:`MAX_KEY_BYTES`, or a ``general.alignment`` that is no power of two up to
        :data:`MAX_ALIGNMENT`.
    OSError
        The file cannot be written (a full disk, say); the error names ``path``, which is left
        as it was.
    """
    target = Path(path)
    g = _gguf()
    fields: dict[str, Any] = {}
    given = dict(metadata or {})
    arch_value = given.pop(_ARCH_KEY, None)
    arch_name = arch if arch is not None else (arch_value.value if isinstance(arch_value, g.GGUFValue) else arch_value)
    fields[_ARCH_KEY] = g.GGUFValue(str(arch_name or "arrayquant"), g.GGUFValueType.STRING)
    for key, value in given.items():
        if not isinstance(key, str) or not key or key.startswith("GGUF."):
            msg = f"metadata key {key!r}: keys are non-empty strings, and GGUF.* names gguf-py's own entries"
            raise ParamsError(msg)
        if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:  # what reading refuses
            msg = f"metadata key {key[:40]!r}... is longer than GGUF's {MAX_KEY_BYTES} bytes for a key; shorten it"
            raise ParamsError(msg)
        fields[key] = _metadata_value(key, value)
    _check_alignment(fields.get(_ALIGN_KEY))
    outs: list[tuple[_Out, Callable[[], np.ndarray]]] = []
    scale_names: set[str] = set()
    for name, value in tensors.items():
        these = _tensor_out(name, value)
        for o, _ in these[1:]:  # an nvfp4 per-tensor scale tensor, named after its weight
            if o.name in tensors or o.name in scale_names:
                msg = (
                    f"tensor {name!r}: its nvfp4 per-tensor scale goes in the F32 tensor {o.name!r} "
                    "(llama.cpp's layout: '.weight' -> '.scale'), which is also the name of another tensor; "
                    "rename one"
                )
                raise ShapeError(msg)
            scale_names.add(o.name)
        outs.extend(these)
    with _writing(target, fields[_ARCH_KEY].value, fields, [o for o, _ in outs]) as writer:
        for o, data in outs:
            _write(writer, o, data())


def _write(writer: Any, o: _Out, data: np.ndarray) -> None:
    if data.nbytes != o.nbytes:
        msg = (
            f"tensor {o.name!r}: {data.nbytes} bytes of {o.type_name} where its shape {list(o.shape)} needs {o.nbytes}"
        )
        raise ShapeError(msg)
    writer.write_tensor_data(data.reshape(-1))


# ---------------------------------------------------------------------------------------------
# re-quantizing


@dataclass
class GGUFSummary:
    """What :func:`quantize_file` did: the tensors quantized, and every multi-dimensional one not, with why."""

    type_name: str  # the GGUF type written
    quantized: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    format: str = NAME
    # tensors whose rows the type cannot hold, quantized (or converted) to llama-quantize's fallback type
    fallback: dict[str, str] = field(default_factory=dict)


def _target(scheme: QuantScheme | str) -> tuple[QuantScheme, str]:
    if isinstance(scheme, str) and scheme.strip().upper() == "TQ1_0":  # TQ2_0's scheme, in base-3 packing
        return _target("TQ2_0")[0], "TQ1_0"
    if isinstance(scheme, str):
        text = scheme.strip()
        if text.upper() in gguf_types.EXACT:
            exact = gguf_types.scheme_of(text.upper())
            if exact is None:
                msg = f"GGUF type {text.upper()} is not available as a scheme; GGUF holds exactly {_exact_list()}"
                raise SchemeError(msg)
            scheme = exact
        else:
            scheme = QuantScheme.parse(text)
    if not isinstance(scheme, QuantScheme):
        msg = f"scheme must be a QuantScheme or its text, got {type(scheme).__name__}"
        raise SchemeError(msg)
    type_name = gguf_types.type_of(scheme)
    if type_name is None:
        msg = f"scheme {scheme} has no GGUF type; GGUF holds exactly {_exact_list()}"
        raise SchemeError(msg)
    return scheme, type_name


def _ggml_rank(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: the rank without GGML's trailing (NumPy's leading) extents of 1."""
    rank = len(shape)
    while rank > 1 and shape[len(shape) - rank] == 1:
        rank -= 1
    return max(rank, 1)


def _why_kept(t: _Info, type_name: str, include: Sequence[str], exclude: Sequence[str]) -> str | None:
    """Why llama-quantize's rules (or the globs) leave this tensor as it is, or None to quantize it."""
    if not t.name.endswith("weight"):
        return "not a weight (llama-quantize quantizes tensors whose names end in 'weight')"
    if _ggml_rank(t.shape) < 2:
        return "1-d (llama-quantize quantizes 2-d and 3-d weights only)"
    for part in _KEPT:
        if part in t.name:
            return f"llama-quantize keeps '*{part}*' tensors as they are"
    if include and not any(fnmatch.fnmatchcase(t.name, p) for p in include):
        return "not selected by --include/--exclude"
    if any(fnmatch.fnmatchcase(t.name, p) for p in exclude):
        return "not selected by --include/--exclude"
    if t.type_name == type_name:
        return f"already {type_name}, copied unchanged"
    if t.type_name not in _FLOAT_SOURCES:
        return f"already quantized as {t.type_name}; llama-quantize does not re-quantize by default, copied unchanged"
    if 0 in t.shape:  # nothing to quantize, and a quantized tensor has at least one value per axis
        return f"has no values (shape {list(t.shape)}); kept as {t.type_name}"
    return None


# llama-quantize's tensor_type_fallback (src/llama-quant.cpp) for the types written here: a tensor whose
# rows are not whole blocks gets this type instead, and F16 where that does not fit either
_FALLBACK = {"TQ1_0": "Q4_0", "TQ2_0": "Q4_0"}


def _fallback(t: _Info, type_name: str) -> tuple[str, str]:
    """The type ``t`` is written as (``type_name`` where its rows are whole blocks), or ("", why it is kept)."""
    cols = t.shape[-1]
    block = _sizes(type_name)[0]
    if cols % block == 0:
        return type_name, ""
    if type_name == "NVFP4":  # llama-quantize stops with "no tensor type fallback is defined"
        return "", f"rows of {cols} values are not whole NVFP4 blocks of 64, and NVFP4 has no fallback type; kept"
    other = _FALLBACK.get(type_name, "F16")
    if other != "F16" and cols % _sizes(other)[0]:
        other = "F16"
    if other == "F16" and t.type_name not in ("F32", "F16"):  # bf16 / f64 would overflow or lose range in f16
        return "", f"rows of {cols} values are not whole {type_name} blocks of {block}; kept as {t.type_name}"
    return other, ""


def _file_type(type_name: str) -> int | None:
    lft = _gguf().LlamaFileType
    special = {"F32": "ALL_F32", "MXFP4": "MOSTLY_MXFP4_MOE"}
    member = getattr(lft, special.get(type_name, f"MOSTLY_{type_name}"), None)
    return None if member is None else int(member)


_SLAB_BYTES = 2 << 20  # float32 bytes of the rows quantized at a time


def _encoded_rows(f: _File, t: _Info, scheme: QuantScheme, type_name: str, **search: Any) -> np.ndarray:
    """The GGUF bytes of float tensor ``t`` quantized with a one-level ``scheme``, a slab of rows at a time.

    GGUF's block types block the last axis only, so rows are independent: each slab is read,
    quantized and encoded alone, and only the encoded tensor is ever whole in memory. The bytes
    are those of quantizing and encoding the whole tensor at once (a search calibration, in
    ``search``, looks at one block at a time too).
    """
    cols, rows = t.shape[-1], math.prod(t.shape[:-1])  # quantized tensors have two or more axes
    row_in = t.nbytes // max(rows, 1)
    row_out = _nbytes(type_name, (1, cols))
    out = np.empty((rows, row_out), np.uint8)
    step = max(1, _SLAB_BYTES // (4 * cols))
    for start in range(0, rows, step):
        n = min(step, rows - start)
        slab = t._replace(shape=(n, cols), start=t.start + start * row_in, nbytes=n * row_in)
        values, _ = _value(f.raw(slab), slab, "numpy", None)
        got, data = gguf_types.encode(quantize(values, scheme, **search), type_name)
        if got != type_name:  # pragma: no cover - type_of and encode agree by construction
            msg = f"tensor {t.name!r}: encoded as {got}, planned as {type_name}"
            raise SchemeError(msg)
        out[start : start + n] = np.asarray(data, np.uint8).reshape(n, row_out)
    return out.reshape(-1)


def _f16_rows(f: _File, t: _Info) -> np.ndarray:
    """Float tensor ``t`` as F16 bytes, a slab of rows at a time (llama-quantize's last fallback)."""
    cols, rows = t.shape[-1], math.prod(t.shape[:-1])
    row_in = t.nbytes // max(rows, 1)
    out = np.empty((rows, 2 * cols), np.uint8)
    step = max(1, _SLAB_BYTES // (4 * cols))
    for start in range(0, rows, step):
        n = min(step, rows - start)
        slab = t._replace(shape=(n, cols), start=t.start + start * row_in, nbytes=n * row_in)
        values, _ = _value(f.raw(slab), slab, "numpy", None)
        with np.errstate(over="ignore"):
            half = np.asarray(values).astype("<f2")
        if not np.all(np.isfinite(half)):
            msg = (
                f"tensor {t.name!r}: llama-quantize's fallback for rows of {cols} values is F16, and a value "
                "there is beyond F16's range (65504); exclude the tensor with --exclude to keep it as it is"
            )
            raise ShapeError(msg)
        out[start : start + n] = half.view(np.uint8).reshape(n, 2 * cols)
    return out.reshape(-1)


def quantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    scheme: QuantScheme | str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
    calibration: Any = None,
    importance: Mapping[str, Any] | None = None,
) -> GGUFSummary:
    """Re-quantize a GGUF file into another, as ``llama-quantize`` does, tensor by tensor.

    Every key/value is kept, in order (architecture, tokenizer, chat template, ...); where a
    tensor is quantized, ``general.file_type`` and ``general.quantization_version`` are set as
    llama-quantize sets them. Every tensor keeps its name, order and shape. The weights
    llama-quantize quantizes are quantized: names ending in ``weight``, of 2 or more dimensions
    (not counting GGML's trailing 1s), except norms, MoE routers and the other small tensors it
    keeps (see ``_KEPT``). Like llama-quantize's ``--pure``, every such weight gets the one
    type asked for, ``token_embd`` and ``output`` included (without ``--pure`` llama-quantize
    picks other types, such as Q6_K, for some; those are no arrayquant schemes). Tensors that
    are quantized already are copied unchanged (llama-quantize refuses to re-quantize without
    ``--allow-requantize``), as are weights with no values (an extent of 0, which GGUF allows):
    there is nothing to quantize, and a quantized tensor that :func:`load` reads back needs at
    least one value per axis. A weight whose rows are not whole blocks of the type gets
    llama-quantize's fallback type (``tensor_type_fallback``): Q4_0 for TQ1_0 / TQ2_0, F16 where
    that does not fit either or for the 32-blocks; NVFP4 has none, so such a weight is kept.

    By default (``calibration=None``) each block is quantized by ggml's reference quantizer,
    ``calibration="ggml"``, so the bytes are llama-quantize's (without an imatrix) bit for bit;
    the two-level ``nvfp4``, which ggml has no quantizer for, uses ``"minmax"``. Any other
    calibration of :func:`arrayquant.quantize` may be named instead.

    The header is written first, then each tensor's data, read, quantized and written one at a
    time: memory stays near a few copies of the largest tensor. The output is a temporary file
    renamed over ``dst`` at the end.

    Parameters
    ----------
    src, dst : path
        The GGUF file to read and the one to write (may be the same).
    scheme : QuantScheme or str
        A scheme with a GGUF type, by arrayquant name or GGUF name (``"q8_0"``, ``"mxfp4"``). A GGUF
        name wins over an arrayquant name spelled the same: ``"nvfp4"`` is GGUF's single-level
        NVFP4 (``e2m1:block16:ue4m3``), since GGUF blocks have no per-tensor scale. The two-level
        nvfp4, ``QuantScheme.nvfp4()`` or its text ``"e2m1:block16:ue4m3:tensor:f32:packed_native"``,
        is written as llama.cpp's converter writes NVFP4 checkpoints: each weight as ``NVFP4``
        blocks followed by its per-tensor scale, the F32 tensor of shape (1,) ``<name>.scale``
        (``.weight`` replaced); a weight whose scale name the file already has is kept as it is.
        ``general.file_type`` is ``MOSTLY_NVFP4`` either way, as llama.cpp sets it.
    include, exclude : sequence of str
        Globs on tensor names narrowing the weights quantized.
    progress : callable, optional
        Called with each tensor's name once it is written (per-tensor scale tensors included).
    calibration : str, optional
        ``"ggml"`` (the default where ggml has a quantizer), or another calibration by name.
    importance : mapping of str to array, optional
        Per-column importance by tensor name, for a search calibration (``"mse"``).

    Returns
    -------
    GGUFSummary

    Raises
    ------
    SchemeError
        A scheme with no GGUF type (the message lists those that have one).
    CorruptDataError
        ``src`` is not a sound GGUF file (see the limits in this module's description).
    OSError
        ``dst`` cannot be written (a full disk, say); the error names it, and it is left as it was.
    """
    scheme_, type_name = _target(scheme)
    split = type_name == "NVFP4" and scheme_.tensor is not None  # two-level: blocks + F32 '<name>.scale'
    g = _gguf()
    with _opened(src) as f:
        fields = f.fields()
        arch = fields.get(_ARCH_KEY)
        summary = GGUFSummary(type_name)
        names = {t.name for t in f.tensors}  # with the scale tensors planned so far: a scale may not clash
        # (source tensor, what is written, "quantize" / "copy"; or None, the F32 scale, "scale")
        plan: list[tuple[_Info | None, _Out, str]] = []
        for t in f.tensors:
            why = _why_kept(t, type_name, include, exclude)
            sname = _scale_name(t.name)
            if why is None and split and sname in names:
                why = (
                    f"its nvfp4 per-tensor scale would go in {sname!r} (llama.cpp's '.weight' -> '.scale'), "
                    f"a name the file already has; kept as {t.type_name}"
                )
            kind = type_name
            if why is None:
                kind, why = _fallback(t, type_name)
                why = why or None
            if why is None and kind != type_name:
                summary.fallback[t.name] = kind
                action = "f16" if kind == "F16" else "quantize"
                plan.append((t, _Out(t.name, kind, t.shape, _nbytes(kind, t.shape)), action))
                if kind != "F16":
                    summary.quantized.append(t.name)
            elif why is None:
                plan.append((t, _Out(t.name, type_name, t.shape, _nbytes(type_name, t.shape)), "quantize"))
                summary.quantized.append(t.name)
                if split:
                    plan.append((None, _Out(sname, "F32", (1,), 4), "scale"))
                    names.add(sname)
            else:
                plan.append((t, _Out(t.name, t.type_name, t.shape, t.nbytes), "copy"))
                if _ggml_rank(t.shape) >= 2:
                    summary.left_out[t.name] = why
        ftype = _file_type(type_name)
        if summary.quantized and ftype is not None:
            fields[_FTYPE_KEY] = g.GGUFValue(ftype, g.GGUFValueType.UINT32)
            fields[_QVERSION_KEY] = g.GGUFValue(_QNT_VERSION, g.GGUFValueType.UINT32)
        with _writing(Path(dst), arch.value if arch is not None else "", fields, [o for _, o, _ in plan]) as writer:
            glob: np.ndarray | None = None  # the per-tensor scale of the tensor just written, if split
            for src_t, o, action in plan:
                if src_t is None:  # the F32 scale tensor right after its NVFP4 weight
                    if glob is None:  # pragma: no cover - encode_split gives a two-level tensor's scale
                        msg = f"tensor {o.name!r}: no per-tensor scale came with its weight"
                        raise SchemeError(msg)
                    _write(writer, o, np.ascontiguousarray(glob.astype("<f4").reshape(1)).view(np.uint8))
                    glob = None
                    if progress is not None:
                        progress(o.name)
                    continue
                t = src_t
                if action == "f16":
                    _write(writer, o, _f16_rows(f, t))
                elif action == "quantize" and (not split or o.type_name != type_name):  # a slab at a time
                    kind_scheme = scheme_ if o.type_name == type_name else gguf_types.scheme_of(o.type_name)
                    assert kind_scheme is not None
                    cal = "ggml" if calibration is None else calibration
                    found = search_arguments(cal, importance, t.name)
                    _write(writer, o, _encoded_rows(f, t, kind_scheme, o.type_name, **found))
                elif action == "quantize":  # the per-tensor scale needs the whole tensor
                    raw = f.raw(t)
                    values, _ = _value(raw, t, "numpy", None)
                    del raw
                    # f16/bf16 are computed in f32 by quantize, a slab at a time; ggml has no two-level rule
                    cal = "minmax" if calibration is None else calibration
                    qt = quantize(values, scheme_, **search_arguments(cal, importance, t.name))
                    del values
                    # as llama.cpp stores it: blocks as they are, the scale apart
                    got, data, glob = gguf_types.encode_split(qt)
                    del qt
                    if got != type_name:  # pragma: no cover - type_of and encode agree by construction
                        msg = f"tensor {t.name!r}: encoded as {got}, planned as {type_name}"
                        raise SchemeError(msg)
                    _write(writer, o, np.ascontiguousarray(np.asarray(data, np.uint8)))
                else:
                    raw = f.raw(t)
                    _write(writer, o, raw)
                    del raw
                if progress is not None:
                    progress(o.name)
    return summary
