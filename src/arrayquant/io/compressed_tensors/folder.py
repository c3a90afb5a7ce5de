"""A Hugging Face model folder's layout: its weight shards, index and ``config.json``, and which paths hold a model.

A model folder holds ``config.json``, the weights (``model.safetensors``, or shards
``model-0000k-of-0000n.safetensors`` listed in ``model.safetensors.index.json``) and files such
as the tokenizer's. The writer (:mod:`~arrayquant.io.compressed_tensors.requantize`) and the
reader (:mod:`~arrayquant.io.compressed_tensors.model`) both find the shards, read the config and
build a new folder through these functions; :func:`is_compressed_tensors` tells a
compressed-tensors model (a folder, or a file its config describes) from arrayquant's own files.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import CorruptDataError, PathError
from .. import _atomic
from ..arrayquant.layout import TENSOR_KEY
from ..paths import copy_folder, read_json, shard_name
from ..safetensors.reader import SafetensorsFile
from .file import file_quantization_config

__all__ = [
    "CONFIG",
    "DTYPE_KEYS",
    "INDEX",
    "SINGLE",
    "SOURCE_DTYPE",
    "building",
    "check_target",
    "copy_other_files",
    "is_compressed_tensors",
    "model_config",
    "model_quantization_config",
    "quantization_config_of",
    "set_dtype",
    "weight_files",
    "write_index",
]

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def model_config(folder: Path) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict; ``{}`` without one."""
    path = folder / CONFIG
    if not os.path.lexists(path):
        return {}
    config = read_json(path, "a model config")
    if not isinstance(config, dict):
        msg = f"{path} holds a JSON {type(config).__name__}, not the object of a model config"
        raise CorruptDataError(msg)
    return config


def weight_files(folder: Path) -> tuple[list[str], bool]:
    """The weight shards of a model folder in order, and whether an index lists them.

    Every name the index gives is checked before anything is opened (see
    :func:`~arrayquant.io.paths.shard_name`): a bare file name that is a regular file of the folder.

    Raises
    ------
    PathError
        A folder with no ``model.safetensors`` and no index (the model must be in safetensors).
    CorruptDataError
        An index that is not JSON, has no ``weight_map``, or names a shard outside the folder, a
        missing one, or one that is not a regular file.
    """
    index = folder / INDEX
    if os.path.lexists(index):
        found = read_json(index, "a safetensors index")
        weight_map = found.get("weight_map") if isinstance(found, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            msg = f"{index} has no weight_map; it is not a safetensors index"
            raise CorruptDataError(msg)
        names: dict[str, None] = {}
        for name in weight_map.values():  # each distinct name checked once: an index lists thousands
            if not (isinstance(name, str) and name in names):
                names[shard_name(folder, name, index)] = None
        return list(names), True
    if os.path.lexists(folder / SINGLE):
        return [shard_name(folder, SINGLE, folder / SINGLE)], False
    msg = f"{folder} holds neither {SINGLE} nor {INDEX}; save the model with safetensors (save_pretrained does)"
    raise PathError(msg)


def check_target(source: Path, target: Path, what: str) -> None:
    """``target`` must not exist (or be an empty folder) and must not lie inside ``source``."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        msg = f"{target} exists and is not an empty folder; name a new folder for the {what} model"
        raise PathError(msg)
    if source.is_dir() and target.resolve().is_relative_to(source.resolve()):
        msg = f"{target} lies inside {source}; write the {what} model beside it, not into it"
        raise PathError(msg)


def building(target: Path) -> contextlib.AbstractContextManager[Path]:
    """A hidden folder beside ``target`` that becomes it at the end, or is removed on failure.

    A failed or interrupted run then leaves no half-written model behind to block the next one.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    return _atomic.building(target)


# float weights in other formats, left behind: an engine could load them instead of, or beside,
# the quantized shards (vLLM reads every *.safetensors of a folder without an index)
_OTHER_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.gguf", "*.index.json")
_NOT_WEIGHTS = ("training_args.bin",)  # pickled settings, not weights


def _other_weights(name: str) -> bool:
    return name not in _NOT_WEIGHTS and any(fnmatch.fnmatch(name, p) for p in _OTHER_WEIGHTS)


def copy_other_files(source: Path, target: Path, shards: Sequence[str]) -> tuple[list[str], list[str], dict[str, str]]:
    """Copy every regular file and folder of ``source`` but the weights, the index and the config.

    Returns the names copied, the weight files of other formats left out, and the entries that
    are not regular files (FIFOs, devices, dangling links, link loops), not copied, with why.
    """
    names = sorted(n for n in os.listdir(source) if n not in {*shards, INDEX, CONFIG})
    return copy_folder(source, target, lambda rel: _other_weights(rel.name), names)


def write_index(target: Path, weight_map: dict[str, str], total: int) -> None:
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (target / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


DTYPE_KEYS = ("dtype", "torch_dtype")  # transformers 5 writes "dtype"; older configs have "torch_dtype"
# the source model's dtype, where the folder had to declare bfloat16 (an extra config attribute,
# which transformers keeps and ignores)
SOURCE_DTYPE = "arrayquant_source_dtype"


def set_dtype(config: dict[str, Any], name: str) -> None:
    """Name ``name`` as the model's dtype wherever ``config`` (and its sub-configs) names one."""
    config.pop(SOURCE_DTYPE, None)
    subs = [v for v in config.values() if isinstance(v, dict) and "model_type" in v]
    for part in (config, *subs):
        for key in DTYPE_KEYS:
            if key in part:
                part[key] = name


def quantization_config_of(folder: Path) -> dict[str, Any] | None:
    """The ``quantization_config`` of the ``config.json`` in ``folder``; None for a model without one."""
    qc = model_config(folder).get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        msg = f"{folder / CONFIG} has a quantization_config that is not an object"
        raise CorruptDataError(msg)
    return qc


def model_quantization_config(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``quantization_config`` that describes ``path``; None for a float model.

    For a folder, its ``config.json``'s. For a file, the one in its own metadata (as
    ``aq.save(..., format="compressed-tensors")`` writes it), else the ``config.json`` beside it.

    Raises
    ------
    CorruptDataError
        A config that is not JSON, or a ``quantization_config`` that is not an object.
    """
    path = Path(path)
    if path.is_dir():
        return quantization_config_of(path)
    own = file_quantization_config(path)
    return own if own is not None else quantization_config_of(path.parent)


def is_compressed_tensors(path: Path) -> bool:
    """A compressed-tensors model: a folder, or a file describing no arrayquant tensor that holds a
    ``quantization_config`` in its metadata or whose folder's config.json has a compressed-tensors one."""
    if path.is_dir():
        return True
    with SafetensorsFile(path) as st:
        if any(k.startswith(TENSOR_KEY) for k in st.metadata):  # arrayquant's own quantized tensors
            return False
        stored = "quantization_config" in st.metadata  # written by aq.save(format="compressed-tensors")
    config = path.parent / "config.json"
    if not config.is_file():
        return stored
    try:  # a config.json that cannot be read describes nothing: the file is read by itself
        found = read_json(config, "a model config")
    except (CorruptDataError, OSError):
        return stored
    qc = found.get("quantization_config") if isinstance(found, dict) else None
    return stored or (isinstance(qc, dict) and qc.get("quant_method") == "compressed-tensors")
