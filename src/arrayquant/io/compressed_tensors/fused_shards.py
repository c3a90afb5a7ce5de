"""Which weights of a model an engine fuses into one layer, so that they must share a per-tensor scale.

vLLM and SGLang load several ``Linear`` weights of a checkpoint into one fused layer: q, k and v
into ``qkv_proj``, gate and up into ``gate_up_proj``, each expert's gate and up (``w1``/``w3``)
into its half of the experts' ``w13``, DeepSeek's MLA ``q_a_proj`` and ``kv_a_proj_with_mqa``
into ``fused_qkv_a_proj``. A fused layer keeps one per-tensor level for all its shards:

- NVFP4 linear layers take the largest ``weight_global_scale`` (a divisor) of the shards and
  multiply every shard's block scales by its reciprocal (vLLM
  ``compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py`` and ``..._w4a16_nvfp4.py``,
  ``process_weights_after_loading``: ``layer.weight_global_scale.max()``); NVFP4 MoE layers take
  the first shard's, ``w13_weight_global_scale[:, 0]``, and only warn that "w1_weight_global_scale
  must match w3_weight_global_scale" (``compressed_tensors_moe_w4a4_nvfp4.py``). With a global of
  its own per shard, every shard but one is dequantized with another shard's global.
- Per-tensor FP8 layers with quantized activations requantize each shard to the largest
  ``weight_scale`` (``utils/w8a8_utils.py``, ``requantize_with_max_scale``; per expert for
  ``w13`` in ``compressed_tensors_moe_w8a8_fp8.py``), rounding every other shard's codes a
  second time. A scale shared from the start makes that requantization the identity.

llm-compressor gives such shards one global (``observers/helpers.py``, ``FUSED_LAYER_NAMES``
and ``fuse_weight_observers``: the global is computed from the largest ``|x|`` over the group),
and :func:`arrayquant.quantize_model` does the same: each weight of a group is quantized beneath
the per-tensor level the group's largest ``|x|`` gives. Per-tensor integer scales are left
alone: vLLM expands each shard's scale to its rows instead of merging them
(``convert_to_channelwise`` in ``compressed_tensors_w8a8_int8.py`` and the W8A16 FP8 scheme), so
a shared integer scale would only cost the smaller shards precision.

The groups come from the module names: siblings (same parent module) whose last name parts are
the shards of one fused layer. Which names fuse is read from vLLM's loaders per architecture
(``packed_modules_mapping`` and ``stacked_params_mapping`` in ``model_executor/models/*.py``, and
``make_expert_params_mapping`` for the experts); an architecture not in :data:`ARCHITECTURES`
gets :data:`FALLBACK`, llm-compressor's own list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from ...scheme import QuantScheme

__all__ = ["ARCHITECTURES", "FALLBACK", "Fusion", "fused_groups", "fusions_for", "shares_tensor_level"]


class Fusion(NamedTuple):
    """Sibling modules ``parts`` an engine loads into one layer ``fused`` (under a parent named ``within``)."""

    fused: str
    parts: tuple[str, ...]
    within: str | None = None  # only under a parent module whose last name part is this


QKV = Fusion("qkv_proj", ("q_proj", "k_proj", "v_proj"))
# a dense MLP, a shared expert, and each routed expert (per expert: vLLM's w13 of that expert)
GATE_UP = Fusion("gate_up_proj", ("gate_proj", "up_proj"))
W13 = Fusion("w13", ("w1", "w3"))  # Mixtral-style experts: w1 (gate) and w3 (up) of one expert
MLA = Fusion("fused_qkv_a_proj", ("q_a_proj", "kv_a_proj_with_mqa"))  # DeepSeek V2/V3 with q_lora_rank
INDEXER = Fusion("wk_weights_proj", ("wk", "weights_proj"), within="indexer")  # DeepSeek V3.2's indexer
CROSS_KV = Fusion("kv_proj", ("k_proj", "v_proj"), within="encoder_attn")  # cross-attention: q apart

_DENSE = (QKV, GATE_UP)
_DEEPSEEK = (MLA, INDEXER, QKV, GATE_UP)  # q/k/v exist only in the MHA variant (model_type "deepseek")

# model_type -> the fusions vLLM's loader for it applies (vllm/model_executor/models/<file>.py)
ARCHITECTURES: dict[str, tuple[Fusion, ...]] = {
    "llama": _DENSE,  # llama.py
    "mistral": _DENSE,  # served by llama.py
    "qwen2": _DENSE,  # qwen2.py
    "qwen3": _DENSE,  # qwen3.py
    "qwen2_moe": _DENSE,  # qwen2_moe.py: experts and the shared expert by gate_proj/up_proj
    "qwen3_moe": _DENSE,  # qwen3_moe.py
    "gemma": _DENSE,  # gemma.py
    "gemma2": _DENSE,  # gemma2.py
    "gemma3_text": _DENSE,  # gemma3.py
    "granite": _DENSE,  # granite.py
    "olmo2": _DENSE,  # olmo2.py
    "phi3": _DENSE,  # phi3.py: its checkpoints store qkv_proj and gate_up_proj fused already
    "mixtral": (QKV, W13),  # mixtral.py: experts by ckpt_gate_proj_name="w1", ckpt_up_proj_name="w3"
    "deepseek": _DEEPSEEK,  # deepseek_v2.py serves V1 (MHA: qkv_proj) to V3.2
    "deepseek_v2": _DEEPSEEK,
    "deepseek_v3": _DEEPSEEK,
    "deepseek_v32": _DEEPSEEK,
    "kimi_k2": _DEEPSEEK,
    "whisper": (CROSS_KV, QKV),  # whisper.py: self_attn.qkv_proj, encoder_attn.kv_proj
}
# llm-compressor's FUSED_LAYER_NAMES (observers/helpers.py): any other architecture
FALLBACK: tuple[Fusion, ...] = (GATE_UP, QKV, MLA, W13)


def fusions_for(config: Mapping[str, Any]) -> tuple[Fusion, ...]:
    """The fusions of the architecture a model's ``config.json`` names (``model_type``), else :data:`FALLBACK`."""
    kind = config.get("model_type")
    return ARCHITECTURES.get(kind, FALLBACK) if isinstance(kind, str) else FALLBACK


