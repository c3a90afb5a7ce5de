"""GGUF block types that are arrayquant schemes, bit for bit: GGUF bytes <-> QuantizedTensor.

Each GGUF (ggml) quantized type stores a tensor row by row as blocks along the last axis. These
are an arrayquant scheme plus a permutation of where codes sit in the block:

=========  ===========  =================================  =========================================
GGUF type  bytes/block  arrayquant scheme                  block layout (ggml-common.h, quants.py)
=========  ===========  =================================  =========================================
``Q8_0``   34 per 32    ``q8f:block32:f16``                f16 ``d``, 32 int8 ``q``; ``x = q * d``
``Q4_0``   18 per 32    ``q4f:block32:f16``                f16 ``d``, 16 bytes: element ``j`` in the
                                                           low nibble of byte ``j``, ``j + 16`` in the
                                                           high one; ``x = (q - 8) * d``
``Q4_1``   20 per 32    ``u4:block32:f16:offset``          f16 ``d``, f16 ``m``, 16 bytes (nibbles as
                                                           Q4_0); ``x = q * d + m``
``Q5_0``   22 per 32    ``q5f:block32:f16``                f16 ``d``, uint32 ``qh`` (bit ``j``: bit 4
                                                           of element ``j``), 16 bytes of the low 4
                                                           bits (nibbles as Q4_0); ``x = (q - 16) * d``
``Q5_1``   24 per 32    ``u5:block32:f16:offset``          f16 ``d``, f16 ``m``, ``qh`` and 16 bytes as
                                                           Q5_0; ``x = q * d + m``
``TQ2_0``  66 per 256   ``q2s:block256:f16``               64 bytes, then f16 ``d``: element
                                                           ``128 c + 32 s + j`` in bits ``2s`` of byte
                                                           ``32 c + j``; ``x = (q - 1) * d``
``TQ1_0``  54 per 256   ``q2s:block256:f16``               48 + 4 bytes of base-3 digits (five, or
                                                           four, trits a byte), then f16 ``d``
``MXFP4``  17 per 32    ``mxfp4``                          E8M0 ``e``, 16 bytes (nibbles as Q4_0);
                                                           ``x = kvalues[q] * 2^(e - 128)``
``NVFP4``  36 per 64    ``e2m1:block16:ue4m3``             four UE4M3 ``d`` (one per 16), 32 bytes:
                        ``:packed_native``                 sub-block ``s`` in bytes ``8s .. 8s + 7``,
                                                           element ``j`` low, ``j + 8`` high;
                                                           ``x = kvalues[q] * ue4m3(d) / 2``
=========  ===========  =================================  =========================================

``kvalues = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)`` is E2M1 doubled (the index
is E2M1's code: sign in bit 3), and both FP4 types halve their scale to match, so the value is
``E2M1(q) * scale`` exactly as arrayquant's ``eff * decode(code)`` in f32.

Symmetric integer blocks keep the sign of their f16 ``d``: llama.cpp writes Q4_0 with
``d = max / -8`` (Q5_0 with ``max / -16``), so every block whose largest-magnitude element is
positive has ``d < 0`` (about half of them), and an all-zero block ``d = -0.0``. Those scales are
stored as they are (arrayquant allows negative scales under symmetric integer codes with
F32/F16/BF16 scales), so ``code * d`` is ggml's value bit for bit, ``-0.0`` included, and every
real Q4_0 / Q5_0 / Q8_0 file reads as a tensor. In arrayquant's code ``c = q - 8`` (``q - 16``).

Q4_1 and Q5_1 are arrayquant's offset mode: the unsigned code ``q`` is arrayquant's code, ``d`` its
scale and ``m`` its offset (``QuantizedTensor.offset``), both f16 values held as f32; ``d * q``
rounded to f32, then ``+ m``, is ``dequantize_row_q4_1`` / ``_q5_1`` and gguf-py's value.

Where the bytes are not an arrayquant tensor (:func:`decode` says which block and why):

- TQ2_0's 2-bit field 3 means ``+2 * d``, outside q2s; llama.cpp never writes it.
- A Q4_1 / Q5_1 ``d < 0`` (arrayquant's offset-mode scales are ``>= 0``; ggml writes
  ``d = (max - min) / 15`` or ``/ 31``, never negative), or a non-finite ``m``.
- A non-finite f16 ``d``; an MXFP4 ``e = 255`` (ggml reads ``2^127``, OCP MX and arrayquant NaN);
  an NVFP4 scale byte ``0xFF`` (ggml ignores bit 7 and reads exponent 15, mantissa 7: 480 > 448).
- GGUF's FP4 table has no ``-0``: nibble 8 is ``+0``. :func:`decode` reads it as code 0;
  :func:`encode` writes arrayquant's code 8 (``-0.0``) as nibble 8, which GGUF reads as ``+0.0``:
  the one difference of an encoded MXFP4 / NVFP4 tensor is the sign of zero.

Other byte patterns are canonicalized without changing a value: NVFP4 scale bytes ``0x7F`` (ggml
reads 0) and ``0x80 .. 0xFE`` (bit 7 ignored), TQ1_0 bytes above the canonical base-3 encoding.

NVFP4's per-tensor scale. A GGUF NVFP4 block has no per-tensor level; llama.cpp's converter
(``conversion/base.py`` ``_repack_nvfp4``) copies ModelOpt's E4M3 block scales (sign bit cleared)
and writes ``weight_scale_2`` as a separate F32 tensor ``<name>.scale`` that the graph multiplies in
(``ggml_mul``). :func:`encode_split` gives that pair; :func:`encode` folds the per-tensor scale ``g``
into the block scales where every ``s * g`` is a UE4M3 value (then ``f32(g * s) * v`` is the same
f32 number), and refuses otherwise; :func:`decode` takes ``global_scale`` to rebuild the
two-level tensor from the pair.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ...backends import default, shim
from ...errors import CorruptDataError, ParamsError, SchemeError, ShapeError
from ...fused import ggml_blocks
from ...invariants import check_shape
from ...kernels.roundup import round_up_scales
from ...scheme import QuantScheme, ScaleDtype
from ...scheme.store import QuantStore
from ...storage import pack
from ...tensor import QuantizedTensor
from ..burn.bytes import decode_scales, encode_scales, to_bytes

__all__ = [
    "EXACT",
    "NOT_EXACT",
    "decode",
    "encode",
    "encode_split",
    "exact_list",
    "fold_scales",
    "scheme_of",
    "type_of",
]

EXACT: tuple[str, ...] = (
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "TQ2_0",
    "TQ1_0",
    "MXFP4",
    "NVFP4",
    *ggml_blocks.KTYPES,
)

_SCHEME_TEXT = {
    "Q8_0": "q8f:block32:f16",
    "Q4_0": "q4f:block32:f16",
    "Q4_1": "u4:block32:f16:offset",
    "Q5_0": "q5f:block32:f16",
    "Q5_1": "u5:block32:f16:offset",
    "TQ2_0": "q2s:block256:f16",
    "TQ1_0": "q2s:block256:f16",
    "MXFP4": "mxfp4",
    "NVFP4": "e2m1:block16:ue4m3:packed_native",
    **ggml_blocks.SCHEMES,
}
# (elements per block, bytes per block), as gguf-py's GGML_QUANT_SIZES
_SIZES = {
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "TQ2_0": (256, 66),
    "TQ1_0": (256, 54),
    "MXFP4": (32, 17),
    "NVFP4": (64, 36),
    **ggml_blocks.KTYPES,
}

NOT_EXACT: dict[str, str] = {
    "F32": "plain float32: passes through as an array",
    "F16": "plain float16: passes through as an array",
    "BF16": "plain bfloat16: passes through as an array",
    "F64": "plain float64: passes through as an array",
    "Q8_1": "llama.cpp's activation type for dot products (d and a precomputed sum), not a file type",
    "Q8_K": "llama.cpp's activation type for K-quant dot products, not a file type",
    "Q1_0": "1-bit codes per 128 with an f16 scale; arrayquant has no 1-bit value kind",
}
for _iq in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"):
    NOT_EXACT[_iq] = "vector codebook (lattice grid of 4 or 8 values per index), not element-wise codes"
for _int in ("I8", "I16", "I32", "I64"):
    NOT_EXACT[_int] = "plain integers: pass through as an array"

_KNOWN = ", ".join(EXACT)
_WRITTEN = tuple(t for t in EXACT if t != "TQ1_0")  # the type each scheme is written as (TQ1_0 on request)
# the blocks of 32 with 4- or 5-bit codes (ggml-common.h): (has an f16 m after d, has a uint32 qh)
_AFFINE = {"Q4_1": (True, False), "Q5_0": (False, True), "Q5_1": (True, True)}


def scheme_of(type_name: str) -> QuantScheme | None:
    """The arrayquant scheme a GGUF type is exactly (where its bytes allow), or None.

    Parameters
    ----------
    type_name : str
        A GGUF type name as ``gguf.GGMLQuantizationType`` spells it (``"Q8_0"``), any case.

    Returns
    -------
    QuantScheme or None
        ``TQ1_0`` and ``TQ2_0`` both give ``q2s:block256:f16``; see the module table.

    Examples
    --------
    >>> scheme_of("Q8_0").spelled_out()
    'q8f:block32:f16'
    >>> scheme_of("iq2_xxs") is None
    True
    """
    text = _SCHEME_TEXT.get(str(type_name).upper())
    return None if text is None else QuantScheme.parse(text)


def exact_list() -> str:
    """The exact types with their schemes, for messages.

    >>> exact_list().split(", ")[0]
    'Q8_0 (q8f:block32:f16)'
    """
    rows = []
    for name in EXACT:
        scheme = scheme_of(name)
        rows.append(f"{name} ({scheme})" if scheme is not None else name)
    return ", ".join(rows)


def _plain(scheme: QuantScheme) -> QuantScheme:
    # the store only says how arrayquant packs codes and the rule how scales were chosen:
    # neither changes a stored value, so any of them maps
    return dataclasses.replace(scheme, store=QuantStore.native(), scale_rule="round_up")


def type_of(scheme: QuantScheme) -> str | None:
    """The GGUF type name that holds ``scheme`` exactly, or None.

    Any store and scale rule map. The two-level ``nvfp4`` gives ``"NVFP4"``: its per-tensor scale
    goes in a separate F32 tensor (:func:`encode_split`) or is folded where exact (:func:`encode`).
    ``q2s:block256:f16`` gives ``"TQ2_0"`` (``TQ1_0`` on request to :func:`encode`).

    Examples
    --------
    >>> type_of(QuantScheme.parse("q8f:block32:f16:native"))
    'Q8_0'
    >>> type_of(QuantScheme.nvfp4()), type_of(QuantScheme.parse("q8s")) is None
    ('NVFP4', True)
    """
    if not isinstance(scheme, QuantScheme):
        return None
    plain = _plain(scheme)
    two_level = plain.tensor is ScaleDtype.F32 and plain.block is not None
    if two_level and dataclasses.replace(plain, tensor=None) == _plain(QuantScheme.parse(_SCHEME_TEXT["NVFP4"])):
        return "NVFP4"
    for name in _WRITTEN:
        if plain == _plain(QuantScheme.parse(_SCHEME_TEXT[name])):
            return name
    return None


def _refuse(scheme: Any) -> SchemeError:
    names = "; ".join(f"{_SCHEME_TEXT[t]} -> {t}" for t in _WRITTEN)
    return SchemeError(
        f"scheme {scheme} has no GGUF block type; the schemes that map (any store) are: {names}; "
        "and nvfp4 (two-level) -> NVFP4 with its per-tensor scale as a separate F32 tensor"
    )


# -- block layouts: codes (n_blocks, block) <-> bytes (n_blocks, type_size) ---------------------
_TQ2_SHIFT = np.array([0, 2, 4, 6], dtype=np.uint8)
_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _split_nibbles(b: np.ndarray) -> np.ndarray:
    """(..., k) bytes -> (..., 2k) nibbles: byte ``j``'s low nibble is ``j``, its high ``j + k``."""
    return np.concatenate([b & 0x0F, b >> 4], axis=-1)


