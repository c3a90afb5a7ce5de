"""Writing and loading arrayquant's safetensors layout: :func:`save`, :func:`save_stream`, :func:`load_checkpoint`.

The layout (``name.qvalues``, ``name.scales``, ... and each quantized tensor described in the
metadata) is set out in :mod:`arrayquant.io.arrayquant.layout`. Names ending in one of its
suffixes, or starting with ``arrayquant.``, are refused on write.

Writes go to a temporary file in the target folder that is renamed over the target, so a crash
never leaves a truncated checkpoint under the target name; the entries are laid out and written
by the one safetensors writer, :mod:`arrayquant.io.safetensors.writer`. Reading goes through
:class:`~arrayquant.io.arrayquant.layout.Checkpoint`, which the ``arrayquant`` commands use too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import array_api_compat as compat
import numpy as np

from ...backends import dask_graph, default, shim
from ...errors import BackendUnavailableError, ShapeError
from ...invariants import Plan, check_params, check_shape, check_zero, plan_for
from ...scheme import QParams, QuantMode, ScaleDtype
from ...storage import check_values, values_layout
from ...tensor import QuantizedTensor, dtype_name
from ..burn.bytes import encode_scales
from ..safetensors import writer
from ..safetensors.reader import PLAIN, ml_dtype
from ..safetensors.writer import Lazy, Part
from .layout import (
    FORMAT_KEY,
    FORMAT_VERSION,
    SCALE_DTYPES,
    SIBLINGS,
    TENSOR_KEY,
    VALUE_DTYPES,
    VALUES_SUFFIX,
    Checkpoint,
)

__all__ = ["load_checkpoint", "save", "save_stream"]


def _safetensors() -> Any:
    try:
        import safetensors
    except ImportError:  # pragma: no cover - depends on the environment
        msg = "checkpoints need safetensors; pip install 'arrayquant[io]'"
        raise BackendUnavailableError(msg) from None
    return safetensors


class _Stored(NamedTuple):
    """A validated quantized tensor's stored arrays."""

    plan: Plan
    shape: tuple[int, ...]
    values: Any
    scales: Any
    glob: Any
    table: Any
    zero: Any = None  # zero points (code dtype) or offsets (f32) of an affine scheme


def _validated(name: str, qt: QuantizedTensor) -> _Stored:
    plan = plan_for(qt.scheme)
    shape = check_shape(qt.shape, f"{name}.shape")
    xp = compat.array_namespace(qt.values)
    stored = QParams(qt.scales, qt.global_scale, qt.table, qt.zero_point, qt.offset)
    scales, glob, tab = check_params(stored, plan, shape, xp, compat.device(qt.values), what=name)
    check_zero(stored, plan, shape, xp, compat.device(qt.values), what=name)
    check_values(qt.values, plan, shape, xp, f"{name}.values")
    zero = qt.zero_point if plan.mode is QuantMode.ZERO_POINT else qt.offset
    return _Stored(plan, shape, qt.values, scales, glob, tab, zero)


def _resolved(stores: list[_Stored]) -> list[_Stored]:
    """Lazy tensors with their small arrays (globals, per-tensor scales, tables) computed, in one pass."""
    per_tensor = [st.plan.block is None for st in stores]
    small = [
        a
        for st, pt in zip(stores, per_tensor, strict=True)
        for a in (st.glob, st.table, st.scales if pt else None, st.zero if pt else None)
    ]
    arrays, found = dask_graph.resolve(
        [a for st, pt in zip(stores, per_tensor, strict=True) for a in (st.values, st.scales, None if pt else st.zero)],
        small,
    )
    out = []
    for i, st in enumerate(stores):
        glob, table, scales, zero = found[4 * i : 4 * i + 4]
        pt = per_tensor[i]
        out.append(
            st._replace(
                values=arrays[3 * i],
                scales=scales if pt else arrays[3 * i + 1],
                glob=glob,
                table=table,
                zero=zero if pt else arrays[3 * i + 2],
            )
        )
    return out


