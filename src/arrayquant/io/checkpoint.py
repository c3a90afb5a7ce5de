"""Checkpoints on safetensors: quantized tensors and plain arrays in one file, validated on load.

Layout, per quantized tensor ``name``: the stored values under ``name``, the stored scales under
``name.scales``, the two-level per-tensor scale under ``name.global_scale`` and a lookup table
under ``name.table``; the scheme, original dtype and shape in the file's metadata under
``arrayquant.tensor.<name>`` (JSON), with ``arrayquant.format`` naming the format version.
Scales use safetensors' own dtypes (F32, F16, BF16, F8_E4M3 for UE4M3, F8_E8M0 for UE8M0).
Writes go to a temporary file in the target folder that is renamed over the target, so a crash
never leaves a truncated checkpoint under the target name.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import array_api_compat as compat
import numpy as np

from ..backends import dask_graph, default, shim
from ..errors import (
    BackendUnavailableError,
    CorruptDataError,
    DTypeError,
    MissingGlobalScaleError,
    QuantizationError,
    ShapeError,
    UnexpectedGlobalScaleError,
)
from ..invariants import Plan, check_params, check_shape, plan_for
from ..scheme import QParams, QuantScheme, ScaleDtype
from ..storage import check_values, values_layout
from ..tensor import QuantizedTensor, dtype_name
from .burn import check_codes, decode_scales, encode_scales
from .regions import ChunkTarget, write_all

__all__ = ["FORMAT_VERSION", "load", "read_header", "save", "save_stream"]

FORMAT_VERSION = "1"
_FORMAT_KEY = "arrayquant.format"
_TENSOR_KEY = "arrayquant.tensor."
_SIBLINGS = (".scales", ".global_scale", ".table")
# safetensors header dtype <-> (numpy dtype of the raw data, TensorSpec dtype name)
_PLAIN = {
    "F64": ("<f8", "float64"),
    "F32": ("<f4", "float32"),
    "F16": ("<f2", "float16"),
    "BF16": ("<u2", "bfloat16"),
    "I64": ("<i8", "int64"),
    "I32": ("<i4", "int32"),
    "I16": ("<i2", "int16"),
    "I8": ("i1", "int8"),
    "U32": ("<u4", "uint32"),
    "U16": ("<u2", "uint16"),
    "U8": ("u1", "uint8"),
    "BOOL": ("u1", "bool"),
    "F8_E4M3": ("u1", "float8_e4m3fn"),
    "F8_E5M2": ("u1", "float8_e5m2"),
    "F8_E8M0": ("u1", "float8_e8m0fnu"),
}
_SCALE_DTYPES = {
    ScaleDtype.F32: "F32",
    ScaleDtype.F16: "F16",
    ScaleDtype.BF16: "BF16",
    ScaleDtype.UE4M3: "F8_E4M3",
    ScaleDtype.UE8M0: "F8_E8M0",
}
_VALUE_DTYPES = {"int8": "I8", "uint8": "U8", "uint32": "U32"}
_FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
_Part = tuple[Any, str, list[int]]  # (bytes, a host array or a lazy source; header dtype; shape)


def _safetensors() -> Any:
    try:
        import safetensors
    except ImportError:  # pragma: no cover - depends on the environment
        msg = "checkpoints need safetensors; pip install 'arrayquant[io]'"
        raise BackendUnavailableError(msg) from None
    return safetensors


def _header_kind(name: str, dtype: Any) -> str:
    """The safetensors header dtype for arrays of ``dtype``."""
    kind = dtype_name(dtype)
    for header, (_, spec_name) in _PLAIN.items():
        if spec_name == kind:
            return header
    msg = f"tensor {name!r} has dtype {dtype}, which a safetensors checkpoint cannot hold"
    raise DTypeError(msg)


def _raw(host: np.ndarray, header: str) -> np.ndarray:
    """A host array in the little-endian raw dtype of ``header`` (no copy where it already is one)."""
    raw_dtype = _PLAIN[header][0]
    data = host.view(raw_dtype) if host.dtype.itemsize == np.dtype(raw_dtype).itemsize else host
    return np.ascontiguousarray(data).astype(raw_dtype, copy=False).reshape(host.shape)


def _host(arr: Any) -> np.ndarray:
    raw = np.asarray(shim.to_host(arr))
    return np.ascontiguousarray(raw).reshape(raw.shape)  # keeps 0-d arrays 0-d


def _plain_array(name: str, arr: Any) -> tuple[np.ndarray, str]:
    """The host array in its little-endian raw dtype and its header dtype."""
    host = _host(arr)
    header = _header_kind(name, host.dtype)
    return _raw(host, header), header


class _PlainCodec:
    """A chunk of a plain lazy array as raw little-endian bytes."""

    def __init__(self, header: str) -> None:
        self.header = header

    def __call__(self, block: Any) -> bytes:
        return _raw(_host(block), self.header).tobytes()


class _Stored(NamedTuple):
    """A validated quantized tensor's stored arrays."""

    plan: Plan
    shape: tuple[int, ...]
    values: Any
    scales: Any
    glob: Any
    table: Any