def _join_nibbles(q: np.ndarray) -> np.ndarray:
    half = q.shape[-1] // 2
    return (q[..., :half] & 0x0F) | ((q[..., half:] & 0x0F) << 4)


def _f16_bits(raw: np.ndarray) -> np.ndarray:
    """(n, 2) little-endian bytes -> (n,) float16."""
    return np.ascontiguousarray(raw).view("<f2").reshape(-1)


def _trits(b: np.ndarray, count: int) -> np.ndarray:
    """Base-3 digits of TQ1_0 bytes, most significant first: (..., k) -> (..., count, k)."""
    shifted = b[..., None, :] * _POW3[:count, None]  # uint8: wraps mod 256, as ggml's uint8_t product
    return ((shifted.astype(np.uint16) * 3) >> 8).astype(np.uint8)


def _tq1_digits(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    qs0 = _trits(blocks[:, :32], 5).reshape(n, 160)
    qs1 = _trits(blocks[:, 32:48], 5).reshape(n, 80)
    qh = _trits(blocks[:, 48:52], 4).reshape(n, 16)
    return np.concatenate([qs0, qs1, qh], axis=-1)


def _tq1_bytes(digits: np.ndarray) -> np.ndarray:
    """Digits 0..2 (n, 256) -> the 52 bytes llama.cpp's quantize_row_tq1_0_ref writes."""
    n = digits.shape[0]
    weights = np.array([81, 27, 9, 3, 1], dtype=np.uint16)

    def group(d: np.ndarray, k: int, width: int) -> np.ndarray:
        v = (d.reshape(n, k, width).astype(np.uint16) * weights[:k, None]).sum(axis=1)
        return ((v * 256 + 242) // 243).astype(np.uint8)  # ceil(v * 256 / 243): the top digit leads

    return np.concatenate(
        [group(digits[:, :160], 5, 32), group(digits[:, 160:240], 5, 16), group(digits[:, 240:], 4, 4)], axis=-1
    )


def _affine_codes(kind: str, blocks: np.ndarray) -> np.ndarray:
    """Q4_1 / Q5_0 / Q5_1: the stored codes ``q`` (n, 32), 0..15 or 0..31.

    ``qs`` (the last 16 bytes) holds bits 0-3, element ``j`` in the low nibble of ``qs[j]`` and
    ``j + 16`` in its high one; ``qh`` (4 bytes, a little-endian uint32) bit 4 of element ``j``
    in its bit ``j``, which is bit ``j % 8`` of byte ``j // 8``.
    """
    has_m, has_qh = _AFFINE[kind]
    q = _split_nibbles(blocks[:, -16:])
    if has_qh:
        at = 4 if has_m else 2
        q = q | (np.unpackbits(blocks[:, at : at + 4], axis=-1, bitorder="little") << 4)
    return q


def _unpack_blocks(kind: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Raw GGUF codes (n, block) and scale bytes (n, scales per block, bytes per scale)."""
    n = blocks.shape[0]
    if kind in _AFFINE:
        return _affine_codes(kind, blocks).astype(np.int16), blocks[:, None, :2]
    if kind == "Q8_0":
        return blocks[:, 2:].view(np.int8).astype(np.int16), blocks[:, None, :2]
    if kind == "Q4_0":
        return _split_nibbles(blocks[:, 2:]).astype(np.int16), blocks[:, None, :2]
    if kind == "TQ2_0":
        fields = (blocks[:, :64].reshape(n, 2, 1, 32) >> _TQ2_SHIFT[:, None]) & 0x03
        return fields.reshape(n, 256).astype(np.int16), blocks[:, None, 64:66]
    if kind == "TQ1_0":
        return _tq1_digits(blocks).astype(np.int16), blocks[:, None, 52:54]
    if kind == "MXFP4":
        return _split_nibbles(blocks[:, 1:]).astype(np.int16), blocks[:, None, :1]
    sub = _split_nibbles(blocks[:, 4:].reshape(n, 4, 8))  # NVFP4: (n, 4, 16)
    return sub.reshape(n, 64).astype(np.int16), blocks[:, :4, None]


def _where(i: int, lead: tuple[int, ...], per_row: int) -> str:
    row = np.unravel_index(i // per_row, lead) if lead else ()
    at = f"row {tuple(int(r) for r in row)}, " if lead else ""
    return f"block {i} ({at}block {i % per_row} of the row)"


# -- decode ------------------------------------------------------------------------------------
def _first(mask: np.ndarray) -> tuple[int, int]:
    """(row, column) of the first True in a 2-d mask."""
    i, j = np.unravel_index(int(np.argmax(mask)), mask.shape)
    return int(i), int(j)


_NOT = (None, None)


def _int_codes(kind: str, raw: np.ndarray, d: np.ndarray, where: Any) -> tuple[Any, Any, str]:
    """Integer types: codes (n, block) int8 and f32 scales (n,), or a reason they are not exact."""
    offset = {"Q8_0": 0, "Q4_0": 8, "Q5_0": 16, "TQ2_0": 1, "TQ1_0": 1}[kind]
    bad_d = ~np.isfinite(d)
    if np.any(bad_d):
        i = int(np.argmax(bad_d))
        return *_NOT, f"{kind} {where(i)} has d = {float(d[i])}; arrayquant scales are finite"
    codes = raw - offset  # d keeps its sign: code * d is ggml's value, -0.0 included
    if kind in ("TQ2_0", "TQ1_0") and np.any(codes > 1):
        i, j = _first(codes > 1)
        why = f"{kind} {where(i)} has d = {float(d[i])} and q = {int(raw[i, j])} at element {j}: the value is 2 * d, "
        return *_NOT, why + "outside q2s's codes -1..1"
    return codes.astype(np.int8), d.astype(np.float32), ""


def _offset_codes(kind: str, raw: np.ndarray, d: np.ndarray, m: np.ndarray, where: Any) -> tuple[Any, Any, Any, str]:
    """Q4_1 / Q5_1: unsigned codes (n, 32) uint8, f32 scales ``d`` and offsets ``m`` (n,), or why not."""
    for name, v in (("d", d), ("m", m)):
        bad = ~np.isfinite(v)
        if np.any(bad):
            i = int(np.argmax(bad))
            why = f"{kind} {where(i)} has {name} = {float(v[i])}; arrayquant's scales and offsets are finite"
            return *_NOT, None, why
    neg = d < 0  # -0.0 is >= 0, as ggml writes (max - min) / 15 for a constant block: +0.0
    if np.any(neg):
        i = int(np.argmax(neg))
        why = f"{kind} {where(i)} has d = {float(d[i])}: arrayquant's offset-mode scales are >= 0 (ggml writes "
        return *_NOT, None, why + "d = (max - min) / qmax, never negative)"
    return raw.astype(np.uint8), d.astype(np.float32), m.astype(np.float32), ""


def _fp4_codes(kind: str, raw: np.ndarray, sbytes: np.ndarray, where: Any) -> tuple[Any, Any, str]:
    """MXFP4 / NVFP4: E2M1 codes (n, block) uint8 and f32 scales (n, scales per block)."""
    # GGUF's table has +0 at nibble 8 (kvalues[8] = 0): read it as arrayquant's +0, code 0
    codes = np.where(raw == 8, 0, raw).astype(np.uint8)
    sb = sbytes.reshape(sbytes.shape[0], -1)
    bad = sb == 0xFF
    if kind == "MXFP4":
        if np.any(bad):
            why = "has E8M0 scale byte 0xFF: ggml reads it as 2^127, OCP MX and arrayquant as NaN"
            return *_NOT, f"MXFP4 {where(_first(bad)[0])} {why}"
        return codes, decode_scales(sb.tobytes(), ScaleDtype.UE8M0, sb.size).reshape(sb.shape), ""
    if np.any(bad):
        i, k = _first(bad)
        why = f"NVFP4 {where(i)} has UE4M3 scale byte 0xFF in sub-block {k}: ggml ignores bit 7 and reads "
        return *_NOT, why + "exponent 15, mantissa 7 (480), beyond UE4M3's largest value 448"
    # ggml reads 0x7F as 0 and ignores bit 7 of the others (ggml_ue4m3_to_fp32)
    canon = np.where(sb == 0x7F, 0, sb & 0x7F).astype(np.uint8)
    return codes, decode_scales(canon.tobytes(), ScaleDtype.UE4M3, canon.size).reshape(sb.shape), ""


def _layout(type_name: Any, shape: Any) -> tuple[str, tuple[int, ...], int, int]:
    if not isinstance(type_name, str):
        msg = f"type_name must be a GGUF type name (str), got {type(type_name).__name__}"
        raise SchemeError(msg)
    kind = type_name.upper()
    if kind not in _SIZES:
        raise _refuse(kind)
    if isinstance(shape, tuple) and not shape:
        msg = "shape () has no axes; a GGUF tensor has at least one (NumPy order, columns last)"
        raise ShapeError(msg)
    shp = check_shape(shape, f"{kind} tensor shape")
    block, size = _SIZES[kind]
    if shp[-1] % block:
        msg = (
            f"{kind} tensor of shape {shp}: the last axis ({shp[-1]}) must be a multiple of the {kind} block "
            f"of {block}; GGUF stores whole blocks per row"
        )
        raise ShapeError(msg)
    return kind, shp, block, size


def decode(
    data: Any,
    type_name: str,
    shape: tuple[int, ...],
    *,
    backend: str | None = None,
    device: Any = None,
    global_scale: Any = None,
) -> tuple[QuantizedTensor | None, str]:
    """The arrayquant tensor that a GGUF tensor's bytes are exactly, or ``(None, why not)``.

    Parameters
    ----------
    data : numpy.ndarray or bytes-like
        The tensor's bytes as stored (``ReaderTensor.data``; any shape, C order, read as uint8).
    type_name : str
        The GGUF type (``"Q8_0"``, ...). Types outside :data:`EXACT` give ``(None, reason)``.
    shape : tuple of int
        NumPy order, columns last (GGUF's ``ne`` reversed).
    backend, device : optional
        Where the result's arrays go (default backend, its default device).
    global_scale : float or array, optional
        NVFP4 only: the per-tensor f32 scale llama.cpp stores as the F32 tensor ``<name>.scale``;
        with it the result is the two-level ``nvfp4`` tensor.

    Returns
    -------
    tuple of (QuantizedTensor or None, str)
        ``(qt, "")`` with ``aq.dequantize(qt)`` equal to ``gguf.quants.dequantize`` bit for bit,
        or ``None`` and a sentence naming the first block that is not exact and why.

    Raises
    ------
    CorruptDataError
        A byte count that is not the type's size for ``shape``.
    ShapeError
        A shape with no axes, an extent below 1, or a last axis that is not whole blocks.
    SchemeError
        ``type_name`` is not a str, or ``global_scale`` with a type other than NVFP4.
    ParamsError
        A ``global_scale`` that is not one finite, non-negative float32.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> block = np.concatenate([np.array([1.0], "<f2").view(np.uint8), np.arange(32, dtype=np.int8).view(np.uint8)])
    >>> qt, why = decode(block, "Q8_0", (32,), backend="numpy")
    >>> aq.dequantize(qt)[:4].tolist(), why
    ([0.0, 1.0, 2.0, 3.0], '')
    >>> qt, why = decode(block, "IQ2_XXS", (32,))
    >>> qt, why.split(": ")[0]
    (None, 'GGUF type IQ2_XXS is not an arrayquant scheme')
    """
    if isinstance(type_name, str) and type_name.upper() not in _SIZES:
        why = NOT_EXACT.get(type_name.upper(), f"no arrayquant scheme maps it (those that do: {_KNOWN})")
        return None, f"GGUF type {type_name.upper()} is not an arrayquant scheme: {why}"
    kind, shp, block, size = _layout(type_name, shape)
    if global_scale is not None and kind != "NVFP4":
        msg = f"global_scale is NVFP4's per-tensor scale; a {kind} tensor has none"
        raise SchemeError(msg)
    try:
        raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    except (TypeError, ValueError) as exc:
        msg = f"{kind} data must be the tensor's bytes (a NumPy array or bytes-like), got {type(data).__name__} ({exc})"
        raise CorruptDataError(msg) from None
    lead, per_row = shp[:-1], shp[-1] // block
    n = math.prod(lead) * per_row
    if raw.size != n * size:
        msg = (
            f"{kind} tensor of shape {shp} takes {n} blocks of {size} bytes ({n * size} bytes), "
            f"but the data holds {raw.size}"
        )
        raise CorruptDataError(msg)
    blocks = raw.reshape(n, size)

    def where(i: int) -> str:
        return _where(i, lead, per_row)

    offset = None
    if kind in ggml_blocks.KTYPES:
        codes, scales, offset = ggml_blocks.decode(kind, blocks)
        refused = ggml_blocks.refusal(kind, scales, offset)
        why = "" if refused is None else f"{kind} {where(refused[0])} has {refused[1]}"
    else:
        codes_raw, sbytes = _unpack_blocks(kind, blocks)
        if kind in ("MXFP4", "NVFP4"):
            codes, scales, why = _fp4_codes(kind, codes_raw, sbytes, where)
        elif _AFFINE.get(kind, (False,))[0]:
            d, m = _f16_bits(sbytes.reshape(n, 2)), _f16_bits(blocks[:, 2:4])
            codes, scales, offset, why = _offset_codes(kind, codes_raw, d, m, where)
        else:
            d = _f16_bits(sbytes.reshape(n, 2))
            codes, scales, why = _int_codes(kind, codes_raw, d, where)
    if why:
        return None, why
    scheme = QuantScheme.parse(_SCHEME_TEXT[kind])
    glob = None
    if global_scale is not None:
        glob = _global(global_scale)
        scheme = QuantScheme.nvfp4()
    grid = (*lead, shp[-1] // scheme.block[0].size)  # type: ignore[index]
    values = pack(np.ascontiguousarray(codes.reshape(shp)), scheme)
    m_grid = None if offset is None else np.ascontiguousarray(offset.reshape(grid))
    qt = QuantizedTensor(
        scheme, shp, np.float32, values, np.ascontiguousarray(scales.reshape(grid)), glob, offset=m_grid
    )
    to_bytes(qt)  # every code and scale checked against the scheme
    return qt.to_backend(backend or default().name, device), ""


def _global(value: Any) -> np.ndarray:
    try:
        g = np.asarray(shim.to_host(value) if not isinstance(value, (int, float)) else value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        msg = f"global_scale must be one float (the F32 '<name>.scale' tensor), got {value!r:.100} ({exc})"
        raise ParamsError(msg) from None
    if g.size != 1:
        msg = f"global_scale must hold exactly one value (the per-tensor scale), got shape {g.shape}"
        raise ParamsError(msg)
    g32 = g.reshape(1).astype(np.float32)
    if not (np.isfinite(g32[0]) and g32[0] >= 0 and float(g32[0]) == float(g.reshape(-1)[0])):
        msg = f"global_scale {float(g.reshape(-1)[0])!r} is not a finite, non-negative float32"
        raise ParamsError(msg)
    return g32


# -- encode ------------------------------------------------------------------------------------
def _host(a: Any) -> np.ndarray:
    return np.asarray(shim.to_host(a))


def fold_scales(scales: np.ndarray, glob: float) -> np.ndarray:
    """UE4M3 block scales times the per-tensor scale, where every product is a UE4M3 value.

    Then arrayquant's ``f32(g * s)`` is that UE4M3 value exactly, and so is every value.
    """
    prod = scales.astype(np.float64) * glob  # exact: 4 significant bits times 24
    with np.errstate(all="ignore"):
        p32 = prod.astype(np.float32)
        ok = np.isfinite(prod) & (prod <= 448.0) & (p32.astype(np.float64) == prod)
        p32 = np.where(ok, p32, np.float32(0))
        ok &= round_up_scales(p32, ScaleDtype.UE4M3, xp=np) == p32
    if not np.all(ok):
        i = int(np.argmin(ok.reshape(-1)))
        s, p = float(scales.reshape(-1)[i]), float(prod.reshape(-1)[i])
        msg = (
            f"nvfp4 tensor's per-tensor scale {glob!r} cannot be folded into GGUF NVFP4's UE4M3 block scales "
            f"exactly: block scale {s!r} at flat index {i} times it is {p!r}, not a UE4M3 value. GGUF NVFP4 "
            "blocks have no per-tensor level; llama.cpp stores it as a separate F32 tensor '<name>.scale' "
            "(multiplied in with ggml_mul): use encode_split(qt) for that pair, or quantize to "
            "e2m1:block16:ue4m3 (single level)"
        )
        raise SchemeError(msg)
    return p32


def encode_split(qt: QuantizedTensor, type_name: str | None = None) -> tuple[str, np.ndarray, np.ndarray | None]:
    """GGUF type, block bytes and the per-tensor scale kept apart, as llama.cpp stores NVFP4.

    For a two-level ``nvfp4`` tensor the third item is its f32 per-tensor scale, shape ``(1,)``,
    which llama.cpp's converter writes as the F32 tensor ``<name>.scale`` (``.weight`` replaced);
    the bytes hold the UE4M3 block scales unchanged. Every other tensor gives ``None`` there.
    Parameters, errors as :func:`encode` (no folding, so no refusal for the per-tensor scale).
    """
    return _encode(qt, type_name, fold=False)


def encode(qt: QuantizedTensor, type_name: str | None = None) -> tuple[str, np.ndarray]:
    """The GGUF type and bytes that hold ``qt`` exactly, as gguf-py and llama.cpp store them.

    Parameters
    ----------
    qt : QuantizedTensor
        A tensor of a scheme :func:`type_of` maps; its last axis a whole number of blocks.
    type_name : str, optional
        ``"TQ1_0"`` to write ``q2s:block256:f16`` in llama.cpp's base-3 packing; default
        :func:`type_of`.

    Returns
    -------
    tuple of (str, numpy.ndarray)
        The type name and uint8 bytes shaped ``(*shape[:-1], bytes per row)``; what
        ``gguf.quants.quantize`` returns, and ``gguf.quants.dequantize`` of it equals
        ``aq.dequantize(qt)`` (E2M1 ``-0.0``, code 8, reads back as ``+0.0``).

    Raises
    ------
    SchemeError
        A scheme with no GGUF type (the message lists those that map), a ``type_name`` that does
        not hold it, or a two-level ``nvfp4`` whose per-tensor scale does not fold exactly into the
        UE4M3 block scales (see :func:`encode_split`).
    ShapeError
        A last axis that is not a whole number of the type's blocks.
    ParamsError
        ``qt`` is not a QuantizedTensor, or its arrays do not fit its scheme.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), "q8f:block32:f16")
    >>> name, raw = encode(qt)
    >>> name, raw.shape, raw.dtype.name
    ('Q8_0', (2, 34), 'uint8')
    """
    kind, out, _ = _encode(qt, type_name, fold=True)
    return kind, out


def _encode(qt: QuantizedTensor, type_name: str | None, *, fold: bool) -> tuple[str, np.ndarray, np.ndarray | None]:
    if not isinstance(qt, QuantizedTensor):
        msg = f"qt must be an aq.QuantizedTensor, got {type(qt).__name__}"
        raise ParamsError(msg)
    kind = type_of(qt.scheme)
    if kind is None:
        raise _refuse(qt.scheme)
    if type_name is not None:
        want = str(type_name).upper()
        if want != kind and not (want == "TQ1_0" and kind == "TQ2_0"):
            msg = f"scheme {qt.scheme} maps to GGUF {kind}, not {type_name!r}"
            raise SchemeError(msg)
        kind = want
    shape = check_shape(qt.shape, "qt.shape")
    _, shp, block, size = _layout(kind, shape)
    to_bytes(qt)  # values, scales and the global checked against the scheme and shape
    lead, per_row = shp[:-1], shp[-1] // block
    n = math.prod(lead) * per_row
    codes = _host(qt.codes()).reshape(n, block)
    scales = _host(qt.scales).astype(np.float32).reshape(n, -1)
    glob = None if qt.global_scale is None else _host(qt.global_scale).astype(np.float32).reshape(1)
    if kind in ggml_blocks.KTYPES:
        offsets = None if qt.offset is None else _host(qt.offset).astype(np.float32).reshape(n, -1)
        out, why = ggml_blocks.encode(kind, codes, scales, offsets)
        if why:
            msg = (
                f"{kind} {why}. Quantize from floats with calibration='ggml' (the default for GGUF files) to "
                f"get {kind}'s own scales"
            )
            raise SchemeError(msg)
    elif kind in _AFFINE:
        out = _affine_bytes(kind, codes, scales, None if qt.offset is None else _host(qt.offset))
    elif kind in ("MXFP4", "NVFP4"):
        q = codes.astype(np.uint8)
        if kind == "MXFP4":
            head = np.frombuffer(encode_scales(scales, ScaleDtype.UE8M0), np.uint8).reshape(n, 1)
            body = _join_nibbles(q)
        else:
            if glob is not None and fold:
                scales = fold_scales(scales, float(glob[0]))
                glob = None
            head = np.frombuffer(encode_scales(scales, ScaleDtype.UE4M3), np.uint8).reshape(n, 4)
            body = _join_nibbles(q.reshape(n, 4, 16)).reshape(n, 32)
        out = np.concatenate([head, body], axis=1)
    else:
        d = scales.reshape(n, 1).astype("<f2").view(np.uint8)  # exact: the scales are on the f16 grid
        c = codes.astype(np.int16)
        if kind == "Q8_0":
            out = np.concatenate([d, c.astype(np.int8).view(np.uint8)], axis=1)
        elif kind == "Q4_0":
            out = np.concatenate([d, _join_nibbles((c + 8).astype(np.uint8))], axis=1)
        elif kind == "TQ2_0":
            t = (c + 1).astype(np.uint8).reshape(n, 2, 4, 32) << _TQ2_SHIFT[:, None]
            out = np.concatenate([np.bitwise_or.reduce(t, axis=2).reshape(n, 64), d], axis=1)
        else:
            out = np.concatenate([_tq1_bytes((c + 1).astype(np.uint8)), d], axis=1)
    return kind, np.ascontiguousarray(out).reshape(*lead, per_row * size), glob


def _affine_bytes(kind: str, codes: Any, scales: np.ndarray, offset: np.ndarray | None) -> np.ndarray:
    """Q4_1 / Q5_0 / Q5_1 blocks (n, size) of arrayquant codes (n, 32), f32 ``d`` and ``m`` (n, 1)."""
    has_m, has_qh = _AFFINE[kind]
    n = scales.shape[0]
    q = codes.astype(np.int16) + (16 if kind == "Q5_0" else 0)  # Q5_0 stores q = c + 16; the others c
    q = q.astype(np.uint8)
    parts = [scales.reshape(n, 1).astype("<f2").view(np.uint8)]  # exact: d and m are on the f16 grid
    if has_m:
        if offset is None:  # pragma: no cover - to_bytes refused an offset-mode tensor without it
            msg = f"{kind} needs the tensor's offsets (m)"
            raise ParamsError(msg)
        parts.append(offset.astype(np.float32).reshape(n, 1).astype("<f2").view(np.uint8))
    if has_qh:
        parts.append(np.packbits((q >> 4) & 1, axis=-1, bitorder="little"))  # 32 bits: a little-endian uint32
    parts.append(_join_nibbles(q))
    return np.concatenate(parts, axis=1)
