"""Quantizing a safetensors file into arrayquant's layout, and turning one back into floats.

:func:`quantize_file` quantizes the float tensors of a plain safetensors file (a PyTorch or
Hugging Face checkpoint) that :class:`~arrayquant.io._select.Selection` keeps, and copies the
rest; the output is arrayquant's layout or, with ``out_format="burnpack"``, a Burnpack file (the
bridge from PyTorch checkpoints to Burn). :func:`dequantize_file` writes the quantized tensors of
a file back as floats. Tensors are read one at a time at the offsets the header gives, into a
fresh buffer (no memory map: every page of a map that has been read counts against the process
until the map is closed, which for a whole checkpoint is the whole file), and written as they
come, so memory stays near the largest tensor.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...backends import default
from ...convert import asarray
from ...dequantize import dequantize
from ...errors import NonFiniteInputError, PathError, SchemeError
from ...quantize import quantize
from ...scheme import QuantScheme
from ...tensor import QuantizedTensor
from .. import _dtypes
from .._select import Selection
from ..safetensors.reader import Entry, ml_dtype
from ..summary import DequantizeSummary, QuantizeSummary
from .checkpoint import save_stream
from .layout import Checkpoint

__all__ = ["FLOAT_DTYPES", "NONFINITE", "OUT_FORMATS", "Observer", "dequantize_file", "quantize_file", "why_not"]

FLOAT_DTYPES = _dtypes.SAFETENSORS_FLOATS  # the header dtypes quantize_file quantizes: F64, F32, F16, BF16
NONFINITE = ("error", "zero", "saturate")  # what NaN and infinities in a tensor to quantize do
OUT_FORMATS = ("arrayquant", "burnpack")  # the files these functions write

# called with each quantized tensor's name, its float input (on the backend) and the result,
# while both are alive: where a caller measures the error without reading the input again
Observer = Callable[[str, Any, QuantizedTensor], None]


def why_not(e: Entry, selection: Selection) -> str | None:
    """Why :func:`quantize_file` copies the entry ``e`` as it is, or None to quantize it.

    A floating tensor of rank >= 1 is quantized where ``selection`` keeps it (by default a 2-d
    weight, not a norm or a bias).

    >>> why_not(Entry("a.weight", "I32", (8, 8), 0, 256), Selection())
    'not a float tensor (I32)'
    >>> why_not(Entry("a.weight", "F32", (8, 8), 0, 256), Selection()) is None
    True
    """
    if e.dtype not in FLOAT_DTYPES:
        return f"not a float tensor ({e.dtype})"
    if not e.shape:
        return "a scalar"
    return selection.why_not(e.name, e.shape)


def _check_option(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        msg = f"{name}={value!r} is not one of {', '.join(map(repr, allowed))}"
        raise SchemeError(msg)


def _writer(out_format: str) -> Callable[..., None]:
    """The streaming writer of ``out_format``: arrayquant's safetensors layout, or Burnpack."""
    if out_format == "burnpack":
        from ..burn.burnpack import save_stream as save_burnpack

        return save_burnpack
    return save_stream


def _zero_nonfinite(host: np.ndarray) -> tuple[np.ndarray, int]:
    """``host`` with every value that is not finite in float32 (NaN, inf, float64 beyond the f32
    range) set to 0, and how many there were."""
    if host.dtype == np.float64:
        with np.errstate(invalid="ignore"):
            ok = np.abs(host) <= float(np.finfo(np.float32).max)  # NaN compares False
    else:  # f32, f16, bf16: finite means finite in f32
        ok = np.isfinite(host)
    bad = int(ok.size - np.count_nonzero(ok))
    if not bad:
        return host, 0
    out = host.copy()
    out[~ok] = 0
    return out, bad


def _nonfinite_message(name: str, src: str | os.PathLike[str], exc: NonFiniteInputError) -> str:
    """The library's message about ``x`` told about tensor ``name``, with the remedies."""
    head = str(exc).split("; ")[0]
    head = head[2:] if head.startswith("x ") else head
    return (
        f"tensor {name!r} of {os.fspath(src)} {head}; pass nonfinite='zero' (NaN and infinities become 0) "
        "or nonfinite='saturate' (infinities saturate to the ends of the range; NaN gives code 0, "
        "or the NaN code of e4m3/e5m2 values)"
    )


def quantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    scheme: QuantScheme | str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    min_size: int = 0,
    progress: Callable[[str], None] | None = None,
    calibration: Any = None,
    importance: Mapping[str, Any] | None = None,
    nonfinite: str = "error",
    out_format: str = "arrayquant",
    backend: str | None = None,
    device: Any = None,
    observe: Observer | None = None,
) -> QuantizeSummary:
    """Quantize the selected tensors of the safetensors file ``src`` into ``dst``, one at a time.

    Parameters
    ----------
    src : str or path-like
        A plain safetensors file (never changed).
    dst : str or path-like
        The output, written atomically: arrayquant's layout, or Burnpack with
        ``out_format="burnpack"``. The metadata of ``src`` is kept.
    scheme : QuantScheme or str
        The scheme of every quantized tensor.
    include, exclude : sequence of str
        Globs on tensor names (see :class:`~arrayquant.io._select.Selection`): ``include``
        replaces the default choice (2-d weights, not norms or biases), ``exclude`` narrows it.
    min_size : int
        Only tensors of this many elements or more are quantized.
    progress : callable, optional
        Called with each tensor's name once it is written.
    calibration : optional
        What :func:`~arrayquant.quantize` takes (``"mse"``, ``"percentile:99.5"``, ...); default MinMax.
    importance : mapping of str to array, optional
        Importance vectors by tensor name, weighting the search of ``calibration`` for the
        weights they name (the others are searched unweighted).
    nonfinite : {"error", "zero", "saturate"}
        NaN and infinities in a tensor to quantize: refused naming the tensor, set to 0 first,
        or quantized unchecked (infinities saturate, NaN gives code 0 or the NaN code of fp8 values).
    out_format : {"arrayquant", "burnpack"}
        The file written.
    backend, device : optional
        Where the tensors are quantized (default: the default backend). A bfloat16 tensor is
        quantized in float32 (exact) where the backend lacks bfloat16, and keeps its dtype.
    observe : callable, optional
        ``observe(name, x, qt)`` for each quantized tensor while its input ``x`` is alive.

    Returns
    -------
    QuantizeSummary
        ``quantized``, and every other tensor in ``left_out`` with why; ``zeroed`` counts the
        values set to 0 by ``nonfinite="zero"``.

    Raises
    ------
    PathError
        ``src`` holds quantized tensors already (arrayquant's or compressed-tensors' layout).
    NonFiniteInputError
        NaN or infinity in a tensor to quantize, with ``nonfinite="error"`` (naming the tensor).
    SchemeError
        An unknown ``nonfinite`` or ``out_format``, or a scheme or calibration that is refused.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> from arrayquant.io.arrayquant.checkpoint import save_stream
    >>> folder = tempfile.mkdtemp()
    >>> src, dst = os.path.join(folder, "m.safetensors"), os.path.join(folder, "q.safetensors")
    >>> save_stream(src, [("fc.weight", np.ones((4, 32), np.float32)), ("fc.bias", np.zeros(4, np.float32))])
    >>> s = quantize_file(src, dst, "q8s", backend="numpy")
    >>> s.quantized, s.left_out
    (['fc.weight'], {'fc.bias': 'rank 1 (only 2-d weights by default)'})
    >>> d = dequantize_file(dst, os.path.join(folder, "f.safetensors"))
    >>> d.dequantized, d.copied, d.dtype
    (['fc.weight'], ['fc.bias'], '')
    """
    _check_option("nonfinite", nonfinite, NONFINITE)
    _check_option("out_format", out_format, OUT_FORMATS)
    target = scheme if isinstance(scheme, QuantScheme) else QuantScheme.parse(scheme)
    options: dict[str, Any] = {} if calibration is None else {"calibration": calibration}
    source = Path(src)
    if source.is_file():
        from ..compressed_tensors.folder import is_compressed_tensors

        if is_compressed_tensors(source):  # codes under float-looking names
            msg = (
                f"{os.fspath(src)} is in compressed-tensors' layout: its weights are quantized already; quantize "
                "the float model, or turn this one back into floats first"
            )
            raise PathError(msg)
    name = backend or default().name
    vectors = importance or {}
    selection = Selection(include, exclude, min_size)
    summary = QuantizeSummary(out_format, scheme if isinstance(scheme, str) else str(scheme))
    with Checkpoint(src) as ck:
        if ck.described:
            msg = (
                f"{os.fspath(src)} already holds {len(ck.described)} quantized tensors "
                f"(e.g. {next(iter(ck.described))!r}); "
                "quantize the original checkpoint, or `arrayquant dequantize` this one first"
            )
            raise PathError(msg)
        reasons = {e.name: why_not(e, selection) for e in ck.tensors}

        def one(e: Entry) -> QuantizedTensor:
            host = ck.array(e.name)
            if e.dtype == "BF16" and name not in ("numpy", "jax"):  # no bfloat16 there: exact in f32
                host = host.astype(np.float32)
            if nonfinite == "zero":
                host, bad = _zero_nonfinite(host)
                if bad:
                    summary.zeroed[e.name] = bad
            x = asarray(host, backend=name, device=device)
            del host
            weights = {}
            if e.name in vectors:
                weights["importance"] = asarray(vectors[e.name], backend=name, device=device)
            try:
                qt = quantize(x, target, check_finite=nonfinite != "saturate", **options, **weights)
            except NonFiniteInputError as exc:
                raise NonFiniteInputError(_nonfinite_message(e.name, src, exc)) from None
            if e.dtype == "BF16":  # the original dtype, whichever backend quantized it
                qt = dataclasses.replace(qt, dtype=ck.array_dtype(e.name))
            if observe is not None:
                observe(e.name, x, qt)
            return qt  # x goes here: only the quantized tensor is alive while it is written

        def items() -> Iterator[tuple[str, Any]]:
            for e in ck.tensors:
                why = reasons[e.name]
                if why is None:
                    qt = one(e)
                    summary.quantized.append(e.name)
                    yield e.name, qt
                    del qt
                else:
                    summary.left_out[e.name] = why
                    yield e.name, ck.array(e.name)
                if progress is not None:
                    progress(e.name)

        _writer(out_format)(dst, items(), metadata=ck.user_metadata)
    return summary


