"""Importance vectors for ``arrayquant quantize --importance FILE``: one weight per input column.

A search calibration (``mse``, ``4over6``) given ``importance=v`` minimises the weighted error
``sum_j v[j] * |w[i, j] - deq[i, j]|^p``, where ``j`` runs over the weight's last axis (a Linear
weight's input features). The usual ``v`` is the mean squared activation feeding each column, as
llama.cpp's imatrix and llm-compressor's ``imatrix_mse`` use: columns that see large inputs
matter more to the layer's output.

Two file layouts are read, told apart by their first bytes:

- **safetensors**: one 1-D floating vector per weight, keyed by the weight's name in the
  checkpoint (``encoder.layer.0.attention.self.query.weight``), of length ``shape[-1]`` of that
  weight, finite and >= 0 (F32; F16, BF16 and F64 are read as float32).
- **llama.cpp's imatrix GGUF** (``llama-imatrix -o imatrix.gguf``, ``general.type = imatrix``):
  for each weight ``<name>`` the F32 tensors ``<name>.in_sum2`` (sum over tokens of x_j^2, shape
  ``[n_matrices, n]``) and ``<name>.counts`` (tokens seen, one per matrix); the vector is
  ``in_sum2 / counts``. Only dense weights (one matrix) are read; per-expert entries of a MoE
  model are refused. Names are llama.cpp's (``blk.0.attn_q.weight``) and are not translated:
  they match a checkpoint whose names are llama.cpp's (a GGUF file turned into safetensors with
  ``arrayquant dequantize``); for any other checkpoint the unknown names are listed. llama.cpp's
  older ``.dat`` imatrix is not read: ``llama-imatrix --in-file imatrix.dat -o imatrix.gguf``
  converts it.

Making a safetensors importance file with PyTorch (mean squared input of every ``nn.Linear`` over
some calibration text; the keys must be the checkpoint's tensor names, which
``arrayquant inspect`` lists: a model loaded with ``AutoModel`` may lack a prefix such as
``bert.`` that the checkpoint has)::

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModel, AutoTokenizer

    path = "sentence-transformers/all-MiniLM-L6-v2"  # or a local model folder
    model, tok = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    sums, counts = {}, {}

    def record(name):
        def hook(module, inputs, output):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()
            sums[name] = sums.get(name, 0) + (x * x).sum(0)
            counts[name] = counts.get(name, 0) + x.shape[0]
        return hook

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(record(name + ".weight"))
    with torch.no_grad():
        for text in ["The quick brown fox.", "Quantization keeps the large weights."]:
            model(**tok(text, return_tensors="pt"))  # one text at a time: no padding tokens
    save_file({k: (sums[k] / counts[k]).float() for k in sums}, "importance.safetensors")

then ``arrayquant quantize model.safetensors out.safetensors --scheme q4s:block32:f16
--calibration mse --importance importance.safetensors``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptDataError, DTypeError, NonFiniteInputError, ParamsError, ShapeError
from . import _dtypes

__all__ = ["check_importance", "load_importance"]

_FLOATS = _dtypes.SAFETENSORS_FLOATS
_SUM2, _COUNTS = ".in_sum2", ".counts"


def load_importance(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The importance vectors of ``path`` (safetensors or llama.cpp imatrix GGUF), by weight name.

    Parameters
    ----------
    path : str or path-like
        A safetensors file of 1-D vectors, or an imatrix GGUF file written by ``llama-imatrix``.

    Returns
    -------
    dict of str to numpy.ndarray
        1-D float32 vectors, finite and >= 0, in the file's order.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    CorruptDataError
        A file that is neither, or an imatrix GGUF without its ``.counts`` (or ``.in_sum2``) tensors,
        or with one of them stored as another type than F32.
    DTypeError
        A vector that is not floating point.
    ShapeError
        A vector that is not 1-D, or a per-expert (MoE) imatrix entry.
    NonFiniteInputError, ParamsError
        A NaN or infinite value; a negative value (or a token count that is not positive, or so
        small that ``in_sum2 / counts`` overflows float32).
    """
    p = Path(path)
    with p.open("rb") as f:  # FileNotFoundError for a missing file, before any parsing
        head = f.read(4)
    vectors = _from_gguf(p) if head == b"GGUF" else _from_safetensors(p)
    for name, v in vectors.items():
        _check_values(name, v, p)
    return vectors


def _from_safetensors(path: Path) -> dict[str, np.ndarray]:
    from .safetensors.reader import SafetensorsFile

    try:
        opened = SafetensorsFile(path)
    except CorruptDataError as exc:
        msg = (
            f"{exc}; --importance takes a safetensors file of 1-D vectors or llama.cpp's imatrix GGUF "
            "(an old imatrix .dat converts with: llama-imatrix --in-file imatrix.dat -o imatrix.gguf)"
        )
        raise CorruptDataError(msg) from None
    out: dict[str, np.ndarray] = {}
    with opened as f:
        for name, e in f.entries.items():
            if e.dtype not in _FLOATS:
                msg = f"importance vector {name!r} of {path} is {e.dtype}; it must be floating point (F32)"
                raise DTypeError(msg)
            if len(e.shape) != 1:
                msg = (
                    f"importance vector {name!r} of {path} has shape {list(e.shape)}; it must be 1-D, one value "
                    "per input column of the weight"
                )
                raise ShapeError(msg)
            out[name] = np.asarray(f.array(name), np.float32)
    return out