def _stored_entries(name: str, st: _Stored) -> dict[str, Part]:
    """Each stored array as ``(data, header dtype, shape)``: bytes, or a lazy source (:class:`Lazy`)."""
    plan = st.plan
    vshape, vdtype = values_layout(plan, st.shape)
    raw_values = np.dtype(vdtype).newbyteorder("<")
    out: dict[str, Part] = {}
    if dask_graph.handles(st.values):
        out[name + VALUES_SUFFIX] = (
            Lazy(st.values, raw_values.itemsize, _ValuesCodec(raw_values)),
            VALUE_DTYPES[vdtype],
            list(vshape),
        )
    else:
        values = np.ascontiguousarray(shim.to_host(st.values))
        out[name + VALUES_SUFFIX] = (values.astype(raw_values).tobytes(), VALUE_DTYPES[vdtype], list(vshape))
    kind, grid = SCALE_DTYPES[plan.scale_dtype], list(plan.grid_shape(st.shape))
    if dask_graph.handles(st.scales):
        out[name + ".scales"] = (Lazy(st.scales, plan.scale_dtype.nbytes, _ScalesCodec(plan.scale_dtype)), kind, grid)
    else:
        out[name + ".scales"] = (encode_scales(shim.to_host(st.scales), plan.scale_dtype), kind, grid)
    if st.glob is not None:
        out[name + ".global_scale"] = (np.asarray(shim.to_host(st.glob), "<f4").tobytes(), "F32", [1])
    if st.table is not None:
        out[name + ".table"] = (np.asarray(shim.to_host(st.table), "<f4").tobytes(), "F32", list(st.table.shape))
    if plan.mode is QuantMode.ZERO_POINT:
        zp = np.asarray(shim.to_host(st.zero)).astype(plan.code_dtype)
        out[name + ".zero_point"] = (zp.tobytes(), VALUE_DTYPES[plan.code_dtype], grid)
    elif plan.mode is QuantMode.OFFSET:
        out[name + ".offset"] = (encode_scales(shim.to_host(st.zero), plan.scale_dtype), kind, grid)
    return out


def _quantized_entries(name: str, qt: QuantizedTensor) -> dict[str, Part]:
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


def _is_lazy(item: Any) -> bool:
    if isinstance(item, QuantizedTensor):
        return dask_graph.handles(item.values) or dask_graph.handles(item.scales)
    return dask_graph.handles(item)


