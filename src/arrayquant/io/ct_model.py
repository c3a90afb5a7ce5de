"""Hugging Face model folders quantized into compressed-tensors, the layout transformers and vLLM load.

A model folder holds ``config.json``, the weights (``model.safetensors``, or shards
``model-0000k-of-0000n.safetensors`` listed in ``model.safetensors.index.json``) and files such
as the tokenizer's. :func:`quantize_model` writes a new folder:

- every file that is not a weight shard or the index is copied unchanged;
- each shard is rewritten tensor by tensor into a shard of the same name, the ``Linear`` weights
  quantized into compressed-tensors entries (``<module>.weight_packed``, ``.weight_scale``, ...),
  every other tensor copied bit for bit; the index maps the new entry names;
- ``config.json`` gains the ``quantization_config`` compressed-tensors writes.

Which tensors are quantized follows llm-compressor's default: the weights of ``Linear`` layers.
A safetensors file does not say which tensor belongs to which kind of layer, so the rule is read
from names and shapes: 2-d floating ``*.weight`` tensors, except embeddings (``embed`` in the
name), ``lm_head`` and normalisation layers (``norm``), and any whose shape the format cannot
hold. Every 2-d weight left in float is listed in ``ignore`` (with ``lm_head``, which a model
with tied embeddings has as a module without a tensor of its own), so the loader keeps it dense.
"""

from __future__ import annotations

import contextlib
import fnmatch
import itertools
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..errors import CorruptDataError, PathError, SchemeError, ShapeError
from ..scheme import QuantScheme
from ..tensor import QuantizedTensor
from . import _atomic, _dtypes
from .checkpoint import save_stream
from .ct_config import modules_quantization_config, quantization_config, weight_groups
from .ct_formats import BF16_FORMATS, read_weight, weight_format
from .ct_stream import fits_format, quantize_entry, shared_level, tensor_level
from .fused_shards import fused_groups, fusions_for, shares_tensor_level
from .paths import copy_folder, read_json, shard_name
from .patterns import matches
from .reader import SafetensorsFile

__all__ = [
    "ACTIVATION_PARTS",
    "Dequantized",
    "ModelSummary",
    "dequantize_model",
    "iter_model",
    "load_model",
    "model_quantization_config",
    "parse_size",
    "quantization_config_of",
    "quantize_model",
    "weight_files",
]

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_FLOATS = _dtypes.SAFETENSORS_FLOATS
_SKIP_NAMES = ("embed", "lm_head", "norm")  # in a name, as llm-compressor's default ignores them


@dataclass
class ModelSummary:
    """What :func:`quantize_model` did: quantized modules, and every 2-d weight left in float with why."""

    format: str
    quantized: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)  # module -> reason
    copied_files: list[str] = field(default_factory=list)
    skipped_files: list[str] = field(default_factory=list)  # float weights of other formats, not copied
    refused_files: dict[str, str] = field(default_factory=dict)  # not regular files, not copied -> why
    shards: list[str] = field(default_factory=list)
    # the engine's fused layer (``...self_attn.qkv_proj``) -> its quantized modules, which share one
    # per-tensor level (NVFP4's global, an FP8 per-tensor scale); see ``fused_shards`` of quantize_model
    fused_groups: dict[str, list[str]] = field(default_factory=dict)
    # what a reader of the folder should know: loaders known to misread it (see _loader_warnings)
    warnings: list[str] = field(default_factory=list)


# transformers 5 (at least to 5.24, with compressed-tensors 0.20) gathers the per-expert weights of an
# MoE block into one fused 3-d parameter and decompresses them itself (DecompressExperts): NVFP4
# experts lose their weight_global_scale (transformers issue 48371, values off by the global's
# inverse), MXFP4 experts are not found (left at their random initial values) and MXFP8 experts
# stop the load; experts left in float beside them stop the load too. vLLM and SGLang load all
# three as written; FP8 and integer experts load in both.
_MOE_EXPERTS = re.compile(r"\.experts\.\d+\.")