def _validated(name: str, qt: QuantizedTensor) -> _Stored:
    plan = plan_for(qt.scheme)
    shape = check_shape(qt.shape, f"{name}.shape")
    xp = compat.array_namespace(qt.values)
    scales, glob, tab = check_params(
        QParams(qt.scales, qt.global_scale, qt.table), plan, shape, xp, compat.device(qt.values), what=name
    )
    check_values(qt.values, plan, shape, xp, f"{name}.values")
    return _Stored(plan, shape, qt.values, scales, glob, tab)


def _resolved(stores: list[_Stored]) -> list[_Stored]:
    """Lazy tensors with their small arrays (globals, per-tensor scales, tables) computed, in one pass."""
    per_tensor = [st.plan.block is None for st in stores]
    small = [
        a for st, pt in zip(stores, per_tensor, strict=True) for a in (st.glob, st.table, st.scales if pt else None)
    ]
    arrays, found = dask_graph.resolve([a for st in stores for a in (st.values, st.scales)], small)
    out = []
    for i, st in enumerate(stores):
        glob, table, scales = found[3 * i : 3 * i + 3]
        out.append(
            st._replace(
                values=arrays[2 * i], scales=scales if per_tensor[i] else arrays[2 * i + 1], glob=glob, table=table
            )
        )
    return out


def _stored_entries(name: str, st: _Stored) -> dict[str, _Part]:
    """Each stored array as ``(data, header dtype, shape)``: bytes, or a :class:`_Lazy` source."""
    plan = st.plan
    vshape, vdtype = values_layout(plan, st.shape)
    raw_values = np.dtype(vdtype).newbyteorder("<")
    out: dict[str, _Part] = {}
    if dask_graph.handles(st.values):
        out[name] = (
            _Lazy(st.values, raw_values.itemsize, _ValuesCodec(raw_values)),
            _VALUE_DTYPES[vdtype],
            list(vshape),
        )
    else:
        values = np.ascontiguousarray(shim.to_host(st.values))
        out[name] = (values.astype(raw_values).tobytes(), _VALUE_DTYPES[vdtype], list(vshape))
    kind, grid = _SCALE_DTYPES[plan.scale_dtype], list(plan.grid_shape(st.shape))
    if dask_graph.handles(st.scales):
        out[name + ".scales"] = (_Lazy(st.scales, plan.scale_dtype.nbytes, _ScalesCodec(plan.scale_dtype)), kind, grid)
    else:
        out[name + ".scales"] = (encode_scales(shim.to_host(st.scales), plan.scale_dtype), kind, grid)
    if st.glob is not None:
        out[name + ".global_scale"] = (np.asarray(shim.to_host(st.glob), "<f4").tobytes(), "F32", [1])
    if st.table is not None:
        out[name + ".table"] = (np.asarray(shim.to_host(st.table), "<f4").tobytes(), "F32", list(st.table.shape))
    return out


