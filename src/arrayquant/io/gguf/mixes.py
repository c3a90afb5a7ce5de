"""llama-quantize's file types (Q4_K_M, Q5_K_S, Q6_K, ...): which GGUF type each tensor of a model gets.

``llama-quantize model.gguf out.gguf Q4_K_M`` does not give every weight Q4_K: it picks per tensor
(``llama_tensor_get_type`` in ``src/llama-quant.cpp`` of the pinned llama.cpp, read for this
module), from the tensor's category (token embedding, output, attention q/k/v/output, feed-forward
gate/up/down), its layer, the model's shape (layers, attention heads per KV head, experts) and
the options:

- which tensors it quantizes at all (``tensor_allows_quantization``: names ending in ``weight``,
  two or three dimensions, no norms, routers, position embeddings, convolutions, ...);
- the file type's default type (``llama_ftype_get_default_type``), then the mix's changes: the
  output (and a token embedding tied to it) to Q6_K; ``attn_v`` and ``ffn_down`` bumped in the
  layers ``use_more_bits`` picks (the first and last eighth and every third between) for the _M
  mixes; Q3_K_M, Q3_K_L and the IQ4 types' own rules; 8-expert and 70B models' extras;
- ``--tensor-type PATTERN=TYPE`` (a regular expression searched in the name, the first that
  matches wins, lowercased as llama-quantize lowercases it), ``--output-tensor-type`` and
  ``--token-embedding-type``, and ``--pure`` (every quantized weight the default type);
- the fallback for rows that are not whole blocks of the chosen type (``tensor_type_fallback``:
  Q4_K to Q5_0, Q6_K to Q8_0, ..., and F16 where that does not fit either).

The counters behind "layer" for ``attn_v`` (and for ``ffn_down`` of a dense model) advance in
llama.cpp's order of the tensors: by layer (``blk.N.``; others first), then by name.

Only the file types whose tensors arrayquant writes are here (:data:`MIXES`); the IQ1, IQ2 and IQ3
ones pick vector-codebook types it does not write.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...errors import SchemeError
from .ggml import block_sizes, ggml_rank

__all__ = [
    "MIXES",
    "Choice",
    "Mix",
    "ModelShape",
    "allows_quantization",
    "llama_order",
    "mix_of",
    "model_shape",
    "tensor_types",
]


@dataclass(frozen=True)
class Mix:
    """A llama-quantize file type: its name, ``llama_ftype`` number and default tensor type."""

    name: str
    ftype: int
    default: str


_TABLE = (
    ("Q4_0", 2, "Q4_0"),
    ("Q4_1", 3, "Q4_1"),
    ("Q8_0", 7, "Q8_0"),
    ("Q5_0", 8, "Q5_0"),
    ("Q5_1", 9, "Q5_1"),
    ("Q2_K", 10, "Q2_K"),
    ("Q3_K_S", 11, "Q3_K"),
    ("Q3_K_M", 12, "Q3_K"),
    ("Q3_K_L", 13, "Q3_K"),
    ("Q4_K_S", 14, "Q4_K"),
    ("Q4_K_M", 15, "Q4_K"),
    ("Q5_K_S", 16, "Q5_K"),
    ("Q5_K_M", 17, "Q5_K"),
    ("Q6_K", 18, "Q6_K"),
    ("Q2_K_S", 21, "Q2_K"),
    ("IQ4_NL", 25, "IQ4_NL"),
    ("IQ4_XS", 30, "IQ4_XS"),
    ("TQ1_0", 36, "TQ1_0"),
    ("TQ2_0", 37, "TQ2_0"),
    ("MXFP4_MOE", 38, "MXFP4"),
)
#: llama-quantize's file types arrayquant writes, by name (``Q3_K``, ``Q4_K``, ``Q5_K`` are its _M aliases)
MIXES: dict[str, Mix] = {name: Mix(name, ftype, default) for name, ftype, default in _TABLE}
_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
# llama.cpp's own IQ file types: their tensors are vector codebooks (IQ1/IQ2/IQ3)
_NOT_WRITTEN = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_S", "IQ3_M", "IQ3_XS")


def mix_of(name: str) -> Mix | None:
    """The llama-quantize file type named ``name`` (any case), or None where it is none.

    >>> mix_of("q4_k").name, mix_of("Q4_K_M").ftype, mix_of("q8s") is None
    ('Q4_K_M', 15, True)
    """
    key = str(name).strip().upper()
    if key in _NOT_WRITTEN:
        msg = (
            f"llama-quantize's {key} picks IQ1, IQ2 or IQ3 vector-codebook types for its tensors, which arrayquant "
            f"does not write; the file types it writes are {', '.join(MIXES)}"
        )
        raise SchemeError(msg)
    return MIXES.get(_ALIASES.get(key, key))


@dataclass(frozen=True)
class ModelShape:
    """What llama-quantize's choices read of a model: its architecture, layers, heads and experts."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int

    @property
    def n_gqa(self) -> int:
        """Attention heads per KV head (``hparams.n_gqa()``; 0 without KV heads)."""
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        """llama.cpp's ``LLM_TYPE_70B``, the one model type the mixes look at: a Llama of 80 layers with GQA."""
        return self.arch == "llama" and self.n_layer == 80 and self.n_head != self.n_head_kv


