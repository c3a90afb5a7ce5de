"""The file formats arrayquant reads and writes: one :class:`Format` record each, in one table.

Every format is a package under ``io/`` whose *entry module* implements the same protocol
(``NAME``, ``sniff``, ``load``, ``iter_tensors``, ``tensor_shapes``, ``save``, ``quantize_file``,
``dequantize_file``). This table is the only place that names them: :func:`detect` asks each
format in turn whether a path is one of its files, and ``aq.load``, ``aq.save``,
:func:`quantize_file`, :func:`dequantize_file` and every ``arrayquant`` command go through it.
Adding a format is adding its package and one line to :data:`FORMATS`.

============================  ==========================================================
format                        recognised by
============================  ==========================================================
``gguf``                      the file starts with ``GGUF`` (llama.cpp, ollama)
``burnpack``                  the file starts with Burn's magic, ``NRUB`` (u32 0x4255524E)
``compressed-tensors``        a model folder, or a safetensors file whose metadata, or
                              ``config.json`` beside it, holds a compressed-tensors
                              ``quantization_config``
``onnx``                      a ``.onnx`` file that starts as an ONNX model does
                              (``matmulnbits`` is its MatMulNBits output form, never detected)
``arrayquant``                any other safetensors file (arrayquant's own layout, or plain)
============================  ==========================================================

The GGUF and Burnpack formats need their optional packages (``gguf``, ``cbor2``); using them
without those installed is a :class:`~arrayquant.errors.BackendUnavailableError` that says what
to install.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import BackendUnavailableError, SchemeError
from ..scheme import QuantScheme
from .paths import open_regular
from .summary import DequantizeSummary, QuantizeSummary

__all__ = [
    "FORMATS",
    "Format",
    "by_suffix",
    "dequantize_file",
    "detect",
    "format_module",
    "get_format",
    "iter_tensors",
    "load",
    "names",
    "quantize_file",
    "save",
    "tensor_shapes",
]


@dataclass(frozen=True)
class Format:
    """One file format: its name, how its files are named, and the module that implements it.

    The entry module is imported on first use, so a format whose optional package is missing
    costs nothing until a file of it is met.
    """

    name: str  # as ``detect`` returns it and ``format=`` takes it
    title: str  # as messages name its files
    entry: str  # dotted path of the module implementing the protocol
    suffix: str = ""  # the file name suffix that names this format ("" for a folder format)
    extra: str | None = None  # the pip extra that installs its optional package

    def module(self) -> ModuleType:
        """The entry module.

        Raises
        ------
        BackendUnavailableError
            The format's package is missing (the message names the extra to install).
        """
        try:
            return importlib.import_module(self.entry)
        except ImportError as exc:
            extra = f" (pip install 'arrayquant[{self.extra}]')" if self.extra else ""
            msg = f"the {self.name} format needs {exc.name or 'a package'}{extra}"
            raise BackendUnavailableError(msg) from None

    def sniff(self, path: Path) -> bool:
        """Whether ``path`` is a file (or folder) of this format, from its first bytes or its files."""
        return bool(self.module().sniff(path))

    def load(self, path: Path, *, backend: str | None = None, device: Any = None) -> dict[str, Any]:
        loaded: dict[str, Any] = self.module().load(path, backend=backend, device=device)
        return loaded

    def iter_tensors(self, path: Path) -> Iterator[tuple[str, Any, str]]:
        yield from self.module().iter_tensors(path)

    def tensor_shapes(self, path: Path) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = self.module().tensor_shapes(path)
        return shapes

    def save(self, path: Path, tensors: Mapping[str, Any], **options: Any) -> None:
        _check_options(self, "save", self.module().save, options)
        self.module().save(path, tensors, **options)


# detect asks in this order; the last one takes any other file
FORMATS: tuple[Format, ...] = (
    Format("gguf", "GGUF", "arrayquant.io.gguf", ".gguf", "gguf"),
    Format("burnpack", "Burnpack", "arrayquant.io.burn.burnpack", ".bpk", "burn"),
    Format("compressed-tensors", "compressed-tensors", "arrayquant.io.compressed_tensors.format"),
    Format("onnx", "ONNX", "arrayquant.io.onnx.format", ".onnx", "onnx"),
    # an output form of ONNX models (MatMulNBits nodes), never detected: format="matmulnbits" only
    Format("matmulnbits", "ONNX (MatMulNBits)", "arrayquant.io.onnx.matmulnbits", "", "onnx"),
    Format("arrayquant", "safetensors", "arrayquant.io.arrayquant.format", ".safetensors"),
)
_BY_NAME = {f.name: f for f in FORMATS}

# which format's quantize_file / dequantize_file writes (input format, output format): the input's
# own, except where another one bridges to it (a safetensors file into a model folder)
_QUANTIZE_ROUTES = {
    ("gguf", "gguf"): "gguf",
    ("burnpack", "burnpack"): "burnpack",
    ("compressed-tensors", "compressed-tensors"): "compressed-tensors",
    ("arrayquant", "compressed-tensors"): "compressed-tensors",
    ("arrayquant", "arrayquant"): "arrayquant",
    ("arrayquant", "burnpack"): "arrayquant",  # the bridge from PyTorch/HF checkpoints to Burn
    ("onnx", "onnx"): "onnx",
    ("onnx", "matmulnbits"): "onnx",
}
_DEQUANTIZE_ROUTES = {
    ("gguf", "gguf"): "gguf",
    ("burnpack", "burnpack"): "burnpack",
    ("compressed-tensors", "compressed-tensors"): "compressed-tensors",
    ("arrayquant", "arrayquant"): "arrayquant",
    ("arrayquant", "burnpack"): "arrayquant",
    ("gguf", "arrayquant"): "arrayquant",  # any tensors, back to floats, as one safetensors file
    ("burnpack", "arrayquant"): "arrayquant",
    ("onnx", "onnx"): "onnx",
    ("onnx", "arrayquant"): "arrayquant",  # the weights alone, as one safetensors file of floats
}


def names() -> tuple[str, ...]:
    """The format names, in :func:`detect`'s order.

    >>> names()
    ('gguf', 'burnpack', 'compressed-tensors', 'onnx', 'matmulnbits', 'arrayquant')
    """
    return tuple(f.name for f in FORMATS)


def get_format(name: str) -> Format:
    """The :class:`Format` called ``name``.

    Raises
    ------
    SchemeError
        A name that is not one of ``names()``.
    """
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        msg = f"format {name!r} is not one arrayquant knows; use one of {', '.join(map(repr, names()))}"
        raise SchemeError(msg) from None


def by_suffix(path: str | os.PathLike[str]) -> str | None:
    """The format a file name's suffix names (``.gguf``, ``.bpk``, ``.safetensors``), or None.

    >>> by_suffix("model-q4_0.GGUF"), by_suffix("weights.bin")
    ('gguf', None)
    """
    suffix = Path(path).suffix.lower()
    return next((f.name for f in FORMATS if f.suffix and f.suffix == suffix), None)


def detect(path: str | os.PathLike[str]) -> str:
    """The format of ``path``, by its content: one of ``names()``.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.bin")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"GGUF" + bytes(20))
    >>> detect(path)
    'gguf'
    """
    path = Path(path)
    if not path.is_dir():
        with open_regular(path):  # a FIFO or a device is refused, not waited on or read forever
            pass
    for fmt in FORMATS[:-1]:
        if fmt.sniff(path):
            return fmt.name
    return FORMATS[-1].name


def load(path: str | os.PathLike[str], *, backend: str | None = None, device: Any = None) -> dict[str, Any]:
    """Every tensor of a file or model folder in any format arrayquant reads, by name.

    The format is found from the content (see :func:`detect`): arrayquant's safetensors layout,
    a compressed-tensors folder or file, GGUF or Burnpack. Tensors stored exactly as an
    arrayquant scheme come back as :class:`~arrayquant.QuantizedTensor`, the others as arrays
    (on ``backend`` and ``device``; default: the default backend).

    Raises
    ------
    CorruptDataError
        A file that is not what it claims, in any format.
    BackendUnavailableError
        A GGUF or Burnpack file without its package installed.
    ShapeError, SchemeError, ParamsError
        A tensor whose parts do not fit its description, each naming the tensor.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> aq.save(path, {"w": aq.quantize(np.ones((2, 64), np.float32), "nf4")})
    >>> str(aq.load(path, backend="numpy")["w"].scheme)
    'nf4'
    """
    return get_format(detect(path)).load(Path(path), backend=backend, device=device)


def save(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    *,
    format: str | None = None,  # noqa: A002
    **options: Any,
) -> None:
    """Write quantized tensors and arrays to one file, atomically, in ``format``.

    Parameters
    ----------
    path : str or path-like
        The output file; replaced atomically if it exists.
    tensors : mapping of str to QuantizedTensor or array
        What to write.
    format : {"arrayquant", "compressed-tensors", "gguf", "burnpack"}, optional
        By default from the file name: ``.gguf`` is GGUF, ``.bpk`` Burnpack, anything else
        arrayquant's safetensors layout.
    **options
        What the format takes besides (GGUF: ``metadata``; Burnpack: ``param_ids``,
        ``metadata``).

    Raises
    ------
    SchemeError
        An unknown format, an option the format does not take, or a scheme the format cannot
        hold (the message lists those it can).
    BackendUnavailableError
        GGUF or Burnpack without its package installed.
    """
    name = format or by_suffix(path) or "arrayquant"
    if name not in _BY_NAME:
        msg = f"format {name!r} is not one aq.save writes; use one of {', '.join(map(repr, names()))}"
        raise SchemeError(msg)
    _BY_NAME[name].save(Path(path), tensors, **options)


def iter_tensors(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any, str]]:
    """``(name, tensor, note)`` for every tensor of a file or folder, one at a time, on the host.

    ``tensor`` is a :class:`~arrayquant.QuantizedTensor` (NumPy) or a NumPy array; ``note`` is
    ``""`` or says how a tensor was read (a GGUF type read as float values, say).
    """
    yield from get_format(detect(path)).iter_tensors(Path(path))


def tensor_shapes(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape (as stored), from the file's header alone.

    A model folder gives the entries of all its shards; arrayquant's own quantized tensors appear
    under their stored entry names.
    """
    return get_format(detect(path)).tensor_shapes(Path(path))


