"""Checkpoints on safetensors: quantized tensors and plain arrays in one file, validated on load.

Layout (format 2), per quantized tensor ``name``:

- ``name.qvalues``: the stored values (int8, uint8 or uint32 words, as the scheme stores them);
- ``name.scales``: the stored scales, in safetensors' own dtypes (F32, F16, BF16, F8_E4M3 for
  UE4M3, F8_E8M0 for UE8M0);
- ``name.global_scale``: the f32 per-tensor scale of a two-level scheme, shape ``(1,)``;
- ``name.table``: a lookup table, f32;
- in the file's metadata, ``arrayquant.tensor.<name>``: JSON with the scheme, original dtype and
  shape; ``arrayquant.format`` names the format version (``"2"``).

No entry carries the tensor's own name, so a float loader that looks for ``name`` (a
``state_dict`` with ``strict=True``, say) reports it missing instead of taking the codes for
weights. Plain arrays are stored under their names, as any safetensors file. Format 1, written
before, stored the values under ``name`` itself; it is still read. Names ending in one of the
suffixes above, or starting with ``arrayquant.``, are refused on write.

Writes go to a temporary file in the target folder that is renamed over the target, so a crash
never leaves a truncated checkpoint under the target name. Reading goes through the one
safetensors reader, :mod:`arrayquant.io.reader`, which the ``arrayquant`` commands use too.
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import array_api_compat as compat
import numpy as np

from ..backends import dask_graph, default, shim
from ..errors import BackendUnavailableError, CorruptDataError, DTypeError, SchemeError, ShapeError
from ..invariants import Plan, check_params, check_shape, plan_for
from ..scheme import QParams, ScaleDtype
from ..storage import check_values, values_layout
from ..tensor import QuantizedTensor, dtype_name
from . import _atomic
from .burn import encode_scales
from .paths import read_json
from .reader import (
    _FORMAT_KEY,
    _PLAIN,
    _SCALE_DTYPES,
    _SIBLINGS,
    _TENSOR_KEY,
    _VALUE_DTYPES,
    FORMAT_VERSION,
    VALUES_SUFFIX,
    Checkpoint,
    Passthrough,
    SafetensorsFile,
    _ml_dtype,
    read_header,
)
from .regions import ChunkTarget, write_all

__all__ = ["FORMAT_VERSION", "is_compressed_tensors", "load_checkpoint", "read_header", "save", "save_stream"]

_Part = tuple[Any, str, list[int]]  # (bytes, a host array or a lazy source; header dtype; shape)


def _safetensors() -> Any:
    try:
        import safetensors
    except ImportError:  # pragma: no cover - depends on the environment
        msg = "checkpoints need safetensors; pip install 'arrayquant[io]'"
        raise BackendUnavailableError(msg) from None
    return safetensors


_BY_NAME = {spec_name: header for header, (_, spec_name) in _PLAIN.items()}


@functools.lru_cache(maxsize=64)
def _kind_of(dtype: Any) -> str | None:
    return _BY_NAME.get(dtype_name(dtype))  # str(dtype) is slow beside the rest of a tiny tensor's write


def _header_kind(name: str, dtype: Any) -> str:
    """The safetensors header dtype for arrays of ``dtype``."""
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
        out[name + VALUES_SUFFIX] = (
            _Lazy(st.values, raw_values.itemsize, _ValuesCodec(raw_values)),
            _VALUE_DTYPES[vdtype],
            list(vshape),
        )
    else:
        values = np.ascontiguousarray(shim.to_host(st.values))
        out[name + VALUES_SUFFIX] = (values.astype(raw_values).tobytes(), _VALUE_DTYPES[vdtype], list(vshape))
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


def _write(path: str, base: int, parts: dict[str, _Part], offsets: dict[str, int], fd: int | None = None) -> None:
    """Write each part at ``base + offsets[key]`` of ``path``; lazy parts chunk by chunk, in one graph.

    ``fd``, when given, is ``path`` already open for writing (and left open).
    """
    sources, targets = [], []
    own = fd is None
    fd = os.open(path, os.O_WRONLY) if fd is None else fd
    try:
        for key, (data, _, shape) in parts.items():
            at = base + offsets[key]
            if isinstance(data, _Lazy):
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


def _nbytes(data: Any) -> int:
    return int(data.nbytes) if isinstance(data, (np.ndarray, Passthrough)) else len(data)


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


def _check_name(name: object, plain: bool = False) -> None:
    if plain and isinstance(name, str) and name and name != "__metadata__":
        return  # a plain file has no quantized tensors whose parts a name could be mistaken for
    if (
        not isinstance(name, str)
        or not name
        or name == "__metadata__"
        or name.startswith("arrayquant.")
        or name.endswith(_SIBLINGS)
    ):
        msg = (
            f"tensor name {name!r} is not allowed; use a non-empty name that does not start with 'arrayquant.' "
            f"nor end with one of {', '.join(repr(s) for s in _SIBLINGS)} (the parts of a quantized tensor)"
        )
        raise ShapeError(msg)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _describe(qt: QuantizedTensor) -> str:
    return json.dumps({"scheme": str(qt.scheme), "dtype": dtype_name(qt.dtype), "shape": list(qt.shape)})


def save(path: str | os.PathLike[str], tensors: Mapping[str, Any], *, format: str = "arrayquant") -> None:  # noqa: A002
    """Write quantized tensors and plain arrays to a safetensors file, atomically.

    A quantized tensor ``name`` is stored as ``name.qvalues`` and ``name.scales`` (plus
    ``name.global_scale`` and ``name.table`` where it has them), described in the file's
    metadata, so no float loader mistakes its codes for weights. The file is written to a
    temporary name and renamed into place. Lazy (Dask) tensors are written chunk by chunk.

    Parameters
    ----------
    path : str or path-like
        The output file; replaced atomically if it exists.
    tensors : mapping of str to QuantizedTensor or array
        Quantized tensors and plain arrays (float, integer, bool; bfloat16 and fp8 through
        ml_dtypes) of any backend.
    format : {"arrayquant", "compressed-tensors"}
        ``"arrayquant"``: the layout above, for every scheme. ``"compressed-tensors"``: the
        entries compressed-tensors writes (``<module>.weight_packed``, ``.weight_scale``, ...)
        for quantized tensors named ``<module>.weight`` whose schemes it has, with the
        ``quantization_config`` in the file's metadata (see
        :func:`arrayquant.io.ct_file.save_compressed_tensors`).

    Raises
    ------
    ParamsError, ShapeError
        A quantized tensor whose parts do not fit its scheme, or a name the layout reserves
        (ending in ``.qvalues``, ``.scales``, ...).
    SchemeError
        An unknown ``format``; with ``"compressed-tensors"``, a scheme that format lacks.
    DTypeError
        An array of a dtype safetensors cannot hold.
    BackendUnavailableError
        The ``safetensors`` package is missing (``pip install 'arrayquant[io]'``).

    Examples
    --------
    >>> import numpy as np, arrayquant as aq, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> qt = aq.quantize(np.ones((4, 32), np.float32), "nvfp4")
    >>> aq.save(path, {"w": qt, "bias": np.zeros(4, np.float32)})
    >>> loaded = aq.load(path)
    >>> aq.to_bytes(loaded["w"]) == aq.to_bytes(qt), loaded["bias"].shape
    (True, (4,))
    """
    if format == "compressed-tensors":
        from .ct_file import save_compressed_tensors

        save_compressed_tensors(path, tensors)
        return
    if format != "arrayquant":
        msg = f"format {format!r} is not one aq.save writes; use 'arrayquant' or 'compressed-tensors'"
        raise SchemeError(msg)
    if any(_is_lazy(item) for item in tensors.values()):
        _save_lazy(path, tensors)
        return
    st = _safetensors()
    entries: dict[str, _Part] = {}
    metadata = {_FORMAT_KEY: FORMAT_VERSION}
    for name, item in tensors.items():
        if isinstance(name, str) and not _utf8(name):
            # the safetensors serializer takes UTF-8 only; the streamed writers escape such names in JSON
            msg = (
                f"tensor name {name!r} is not valid Unicode text (a lone surrogate), which aq.save cannot "
                "write; rename the tensor"
            )
            raise ShapeError(msg)
        _add(entries, _parts(name, item, metadata))
    buffers = {k: np.frombuffer(memoryview(data).cast("B"), np.uint8) for k, (data, _, _) in entries.items()}
    specs = {
        k: st.TensorSpec(dtype=_PLAIN[kind][1], shape=shape, data_ptr=buffers[k].ctypes.data, data_len=buffers[k].size)
        for k, (_, kind, shape) in entries.items()
    }
    _publish(Path(path), st.serialize(specs, metadata=metadata), lambda f, tmp: None)


def save_stream(
    path: str | os.PathLike[str],
    items: Iterable[tuple[str, Any]],
    *,
    metadata: Mapping[str, str] | None = None,
    plain: bool = False,
) -> None:
    """Write ``(name, tensor)`` pairs as they come, holding one tensor at a time; same file as :func:`save`.

    With ``plain``, the file is a plain safetensors file (a model folder's shard): arrays only, any
    non-empty names, no arrayquant format key.

    ``items`` may be a generator: each quantized tensor or array is written and dropped before the
    next is asked for, so memory stays near the largest tensor. An item may also be a
    :class:`~arrayquant.io.reader.Passthrough`, an entry of an open file copied as stored, a
    chunk at a time. The data goes to a spool file next
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
    meta = {} if plain else {_FORMAT_KEY: FORMAT_VERSION}
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
        # constant work per entry (no scan of what came before), so the whole is linear in the entries
        kinds: dict[str, tuple[str, list[int], int]] = {}
        spooled: dict[str, int] = {}  # where each entry's bytes are in the spool, in arrival order
        names: set[str] = set()
        at = 0
        for name, item in items:
            if name in names:
                msg = f"tensor name {name!r} appears twice; each name must be unique"
                raise ShapeError(msg)
            if plain and isinstance(item, QuantizedTensor):
                msg = f"tensor {name!r} is quantized; a plain safetensors file holds arrays only"
                raise ShapeError(msg)
            parts = _parts(name, item, meta, plain=plain)
            names.add(name)
            _add(kinds, {k: (kind, shape, _nbytes(data)) for k, (data, kind, shape) in parts.items()})
            offsets, part = {}, None
            for key, part in parts.items():
                offsets[key] = at
                at += _nbytes(part[0])
            spooled.update(offsets)
            _write(spool.name, 0, parts, offsets, spool.fileno())
            del parts, part, item  # nothing of this tensor is held while the next one is made
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
    """Add one item's entries, refusing a name that is already there (a lookup per entry, not a scan)."""
    clash = [k for k in parts if k in into]
    if clash:
        msg = f"tensor names {sorted(clash)} appear twice; each name (and its .scales siblings) must be unique"
        raise ShapeError(msg)
    into.update(parts)


def _parts(
    name: str, item: Any, meta: dict[str, str], stored: _Stored | None = None, plain: bool = False
) -> dict[str, _Part]:
    """The entries of one named item; a quantized tensor also describes itself in ``meta``.

    ``stored`` is the item's validated (and, if lazy, resolved) arrays when the caller has them.
    """
    _check_name(name, plain)
    if isinstance(item, QuantizedTensor):
        meta[_TENSOR_KEY + name] = _describe(item)
        return _stored_entries(name, stored) if stored is not None else _quantized_entries(name, item)
    if isinstance(item, Passthrough):  # copied from its file as stored
        return {name: (item, item.entry.dtype, list(item.entry.shape))}
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

    def write(f: BinaryIO, tmp: Path) -> None:
        f.write(head)
        f.flush()
        fill(f, str(tmp))

    _atomic.publish(target, write)


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


def is_compressed_tensors(path: Path) -> bool:
    """A compressed-tensors model: a folder, or a file describing no arrayquant tensor that holds a
    ``quantization_config`` in its metadata or whose folder's config.json has a compressed-tensors one."""
    if path.is_dir():
        return True
    with SafetensorsFile(path) as st:
        if any(k.startswith(_TENSOR_KEY) for k in st.metadata):  # arrayquant's own quantized tensors
            return False
        stored = "quantization_config" in st.metadata  # written by aq.save(format="compressed-tensors")
    config = path.parent / "config.json"
    if not config.is_file():
        return stored
    try:  # a config.json that cannot be read describes nothing: the file is read by itself
        found = read_json(config, "a model config")
    except (CorruptDataError, OSError):
        return stored
    qc = found.get("quantization_config") if isinstance(found, dict) else None
    return stored or (isinstance(qc, dict) and qc.get("quant_method") == "compressed-tensors")


def load_checkpoint(path: str | os.PathLike[str], *, backend: str | None = None, device: Any = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save`, validating every tensor before building it.

    Files of format 1 (values under the tensor's own name) are read too. Tensors come in file
    order, read one at a time (no memory map). ``aq.load`` calls this for safetensors files that
    are not compressed-tensors ones (see :mod:`arrayquant.io.formats`).

    Parameters
    ----------
    path
        The safetensors file.
    backend, device
        Where the arrays go (default: the default backend, its default device).

    Returns
    -------
    dict
        Name to :class:`~arrayquant.QuantizedTensor` for quantized tensors, to an array for the others.

    Raises
    ------
    CorruptDataError
        A file that is not what it claims: see :class:`arrayquant.io.reader.Checkpoint`.
    ShapeError, SchemeError, ParamsError, MissingGlobalScaleError, UnexpectedGlobalScaleError
        A quantized tensor whose parts do not fit its description, each naming the tensor.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> aq.save(path, {"w": aq.quantize(np.ones((2, 64), np.float32), "nf4")})
    >>> str(aq.load(path, backend="numpy")["w"].scheme)
    'nf4'
    """
    name_ = backend or default().name
    same = name_.strip().lower() == "numpy" and device is None  # host arrays as read: nothing to convert
    move = (lambda a: a) if same else (lambda a: shim.convert(a, name_, device))
    out: dict[str, Any] = {}
    with Checkpoint(path) as ck:
        for e in ck.tensors:
            if e.name in ck.described:
                out[e.name] = ck.quantized(e.name, backend=name_, device=device)
                continue
            arr = ck.raw(e.name)
            if e.dtype == "BF16" or e.dtype.startswith("F8"):
                arr = arr.view(_ml_dtype(_PLAIN[e.dtype][1]))
            elif e.dtype == "BOOL":
                arr = arr.astype(bool)
            out[e.name] = move(arr)
    return out
