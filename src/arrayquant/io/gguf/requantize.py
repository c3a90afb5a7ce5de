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
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...dequantize import dequantize
from ...errors import DTypeError, SchemeError, ShapeError
from ...fused import ggml_kquants
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
from .mixes import MIXES, Choice, Mix, allows_quantization, mix_of, model_shape, tensor_types
from .reader import read_tensor, scale_pairs, tensor_value
from .writer import ARRAY_TYPES, TensorOut, write_tensor, writing

__all__ = ["PLAIN_TYPES", "dequantize_file", "quantize_file", "quantized_already", "target_type", "why_kept"]

PLAIN_TYPES = frozenset(_dtypes.GGUF)  # the types of arrays (F32, BF16, I8, ...): not quantized
_QNT_VERSION = 2  # GGML_QNT_VERSION, which llama-quantize writes as general.quantization_version
_FLOAT_SOURCES = _dtypes.GGUF_FLOATS  # what quantize_file quantizes from


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
    kept = allows_quantization(t.name, t.shape)
    if kept is not None:
        return kept
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
_FALLBACK = {
    "TQ1_0": "Q4_0",
    "TQ2_0": "Q4_0",
    "Q2_K": "Q4_0",
    "Q3_K": "Q4_0",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
    "IQ4_XS": "IQ4_NL",
}


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


def _ggml_bytes(type_name: str, search: dict[str, Any]) -> bool:
    """Whether ggml's own kernels write the type's bytes here (the K-quants, IQ4, and imatrix searches)."""
    cal = search.get("calibration")
    ggml = isinstance(cal, str) and cal.strip().lower() == "ggml"
    return (
        ggml
        and (type_name in ggml_kquants.TYPES)
        and (type_name not in ggml_kquants.IMATRIX_ONLY or "importance" in search)
    )


