"""GGUF's K-quant and IQ4 blocks as arrayquant codes, scales and offsets, and back (host NumPy).

A K-quant super-block of 256 values stores one or two f16 numbers (``d``, and ``dmin`` where it
has offsets) and a small integer per sub-block (a scale, and a min); ggml decodes a sub-block
with the f32 products ``dl = d * sc`` and ``ml = dmin * m``. An f16 has 11 significant bits and the
integers at most 8, so those products are exact in f32: each sub-block has an f32 scale (and
offset) that *is* ggml's, and the tensor is an arrayquant one-level scheme with f32 scales:

========  ======  ====================================  =============================================
type      B/256   arrayquant scheme                     ggml's value (``dequantize_row_*``)
========  ======  ====================================  =============================================
``Q2_K``  84      ``u2:block16:f32:offset``             ``(d * (sc & 15)) * q - dmin * (sc >> 4)``
``Q3_K``  110     ``q3f:block16:f32``                   ``(d * (sc - 32)) * q``, ``q`` in -4 .. 3
``Q4_K``  144     ``u4:block32:f32:offset``             ``(d * sc) * q - dmin * m``, 6-bit ``sc``, ``m``
``Q5_K``  176     ``u5:block32:f32:offset``             the same over 5-bit codes
``Q6_K``  210     ``q6f:block16:f32``                   ``(d * sc) * q``, int8 ``sc``, ``q`` in -32 .. 31
``IQ4_XS``  136   ``q4f:block32:f32:lookup:iq4nl``      ``(d * (ls - 32)) * kvalues[q]``
``IQ4_NL``  18/32 ``q4f:block32:f16:lookup:iq4nl``      ``d * kvalues[q]``
========  ======  ====================================  =============================================

The offset is the negated product ``-(dmin * m)``, exact too, and arrayquant's offset decode
``scale * q + offset`` (product rounded, then the sum) is ggml's ``dl * q - ml`` bit for bit. The
IQ4 codes index ``kvalues_iq4nl`` (arrayquant's ``iq4nl`` codebook); the nibble is the 4-bit
field of arrayquant's signed code.

Back to bytes (:func:`encode`), each super-block's f32 scales are factored into an f16 ``d`` and
the integers again: the first level, from the format's extreme down (-32 for Q3_K and IQ4_XS, -128
for Q6_K, 63 for Q4_K/Q5_K, 15 for Q2_K), whose ``d = scale / level`` is an f16 making every scale
of the super-block ``d`` times an integer of the range, exactly. llama.cpp's reference quantizers
give the sub-block of largest scale that extreme level, so its blocks factor back to the same
bytes; any factoring decodes to the same values. Scales that factor no way (arbitrary f32 scales
from another calibration) are refused.
"""

from __future__ import annotations

import numpy as np

from ..scheme.codebooks import IQ4NL

__all__ = ["KTYPES", "LEGACY", "SCHEMES", "decode", "encode", "refusal"]

_F32 = np.float32
KVALUES_IQ4NL = np.asarray(IQ4NL, np.float32)  # kvalues_iq4nl

# type -> (values per block, bytes per block)
KTYPES: dict[str, tuple[int, int]] = {
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "IQ4_NL": (32, 18),
    "IQ4_XS": (256, 136),
}
# the 32-blocks ggml's imatrix searches also write: (has an f16 m after d, has a uint32 qh)
LEGACY = {"Q4_0": (False, False), "Q4_1": (True, False), "Q5_0": (False, True), "Q5_1": (True, True)}
SCHEMES = {
    "Q2_K": "u2:block16:f32:offset",
    "Q3_K": "q3f:block16:f32",
    "Q4_K": "u4:block32:f32:offset",
    "Q5_K": "u5:block32:f32:offset",
    "Q6_K": "q6f:block16:f32",
    "IQ4_NL": "q4f:block32:f16:lookup:iq4nl",
    "IQ4_XS": "q4f:block32:f32:lookup:iq4nl",
}
# the (d, level) llama.cpp writes for a super-block of zeros: Q3_K stores scale bytes of 0 (level -32)
# under d = +0, IQ4_XS d = -0.0 (from -max / 32) with level 0; the others +0 and 0
_ZERO = {"Q3_K": (0.0, -32), "IQ4_XS": (-0.0, 0)}
# sub-block scale levels as stored: (lowest, highest) of the integer each scale is d times, and of the mins
_LEVELS = {
    "Q2_K": ((0, 15), (0, 15)),
    "Q3_K": ((-32, 31), None),
    "Q4_K": ((0, 63), (0, 63)),
    "Q5_K": ((0, 63), (0, 63)),
    "Q6_K": ((-128, 127), None),
    "IQ4_XS": ((-32, 31), None),
}


