"""Writing GGUF files through gguf-py's :class:`gguf.GGUFWriter`: :func:`save`, and the streaming writer.

:func:`writing` opens a writer on a temporary file beside the target with the header written
(key/values in their order, then every tensor's info); its caller writes each tensor's bytes
in turn with :func:`write_tensor`, so only one tensor is in memory at a time, and the file is
renamed over the target at the end (:mod:`arrayquant.io._atomic`). Arrays read from a file
(:class:`~arrayquant.io.gguf.metadata.GGUFArray`) go back byte for byte.

Metadata beyond the reader's limits (:mod:`arrayquant.io.gguf.container`) is a
:class:`~arrayquant.errors.ParamsError`; a failed write is the system's ``OSError`` naming the
file being written, which is left as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...backends import shim
from ...errors import DTypeError, ParamsError, SchemeError, ShapeError
from ...tensor import QuantizedTensor
from .. import _atomic, _dtypes
from . import types as gguf_types
from .container import MAX_ALIGNMENT, MAX_KEY_BYTES
from .ggml import MAX_DIMS, block_sizes, gguf_py, scale_name, type_nbytes
from .metadata import ALIGN_KEY, ARCH_KEY, GGUFArray, metadata_value

__all__ = ["ARRAY_TYPES", "TensorOut", "save", "write_tensor", "writing"]

ARRAY_TYPES = {d.name: k for k, d in _dtypes.GGUF.items()}  # an array's dtype name -> its GGUF type


def _writer_class() -> Any:
    g = gguf_py()

    class Writer(g.GGUFWriter):  # type: ignore[name-defined]
        """gguf-py's writer, plus empty arrays (which GGUF allows and gguf-py refuses to write),
        :class:`~arrayquant.io.gguf.metadata.GGUFArray` values written back as stored, and write
        errors that name the file."""

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


class TensorOut(NamedTuple):
    """One tensor as it is written: its name, GGUF type, shape and byte count."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    nbytes: int


@contextmanager
def writing(target: Path, arch: str, fields: Mapping[str, Any], plan: Sequence[TensorOut]) -> Iterator[Any]:
    """A gguf-py writer on a temporary file beside ``target`` with the header written; renamed at the end.

    ``fields`` are written in their order and are the only key/values (gguf-py's own
    ``general.architecture`` is replaced by the one in ``fields``, or dropped if it has none).
    The caller writes each tensor of ``plan`` in order with :func:`write_tensor`.
    """
    g = gguf_py()
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
            align = fields.get(ALIGN_KEY)
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
    g = gguf_py()
    if (
        align.type != g.GGUFValueType.UINT32
        or not isinstance(align.value, int)
        or align.value <= 0
        or align.value & (align.value - 1)
    ):
        msg = f"metadata {ALIGN_KEY!r} must be a UINT32 power of two, got {align.value!r}"
        raise ParamsError(msg)
    if align.value > MAX_ALIGNMENT:
        msg = (
            f"metadata {ALIGN_KEY!r} is {align.value}; alignments up to {MAX_ALIGNMENT} (a 64 KiB page) are written "
            f"and read, as every tensor is padded with up to that many zero bytes; use {MAX_ALIGNMENT} or less"
        )
        raise ParamsError(msg)


def _folds(qt: QuantizedTensor) -> bool:
    """Whether a two-level nvfp4 tensor's per-tensor scale folds exactly into its UE4M3 block scales.

    The same check :func:`gguf_types.encode` makes, on the scales alone (1/16 of the values).
    """
    glob = np.asarray(shim.to_host(qt.global_scale)).astype(np.float32).reshape(1)
    try:
        gguf_types.fold_scales(np.asarray(shim.to_host(qt.scales)).astype(np.float32), float(glob[0]))
    except SchemeError:
        return False
    return True


