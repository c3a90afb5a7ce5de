"""The file formats arrayquant reads and writes, and the one place that tells them apart.

Each format is one module under ``io/`` with the same few functions (``load``, ``save``,
``iter_tensors``, and for the command line ``quantize_file``); this registry picks the module for
a path by what the path holds, not by its name, so ``aq.load``, ``aq.save`` and every
``arrayquant`` command read every format alike and adding a format is adding one module:

============================  ==========================================================
format                        recognised by
============================  ==========================================================
``gguf``                      the file starts with ``GGUF`` (llama.cpp, ollama)
``burnpack``                  the file starts with Burn's magic, ``NRUB`` (u32 0x4255524E)
``compressed-tensors``        a model folder, or a safetensors file whose metadata, or
                              ``config.json`` beside it, holds a compressed-tensors
                              ``quantization_config``
``arrayquant``                any other safetensors file (arrayquant's own layout, or plain)
============================  ==========================================================

The GGUF and Burnpack modules need their optional packages (``gguf``, ``cbor2``); asking for
them without those installed is a :class:`~arrayquant.errors.BackendUnavailableError` that says
what to install.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import BackendUnavailableError, SchemeError
from .paths import open_regular

__all__ = ["FORMATS", "detect", "format_module", "iter_tensors", "load", "save", "tensor_shapes"]

FORMATS = ("arrayquant", "compressed-tensors", "gguf", "burnpack")
_MAGIC = {b"GGUF": "gguf", b"NRUB": "burnpack"}
# the module of each format and the extra that installs what it needs
_MODULES = {
    "gguf": ("gguf", "gguf"),
    "burnpack": ("burnpack", "burn"),
}
_SUFFIXES = {".gguf": "gguf", ".bpk": "burnpack"}


def detect(path: str | os.PathLike[str]) -> str:
    """The format of ``path``, by its content: one of :data:`FORMATS`.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.bin")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"GGUF" + bytes(20))
    >>> detect(path)
    'gguf'
    """
    path = Path(path)
    if path.is_dir():
        return "compressed-tensors"
    with open_regular(path) as f:  # a FIFO or a device is refused, not waited on or read forever
        head = f.read(4)
    if head in _MAGIC:
        return _MAGIC[head]
    from .checkpoint import is_compressed_tensors

    return "compressed-tensors" if is_compressed_tensors(path) else "arrayquant"


def format_module(name: str) -> ModuleType:
    """The ``io`` module of the format ``name`` (``"gguf"``, ``"burnpack"``).

    Raises
    ------
    SchemeError
        A name that is not one of :data:`FORMATS`, or one without a module of its own.
    BackendUnavailableError
        The format's package is missing (the message names the extra to install).
    """
    if name not in _MODULES:
        msg = f"format {name!r} has no module of its own; the formats are {', '.join(FORMATS)}"
        raise SchemeError(msg)
    module, extra = _MODULES[name]
    try:
        return importlib.import_module(f"{__package__}.{module}")
    except ImportError as exc:
        msg = f"the {name} format needs {exc.name or 'a package'} (pip install 'arrayquant[{extra}]')"
        raise BackendUnavailableError(msg) from None


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
    kind = detect(path)
    if kind == "arrayquant":
        from .checkpoint import load_checkpoint

        return load_checkpoint(path, backend=backend, device=device)
    if kind == "compressed-tensors":
        from .ct_model import load_model

        return load_model(path, backend=backend, device=device)
    loaded: dict[str, Any] = format_module(kind).load(path, backend=backend, device=device)
    return loaded


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
        arrayquant's safetensors layout (see :func:`arrayquant.io.checkpoint.save`).
    **options
        What the format takes besides (GGUF: ``metadata``; Burnpack: ``param_ids``,
        ``metadata``).

    Raises
    ------
    SchemeError
        An unknown format, or a scheme the format cannot hold (the message lists those it can).
    BackendUnavailableError
        GGUF or Burnpack without its package installed.
    """
    kind = format or _SUFFIXES.get(Path(path).suffix.lower(), "arrayquant")
    if kind in ("arrayquant", "compressed-tensors"):
        if options:
            msg = f"format {kind!r} takes no options, got {sorted(options)}"
            raise SchemeError(msg)
        from .checkpoint import save as save_safetensors

        save_safetensors(path, tensors, format=kind)
        return
    if kind not in FORMATS:
        msg = f"format {kind!r} is not one aq.save writes; use one of {', '.join(map(repr, FORMATS))}"
        raise SchemeError(msg)
    format_module(kind).save(path, tensors, **options)


def iter_tensors(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any, str]]:
    """``(name, tensor, note)`` for every tensor of a file or folder, one at a time, on the host.

    ``tensor`` is a :class:`~arrayquant.QuantizedTensor` (NumPy) or a NumPy array; ``note`` is
    ``""`` or says how a tensor was read (a GGUF type read as float values, say).
    """
    kind = detect(path)
    if kind == "arrayquant":
        from .reader import Checkpoint

        with Checkpoint(path) as ck:
            for e in ck.tensors:
                yield e.name, (ck.quantized(e.name) if e.name in ck.described else ck.array(e.name)), ""
        return
    if kind == "compressed-tensors":
        from .ct_model import iter_model

        for _, name, tensor in iter_model(path):
            yield name, tensor, ""
        return
    yield from format_module(kind).iter_tensors(path)


def tensor_shapes(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape (as stored), from the file's header alone.

    A model folder gives the entries of all its shards; arrayquant's own quantized tensors appear
    under their stored entry names.
    """
    kind = detect(path)
    if kind == "gguf":
        from .gguf import _opened

        with _opened(path) as f:
            return {t.name: t.shape for t in f.tensors}
    if kind == "burnpack":
        from .burnpack import BurnpackFile

        with BurnpackFile(path) as bp:
            return {e.name: e.shape for e in bp.entries}
    from .reader import SafetensorsFile

    path = Path(path)
    if path.is_dir():
        from .ct_model import weight_files

        files = [path / f for f in weight_files(path)[0]]
    else:
        files = [path]
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with SafetensorsFile(file) as st:
            shapes.update({name: e.shape for name, e in st.entries.items()})
    return shapes