def _first_int(value: Any) -> int:
    """A metadata integer, or the first of a per-layer array."""
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else 0
    return int(value) if value is not None else 0


def model_shape(fields: Mapping[str, Any]) -> ModelShape:
    """The :class:`ModelShape` of a GGUF file's key/values (``general.architecture``, ``<arch>.block_count``, ...).

    ``fields`` maps a key to its value (a plain Python value, or a list for an array).
    """
    arch = str(fields.get("general.architecture", ""))
    n_head = _first_int(fields.get(f"{arch}.attention.head_count"))
    kv = fields.get(f"{arch}.attention.head_count_kv")
    return ModelShape(
        arch=arch,
        n_layer=_first_int(fields.get(f"{arch}.block_count")),
        n_head=n_head,
        n_head_kv=_first_int(kv) if kv is not None else n_head,
        n_expert=_first_int(fields.get(f"{arch}.expert_count")),
    )


# tensor_allows_quantization: substrings of the 2-d and 3-d weights llama-quantize leaves as they are
_KEPT = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
)
_KEPT_EXACT = ("position_embd.weight", "token_types.weight")  # BERT's, by their whole name
_KEPT_GLM5_NEXT = (
    "hc_",
    "indexer.attn_q_b",
    "indexer.attn_k",
    "indexer.proj",
    "indexer_compressor_gate",
    "indexer_compressor_ape",
    "ssm_f_a.weight",
    "ssm_f_b.weight",
    "ssm_g_a.weight",
    "ssm_g_b.weight",
    "ssm_beta.weight",
    "attn_kv_a_mqa.weight",
    "attn_k_b.weight",
    "attn_v_b.weight",
)


def allows_quantization(name: str, shape: Sequence[int], arch: str = "", *, quantize_output: bool = True) -> str | None:
    """Why llama-quantize leaves this tensor as it is (``tensor_allows_quantization``), or None to quantize it.

    >>> allows_quantization("blk.0.attn_norm.weight", (4096,)) is not None
    True
    >>> allows_quantization("blk.0.ffn_up.weight", (11008, 4096)) is None
    True
    """
    if not name.endswith("weight"):
        return "not a weight (llama-quantize quantizes tensors whose names end in 'weight')"
    if ggml_rank(tuple(shape)) < 2:
        return "1-d (llama-quantize quantizes 2-d and 3-d weights only)"
    if not quantize_output and name == "output.weight":
        return "the output tensor, left as it is (--leave-output-tensor)"
    kept = _KEPT + (_KEPT_GLM5_NEXT if arch == "glm5-next" else ())
    for part in kept:
        if part in name:
            return f"llama-quantize keeps '*{part}*' tensors as they are"
    if name in _KEPT_EXACT:
        return f"llama-quantize keeps {name} as it is"
    return None


def _category(name: str) -> str:
    """``tensor_get_category``: one of output, token_embd, attn_qkv, attn_kv_b, attn_v, attn_k, attn_q,
    attn_output, ffn_up, ffn_gate, ffn_down or other."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in (
        ("attn_qkv.weight", "attn_qkv"),
        ("attn_kv_b.weight", "attn_kv_b"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if part in name:
            return cat
    return "other"


_LAYER = re.compile(r"blk\.\s*([+-]?\d+)")  # what sscanf(name, "blk.%d.", &layer) reads


def _layer(name: str) -> int | None:
    """``sscanf(name, "blk.%d.", &layer)``: the layer number, or None where the name has none at its start."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def llama_order(names: Sequence[str]) -> list[str]:
    """The tensors in llama.cpp's order (``weight_name_comparer``): by layer (names outside ``blk.N.`` first),
    then by name (byte order).

    >>> llama_order(["blk.10.a", "blk.2.b", "output.weight", "blk.2.a"])
    ['output.weight', 'blk.2.a', 'blk.2.b', 'blk.10.a']
    """
    return sorted(names, key=lambda n: (-1 if (k := _layer(n)) is None else k, n.encode()))