def _quantized_entries(name: str, qt: QuantizedTensor) -> dict[str, _Part]:
    st = _validated(name, qt)
    return _stored_entries(name, _resolved([st])[0] if dask_graph.handles(st.values) else st)


class _ValuesCodec:
    """Stored values of a chunk as little-endian bytes (a class, so dask workers can receive it)."""

    def __init__(self, dtype: np.dtype[Any]) -> None:
        self.dtype = dtype

    def __call__(self, block: Any) -> bytes:
        return np.ascontiguousarray(shim.to_host(block)).astype(self.dtype).tobytes()


class _ScalesCodec:
    """Stored scales of a chunk in the scale dtype's bytes."""

    def __init__(self, dtype: ScaleDtype) -> None:
        self.dtype = dtype

    def __call__(self, block: Any) -> bytes:
        return encode_scales(shim.to_host(block), self.dtype)


class _Lazy:
    """A lazy array to be written chunk by chunk: the array, bytes per element, and its encoder."""

    def __init__(self, array: Any, itemsize: int, encode: Any) -> None:
        self.array, self.itemsize, self.encode = array, itemsize, encode

    def __len__(self) -> int:
        return math.prod(int(n) for n in self.array.shape) * self.itemsize


def _is_lazy(item: Any) -> bool:
    if isinstance(item, QuantizedTensor):
        return dask_graph.handles(item.values) or dask_graph.handles(item.scales)
    return dask_graph.handles(item)


def _write(path: str, base: int, parts: dict[str, _Part], offsets: dict[str, int]) -> None:
    """Write each part at ``base + offsets[key]`` of ``path``; lazy parts chunk by chunk, in one graph."""
    sources, targets = [], []
    fd = os.open(path, os.O_WRONLY)
    try:
        for key, (data, _, shape) in parts.items():
            at = base + offsets[key]
            if isinstance(data, _Lazy):
                sources.append(data.array)
                targets.append(ChunkTarget(path, at, tuple(shape), data.itemsize, data.encode))
            else:
                write_all(fd, data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else data, at)
    finally:
        os.close(fd)
    if sources:
        dask_graph.store(sources, targets)


def _nbytes(data: Any) -> int:
    return int(data.nbytes) if isinstance(data, np.ndarray) else len(data)


def _layout(kinds: dict[str, tuple[str, list[int], int]]) -> tuple[dict[str, Any], dict[str, int]]:
    """Header entries and data offsets for ``{key: (dtype, shape, nbytes)}``.

    Entries go widest dtype first, then by name, as safetensors orders them: with the data
    starting 8-aligned, every entry then starts at a multiple of its element size.
    """
    order = sorted(kinds, key=lambda k: (-np.dtype(_PLAIN[kinds[k][0]][0]).itemsize, k))
    header, offsets, at = {}, {}, 0
    for key in order:
        kind, shape, size = kinds[key]
        header[key] = {"dtype": kind, "shape": [int(n) for n in shape], "data_offsets": [at, at + size]}
        offsets[key] = at
        at += size
    return header, offsets


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name or name.startswith("arrayquant.") or name.endswith(_SIBLINGS):
        msg = f"tensor name {name!r} is not allowed; use a non-empty name without the suffixes {_SIBLINGS}"
        raise ShapeError(msg)


def _describe(qt: QuantizedTensor) -> str:
    return json.dumps({"scheme": str(qt.scheme), "dtype": dtype_name(qt.dtype), "shape": list(qt.shape)})


