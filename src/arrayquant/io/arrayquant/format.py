"""The arrayquant format's entry in the format table (:mod:`arrayquant.io.formats`).

arrayquant's own safetensors layout (:mod:`~arrayquant.io.arrayquant.layout`), and any plain
safetensors file: every safetensors file that no other format claims. The table asks the other
formats first, so :func:`sniff` only says that ``path`` is a safetensors file at all.
Quantizing and dequantizing a file are :mod:`~arrayquant.io.arrayquant.requantize`'s.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ...errors import QuantizationError, SchemeError
from ..paths import open_regular
from ..safetensors.reader import SafetensorsFile, read_header
from .checkpoint import load_checkpoint as load
from .checkpoint import save as save_checkpoint
from .layout import Checkpoint
from .requantize import dequantize_file, quantize_file

__all__ = ["NAME", "dequantize_file", "iter_tensors", "load", "quantize_file", "save", "sniff", "tensor_shapes"]

NAME = "arrayquant"


def sniff(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file that starts with a safetensors header; never raises.

    Reads the length prefix and the JSON header only (bounded by the file's size and
    safetensors' own limit); the entries are checked when the file is opened.
    """
    try:
        with open_regular(path) as f:
            read_header(f, Path(path), os.fstat(f.fileno()).st_size)
    except (QuantizationError, OSError):
        return False
    return True


def iter_tensors(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any, str]]:
    """``(name, tensor, "")`` for every tensor in file order: QuantizedTensor (NumPy) or a NumPy array."""
    with Checkpoint(path) as ck:
        for e in ck.tensors:
            yield e.name, (ck.quantized(e.name) if e.name in ck.described else ck.array(e.name)), ""


def tensor_shapes(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Every entry's name and shape as stored (a quantized tensor under its entries' names), from the header."""
    with SafetensorsFile(path) as st:
        return {name: e.shape for name, e in st.entries.items()}


def save(path: str | os.PathLike[str], tensors: Mapping[str, Any], **options: Any) -> None:
    """Write quantized tensors and arrays in arrayquant's layout: :func:`~arrayquant.io.arrayquant.checkpoint.save`.

    Raises
    ------
    SchemeError
        Any option: the format takes none.
    """
    if options:
        msg = f"format {NAME!r} takes no options, got {sorted(options)}"
        raise SchemeError(msg)
    save_checkpoint(path, tensors)