def fused_groups(modules: Iterable[str], fusions: Iterable[Fusion]) -> dict[str, list[str]]:
    """The groups of ``modules`` an engine fuses: ``"<parent>.<fused>"`` -> its members, in the order given.

    A module joins the first fusion listing its last name part (whose ``within`` its parent
    matches); only groups of two modules or more are returned.

    >>> mods = ["m.layers.0.self_attn.q_proj", "m.layers.0.self_attn.k_proj", "m.layers.0.self_attn.o_proj"]
    >>> fused_groups(mods, FALLBACK)
    {'m.layers.0.self_attn.qkv_proj': ['m.layers.0.self_attn.q_proj', 'm.layers.0.self_attn.k_proj']}
    """
    rules = tuple(fusions)
    found: dict[str, list[str]] = {}
    for module in modules:
        parent, _, leaf = module.rpartition(".")
        owner = parent.rpartition(".")[2]
        for rule in rules:
            if leaf in rule.parts and rule.within in (None, owner):
                found.setdefault(f"{parent}.{rule.fused}" if parent else rule.fused, []).append(module)
                break
    return {group: members for group, members in found.items() if len(members) > 1}


def shares_tensor_level(scheme: QuantScheme) -> bool:
    """Whether the shards of a fused layer share their per-tensor level under ``scheme``.

    Two-level schemes (NVFP4's global) and per-tensor float schemes (FP8 ``tensor``) do; schemes
    of block scales alone (MXFP8, MXFP4, per-row or per-group scales) have no per-tensor level,
    and per-tensor integer scales are kept per shard by the engines (see the module notes).
    """
    return scheme.is_two_level or (scheme.block is None and scheme.value.is_float)