def save(path: str | os.PathLike[str], tensors: Mapping[str, Any]) -> None:
    """Write quantized tensors and plain arrays to a safetensors file, atomically.

    >>> import numpy as np, arrayquant as aq, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> qt = aq.quantize(np.ones((4, 32), np.float32), "nvfp4")
    >>> aq.save(path, {"w": qt, "bias": np.zeros(4, np.float32)})
    >>> loaded = aq.load(path)
    >>> aq.to_bytes(loaded["w"]) == aq.to_bytes(qt), loaded["bias"].shape
    (True, (4,))
    """
    if any(_is_lazy(item) for item in tensors.values()):
        _save_lazy(path, tensors)
        return
    st = _safetensors()
    entries: dict[str, _Part] = {}
    metadata = {_FORMAT_KEY: FORMAT_VERSION}
    for name, item in tensors.items():
        _add(entries, _parts(name, item, metadata))
    buffers = {k: np.frombuffer(memoryview(data).cast("B"), np.uint8) for k, (data, _, _) in entries.items()}
    specs = {
        k: st.TensorSpec(dtype=_PLAIN[kind][1], shape=shape, data_ptr=buffers[k].ctypes.data, data_len=buffers[k].size)
        for k, (_, kind, shape) in entries.items()
    }
    _publish(Path(path), st.serialize(specs, metadata=metadata), lambda f, tmp: None)