def _np_dtype(name: str) -> np.dtype[Any]:
    if name == "bfloat16":
        return np.dtype(ml_dtype("bfloat16"))
    return np.dtype(name if name in ("float64", "float32", "float16") else "float32")


def dequantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    dtype: str | None = None,
    names: Collection[str] | None = None,
    out_format: str = "arrayquant",
) -> DequantizeSummary:
    """Write the file ``src`` to ``dst`` with its quantized tensors (those in ``names``; all with
    None) back to floats, every other tensor as stored, one tensor at a time.

    ``src`` is a safetensors file in arrayquant's layout (each tensor goes back to ``dtype``,
    default its original dtype, and the metadata is kept), or a file of another format
    arrayquant reads, GGUF or Burnpack (``dtype`` default float32; tensors read as float values
    are written as they are). ``dst`` is written atomically in arrayquant's layout (a plain
    safetensors file where nothing stays quantized) or, with ``out_format="burnpack"``, Burnpack.

    Raises
    ------
    SchemeError
        An unknown ``out_format``.
    DTypeError
        ``dtype="bfloat16"`` without ml_dtypes installed.
    """
    _check_option("out_format", out_format, OUT_FORMATS)
    write = _writer(out_format)
    from ..formats import detect

    wanted: Callable[[str], bool] = (lambda n: True) if names is None else (lambda n: n in names)
    if detect(src) != "arrayquant":
        out_dtype = _np_dtype(dtype or "float32")
        summary = DequantizeSummary(out_format, out_dtype.name)
        write(dst, _floats(src, out_dtype, wanted, summary), metadata={"format": "pt"})
        return summary
    summary = DequantizeSummary(out_format, dtype or "")
    with Checkpoint(src) as ck:

        def items() -> Iterator[tuple[str, Any]]:
            for e in ck.tensors:
                if e.name in ck.described and wanted(e.name):
                    qt = ck.quantized(e.name)
                    summary.dequantized.append(e.name)
                    yield e.name, dequantize(qt, _np_dtype(dtype or ck.stored_dtype(e.name)))
                elif e.name in ck.described:
                    summary.copied.append(e.name)
                    yield e.name, ck.quantized(e.name)
                else:
                    summary.copied.append(e.name)
                    yield e.name, ck.passthrough(e.name)  # copied as stored, a chunk at a time

        write(dst, items(), metadata=ck.user_metadata)
    return summary


def _floats(
    src: str | os.PathLike[str], dtype: np.dtype[Any], wanted: Callable[[str], bool], summary: DequantizeSummary
) -> Iterator[tuple[str, Any]]:
    """The tensors of a file in any format, the quantized ones that are ``wanted`` dequantized to ``dtype``."""
    from ..formats import iter_tensors

    for name, tensor, _ in iter_tensors(src):
        if isinstance(tensor, QuantizedTensor) and wanted(name):
            summary.dequantized.append(name)
            tensor = dequantize(tensor, dtype)
        else:
            summary.copied.append(name)
        yield name, tensor
        del tensor