class _State:
    """``quantize_state_impl``: the counters the mixes advance tensor by tensor."""

    def __init__(self, names: Sequence[str], shape: ModelShape, imatrix: bool) -> None:
        cats = [_category(n) for n in names]
        self.n_attention_wv = sum(c in ("attn_v", "attn_qkv", "attn_kv_b") for c in cats)
        self.has_tied_embeddings = "output" not in cats
        self.n_ffn = shape.n_layer
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self.has_imatrix = imatrix


def _more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _layer_info(i: int, n: int, name: str, shape: ModelShape) -> tuple[int, int]:
    if max(1, shape.n_expert) > 1:  # experts are not consecutive: the layer comes from the name
        layer = _layer(name)
        if layer is None:
            msg = f"failed to determine the layer of tensor {name!r} (llama-quantize reads it from 'blk.N.')"
            raise SchemeError(msg)
        if layer < 0 or layer >= n:
            msg = f"bad layer {layer} for tensor {name!r}: it must be in [0, {n})"
            raise SchemeError(msg)
        return layer, n
    return i, n


def _by_mix(
    qs: _State, new: str, name: str, cols: int, mix: str, cat: str, shape: ModelShape, output_type: str | None
) -> str:
    """``llama_tensor_get_type_impl`` for the file types of :data:`MIXES`."""
    gqa, experts, falcon = shape.n_gqa, shape.n_expert, shape.arch == "falcon"
    if cat == "output" or (qs.has_tied_embeddings and cat == "token_embd"):
        if output_type is not None:  # a token embedding tied to the output follows --output-tensor-type
            return output_type
        if mix == "MXFP4_MOE" or falcon or cols % block_sizes(new)[0]:
            return "Q8_0"
        return "Q6_K" if new != "Q8_0" else new
    if mix == "MXFP4_MOE":
        return new  # chosen by the caller: experts MXFP4, the rest Q8_0
    if cat == "token_embd":
        return "Q4_K" if mix in ("TQ1_0", "TQ2_0") else new
    if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
        if mix == "Q2_K":
            new = "Q4_K" if gqa >= 4 else "Q3_K"
        elif mix == "Q2_K_S" and gqa >= 4:
            new = "Q4_K"
        elif mix == "Q3_K_M":
            new = "Q5_K" if qs.i_attention_wv < 2 else "Q4_K"
        elif mix == "Q3_K_L" or (mix in ("IQ4_NL", "IQ4_XS") and gqa >= 4):
            new = "Q5_K"
        elif mix in ("Q4_K_M", "Q5_K_M") and _more_bits(qs.i_attention_wv, qs.n_attention_wv):
            new = "Q6_K"
        elif mix == "Q4_K_S" and qs.i_attention_wv < 4:
            new = "Q5_K"
        if shape.is_70b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"
        if experts == 8:
            new = "Q8_0"
        qs.i_attention_wv += 1
        return new
    if cat == "attn_k":
        return "Q8_0" if experts == 8 else new
    if cat == "ffn_down":
        i, n = _layer_info(qs.i_ffn_down, qs.n_ffn, name, shape)
        if mix == "Q2_K":
            new = "Q3_K"
        elif mix == "Q2_K_S":
            if i < n // 8:
                new = "Q4_K"
        elif mix == "Q3_K_M":
            new = "Q5_K" if i < n // 16 else "Q4_K" if not falcon or _more_bits(i, n) else "Q3_K"
        elif mix == "Q3_K_L":
            new = "Q4_K" if falcon else "Q5_K"
        elif mix == "Q4_K_M":
            if falcon:
                new = "Q6_K" if i < n // 16 else "Q5_K" if _more_bits(i, n) else "Q4_K"
            elif _more_bits(i, n):
                new = "Q6_K"
        elif i < n // 8 and mix in ("IQ4_NL", "IQ4_XS") and not qs.has_imatrix:
            new = "Q5_K"
        elif mix == "Q5_K_M" and _more_bits(i, n):
            new = "Q6_K"
        elif mix == "Q4_K_S" and not falcon and i < n // 8:
            new = "Q5_K"
        elif mix in ("Q4_0", "Q5_0") and qs.has_imatrix and i < n // 8:
            new = "Q4_1" if mix == "Q4_0" else "Q5_1"
        qs.i_ffn_down += 1
        return new
    if cat == "attn_output":
        if not falcon:
            if experts == 8:
                if mix in ("Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS"):
                    new = "Q5_K"
            elif mix == "Q2_K":
                new = "Q3_K"
            elif mix == "Q3_K_M":
                new = "Q4_K"
            elif mix == "Q3_K_L":
                new = "Q5_K"
        elif mix == "Q3_K_L":
            new = "Q4_K"
        return new
    if cat == "ffn_gate":
        _layer_info(qs.i_ffn_gate, qs.n_ffn, name, shape)
        qs.i_ffn_gate += 1
    elif cat == "ffn_up":
        _layer_info(qs.i_ffn_up, qs.n_ffn, name, shape)
        qs.i_ffn_up += 1
    return new


