"""Re-quantizing a GGUF file as llama-quantize does (:func:`quantize_file`), and back (:func:`dequantize_file`).

Which tensors are quantized is llama-quantize's rule (:func:`why_kept`): weights of two or more
dimensions, less the small tensors it keeps, narrowed by the caller's globs
(:class:`~arrayquant.io._select.Selection`); a weight whose rows are not whole blocks of the type
gets llama-quantize's fallback type. Each tensor is read, quantized and written one at a time
(rows independent, a slab of rows at a time where the type allows), through the streaming
writer of :mod:`arrayquant.io.gguf.writer`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...dequantize import dequantize
from ...errors import DTypeError, SchemeError, ShapeError
from ...quantize import quantize
from ...scheme import QuantScheme
from ...tensor import QuantizedTensor
from .. import _dtypes
from .._calibration import search_arguments
from .._select import Selection
from ..summary import DequantizeSummary, QuantizeSummary
from . import types as gguf_types
from .container import NAME, GGUFFile, TensorInfo, open_gguf
from .ggml import block_sizes, file_type, ggml_rank, gguf_py, scale_name, type_nbytes
from .metadata import ARCH_KEY, FTYPE_KEY, QVERSION_KEY
from .reader import read_tensor, scale_pairs, tensor_value
from .writer import ARRAY_TYPES, TensorOut, write_tensor, writing

__all__ = ["PLAIN_TYPES", "dequantize_file", "quantize_file", "quantized_already", "target_type", "why_kept"]

PLAIN_TYPES = frozenset(_dtypes.GGUF)  # the types of arrays (F32, BF16, I8, ...): not quantized
_QNT_VERSION = 2  # GGML_QNT_VERSION, which llama-quantize writes as general.quantization_version
_FLOAT_SOURCES = _dtypes.GGUF_FLOATS  # what quantize_file quantizes from
# Substrings of the 2-d weights llama-quantize leaves unquantized (llama-quant.cpp, as read in 2025):
# MoE routers, Gemma 3n's small altup/laurel/per-layer projections, BERT's position and token-type
# embeddings, Mamba/LFM2 convolutions, RWKV's time-mix weights, T5's relative bias, vision position
# embeddings. Norms are caught by "_norm.weight"; 1-d tensors by their rank.
_KEPT = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "position_embd.weight",
    "token_types.weight",
    "ssm_conv1d.weight",
    "shortconv.conv.weight",
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
    ".position_embd.",
)


def target_type(scheme: QuantScheme | str) -> tuple[QuantScheme, str]:
    """The scheme asked for and the GGUF type it is written as; a GGUF type name wins over a scheme's text.

    >>> target_type("q8_0")[1], target_type("tq1_0")[1], str(target_type("tq1_0")[0])
    ('Q8_0', 'TQ1_0', 'q2s:block256:f16')
    """
    if isinstance(scheme, str) and scheme.strip().upper() == "TQ1_0":  # TQ2_0's scheme, in base-3 packing
        return target_type("TQ2_0")[0], "TQ1_0"
    if isinstance(scheme, str):
        text = scheme.strip()
        if text.upper() in gguf_types.EXACT:
            exact = gguf_types.scheme_of(text.upper())
            if exact is None:
                exact_types = gguf_types.exact_list()
                msg = f"GGUF type {text.upper()} is not available as a scheme; GGUF holds exactly {exact_types}"
                raise SchemeError(msg)
            scheme = exact
        else:
            scheme = QuantScheme.parse(text)
    if not isinstance(scheme, QuantScheme):
        msg = f"scheme must be a QuantScheme or its text, got {type(scheme).__name__}"
        raise SchemeError(msg)
    type_name = gguf_types.type_of(scheme)
    if type_name is None:
        msg = f"scheme {scheme} has no GGUF type; GGUF holds exactly {gguf_types.exact_list()}"
        raise SchemeError(msg)
    return scheme, type_name


def why_kept(t: TensorInfo, type_name: str, selection: Selection) -> str | None:
    """Why llama-quantize's rules (or the caller's ``selection``) leave this tensor as it is, or None to quantize it."""
    if not t.name.endswith("weight"):
        return "not a weight (llama-quantize quantizes tensors whose names end in 'weight')"
    if ggml_rank(t.shape) < 2:
        return "1-d (llama-quantize quantizes 2-d and 3-d weights only)"
    for part in _KEPT:
        if part in t.name:
            return f"llama-quantize keeps '*{part}*' tensors as they are"
    why = selection.why_not(t.name, t.shape, default=False)  # the rule above is the default choice
    if why is not None:
        return why
    if t.type_name == type_name:
        return f"already {type_name}, copied unchanged"
    if t.type_name not in _FLOAT_SOURCES:
        return f"already quantized as {t.type_name}; llama-quantize does not re-quantize by default, copied unchanged"
    if 0 in t.shape:  # nothing to quantize, and a quantized tensor has at least one value per axis
        return f"has no values (shape {list(t.shape)}); kept as {t.type_name}"
    return None


# llama-quantize's tensor_type_fallback (src/llama-quant.cpp) for the types written here: a tensor whose
# rows are not whole blocks gets this type instead, and F16 where that does not fit either
_FALLBACK = {"TQ1_0": "Q4_0", "TQ2_0": "Q4_0"}


def _fallback(t: TensorInfo, type_name: str) -> tuple[str, str]:
    """The type ``t`` is written as (``type_name`` where its rows are whole blocks), or ("", why it is kept)."""
    cols = t.shape[-1]
    block = block_sizes(type_name)[0]
    if cols % block == 0:
        return type_name, ""
    if type_name == "NVFP4":  # llama-quantize stops with "no tensor type fallback is defined"
        return "", f"rows of {cols} values are not whole NVFP4 blocks of 64, and NVFP4 has no fallback type; kept"
    other = _FALLBACK.get(type_name, "F16")
    if other != "F16" and cols % block_sizes(other)[0]:
        other = "F16"
    if other == "F16" and t.type_name not in ("F32", "F16"):  # bf16 / f64 would overflow or lose range in f16
        return "", f"rows of {cols} values are not whole {type_name} blocks of {block}; kept as {t.type_name}"
    return other, ""


_SLAB_BYTES = 2 << 20  # float32 bytes of the rows quantized at a time


def _encoded_rows(f: GGUFFile, t: TensorInfo, scheme: QuantScheme, type_name: str, **search: Any) -> np.ndarray:
    """The GGUF bytes of float tensor ``t`` quantized with a one-level ``scheme``, a slab of rows at a time.

    GGUF's block types block the last axis only, so rows are independent: each slab is read,
    quantized and encoded alone, and only the encoded tensor is ever whole in memory. The bytes
    are those of quantizing and encoding the whole tensor at once (a search calibration, in
    ``search``, looks at one block at a time too).
    """
    cols, rows = t.shape[-1], math.prod(t.shape[:-1])  # quantized tensors have two or more axes
    row_in = t.nbytes // max(rows, 1)
    row_out = type_nbytes(type_name, (1, cols))
    out = np.empty((rows, row_out), np.uint8)
    step = max(1, _SLAB_BYTES // (4 * cols))
    for start in range(0, rows, step):
        n = min(step, rows - start)
        slab = t._replace(shape=(n, cols), start=t.start + start * row_in, nbytes=n * row_in)
        values, _ = tensor_value(f.raw(slab), slab, "numpy", None)
        got, data = gguf_types.encode(quantize(values, scheme, **search), type_name)
        if got != type_name:  # pragma: no cover - type_of and encode agree by construction
            msg = f"tensor {t.name!r}: encoded as {got}, planned as {type_name}"
            raise SchemeError(msg)
        out[start : start + n] = np.asarray(data, np.uint8).reshape(n, row_out)
    return out.reshape(-1)


def _f16_rows(f: GGUFFile, t: TensorInfo) -> np.ndarray:
    """Float tensor ``t`` as F16 bytes, a slab of rows at a time (llama-quantize's last fallback)."""
    cols, rows = t.shape[-1], math.prod(t.shape[:-1])
    row_in = t.nbytes // max(rows, 1)
    out = np.empty((rows, 2 * cols), np.uint8)
    step = max(1, _SLAB_BYTES // (4 * cols))
    for start in range(0, rows, step):
        n = min(step, rows - start)
        slab = t._replace(shape=(n, cols), start=t.start + start * row_in, nbytes=n * row_in)
        values, _ = tensor_value(f.raw(slab), slab, "numpy", None)
        with np.errstate(over="ignore"):
            half = np.asarray(values).astype("<f2")
        if not np.all(np.isfinite(half)):
            msg = (
                f"tensor {t.name!r}: llama-quantize's fallback for rows of {cols} values is F16, and a value "
                "there is beyond F16's range (65504); exclude the tensor with --exclude to keep it as it is"
            )
            raise ShapeError(msg)
        out[start : start + n] = half.view(np.uint8).reshape(n, 2 * cols)
    return out.reshape(-1)


def quantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    scheme: QuantScheme | str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
    calibration: Any = None,
    importance: Mapping[str, Any] | None = None,
) -> QuantizeSummary:
    """Re-quantize a GGUF file into another, as ``llama-quantize`` does, tensor by tensor.

    Every key/value is kept, in order (architecture, tokenizer, chat template, ...); where a
    tensor is quantized, ``general.file_type`` and ``general.quantization_version`` are set as
    llama-quantize sets them. Every tensor keeps its name, order and shape. The weights
    llama-quantize quantizes are quantized: names ending in ``weight``, of 2 or more dimensions
    (not counting GGML's trailing 1s), except norms, MoE routers and the other small tensors it
    keeps (see ``_KEPT``). Like llama-quantize's ``--pure``, every such weight gets the one
    type asked for, ``token_embd`` and ``output`` included (without ``--pure`` llama-quantize
    picks other types, such as Q6_K, for some; those are no arrayquant schemes). Tensors that
    are quantized already are copied unchanged (llama-quantize refuses to re-quantize without
    ``--allow-requantize``), as are weights with no values (an extent of 0, which GGUF allows):
    there is nothing to quantize, and a quantized tensor that :func:`~arrayquant.io.gguf.load` reads back needs at
    least one value per axis. A weight whose rows are not whole blocks of the type gets
    llama-quantize's fallback type (``tensor_type_fallback``): Q4_0 for TQ1_0 / TQ2_0, F16 where
    that does not fit either or for the 32-blocks; NVFP4 has none, so such a weight is kept.

    By default (``calibration=None``) each block is quantized by ggml's reference quantizer,
    ``calibration="ggml"``, so the bytes are llama-quantize's (without an imatrix) bit for bit;
    the two-level ``nvfp4``, which ggml has no quantizer for, uses ``"minmax"``. Any other
    calibration of :func:`arrayquant.quantize` may be named instead.

    The header is written first, then each tensor's data, read, quantized and written one at a
    time: memory stays near a few copies of the largest tensor. The output is a temporary file
    renamed over ``dst`` at the end.

    Parameters
    ----------
    src, dst : path
        The GGUF file to read and the one to write (may be the same).
    scheme : QuantScheme or str
        A scheme with a GGUF type, by arrayquant name or GGUF name (``"q8_0"``, ``"mxfp4"``). A GGUF
        name wins over an arrayquant name spelled the same: ``"nvfp4"`` is GGUF's single-level
        NVFP4 (``e2m1:block16:ue4m3``), since GGUF blocks have no per-tensor scale. The two-level
        nvfp4, ``QuantScheme.nvfp4()`` or its text ``"e2m1:block16:ue4m3:tensor:f32:packed_native"``,
        is written as llama.cpp's converter writes NVFP4 checkpoints: each weight as ``NVFP4``
        blocks followed by its per-tensor scale, the F32 tensor of shape (1,) ``<name>.scale``
        (``.weight`` replaced); a weight whose scale name the file already has is kept as it is.
        ``general.file_type`` is ``MOSTLY_NVFP4`` either way, as llama.cpp sets it.
    include, exclude : sequence of str
        Globs on tensor names narrowing the weights quantized.
    progress : callable, optional
        Called with each tensor's name once it is written (per-tensor scale tensors included).
    calibration : str, optional
        ``"ggml"`` (the default where ggml has a quantizer), or another calibration by name.
    importance : mapping of str to array, optional
        Per-column importance by tensor name, for a search calibration (``"mse"``).

    Returns
    -------
    QuantizeSummary
        ``format="gguf"``, ``stored_as`` the GGUF type written; ``fallback`` the weights written
        in llama-quantize's fallback type instead, with that type; ``left_out`` every other
        tensor of two or more dimensions, with why.

    Raises
    ------
    SchemeError
        A scheme with no GGUF type (the message lists those that have one).
    CorruptDataError
        ``src`` is not a sound GGUF file (see the limits in :mod:`arrayquant.io.gguf.container`).
    OSError
        ``dst`` cannot be written (a full disk, say); the error names it, and it is left as it was.
    """
    scheme_, type_name = target_type(scheme)
    split = type_name == "NVFP4" and scheme_.tensor is not None  # two-level: blocks + F32 '<name>.scale'
    g = gguf_py()
    with open_gguf(src) as f:
        fields = f.fields()
        arch = fields.get(ARCH_KEY)
        summary = QuantizeSummary(NAME, str(scheme_), stored_as=type_name)
        names = {t.name for t in f.tensors}  # with the scale tensors planned so far: a scale may not clash
        # (source tensor, what is written, "quantize" / "copy"; or None, the F32 scale, "scale")
        plan: list[tuple[TensorInfo | None, TensorOut, str]] = []
        selection = Selection(include, exclude)
        for t in f.tensors:
            why = why_kept(t, type_name, selection)
            sname = scale_name(t.name)
            if why is None and split and sname in names:
                why = (
                    f"its nvfp4 per-tensor scale would go in {sname!r} (llama.cpp's '.weight' -> '.scale'), "
                    f"a name the file already has; kept as {t.type_name}"
                )
            kind = type_name
            if why is None:
                kind, why = _fallback(t, type_name)
                why = why or None
            if why is None and kind != type_name:
                summary.fallback[t.name] = kind
                action = "f16" if kind == "F16" else "quantize"
                plan.append((t, TensorOut(t.name, kind, t.shape, type_nbytes(kind, t.shape)), action))
                if kind != "F16":
                    summary.quantized.append(t.name)
            elif why is None:
                plan.append((t, TensorOut(t.name, type_name, t.shape, type_nbytes(type_name, t.shape)), "quantize"))
                summary.quantized.append(t.name)
                if split:
                    plan.append((None, TensorOut(sname, "F32", (1,), 4), "scale"))
                    names.add(sname)
            else:
                plan.append((t, TensorOut(t.name, t.type_name, t.shape, t.nbytes), "copy"))
                if ggml_rank(t.shape) >= 2:
                    summary.left_out[t.name] = why
        ftype = file_type(type_name)
        if summary.quantized and ftype is not None:
            fields[FTYPE_KEY] = g.GGUFValue(ftype, g.GGUFValueType.UINT32)
            fields[QVERSION_KEY] = g.GGUFValue(_QNT_VERSION, g.GGUFValueType.UINT32)
        with writing(Path(dst), arch.value if arch is not None else "", fields, [o for _, o, _ in plan]) as writer:
            glob: np.ndarray | None = None  # the per-tensor scale of the tensor just written, if split
            for src_t, o, action in plan:
                if src_t is None:  # the F32 scale tensor right after its NVFP4 weight
                    if glob is None:  # pragma: no cover - encode_split gives a two-level tensor's scale
                        msg = f"tensor {o.name!r}: no per-tensor scale came with its weight"
                        raise SchemeError(msg)
                    write_tensor(writer, o, np.ascontiguousarray(glob.astype("<f4").reshape(1)).view(np.uint8))
                    glob = None
                    if progress is not None:
                        progress(o.name)
                    continue
                t = src_t
                if action == "f16":
                    write_tensor(writer, o, _f16_rows(f, t))
                elif action == "quantize" and (not split or o.type_name != type_name):  # a slab at a time
                    kind_scheme = scheme_ if o.type_name == type_name else gguf_types.scheme_of(o.type_name)
                    assert kind_scheme is not None
                    cal = "ggml" if calibration is None else calibration
                    found = search_arguments(cal, importance, t.name)
                    write_tensor(writer, o, _encoded_rows(f, t, kind_scheme, o.type_name, **found))
                elif action == "quantize":  # the per-tensor scale needs the whole tensor
                    raw = f.raw(t)
                    values, _ = tensor_value(raw, t, "numpy", None)
                    del raw
                    # f16/bf16 are computed in f32 by quantize, a slab at a time; ggml has no two-level rule
                    cal = "minmax" if calibration is None else calibration
                    qt = quantize(values, scheme_, **search_arguments(cal, importance, t.name))
                    del values
                    # as llama.cpp stores it: blocks as they are, the scale apart
                    got, data, glob = gguf_types.encode_split(qt)
                    del qt
                    if got != type_name:  # pragma: no cover - type_of and encode agree by construction
                        msg = f"tensor {t.name!r}: encoded as {got}, planned as {type_name}"
                        raise SchemeError(msg)
                    write_tensor(writer, o, np.ascontiguousarray(np.asarray(data, np.uint8)))
                else:
                    raw = f.raw(t)
                    write_tensor(writer, o, raw)
                    del raw
                if progress is not None:
                    progress(o.name)
    return summary


def quantized_already(
    src: str | os.PathLike[str], scheme: QuantScheme | str, *, include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> dict[str, str]:
    """The weights :func:`quantize_file` would quantize were they float that ``src`` holds quantized in
    another type than the one ``scheme`` is written as, with that type (read from the header alone).

    llama-quantize refuses these without ``--allow-requantize``; :func:`quantize_file` copies them.
    """
    _, type_name = target_type(scheme)
    selection = Selection(include, exclude)
    with open_gguf(src) as f:
        return {
            t.name: t.type_name
            for t in f.tensors
            if t.type_name not in PLAIN_TYPES
            and t.type_name != type_name
            and why_kept(t._replace(type_name="F32"), type_name, selection) is None
        }


def _float_dtype(dtype: Any) -> np.dtype[Any]:
    """The NumPy dtype of ``dtype`` (float32 for None), one of the float types GGUF holds."""
    if dtype is None:
        return np.dtype(np.float32)
    if isinstance(dtype, str) and dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    out = np.dtype(dtype)
    if ARRAY_TYPES.get(out.name) not in _FLOAT_SOURCES:
        floats = ", ".join(d.name for d in _dtypes.GGUF.values() if d.is_float)
        msg = f"GGUF tensors dequantize to {floats}, not {out.name}"
        raise DTypeError(msg)
    return out


def dequantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    dtype: Any = None,
    names: Collection[str] | None = None,
) -> DequantizeSummary:
    """Write the GGUF file ``src`` to ``dst`` with its quantized tensors back to floats, one at a time.

    The quantized tensors named in ``names`` (all of them with None) become ``dtype`` (default
    float32), K-quants and the other types that are no arrayquant scheme included (through
    gguf-py's values); an NVFP4 weight's per-tensor scale tensor goes into its weight and is not
    written. Every other tensor and every key/value is kept as stored, but for
    ``general.file_type``, set to the float type where a tensor was dequantized. The output is a
    temporary file renamed over ``dst`` at the end.

    Parameters
    ----------
    src, dst : path
        The GGUF file to read and the one to write.
    dtype : numpy dtype or its name, optional
        ``float32`` (the default), ``float16``, ``bfloat16`` or ``float64``.
    names : collection of str, optional
        The tensors to dequantize; None for every quantized one.

    Returns
    -------
    DequantizeSummary
        ``dequantized`` and ``copied`` in file order; ``dropped`` the per-tensor scale tensors
        applied to their dequantized NVFP4 weight.

    Raises
    ------
    DTypeError
        A ``dtype`` GGUF holds no floats of.
    CorruptDataError, SchemeError
        As :func:`~arrayquant.io.gguf.iter_tensors`.
    OSError
        ``dst`` cannot be written; the error names it, and it is left as it was.
    """
    out_dtype = _float_dtype(dtype)
    g = gguf_py()
    type_name = ARRAY_TYPES[out_dtype.name]
    summary = DequantizeSummary(NAME, out_dtype.name)
    with open_gguf(src) as f:
        fields = f.fields()
        pairs = scale_pairs(f)
        weight_of = {scale: weight for weight, (scale, _) in pairs.scales.items()}
        floats = {t.name for t in f.tensors if t.type_name not in PLAIN_TYPES and (names is None or t.name in names)}
        plan = []
        for t in f.tensors:
            if t.name in floats:
                plan.append((t, TensorOut(t.name, type_name, t.shape, math.prod(t.shape) * out_dtype.itemsize)))
                summary.dequantized.append(t.name)
            elif weight_of.get(t.name) not in floats:  # an NVFP4 scale goes into its dequantized weight
                plan.append((t, TensorOut(t.name, t.type_name, t.shape, t.nbytes)))
                summary.copied.append(t.name)
            else:
                summary.dropped.append(t.name)
        if floats and FTYPE_KEY in fields:
            fields[FTYPE_KEY] = g.GGUFValue(file_type(type_name), g.GGUFValueType.UINT32)
        arch = fields.get(ARCH_KEY)
        with writing(Path(dst), arch.value if arch is not None else "", fields, [o for _, o in plan]) as w:
            for t, o in plan:
                if t.name in floats:
                    value, _ = read_tensor(f, t, pairs, "numpy", None)
                    if isinstance(value, QuantizedTensor):
                        value = dequantize(value, out_dtype)
                    data = np.ascontiguousarray(np.asarray(value).astype(out_dtype, copy=False))  # little-endian
                    del value
                else:
                    data = f.raw(t)
                write_tensor(w, o, data.reshape(-1).view(np.uint8))
                del data
    return summary