def _tensor_out(name: str, value: Any) -> list[tuple[TensorOut, Callable[[], np.ndarray]]]:
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
            msg = (
                f"tensor {name!r}: scheme {value.scheme} has no GGUF type; GGUF holds exactly {gguf_types.exact_list()}"
            )
            raise SchemeError(msg)
        shape = tuple(int(n) for n in value.shape)
        block = block_sizes(type_name)[0]
        if not shape or shape[-1] % block:
            msg = f"tensor {name!r}: {type_name} needs rows of whole {block}-value blocks, the shape is {list(shape)}"
            raise ShapeError(msg)

        out = TensorOut(name, type_name, shape, type_nbytes(type_name, shape))
        if type_name == "NVFP4" and value.global_scale is not None and not _folds(value):
            glob = np.asarray(shim.to_host(value.global_scale)).astype("<f4").reshape(1)

            def blocks() -> np.ndarray:
                _, data, _ = gguf_types.encode_split(value)
                return np.ascontiguousarray(np.asarray(data, np.uint8))

            return [(out, blocks), (TensorOut(scale_name(name), "F32", (1,), 4), lambda: glob.view(np.uint8))]

        def encoded() -> np.ndarray:
            _, data = gguf_types.encode(value)
            return np.ascontiguousarray(np.asarray(data, np.uint8))

        return [(out, encoded)]
    arr = shim.to_host(value) if not isinstance(value, np.ndarray) else value
    type_name_ = ARRAY_TYPES.get(arr.dtype.name)
    if type_name_ is None:
        msg = (
            f"tensor {name!r}: GGUF holds arrays of {', '.join(sorted(ARRAY_TYPES))}, not {arr.dtype.name}; "
            "convert it first"
        )
        raise DTypeError(msg)
    if arr.ndim > MAX_DIMS:
        msg = f"tensor {name!r} has {arr.ndim} dimensions; GGUF tensors have at most {MAX_DIMS}"
        raise ShapeError(msg)
    little = arr.astype(arr.dtype.newbyteorder("<"), copy=False) if arr.dtype.byteorder == ">" else arr
    return [
        (TensorOut(name, type_name_, tuple(arr.shape), arr.nbytes), lambda: np.ascontiguousarray(little).view(np.uint8))
    ]


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
        :mod:`arrayquant.io.gguf.types`), written as that type; arrays of float32, float16,
        bfloat16, float64 or int8 ... int64, written as ``F32``, ``F16``, ``BF16``, ...
        A two-level ``nvfp4`` tensor is ``NVFP4`` with its per-tensor scale folded into the
        block scales where that is exact; otherwise, as llama.cpp stores it, ``NVFP4`` followed
        by the per-tensor scale as the F32 tensor of shape (1,) ``<name>.scale`` (``.weight``
        replaced: ``blk.0.attn_q.weight`` -> ``blk.0.attn_q.scale``), which :func:`~arrayquant.io.gguf.iter_tensors`
        and :func:`~arrayquant.io.gguf.load` read back into the one two-level tensor.
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
        :data:`~arrayquant.io.gguf.MAX_KEY_BYTES`, or a ``general.alignment`` that is no power of two up to
        :data:`~arrayquant.io.gguf.MAX_ALIGNMENT`.
    OSError
        The file cannot be written (a full disk, say); the error names ``path``, which is left
        as it was.
    """
    target = Path(path)
    g = gguf_py()
    fields: dict[str, Any] = {}
    given = dict(metadata or {})
    arch_value = given.pop(ARCH_KEY, None)
    arch_name = arch if arch is not None else (arch_value.value if isinstance(arch_value, g.GGUFValue) else arch_value)
    fields[ARCH_KEY] = g.GGUFValue(str(arch_name or "arrayquant"), g.GGUFValueType.STRING)
    for key, value in given.items():
        if not isinstance(key, str) or not key or key.startswith("GGUF."):
            msg = f"metadata key {key!r}: keys are non-empty strings, and GGUF.* names gguf-py's own entries"
            raise ParamsError(msg)
        if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:  # what reading refuses
            msg = f"metadata key {key[:40]!r}... is longer than GGUF's {MAX_KEY_BYTES} bytes for a key; shorten it"
            raise ParamsError(msg)
        fields[key] = metadata_value(key, value)
    _check_alignment(fields.get(ALIGN_KEY))
    outs: list[tuple[TensorOut, Callable[[], np.ndarray]]] = []
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
    with writing(target, fields[ARCH_KEY].value, fields, [o for o, _ in outs]) as writer:
        for o, data in outs:
            write_tensor(writer, o, data())


def write_tensor(writer: Any, o: TensorOut, data: np.ndarray) -> None:
    """Write the bytes of ``o``, the next tensor of the writer's plan, refusing a byte count its shape does not take."""
    if data.nbytes != o.nbytes:
        msg = (
            f"tensor {o.name!r}: {data.nbytes} bytes of {o.type_name} where its shape {list(o.shape)} needs {o.nbytes}"
        )
        raise ShapeError(msg)
    writer.write_tensor_data(data.reshape(-1))