def _fallback(name: str, cols: int, target: str) -> str:
    """``tensor_type_fallback``: a type whose blocks fit rows of ``cols``."""
    block = block_sizes(target)[0]
    if cols % block == 0:
        return target
    out = {
        "IQ4_XS": "IQ4_NL",
        "Q2_K": "Q4_0",
        "Q3_K": "Q4_0",
        "TQ1_0": "Q4_0",
        "TQ2_0": "Q4_0",
        "Q4_K": "Q5_0",
        "Q5_K": "Q5_1",
        "Q6_K": "Q8_0",
    }.get(target)
    if out is None:
        if block > 32:
            msg = f"no tensor type fallback is defined for type {target} (tensor {name!r}, rows of {cols})"
            raise SchemeError(msg)
        out = target
    return out if cols % block_sizes(out)[0] == 0 else "F16"


class Choice(NamedTuple):
    """A tensor's type, and the one chosen before llama-quantize's fallback for rows that do not fit it."""

    type: str
    wanted: str


def tensor_types(
    mix: Mix,
    tensors: Sequence[tuple[str, tuple[int, ...], str]],
    shape: ModelShape,
    *,
    imatrix: bool = False,
    pure: bool = False,
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
    overrides: Sequence[tuple[str, str]] = (),
    quantize_output: bool = True,
) -> dict[str, Choice]:
    """Each tensor's GGUF type under ``mix``, as ``llama_tensor_get_type`` chooses it.

    Parameters
    ----------
    mix : Mix
        The file type (:data:`MIXES`).
    tensors : sequence of (name, shape, type name)
        Every tensor of the model (NumPy order: columns last), in any order.
    shape : ModelShape
        From the file's key/values (:func:`model_shape`).
    imatrix : bool
        Whether an importance matrix is given (some choices depend on it).
    pure : bool
        ``--pure``: every tensor quantized gets the default type (overrides still apply).
    output_tensor_type, token_embedding_type : str, optional
        ``--output-tensor-type`` / ``--token-embedding-type``.
    overrides : sequence of (pattern, type)
        ``--tensor-type PATTERN=TYPE`` in order: the first whose regular expression is found in
        the name (patterns are lowercased, as llama-quantize lowercases them) decides.
    quantize_output : bool
        False for ``--leave-output-tensor``.

    Returns
    -------
    dict of str to Choice
        The type of every tensor (its own where llama-quantize leaves it as it is), with the type
        chosen before the fallback.

    Raises
    ------
    SchemeError
        A layer llama-quantize cannot place (an expert tensor without ``blk.N.``), or a fallback
        it has none for.
    """
    names = llama_order([t[0] for t in tensors])
    by_name = {name: (shp, kind) for name, shp, kind in tensors}
    qs = _State(names, shape, imatrix)
    compiled = [(re.compile(p.lower()), t.upper()) for p, t in overrides]
    out: dict[str, Choice] = {}
    for name in names:
        shp, kind = by_name[name]
        if allows_quantization(name, shp, shape.arch, quantize_output=quantize_output) is not None:
            out[name] = Choice(kind, kind)
            continue
        cat = _category(name)
        if token_embedding_type is not None and cat == "token_embd":
            named = name == "per_layer_token_embd.weight" and any(p.search(name) for p, _ in compiled)
            if not named:
                out[name] = Choice(token_embedding_type.upper(), token_embedding_type.upper())
                continue
        if output_tensor_type is not None and cat == "output":
            out[name] = Choice(output_tensor_type.upper(), output_tensor_type.upper())
            continue
        new = mix.default
        manual = False
        for pattern, kind_over in compiled:
            if pattern.search(name):
                new, manual = kind_over, True
                break
        cols = int(shp[-1])
        if not manual and not pure:
            if mix.name == "MXFP4_MOE" and not (cat == "output" or (qs.has_tied_embeddings and cat == "token_embd")):
                experts = len(shp) >= 3 and int(shp[-3]) > 1  # ggml's ne[2]: the expert axis
                new = "MXFP4" if experts and (shape.arch != "bailingmoe3" or cat.startswith("ffn_")) else "Q8_0"
            upper = None if output_tensor_type is None else output_tensor_type.upper()
            new = _by_mix(qs, new, name, cols, mix.name, cat, shape, upper)
        out[name] = Choice(_fallback(name, cols, new), new)
    return out
