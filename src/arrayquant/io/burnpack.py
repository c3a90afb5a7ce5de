"""Burnpack (``.bpk``), Burn's own model file: read and written as Burn lays it out.

Verified against Burn's source at tracel-ai/burn commit ``2c06be351006851d42fdb6df16b976f4a82d9747``
(2026-08-21, burn 0.22.0-pre.2):

- ``crates/burn-pack/src/base.rs``: the constants, ``Header``, ``Metadata``, ``TensorDescriptor``
  and ``Scalar``; ``crates/burn-pack/src/reader.rs`` (the limits it enforces) and
  ``crates/burn-pack/src/writer.rs`` (the layout it writes);
- ``crates/burn-std/src/tensor/dtype.rs``: ``DType`` and ``BoolStore``;
- ``crates/burn-std/src/tensor/quantization.rs``: a quantized tensor's bytes
  (``QuantizedBytes::new``, ``quantized_data_len``: values, block scales, f32 per-tensor scale,
  dense), which is :func:`arrayquant.to_bytes`;
- the ``QuantScheme`` serde of ``cubecl-common``, at the tracel-ai/cubecl revision Burn pins there,
  ``48348968468e433235be3db6e7c344c34bc446c0``: ``crates/cubecl-common/src/quant/scheme.rs``.

Layout. A 10-byte little-endian header: magic ``u32 0x4255524E`` (``b"NRUB"`` on disk),
version ``u16 1``, ``metadata_size u32``; then ``metadata_size`` bytes of CBOR metadata (serde's
encoding, as ``ciborium`` writes it)::

    {"tensors": {name: {"dtype": DType, "shape": [u64, ...], "data_offsets": [start, end],
                        "param_id": u64 (left out when absent)}},
     "metadata": {str: str} (left out when empty), "scalars": {str: Scalar} (left out when empty)}

with ``tensors`` sorted by name (a Rust ``BTreeMap``: by UTF-8 bytes); then zeros up to the next
multiple of 256, where the data section starts. Each tensor's ``[start, end)`` is relative to the
data section, ``start`` a multiple of 256; the data is written in the writer's order, padded with
zeros, and the file ends at the last tensor's end. A ``DType`` is a string (``"F32"``, ``"BF16"``,
``"I64"``, ``"U8"``, ``"Flex32"``, ...) or a one-entry map: ``{"Bool": "Native" | "U8" | "U32"}``,
``{"QFloat": QuantScheme}``. A ``Scalar`` is ``{"Int": i64}``, ``{"UInt": u64}``,
``{"Float": f64}`` or ``{"Bool": bool}``. The metadata is written with ciborium's choices
(``ciborium/src/ser/mod.rs``, ``ciborium-ll/src/hdr.rs``): structs as definite-length maps in
field order, unit variants as text, newtype variants as one-entry maps, ``None`` as null, each
integer and float in its narrowest encoding.

Reading gives a :class:`~arrayquant.QuantizedTensor` for QFloat tensors (its bytes through
:func:`arrayquant.from_bytes`) and NumPy arrays for the rest (``Flex32`` as float32, ``Bool``
of any store as bool, notes saying so from :func:`iter_tensors`); param ids, metadata and
scalars come with :func:`read_burnpack` and are kept by :func:`quantize_file`.

QFloat encoding. This module reads and writes the ``QuantScheme`` encoding of cubecl
``1e735584a`` (2026-08-19, "Replace QuantLevel with per-tensor and per-block scale levels"),
current at the Burn commit above::

    {"value": "Q8F" | "Q8S" | "Q4F" | "Q4S" | "Q2F" | "Q2S" | "E4M3" | "E5M2" | "E2M1",
     "store": "Native" | {"PackedU32": dim} | {"PackedNative": dim},
     "mode": "Symmetric",
     "tensor": null | ScaleDtype,
     "block": null | {"size": {"storage": [u8; 5], "len": u8}, "dtype": ScaleDtype}}

(``ScaleDtype``: ``"F32"``, ``"F16"``, ``"BF16"``, ``"UE8M0"``, ``"UE4M3"``). A block size is
written canonically, as ``BlockSize::new`` makes it: leading 1s dropped, the extents first in
``storage``, unused slots 1 (``[1, 32]`` is ``{"storage": [32, 1, 1, 1, 1], "len": 1}``). The
encoding before that commit (``{"value", "param", "store", "level", "mode"}``) changed without
a format version bump; Burn's own reader would take such a scheme as per-tensor F32 (serde
fills the missing ``tensor``/``block`` with ``None``), so it, and any other key set, is refused
here with a :class:`~arrayquant.errors.SchemeError` that says which encoding is read.
``"Lookup"`` mode is refused too: the table does not travel in the bytes. The scheme's scale
rule (``ocp``) is not part of the encoding, so a tensor read back has the default rule (its
bytes, and so its values, are unchanged).

Reading enforces Burn's limits (``MAX_METADATA_SIZE`` 100 MiB, ``MAX_TENSOR_COUNT`` 100,000,
``MAX_TENSOR_SIZE`` 10 GiB, ``MAX_CBOR_RECURSION_DEPTH`` 128, ``MAX_FILE_SIZE`` 100 GiB) and
more than Burn checks: version exactly 1, every range inside the file, starts aligned to 256, no
two ranges overlapping, each tensor's byte count what its dtype and shape need, no CBOR tags, no
duplicate keys, no bytes after the metadata's CBOR item. All are :class:`CorruptDataError` (an
empty shape whose other extents no array can take, such as ``[0, 2**62]`` of F32, is a
:class:`ShapeError`); sizes are checked against the file before anything is read, so a lying
header never allocates more than the file holds. The metadata is walked item by item, not
decoded whole (Python objects took up to 75 times its bytes: one byte ``0xA0`` is a 64-byte
dict): only what is kept is built, each descriptor, scalar or value of a key Burn does not write
is decoded within :data:`MAX_ITEM_SIZE` bytes and checked at once, ``metadata`` and ``scalars``
hold at most :data:`MAX_ENTRIES` entries and the metadata map 64 keys, so reading costs memory
in proportion to the file (about its metadata's size, plus what the tensors' entries keep).

Note that Burn itself (burn-std's ``encode_scales``/``decode_scales``) does not implement UE8M0
scales yet, so an ``mxfp8``/``mxfp4`` file is valid Burnpack that Burn's backends may refuse to
dequantize.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import itertools
import math
import os
import struct
import tempfile
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..backends import default, shim
from ..errors import BackendUnavailableError, CorruptDataError, DTypeError, SchemeError, ShapeError
from ..invariants.data import MAX_ELEMENTS
from ..scheme import QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype
from ..scheme.block import MAX_BLOCK_DIMS, BlockSize
from ..tensor import QuantizedTensor
from . import _dtypes
from .burn import from_bytes, to_bytes
from .checkpoint import _publish
from .importance import search_arguments
from .reader import Passthrough, _ml_dtype

__all__ = [
    "ALIGNMENT",
    "BURN_COMMIT",
    "MAGIC",
    "NAME",
    "VERSION",
    "Burnpack",
    "BurnpackEntry",
    "BurnpackFile",
    "BurnpackSummary",
    "decode_scheme",
    "encode_scheme",
    "iter_tensors",
    "load",
    "quantize_file",
    "read_burnpack",
    "save",
    "save_stream",
    "sniff",
]

NAME = "burnpack"
BURN_COMMIT = "2c06be351006851d42fdb6df16b976f4a82d9747"  # the Burn source this module follows
MAGIC = 0x4255524E
VERSION = 1
HEADER_SIZE = 10
ALIGNMENT = 256
MAX_METADATA_SIZE = 100 * 1024 * 1024
MAX_TENSOR_SIZE = 10 * 1024**3
MAX_TENSOR_COUNT = 100_000
MAX_CBOR_DEPTH = 128
MAX_FILE_SIZE = 100 * 1024**3
# beyond Burn's limits: decoded, these would cost memory out of proportion to the file
MAX_ITEM_SIZE = 64 * 1024  # one descriptor, scalar or unknown key's value, in bytes of CBOR
MAX_ENTRIES = MAX_TENSOR_COUNT  # entries of 'metadata' and of 'scalars' each (Burn sets no limit on them)
_MAX_KEYS = 64  # keys of the metadata map (Burn's has three)
_WINDOWS = (512, 8192, MAX_ITEM_SIZE)  # bytes an item is decoded in, each tried when it runs past the last
_NUMPY_MAX_BYTES = 2**63 - 1  # NumPy refuses a shape whose non-zero extents times the item size pass this
_MAX_RANK = 64  # NumPy's; Burn has no limit, but no array of more axes can be built here
_U64 = 1 << 64
_I64 = 1 << 63
_HEADER = struct.Struct("<IHI")
_CHUNK = 1 << 20

# Burn DType (string form) -> (little-endian NumPy dtype, the array's dtype name)
_PLAIN = {k: (d.numpy, d.name) for k, d in _dtypes.BURN.items()}
_BOOL_STORES = {"Native": "u1", "U8": "u1", "U32": "<u4"}
_BY_ARRAY = {spec: burn for burn, (_, spec) in _PLAIN.items() if burn != "Flex32"}
_FLOATS = _dtypes.BURN_FLOATS
# safetensors header dtypes of a Passthrough entry -> Burn DType
_FROM_SAFETENSORS: dict[str, Any] = {k: k for k in _PLAIN if k != "Flex32"} | {"BOOL": {"Bool": "Native"}}

_VALUES = {v: v.name for v in QuantValue}  # Q8F, E2M1, ...: arrayquant's enum names are Burn's
_SCALES = {s: s.name for s in ScaleDtype}
_STORES = {"packed_u32": "PackedU32", "packed_native": "PackedNative"}
_SCHEME_KEYS = ("value", "store", "mode", "tensor", "block")
_TARGET = (
    f"the QuantScheme encoding of Burn {BURN_COMMIT[:8]} (cubecl 1e735584a, 2026-08-19): "
    "{value, store, mode, tensor, block}"
)


# -- the QFloat scheme ---------------------------------------------------------------------------
def encode_scheme(scheme: QuantScheme | str) -> dict[str, Any]:
    """``scheme`` as Burn's serde writes a ``QuantScheme`` (the CBOR of a QFloat dtype).

    Parameters
    ----------
    scheme : QuantScheme or str

    Returns
    -------
    dict
        ``{"value", "store", "mode", "tensor", "block"}``, the block size canonical.

    Raises
    ------
    SchemeError
        A scheme Burn's ``QuantScheme`` cannot hold: lookup mode (Burn's bytes carry no table) or
        a block extent above 255 (Burn's ``BlockSize`` holds ``u8`` extents).

    Examples
    --------
    >>> encode_scheme("q4s:block32:f16")["block"]
    {'size': {'storage': [32, 1, 1, 1, 1], 'len': 1}, 'dtype': 'F16'}
    >>> encode_scheme("nvfp4")["store"], encode_scheme("nvfp4")["tensor"]
    ({'PackedNative': 0}, 'F32')
    """
    s = QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme
    if not isinstance(s, QuantScheme):
        msg = f"scheme must be a QuantScheme or its text, got {type(scheme).__name__}"
        raise SchemeError(msg)
    holds = (
        "Burnpack's QFloat holds symmetric schemes with block extents up to 255 (q8s, q4s:block32, nvfp4, mxfp8, ...)"
    )
    if s.mode is not QuantMode.SYMMETRIC:
        msg = f"scheme {s} looks values up in a table, which Burn's quantized bytes do not carry; {holds}"
        raise SchemeError(msg)
    block = None
    if s.block is not None:
        size, dtype = s.block
        dims = list(size.dims)
        while dims and dims[0] == 1:  # BlockSize::new drops every leading 1: [1] is the empty block
            dims.pop(0)
        if any(d > 255 for d in dims):
            msg = f"scheme {s} has block extents {list(size.dims)}, but Burn stores each extent in a u8; {holds}"
            raise SchemeError(msg)
        storage = dims + [1] * (MAX_BLOCK_DIMS - len(dims))
        block = {"size": {"storage": storage, "len": len(dims)}, "dtype": _SCALES[dtype]}
    store: Any = "Native" if s.store.kind == "native" else {_STORES[s.store.kind]: s.store.dim}
    return {
        "value": _VALUES[s.value],
        "store": store,
        "mode": "Symmetric",
        "tensor": None if s.tensor is None else _SCALES[s.tensor],
        "block": block,
    }


def _unit(obj: Any, names: Mapping[str, Any], what: str) -> Any:
    if not isinstance(obj, str) or obj not in names:
        msg = f"{what} {_short(obj)} is not one of {', '.join(names)}; arrayquant reads {_TARGET}"
        raise SchemeError(msg)
    return names[obj]


def decode_scheme(obj: Any) -> QuantScheme:
    """The :class:`QuantScheme` of a QFloat dtype's CBOR, in the encoding :func:`encode_scheme` writes.

    Parameters
    ----------
    obj : dict
        The value under ``"QFloat"``.

    Returns
    -------
    QuantScheme

    Raises
    ------
    SchemeError
        Any other encoding (Burn's older ``{value, param, store, level, mode}`` among them, which
        changed without a version bump), lookup mode, or a scheme arrayquant refuses.

    Examples
    --------
    >>> str(decode_scheme(encode_scheme("q8s:block32:f16")))
    'q8s:block32:f16'
    """
    if not isinstance(obj, dict):
        msg = f"QFloat scheme {_short(obj)} is not a map; arrayquant reads {_TARGET}"
        raise SchemeError(msg)
    keys = set(obj)
    if keys != set(_SCHEME_KEYS):
        old = " (Burn's encoding before 2026-08-19, with 'level' and 'param')" if {"level", "param"} & keys else ""
        msg = (
            f"QFloat scheme with keys {sorted(map(str, keys))}{old} is not an encoding arrayquant reads: it reads "
            f"{_TARGET}; re-save the model with a Burn at or after that commit"
        )
        raise SchemeError(msg)
    value = _unit(obj["value"], {n: v for v, n in _VALUES.items()}, "QFloat value")
    if obj["mode"] != "Symmetric":
        msg = (
            f"QFloat mode {_short(obj['mode'])}: arrayquant reads 'Symmetric' schemes only (a 'Lookup' "
            f"table does not travel in the bytes); it reads {_TARGET}"
        )
        raise SchemeError(msg)
    store_obj = obj["store"]
    if store_obj == "Native":
        store = QuantStore.native()
    else:
        if not isinstance(store_obj, dict) or len(store_obj) != 1:
            msg = f"QFloat store {_short(store_obj)} is not 'Native', {{'PackedU32': dim}} or {{'PackedNative': dim}}"
            raise SchemeError(msg)
        ((kind, dim),) = store_obj.items()
        kinds = {v: k for k, v in _STORES.items()}
        if kind not in kinds or not _is_int(dim) or not 0 <= dim < _U64:
            msg = f"QFloat store {_short(store_obj)} is not 'Native', {{'PackedU32': dim}} or {{'PackedNative': dim}}"
            raise SchemeError(msg)
        store = QuantStore(kinds[kind], dim)
    scales = {n: s for s, n in _SCALES.items()}
    tensor = None if obj["tensor"] is None else _unit(obj["tensor"], scales, "QFloat tensor scale dtype")
    block = None
    if obj["block"] is not None:
        b = obj["block"]
        size = b.get("size") if isinstance(b, dict) else None
        if not isinstance(b, dict) or set(b) != {"size", "dtype"} or not isinstance(size, dict):
            msg = (
                f"QFloat block {_short(b)} is not {{'size': {{'storage', 'len'}}, 'dtype'}}; arrayquant reads {_TARGET}"
            )
            raise SchemeError(msg)
        storage: Any = size.get("storage")
        n: Any = size.get("len")
        if (
            set(size) != {"storage", "len"}
            or not isinstance(storage, list)
            or len(storage) != MAX_BLOCK_DIMS
            or not all(_is_int(d) and 0 <= d <= 255 for d in storage)
            or not _is_int(n)
            or not 0 <= n <= MAX_BLOCK_DIMS
        ):
            msg = (
                f"QFloat block size {_short(size)} is not {{'storage': [5 u8 extents], 'len': 0..5}}; "
                f"arrayquant reads {_TARGET}"
            )
            raise SchemeError(msg)
        dims = storage[:n] or [1]  # len 0: Burn's canonical [1], one scale per element
        block = (BlockSize(dims), _unit(b["dtype"], scales, "QFloat block scale dtype"))
    return QuantScheme(value, store, QuantMode.SYMMETRIC, tensor, block)


# -- reading ---------------------------------------------------------------------------------------
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


class _AnyTag(dict[int, Any]):
    """cbor2's semantic decoders, every tag refused: Burn writes none, and some decode to objects."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, tag: int) -> Callable[..., Any]:
        def refuse(*_: Any) -> Any:
            msg = f"CBOR tag {tag}"
            raise ValueError(msg)

        return refuse

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key]


