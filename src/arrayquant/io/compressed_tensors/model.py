"""Compressed-tensors models read back: every tensor one at a time, and the whole model dequantized.

:func:`iter_model` walks a model folder (or one of its files) in file order, each
compressed-tensors weight decoded into the :class:`~arrayquant.QuantizedTensor` that stores the
same bits, named ``<module>.weight``; :func:`load_model` gathers them. :func:`~arrayquant.dequantize_file`
(and :func:`dequantize_model`) writes a quantized folder back as a plain float one.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...errors import CorruptDataError, PathError, SchemeError, ShapeError
from ...tensor import QuantizedTensor
from ..patterns import matches
from ..safetensors.reader import SafetensorsFile
from ..safetensors.writer import save_stream
from ..summary import DequantizeSummary
from .config import QUANT_METHOD, weight_groups
from .folder import (
    CONFIG,
    INDEX,
    SOURCE_DTYPE,
    building,
    check_target,
    copy_other_files,
    model_config,
    model_quantization_config,
    set_dtype,
    weight_files,
    write_index,
)
from .schemes import read_weight

__all__ = [
    "ACTIVATION_PARTS",
    "Dequantized",
    "dequantize_file",
    "dequantize_model",
    "iter_model",
    "load_model",
]


# the entries compressed-tensors writes for a quantized weight, beside the module's other parameters
_PARTS = ("weight_packed", "weight_scale", "weight_global_scale", "weight_shape", "weight_zero_point", "weight")


def _group_for(module: str, groups: list[tuple[str, list[str], dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    """The (format, weight arguments) of the config group that ``module`` belongs to."""
    if len(groups) == 1:
        return groups[0][0], groups[0][2]
    by_pattern = [g for g in groups if any(t.startswith("re:") and matches(t, module) for t in g[1])]
    if len(by_pattern) == 1:
        return by_pattern[0][0], by_pattern[0][2]
    by_class = [g for g in groups if not any(t.startswith("re:") for t in g[1])]
    if not by_pattern and len(by_class) == 1:
        return by_class[0][0], by_class[0][2]
    msg = (
        f"module {module!r} matches {len(by_pattern)} of the {len(groups)} config groups by name; arrayquant "
        "cannot tell which one describes its weight without the model's classes"
    )
    raise CorruptDataError(msg)


# safetensors dtypes a compressed-tensors model stores codes in and no float model stores a weight in
_CODE_DTYPES = frozenset({"F8_E4M3", "F8_E5M2", "I8", "U8", "I32"})


def _check_codes_have_scales(
    where: Mapping[str, SafetensorsFile], quantized: set[str], qc: Mapping[str, Any] | None
) -> None:
    """A ``.weight`` of codes (FP8, int8) in a quantized model must come with its ``weight_scale``.

    Without this, a folder whose scale entry was lost would load its raw codes as the weight.
    """
    if qc is None:
        return
    for name, st in where.items():
        module, _, part = name.rpartition(".")
        dtype = st.entries[name].dtype
        if part == "weight" and module not in quantized and dtype in _CODE_DTYPES:
            msg = (
                f"{st.path} stores {name!r} as {dtype}, the codes of a quantized weight, but the model has no "
                f"{module + '.weight_scale'!r} to decode them with; the folder is incomplete (copy it again)"
            )
            raise CorruptDataError(msg)


def load_model(path: str | os.PathLike[str], *, backend: str | None = None, device: Any = None) -> dict[str, Any]:
    """Every tensor of a model folder: compressed-tensors weights as :class:`QuantizedTensor`.

    ``path`` is the folder, or one of its ``.safetensors`` files (the ``config.json`` beside it
    describes the weights). A folder whose config has no ``quantization_config`` loads as its
    arrays. A quantized weight comes back under its module's ``.weight`` name, with
    the arrayquant scheme that stores the same bits; every other tensor is an array as stored.
    Activation arguments in the config say how an engine quantizes activations at run time: they
    do not change the weights, and are not read.

    Raises
    ------
    CorruptDataError
        Quantized entries without a ``quantization_config``, a group the weights cannot be
        matched to, or entries that disagree with the format.
    PathError
        A folder with neither ``model.safetensors`` nor an index.
    SchemeError
        A format arrayquant does not read (the message lists those it does).
    """
    from ...backends import default, shim

    target = backend or default().name
    same = target.strip().lower() == "numpy" and device is None
    move = (lambda a: a) if same else (lambda a: shim.convert(a, target, device))
    out: dict[str, Any] = {}
    for _, name, item in iter_model(path, backend=target, device=device):
        out[name] = item if isinstance(item, QuantizedTensor) else move(item)
    return out


def iter_model(
    path: str | os.PathLike[str], *, backend: str = "numpy", device: Any = None, passthrough: bool = False
) -> Iterator[tuple[str, str, Any]]:
    """``(shard, name, tensor)`` for every tensor of a model folder, read one at a time in file order.

    ``tensor`` is a NumPy array as stored (with ``passthrough``, a
    :class:`~arrayquant.io.safetensors.reader.Passthrough` for a writer to copy), or for a compressed-tensors
    weight a :class:`QuantizedTensor` (on ``backend``) named ``<module>.weight`` and placed in the
    shard of its ``weight_scale`` entry. Given one shard of an indexed folder, the other shards
    are searched for the entries of its modules that were written beside them, and a module is
    yielded with the shard holding its ``weight_scale``. Raises as :func:`load_model`.
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    qc = model_quantization_config(path)
    groups = [] if qc is None else weight_groups(qc)
    files = weight_files(folder)[0] if path.is_dir() else [path.name]
    if not path.is_dir() and os.path.lexists(folder / INDEX):
        shards = weight_files(folder)[0]
        if path.name in shards:  # one shard: a module's entries may lie in its neighbours
            files = [path.name, *(f for f in shards if f != path.name)]
    opened: list[SafetensorsFile] = []
    try:
        opened.extend(SafetensorsFile(folder / f) for f in files)
        where: dict[str, SafetensorsFile] = {}
        for st in opened:
            where.update(dict.fromkeys(st.entries, st))
        parts: dict[str, list[str]] = {}  # module -> its weight entries (a module may span shards)
        for name in where:
            module, _, part = name.rpartition(".")
            if part in _PARTS:
                parts.setdefault(module, []).append(name)
        quantized = {m for m, names in parts.items() if f"{m}.weight_scale" in names}
        orphans = [n for m, names in parts.items() if m not in quantized for n in names if not n.endswith(".weight")]
        if orphans:
            msg = (
                f"{path} holds {orphans[0]!r} but no {orphans[0].rpartition('.')[0]!r}.weight_scale to decode it "
                "with; a shard of a model is read with its folder (pass the folder, or keep its index beside it)"
            )
            raise CorruptDataError(msg)
        _check_codes_have_scales(where, quantized, qc)
        if quantized and not groups:
            msg = (
                f"{folder} holds quantized weights (e.g. {min(quantized)!r}.weight_scale) but no "
                f"{CONFIG} with a quantization_config to say how they decode"
            )
            raise CorruptDataError(msg)
        for st in opened if path.is_dir() else opened[:1]:
            for name in st.entries:
                module, _, part = name.rpartition(".")
                if module in quantized and part in _PARTS:
                    if part == "weight_scale":  # once per module
                        entries = {k: where[k].array(k) for k in parts[module]}
                        fmt, args = _group_for(module, groups)
                        qt = read_weight(entries, module, fmt, args, backend=backend, device=device)
                        del entries
                        yield st.path.name, f"{module}.weight", qt
                        del qt
                    continue
                yield st.path.name, name, st.passthrough(name) if passthrough else st.array(name)
    finally:
        for st in opened:
            st.close()


