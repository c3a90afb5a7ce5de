"""GGUF key/values: where each lies, its value decoded, and Python values typed for writing.

The header walk (:mod:`arrayquant.io.gguf.container`) notes where each key/value lies (:class:`KV`)
and checks it; :func:`decode_value` turns one into a ``gguf.GGUFValue`` when asked for, an array
as a :class:`GGUFArray`, a view of its stored bytes, so metadata costs about its size in memory.
:func:`metadata_value` types a Python value the way llama.cpp's converters type it, for writing.
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload

import numpy as np

from ...errors import ParamsError
from .ggml import gguf_py

__all__ = [
    "ALIGN_KEY",
    "ARCH_KEY",
    "ARRAY",
    "BOOL",
    "FTYPE_KEY",
    "KV",
    "QVERSION_KEY",
    "SCALAR_SIZE",
    "STRING",
    "U64",
    "UINT32",
    "GGUFArray",
    "decode_value",
    "metadata_value",
]

ARCH_KEY = "general.architecture"
ALIGN_KEY = "general.alignment"
FTYPE_KEY = "general.file_type"
QVERSION_KEY = "general.quantization_version"
# GGUF value type ids (gguf.GGUFValueType) -> bytes of one value; 8: string, 9: array
SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32, BOOL = 8, 9, 4, 7
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
U64 = struct.Struct("<Q")


class KV(NamedTuple):
    """Where one key/value lies in the file; its value is decoded only when asked for."""

    key: str
    vtype: int
    itype: int  # an array's item type, else -1
    items: int  # an array's length, else 1
    start: int  # the value's first byte: a string's text, an array's first item
    end: int


class GGUFArray(Sequence[Any]):
    """A GGUF metadata array as stored: its bytes, with items decoded only when asked for.

    :func:`~arrayquant.io.gguf.read_metadata` gives arrays as this read-only sequence, so that a
    file's metadata costs about its size in memory whatever it holds (a Python list costs 8 to 60
    bytes per item). It behaves as the list it stands for: ``len``, indexing and slicing (Python
    ints, floats, bools or strs), iteration, and ``==`` with a list; ``tolist()`` gives that list,
    and for numbers ``np.asarray(a)`` is a read-only NumPy view of the stored little-endian items
    (for bools, a bool array: nonzero bytes are true, as in llama.cpp).
    :func:`~arrayquant.io.gguf.save` and :func:`~arrayquant.io.gguf.quantize_file` write it back
    byte for byte.
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
        return view != 0 if self.item_type == BOOL else view

    def _text(self, at: int) -> str:
        n = U64.unpack_from(self._raw, at)[0]
        return str(self._raw[at + 8 : at + 8 + n], "utf-8")

    def _string_starts(self) -> np.ndarray:
        if self._starts is None:
            starts, at, unpack = np.empty(self._len, np.int64), 0, U64.unpack_from
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
        if self.item_type == STRING:
            return self._text(int(self._string_starts()[i]))
        item = self._view()[i]
        return bool(item) if self.item_type == BOOL else item.item()

    def __iter__(self) -> Iterator[Any]:
        if self.item_type != STRING:
            numbers = self._numbers()
            for start in range(0, self._len, 1 << 16):  # a chunk of Python objects at a time
                yield from numbers[start : start + (1 << 16)].tolist()
            return
        at = 0
        for _ in range(self._len):
            text = self._text(at)
            at += 8 + U64.unpack_from(self._raw, at)[0]
            yield text

    def tolist(self) -> list[Any]:
        """The items as a Python list, as gguf-py's ``ReaderField.contents()`` gives them."""
        return self._numbers().tolist() if self.item_type != STRING else list(self)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self._numbers() if self.item_type != STRING else np.array(self.tolist(), dtype=object)
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
        return f"GGUFArray({gguf_py().GGUFValueType(self.item_type).name}, {shown!r}{more})"


def decode_value(kv: KV, blob: memoryview) -> Any:
    """One key/value as a ``gguf.GGUFValue``: scalars and strings decoded, arrays as :class:`GGUFArray`."""
    g = gguf_py()
    vtype = g.GGUFValueType(kv.vtype)
    if kv.vtype == ARRAY:
        items = GGUFArray(blob[kv.start : kv.end], kv.itype, kv.items)
        return g.GGUFValue(items, vtype, g.GGUFValueType(kv.itype))
    if kv.vtype == STRING:  # checked to be UTF-8 by the walk
        return g.GGUFValue(str(blob[kv.start : kv.end], "utf-8"), vtype)
    return g.GGUFValue(struct.unpack_from(_SCALAR_FORMAT[kv.vtype], blob, kv.start)[0], vtype)


def metadata_value(key: str, value: Any) -> Any:
    """A GGUFValue for a metadata value: as given, or typed the way llama.cpp's converters type it."""
    g = gguf_py()
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
    t = gguf_py().GGUFValueType
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