def _check_name(name: object, plain: bool = False) -> None:
    if plain and isinstance(name, str) and name and name != "__metadata__":
        return  # a plain file has no quantized tensors whose parts a name could be mistaken for
    if (
        not isinstance(name, str)
        or not name
        or name == "__metadata__"
        or name.startswith("arrayquant.")
        or name.endswith(SIBLINGS)
    ):
        msg = (
            f"tensor name {name!r} is not allowed; use a non-empty name that does not start with 'arrayquant.' "
            f"nor end with one of {', '.join(repr(s) for s in SIBLINGS)} (the parts of a quantized tensor)"
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


def save(path: str | os.PathLike[str], tensors: Mapping[str, Any]) -> None:
    """Write quantized tensors and plain arrays to a safetensors file in arrayquant's layout, atomically.

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

    Raises
    ------
    ParamsError, ShapeError
        A quantized tensor whose parts do not fit its scheme, or a name the layout reserves
        (ending in ``.qvalues``, ``.scales``, ...).
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
    if any(_is_lazy(item) for item in tensors.values()):
        _save_lazy(path, tensors)
        return
    st = _safetensors()
    entries: dict[str, Part] = {}
    metadata = {FORMAT_KEY: FORMAT_VERSION}
    for name, item in tensors.items():
        if isinstance(name, str) and not _utf8(name):
            # the safetensors serializer takes UTF-8 only; the streamed writers escape such names in JSON
            msg = (
                f"tensor name {name!r} is not valid Unicode text (a lone surrogate), which aq.save cannot "
                "write; rename the tensor"
            )
            raise ShapeError(msg)
        writer.add_entries(entries, _parts(name, item, metadata))
    buffers = {k: np.frombuffer(memoryview(data).cast("B"), np.uint8) for k, (data, _, _) in entries.items()}
    specs = {
        k: st.TensorSpec(dtype=PLAIN[kind][1], shape=shape, data_ptr=buffers[k].ctypes.data, data_len=buffers[k].size)
        for k, (_, kind, shape) in entries.items()
    }
    writer.publish(Path(path), st.serialize(specs, metadata=metadata), lambda f, tmp: None)


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
    :class:`~arrayquant.io.safetensors.reader.Passthrough`, an entry of an open file copied as stored, a
    chunk at a time. The file is written by :func:`arrayquant.io.safetensors.writer.save_stream`,
    through a spool file next to the target. ``metadata`` adds string entries to the file's
    metadata; keys under ``arrayquant.`` are reserved. A failure anywhere, in ``items`` included,
    leaves the target as it was.

    >>> import numpy as np, arrayquant as aq, tempfile, os
    >>> from arrayquant.io.arrayquant.checkpoint import save_stream
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> items = ((f"w{i}", aq.quantize(np.full((4, 32), i, np.float32), "q8s")) for i in range(3))
    >>> save_stream(path, items, metadata={"origin": "doctest"})
    >>> sorted(aq.load(path)), aq.load(path)["w2"].shape
    (['w0', 'w1', 'w2'], (4, 32))
    """
    meta = {} if plain else {FORMAT_KEY: FORMAT_VERSION}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str) or key.startswith("arrayquant."):
            msg = f"metadata entry {key!r}: {value!r} is not allowed; use strings, keys outside 'arrayquant.'"
            raise ShapeError(msg)
        meta[key] = value

    def entries(name: str, item: Any) -> dict[str, Part]:
        if plain and isinstance(item, QuantizedTensor):
            msg = f"tensor {name!r} is quantized; a plain safetensors file holds arrays only"
            raise ShapeError(msg)
        return _parts(name, item, meta, plain=plain)  # a quantized tensor describes itself in meta

    writer.save_stream(path, items, metadata=meta, entries=entries)


def _parts(
    name: str, item: Any, meta: dict[str, str], stored: _Stored | None = None, plain: bool = False
) -> dict[str, Part]:
    """The entries of one named item; a quantized tensor also describes itself in ``meta``.

    ``stored`` is the item's validated (and, if lazy, resolved) arrays when the caller has them.
    """
    _check_name(name, plain)
    if isinstance(item, QuantizedTensor):
        meta[TENSOR_KEY + name] = _describe(item)
        return _stored_entries(name, stored) if stored is not None else _quantized_entries(name, item)
    return writer.array_entries(name, item)


def _save_lazy(path: str | os.PathLike[str], tensors: Mapping[str, Any]) -> None:
    """:func:`save` with lazy tensors: the header first (sizes need no data), then chunk by chunk.

    Every lazy tensor's small arrays (globals, per-tensor scales) come from one first pass.
    """
    for name in tensors:
        _check_name(name)
    stores = {n: _validated(n, t) for n, t in tensors.items() if isinstance(t, QuantizedTensor)}
    lazy = [n for n, st in stores.items() if dask_graph.handles(st.values)]
    stores.update(zip(lazy, _resolved([stores[n] for n in lazy]), strict=True))
    meta = {FORMAT_KEY: FORMAT_VERSION}
    everything: dict[str, Part] = {}
    for name, item in tensors.items():
        writer.add_entries(everything, _parts(name, item, meta, stores.get(name)))
    header, offsets = writer.layout(
        {k: (kind, shape, writer.part_nbytes(data)) for k, (data, kind, shape) in everything.items()}
    )
    head = writer.header_bytes(meta, header)
    writer.publish(Path(path), head, lambda _, tmp: writer.write_parts(tmp, len(head), everything, offsets))


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
        A file that is not what it claims: see :class:`arrayquant.io.safetensors.reader.Checkpoint`.
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
                arr = arr.view(ml_dtype(PLAIN[e.dtype][1]))
            elif e.dtype == "BOOL":
                arr = arr.astype(bool)
            out[e.name] = move(arr)
    return out