def _refuse_tag(_: Any, tag: Any) -> Any:
    msg = f"CBOR tag {getattr(tag, 'tag', '?')}"
    raise ValueError(msg)


def _cbor2() -> Any:
    try:
        import cbor2
    except ImportError:  # pragma: no cover - depends on the environment
        msg = "Burnpack files need cbor2: pip install 'arrayquant[burn]' (or cbor2)"
        raise BackendUnavailableError(msg) from None
    return cbor2


class _BadCbor(Exception):
    """A CBOR fault, raised as one CorruptDataError that says which CBOR Burn's writer makes."""


_NO_TAGS = _AnyTag()


class _Cbor:
    """The metadata's CBOR, walked item by item so that only what is kept gets built.

    Decoding it whole cost memory far beyond its size: one byte ``0xA0`` is an empty dict of 64
    bytes, so 20 MB of them took 1.4 GiB. Here the maps Burn writes (the metadata, its tensors,
    metadata and scalars) are walked, keys and text read directly, and every other item (a
    descriptor, a scalar, the value of a key Burn does not write) is decoded by cbor2 inside a
    window of at most :data:`MAX_ITEM_SIZE` bytes and checked at once: decoding costs at most
    ~80 bytes a byte of that window, and nothing but the checked result stays.
    """

    def __init__(self, raw: bytearray, where: str) -> None:
        self.cbor2 = _cbor2()
        self.raw = raw
        self.view = memoryview(raw)
        self.at = 0
        self.where = where

    def _take(self, n: int) -> memoryview:
        end = self.at + n
        if end > len(self.raw):
            msg = f"premature end of the metadata: an item at offset {self.at} needs {n} more bytes"
            raise _BadCbor(msg)
        out, self.at = self.view[self.at : end], end
        return out

    def head(self) -> tuple[int, int | None]:
        """The next item's major type and argument (None: an indefinite length); a tag is a fault."""
        at = self.at
        byte = self._take(1)[0]
        major, info = byte >> 5, byte & 0x1F
        if info < 24:
            arg: int | None = info
        elif info < 28:
            arg = int.from_bytes(self._take(1 << (info - 24)), "big")
        elif info == 31 and 2 <= major <= 5:
            arg = None
        else:
            msg = f"invalid CBOR initial byte 0x{byte:02x} at metadata offset {at}"
            raise _BadCbor(msg)
        if major == 6:
            msg = f"CBOR tag {arg}"
            raise _BadCbor(msg)
        return major, arg

    def more(self, n: int | None, done: int) -> bool:
        """Whether a map or array of ``n`` entries (None: up to a break) has another after ``done``."""
        if n is not None:
            return done < n
        if self.at < len(self.raw) and self.raw[self.at] == 0xFF:
            self.at += 1
            return False
        return True

    def string(self, major: int, n: int | None) -> str | bytes:
        """The payload of a byte (major 2) or text (major 3) string whose head was read."""
        if n is None:  # indefinite: definite chunks of the same type up to a break
            chunks, done = [], 0
            while self.more(None, done):
                kind, size = self.head()
                if kind != major or size is None:
                    msg = "an indefinite-length string holds a chunk of another type"
                    raise _BadCbor(msg)
                chunks.append(bytes(self._take(size)))
                done += 1
            data: bytes | memoryview = b"".join(chunks)
        else:
            data = self._take(n)
        if major == 2:
            return bytes(data)
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as exc:
            raise _BadCbor(f"text that is not UTF-8 ({exc})") from None

    def key(self, seen: Container[Any]) -> str | bytes:
        """A map key (text, or bytes as cbor2 allows), never one of ``seen``."""
        major, n = self.head()
        if major not in (2, 3):
            msg = f"a map key of CBOR major type {major}; keys are text"
            raise _BadCbor(msg)
        key = self.string(major, n)
        if key in seen:
            msg = f"Duplicate map key {_short(key)}"
            raise _BadCbor(msg)
        return key

    def value(self, depth: int, what: str, name: Any) -> Any:
        """The next item decoded by cbor2, in a window of at most MAX_ITEM_SIZE bytes; ``depth`` maps enclose it.

        ``what.format(name)`` names the item in the error for one that runs past the window (formatted
        only then: a file has up to 100,000 descriptors).
        """
        cbor2 = self.cbor2
        for size in _WINDOWS:
            end = min(self.at + size, len(self.raw))
            fp = io.BytesIO(bytes(self.view[self.at : end]))
            decoder = cbor2.CBORDecoder(
                fp,
                read_size=1,  # so fp.tell() is where the item ends
                max_depth=MAX_CBOR_DEPTH - depth,
                allow_duplicate_keys=False,
                strict_hashable_types=True,
                semantic_decoders=_NO_TAGS,
                tag_hook=_refuse_tag,
            )
            try:
                obj = decoder.decode()
            except cbor2.CBORDecodeEOF as exc:
                if end < len(self.raw):
                    continue  # the item goes on past the window
                raise _BadCbor(str(exc)) from None
            except (cbor2.CBORError, ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
                raise _BadCbor(str(exc) + (f" ({exc.__cause__})" if exc.__cause__ else "")) from None
            self.at += fp.tell()
            return obj
        msg = (
            f"{self.where}: {what.format(_short(name))} takes more than {MAX_ITEM_SIZE} bytes of CBOR, over "
            "arrayquant's limit for one item; the file was not written by Burn"
        )
        raise CorruptDataError(msg)


class BurnpackEntry(NamedTuple):
    """One tensor's descriptor, checked: its dtype (as stored), shape and absolute byte range."""

    name: str
    dtype: Any  # the DType's CBOR value, e.g. "F32", {"Bool": "U8"}, {"QFloat": {...}}
    shape: tuple[int, ...]
    start: int  # absolute, in the file
    stop: int
    param_id: int | None
    scheme: QuantScheme | None  # for QFloat

    @property
    def nbytes(self) -> int:
        return self.stop - self.start

    @property
    def kind(self) -> str:
        """``"QFloat"``, ``"Bool"`` or the plain dtype name."""
        return self.dtype if isinstance(self.dtype, str) else next(iter(self.dtype))


def _dtype_of(obj: Any, where: str) -> tuple[str | None, QuantScheme | None]:
    """(NumPy raw dtype or None for QFloat, scheme) of a stored DType; typed errors otherwise."""
    if isinstance(obj, str) and obj in _PLAIN:
        return _PLAIN[obj][0], None
    if isinstance(obj, dict) and len(obj) == 1:
        ((kind, arg),) = obj.items()
        if kind == "Bool" and isinstance(arg, str) and arg in _BOOL_STORES:
            return _BOOL_STORES[arg], None
        if kind == "QFloat":
            try:
                return None, decode_scheme(arg)
            except SchemeError as exc:
                raise SchemeError(f"{where}: {exc}") from None
    names = ", ".join([*_PLAIN, "{'Bool': store}", "{'QFloat': scheme}"])
    msg = f"{where}: dtype {_short(obj)} is not a Burn DType ({names})"
    raise CorruptDataError(msg)


def _uint(x: Any, limit: int, what: str) -> int:
    if not _is_int(x) or not 0 <= x < limit:
        msg = f"{what} {_short(x)} is not an integer in [0, {limit})"
        raise CorruptDataError(msg)
    return int(x)


def _scalar(name: str, obj: Any, where: str) -> tuple[str, Any]:
    if isinstance(obj, dict) and len(obj) == 1:
        ((kind, value),) = obj.items()
        ok = {
            "Int": lambda v: _is_int(v) and -_I64 <= v < _I64,
            "UInt": lambda v: _is_int(v) and 0 <= v < _U64,
            "Float": lambda v: isinstance(v, float),
            "Bool": lambda v: isinstance(v, bool),
        }
        if kind in ok and ok[kind](value):
            return kind, value
    msg = f"{where}: scalar {name!r} is {_short(obj)}, not {{'Int'|'UInt'|'Float'|'Bool': value}}"
    raise CorruptDataError(msg)


def _expected_nbytes(raw: str | None, scheme: QuantScheme | None, shape: tuple[int, ...], where: str) -> int:
    if raw is not None:
        return math.prod(shape) * np.dtype(raw).itemsize
    from ..storage import quantized_nbytes

    assert scheme is not None
    try:
        return quantized_nbytes(scheme, shape)
    except (SchemeError, ShapeError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def _check_span(shape: tuple[int, ...], itemsize: int, where: str) -> None:
    """Refuse an empty shape no array can take: NumPy sizes even an empty array by its non-zero extents.

    A non-empty shape needs its bytes in the file, which bounds it; an empty one needs none, so
    ``[0, 2**62]`` would reach NumPy (a ValueError) and ``[0, 2**64 - 1]`` overflow its indices.
    ``itemsize`` is the array's (a bool is read as one byte whatever its store).
    """
    span = math.prod(d for d in shape if d)
    if span > MAX_ELEMENTS or span * itemsize > _NUMPY_MAX_BYTES:
        msg = (
            f"{where}: shape {list(shape)} is empty, but its non-zero extents multiply to {span} elements of "
            f"{itemsize} byte(s), more than any array can hold (at most {MAX_ELEMENTS} elements and "
            f"{_NUMPY_MAX_BYTES} bytes; NumPy sizes an empty array by those extents too), so it cannot be read; "
            "save the empty tensor with small extents, e.g. [0]"
        )
        raise ShapeError(msg)


class BurnpackFile:
    """An open Burnpack file, its header and metadata validated; tensors read one at a time.

    Attributes
    ----------
    entries : list of BurnpackEntry
        In file order (by data offset).
    metadata : dict of str to str
    scalars : dict of str to (kind, value)
        ``kind`` is ``"Int"``, ``"UInt"``, ``"Float"`` or ``"Bool"``.
    param_ids : dict of str to int
        The tensors that have one.

    Raises
    ------
    CorruptDataError
        Anything that is not a Burnpack file as Burn writes it (see the module notes).
    SchemeError
        A QFloat dtype in an encoding arrayquant does not read.
    ShapeError
        A shape no array can take (an empty one whose other extents are too large, a QFloat one
        arrayquant refuses).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file = open(self.path, "rb", buffering=0)  # noqa: SIM115 - closed by close() / the context manager
        try:
            self._parse()
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> BurnpackFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def _parse(self) -> None:
        where = str(self.path)
        size = os.fstat(self._file.fileno()).st_size
        if size > MAX_FILE_SIZE:
            msg = f"{where}: {size} bytes is over Burn's limit of {MAX_FILE_SIZE} bytes for a Burnpack file"
            raise CorruptDataError(msg)
        head = self._read(0, min(size, HEADER_SIZE))
        if len(head) < HEADER_SIZE:
            msg = f"{where}: {len(head)} bytes, less than the {HEADER_SIZE}-byte Burnpack header: truncated"
            raise CorruptDataError(msg)
        magic, version, meta_size = _HEADER.unpack(head)
        if magic != MAGIC:
            msg = f"{where}: magic 0x{magic:08X} is not Burnpack's 0x{MAGIC:08X} (b'NRUB'); not a Burnpack file"
            raise CorruptDataError(msg)
        if version != VERSION:
            msg = f"{where}: Burnpack format version {version}; arrayquant reads version {VERSION}"
            raise CorruptDataError(msg)
        if meta_size > MAX_METADATA_SIZE:
            msg = f"{where}: metadata_size {meta_size} is over Burn's limit of {MAX_METADATA_SIZE} bytes"
            raise CorruptDataError(msg)
        if HEADER_SIZE + meta_size > size:
            msg = (
                f"{where}: metadata_size {meta_size} runs past the end of the {size}-byte file; "
                "the file is truncated or the header lies"
            )
            raise CorruptDataError(msg)
        self.data_start = -(-(HEADER_SIZE + meta_size) // ALIGNMENT) * ALIGNMENT
        cbor = _Cbor(self._read(HEADER_SIZE, meta_size), where)
        try:
            entries = self._metadata(cbor, size)
        except _BadCbor as exc:
            msg = (
                f"{where}: the metadata is not valid CBOR as Burn writes it (nesting at most {MAX_CBOR_DEPTH}, "
                f"no tags, no duplicate keys): {exc}"
            )
            raise CorruptDataError(msg) from None
        if cbor.at != meta_size:
            msg = f"{where}: {meta_size - cbor.at} bytes follow the CBOR metadata inside metadata_size; the header lies"
            raise CorruptDataError(msg)
        entries.sort(key=lambda e: (e.start, e.stop, e.name))
        for before, after in itertools.pairwise(entries):
            if after.start < before.stop:
                msg = (
                    f"{where}: tensors {before.name!r} and {after.name!r} overlap (data offsets "
                    f"[{before.start - self.data_start}, {before.stop - self.data_start}) and "
                    f"[{after.start - self.data_start}, {after.stop - self.data_start}))"
                )
                raise CorruptDataError(msg)
        self.entries = entries
        self.by_name = {e.name: e for e in entries}
        self.param_ids = {e.name: e.param_id for e in entries if e.param_id is not None}

    def _metadata(self, cbor: _Cbor, size: int) -> list[BurnpackEntry]:
        """Burn's ``Metadata`` map: its tensors' entries; ``metadata`` and ``scalars`` kept, other keys checked."""
        not_meta = f"{self.path}: the metadata is not a map with a 'tensors' map"
        major, n = cbor.head()
        if major != 5:
            raise CorruptDataError(not_meta)
        self.metadata: dict[str, str] = {}
        self.scalars: dict[str, tuple[str, Any]] = {}
        entries: list[BurnpackEntry] | None = None
        seen: set[str | bytes] = set()
        while cbor.more(n, len(seen)):
            self._over(
                len(seen) + 1,
                _MAX_KEYS,
                "keys in the metadata map is over arrayquant's limit of {limit}; Burn's has 3",
            )
            key = cbor.key(seen)
            seen.add(key)
            if key == "tensors":
                entries = self._tensors(cbor, size, not_meta)
            elif key == "metadata":
                self.metadata = self._strings(cbor)
            elif key == "scalars":
                self.scalars = self._scalars(cbor)
            else:  # a key Burn does not write: checked as CBOR, then dropped
                cbor.value(1, "the value of key {}, which Burn does not write,", key)
        if entries is None:
            raise CorruptDataError(not_meta)
        return entries

    def _map(self, cbor: _Cbor, bad: str, limit: int, what: str) -> int | None:
        """The entry count of the map that comes next (None: up to a break), at most ``limit``."""
        major, n = cbor.head()
        if major != 5:
            raise CorruptDataError(bad)
        self._over(n, limit, what)
        return n

    def _over(self, n: int | None, limit: int, what: str) -> None:
        """``what`` says ``n`` is over ``limit`` (a format string with ``{limit}``)."""
        if n is not None and n > limit:
            msg = f"{self.path}: {n} {what.format(limit=limit)}"
            raise CorruptDataError(msg)

    def _tensors(self, cbor: _Cbor, size: int, bad: str) -> list[BurnpackEntry]:
        what = "tensors is over Burn's limit of {limit}"
        n = self._map(cbor, bad, MAX_TENSOR_COUNT, what)
        names: set[str | bytes] = set()
        entries = []
        while cbor.more(n, len(names)):
            self._over(len(names) + 1, MAX_TENSOR_COUNT, what)  # an indefinite-length map that goes on
            name = cbor.key(names)
            names.add(name)
            desc = cbor.value(2, "the descriptor of tensor {} (Burn's take a few hundred bytes)", name)
            entries.append(self._entry(name, desc, size))
        return entries

    def _strings(self, cbor: _Cbor) -> dict[str, str]:
        bad = f"{self.path}: 'metadata' is not a map of strings to strings"
        what = "'metadata' entries is over arrayquant's limit of {limit}, the number of tensors Burn allows"
        n = self._map(cbor, bad, MAX_ENTRIES, what)
        out: dict[str, str] = {}
        while cbor.more(n, len(out)):
            self._over(len(out) + 1, MAX_ENTRIES, what)
            key = cbor.key(out)
            major, length = cbor.head()
            if not isinstance(key, str) or major != 3:
                raise CorruptDataError(bad)
            out[key] = str(cbor.string(major, length))
        return out

    def _scalars(self, cbor: _Cbor) -> dict[str, tuple[str, Any]]:
        bad = f"{self.path}: 'scalars' is not a map of names to scalars"
        what = "'scalars' entries is over arrayquant's limit of {limit}, the number of tensors Burn allows"
        n = self._map(cbor, bad, MAX_ENTRIES, what)
        out: dict[str, tuple[str, Any]] = {}
        while cbor.more(n, len(out)):
            self._over(len(out) + 1, MAX_ENTRIES, what)
            name = cbor.key(out)
            if not isinstance(name, str):
                raise CorruptDataError(bad)
            out[name] = _scalar(name, cbor.value(2, "scalar {}", name), str(self.path))
        return out

    def _entry(self, name: Any, desc: Any, size: int) -> BurnpackEntry:
        where = f"{self.path}: tensor {_short(name)}"
        if not isinstance(name, str) or not isinstance(desc, dict):
            msg = f"{where}: not a name with a descriptor map"
            raise CorruptDataError(msg)
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in desc]
        if missing:
            msg = f"{where}: the descriptor lacks {missing}"
            raise CorruptDataError(msg)
        shape_obj, offsets = desc["shape"], desc["data_offsets"]
        if not isinstance(shape_obj, list) or len(shape_obj) > _MAX_RANK:
            msg = f"{where}: shape {_short(shape_obj)} is not a list of at most {_MAX_RANK} extents"
            raise CorruptDataError(msg)
        shape = tuple(_uint(d, _U64, f"{where}: shape extent") for d in shape_obj)
        if not isinstance(offsets, list) or len(offsets) != 2:
            msg = f"{where}: data_offsets {_short(offsets)} is not [start, end]"
            raise CorruptDataError(msg)
        start, end = (_uint(o, _U64, f"{where}: data offset") for o in offsets)
        pid = desc.get("param_id")
        param_id = None if pid is None else _uint(pid, _U64, f"{where}: param_id")
        if end < start:
            msg = f"{where}: data_offsets [{start}, {end}] end before they start"
            raise CorruptDataError(msg)
        if end - start > MAX_TENSOR_SIZE:
            msg = f"{where}: {end - start} bytes is over Burn's limit of {MAX_TENSOR_SIZE} bytes for one tensor"
            raise CorruptDataError(msg)
        if start % ALIGNMENT:
            msg = f"{where}: data offset {start} is not a multiple of {ALIGNMENT}, as Burn aligns every tensor"
            raise CorruptDataError(msg)
        if self.data_start + end > size:
            msg = (
                f"{where}: data_offsets [{start}, {end}] run past the end of the file (the data section "
                f"holds {max(size - self.data_start, 0)} bytes); the file is truncated or the header lies"
            )
            raise CorruptDataError(msg)
        raw, scheme = _dtype_of(desc["dtype"], where)
        want = _expected_nbytes(raw, scheme, shape, where)
        if want != end - start:
            kind = desc["dtype"] if raw is not None else f"QFloat {scheme}"
            msg = (
                f"{where}: dtype {_short(kind)} and shape {list(shape)} need {want} bytes, "
                f"but its data_offsets hold {end - start}"
            )
            raise CorruptDataError(msg)
        if raw is not None:  # a {"Bool": store} is read as bools of one byte
            _check_span(shape, 1 if isinstance(desc["dtype"], dict) else np.dtype(raw).itemsize, where)
        return BurnpackEntry(
            name, desc["dtype"], shape, self.data_start + start, self.data_start + end, param_id, scheme
        )

    def _read(self, at: int, n: int) -> bytearray:
        buf = bytearray(n)  # returned as is: a tensor is read into memory once, not copied again
        view, done = memoryview(buf), 0
        self._file.seek(at)
        while done < n:
            got = self._file.readinto(view[done:])
            if not got:
                msg = f"{self.path}: the file ends {n - done} bytes early; it changed or was truncated while read"
                raise CorruptDataError(msg)
            done += got
        return buf

    def raw(self, name: str) -> bytearray:
        """A tensor's stored bytes."""
        e = self.by_name[name]
        return self._read(e.start, e.nbytes)

    def copy_to(self, name: str, fd: int, offset: int) -> None:
        """Write a tensor's stored bytes at ``offset`` of the open file ``fd``, a chunk at a time."""
        e = self.by_name[name]
        at = e.start
        while at < e.stop:
            data = self._read(at, min(_CHUNK, e.stop - at))
            _write_at(fd, data, offset)
            at, offset = at + len(data), offset + len(data)

    def tensor(self, name: str, *, backend: str | None = None, device: Any = None) -> tuple[Any, str]:
        """``(QuantizedTensor or NumPy array, note)`` for one tensor; ``note`` says what was converted."""
        e = self.by_name[name]
        data = self.raw(name)
        if e.scheme is not None:
            return from_bytes(data, e.scheme, e.shape, backend=backend, device=device), ""
        if e.kind == "Bool":
            store = e.dtype["Bool"]
            codes = np.frombuffer(data, dtype=_BOOL_STORES[store])
            if np.any(codes > 1):
                i = int(np.argmax(codes > 1))
                msg = f"{self.path}: tensor {name!r}: bool value {int(codes[i])} at flat index {i} is not 0 or 1"
                raise CorruptDataError(msg)
            return codes.astype(bool).reshape(e.shape), "" if store == "Native" else f"Bool({store}) read as bool"
        raw, spec = _PLAIN[e.dtype]
        # a view of the buffer just read on a little-endian machine; byte-swapped on a big-endian one
        arr = np.frombuffer(data, dtype=raw).astype(np.dtype(raw).newbyteorder("="), copy=False).reshape(e.shape)
        if e.dtype == "BF16":
            arr = arr.view(_ml_dtype(spec))
        return arr, "Flex32 read as float32" if e.dtype == "Flex32" else ""


class Burnpack(NamedTuple):
    """What :func:`read_burnpack` returns."""

    tensors: dict[str, Any]
    param_ids: dict[str, int]
    metadata: dict[str, str]
    scalars: dict[str, tuple[str, Any]]


def sniff(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts with Burnpack's magic; never raises (an unreadable file is not one)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except (OSError, ValueError, TypeError):
        return False
    return len(head) == 4 and struct.unpack("<I", head)[0] == MAGIC


def read_burnpack(path: str | os.PathLike[str], *, backend: str | None = None, device: Any = None) -> Burnpack:
    """Every tensor of a Burnpack file, with its param ids, metadata and scalars.

    Parameters
    ----------
    path
        The ``.bpk`` file.
    backend, device : optional
        Where the arrays go (default: the default backend and its default device).

    Returns
    -------
    Burnpack
        ``tensors`` (name to :class:`QuantizedTensor` for QFloat, to an array otherwise, in file
        order), ``param_ids``, ``metadata``, ``scalars``.

    Raises
    ------
    CorruptDataError
        A file that is not Burnpack as Burn writes it, or breaks Burn's limits.
    SchemeError
        A QFloat scheme in an encoding arrayquant does not read.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "m.bpk")
    >>> save(path, {"w": np.ones((2, 3), np.float32)}, param_ids={"w": 7}, metadata={"producer": "doc"})
    >>> bp = read_burnpack(path, backend="numpy")
    >>> bp.tensors["w"].shape, bp.param_ids, bp.metadata
    ((2, 3), {'w': 7}, {'producer': 'doc'})
    """
    name = backend or default().name
    same = name.strip().lower() == "numpy" and device is None
    tensors: dict[str, Any] = {}
    with BurnpackFile(path) as f:
        for e in f.entries:
            obj, _ = f.tensor(e.name, backend=name, device=device)
            tensors[e.name] = obj if same or isinstance(obj, QuantizedTensor) else shim.convert(obj, name, device)
        return Burnpack(tensors, dict(f.param_ids), dict(f.metadata), dict(f.scalars))


def load(path: str | os.PathLike[str], *, backend: str | None = None, device: Any = None) -> dict[str, Any]:
    """Every tensor of a Burnpack file: :class:`QuantizedTensor` for QFloat ones, arrays for the rest.

    See :func:`read_burnpack`, which also returns the param ids, metadata and scalars.
    """
    return read_burnpack(path, backend=backend, device=device).tensors


def iter_tensors(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any, str]]:
    """``(name, QuantizedTensor or NumPy array, note)`` one at a time, in file order.

    ``note`` is ``""``, or says what was converted (``"Flex32 read as float32"``,
    ``"Bool(U8) read as bool"``). QuantizedTensors are on the NumPy backend.
    """
    with BurnpackFile(path) as f:
        for e in f.entries:
            obj, note = f.tensor(e.name, backend="numpy")
            yield e.name, obj, note


# -- writing ---------------------------------------------------------------------------------------
def _write_at(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class _Stored(NamedTuple):
    """A tensor already in a Burnpack file, copied as stored (dtype, shape and bytes)."""

    source: BurnpackFile
    entry: BurnpackEntry


def _item(name: str, item: Any) -> tuple[Any, tuple[int, ...], int, Callable[[int, int], None]]:
    """(DType CBOR, shape, byte count, write(fd, offset)) of one item to write."""
    if isinstance(item, _Stored):
        e = item.entry
        return e.dtype, e.shape, e.nbytes, lambda fd, at: item.source.copy_to(e.name, fd, at)
    if isinstance(item, Passthrough):
        kind = _FROM_SAFETENSORS.get(item.entry.dtype)
        if kind is None:
            msg = f"tensor {name!r} has safetensors dtype {item.entry.dtype}, which Burn has no DType for"
            raise DTypeError(msg)
        return kind, tuple(item.entry.shape), item.nbytes, item.copy_to
    if isinstance(item, QuantizedTensor):
        try:
            qfloat = {"QFloat": encode_scheme(item.scheme)}
        except SchemeError as exc:
            raise SchemeError(f"tensor {name!r}: {exc}") from None
        data = to_bytes(item)
        return qfloat, tuple(item.shape), len(data), lambda fd, at: _write_at(fd, data, at)
    try:
        host = np.asarray(shim.to_host(item))
    except Exception as exc:  # anything that is not an array of a backend
        msg = f"tensor {name!r} is a {type(item).__name__}, not an array or a QuantizedTensor ({exc})"
        raise DTypeError(msg) from None
    spec = str(host.dtype)
    if host.dtype == np.bool_:
        dtype: Any = {"Bool": "Native"}
        raw = host.astype("u1")
    elif spec in _BY_ARRAY:
        dtype = _BY_ARRAY[spec]
        rawtype = _PLAIN[_BY_ARRAY[spec]][0]
        raw = (host.view("u2") if spec == "bfloat16" else host).astype(rawtype, copy=False)
    else:
        names = ", ".join([*_BY_ARRAY, "bool"])
        msg = f"tensor {name!r} has dtype {host.dtype}, which Burnpack cannot hold ({names})"
        raise DTypeError(msg)
    data = np.ascontiguousarray(raw).tobytes()
    return dtype, tuple(host.shape), len(data), lambda fd, at: _write_at(fd, data, at)


def _utf8(name: str, what: str) -> bytes:
    if not isinstance(name, str):
        msg = f"{what} {_short(name)} is not a string"
        raise ShapeError(msg)
    try:
        return name.encode("utf-8")
    except UnicodeEncodeError:
        msg = f"{what} {name!r} is not valid UTF-8 text"
        raise ShapeError(msg) from None


def _scalar_cbor(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, tuple) and len(value) == 2:
        kind, v = value
    elif isinstance(value, bool):
        kind, v = "Bool", value
    elif isinstance(value, float):
        kind, v = "Float", value
    elif _is_int(value):
        kind, v = ("Int" if value < _I64 else "UInt"), value
    else:
        kind, v = None, value
    try:
        kind, v = _scalar(name, {kind: v}, "scalars")
    except CorruptDataError:
        msg = f"scalar {name!r} = {_short(value)} is not a bool, float, int, or (kind, value), kind Int/UInt/Float/Bool"
        raise ShapeError(msg) from None
    return {kind: _MinimalFloat(v) if kind == "Float" else v}


class _MinimalFloat:
    """A float to write as ciborium does: at the narrowest of f16/f32/f64 that holds it (ciborium-ll hdr.rs).

    Not a tuple or a float subclass, so cbor2 hands it to :func:`_minimal_float`.
    """

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value


def _minimal_float(encoder: Any, obj: Any) -> None:
    if not isinstance(obj, _MinimalFloat):
        msg = f"cannot write {type(obj).__name__} to CBOR"
        raise DTypeError(msg)
    encoder.write(_cbor2().dumps(obj.value, canonical=True))  # cbor2's canonical float is the narrowest


def _metadata_bytes(
    descs: dict[str, dict[str, Any]], metadata: Mapping[str, str] | None, scalars: Mapping[str, Any] | None
) -> bytes:
    meta: dict[str, Any] = {"tensors": {n: descs[n] for n in sorted(descs, key=lambda n: n.encode("utf-8"))}}
    if metadata:
        for k, v in metadata.items():
            _utf8(k, "metadata key")
            _utf8(v, f"metadata value of {k!r}")
        meta["metadata"] = {k: metadata[k] for k in sorted(metadata, key=lambda k: k.encode("utf-8"))}
    if scalars:
        meta["scalars"] = {
            k: _scalar_cbor(k, scalars[k]) for k in sorted(scalars, key=lambda k: _utf8(k, "scalar name"))
        }
    out: bytes = _cbor2().dumps(meta, default=_minimal_float)
    if len(out) > MAX_METADATA_SIZE:
        msg = f"the metadata takes {len(out)} bytes, over Burn's limit of {MAX_METADATA_SIZE}"
        raise ShapeError(msg)
    return out


def save_stream(
    path: str | os.PathLike[str],
    items: Iterable[tuple[str, Any]],
    *,
    param_ids: Mapping[str, int] | None = None,
    metadata: Mapping[str, str] | None = None,
    scalars: Mapping[str, Any] | None = None,
) -> None:
    """Write ``(name, tensor)`` pairs to a Burnpack file as they come, holding one at a time.

    The data goes to a spool file beside the target while the metadata (which precedes the data
    and needs every size) is built; then header, metadata and data are copied to a temporary
    file renamed over the target, so a failure anywhere (in ``items`` too) leaves it as it was.

    Parameters
    ----------
    path
        The file to write.
    items : iterable of (str, tensor)
        A :class:`QuantizedTensor` (written as QFloat, bytes :func:`arrayquant.to_bytes`), an array
        of any backend (float64/32/16, bfloat16, int and uint 8-64, bool), or an entry of an open
        safetensors file (:class:`~arrayquant.io.reader.Passthrough`, copied a chunk at a time).
    param_ids : mapping of str to int, optional
        Burn's parameter ids (``u64``) for the tensors that have one.
    metadata : mapping of str to str, optional
        The file's key/value metadata.
    scalars : mapping of str to scalar, optional
        Typed scalars: ``bool``, ``float``, ``int`` (``Int``, or ``UInt`` past ``i64``) or
        ``(kind, value)`` with kind ``"Int"``, ``"UInt"``, ``"Float"``, ``"Bool"``.

    Raises
    ------
    ShapeError
        A name given twice, a param id for no tensor or outside ``u64``, metadata that is not
        strings.
    DTypeError
        An array dtype Burn has no DType for.
    SchemeError
        A quantized tensor whose scheme Burn's ``QuantScheme`` cannot hold (see :func:`encode_scheme`).
    """
    ids = dict(param_ids or {})
    for k, v in ids.items():
        if not _is_int(v) or not 0 <= v < _U64:
            msg = f"param id of {k!r} is {_short(v)}, not an integer in [0, 2**64)"
            raise ShapeError(msg)
    target = Path(path)
    spool = tempfile.NamedTemporaryFile(dir=target.parent or Path("."), prefix=f".{target.name}.", suffix=".spool")  # noqa: SIM115
    try:
        descs: dict[str, dict[str, Any]] = {}
        at = 0
        for name, item in items:
            _utf8(name, "tensor name")
            if name in descs:
                msg = f"tensor name {name!r} appears twice; each name must be unique"
                raise ShapeError(msg)
            dtype, shape, nbytes, write = _item(name, item)
            start = -(-at // ALIGNMENT) * ALIGNMENT
            desc: dict[str, Any] = {"dtype": dtype, "shape": list(shape), "data_offsets": [start, start + nbytes]}
            if name in ids:
                desc["param_id"] = ids[name]
            descs[name] = desc
            write(spool.fileno(), start)
            at = start + nbytes
            del item, write
        unknown = sorted(set(ids) - set(descs))
        if unknown:
            msg = f"param ids for tensors that are not written: {unknown[:5]}"
            raise ShapeError(msg)
        meta = _metadata_bytes(descs, metadata, scalars)
        head = _HEADER.pack(MAGIC, VERSION, len(meta)) + meta
        head += bytes(-len(head) % ALIGNMENT)
        os.ftruncate(spool.fileno(), at)  # the padding before an empty last tensor is data too

        def copy(f: Any, _: str) -> None:
            spool.seek(0)
            while chunk := spool.read(_CHUNK):
                f.write(chunk)

        _publish(target, head, copy)
    finally:
        spool.close()


def save(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    *,
    param_ids: Mapping[str, int] | None = None,
    metadata: Mapping[str, str] | None = None,
    scalars: Mapping[str, Any] | None = None,
) -> None:
    """Write tensors to a Burnpack file, atomically (temporary file renamed over ``path``).

    Tensors are written in the mapping's order; see :func:`save_stream` for what they may be
    and the errors.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "m.bpk")
    >>> save(path, {"w": aq.quantize(np.ones((2, 32), np.float32), "q8s:block32:f16:native")})
    >>> str(load(path, backend="numpy")["w"].scheme)
    'q8s:block32:f16:native'
    """
    if not isinstance(tensors, Mapping):
        msg = f"tensors must be a mapping of names to tensors, got {type(tensors).__name__}"
        raise ShapeError(msg)
    save_stream(path, tensors.items(), param_ids=param_ids, metadata=metadata, scalars=scalars)


# -- re-quantizing ---------------------------------------------------------------------------------
@dataclasses.dataclass
class BurnpackSummary:
    """What :func:`quantize_file` did: the tensors quantized, and every other one with why it was not."""

    scheme: str  # the scheme written
    quantized: list[str] = dataclasses.field(default_factory=list)
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> why (copied as stored)
    format: str = NAME


def _why_not(e: BurnpackEntry, include: Sequence[str], exclude: Sequence[str]) -> str | None:
    if e.scheme is not None:
        return f"quantized already ({e.scheme})"
    if e.kind not in _FLOATS:
        return f"not a float tensor ({e.kind})"
    if not e.shape:
        return "a scalar"
    if include:
        if not any(fnmatch.fnmatchcase(e.name, g) for g in include):
            return "not named by include"
    elif len(e.shape) != 2:
        return f"rank {len(e.shape)} (only 2-d weights by default)"
    else:
        leaf = e.name.rsplit(".", 1)[-1].lower()
        if "norm" in e.name.lower() or leaf.endswith("bias"):
            return "a norm or a bias"
    if any(fnmatch.fnmatchcase(e.name, g) for g in exclude):
        return "named by exclude"
    return None


def quantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    scheme: QuantScheme | str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
    calibration: Any = "minmax",
    importance: Mapping[str, Any] | None = None,
) -> BurnpackSummary:
    """Re-quantize a Burnpack file into another, tensor by tensor, keeping everything else.

    By default the 2-d float weights are quantized (not norms or biases); ``include`` globs
    replace that choice, ``exclude`` globs narrow it. Every other tensor is copied as stored
    (dtype, shape, bytes), and the param ids, metadata and scalars are kept; the data keeps the
    source's order.

    Parameters
    ----------
    src, dst : path
        The ``.bpk`` to read and the one to write (they may be the same file).
    scheme : QuantScheme or str
        A scheme Burn's ``QuantScheme`` holds (see :func:`encode_scheme`).
    include, exclude : sequence of str
        Globs on tensor names.
    progress : callable, optional
        Called with each tensor's name as it is written.

    Returns
    -------
    BurnpackSummary

    Raises
    ------
    SchemeError
        A scheme Burnpack cannot hold, refused before anything is read.
    CorruptDataError
        A source that is not a valid Burnpack file.
    NonFiniteInputError
        A weight with NaN or infinite values (naming it).
    """
    from ..errors import NonFiniteInputError
    from ..quantize import quantize

    s = QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme
    encode_scheme(s)  # refuse what Burn cannot hold before any work
    summary = BurnpackSummary(str(s))
    with BurnpackFile(src) as f:

        def items() -> Iterator[tuple[str, Any]]:
            for e in f.entries:
                why = _why_not(e, include, exclude)
                if why is None:
                    host, _ = f.tensor(e.name)
                    try:
                        # f16/bf16 are computed in f32 by quantize, a slab at a time
                        qt = quantize(host, s, **search_arguments(calibration, importance, e.name))
                    except NonFiniteInputError as exc:
                        raise NonFiniteInputError(f"tensor {e.name!r} of {src}: {exc}") from None
                    del host
                    summary.quantized.append(e.name)
                    yield e.name, qt
                    del qt  # only one quantized tensor alive at a time
                else:
                    summary.left_out[e.name] = why
                    yield e.name, _Stored(f, e)
                if progress is not None:
                    progress(e.name)

        save_stream(dst, items(), param_ids=f.param_ids, metadata=f.metadata, scalars=f.scalars)
    return summary