def _loader_warnings(formats: set[str], modules: Sequence[str]) -> list[str]:
    experts = [m for m in modules if _MOE_EXPERTS.search(m)]
    bad = sorted(formats & BF16_FORMATS)
    if not experts or not bad:
        return []
    return [
        f"{len(experts)} MoE expert weights are {'/'.join(bad)}: vLLM and SGLang load them as written, but "
        "transformers (5.x, to at least 5.24) misreads quantized experts of these formats (NVFP4 loses its "
        "per-tensor scale, transformers issue 48371; MXFP4 experts are left unloaded; MXFP8 stops the load). "
        "To run this model in transformers, quantize it with an FP8 or integer scheme (e4m3, q4s:block32:bf16)"
    ]


def _model_config(folder: Path) -> dict[str, Any]:
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


def _check_target(source: Path, target: Path, what: str) -> None:
    """``target`` must not exist (or be an empty folder) and must not lie inside ``source``."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        msg = f"{target} exists and is not an empty folder; name a new folder for the {what} model"
        raise PathError(msg)
    if source.is_dir() and target.resolve().is_relative_to(source.resolve()):
        msg = f"{target} lies inside {source}; write the {what} model beside it, not into it"
        raise PathError(msg)


def _building(target: Path) -> contextlib.AbstractContextManager[Path]:
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


def _copy_other_files(source: Path, target: Path, shards: Sequence[str]) -> tuple[list[str], list[str], dict[str, str]]:
    """Copy every regular file and folder of ``source`` but the weights, the index and the config.

    Returns the names copied, the weight files of other formats left out, and the entries that
    are not regular files (FIFOs, devices, dangling links, link loops), not copied, with why.
    """
    names = sorted(n for n in os.listdir(source) if n not in {*shards, INDEX, CONFIG})
    return copy_folder(source, target, lambda rel: _other_weights(rel.name), names)


def _write_index(target: Path, weight_map: dict[str, str], total: int) -> None:
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (target / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def _module(name: str) -> str:
    return name[: -len(".weight")]


# embeddings and heads by name: GPT-2's wte/wpe, T5's shared and relative attention bias
_SKIP_PARTS = frozenset({"wte", "wpe", "shared", "relative_attention_bias"})
# models whose projections are Conv1D layers storing (in, out): compressed-tensors quantizes Linear only
_CONV1D_MODELS = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer"})


# MoE routers: vLLM builds them unquantized (Mixtral's and DeepSeek's gate is a ReplicatedLinear with
# quant_config=None, Qwen2-MoE's shared_expert_gate a plain Linear), and transformers 5 holds Mixtral's
# and DeepSeek-V3's as a bare parameter of the MoE block, which reads no compressed-tensors entries:
# a quantized router would be left at its random initial values (module name, parent module names)
_ROUTERS = (("gate", ("mlp", "block_sparse_moe", "moe", "feed_forward")), ("router", ()), ("shared_expert_gate", ()))


def _router(name: str) -> bool:
    parts = name.lower().split(".")
    if len(parts) < 2:
        return False
    last, parent = parts[-2], parts[-3] if len(parts) > 2 else ""
    return any(last == r and (not parents or parent in parents) for r, parents in _ROUTERS)


def _skip_reason(name: str, shape: tuple[int, ...], vocab: int | None) -> str | None:
    """Why a 2-d weight is not a ``Linear`` to quantize (embedding, head, norm, MoE router), or None."""
    lowered = name.lower()
    if any(word in lowered for word in _SKIP_NAMES) or _SKIP_PARTS.intersection(lowered.split(".")):
        return "embedding, head or norm (left in float, as llm-compressor does)"
    if _router(name):
        return "MoE router (left in float, as vLLM builds it and transformers reads it)"
    # outside the numbered layers, a weight with a row per token is an embedding or a head
    if vocab is not None and shape[0] == vocab and not any(part.isdigit() for part in name.split(".")):
        return f"{vocab} rows, the vocabulary size, outside the layers: an embedding or output head (left in float)"
    return None


def _chosen(name: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    if include and not any(fnmatch.fnmatchcase(name, p) for p in include):
        return False
    return not any(fnmatch.fnmatchcase(name, p) for p in exclude)


def quantize_model(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    scheme: QuantScheme | str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
    max_shard_size: int | str | None = None,
    calibration: Any = "minmax",
    importance: Mapping[str, Any] | None = None,
    fused_shards: bool = True,
) -> ModelSummary:
    """Quantize the ``Linear`` weights of a Hugging Face model folder into a compressed-tensors folder.

    Parameters
    ----------
    src : path
        A model folder (``config.json`` with ``model.safetensors`` or an indexed set of shards), or
        one ``.safetensors`` file (the folder written then holds its weights and a ``config.json``
        with the ``quantization_config`` alone).
    dst : path
        The new folder; it must not exist yet, or be empty.
    scheme : QuantScheme or str
        A scheme with a compressed-tensors format (``"nvfp4"``, ``"mxfp8"``, ...).
    include, exclude : sequence of str
        Globs on tensor names narrowing the weights quantized (``"*.mlp.*"``).
    progress : callable, optional
        Called with each tensor's name as it is written.
    calibration : str, Calibration, MSE or Percentile
        How each weight's scales are found, as for :func:`arrayquant.quantize` (``"mse"``,
        ``"4over6"``, ...); the folder written is the same compressed-tensors layout.
    importance : mapping of str to array, optional
        Per-input-column importance vectors by weight name, for ``"mse"`` and ``"4over6"``.
    max_shard_size : int or str, optional
        Cut the output into shards of at most this many bytes (``"5GB"``, ``"500MB"``,
        ``"2GiB"``; a larger tensor gets a shard of its own), named and indexed as
        transformers' ``save_pretrained`` does. By default the output has the input's shards.
    fused_shards : bool
        True (default): the weights an engine fuses into one layer (q/k/v into ``qkv_proj``,
        gate/up into ``gate_up_proj``, each expert's gate/up or ``w1``/``w3``, DeepSeek's
        ``q_a_proj``/``kv_a_proj_with_mqa``; by the config's ``model_type``, see
        :mod:`arrayquant.io.fused_shards`) share one per-tensor level where the scheme has one:
        NVFP4's global scale and an FP8 per-tensor scale, from the group's largest range (a first
        pass reads those weights a slab at a time). vLLM and SGLang keep one such level per fused
        layer, so shards with levels of their own load with the wrong scale. A member left in
        float (excluded, a shape the format cannot hold) is left out of its group; the others
        share theirs. ``ModelSummary.fused_groups`` lists the groups. False: every weight keeps
        its own level, each one the same bits as quantized alone.

    Returns
    -------
    ModelSummary

    Raises
    ------
    SchemeError
        A scheme with no compressed-tensors format (the message lists those that map).
    PathError
        A source that is not a safetensors model folder or is quantized already, or a destination
        in use (a :class:`~arrayquant.errors.ShapeError`, as before it existed).
    ShapeError
        A ``max_shard_size`` that is not a size, or a Conv1D model.

    Examples
    --------
    See the guide, "Model folders for transformers and vLLM".
    """
    plan_scheme = QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme
    if not isinstance(plan_scheme, QuantScheme):
        msg = f"scheme must be a QuantScheme or its text, got {type(scheme).__name__}"
        raise SchemeError(msg)
    fmt, args = weight_format(plan_scheme)
    limit = None if max_shard_size is None else parse_size(max_shard_size)
    source, target = Path(src), Path(dst)
    single = source.is_file()  # one .safetensors file: a folder of its weights alone comes out
    if not single and not source.is_dir():
        msg = f"{source} is neither a model folder (config.json and model.safetensors) nor a .safetensors file"
        raise PathError(msg)
    shards, indexed = ([source.name], False) if single else weight_files(source)
    folder = source.parent if single else source
    existing = model_quantization_config(source)
    if existing is not None:  # its entries are codes already: a new config would misdescribe them
        method = existing.get("quant_method", "unknown")
        msg = (
            f"{source} is already quantized (it has a quantization_config, quant_method {method!r}); "
            "quantize the float model, or turn this one back into floats first with arrayquant dequantize"
        )
        raise PathError(msg)
    config = {} if single else _model_config(source)
    if config.get("model_type") in _CONV1D_MODELS:
        msg = (
            f"{source} is a {config['model_type']} model, whose projections are Conv1D layers storing weights "
            "as (in, out); compressed-tensors quantizes Linear layers only, so engines would not load them"
        )
        raise ShapeError(msg)
    vocab = config.get("vocab_size") if isinstance(config.get("vocab_size"), int) else None
    rule = _Rule(plan_scheme, include, exclude, vocab, calibration, importance)
    _check_target(source, target, "quantized")
    summary = ModelSummary(fmt)
    if fused_shards and shares_tensor_level(plan_scheme):  # a first pass, before anything is written
        rule = rule._replace(levels=_shared_levels(folder, shards, rule, config, summary))
    with _building(target) as out_dir:
        if not single:
            summary.copied_files, summary.skipped_files, summary.refused_files = _copy_other_files(
                source, out_dir, shards
            )
        mods, written = _write_shards(folder, shards, out_dir, single, limit, summary, progress, rule)
        summary.shards = [out for out, _ in written]
        if len(written) > 1 if limit is not None else indexed:  # size-cut shards get an index when several
            weight_map = {key: out for out, sizes in written for key in sizes}
            _write_index(out_dir, weight_map, sum(sum(sizes.values()) for _, sizes in written))
        ignore = sorted({*summary.left_out, "lm_head"})
        if not single:  # the dtype a loader builds the model in, where a format decompresses into bfloat16 only
            _declare_dtype(config, {f for f, _ in mods.values()})
        summary.warnings = _loader_warnings({f for f, _ in mods.values()}, summary.quantized)
        # one group for the whole model, or one per kind when weights of different widths differ in strategy
        config["quantization_config"] = (
            modules_quantization_config(mods, ignore) if mods else quantization_config(fmt, args, ignore)
        )
        (out_dir / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return summary


_DTYPE_KEYS = ("dtype", "torch_dtype")  # transformers 5 writes "dtype"; older configs have "torch_dtype"


def _declare_dtype(config: dict[str, Any], formats: set[str]) -> None:
    """Make ``config`` name bfloat16 as the model's dtype when one of ``formats`` decompresses into it only.

    transformers builds a model in the dtype its ``config.json`` names and leaves the weights of a
    compressed-tensors folder compressed until the first forward pass, when compressed-tensors
    decompresses each one in place (``ModelCompressor.decompress_model``). NVFP4, MXFP4 and MXFP8
    weights come out in bfloat16 whatever that dtype is (see ``ct_formats.BF16_FORMATS``), so a
    float32 or float16 model would multiply its activations with bfloat16 weights and stop at its
    first ``Linear``. No scale dtype or ``quantization_config`` field changes that, so such a model
    is declared bfloat16, the one dtype its decompressed weights run in. The MX weights are exact
    in bfloat16; the float tensors stay in the files as they were (transformers rounds them to
    bfloat16 as it loads them). The other formats decompress in the model's own dtype, which is
    kept. Sub-configs that name a dtype of their own (``text_config``, ...) are changed alike.
    """
    if not formats & BF16_FORMATS:
        return
    # no dtype named: transformers builds it in float32
    source = next((str(config[k]) for k in _DTYPE_KEYS if isinstance(config.get(k), str)), "float32")
    _set_dtype(config, "bfloat16")
    config["dtype"] = "bfloat16"
    if source != "bfloat16":  # dequantize_model gives the source's dtype back
        config[SOURCE_DTYPE] = source


# the source model's dtype, where the folder had to declare bfloat16 (an extra config attribute,
# which transformers keeps and ignores)
SOURCE_DTYPE = "arrayquant_source_dtype"


def _set_dtype(config: dict[str, Any], name: str) -> None:
    """Name ``name`` as the model's dtype wherever ``config`` (and its sub-configs) names one."""
    config.pop(SOURCE_DTYPE, None)
    subs = [v for v in config.values() if isinstance(v, dict) and "model_type" in v]
    for part in (config, *subs):
        for key in _DTYPE_KEYS:
            if key in part:
                part[key] = name


