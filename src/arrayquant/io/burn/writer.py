"""Writing Burnpack files as Burn lays them out: :func:`save`, :func:`save_stream` (one tensor at a time).

The metadata is written as ciborium writes Burn's structs (see :mod:`arrayquant.io.burn.layout`),
the tensors in the order given, each at the next multiple of 256; the file is published through
:mod:`arrayquant.io._atomic`. Besides arrays and quantized tensors a writer takes entries of open
files to copy as they are stored, a chunk at a time: a :class:`Stored` tensor of a Burnpack file,
a :class:`~arrayquant.io.safetensors.reader.Passthrough` entry of a safetensors file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ...backends import shim
from ...errors import CorruptDataError, DTypeError, SchemeError, ShapeError
from ...tensor import QuantizedTensor
from .. import _atomic
from ..regions import write_all
from ..safetensors.reader import Passthrough
from .bytes import to_bytes
from .cbor import MinimalFloat, dumps
from .layout import (
    ALIGNMENT,
    CHUNK,
    HEADER,
    I64,
    MAGIC,
    MAX_METADATA_SIZE,
    PLAIN,
    U64,
    VERSION,
    check_scalar,
    is_int,
    short,
)
from .reader import BurnpackEntry, BurnpackFile
from .schemes import encode_scheme

__all__ = ["Stored", "save", "save_stream"]

# array dtype name -> Burn DType (Flex32 is read as float32, written as F32)
_BY_ARRAY = {spec: burn for burn, (_, spec) in PLAIN.items() if burn != "Flex32"}
# safetensors header dtypes of a Passthrough entry -> Burn DType
_FROM_SAFETENSORS: dict[str, Any] = {k: k for k in PLAIN if k != "Flex32"} | {"BOOL": {"Bool": "Native"}}


class Stored(NamedTuple):
    """A tensor already in a Burnpack file, copied as stored (dtype, shape and bytes)."""

    source: BurnpackFile
    entry: BurnpackEntry


def _item(name: str, item: Any) -> tuple[Any, tuple[int, ...], int, Callable[[int, int], None]]:
    """(DType CBOR, shape, byte count, write(fd, offset)) of one item to write."""
    if isinstance(item, Stored):
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
        return qfloat, tuple(item.shape), len(data), lambda fd, at: write_all(fd, data, at)
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
        rawtype = PLAIN[_BY_ARRAY[spec]][0]
        raw = (host.view("u2") if spec == "bfloat16" else host).astype(rawtype, copy=False)
    else:
        names = ", ".join([*_BY_ARRAY, "bool"])
        msg = f"tensor {name!r} has dtype {host.dtype}, which Burnpack cannot hold ({names})"
        raise DTypeError(msg)
    data = np.ascontiguousarray(raw).tobytes()
    return dtype, tuple(host.shape), len(data), lambda fd, at: write_all(fd, data, at)


def _utf8(name: str, what: str) -> bytes:
    if not isinstance(name, str):
        msg = f"{what} {short(name)} is not a string"
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
    elif is_int(value):
        kind, v = ("Int" if value < I64 else "UInt"), value
    else:
        kind, v = None, value
    try:
        kind, v = check_scalar(name, {kind: v}, "scalars")
    except CorruptDataError:
        msg = f"scalar {name!r} = {short(value)} is not a bool, float, int, or (kind, value), kind Int/UInt/Float/Bool"
        raise ShapeError(msg) from None
    return {kind: MinimalFloat(v) if kind == "Float" else v}


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
    out = dumps(meta)
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
        file copied as stored, a chunk at a time: a Burnpack tensor (:class:`Stored`) or a
        safetensors entry (:class:`~arrayquant.io.safetensors.reader.Passthrough`).
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
        if not is_int(v) or not 0 <= v < U64:
            msg = f"param id of {k!r} is {short(v)}, not an integer in [0, 2**64)"
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
        head = HEADER.pack(MAGIC, VERSION, len(meta)) + meta
        head += bytes(-len(head) % ALIGNMENT)
        os.ftruncate(spool.fileno(), at)  # the padding before an empty last tensor is data too

        def fill(f: BinaryIO, _: Path) -> None:
            f.write(head)
            spool.seek(0)
            while chunk := spool.read(CHUNK):
                f.write(chunk)

        _atomic.publish(target, fill)
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
    >>> from arrayquant.io.burn.reader import load
    >>> path = os.path.join(tempfile.mkdtemp(), "m.bpk")
    >>> save(path, {"w": aq.quantize(np.ones((2, 32), np.float32), "q8s:block32:f16:native")})
    >>> str(load(path, backend="numpy")["w"].scheme)
    'q8s:block32:f16:native'
    """
    if not isinstance(tensors, Mapping):
        msg = f"tensors must be a mapping of names to tensors, got {type(tensors).__name__}"
        raise ShapeError(msg)
    save_stream(path, tensors.items(), param_ids=param_ids, metadata=metadata, scalars=scalars)
