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

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import CorruptDataError

__all__ = ["CT_VERSION", "QUANT_METHOD", "quantization_config", "weight_groups"]

QUANT_METHOD = "compressed-tensors"
CT_VERSION = "0.20.1"  # the compressed-tensors release whose layouts the tests check against


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


def weight_groups(config: Mapping[str, Any]) -> list[tuple[str, list[str], dict[str, Any]]]:
    """``(format, targets, weights)`` of each config group of a ``quantization_config``.

    A group without its own ``format`` takes the top-level one. Activation arguments are not
    returned: they say how an engine quantizes activations at run time, not how the stored
    weights decode.

    Raises
    ------
    CorruptDataError
        Not a compressed-tensors block, or a group without targets or weight arguments.

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
    out = []
    for key, group in groups.items():
        if not isinstance(group, Mapping):
            msg = f"quantization_config group {key!r} is not an object"
            raise CorruptDataError(msg)
        fmt = group.get("format") or config.get("format")
        targets, weights = group.get("targets"), group.get("weights")
        if not isinstance(fmt, str) or not isinstance(targets, list) or not isinstance(weights, Mapping):
            msg = f"quantization_config group {key!r} lacks a format, its targets or its weights arguments"
            raise CorruptDataError(msg)
        out.append((fmt, [str(t) for t in targets], dict(weights)))
    return out