# entries of activation and KV-cache quantization: scales an engine applies at run time, which mean
# nothing to a float model (transformers reports them as unexpected keys)
ACTIVATION_PARTS = frozenset(
    {
        "input_scale",
        "input_global_scale",
        "input_zero_point",
        "output_scale",
        "output_global_scale",
        "output_zero_point",
        "k_scale",
        "v_scale",
    }
)


class Dequantized(NamedTuple):
    """What :func:`dequantize_model` did: the modules it dequantized and the activation entries it dropped."""

    modules: list[str]
    dropped: list[str]


def dequantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    dtype: str | None = None,
    names: Collection[str] | None = None,
) -> DequantizeSummary:
    """Write a compressed-tensors model folder (or file) back as a plain float folder (or file).

    Every file but the weights is copied, ``config.json`` without its ``quantization_config``;
    each shard is rewritten tensor by tensor with the quantized weights dequantized to ``dtype``
    (default: the model's ``torch_dtype``/``dtype`` from its config, else float32) under their
    ``.weight`` names, other tensors copied as stored, and the index maps them. Scales of
    activation or KV-cache quantization (``input_scale``, ``input_global_scale``, ``k_scale``,
    ...) are dropped: without the ``quantization_config`` no loader uses them. A single file
    (with its config beside it or in its metadata) gives a single float file ``dst``.

    ``names`` (``<module>.weight`` names), when given, must name every quantized weight: the
    model's ``quantization_config`` describes them all, so a model is dequantized whole.

    Returns
    -------
    DequantizeSummary
        ``dtype`` is the float dtype written; ``dequantized`` the weights, ``copied`` the other
        tensors, ``dropped`` the activation and KV-cache scales.

    Raises
    ------
    PathError
        A destination in use, or a source that is neither a model folder nor a file.
    SchemeError
        ``names`` leaves a quantized weight out.
    CorruptDataError, SchemeError
        As :func:`load_model`.
    """
    source, target = Path(src), Path(dst)
    if not source.exists():
        msg = f"{source} is neither a model folder nor a .safetensors file"
        raise PathError(msg)
    folder = source if source.is_dir() else source.parent
    config_path = folder / CONFIG
    config = model_config(folder)
    named = config.get(SOURCE_DTYPE) or config.get("torch_dtype") or config.get("dtype") or "float32"
    out_dtype = _float_dtype(dtype or str(named))
    quantized_model = model_quantization_config(source) is not None
    result = DequantizeSummary(QUANT_METHOD, out_dtype.name)
    if source.is_file():  # one file in, one file out
        if target.is_dir():
            msg = f"{target} is a folder; name the float .safetensors file to write"
            raise PathError(msg)
        tensors = iter_model(source, passthrough=True)
        save_stream(
            target, _float_items(tensors, out_dtype, quantized_model, result, {}, names), metadata={"format": "pt"}
        )
        return result
    shards, indexed = weight_files(source)
    check_target(source, target, "dequantized")
    with building(target) as out_dir:
        copy_other_files(source, out_dir, shards)
        where: dict[str, tuple[str, int]] = {}  # entry -> (shard, bytes)
        # one pass over the model, tensor by tensor; each shard is written as its tensors come
        for shard, group in itertools.groupby(iter_model(source, passthrough=True), key=lambda t: t[0]):
            items = _float_items(group, out_dtype, quantized_model, result, where, names)
            save_stream(out_dir / shard, items, metadata={"format": "pt"})
        if indexed:
            write_index(out_dir, {k: s for k, (s, _) in where.items()}, sum(n for _, n in where.values()))
        config.pop("quantization_config", None)
        if config:  # the dtype the float shards are written in
            set_dtype(config, out_dtype.name)
        if config or config_path.is_file():
            (out_dir / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return result


def dequantize_model(src: str | os.PathLike[str], dst: str | os.PathLike[str], dtype: str | None = None) -> Dequantized:
    """:func:`~arrayquant.dequantize_file` on a folder: the modules dequantized and the entries dropped."""
    done = dequantize_file(src, dst, dtype=dtype)
    return Dequantized([name.removesuffix(".weight") for name in done.dequantized], done.dropped)


def _float_items(
    tensors: Iterator[tuple[str, str, Any]],
    dtype: np.dtype[Any],
    drop_activations: bool,
    result: DequantizeSummary,
    where: dict[str, tuple[str, int]],
    names: Collection[str] | None = None,
) -> Iterator[tuple[str, Any]]:
    """The entries of a float model: weights dequantized, activation scales dropped, the rest as stored."""
    from ...dequantize import dequantize

    for shard, key, tensor in tensors:
        if isinstance(tensor, QuantizedTensor):
            if names is not None and key not in names:  # the target is left as it was
                msg = (
                    f"names leaves the quantized weight {key!r} out; a compressed-tensors model is dequantized "
                    "whole (its quantization_config describes every quantized weight), so name them all"
                )
                raise SchemeError(msg)
            tensor = np.asarray(dequantize(tensor, dtype))  # saturating at the dtype's maximum
            result.dequantized.append(key)
        elif drop_activations and key.rpartition(".")[2] in ACTIVATION_PARTS:
            result.dropped.append(key)
            continue
        else:
            result.copied.append(key)
        where[key] = (shard, tensor.nbytes)
        yield key, tensor
        del tensor


def _float_dtype(name: str) -> np.dtype[Any]:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name not in ("float32", "float16", "float64"):
        msg = f"dtype {name!r} is not one of float32, float16, bfloat16, float64"
        raise ShapeError(msg)
    return np.dtype(name)
