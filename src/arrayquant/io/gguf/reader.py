"""A GGUF file's tensors as arrayquant holds them, and its key/values: :func:`load`, :func:`iter_tensors`.

Each tensor is read with a positioned read into a fresh buffer (:mod:`arrayquant.io.gguf.container`),
one at a time. Types map as follows (the exact block maps live in :mod:`arrayquant.io.gguf.types`):

- ``F32``, ``F16``, ``F64``, ``I8`` ... ``I64``: arrays of that dtype; ``BF16``: a bfloat16
  array through ml_dtypes (float32 values, with a note, where ml_dtypes is missing);
- a type whose blocks are exactly an arrayquant scheme (``Q8_0``, ``Q4_0``, ``Q4_1``, ``Q5_0``,
  ``Q5_1``, ``MXFP4``, ...): a :class:`~arrayquant.QuantizedTensor`, bit for bit (Q4_1 and Q5_1
  with their per-block offsets ``m`` as ``QuantizedTensor.offset``);
- ``NVFP4`` with its per-tensor scale as llama.cpp's converter writes it (the F32 tensor
  ``<name>.scale``, ``.weight`` replaced, shape (1,)): one two-level ``nvfp4`` QuantizedTensor;
- every other type (K-quants, IQ-quants, ``Q8_1``, ...) and an exact type whose particular blocks
  are not exact (a Q4_1 block with ``d < 0``, say): float32 values through
  ``gguf.quants.dequantize``, with a note naming the type and why.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from ...backends import default, shim
from ...errors import QuantizationError, SchemeError, ShapeError
from ...tensor import QuantizedTensor
from .. import _dtypes
from . import types as gguf_types
from .container import GGUFFile, TensorInfo, open_gguf
from .ggml import gguf_py, row_bytes, scale_name

__all__ = [
    "ScalePairs",
    "iter_tensors",
    "load",
    "read_metadata",
    "read_tensor",
    "scale_pairs",
    "tensor_shapes",
    "tensor_value",
]

_PLAIN = {k: d.numpy for k, d in _dtypes.GGUF.items() if d.native}  # viewed as NumPy arrays as they are


def _ml_dtypes() -> Any:
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
        return None
    return ml_dtypes


def tensor_value(
    raw: np.ndarray, t: TensorInfo, backend: str | None, device: Any
) -> tuple[QuantizedTensor | np.ndarray, str]:
    """The tensor as arrayquant holds it, and a note ("" unless it was turned into floats)."""
    try:
        return _shaped(raw, t, backend, device)
    except ValueError as exc:  # NumPy's own refusal of an empty shape no array can take
        if isinstance(exc, QuantizationError):
            raise
        msg = f"tensor {t.name!r} has shape {list(t.shape)}, which no array can take ({exc})"
        raise ShapeError(msg) from None


def _shaped(
    raw: np.ndarray, t: TensorInfo, backend: str | None, device: Any
) -> tuple[QuantizedTensor | np.ndarray, str]:
    if t.type_name in _PLAIN:
        return raw.view(_PLAIN[t.type_name]).reshape(t.shape), ""
    if t.type_name == "BF16":
        md = _ml_dtypes()
        if md is not None:
            return raw.view(md.bfloat16).reshape(t.shape), ""
        floats = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
        return floats, "BF16 read as float32 values (ml_dtypes, which holds bfloat16 arrays, is not installed)"
    data = raw.reshape(row_bytes(t.type_name, t.shape))
    if t.type_name in gguf_types.EXACT:
        qt, why = _decode(data, t, backend, device)
        if qt is not None:
            return qt, ""
    else:
        why = "its blocks are not an arrayquant scheme"
    g = gguf_py()
    try:
        with np.errstate(all="ignore"):  # scales of inf or NaN give inf or NaN values, as in llama.cpp
            floats = g.quants.dequantize(data, g.GGMLQuantizationType[t.type_name])
    except NotImplementedError:
        msg = f"tensor {t.name!r} is {t.type_name}, which gguf-py cannot dequantize and arrayquant does not hold"
        raise SchemeError(msg) from None
    return np.asarray(floats, np.float32).reshape(t.shape), f"{t.type_name} read as float32 values: {why}"


def _decode(data: np.ndarray, t: TensorInfo, backend: str | None, device: Any, glob: Any = None) -> tuple[Any, str]:
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


class ScalePairs(NamedTuple):
    """The NVFP4 weights of a file whose per-tensor scale tensor is there, as :func:`scale_pairs` finds them."""

    scales: dict[str, tuple[str, np.ndarray]]  # NVFP4 weight -> (its scale tensor, the f32 scale, shape (1,))
    taken: set[str]  # scale tensors read into their weight, not yielded on their own
    notes: dict[str, str]  # why a scale tensor that is there was not applied (on the weight and the scale)


def scale_pairs(f: GGUFFile) -> ScalePairs:
    """NVFP4 tensors with their per-tensor scale tensor; each scale read (4 bytes) and checked."""
    by_name = {t.name: t for t in f.tensors}
    out = ScalePairs({}, set(), {})
    for t in f.tensors:
        if t.type_name != "NVFP4":
            continue
        sname = scale_name(t.name)
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


def read_tensor(f: GGUFFile, t: TensorInfo, pairs: ScalePairs, backend: str | None, device: Any) -> tuple[Any, str]:
    """One tensor as :func:`tensor_value` gives it, an NVFP4 one with its per-tensor scale where it has one."""
    raw = f.raw(t)
    paired = pairs.scales.get(t.name)
    if paired is None:
        value, note = tensor_value(raw, t, backend, device)
        extra = pairs.notes.get(t.name, "")
        return value, f"{note}; {extra}" if note and extra else note or extra
    sname, g = paired
    data = raw.reshape(row_bytes(t.type_name, t.shape))
    qt, _ = _decode(data, t, backend, device, g)
    if qt is not None:
        return qt, f"NVFP4 with its per-tensor scale {sname} (llama.cpp layout)"
    floats, note = tensor_value(raw, t, backend, device)  # blocks that are not exact: llama.cpp's values, scaled
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
    with open_gguf(path) as f:
        pairs = scale_pairs(f)
        for t in f.tensors:
            if t.name in pairs.taken:
                continue
            value, note = read_tensor(f, t, pairs, "numpy", None)
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
    with open_gguf(path) as f:
        pairs = scale_pairs(f)
        for t in f.tensors:
            if t.name in pairs.taken:
                continue
            value, _ = read_tensor(f, t, pairs, name_, device)
            if not isinstance(value, QuantizedTensor) and not same:
                value = shim.convert(value, name_, device)
            out[t.name] = value
    return out


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Every key/value of a GGUF file as ``gguf.GGUFValue`` (value, type, item type), in file order.

    Scalars come as Python values and strings as ``str``; an array comes as a :class:`GGUFArray`,
    which reads as the list of its items (``==`` with a list, indexing, iteration, ``tolist()``)
    and, for numbers, ``np.asarray`` of it is a view of the stored items. Passed back to
    :func:`~arrayquant.io.gguf.save` as ``metadata``, every value is written as it was read.

    Raises
    ------
    CorruptDataError
        As :func:`iter_tensors`, and a string that is not UTF-8.
    """
    with open_gguf(path) as f:
        return f.fields()


def tensor_shapes(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape as stored (NumPy order), from the header alone.

    An NVFP4 weight's per-tensor scale tensor is listed on its own, as it is stored.

    Raises
    ------
    CorruptDataError
        As :func:`iter_tensors`.
    """
    with open_gguf(path) as f:
        return {t.name: t.shape for t in f.tensors}
