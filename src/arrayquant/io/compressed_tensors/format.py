"""The compressed-tensors format's entry in the format table (:mod:`arrayquant.io.formats`).

A path is compressed-tensors when it is a model folder, or a safetensors file whose metadata (or
the ``config.json`` beside it) holds a compressed-tensors ``quantization_config``; see
:func:`~arrayquant.io.compressed_tensors.folder.is_compressed_tensors`. The functions below are
the ones every format has: reading a model whole or a tensor at a time
(:mod:`~arrayquant.io.compressed_tensors.model`), writing one file
(:mod:`~arrayquant.io.compressed_tensors.file`), quantizing a float model folder
(:mod:`~arrayquant.io.compressed_tensors.requantize`) and dequantizing one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ...errors import QuantizationError, SchemeError
from ..safetensors.reader import SafetensorsFile
from .config import QUANT_METHOD
from .file import save_compressed_tensors
from .folder import is_compressed_tensors, weight_files
from .model import dequantize_file, iter_model
from .model import load_model as load
from .requantize import quantize_file

__all__ = ["NAME", "dequantize_file", "iter_tensors", "load", "quantize_file", "save", "sniff", "tensor_shapes"]

NAME = QUANT_METHOD  # the format is named as its quantization_config names it


def sniff(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a model folder or a compressed-tensors safetensors file; never raises.

    Reads the file's header and at most the ``config.json`` beside it. A file that cannot be read
    as safetensors is not one.
    """
    try:
        return is_compressed_tensors(Path(path))
    except (QuantizationError, OSError):
        return False


def iter_tensors(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any, str]]:
    """``(name, tensor, "")`` for every tensor of the model, one at a time: weights as QuantizedTensor."""
    for _, name, tensor in iter_model(path):
        yield name, tensor, ""


def tensor_shapes(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Every entry's name and shape as stored, from the headers alone (a folder: of all its shards)."""
    path = Path(path)
    files = [path / f for f in weight_files(path)[0]] if path.is_dir() else [path]
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with SafetensorsFile(file) as st:
            shapes.update({name: e.shape for name, e in st.entries.items()})
    return shapes


def save(path: str | os.PathLike[str], tensors: Mapping[str, Any], **options: Any) -> None:
    """Write one safetensors file in compressed-tensors' layout (see :func:`save_compressed_tensors`).

    Raises
    ------
    SchemeError
        Any option (the format takes none), or a scheme without a compressed-tensors format.
    """
    if options:
        msg = f"format {NAME!r} takes no options, got {sorted(options)}"
        raise SchemeError(msg)
    save_compressed_tensors(path, tensors)
