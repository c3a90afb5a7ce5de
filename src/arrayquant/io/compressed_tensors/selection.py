"""Which tensors of a model folder are the ``Linear`` weights to quantize, and why each other weight is not.

Which tensors are quantized follows llm-compressor's default: the weights of ``Linear`` layers.
A safetensors file does not say which tensor belongs to which kind of layer, so the rule is read
from names and shapes: 2-d floating ``*.weight`` tensors (:func:`is_weight`), except embeddings
(``embed`` in the name), ``lm_head``, normalisation layers (``norm``) and MoE routers
(:func:`skip_reason`). The caller's ``include``/``exclude`` globs then narrow the choice, by the
one rule every format applies (:class:`~arrayquant.io._select.Selection`).
"""

from __future__ import annotations

from .. import _dtypes
from .._select import Selection
from ..safetensors.reader import Entry

__all__ = ["CONV1D_MODELS", "is_weight", "left_out_why", "skip_reason"]

_FLOATS = _dtypes.SAFETENSORS_FLOATS
_SKIP_NAMES = ("embed", "lm_head", "norm")  # in a name, as llm-compressor's default ignores them


# embeddings and heads by name: GPT-2's wte/wpe, T5's shared and relative attention bias
_SKIP_PARTS = frozenset({"wte", "wpe", "shared", "relative_attention_bias"})
# models whose projections are Conv1D layers storing (in, out): compressed-tensors quantizes Linear only
CONV1D_MODELS = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer"})


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


def skip_reason(name: str, shape: tuple[int, ...], vocab: int | None) -> str | None:
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


def is_weight(name: str, entry: Entry) -> bool:
    """A 2-d floating ``*.weight``: a candidate ``Linear`` weight."""
    return name.endswith(".weight") and entry.dtype in _FLOATS and len(entry.shape) == 2


def left_out_why(name: str, shape: tuple[int, ...], vocab: int | None, selection: Selection) -> str | None:
    """Why the candidate weight ``name`` stays in float by its name or the caller's selection, or None."""
    why = skip_reason(name, shape, vocab)
    if why is None:
        why = selection.why_not(name, shape, default=False)  # the Linear rule above is the default
    return why