def _from_gguf(path: Path) -> dict[str, np.ndarray]:
    from .gguf import iter_tensors, open_gguf

    with open_gguf(path) as f:
        types = {t.name: t.type_name for t in f.tensors}
    for name, type_name in types.items():
        if name.endswith((_SUM2, _COUNTS)) and type_name != "F32":
            msg = (
                f"imatrix tensor {name!r} of {path} is stored as {type_name}; its .in_sum2 and .counts tensors must "
                "be F32, as llama-imatrix writes them (llama-quantize refuses other types too): write the file "
                "again with llama-imatrix"
            )
            raise CorruptDataError(msg)
    tensors: dict[str, Any] = {name: value for name, value, _ in iter_tensors(path)}
    sums = {n[: -len(_SUM2)]: v for n, v in tensors.items() if n.endswith(_SUM2)}
    counts = {n[: -len(_COUNTS)]: v for n, v in tensors.items() if n.endswith(_COUNTS)}
    if not sums:
        msg = (
            f"{path} is a GGUF file without imatrix tensors (<name>.in_sum2 and <name>.counts); "
            "--importance takes llama.cpp's imatrix GGUF or a safetensors file of vectors"
        )
        raise CorruptDataError(msg)
    unpaired = sorted(sums.keys() ^ counts.keys())
    if unpaired:
        msg = f"{path}: imatrix entries without both .in_sum2 and .counts: {', '.join(map(repr, unpaired[:5]))}"
        raise CorruptDataError(msg)
    out: dict[str, np.ndarray] = {}
    for name, s in sums.items():
        s2, c = np.asarray(s, np.float32), np.asarray(counts[name], np.float32).reshape(-1)
        matrices = s2.shape[0] if s2.ndim == 2 else 1
        if s2.ndim > 2 or matrices != 1 or c.size != 1:
            msg = (
                f"imatrix entry {name!r} of {path} holds {max(matrices, c.size)} matrices (a mixture of experts); "
                "only dense weights, one vector each, are read"
            )
            raise ShapeError(msg)
        count = float(c[0])
        if not count > 0:  # llama.cpp stores 0 for a weight no token reached; NaN fails here too
            msg = f"imatrix entry {name!r} of {path} counts {count} tokens; it needs at least one"
            raise ParamsError(msg)
        out[name] = _mean(name, s2.reshape(-1), count, path)
    return out


def _mean(name: str, sums: np.ndarray, count: float, path: Path) -> np.ndarray:
    """``sums / count`` in float32, refusing a quotient beyond the float32 range (a count below 1 does that)."""
    with np.errstate(over="ignore"):  # checked just below, with a message
        mean = sums / np.float32(count)
    over = np.isinf(mean) & np.isfinite(sums)
    if over.any():
        j = int(np.argmax(over))
        msg = (
            f"imatrix entry {name!r} of {path}: in_sum2 / counts overflows float32 at column {j} "
            f"({float(sums[j])!r} / {count!r}); a token count is a whole number >= 1, which cannot overflow "
            "a float32 sum: the file's counts are wrong"
        )
        raise ParamsError(msg)
    return mean


def _check_values(name: str, v: np.ndarray, path: Path) -> None:
    bad = ~np.isfinite(v)
    if bad.any():
        msg = (
            f"importance vector {name!r} of {path} holds {int(bad.sum())} NaN or infinite values "
            f"(first at column {int(np.argmax(bad))}); every weight must be finite"
        )
        raise NonFiniteInputError(msg)
    neg = v < 0
    if neg.any():
        first = int(np.argmax(neg))
        msg = (
            f"importance vector {name!r} of {path} holds {int(neg.sum())} negative values (column {first}: "
            f"{float(v[first])!r}); importance weights are >= 0 (e.g. mean squared activations)"
        )
        raise ParamsError(msg)


def check_importance(
    vectors: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]], path: str | os.PathLike[str]
) -> None:
    """Refuse importance vectors that do not fit the checkpoint whose tensor shapes are ``shapes``.

    Parameters
    ----------
    vectors : mapping of str to numpy.ndarray
        From :func:`load_importance`.
    shapes : mapping of str to tuple of int
        Every tensor of the checkpoint, by name.
    path : str or path-like
        The importance file, for the messages.

    Raises
    ------
    ParamsError
        Names that are no tensor of the checkpoint (all listed, up to ten).
    ShapeError
        A vector whose length is not its weight's last axis.
    """
    unknown = [n for n in vectors if n not in shapes]
    if unknown:
        shown = ", ".join(map(repr, unknown[:10])) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        example = next(iter(shapes), None)
        like = f" (its names look like {example!r})" if example is not None else ""
        msg = (
            f"{len(unknown)} of the {len(vectors)} importance vectors of {path} name no tensor of the checkpoint"
            f"{like}: {shown}; the names must be the checkpoint's (arrayquant inspect lists them)"
        )
        raise ParamsError(msg)
    for name, v in vectors.items():
        shape = shapes[name]
        if not shape or shape[-1] != v.shape[0]:
            msg = (
                f"importance vector {name!r} of {path} has {v.shape[0]} values but the weight is {list(shape)}: "
                f"it needs one per input column, {shape[-1] if shape else 'none for a scalar'}"
            )
            raise ShapeError(msg)