class _Rule(NamedTuple):
    """Which tensors are quantized, and how."""

    scheme: QuantScheme
    include: Sequence[str]
    exclude: Sequence[str]
    vocab: int | None
    calibration: Any = "minmax"
    importance: Mapping[str, Any] | None = None  # weight name -> per-column importance
    levels: Mapping[str, Any] | None = None  # weight name -> the per-tensor level its fused group shares


def _write_shards(
    folder: Path,
    shards: Sequence[str],
    out_dir: Path,
    single: bool,
    limit: int | None,
    summary: ModelSummary,
    progress: Callable[[str], None] | None,
    rule: _Rule,
) -> tuple[dict[str, tuple[str, dict[str, Any]]], list[tuple[str, dict[str, int]]]]:
    """Write the output shards; each quantized module's (format, arguments) and each shard's entry sizes."""
    formats: dict[str, tuple[str, dict[str, Any]]] = {}
    written: list[tuple[str, dict[str, int]]] = []
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(SafetensorsFile(folder / shard)) for shard in shards]
        streams = (_shard_items(st, rule, summary, formats, progress) for st in files)
        if limit is None:  # shard for shard, under the input's names
            names = [SINGLE] if single else list(shards)  # a lone file becomes the folder's model.safetensors
            outputs: Iterator[tuple[str, Iterator[tuple[str, Any]]]] = zip(names, streams, strict=True)
        else:  # cut by size, named once their number is known
            parts = _split(itertools.chain.from_iterable(streams), limit)
            outputs = ((f".part-{k:05d}.safetensors", part) for k, part in enumerate(parts))
        for out, items in outputs:
            sizes: dict[str, int] = {}
            # one tensor read, quantized and written at a time
            save_stream(
                out_dir / out, _recorded(items, sizes), metadata={"format": "pt"}, plain=True
            )  # transformers needs "pt"
            written.append((out, sizes))
    if limit is not None:
        written = _rename_parts(out_dir, written)
    return formats, written


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(size: int | str) -> int:
    """Bytes from ``5000000``, ``"5GB"`` (powers of ten, as transformers reads it) or ``"2GiB"``.

    >>> parse_size("5GB"), parse_size("1MiB"), parse_size(4096)
    (5000000000, 1048576, 4096)
    """
    if isinstance(size, int) and not isinstance(size, bool):
        number, unit = size, ""
    else:
        found = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(size))
        if found is None or found[2].upper() not in _UNITS:
            msg = f"max shard size {size!r} is not a size; write bytes or e.g. '5GB', '500MB', '2GiB'"
            raise ShapeError(msg)
        number, unit = int(found[1]), found[2].upper()
    if number <= 0:
        msg = f"max shard size {size!r} must be positive"
        raise ShapeError(msg)
    return number * _UNITS[unit]


