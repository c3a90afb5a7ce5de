"""``arrayquant inspect``: a row per tensor of a file or model folder, in natural name order, with its
shape, scheme or dtype, bytes and scale range; nothing but the quantized tensors' scales is read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..backends import shim
from ..io.arrayquant.layout import SIBLINGS, Checkpoint
from ..io.formats import detect, iter_tensors
from ..io.safetensors.reader import PLAIN
from ..tensor import QuantizedTensor
from .common import MiB, natural_order, shown, table

__all__ = ["run"]

_HEADER = ["name", "shape", "scheme / dtype", "bytes", "scales min..max"]


def run(path: str) -> int:
    """``arrayquant inspect FILE``: the table of a file or model folder in any format arrayquant reads."""
    kind = detect(path)
    if kind == "compressed-tensors":  # a folder, or a file in compressed-tensors' layout
        return _inspect_folder(path)
    if kind != "arrayquant":  # GGUF, Burnpack
        return _inspect_rows(iter_tensors(path))
    rows = []
    total = quantized = 0
    with Checkpoint(path) as ck:
        by_name = {e.name: e for e in ck.tensors}
        for name in natural_order(by_name):
            e = by_name[name]
            if name in ck.described:
                qt = ck.quantized(name)
                nbytes = sum(ck.entries[k].nbytes for k in (name, *(name + s for s in SIBLINGS)) if k in ck.entries)
                rows.append([shown(name), "x".join(map(str, qt.shape)), str(qt.scheme), f"{nbytes:,}", _scale_span(qt)])
                quantized += 1
            else:
                nbytes = e.nbytes
                rows.append([shown(name), "x".join(map(str, e.shape)) or "()", PLAIN[e.dtype][1], f"{nbytes:,}", "-"])
            total += nbytes
    print("\n".join(table(_HEADER, rows, {3})))
    print(f"\n{len(rows)} tensors, {quantized} quantized, {total / MiB:.2f} MiB of tensor data")
    return 0


def _scale_span(qt: QuantizedTensor) -> str:
    scales = np.asarray(shim.to_host(qt.scales))
    span = f"{float(scales.min()):.3e}..{float(scales.max()):.3e}"
    if qt.global_scale is not None:
        span += f" x {float(np.asarray(shim.to_host(qt.global_scale))[0]):.3e}"
    return span


def _inspect_rows(items: Iterator[tuple[str, Any, str]]) -> int:
    """Print the inspect table of ``(name, tensor, note)``: tensor a QuantizedTensor, array or Passthrough."""
    rows: dict[str, list[str]] = {}
    total = quantized = 0
    noted = False
    for name, tensor, note in items:
        nbytes = tensor.nbytes
        if isinstance(tensor, QuantizedTensor):
            rows[name] = [shown(name), "x".join(map(str, tensor.shape)), str(tensor.scheme), f"{nbytes:,}"]
            rows[name].append(_scale_span(tensor))
            quantized += 1
        else:
            if hasattr(tensor, "entry"):  # a Passthrough: described, not read
                shape, dtype = tensor.entry.shape, PLAIN[tensor.entry.dtype][1]
            else:
                shape, dtype = tensor.shape, str(tensor.dtype)
            rows[name] = [shown(name), "x".join(map(str, shape)) or "()", dtype, f"{nbytes:,}", "-"]
        rows[name].append(note)
        noted = noted or bool(note)
        total += nbytes
    header = [*_HEADER, "note"]
    lines = [rows[n] if noted else rows[n][:-1] for n in natural_order(rows)]
    print("\n".join(table(header if noted else header[:-1], lines, {3})))
    print(f"\n{len(lines)} tensors, {quantized} quantized, {total / MiB:.2f} MiB of tensor data")
    return 0


def _inspect_folder(path: str) -> int:
    """``arrayquant inspect FOLDER``: the tensors of a model folder (or compressed-tensors file), weights by scheme."""
    from ..io.compressed_tensors.config import activation_notes
    from ..io.compressed_tensors.folder import model_quantization_config
    from ..io.compressed_tensors.model import iter_model

    # plain tensors described, not read
    _inspect_rows((name, tensor, "") for _, name, tensor in iter_model(path, passthrough=True))
    qc = model_quantization_config(path)
    notes = activation_notes(qc) if qc is not None else []
    if notes:
        print("the config also quantizes, at run time in the engine (not read by arrayquant, which reads weights):")
        print("\n".join(f"  {shown(note)}" for note in notes))
    return 0
