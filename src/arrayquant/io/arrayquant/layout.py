"""arrayquant's own safetensors layout: its names, and :class:`Checkpoint`, the reader that checks it.

Layout (format 2), per quantized tensor ``name``:

- ``name.qvalues``: the stored values (int8, uint8 or uint32 words, as the scheme stores them);
- ``name.scales``: the stored scales, in safetensors' own dtypes (F32, F16, BF16, F8_E4M3 for
  UE4M3, F8_E8M0 for UE8M0);
- ``name.global_scale``: the f32 per-tensor scale of a two-level scheme, shape ``(1,)``;
- ``name.table``: a lookup table, f32;
- ``name.zero_point`` (zero-point mode): one integer per scale, I8 (U8 for unsigned values),
  shaped as the scales; ``name.offset`` (offset mode): one offset per scale, in the scales' dtype;
- in the file's metadata, ``arrayquant.tensor.<name>``: JSON with the scheme, original dtype and
  shape; ``arrayquant.format`` names the format version (``"2"``).

No entry carries the tensor's own name, so a float loader that looks for ``name`` (a
``state_dict`` with ``strict=True``, say) reports it missing instead of taking the codes for
weights. Plain arrays are stored under their names, as any safetensors file. Format 1, written
before, stored the values under ``name`` itself; it is still read.

:class:`Checkpoint` adds the layout's checks to :class:`~arrayquant.io.safetensors.reader.SafetensorsFile`:
the format version, every quantized tensor's description parsed on open and the complete set of
entries it needs (values, scales, the per-tensor scale exactly when the scheme has two levels),
no stray entry that looks like a part of a tensor that is not described. ``aq.load`` and every
``arrayquant`` command read arrayquant files through it; :mod:`arrayquant.io.arrayquant.checkpoint`
writes them.
"""

from __future__ import annotations

import functools
import json
import math
import os
import reprlib
from typing import Any, NamedTuple

import array_api_compat as compat
import numpy as np

from ...backends import shim
from ...errors import (
    CorruptDataError,
    MissingGlobalScaleError,
    QuantizationError,
    ShapeError,
    UnexpectedGlobalScaleError,
)
from ...invariants import Plan, check_params, check_shape, check_zero, plan_for
from ...scheme import QParams, QuantMode, QuantScheme, ScaleDtype
from ...storage import values_layout
from ...tensor import QuantizedTensor
from .. import _dtypes
from ..burn.bytes import check_codes, decode_scales
from ..safetensors.reader import Entry, SafetensorsFile

__all__ = [
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "PARTS",
    "READABLE_VERSIONS",
    "SCALE_DTYPES",
    "SIBLINGS",
    "TENSOR_KEY",
    "VALUES_SUFFIX",
    "VALUE_DTYPES",
    "Checkpoint",
]

FORMAT_VERSION = "2"
READABLE_VERSIONS = ("1", "2")  # "1": values under the tensor's own name
VALUES_SUFFIX = ".qvalues"
FORMAT_KEY = "arrayquant.format"  # the metadata key naming the format version
TENSOR_KEY = "arrayquant.tensor."  # + a quantized tensor's name: the metadata key describing it
PARTS = (".scales", ".global_scale", ".table", ".zero_point", ".offset")  # entries besides the values
SIBLINGS = (VALUES_SUFFIX, *PARTS)  # suffixes no tensor name may end with
# the header dtype of each scale dtype and of each stored values dtype
SCALE_DTYPES = {
    ScaleDtype.F32: "F32",
    ScaleDtype.F16: "F16",
    ScaleDtype.BF16: "BF16",
    ScaleDtype.UE4M3: "F8_E4M3",
    ScaleDtype.UE8M0: "F8_E8M0",
}
VALUE_DTYPES = {"int8": "I8", "uint8": "U8", "uint32": "U32"}
_FLOAT_DTYPES = _dtypes.FLOAT_NAMES
_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlist, _short.maxdict = 60, 60, 8, 4


class _Described(NamedTuple):
    """A quantized tensor's description in the metadata, parsed and checked."""

    scheme: QuantScheme
    plan: Plan
    shape: tuple[int, ...]
    dtype: str


@functools.lru_cache(maxsize=256)
def _parse_scheme(text: str) -> QuantScheme:
    return QuantScheme.parse(text)  # a checkpoint names few schemes for many tensors


def _described(name: str, info: str) -> _Described:
    try:
        meta = json.loads(info)
        text = meta["scheme"]
        scheme = _parse_scheme(text) if isinstance(text, str) else QuantScheme.parse(text)
        shape = check_shape(meta["shape"], f"{name} shape in the metadata")
        dtype = str(meta["dtype"])
        plan = plan_for(scheme)
    except QuantizationError as exc:
        msg = f"tensor {name!r}: {exc}"
        raise type(exc)(msg) from None
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        msg = f"tensor {name!r} has unreadable metadata {_short.repr(info)}: {_short.repr(str(exc))}"
        raise CorruptDataError(msg) from None
    if dtype not in _FLOAT_DTYPES:
        msg = (
            f"tensor {name!r} has original dtype {_short.repr(dtype)} in the metadata; it must be one of "
            f"{', '.join(_FLOAT_DTYPES)} (the float dtype the tensor was quantized from)"
        )
        raise CorruptDataError(msg)
    return _Described(scheme, plan, shape, dtype)