def _split(items: Iterator[tuple[str, Any]], limit: int) -> Iterator[Iterator[tuple[str, Any]]]:
    """``items`` cut into runs of at most ``limit`` bytes each (a larger entry alone in its run)."""
    pending = next(items, None)

    def run() -> Iterator[tuple[str, Any]]:
        nonlocal pending
        size = 0
        while pending is not None and (size == 0 or size + pending[1].nbytes <= limit):
            size += pending[1].nbytes
            yield pending
            pending = next(items, None)

    while pending is not None:
        yield run()


def _rename_parts(target: Path, written: list[tuple[str, dict[str, int]]]) -> list[tuple[str, dict[str, int]]]:
    """Give size-cut shards transformers' names: ``model.safetensors`` alone, else ``model-0000k-of-0000n``."""
    n = len(written)
    if n == 0:  # a model without tensors: one empty file, as save_pretrained writes
        save_stream(target / SINGLE, iter(()), metadata={"format": "pt"}, plain=True)
        return [(SINGLE, {})]
    named = []
    for k, (part, sizes) in enumerate(written, 1):
        name = SINGLE if n == 1 else f"model-{k:05d}-of-{n:05d}.safetensors"
        os.replace(target / part, target / name)
        named.append((name, sizes))
    return named


def _recorded(pairs: Iterator[tuple[str, Any]], sizes: dict[str, int]) -> Iterator[tuple[str, Any]]:
    for key, arr in pairs:
        sizes[key] = arr.nbytes
        yield key, arr
        del arr  # not held while the next tensor is computed