def _encoded_rows(f: GGUFFile, t: TensorInfo, scheme: QuantScheme, type_name: str, **search: Any) -> np.ndarray:
    """The GGUF bytes of float tensor ``t`` quantized with a one-level ``scheme``, a slab of rows at a time.

    GGUF's block types block the last axis only, so rows are independent: each slab is read,
    quantized and encoded alone, and only the encoded tensor is ever whole in memory. The bytes
    are those of quantizing and encoding the whole tensor at once (a search calibration, in
    ``search``, looks at one block at a time too). Under ggml's calibration the K-quants, IQ4
    and the imatrix searches write ggml's bytes directly (no codes and scales in between).
    """
    cols, rows = t.shape[-1], math.prod(t.shape[:-1])  # quantized tensors have two or more axes
    row_in = t.nbytes // max(rows, 1)
    row_out = type_nbytes(type_name, (1, cols))
    out = np.empty((rows, row_out), np.uint8)
    step = max(1, _SLAB_BYTES // (4 * cols))
    direct = _ggml_bytes(type_name, search)
    for start in range(0, rows, step):
        n = min(step, rows - start)
        slab = t._replace(shape=(n, cols), start=t.start + start * row_in, nbytes=n * row_in)
        values, _ = tensor_value(f.raw(slab), slab, "numpy", None)
        if direct:
            imatrix = search.get("importance")
            out[start : start + n] = ggml_kquants.quantize_host_bytes(values, type_name, imatrix)
            continue
        got, data = gguf_types.encode(quantize(values, scheme, **search), type_name)
        if got != type_name:  # pragma: no cover - type_of and encode agree by construction
            msg = f"tensor {t.name!r}: encoded as {got}, planned as {type_name}"
            raise SchemeError(msg)
        out[start : start + n] = np.asarray(data, np.uint8).reshape(n, row_out)
    return out.reshape(-1)


def _float_rows(f: GGUFFile, t: TensorInfo, kind: str = "F16") -> np.ndarray:
    """Float tensor ``t`` as F32, F16 or BF16 bytes, a slab of rows at a time (llama-quantize's last
    fallback is F16; ``--tensor-type`` may name any of the three)."""
    cols, rows = t.shape[-1], math.prod(t.shape[:-1])
    row_in = t.nbytes // max(rows, 1)
    width = 4 if kind == "F32" else 2
    out = np.empty((rows, width * cols), np.uint8)
    step = max(1, _SLAB_BYTES // (4 * cols))
    for start in range(0, rows, step):
        n = min(step, rows - start)
        slab = t._replace(shape=(n, cols), start=t.start + start * row_in, nbytes=n * row_in)
        values, _ = tensor_value(f.raw(slab), slab, "numpy", None)
        with np.errstate(over="ignore"):
            f32 = np.asarray(values, np.float32)
            if kind == "BF16":  # ml_dtypes rounds to nearest even, as ggml_fp32_to_bf16 does
                import ml_dtypes

                floats = f32.astype(ml_dtypes.bfloat16)
            else:
                floats = f32.astype(np.float32 if kind == "F32" else np.float16)
        if not np.all(np.isfinite(floats.astype(np.float32))):
            msg = (
                f"tensor {t.name!r}: written as {kind} (llama-quantize's fallback for rows of {cols} values, or "
                f"the type asked for), a value there is beyond {kind}'s range; exclude the tensor with --exclude "
                "to keep it as it is"
            )
            raise ShapeError(msg)
        out[start : start + n] = (
            np.ascontiguousarray(floats).view(np.uint8).reshape(n, width * cols)
        )  # little-endian host
    return out.reshape(-1)


def _quantized_rows(
    f: GGUFFile,
    t: TensorInfo,
    kind: str,
    calibration: Any,
    importance: Mapping[str, Any] | None,
    scheme: QuantScheme | None = None,
) -> np.ndarray:
    """Float tensor ``t`` quantized as the GGUF type ``kind`` (with ``scheme``, a one-level scheme stored as
    ``kind``, or the type's own scheme), a slab at a time."""
    kind_scheme = gguf_types.scheme_of(kind) if scheme is None else scheme
    assert kind_scheme is not None  # the plan holds types that are schemes
    cal = "ggml" if calibration is None else calibration
    found = search_arguments(cal, importance, t.name)
    if cal == "ggml" and kind not in ggml_kquants.TYPES:
        found.pop("importance", None)  # ggml's quantizer for the type takes none (Q8_0, MXFP4, ...)
    return _encoded_rows(f, t, kind_scheme, kind, **found)


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
    pure: bool = False,
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
    tensor_types: Sequence[tuple[str, str]] = (),
) -> QuantizeSummary:
    """Re-quantize a GGUF file into another, as ``llama-quantize`` does, tensor by tensor.

    ``scheme`` a llama-quantize file type (``"Q4_K_M"``, ``"Q6_K"``, ``"Q4_0"``, ...: one of
    :data:`arrayquant.io.gguf.mixes.MIXES`, with its aliases ``"q4_k"`` and so on) picks each
    tensor's type as llama-quantize does (:func:`arrayquant.io.gguf.mixes.tensor_types`): the
    output tensor Q6_K, ``attn_v`` and ``ffn_down`` bumped in some layers, ... ; ``pure=True``
    gives every quantized weight the file type's default type instead, as ``--pure`` does, and
    ``output_tensor_type``, ``token_embedding_type`` and ``tensor_types`` (``(pattern, type)``
    pairs, the first whose regular expression is found in a name deciding) are llama-quantize's
    options of those names. ``summary.types`` then holds each written tensor's type. Any other
    scheme (an arrayquant scheme, or a GGUF type that is no file type, such as ``"mxfp4"``) gives
    every weight that one type, as described below.

    Every key/value is kept, in order (architecture, tokenizer, chat template, ...); where a
    tensor is quantized, ``general.file_type`` and ``general.quantization_version`` are set as
    llama-quantize sets them. Every tensor keeps its name, order and shape. The weights
    llama-quantize quantizes are quantized: names ending in ``weight``, of 2 or more dimensions
    (not counting GGML's trailing 1s), except norms, MoE routers and the other small tensors it
    keeps (:func:`arrayquant.io.gguf.mixes.allows_quantization`). With a scheme that is no
    llama-quantize file type, every such weight gets the one type asked for, ``token_embd`` and
    ``output`` included, as ``llama-quantize --pure`` would. Tensors that
    are quantized already are copied unchanged (llama-quantize refuses to re-quantize without
    ``--allow-requantize``), as are weights with no values (an extent of 0, which GGUF allows):
    there is nothing to quantize, and a quantized tensor that :func:`~arrayquant.io.gguf.load` reads back needs at
    least one value per axis. A weight whose rows are not whole blocks of the type gets
    llama-quantize's fallback type (``tensor_type_fallback``): Q4_0 for TQ1_0 / TQ2_0, Q5_0 for
    Q4_K, ..., F16 where that does not fit either or for the 32-blocks; NVFP4 has none, so such
    a weight is kept.

    By default (``calibration=None``) each block is quantized by ggml's own quantizer,
    ``calibration="ggml"`` (with ``importance`` its imatrix searches), so the bytes are
    llama-quantize's bit for bit;
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
        Per-column importance by tensor name: llama.cpp's imatrix vectors under ``"ggml"`` (as
        ``llama-quantize --imatrix``), or the weights of a search calibration (``"mse"``).
    pure, output_tensor_type, token_embedding_type, tensor_types : optional
        llama-quantize's options, with a file type as ``scheme`` (see above).

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
    mix = mix_of(scheme) if isinstance(scheme, str) else None
    if mix is not None:
        options = _MixOptions(pure, output_tensor_type, token_embedding_type, tuple(tensor_types))
        return _quantize_mix(src, dst, mix, options, Selection(include, exclude), progress, calibration, importance)
    if output_tensor_type is not None or token_embedding_type is not None or tensor_types:
        msg = (
            "the output tensor type, the token embedding type and tensor types choose among llama-quantize's "
            f"types: name one of its file types as the scheme ({', '.join(MIXES)}), not {scheme}"
        )
        raise SchemeError(msg)
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
                    write_tensor(writer, o, _float_rows(f, t))
                elif action == "quantize" and (not split or o.type_name != type_name):  # a slab at a time
                    kind_scheme = scheme_ if o.type_name == type_name else None  # else a fallback type's own
                    write_tensor(writer, o, _quantized_rows(f, t, o.type_name, calibration, importance, kind_scheme))
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


class _MixOptions(NamedTuple):
    """llama-quantize's options of a mixed run."""

    pure: bool
    output_tensor_type: str | None
    token_embedding_type: str | None
    tensor_types: tuple[tuple[str, str], ...]


_FLOAT_TARGETS = ("F32", "F16", "BF16")


def _check_named_type(kind: str, what: str) -> str:
    """A type an option names: a GGUF type arrayquant writes, or a float type."""
    name = str(kind).strip().upper()
    if name in _FLOAT_TARGETS or name in gguf_types.EXACT:
        return name
    msg = f"{what} {kind!r} is no GGUF type arrayquant writes: {', '.join((*gguf_types.EXACT, *_FLOAT_TARGETS))}"
    raise SchemeError(msg)


def _pick(
    f: GGUFFile, mix: Mix, options: _MixOptions, tensors: list[tuple[str, tuple[int, ...], str]], *, imatrix: bool
) -> dict[str, Choice]:
    """:func:`~arrayquant.io.gguf.mixes.tensor_types` of ``tensors`` with the file's model shape."""
    fields = {k: v.value for k, v in f.fields().items()}
    return tensor_types(
        mix,
        tensors,
        model_shape(fields),
        imatrix=imatrix,
        pure=options.pure,
        output_tensor_type=options.output_tensor_type,
        token_embedding_type=options.token_embedding_type,
        overrides=options.tensor_types,
    )


def _mix_plan(
    f: GGUFFile, mix: Mix, options: _MixOptions, selection: Selection, importance: Mapping[str, Any] | None
) -> tuple[QuantizeSummary, list[tuple[TensorInfo, TensorOut, str]]]:
    """Each tensor's type under ``mix`` and what is done with it: quantize, float, or copy (with why)."""
    overrides = []
    for pattern, kind in options.tensor_types:
        try:
            re.compile(pattern.lower())
        except re.error as exc:
            msg = f"tensor type pattern {pattern!r} is no regular expression ({exc})"
            raise SchemeError(msg) from None
        overrides.append((pattern, _check_named_type(kind, f"tensor type for {pattern!r}")))
    out_type = (
        None
        if options.output_tensor_type is None
        else _check_named_type(options.output_tensor_type, "output tensor type")
    )
    embd_type = (
        None
        if options.token_embedding_type is None
        else _check_named_type(options.token_embedding_type, "token embedding type")
    )
    tensors = [(t.name, tuple(t.shape), t.type_name) for t in f.tensors]
    choices = _pick(
        f,
        mix,
        options._replace(output_tensor_type=out_type, token_embedding_type=embd_type, tensor_types=tuple(overrides)),
        tensors,
        imatrix=importance is not None,
    )
    # a pure run writes one type (and its fallbacks): reported as a run of that type
    summary = QuantizeSummary(NAME, mix.name, stored_as=mix.default if options.pure else mix.name)
    plan: list[tuple[TensorInfo, TensorOut, str]] = []
    for t in f.tensors:
        kind, wanted = choices[t.name]
        if kind == t.type_name and wanted != kind and kind in _FLOAT_TARGETS:  # a fallback to the type it has
            plan.append((t, TensorOut(t.name, kind, t.shape, t.nbytes), "copy"))
            summary.fallback[t.name] = kind
            if not options.pure:
                summary.types[t.name] = kind
            continue
        why = allows_quantization(t.name, t.shape) if kind == t.type_name else None
        if why is None:
            why = selection.why_not(t.name, t.shape, default=False)
        if why is None and kind == t.type_name:
            why = f"already {kind}, copied unchanged"
        if why is None and t.type_name not in _FLOAT_SOURCES:
            why = (
                f"already quantized as {t.type_name}; llama-quantize does not re-quantize by default, copied unchanged"
            )
        if why is None and 0 in t.shape:
            why = f"has no values (shape {list(t.shape)}); kept as {t.type_name}"
        if why is None and kind == "F16" and wanted != kind and t.type_name not in ("F32", "F16"):
            why = f"rows of {t.shape[-1]} values are not whole {wanted} blocks; kept as {t.type_name}"
        if why is None and kind not in _FLOAT_TARGETS and kind not in gguf_types.EXACT:
            why = f"llama-quantize picks {kind}, which arrayquant does not write; kept as {t.type_name}"
        if why is not None:
            plan.append((t, TensorOut(t.name, t.type_name, t.shape, t.nbytes), "copy"))
            if ggml_rank(t.shape) >= 2:
                summary.left_out[t.name] = why
            continue
        action = "float" if kind in _FLOAT_TARGETS else "quantize"
        nbytes = math.prod(t.shape) * (4 if kind == "F32" else 2) if action == "float" else type_nbytes(kind, t.shape)
        plan.append((t, TensorOut(t.name, kind, t.shape, nbytes), action))
        if not options.pure:
            summary.types[t.name] = kind
        if action == "quantize":
            summary.quantized.append(t.name)
        if wanted != kind:
            summary.fallback[t.name] = kind
        needs = mix.name == "Q2_K_S" and kind == "Q2_K" and t.name not in ("token_embd.weight", "output.weight")
        if needs and (importance is None or t.name not in importance):
            msg = (
                f"llama-quantize's Q2_K_S needs an importance matrix for its Q2_K tensors, and {t.name!r} has none; "
                "give --importance imatrix.gguf (llama-imatrix's file), or pick Q2_K"
            )
            raise SchemeError(msg)
    return summary, plan


def _quantize_mix(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    mix: Mix,
    options: _MixOptions,
    selection: Selection,
    progress: Callable[[str], None] | None,
    calibration: Any,
    importance: Mapping[str, Any] | None,
) -> QuantizeSummary:
    """:func:`quantize_file` under a llama-quantize file type: each tensor in its own type."""
    g = gguf_py()
    with open_gguf(src) as f:
        summary, plan = _mix_plan(f, mix, options, selection, importance)
        fields = f.fields()
        arch = fields.get(ARCH_KEY)
        if summary.quantized:  # as the single-type path: a file nothing was quantized in keeps its own
            fields[FTYPE_KEY] = g.GGUFValue(mix.ftype, g.GGUFValueType.UINT32)
            fields[QVERSION_KEY] = g.GGUFValue(_QNT_VERSION, g.GGUFValueType.UINT32)
        with writing(Path(dst), arch.value if arch is not None else "", fields, [o for _, o, _ in plan]) as writer:
            for t, o, action in plan:
                if action == "float":
                    write_tensor(writer, o, _float_rows(f, t, o.type_name))
                elif action == "quantize":
                    write_tensor(writer, o, _quantized_rows(f, t, o.type_name, calibration, importance))
                else:
                    write_tensor(writer, o, f.raw(t))
                if progress is not None:
                    progress(o.name)
    return summary


def quantized_already(
    src: str | os.PathLike[str],
    scheme: QuantScheme | str,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    pure: bool = False,
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
    tensor_types: Sequence[tuple[str, str]] = (),
) -> dict[str, str]:
    """The weights :func:`quantize_file` would quantize were they float that ``src`` holds quantized in
    another type than the one ``scheme`` (and llama-quantize's options, as :func:`quantize_file` takes
    them) gives them, with that type (read from the header alone).

    llama-quantize refuses these without ``--allow-requantize``; :func:`quantize_file` copies them.
    """
    selection = Selection(include, exclude)
    mix = mix_of(scheme) if isinstance(scheme, str) else None
    if mix is not None:  # the type the mix picks for each tensor, were they all float
        options = _MixOptions(pure, output_tensor_type, token_embedding_type, tuple(tensor_types))
        with open_gguf(src) as f:
            floats = [(t.name, tuple(t.shape), "F32") for t in f.tensors]
            picked = _pick(f, mix, options, floats, imatrix=False)
            return {
                t.name: t.type_name
                for t in f.tensors
                if t.type_name not in PLAIN_TYPES
                and picked[t.name].type not in (t.type_name, "F32")
                and selection.why_not(t.name, t.shape, default=False) is None
            }
    _, type_name = target_type(scheme)
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