def _check_options(fmt: Format, what: str, fn: Callable[..., Any], options: Mapping[str, Any]) -> None:
    """Refuse an option ``fn`` does not take by name, before any work, naming the format."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(k for k in options if k not in params)
    if unknown:
        if what == "save":
            msg = f"format {fmt.name!r} takes no options, got {unknown}"
        else:
            msg = f"{what} into {fmt.title} does not take {', '.join(unknown)}"
        raise SchemeError(msg)


def _route(routes: Mapping[tuple[str, str], str], what: str, src: str, out: str) -> Format:
    try:
        return _BY_NAME[routes[src, out]]
    except KeyError:
        pairs = ", ".join(f"{a} -> {b}" for a, b in routes)
        msg = f"{what} does not write {_BY_NAME[out].title} from {_BY_NAME[src].title}; it writes {pairs}"
        raise SchemeError(msg) from None


def _out_format(src: Path, dst: str | os.PathLike[str], given: str | None, kind: str) -> str:
    """``format=``, else the format OUT's suffix names, else the input's own."""
    if given is not None:
        return get_format(given).name
    return by_suffix(dst) or ("compressed-tensors" if src.is_dir() else kind)


def quantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    scheme: QuantScheme | str,
    *,
    format: str | None = None,  # noqa: A002
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> QuantizeSummary:
    """Quantize the weights of a file or model folder into a new one, in any format, tensor by tensor.

    The input's format comes from its content (:func:`detect`); the output's from ``format``,
    else OUT's suffix (``.gguf``, ``.bpk``, ``.safetensors``), else the input's own (a model
    folder gives a compressed-tensors folder). Each format applies its own rule for which
    tensors it quantizes (llama-quantize's for GGUF, the ``Linear`` weights for a folder, the
    2-d weights otherwise), narrowed by ``include`` / ``exclude`` globs; everything else is
    copied as stored. Memory stays near a few copies of the largest tensor.

    Parameters
    ----------
    src, dst : path
        What to read and what to write (written atomically; a folder must not exist yet).
    scheme : QuantScheme or str
        The scheme, e.g. ``"q4_0"``, ``"nvfp4"``, ``"q8s:block32:f16"``.
    format : {"arrayquant", "compressed-tensors", "gguf", "burnpack"}, optional
        The output format.
    progress : callable, optional
        Called with each tensor's name as it is written.
    **options
        ``include``, ``exclude``, ``calibration``, ``importance`` (a mapping of per-column
        vectors) for every format; and what one format takes besides (``max_shard_size``,
        ``fused_shards`` for folders; ``min_size``, ``nonfinite``, ``backend``, ``device`` for
        safetensors files).

    Returns
    -------
    QuantizeSummary
        The tensors quantized, and every one left out with why.

    Raises
    ------
    SchemeError
        An output format the input cannot be written as, or an option the format does not take.
    PathError
        OUT is IN, or a folder OUT is not new.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> aq.save(os.path.join(d, "m.safetensors"), {"fc.weight": np.ones((4, 64), np.float32)})
    >>> s = aq.quantize_file(os.path.join(d, "m.safetensors"), os.path.join(d, "q.safetensors"), "q8s")
    >>> s.format, s.quantized
    ('arrayquant', ['fc.weight'])
    """
    source = Path(src)
    kind = detect(source)
    out = _out_format(source, dst, format, kind)
    fmt = _route(_QUANTIZE_ROUTES, "quantize_file", kind, out)
    fn = fmt.module().quantize_file
    if out != fmt.name:
        options["out_format"] = out
    _check_options(get_format(out), "quantize_file", fn, options)
    summary: QuantizeSummary = fn(source, dst, scheme, progress=progress, **options)
    return summary


def dequantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    dtype: str | None = None,
    format: str | None = None,  # noqa: A002
    names: Sequence[str] | None = None,
) -> DequantizeSummary:
    """Turn the quantized tensors of a file or model folder back into floats, in a new one.

    The output's format is ``format``, else OUT's suffix, else the input's own (GGUF and
    Burnpack may also be written as one safetensors file). Quantized tensors (those in
    ``names``; all by default) become ``dtype`` (default float32, or each tensor's original
    dtype where the format records it); everything else is copied as stored.

    Raises
    ------
    SchemeError
        An output format the input cannot be written as.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> aq.save(os.path.join(d, "q.safetensors"), {"w": aq.quantize(np.ones((2, 32), np.float32), "q8s")})
    >>> s = aq.dequantize_file(os.path.join(d, "q.safetensors"), os.path.join(d, "f.safetensors"))
    >>> s.dequantized
    ['w']
    """
    source = Path(src)
    kind = detect(source)
    out = _out_format(source, dst, format, kind)
    fmt = _route(_DEQUANTIZE_ROUTES, "dequantize_file", kind, out)
    extra = {"out_format": out} if out != fmt.name else {}
    summary: DequantizeSummary = fmt.module().dequantize_file(source, dst, dtype=dtype, names=names, **extra)
    return summary


def format_module(name: str) -> ModuleType:
    """The entry module of the format ``name``: the protocol functions and what else it exports.

    Raises
    ------
    SchemeError
        A name that is not one of ``names()``.
    BackendUnavailableError
        The format's package is missing (the message names the extra to install).
    """
    return get_format(name).module()