def _is_weight(name: str, entry: Any) -> bool:
    """A 2-d floating ``*.weight``: a candidate ``Linear`` weight."""
    return name.endswith(".weight") and entry.dtype in _FLOATS and len(entry.shape) == 2


def _left_out_why(name: str, entry: Any, rule: _Rule) -> str | None:
    """Why the candidate weight ``name`` stays in float by its name or the selection, or None."""
    why = _skip_reason(name, entry.shape, rule.vocab)
    if why is None and not _chosen(name, rule.include, rule.exclude):
        why = "not selected by --include/--exclude"
    return why


def _importance(rule: _Rule, name: str) -> Any:
    return None if rule.importance is None else rule.importance.get(name)


def _shared_levels(
    folder: Path, shards: Sequence[str], rule: _Rule, config: Mapping[str, Any], summary: ModelSummary
) -> dict[str, Any]:
    """Weight name -> the per-tensor level of its fused group, for every weight in a group.

    The groups (:mod:`~arrayquant.io.fused_shards`, by the config's ``model_type``) are formed
    from the weights that will be quantized: those the name rules and the selection keep and
    whose shape the format holds, wherever their shards lie; a member left in float is no part
    of its group. Each member's own level is found as :func:`quantize_entry` finds it (a slab at
    a time for MinMax) and the group shares the largest, which is what each member's level would
    be computed from the group's largest range. The groups are recorded in ``summary``.
    """
    with contextlib.ExitStack() as stack:
        where: dict[str, tuple[SafetensorsFile, str]] = {}  # module -> (its file, weight name)
        fits: dict[tuple[int, ...], bool] = {}  # shape -> whether the format holds it (a model has few shapes)
        for shard in shards:
            st = stack.enter_context(SafetensorsFile(folder / shard))
            for name, entry in st.entries.items():
                if not (_is_weight(name, entry) and _left_out_why(name, entry, rule) is None):
                    continue
                if entry.shape not in fits:
                    fits[entry.shape] = fits_format(rule.scheme, entry.shape)
                if fits[entry.shape]:
                    where[_module(name)] = (st, name)
        levels: dict[str, Any] = {}
        for group, members in fused_groups(where, fusions_for(config)).items():
            found = [
                tensor_level(st, name, rule.scheme, calibration=rule.calibration, importance=_importance(rule, name))
                for st, name in (where[m] for m in members)
            ]
            level = shared_level(found)
            levels.update((where[m][1], level) for m in members)
            summary.fused_groups[group] = members
    return levels


