"""Hugging Face model folders quantized into compressed-tensors, the layout transformers and vLLM load.

:func:`quantize_file` (also :func:`arrayquant.quantize_model`) writes a new folder from a float
model folder (see :mod:`~arrayquant.io.compressed_tensors.folder`):

- every file that is not a weight shard or the index is copied unchanged;
- each shard is rewritten tensor by tensor into a shard of the same name, the ``Linear`` weights
  quantized into compressed-tensors entries (``<module>.weight_packed``, ``.weight_scale``, ...),
  every other tensor copied bit for bit; the index maps the new entry names;
- ``config.json`` gains the ``quantization_config`` compressed-tensors writes.

Which weights are quantized is :mod:`~arrayquant.io.compressed_tensors.selection`'s rule. Every
2-d weight left in float is listed in ``ignore`` (with ``lm_head``, which a model with tied
embeddings has as a module without a tensor of its own), so the loader keeps it dense.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ...errors import PathError, SchemeError, ShapeError
from ...scheme import QuantScheme
from .._select import Selection
from ..safetensors.reader import SafetensorsFile
from ..safetensors.writer import save_stream
from ..summary import QuantizeSummary
from .config import QUANT_METHOD, modules_quantization_config, quantization_config
from .folder import (
    CONFIG,
    DTYPE_KEYS,
    SINGLE,
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
from .fused_shards import fused_groups, fusions_for, shares_tensor_level
from .schemes import BF16_FORMATS, weight_format
from .selection import CONV1D_MODELS, is_weight, left_out_why
from .stream import fits_format, quantize_entry, shared_level, tensor_level

__all__ = ["parse_size", "quantize_file", "quantize_model"]


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


def _module(name: str) -> str:
    return name[: -len(".weight")]


def quantize_file(
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
) -> QuantizeSummary:
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
        :mod:`arrayquant.io.compressed_tensors.fused_shards`) share one per-tensor level where the scheme has one:
        NVFP4's global scale and an FP8 per-tensor scale, from the group's largest range (a first
        pass reads those weights a slab at a time). vLLM and SGLang keep one such level per fused
        layer, so shards with levels of their own load with the wrong scale. A member left in
        float (excluded, a shape the format cannot hold) is left out of its group; the others
        share theirs. ``QuantizeSummary.fused_groups`` lists the groups. False: every weight keeps
        its own level, each one the same bits as quantized alone.

    Returns
    -------
    QuantizeSummary

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
    config = {} if single else model_config(source)
    if config.get("model_type") in CONV1D_MODELS:
        msg = (
            f"{source} is a {config['model_type']} model, whose projections are Conv1D layers storing weights "
            "as (in, out); compressed-tensors quantizes Linear layers only, so engines would not load them"
        )
        raise ShapeError(msg)
    vocab = config.get("vocab_size") if isinstance(config.get("vocab_size"), int) else None
    rule = _Rule(plan_scheme, Selection(include, exclude), vocab, calibration, importance)
    check_target(source, target, "quantized")
    summary = QuantizeSummary(QUANT_METHOD, str(plan_scheme), stored_as=fmt)
    if fused_shards and shares_tensor_level(plan_scheme):  # a first pass, before anything is written
        rule = rule._replace(levels=_shared_levels(folder, shards, rule, config, summary))
    with building(target) as out_dir:
        if not single:
            summary.copied_files, summary.skipped_files, summary.refused_files = copy_other_files(
                source, out_dir, shards
            )
        mods, written = _write_shards(folder, shards, out_dir, single, limit, summary, progress, rule)
        summary.shards = [out for out, _ in written]
        if len(written) > 1 if limit is not None else indexed:  # size-cut shards get an index when several
            weight_map = {key: out for out, sizes in written for key in sizes}
            write_index(out_dir, weight_map, sum(sum(sizes.values()) for _, sizes in written))
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


def _declare_dtype(config: dict[str, Any], formats: set[str]) -> None:
    """Make ``config`` name bfloat16 as the model's dtype when one of ``formats`` decompresses into it only.

    transformers builds a model in the dtype its ``config.json`` names and leaves the weights of a
    compressed-tensors folder compressed until the first forward pass, when compressed-tensors
    decompresses each one in place (``ModelCompressor.decompress_model``). NVFP4, MXFP4 and MXFP8
    weights come out in bfloat16 whatever that dtype is (see ``schemes.BF16_FORMATS``), so a
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
    source = next((str(config[k]) for k in DTYPE_KEYS if isinstance(config.get(k), str)), "float32")
    set_dtype(config, "bfloat16")
    config["dtype"] = "bfloat16"
    if source != "bfloat16":  # dequantize_model gives the source's dtype back
        config[SOURCE_DTYPE] = source


class _Rule(NamedTuple):
    """Which tensors are quantized, and how."""

    scheme: QuantScheme
    selection: Selection  # the caller's include/exclude globs
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
    summary: QuantizeSummary,
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
            save_stream(out_dir / out, _recorded(items, sizes), metadata={"format": "pt"})  # transformers needs "pt"
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
        save_stream(target / SINGLE, iter(()), metadata={"format": "pt"})
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


def _importance(rule: _Rule, name: str) -> Any:
    return None if rule.importance is None else rule.importance.get(name)


def _shared_levels(
    folder: Path, shards: Sequence[str], rule: _Rule, config: Mapping[str, Any], summary: QuantizeSummary
) -> dict[str, Any]:
    """Weight name -> the per-tensor level of its fused group, for every weight in a group.

    The groups (:mod:`~arrayquant.io.compressed_tensors.fused_shards`, by the config's ``model_type``) are formed
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
                if not (is_weight(name, entry) and left_out_why(name, entry.shape, rule.vocab, rule.selection) is None):
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
    summary: QuantizeSummary,
    formats: dict[str, tuple[str, dict[str, Any]]],
    progress: Callable[[str], None] | None,
) -> Iterator[tuple[str, Any]]:
    """The entries of one output shard, in input order, one tensor read at a time."""
    for name, entry in st.entries.items():
        if progress is not None:
            progress(name)
        if not is_weight(name, entry):
            yield name, st.passthrough(name)  # copied as stored, never whole in memory
            continue
        why = left_out_why(name, entry.shape, rule.vocab, rule.selection)
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


quantize_model = quantize_file  # the name arrayquant exports it under