class Checkpoint(SafetensorsFile):
    """A safetensors file read as an arrayquant checkpoint: quantized tensors and plain arrays.

    On open, beyond :class:`SafetensorsFile`'s checks: the format version is one this version
    reads, every quantized tensor described in the metadata parses (scheme, shape, dtype) and has
    its complete set of entries, and no entry looks like a part of a tensor that is not
    described. ``described`` maps quantized tensor names to their metadata text; ``tensors``
    lists the tensors of the file in file order, a quantized one as its values entry under the
    tensor's own name; ``siblings`` holds the entry names that are parts of a quantized tensor.

    Raises
    ------
    CorruptDataError, ShapeError, SchemeError, MissingGlobalScaleError, UnexpectedGlobalScaleError
        Typed errors that name the tensor, for every defect found on open.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        try:
            self._check_layout()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Checkpoint:
        return self

    def _check_layout(self) -> None:
        version = self.metadata.get(FORMAT_KEY)
        self.described = {k[len(TENSOR_KEY) :]: v for k, v in self.metadata.items() if k.startswith(TENSOR_KEY)}
        if version is None and self.described:
            msg = f"{self.path} describes quantized tensors but names no {FORMAT_KEY}; it was not written by arrayquant"
            raise CorruptDataError(msg)
        if version is not None and version not in READABLE_VERSIONS:
            msg = (
                f"{self.path} has checkpoint format {version!r}; this arrayquant reads format {FORMAT_VERSION!r} "
                f"(and the older {', '.join(repr(v) for v in READABLE_VERSIONS if v != FORMAT_VERSION)}), upgrade it"
            )
            raise CorruptDataError(msg)
        self.version = version or FORMAT_VERSION
        legacy = self.version == "1"
        suffixes = PARTS if legacy else SIBLINGS
        self._info: dict[str, _Described] = {}
        self._values: dict[str, str] = {}  # values entry -> tensor name
        self.siblings: set[str] = set()
        for name, info in self.described.items():
            if not name or name.endswith(suffixes):
                msg = f"{self.path}: the metadata describes a quantized tensor named {name!r}, which no writer allows"
                raise CorruptDataError(msg)
            self._info[name] = d = _described(name, info)
            values = self.values_key(name)
            if values not in self.entries:
                msg = f"tensor {name!r} is described in the metadata but its values entry {values!r} is missing"
                raise CorruptDataError(msg)
            if not legacy and name in self.entries:
                msg = (
                    f"{self.path}: entry {name!r} has the name of the quantized tensor {name!r} (whose values are "
                    f"{values!r}); a format-{self.version} checkpoint cannot hold both"
                )
                raise CorruptDataError(msg)
            if name + ".scales" not in self.entries:
                msg = f"tensor {name!r} (scheme {d.scheme}) has no {name}.scales entry; the checkpoint is incomplete"
                raise CorruptDataError(msg)
            has_global = name + ".global_scale" in self.entries
            if d.plan.two_level and not has_global:
                msg = (
                    f"tensor {name!r} uses the two-level scheme {d.scheme}, but the checkpoint has no per-tensor "
                    f"scale entry {name}.global_scale; re-export the tensor with its f32 per-tensor scale (shape (1,))"
                )
                raise MissingGlobalScaleError(msg)
            if has_global and not d.plan.two_level:
                msg = (
                    f"tensor {name!r} has scheme {d.scheme}, which has one scale level, but the checkpoint has "
                    f"{name}.global_scale"
                )
                raise UnexpectedGlobalScaleError(msg)
            for part, mode in ((".zero_point", QuantMode.ZERO_POINT), (".offset", QuantMode.OFFSET)):
                has = name + part in self.entries
                if has != (d.plan.mode is mode):
                    msg = (
                        f"tensor {name!r} has scheme {d.scheme} ({d.plan.mode.value} mode) and "
                        f"{'an' if has else 'no'} {name}{part} entry; "
                        + (f"{mode.value} mode needs one" if not has else f"only {mode.value} mode has one")
                    )
                    raise CorruptDataError(msg)
            self._values[values] = name
            self.siblings.update(name + s for s in suffixes)
        stray = [k for k in self.entries if k.endswith(suffixes) and k not in self.siblings]
        if stray:
            shown = sorted(stray)[:10] + (["..."] if len(stray) > 10 else [])
            msg = f"{self.path} has entries {shown} that belong to no quantized tensor in its metadata"
            raise CorruptDataError(msg)
        self.tensors: list[Entry] = [
            Entry(self._values[e.name], e.dtype, e.shape, e.start, e.stop) if e.name in self._values else e
            for e in self.entries.values()
            if e.name in self._values or e.name not in self.siblings
        ]

    def values_key(self, name: str) -> str:
        """The entry holding quantized tensor ``name``'s stored values (``name.qvalues``; ``name`` in format 1)."""
        return name if self.version == "1" else name + VALUES_SUFFIX

    def parts(self, name: str) -> list[str]:
        """The entries of quantized tensor ``name``: values, scales, and the per-tensor scale and table if present."""
        keys = [self.values_key(name), *(name + s for s in PARTS)]
        return [k for k in keys if k in self.entries]

    @property
    def user_metadata(self) -> dict[str, str]:
        """The metadata entries that are not arrayquant's own (carried over to a written file)."""
        return {k: v for k, v in self.metadata.items() if not k.startswith("arrayquant.")}

    def stored_dtype(self, name: str) -> str:
        """The original dtype name of a quantized tensor, from the metadata."""
        return self._info[name].dtype

    def _part(self, name: str, key: str, want: str) -> Entry:
        e = self.entries[key]
        if e.dtype != want:
            msg = f"tensor {name!r}: entry {key!r} has dtype {e.dtype}, expected {want}"
            raise CorruptDataError(msg)
        return e

    def quantized(self, name: str, *, backend: str = "numpy", device: Any = None) -> QuantizedTensor:
        """The quantized tensor ``name``, every stored array checked before it is built.

        Shapes and dtypes are checked against the scheme before any bytes are read, so a lying
        description cannot make a small file allocate much.

        Raises
        ------
        CorruptDataError
            A part of the wrong dtype, a stored value or scale code no decoder reads.
        ShapeError
            Values or scales of a shape the scheme does not store for the described shape.
        ParamsError
            NaN, infinite, negative or zero scales where the scheme forbids them, a stray table.
        """
        d = self._info[name]
        plan, shape = d.plan, d.shape
        vkey = self.values_key(name)
        vshape, vdtype = values_layout(plan, shape)
        values_entry = self._part(name, vkey, VALUE_DTYPES[vdtype])
        if values_entry.shape != vshape:
            msg = (
                f"tensor {name!r}: values have shape {values_entry.shape} but scheme {d.scheme} on shape {shape} "
                f"stores {vshape}"
            )
            raise ShapeError(msg)
        grid = plan.grid_shape(shape)
        scales_entry = self._part(name, name + ".scales", SCALE_DTYPES[plan.scale_dtype])
        if scales_entry.shape != grid:
            msg = f"tensor {name!r}: {name}.scales has shape {scales_entry.shape} but scheme {d.scheme} needs {grid}"
            raise ShapeError(msg)
        values = self.raw(vkey).astype(vdtype)
        check_codes(values, plan, f"tensor {name!r}")
        glob = table = None
        try:
            scales = decode_scales(self.raw(name + ".scales").tobytes(), plan.scale_dtype, math.prod(grid))
            scales = scales.reshape(grid)
            if plan.two_level:
                self._part(name, name + ".global_scale", "F32")
                glob = self.raw(name + ".global_scale").astype(np.float32)
            if name + ".table" in self.entries:
                self._part(name, name + ".table", "F32")
                table = self.raw(name + ".table").astype(np.float32)
            zp = offset = None
            if plan.mode is QuantMode.ZERO_POINT:
                zp = self._grid_part(name, ".zero_point", VALUE_DTYPES[plan.code_dtype], grid).astype(plan.code_dtype)
            elif plan.mode is QuantMode.OFFSET:
                self._grid_part(name, ".offset", SCALE_DTYPES[plan.scale_dtype], grid)
                offset = decode_scales(self.raw(name + ".offset").tobytes(), plan.scale_dtype, math.prod(grid))
                offset = offset.reshape(grid)
            xp_np = compat.array_namespace(scales)
            stored = QParams(scales, glob, table, zp, offset)
            scales, glob, table = check_params(stored, plan, shape, xp_np, "cpu", what=name)
            check_zero(stored, plan, shape, xp_np, "cpu", what=name)
        except QuantizationError as exc:
            text = str(exc)
            raise type(exc)(text if text.startswith(f"tensor {name!r}") else f"tensor {name!r}: {text}") from None
        xp = shim.namespace(backend)
        if backend.strip().lower() == "numpy" and device is None:  # host arrays as read: nothing to convert
            move: Any = lambda a: a
        else:
            move = lambda a: None if a is None else shim.convert(a, backend, device)
        return QuantizedTensor(
            d.scheme,
            shape,
            getattr(xp, d.dtype, xp.float32),
            move(values),
            move(scales),
            move(glob),
            move(table),
            zero_point=None if zp is None else move(zp),
            offset=None if offset is None else move(offset),
        )

    def _grid_part(self, name: str, part: str, want: str, grid: tuple[int, ...]) -> Any:
        """A grid-shaped part (zero points, offsets) of dtype ``want``, as read."""
        e = self._part(name, name + part, want)
        if e.shape != grid:
            msg = f"tensor {name!r}: {name}{part} has shape {e.shape} but the scales' grid is {grid}"
            raise ShapeError(msg)
        return self.raw(name + part)