def _shard_items(
    st: SafetensorsFile,
    rule: _Rule,
    summary: ModelSummary,
    formats: dict[str, tuple[str, dict[str, Any]]],
    progress: Callable[[str], None] | None,
) -> Iterator[tuple[str, Any]]:
    """The entries of one output shard, in input order, one tensor read at a time."""
    for name, entry in st.entries.items():
        if progress is not None:
            progress(name)
        if not _is_weight(name, entry):
            yield name, st.passthrough(name)  # copied as stored, never whole in memory
            continue
        why = _left_out_why(name, entry, rule)
        if why is not None:
            summary.left_out[_module(name)] = why
            yield name, st.passthrough(name)
            continue
        try:
            # a row slab at a time: the float weight is never whole in memory, only its entries
            level = None if rule.levels is None else rule.levels.get(name)  # its fused group's
            entries = quantize_entry(
                st,
                name,
                rule.scheme,
                _module(name),
                calibration=rule.calibration,
                importance=_importance(rule, name),
                level=level,
            )
        except (ShapeError, SchemeError) as exc:  # the format cannot hold it: left in float, in `ignore`
            summary.left_out[_module(name)] = f"shape {list(entry.shape)} does not fit the format: {exc}"
            yield name, st.passthrough(name)
            continue
        # anything else (NaN or infinity in the weight, ...) stops the run: an engine would fail on a
        # layer left in float beside its quantized siblings
        summary.quantized.append(_module(name))
        formats[_module(name)] = weight_format(rule.scheme, entry.shape)
        yield from entries.items()
        del entries


# the entries compressed-tensors writes for a quantized weight, beside the module's other parameters
_PARTS = ("weight_packed", "weight_scale", "weight_global_scale", "weight_shape", "weight_zero_point", "weight")