def _f16(raw: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte ``at`` of every block (``raw``: uint8 ``(blocks, bytes)``), as f32."""
    return np.ascontiguousarray(raw[:, at : at + 2]).view("<f2")[:, 0].astype(_F32)


def _bits_at(raw: np.ndarray, start: int, count: int) -> np.ndarray:
    return raw[:, start : start + count].astype(np.int32)


def _scale_min_k4(sb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``get_scale_min_k4`` for the 8 sub-blocks: 6-bit scales and mins from the 12 scale bytes."""
    q = sb.astype(np.int32)
    sc = np.empty((q.shape[0], 8), np.int32)
    mn = np.empty((q.shape[0], 8), np.int32)
    sc[:, :4] = q[:, 0:4] & 63
    mn[:, :4] = q[:, 4:8] & 63
    sc[:, 4:] = (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
    return sc, mn


def _q3_scales(sb: np.ndarray) -> np.ndarray:
    """The 16 signed 6-bit scales of a Q3_K block (``sc - 32``) from its 12 scale bytes."""
    q = sb.astype(np.int32)
    j = np.arange(16)
    low = np.where(j < 8, q[:, j % 8] & 0xF, q[:, j % 8] >> 4)
    high = (q[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    return (low | (high << 4)) - 32


def _two_bit(qs: np.ndarray) -> np.ndarray:
    """Fields of the 2-bit layout (``qs[32h + i]`` bits ``2j``: element ``128h + 32j + i``): ``(blocks, 256)``."""
    b = qs.reshape(-1, 2, 1, 32).astype(np.int32)
    shifts = (2 * np.arange(4)).reshape(1, 1, 4, 1)
    return ((b >> shifts) & 3).reshape(-1, 256)


def _nibbles_k(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K low fields: ``qs[32g + i]`` low nibble is element ``64g + i``, high ``64g + 32 + i``."""
    b = qs.reshape(-1, 4, 1, 32).astype(np.int32)
    return ((b >> np.array([0, 4]).reshape(1, 1, 2, 1)) & 0xF).reshape(-1, 256)


def decode(type_name: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Codes, f32 scales and f32 offsets (or None) of whole blocks ``raw`` (uint8 ``(blocks, bytes)``).

    The K-quants and IQ4 (:data:`KTYPES`), and the 32-blocks of :data:`LEGACY` (written here by
    ggml's imatrix searches; their reader with its checks is :mod:`arrayquant.io.gguf.types`).

    Codes are the arrayquant value's (uint8 for the unsigned values, int8 for the signed ones and
    the IQ4 indices), ``(blocks, values per block)``; scales and offsets one per sub-block. Values
    are whatever the bytes hold: checking them (a negative ``d``, an infinite one) is the caller's.
    """
    n = raw.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        if type_name == "Q2_K":
            sc = _bits_at(raw, 0, 16)
            d, dmin = _f16(raw, 80), _f16(raw, 82)
            codes = _two_bit(raw[:, 16:80]).astype(np.uint8)
            return codes, d[:, None] * (sc & 0xF).astype(_F32), -(dmin[:, None] * (sc >> 4).astype(_F32))
        if type_name == "Q3_K":
            low = _two_bit(raw[:, 32:96])
            hm = raw[:, 0:32].astype(np.int32)  # element 128h + 32j + i: bit 4h + j of hmask[i]
            bit = (4 * np.arange(2).reshape(2, 1, 1) + np.arange(4).reshape(1, 4, 1)).reshape(1, 2, 4, 1)
            high = ((hm.reshape(-1, 1, 1, 32) >> bit) & 1).reshape(-1, 256)
            codes = (low - np.where(high == 1, 0, 4)).astype(np.int8)
            return codes, _f16(raw, 108)[:, None] * _q3_scales(raw[:, 96:108]).astype(_F32), None
        if type_name in ("Q4_K", "Q5_K"):
            d, dmin = _f16(raw, 0), _f16(raw, 2)
            sc, mn = _scale_min_k4(raw[:, 4:16])
            if type_name == "Q4_K":
                codes = _nibbles_k(raw[:, 16:144])
            else:
                qh = raw[:, 16:48].astype(np.int32)  # element 64g + 32k + i: bit 2g + k of qh[i]
                bit = (2 * np.arange(4).reshape(4, 1, 1) + np.arange(2).reshape(1, 2, 1)).reshape(1, 4, 2, 1)
                high = ((qh.reshape(-1, 1, 1, 32) >> bit) & 1).reshape(-1, 256)
                codes = _nibbles_k(raw[:, 48:176]) + 16 * high
            scales = d[:, None] * sc.astype(_F32)
            return codes.astype(np.uint8), scales, -(dmin[:, None] * mn.astype(_F32))
        if type_name == "Q6_K":
            # element 128h + 32t + i: ql[64h + 32(t % 2) + i] nibble t // 2, qh[32h + i] bits 2t
            ql = raw[:, 0:128].astype(np.int32).reshape(-1, 2, 1, 2, 32)
            nib = (ql >> (4 * np.arange(2)).reshape(1, 1, 2, 1, 1)) & 0xF  # (blocks, h, t // 2, t % 2, i)
            qh = raw[:, 128:192].astype(np.int32).reshape(-1, 2, 1, 32)
            hi = (qh >> (2 * np.arange(4)).reshape(1, 1, 4, 1)) & 3  # (blocks, h, t, i)
            six = (nib.reshape(-1, 2, 4, 32) | (hi << 4)) - 32
            sc6 = raw[:, 192:208].view(np.int8).astype(_F32)
            return six.reshape(n, 256).astype(np.int8), _f16(raw, 208)[:, None] * sc6, None
        if type_name == "IQ4_NL":
            qs = raw[:, 2:18].astype(np.int32)
            idx = np.concatenate([qs & 0xF, qs >> 4], axis=1)
            return _index_codes(idx), _f16(raw, 0)[:, None], None
        if type_name == "IQ4_XS":
            d = _f16(raw, 0)
            sh = raw[:, 2].astype(np.int32) | (raw[:, 3].astype(np.int32) << 8)
            sl = raw[:, 4:8].astype(np.int32)
            ib = np.arange(8)
            ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 0xF) | (((sh[:, None] >> (2 * ib)) & 3) << 4)
            qs = raw[:, 8:136].astype(np.int32).reshape(-1, 8, 1, 16)
            idx = ((qs >> np.array([0, 4]).reshape(1, 1, 2, 1)) & 0xF).reshape(-1, 256)
            return _index_codes(idx), d[:, None] * (ls - 32).astype(_F32), None
        if type_name in LEGACY:  # Q4_0, Q4_1, Q5_0, Q5_1: f16 d (and m), qh bits, nibbles j / j + 16
            has_m, has_qh = LEGACY[type_name]
            q = raw[:, -16:].astype(np.int32)
            codes = np.concatenate([q & 0xF, q >> 4], axis=1)
            if has_qh:
                at = 4 if has_m else 2
                codes |= np.unpackbits(raw[:, at : at + 4], axis=1, bitorder="little").astype(np.int32) << 4
            d = _f16(raw, 0)[:, None]
            if has_m:
                return codes.astype(np.uint8), d, _f16(raw, 2)[:, None]
            return (codes - (8 if type_name == "Q4_0" else 16)).astype(np.int8), d, None
    msg = f"not a K-quant, IQ4 or legacy 32-block type: {type_name}"
    raise KeyError(msg)


def _index_codes(idx: np.ndarray) -> np.ndarray:
    """A 4-bit table index as the int8 code of a signed 4-bit value whose field it is."""
    return np.where(idx >= 8, idx - 16, idx).astype(np.int8)


def refusal(type_name: str, scales: np.ndarray, offsets: np.ndarray | None) -> tuple[int, str] | None:
    """The first block a tensor of decoded ``scales`` cannot be (offset modes need scales >= 0), or None.

    ``(block, why)``: a non-finite scale or offset anywhere; a negative scale under offsets (ggml
    writes ``d >= 0`` there; a file with ``d < 0`` decodes, but is no arrayquant offset tensor).
    """
    bad = ~np.isfinite(scales).all(axis=1)
    why = "a non-finite f16 scale d"
    if offsets is not None:
        bad |= ~np.isfinite(offsets).all(axis=1)
        neg = (scales < 0).any(axis=1)
        if neg.any() and not bad[: int(np.argmax(neg)) + 1].any():
            return int(np.argmax(neg)), "a negative scale d under offsets (ggml writes d >= 0)"
        why = "a non-finite f16 scale d or dmin"
    if bad.any():
        return int(np.argmax(bad)), why
    return None


# --------------------------------------------------------------------------------------------
# back to bytes
# --------------------------------------------------------------------------------------------


def _candidates(lo: int, hi: int) -> list[int]:
    """Levels to try as the largest scale's, from the extreme the reference quantizers give it."""
    order = sorted((q for q in range(lo, hi + 1) if q), key=lambda q: (-abs(q), q > 0 if lo < 0 else q < 0))
    return order


def _factor(
    eff: np.ndarray, lo: int, hi: int, zero_as: tuple[float, int] = (0.0, 0)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row of f32 ``eff`` as ``d * level`` exactly: f16 bits of ``d``, int levels, and a row-ok mask.

    A row of zeros is ``zero_as`` (llama.cpp's ``(d, level)`` for one) where that gives the same
    zeros, sign included, and else a ``d`` of 0 with levels giving each zero its sign.
    """
    rows, k = eff.shape
    d = np.zeros(rows, _F32)
    levels = np.zeros((rows, k), np.int32)
    ok = np.zeros(rows, bool)
    zero = (eff == 0).all(axis=1)
    d0, l0 = _F32(zero_as[0]), zero_as[1]
    as_ggml = zero & (np.signbit(eff) == np.signbit(d0 * _F32(l0))).all(axis=1)
    d[as_ggml] = d0
    levels[as_ggml] = l0
    # zeros of other signs (an f16 d that rounded to 0 under levels of both signs): d = +0, and level -1
    # where the zero is -0.0 (where the levels are unsigned, every zero has d's sign: d carries it)
    other = zero & ~as_ggml
    if lo < 0:
        levels[other] = np.where(np.signbit(eff[other]), -1, 0)
    else:
        d[other] = np.where(np.signbit(eff[other]).any(axis=1), _F32(-0.0), _F32(0.0))
    ok[zero] = True
    lead = np.argmax(np.abs(eff), axis=1)
    ref = eff[np.arange(rows), lead]
    todo = ~zero & np.isfinite(eff).all(axis=1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for q in _candidates(lo, hi):
            if not todo.any():
                break
            idx = np.flatnonzero(todo)
            cand = (ref[idx] / _F32(q)).astype(_F32)
            half = cand.astype(np.float16)
            fits = np.isfinite(half) & (half.astype(_F32) == cand) & (cand != 0)
            lv = np.rint(eff[idx] / cand[:, None])
            inside = (lv >= lo) & (lv <= hi)
            lv = np.where(inside, lv, 0).astype(np.int32)  # an integer level: its 0 has no sign
            # bit for bit, so that a zero's sign (d's, under level 0) picks between d and -d
            exact = (cand[:, None] * lv.astype(_F32)).view(np.uint32) == eff[idx].view(np.uint32)
            good = fits & inside.all(axis=1) & exact.all(axis=1)
            hit = idx[good]
            d[hit] = cand[good]
            levels[hit] = lv[good]
            ok[hit] = True
            todo[hit] = False
    return d.astype(np.float16).view(np.uint16), levels, ok


def _put_f16(out: np.ndarray, at: int, bits: np.ndarray) -> None:
    out[:, at] = (bits & 0xFF).astype(np.uint8)
    out[:, at + 1] = (bits >> 8).astype(np.uint8)


def _pack_two_bit(codes: np.ndarray) -> np.ndarray:
    c = codes.astype(np.int32).reshape(-1, 2, 4, 32)
    return (c << (2 * np.arange(4)).reshape(1, 1, 4, 1)).sum(axis=2).astype(np.uint8).reshape(-1, 64)


def _pack_nibbles_k(low: np.ndarray) -> np.ndarray:
    c = low.astype(np.int32).reshape(-1, 4, 2, 32)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).astype(np.uint8).reshape(-1, 128)


def _put_scales_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    out = np.zeros((sc.shape[0], 12), np.int32)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    return out.astype(np.uint8)


def encode(type_name: str, codes: np.ndarray, scales: np.ndarray, offsets: np.ndarray | None) -> tuple[np.ndarray, str]:
    """The bytes of whole blocks from codes ``(blocks, values)``, f32 scales and offsets per sub-block.

    Returns ``(raw, "")`` or, where a block's scales (or offsets) factor into no f16 ``d`` times
    integers of the format, ``(empty, why)`` naming the first such block.
    """
    n = codes.shape[0]
    size = KTYPES[type_name][1]
    out = np.zeros((n, size), np.uint8)
    scales = np.asarray(scales, _F32)
    if type_name == "IQ4_NL":  # its scheme's scales are f16 values (the tensor's own check)
        _put_f16(out, 0, scales[:, 0].astype(np.float16).view(np.uint16))
        idx = codes.astype(np.int32) & 0xF
        out[:, 2:18] = (idx[:, :16] | (idx[:, 16:] << 4)).astype(np.uint8)
        return out, ""
    lo, hi = _LEVELS[type_name][0]
    dbits, lv, ok = _factor(scales, lo, hi, _ZERO.get(type_name, (0.0, 0)))
    if offsets is not None:
        neg = -np.asarray(offsets, _F32)
        mbits, mv, mok = _factor(neg, *_LEVELS[type_name][1])  # type: ignore[misc]
        ok &= mok
    if not ok.all():
        what = "scales (and offsets)" if offsets is not None else "scales"
        return out[:0], (
            f"block {int(np.argmin(ok))}: its {what} are not one f16 times {type_name}'s integer levels "
            f"({lo} .. {hi}); they come from another calibration"
        )
    c = codes.astype(np.int32)
    if type_name == "Q2_K":
        out[:, 0:16] = (lv | (mv << 4)).astype(np.uint8)
        out[:, 16:80] = _pack_two_bit(c)
        _put_f16(out, 80, dbits)
        _put_f16(out, 82, mbits)
    elif type_name == "Q3_K":
        u = c + 4
        high = (u >> 2) & 1
        bit = (4 * np.arange(2).reshape(2, 1, 1) + np.arange(4).reshape(1, 4, 1)).reshape(1, 2, 4, 1)
        out[:, 0:32] = (high.reshape(-1, 2, 4, 32) << bit).sum(axis=(1, 2)).astype(np.uint8)
        out[:, 32:96] = _pack_two_bit(u & 3)
        s = lv + 32
        sb = np.zeros((n, 12), np.int32)
        low = s & 0xF
        sb[:, 0:8] = low[:, :8] | (low[:, 8:] << 4)
        for k in range(16):
            sb[:, 8 + k % 4] |= (s[:, k] >> 4) << (2 * (k // 4))
        out[:, 96:108] = sb.astype(np.uint8)
        _put_f16(out, 108, dbits)
    elif type_name in ("Q4_K", "Q5_K"):
        _put_f16(out, 0, dbits)
        _put_f16(out, 2, mbits)
        out[:, 4:16] = _put_scales_k4(lv, mv)
        if type_name == "Q4_K":
            out[:, 16:144] = _pack_nibbles_k(c)
        else:
            high = (c >> 4) & 1
            bit = (2 * np.arange(4).reshape(4, 1, 1) + np.arange(2).reshape(1, 2, 1)).reshape(1, 4, 2, 1)
            out[:, 16:48] = (high.reshape(-1, 4, 2, 32) << bit).sum(axis=(1, 2)).astype(np.uint8)
            out[:, 48:176] = _pack_nibbles_k(c & 0xF)
    elif type_name == "Q6_K":
        u = (c + 32).reshape(-1, 2, 4, 32)  # (blocks, h, t, i)
        nib = u & 0xF
        ql = nib[:, :, 0:2] | (nib[:, :, 2:4] << 4)  # t and t + 2 share a byte
        out[:, 0:128] = ql.reshape(-1, 128).astype(np.uint8)
        top = (u >> 4) << (2 * np.arange(4)).reshape(1, 1, 4, 1)
        out[:, 128:192] = top.sum(axis=2).reshape(-1, 64).astype(np.uint8)
        out[:, 192:208] = lv.astype(np.int8).view(np.uint8)
        _put_f16(out, 208, dbits)
    else:  # IQ4_XS
        _put_f16(out, 0, dbits)
        ls = lv + 32
        sh = ((ls >> 4) << (2 * np.arange(8))).sum(axis=1)
        out[:, 2] = (sh & 0xFF).astype(np.uint8)
        out[:, 3] = (sh >> 8).astype(np.uint8)
        low = ls & 0xF
        out[:, 4:8] = (low[:, 0::2] | (low[:, 1::2] << 4)).astype(np.uint8)
        idx = (c & 0xF).reshape(-1, 8, 2, 16)
        out[:, 8:136] = (idx[:, :, 0] | (idx[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)
    return out, ""
