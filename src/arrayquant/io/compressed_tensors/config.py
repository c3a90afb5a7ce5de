"""The ``quantization_config`` block of a compressed-tensors model folder's ``config.json``.

transformers and vLLM pick their loader from this block (``quant_method: "compressed-tensors"``)
and the layout of every weight from ``format`` and each config group's ``weights`` arguments.
The keys and their order follow what compressed-tensors' own ``ModelCompressor.update_config``
writes (``QuantizationConfig.model_dump`` plus ``version``, ``quant_method``,
``sparsity_config`` and ``transform_config``), so a folder written here reads like one written by
llm-compressor; ``tests/test_ct_config.py`` parses it back with compressed-tensors'
``QuantizationConfig``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import CorruptDataError, ShapeError
from ..patterns import check_pattern

__all__ = [
    "CT_VERSION",
    "DEQUANTIZE",
    "MIXED",
    "QUANT_METHOD",
    "activation_notes",
    "modules_quantization_config",
    "quantization_config",
    "weight_groups",
]

QUANT_METHOD = "compressed-tensors"
# transformers' own loading option, read from the folder's quantization_config as from its argument
DEQUANTIZE = "dequantize"
CT_VERSION = "0.20.1"  # the compressed-tensors release whose layouts the tests check against
MIXED = "mixed-precision"  # the top-level format of a model whose groups differ in format


def quantization_config(
    fmt: str, weights: Mapping[str, Any], ignore: Sequence[str], *, targets: Sequence[str] = ("Linear",)
) -> dict[str, Any]:
    """The ``quantization_config`` for one group of weight-only quantized layers.

    Parameters
    ----------
    fmt : str
        The compressed-tensors format of the group (``"nvfp4-pack-quantized"``, ...).
    weights : mapping
        The group's weight ``QuantizationArgs`` as JSON (``num_bits``, ``type``, ``strategy``, ...).
    ignore : sequence of str
        The layers left in float, by module name.
    targets : sequence of str
        What the group applies to: module class names or ``re:`` patterns.

    Returns
    -------
    dict
        JSON-ready, keys as compressed-tensors writes them.

    Examples
    --------
    >>> cfg = quantization_config("float-quantized", {"num_bits": 8, "type": "float"}, ["lm_head"])
    >>> cfg["quant_method"], cfg["quantization_status"], cfg["config_groups"]["group_0"]["targets"]
    ('compressed-tensors', 'compressed', ['Linear'])
    """
    config = _quantization_config(fmt, weights, ignore, targets)
    _hint_loading(config)
    return config


def _packs_zero_points(fmt: str | None, weights: Mapping[str, Any]) -> bool:
    return (
        fmt == "pack-quantized"
        and weights.get("symmetric") is False
        and weights.get("strategy") in ("group", "channel")
    )


def _hint_loading(config: dict[str, Any]) -> None:
    """Ask transformers to decompress at load where its default path cannot load the weights.

    compressed-tensors (0.20.1) packs the zero points of asymmetric ``pack-quantized`` group and
    channel weights (``(ceil(rows * bits / 32), groups)`` int32), but the model transformers builds
    before loading gets them unpacked (``PackedQuantizationCompressor.compress`` on meta weights
    leaves ``weight_zero_point`` as ``(rows, groups)`` int8), so a plain ``from_pretrained`` stops
    on a size mismatch, for compressed-tensors' own ``W4A16_ASYM`` folders too. With
    ``dequantize: true`` (transformers' ``CompressedTensorsConfig`` takes it from the folder)
    transformers decompresses the stored weights at load instead, which works. vLLM, SGLang and
    compressed-tensors ignore the key.
    """
    groups = config["config_groups"].values()
    if any(_packs_zero_points(g.get("format") or config["format"], g["weights"]) for g in groups):
        config[DEQUANTIZE] = True


def _quantization_config(
    fmt: str, weights: Mapping[str, Any], ignore: Sequence[str], targets: Sequence[str]
) -> dict[str, Any]:
    group = {
        "format": None,  # the top-level format applies
        "input_activations": None,
        "output_activations": None,
        "targets": list(targets),
        "weights": dict(weights),
    }
    return {
        "config_groups": {"group_0": group},
        "format": fmt,
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "moe_sparsity_config": None,
        "quant_method": QUANT_METHOD,
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": CT_VERSION,
    }


def modules_quantization_config(
    modules: Mapping[str, tuple[str, Mapping[str, Any]]], ignore: Sequence[str]
) -> dict[str, Any]:
    r"""The ``quantization_config`` for quantized modules whose formats or weight arguments may differ.

    Modules that all share one ``(format, weights)`` give :func:`quantization_config`'s single
    group targeting ``Linear``. Otherwise each distinct ``(format, weights)`` becomes a group, in
    order of first appearance, whose targets name its modules exactly (``re:^<name>$``) and which
    carries its own ``format``; the top-level ``format`` is the shared one, or
    ``"mixed-precision"`` when the groups differ in format, as compressed-tensors'
    ``infer_model_format`` sets it.

    Parameters
    ----------
    modules : mapping of str to (str, mapping)
        Each quantized module's name and its weight's (compressed-tensors format, weight
        ``QuantizationArgs`` as JSON), as :func:`arrayquant.io.compressed_tensors.schemes.weight_format` gives them.
    ignore : sequence of str
        The layers left in float, by module name.

    Returns
    -------
    dict
        JSON-ready, keys as compressed-tensors writes them.

    Raises
    ------
    ShapeError
        No modules: a config without groups describes nothing.

    Examples
    --------
    >>> nv = ("nvfp4-pack-quantized", {"num_bits": 4, "type": "float"})
    >>> fp8 = ("float-quantized", {"num_bits": 8, "type": "float"})
    >>> cfg = modules_quantization_config({"a.q": nv, "a.k": nv, "a.o": fp8}, ["lm_head"])
    >>> cfg["format"], [(g["format"], g["targets"]) for g in cfg["config_groups"].values()]
    ('mixed-precision', [('nvfp4-pack-quantized', ['re:^a\\.q$', 're:^a\\.k$']), ('float-quantized', ['re:^a\\.o$'])])
    """
    groups: dict[str, tuple[str, dict[str, Any], list[str]]] = {}
    for module, (fmt, weights) in modules.items():
        key = json.dumps([fmt, weights], sort_keys=True)  # equal arguments in any key order share a group
        groups.setdefault(key, (fmt, dict(weights), []))[2].append(module)
    if not groups:
        msg = "no quantized modules: a quantization_config needs at least one; write a file without one"
        raise ShapeError(msg)
    if len(groups) == 1:
        ((fmt, weights, _),) = groups.values()
        return quantization_config(fmt, weights, ignore)
    formats = {fmt for fmt, _, _ in groups.values()}
    config = quantization_config(next(iter(formats)) if len(formats) == 1 else MIXED, {}, ignore)
    config["config_groups"] = {
        f"group_{i}": {
            # each group names its format: readers take it over the top-level one
            "format": fmt,
            "input_activations": None,
            "output_activations": None,
            # anchored both ends so "layers.1.q" does not also take "layers.1.q_proj" or "layers.10.q"
            "targets": [f"re:^{re.escape(m)}$" for m in names],
            "weights": weights,
        }
        for i, (fmt, weights, names) in enumerate(groups.values())
    }
    _hint_loading(config)
    return config


def weight_groups(config: Mapping[str, Any]) -> list[tuple[str, list[str], dict[str, Any]]]:
    """``(format, targets, weights)`` of each config group of a ``quantization_config``.

    A group without its own ``format`` takes the top-level one; in a ``"mixed-precision"`` config
    every group must name its own. Activation arguments are not returned: they say how an engine
    quantizes activations at run time, not how the stored weights decode.

    Raises
    ------
    CorruptDataError
        Not a compressed-tensors block, a group without targets or weight arguments, or a group of
        a mixed-precision config without its own format.

    Examples
    --------
    >>> cfg = quantization_config("pack-quantized", {"num_bits": 4, "type": "int"}, [])
    >>> weight_groups(cfg)
    [('pack-quantized', ['Linear'], {'num_bits': 4, 'type': 'int'})]
    """
    if not isinstance(config, Mapping) or config.get("quant_method") != QUANT_METHOD:
        method = config.get("quant_method") if isinstance(config, Mapping) else type(config).__name__
        msg = f"quantization_config has quant_method {method!r}; arrayquant reads {QUANT_METHOD!r} only"
        raise CorruptDataError(msg)
    groups = config.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        msg = "quantization_config has no config_groups; a compressed-tensors model names at least one"
        raise CorruptDataError(msg)
    ignore = config.get("ignore") or []
    if not isinstance(ignore, list):
        msg = f"quantization_config has an ignore of type {type(ignore).__name__}; it is a list of module names"
        raise CorruptDataError(msg)
    out = []
    for key, group in groups.items():
        if not isinstance(group, Mapping):
            msg = f"quantization_config group {key!r} is not an object"
            raise CorruptDataError(msg)
        fmt = group.get("format") or config.get("format")
        if fmt == MIXED:
            # compressed-tensors would infer it from the model's module classes, which a file lacks
            msg = (
                f"quantization_config group {key!r} names no format while the config's format is {MIXED!r}; "
                "each group of a mixed-precision config must name its own"
            )
            raise CorruptDataError(msg)
        targets, weights = group.get("targets"), group.get("weights")
        if not isinstance(fmt, str) or not isinstance(targets, list) or not isinstance(weights, Mapping):
            msg = f"quantization_config group {key!r} lacks a format, its targets or its weights arguments"
            raise CorruptDataError(msg)
        for target in (*targets, *ignore):
            check_pattern(str(target))  # a broken or unbounded pattern is refused before any weight is read
        out.append((fmt, [str(t) for t in targets], dict(weights)))
    return out


def activation_notes(config: Mapping[str, Any]) -> list[str]:
    """What a ``quantization_config`` says about activations and the KV cache, one line per group.

    arrayquant reads weights only: these arguments tell an engine how to quantize activations
    while it runs, and do not change how the stored weights decode.

    >>> cfg = quantization_config("float-quantized", {"num_bits": 8, "type": "float"}, [])
    >>> cfg["config_groups"]["group_0"]["input_activations"] = {"num_bits": 8, "type": "float",
    ...     "strategy": "token", "dynamic": True}
    >>> activation_notes(cfg)
    ['group_0: input activations float 8-bit, strategy token, dynamic']
    """
    notes = []
    groups = config.get("config_groups")
    for key, group in groups.items() if isinstance(groups, Mapping) else ():
        for side in ("input_activations", "output_activations"):
            args = group.get(side) if isinstance(group, Mapping) else None
            if isinstance(args, Mapping):
                notes.append(f"{key}: {side.replace('_', ' ')} {_describe(args)}")
    kv = config.get("kv_cache_scheme")
    if isinstance(kv, Mapping):
        notes.append(f"kv cache {_describe(kv)}")
    return notes


def _describe(args: Mapping[str, Any]) -> str:
    dynamic = args.get("dynamic")
    when = "dynamic" if dynamic is True else "static" if dynamic is False else f"dynamic={dynamic}"
    return f"{args.get('type')} {args.get('num_bits')}-bit, strategy {args.get('strategy')}, {when}"