def quantization_config_of(folder: Path) -> dict[str, Any] | None:
    """The ``quantization_config`` of the ``config.json`` in ``folder``; None for a model without one."""
    qc = _model_config(folder).get("quantization_config")
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
    from .ct_file import file_quantization_config

    own = file_quantization_config(path)
    return own if own is not None else quantization_config_of(path.parent)


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
    from ..backends import default, shim

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
    :class:`~arrayquant.io.reader.Passthrough` for a writer to copy), or for a compressed-tensors
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


def dequantize_model(src: str | os.PathLike[str], dst: str | os.PathLike[str], dtype: str | None = None) -> Dequantized:
    """Write a compressed-tensors model folder (or file) back as a plain float folder (or file).

    Every file but the weights is copied, ``config.json`` without its ``quantization_config``;
    each shard is rewritten tensor by tensor with the quantized weights dequantized to ``dtype``
    (default: the model's ``torch_dtype``/``dtype`` from its config, else float32) under their
    ``.weight`` names, other tensors copied as stored, and the index maps them. Scales of
    activation or KV-cache quantization (``input_scale``, ``input_global_scale``, ``k_scale``,
    ...) are dropped: without the ``quantization_config`` no loader uses them. A single file
    (with its config beside it or in its metadata) gives a single float file ``dst``.

    Raises
    ------
    PathError
        A destination in use, or a source that is neither a model folder nor a file.
    CorruptDataError, SchemeError
        As :func:`load_model`.
    """
    source, target = Path(src), Path(dst)
    if not source.exists():
        msg = f"{source} is neither a model folder nor a .safetensors file"
        raise PathError(msg)
    folder = source if source.is_dir() else source.parent
    config_path = folder / CONFIG
    config = _model_config(folder)
    named = config.get(SOURCE_DTYPE) or config.get("torch_dtype") or config.get("dtype") or "float32"
    out_dtype = _float_dtype(dtype or str(named))
    quantized_model = model_quantization_config(source) is not None
    result = Dequantized([], [])
    if source.is_file():  # one file in, one file out
        if target.is_dir():
            msg = f"{target} is a folder; name the float .safetensors file to write"
            raise PathError(msg)
        tensors = iter_model(source, passthrough=True)
        save_stream(
            target, _float_items(tensors, out_dtype, quantized_model, result, {}), metadata={"format": "pt"}, plain=True
        )
        return result
    shards, indexed = weight_files(source)
    _check_target(source, target, "dequantized")
    with _building(target) as out_dir:
        _copy_other_files(source, out_dir, shards)
        where: dict[str, tuple[str, int]] = {}  # entry -> (shard, bytes)
        # one pass over the model, tensor by tensor; each shard is written as its tensors come
        for shard, group in itertools.groupby(iter_model(source, passthrough=True), key=lambda t: t[0]):
            items = _float_items(group, out_dtype, quantized_model, result, where)
            save_stream(out_dir / shard, items, metadata={"format": "pt"}, plain=True)
        if indexed:
            _write_index(out_dir, {k: s for k, (s, _) in where.items()}, sum(n for _, n in where.values()))
        config.pop("quantization_config", None)
        if config:  # the dtype the float shards are written in
            _set_dtype(config, out_dtype.name)
        if config or config_path.is_file():
            (out_dir / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return result


def _float_items(
    tensors: Iterator[tuple[str, str, Any]],
    dtype: np.dtype[Any],
    drop_activations: bool,
    result: Dequantized,
    where: dict[str, tuple[str, int]],
) -> Iterator[tuple[str, Any]]:
    """The entries of a float model: weights dequantized, activation scales dropped, the rest as stored."""
    from ..dequantize import dequantize

    for shard, key, tensor in tensors:
        if isinstance(tensor, QuantizedTensor):
            tensor = np.asarray(dequantize(tensor, dtype))  # saturating at the dtype's maximum
            result.modules.append(key.removesuffix(".weight"))
        elif drop_activations and key.rpartition(".")[2] in ACTIVATION_PARTS:
            result.dropped.append(key)
            continue
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