def save_stream(
    path: str | os.PathLike[str], items: Iterable[tuple[str, Any]], *, metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``(name, tensor)`` pairs as they come, holding one tensor at a time; same file as :func:`save`.

    ``items`` may be a generator: each quantized tensor or array is written and dropped before the
    next is asked for, so memory stays near the largest tensor. The data goes to a spool file next
    to the target while the header (which precedes the data in the format and needs every size) is
    built; then header and data are copied to a temporary file that is renamed over the target.
    ``metadata`` adds string entries to the file's metadata; keys under ``arrayquant.`` are
    reserved. A failure anywhere, in ``items`` included, leaves the target as it was.

    >>> import numpy as np, arrayquant as aq, tempfile, os
    >>> from arrayquant.io.checkpoint import save_stream
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> items = ((f"w{i}", aq.quantize(np.full((4, 32), i, np.float32), "q8s")) for i in range(3))
    >>> save_stream(path, items, metadata={"origin": "doctest"})
    >>> sorted(aq.load(path)), aq.load(path)["w2"].shape
    (['w0', 'w1', 'w2'], (4, 32))
    """
    meta = {_FORMAT_KEY: FORMAT_VERSION}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str) or key.startswith("arrayquant."):
            msg = f"metadata entry {key!r}: {value!r} is not allowed; use strings, keys outside 'arrayquant.'"
            raise ShapeError(msg)
        meta[key] = value
    target = Path(path)
    folder = target.parent or Path(".")
    # named, so lazy tensors can be written into it chunk by chunk (by dask workers too)
    spool = tempfile.NamedTemporaryFile(dir=folder, prefix=f".{target.name}.", suffix=".spool")  # noqa: SIM115
    try:
        kinds: dict[str, tuple[str, list[int], int]] = {}
        spooled: dict[str, int] = {}  # where each entry's bytes are in the spool, in arrival order
        for name, item in items:
            parts = _parts(name, item, meta)
            _add(kinds, {k: (kind, shape, _nbytes(data)) for k, (data, kind, shape) in parts.items()})
            at = sum(size for _, _, size in kinds.values()) - sum(_nbytes(data) for data, _, _ in parts.values())
            offsets = {}
            for key, (data, _, _) in parts.items():
                offsets[key] = at
                at += _nbytes(data)
            spooled.update(offsets)
            _write(spool.name, 0, parts, offsets)
            del parts, item
        header, _ = _layout(kinds)

        def copy(f: Any, _: str) -> None:
            for key, entry in header.items():  # the file's order: widest dtype first
                _copy_range(spool, f, spooled[key], entry["data_offsets"][1] - entry["data_offsets"][0])

        _publish(target, _header_bytes(meta, header), copy)
    finally:
        spool.close()


def _copy_range(src: Any, dst: Any, start: int, length: int) -> None:
    src.seek(start)
    while length:
        buf = src.read(min(length, 1 << 20))
        dst.write(buf)
        length -= len(buf)


def _add(into: dict[str, Any], parts: dict[str, Any]) -> None:
    """Add one item's entries, refusing a name that is already there."""
    clash = set(parts) & set(into)
    if clash:
        msg = f"tensor names {sorted(clash)} appear twice; each name (and its .scales siblings) must be unique"
        raise ShapeError(msg)
    into.update(parts)


def _parts(name: str, item: Any, meta: dict[str, str], stored: _Stored | None = None) -> dict[str, _Part]:
    """The entries of one named item; a quantized tensor also describes itself in ``meta``.

    ``stored`` is the item's validated (and, if lazy, resolved) arrays when the caller has them.
    """
    _check_name(name)
    if isinstance(item, QuantizedTensor):
        meta[_TENSOR_KEY + name] = _describe(item)
        return _stored_entries(name, stored) if stored is not None else _quantized_entries(name, item)
    if dask_graph.handles(item):
        kind = _header_kind(name, item.dtype)
        return {name: (_Lazy(item, np.dtype(_PLAIN[kind][0]).itemsize, _PlainCodec(kind)), kind, list(item.shape))}
    data, kind = _plain_array(name, item)
    return {name: (data, kind, list(data.shape))}


def _header_bytes(meta: dict[str, str], header: dict[str, Any]) -> bytes:
    text = json.dumps({"__metadata__": meta, **header}, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # pad as safetensors does, so the data starts 8-aligned
    return len(text).to_bytes(8, "little") + text


def _publish(target: Path, head: bytes, fill: Any) -> None:
    """Write ``head``, then ``fill(file, its path)``, to a temporary file renamed over the target at the end."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        umask = os.umask(0o22)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # the mode of a file opened for writing, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            f.flush()
            fill(f, tmp)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself survives a crash only once the folder is synced
        finally:
            os.close(folder)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _save_lazy(path: str | os.PathLike[str], tensors: Mapping[str, Any]) -> None:
    """:func:`save` with lazy tensors: the header first (sizes need no data), then chunk by chunk.

    Every lazy tensor's small arrays (globals, per-tensor scales) come from one first pass.
    """
    for name in tensors:
        _check_name(name)
    stores = {n: _validated(n, t) for n, t in tensors.items() if isinstance(t, QuantizedTensor)}
    lazy = [n for n, st in stores.items() if dask_graph.handles(st.values)]
    stores.update(zip(lazy, _resolved([stores[n] for n in lazy]), strict=True))
    meta = {_FORMAT_KEY: FORMAT_VERSION}
    everything: dict[str, _Part] = {}
    for name, item in tensors.items():
        _add(everything, _parts(name, item, meta, stores.get(name)))
    header, offsets = _layout({k: (kind, shape, _nbytes(data)) for k, (data, kind, shape) in everything.items()})
    head = _header_bytes(meta, header)
    _publish(Path(path), head, lambda _, tmp: _write(tmp, len(head), everything, offsets))


def _blame(header: dict[str, Any]) -> str:
    """Which entry of a refused header has a size that does not add up (for the error message)."""
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            kind = str(entry["dtype"]).upper()
            shape = [int(n) for n in entry["shape"]]
            start, end = (int(n) for n in entry["data_offsets"])
        except (TypeError, KeyError, ValueError, OverflowError):
            return f"; entry {key!r} is not a dtype, shape and data_offsets triple"
        if kind in _PLAIN and end - start != math.prod(shape) * np.dtype(_PLAIN[kind][0]).itemsize:
            need = math.prod(shape) * np.dtype(_PLAIN[kind][0]).itemsize
            return (
                f"; entry {key!r} declares shape {shape} of {kind} ({need} bytes) "
                f"but its data_offsets span {end - start} bytes"
            )
    return ""


def read_header(f: Any, path: Path, size: int) -> tuple[int, dict[str, Any]]:
    """The length and JSON header of the safetensors file open as ``f`` (positioned at 0).

    The declared length is checked against the file's ``size`` before anything of that size is
    read, so a lying header cannot make a small file allocate gigabytes.
    """
    head = f.read(8)
    if len(head) < 8:
        msg = f"{path} has {size} bytes, too few for a safetensors header"
        raise CorruptDataError(msg)
    header_len = int.from_bytes(head, "little")
    if header_len > size - 8:
        msg = f"{path} declares a {header_len}-byte header but the file has only {size} bytes"
        raise CorruptDataError(msg)
    try:
        header = json.loads(f.read(header_len))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        msg = f"{path} has an unreadable safetensors header: {exc}"
        raise CorruptDataError(msg) from None
    if not isinstance(header, dict):
        msg = f"{path}: the safetensors header is not a JSON object"
        raise CorruptDataError(msg)
    return header_len, header


def _read(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    st = _safetensors()
    size = path.stat().st_size
    with path.open("rb") as f:
        _, header = read_header(f, path, size)
        f.seek(0)
        blob = f.read()
    try:
        entries = dict(st.deserialize(blob))
    except Exception as exc:  # the format library's own validation: offsets, sizes, dtypes
        msg = f"{path} is not a valid safetensors file: {exc}{_blame(header)}"
        raise CorruptDataError(msg) from None
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        msg = f"{path}: the metadata must map strings to strings"
        raise CorruptDataError(msg)
    return entries, meta


def _array(name: str, entry: dict[str, Any], want: str | None = None) -> np.ndarray:
    header = str(entry["dtype"]).upper()
    if header not in _PLAIN or (want is not None and header != want):
        expected = f"{want}" if want else f"one of {', '.join(_PLAIN)}"
        msg = f"entry {name!r} has dtype {entry['dtype']}, expected {expected}"
        raise CorruptDataError(msg)
    shape = tuple(int(n) for n in entry["shape"])
    raw_dtype = np.dtype(_PLAIN[header][0])
    data = bytearray(entry["data"])  # writable: torch warns about read-only buffers
    if len(data) != math.prod(shape) * raw_dtype.itemsize:
        need = math.prod(shape) * raw_dtype.itemsize
        msg = f"entry {name!r} holds {len(data)} bytes but its shape {shape} and dtype {header} need {need}"
        raise CorruptDataError(msg)
    return np.frombuffer(data, raw_dtype).reshape(shape)


def _load_quantized(name: str, info: str, entries: dict[str, dict[str, Any]]) -> tuple[Any, ...]:
    try:
        meta = json.loads(info)
        scheme = QuantScheme.parse(meta["scheme"])
        shape = check_shape(meta["shape"], f"{name} shape in the metadata")
        dtype = str(meta["dtype"])
        plan = plan_for(scheme)
    except QuantizationError as exc:
        msg = f"tensor {name!r}: {exc}"
        raise type(exc)(msg) from None
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        msg = f"tensor {name!r} has unreadable metadata {info!r}: {exc}"
        raise CorruptDataError(msg) from None
    if dtype not in _FLOAT_DTYPES:
        msg = (
            f"tensor {name!r} has original dtype {dtype!r} in the metadata; it must be one of "
            f"{', '.join(_FLOAT_DTYPES)} (the float dtype the tensor was quantized from)"
        )
        raise CorruptDataError(msg)
    if name not in entries:
        msg = f"tensor {name!r} is described in the metadata but its values entry is missing"
        raise CorruptDataError(msg)
    vshape, vdtype = values_layout(plan, shape)
    values = _array(name, entries[name], _VALUE_DTYPES[vdtype]).astype(vdtype)
    check_codes(values, plan, f"tensor {name!r}")
    if tuple(values.shape) != vshape:
        msg = (
            f"tensor {name!r}: values have shape {tuple(values.shape)} but scheme {scheme} on shape {shape} "
            f"stores {vshape}"
        )
        raise ShapeError(msg)
    if name + ".scales" not in entries:
        msg = f"tensor {name!r} (scheme {scheme}) has no {name}.scales entry; the checkpoint is incomplete"
        raise CorruptDataError(msg)
    grid = plan.grid_shape(shape)
    raw_scales = _array(name + ".scales", entries[name + ".scales"], _SCALE_DTYPES[plan.scale_dtype])
    if tuple(raw_scales.shape) != grid:
        msg = f"tensor {name!r}: {name}.scales has shape {tuple(raw_scales.shape)} but scheme {scheme} needs {grid}"
        raise ShapeError(msg)
    try:
        scales = decode_scales(raw_scales.tobytes(), plan.scale_dtype, math.prod(grid)).reshape(grid)
    except QuantizationError as exc:
        raise type(exc)(f"tensor {name!r}: {exc}") from None
    glob = None
    if plan.two_level:
        if name + ".global_scale" not in entries:
            msg = (
                f"tensor {name!r} uses the two-level scheme {scheme}, but the checkpoint has no per-tensor scale "
                f"entry {name}.global_scale; re-export the tensor with its f32 per-tensor scale (shape (1,))"
            )
            raise MissingGlobalScaleError(msg)
        glob = _array(name + ".global_scale", entries[name + ".global_scale"], "F32").astype(np.float32)
    elif name + ".global_scale" in entries:
        msg = (
            f"tensor {name!r} has scheme {scheme}, which has one scale level, but the checkpoint has "
            f"{name}.global_scale"
        )
        raise UnexpectedGlobalScaleError(msg)
    table = None
    if name + ".table" in entries:
        table = _array(name + ".table", entries[name + ".table"], "F32").astype(np.float32)
    try:
        scales, glob, table = check_params(
            QParams(scales, glob, table), plan, shape, compat.array_namespace(scales), "cpu", what=name
        )
    except QuantizationError as exc:
        raise type(exc)(f"tensor {name!r}: {exc}") from None
    return scheme, shape, dtype, values, scales, glob, table


def load(path: str | os.PathLike[str], *, backend: str | None = None, device: Any = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save`, validating every tensor before building it."""
    entries, meta = _read(Path(path))
    version = meta.get(_FORMAT_KEY)
    described = {k[len(_TENSOR_KEY) :]: v for k, v in meta.items() if k.startswith(_TENSOR_KEY)}
    if version is None and described:
        msg = f"{path} describes quantized tensors but names no {_FORMAT_KEY}; it was not written by arrayquant"
        raise CorruptDataError(msg)
    if version is not None and version != FORMAT_VERSION:
        msg = f"{path} has checkpoint format {version!r}; this arrayquant reads format {FORMAT_VERSION!r}, upgrade it"
        raise CorruptDataError(msg)
    name_ = backend or default().name
    xp = shim.namespace(name_)
    move = lambda a: None if a is None else shim.convert(a, name_, device)
    siblings = {n + s for n in described for s in _SIBLINGS}
    stray = [k for k in entries if k.endswith(_SIBLINGS) and k not in siblings]
    if stray:
        msg = f"{path} has entries {sorted(stray)} that belong to no quantized tensor in its metadata"
        raise CorruptDataError(msg)
    out: dict[str, Any] = {}
    for name, info in described.items():
        scheme, shape, dtype, values, scales, glob, table = _load_quantized(name, info, entries)
        out[name] = QuantizedTensor(
            scheme, shape, getattr(xp, dtype, xp.float32), move(values), move(scales), move(glob), move(table)
        )
    for name, entry in entries.items():
        if name in out or name in siblings:
            continue
        arr = _array(name, entry)
        header = str(entry["dtype"]).upper()
        if header == "BF16" or header.startswith("F8"):
            arr = arr.view(_ml_dtype(_PLAIN[header][1]))
        elif header == "BOOL":
            arr = arr.astype(bool)
        out[name] = move(arr)
    return out


def _ml_dtype(name: str) -> Any:
    try:
        import ml_dtypes
    except ImportError:
        msg = f"reading {name} arrays into NumPy needs ml_dtypes; pip install ml_dtypes"
        raise DTypeError(msg) from None
    return getattr(ml_dtypes, name)
