"""llama.cpp's reference quantizers (``quantize_row_*_ref`` in ggml-quants.c), step for step.

``llama-quantize`` and ``ggml_quantize_chunk`` call these scalar C loops on the host in f32 (the
SIMD paths are for activations, not for files), so a GGUF file's bytes depend on them alone.
Each function below repeats one of them in NumPy f32 arithmetic, in the same order of
operations, so that the codes and the stored scales are equal to ggml's bit for bit. They
differ from arrayquant's own MinMax rule on purpose, in ways a reader should know:

- ``Q8_0``: ``d = amax / 127`` rounded to nearest f16, codes ``roundf(x * (1 / d))`` from the
  f32 ``d`` before rounding (ties away from zero);
- ``Q4_0``: ``d = max / -8`` with ``max`` the signed element of largest magnitude (the first
  such), so ``d`` is negative where that element is positive; codes
  ``min(15, (int)(x / d + 8.5))``;
- ``Q5_0``: Q4_0's rule with 32 levels: ``d = max / -16``, codes
  ``min(31, (int8_t)(x * (1 / d) + 16.5f)) - 16`` from the f32 ``d`` before its nearest-even
  f16 rounding (half up by truncation, not to nearest);
- ``Q4_1`` (offset, ``x = code * d + m``): ``d = (max - min) / 15`` from the block's own min and
  max, not a range widened to hold 0; codes ``min(15, (int8_t)((x - min) * (1 / d) + 0.5f))``
  from the f32 ``d`` and ``min`` before rounding (half up), then ``d`` and ``m = min`` each
  rounded to nearest-even f16, so a value's code need not be the nearest point of the stored grid;
- ``Q5_1``: as Q4_1 with ``d = (max - min) / 31`` and ``(uint8_t)((x - min) * (1 / d) + 0.5f)``,
  no clamp;
- ``TQ1_0`` / ``TQ2_0``: ``d = amax`` rounded to nearest f16, codes ``lroundf(x / amax)``;
- ``MXFP4``: exponent ``floor(log2(amax)) - 2`` (OCP MX's rule, not arrayquant's round-up),
  each value to the nearest E2M1 point, a tie to the first in ggml's table (toward zero, +0);
- ``NVFP4`` (GGUF's, one level): UE4M3 scale ``amax / 6`` rounded by ggml's own converter
  (half up on the mantissa, ``256 .. 448`` to 448), E2M1 codes as for MXFP4.

Blocks run along the last axis. :func:`quantize_host` (and :func:`quantize_offset_host` for the
offset types Q4_1 and Q5_1) takes any backend's array to f32 on the host (as llama.cpp converts
every source) and refuses non-finite values first.

Where ggml's C is undefined (a block whose ``amax`` is below ``2**-125`` gives MXFP4 a negative
exponent cast to ``uint8_t``), the exponent is clamped to 0: that block's values are 0 either way.
For Q5_0, Q4_1 and Q5_1, a block whose ``|d|`` is below ``2**-128`` has ``1 / d`` overflow to
infinity (and one whose ``max - min`` overflows f32 has ``(x - min) * 0`` NaN where ``x - min``
does), and the C casts those infinities and NaNs to an integer; such codes are 0 in the stored
bits here, as x86's truncating conversion (``cvttss2si``: ``INT_MIN``, low byte 0) gives. The
first kind of block stores f16 zeros as ``d`` and ``m``, so its values are 0 whatever its codes;
the second stores ``d = inf``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backends import shim
from ..invariants import check_finite

__all__ = [
    "KINDS",
    "OFFSET_KINDS",
    "quantize_blocks",
    "quantize_host",
    "quantize_offset_blocks",
    "quantize_offset_host",
]

# GGUF type -> (elements per block, elements per scale)
KINDS: dict[str, tuple[int, int]] = {
    "Q8_0": (32, 32),
    "Q4_0": (32, 32),
    "Q5_0": (32, 32),
    "TQ1_0": (256, 256),
    "TQ2_0": (256, 256),
    "MXFP4": (32, 32),
    "NVFP4": (64, 16),
}

# GGUF offset type (x = code * d + m) -> (elements per block, elements per scale)
OFFSET_KINDS: dict[str, tuple[int, int]] = {"Q4_1": (32, 32), "Q5_1": (32, 32)}

_F32 = np.float32
# ggml's kvalues_mxfp4: E2M1 doubled, indexed by the E2M1 code (bit 3 = sign, 8 is +0 there)
_KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=_F32)


def _roundf(v: np.ndarray) -> np.ndarray:
    """C's ``roundf``/``lroundf``: nearest, ties away from zero (``v - trunc(v)`` is exact in f32)."""
    t = np.trunc(v)
    return t + np.where(np.abs(v - t) >= _F32(0.5), np.sign(v), _F32(0))


def _inverse(d: np.ndarray) -> np.ndarray:
    """``d ? 1.0f / d : 0.0f``."""
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(d != 0, _F32(1) / np.where(d != 0, d, _F32(1)), _F32(0)).astype(_F32)


def _trunc_c(t: np.ndarray) -> np.ndarray:
    """C's float-to-integer cast of ``t`` (toward zero); a non-finite ``t`` to 0, as on x86.

    The C is undefined there; x86's ``cvttss2si`` gives ``INT_MIN``, whose low byte (all that
    an ``int8_t`` or ``uint8_t`` keeps) is 0. Finite ``t`` here are small (below 34).
    """
    return np.where(np.isfinite(t), np.trunc(t), _F32(0)).astype(_F32)


def _to_f16(d: np.ndarray) -> np.ndarray:
    """GGML_FP32_TO_FP16: nearest even; the f16 value as f32."""
    with np.errstate(over="ignore"):
        return d.astype(np.float16).astype(_F32)


def _best_index(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_mxfp4``: the first table entry with the least ``|k * d - x|`` in f32."""
    err = np.abs(_KVALUES * d[:, None, None] - x[..., None])  # k * d is exact: 4 bits times a power or UE4M3
    return np.argmin(err, axis=-1).astype(np.uint8)


def _ue4m3(x: np.ndarray) -> np.ndarray:
    """ggml's ``ggml_fp32_to_ue4m3``: the scale byte for a non-negative f32."""
    x = np.minimum(x, _F32(448))
    bits = x.view(np.uint32)
    exp0 = ((bits >> 23) & 0xFF).astype(np.int32) - 127 + 7
    man = ((bits >> 20) & 0x7).astype(np.int32) + ((bits >> 19) & 1).astype(np.int32)  # half up
    carry = man > 7
    exp, man = np.where(carry, exp0 + 1, exp0), np.where(carry, 0, man)
    normal = np.where(exp >= 15, 0x7E, (exp << 3) | man)
    sub = np.clip((x * _F32(512) + _F32(0.5)).astype(np.int32), 0, 7)  # (int) truncates: x >= 0
    out = np.where(exp0 <= 0, sub, normal)
    return np.where(x > 0, out, 0).astype(np.uint8)


def _ue4m3_value(b: np.ndarray) -> np.ndarray:
    """The UE4M3 byte's value (not ggml's halved one)."""
    e, m = (b >> 3).astype(np.int32) & 0xF, (b & 7).astype(_F32)
    v = np.where(e == 0, m * _F32(2.0**-9), np.ldexp(_F32(1) + m / _F32(8), e - 7).astype(_F32))
    return np.where((b == 0) | (b == 0x7F), _F32(0), v).astype(_F32)


def quantize_blocks(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """ggml's codes and scales for ``x`` (f32, last axis whole blocks of ``kind``).

    Returns ``(codes, scales)``: codes shaped as ``x`` (int8 for the integer types, Q5_0's
    ``q - 16`` in ``-16 .. 15`` among them; E2M1 codes as uint8 for the FP4 types), scales f32
    shaped ``(*x.shape[:-1], x.shape[-1] // per_scale)`` with ``x = code * scale`` (E2M1's value
    of the code for FP4) as ggml dequantizes it. The offset types are
    :func:`quantize_offset_blocks`'s.

    >>> x = np.array([[0.5, -2.0] + [0.0] * 30], np.float32)
    >>> codes, scales = quantize_blocks(x, "Q4_0")
    >>> codes[0, :2].tolist(), scales.tolist()
    ([2, -8], [[0.25]])
    """
    per = KINDS[kind][1]
    x = np.asarray(x, dtype=_F32)
    v = x.reshape(-1, per)
    codes = np.empty(v.shape, np.uint8 if kind in ("MXFP4", "NVFP4") else np.int8)
    scales = np.empty(v.shape[0], _F32)
    step = max(1, _CHUNK // per)  # a bounded slice at a time: the FP4 search holds 16 errors per value
    for i in range(0, v.shape[0], step):
        codes[i : i + step], scales[i : i + step] = _blocks(v[i : i + step], kind)
    return codes.reshape(x.shape), scales.reshape(*x.shape[:-1], x.shape[-1] // per)


_CHUNK = 1 << 15  # values per slice


def quantize_host(x: Any, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quantize_blocks` of any backend's floats, taken to f32 on the host and checked finite.

    Non-finite values are refused whatever ``check_finite`` says elsewhere: ggml's C has no
    defined result for them (an f64 beyond the f32 range counts as infinite).
    """
    with np.errstate(over="ignore"):
        host = np.asarray(shim.to_host(x)).astype(np.float32)
    check_finite(host, np)
    return quantize_blocks(host, kind)


def _blocks(v: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``(n, per)`` and scales ``(n,)`` of ``n`` scale groups."""
    a = np.abs(v)
    amax = np.max(a, axis=1)
    if kind == "Q8_0":
        d = amax / _F32(127)
        codes = _roundf(v * _inverse(d)[:, None]).astype(np.int8)
        scales = _to_f16(d)
    elif kind == "Q4_0":
        pick = np.take_along_axis(v, np.argmax(a, axis=1)[:, None], axis=1)[:, 0]
        signed = np.where(amax > 0, pick, _F32(0))  # ggml's max stays +0.0 in an all-zero block
        d = (signed / _F32(-8)).astype(_F32)
        with np.errstate(invalid="ignore"):  # 1 / d is infinite below 2**-128: 0 * inf
            q = _trunc_c(v * _inverse(d)[:, None] + _F32(8.5))  # (int8_t) of a value in [0.5, 16.5]
        codes = (np.minimum(q, 15) - 8).astype(np.int8)
        scales = _to_f16(d)
    elif kind == "Q5_0":
        pick = np.take_along_axis(v, np.argmax(a, axis=1)[:, None], axis=1)[:, 0]
        signed = np.where(amax > 0, pick, _F32(0))  # max = 0.0f until an element beats it, as in Q4_0
        d = (signed / _F32(-16)).astype(_F32)
        with np.errstate(invalid="ignore"):  # 1 / d is infinite below 2**-128: 0 * inf
            q = _trunc_c(v * _inverse(d)[:, None] + _F32(16.5))  # (int8_t) of a value in [0.5, 32.5]
        codes = (np.minimum(q, _F32(31)) - _F32(16)).astype(np.int8)
        scales = _to_f16(d)
    elif kind in ("TQ1_0", "TQ2_0"):
        codes = _roundf(v * _inverse(amax)[:, None]).astype(np.int8)
        scales = _to_f16(amax)
    elif kind == "MXFP4":
        with np.errstate(divide="ignore"):
            log2 = np.log2(amax.astype(np.float64)).astype(_F32)  # log2f, correctly rounded
        e = np.where(amax > 0, np.floor(log2) - 2 + 127, 0)
        e = np.clip(np.nan_to_num(e, nan=0.0, neginf=0.0), 0, 255).astype(np.int32)
        half = np.ldexp(_F32(1), e - 128).astype(_F32)  # GGML_E8M0_TO_FP32_HALF: 2^(e - 128), subnormal below 2
        codes = _best_index(v, half)
        scales = (half * _F32(2)).astype(_F32)
    elif kind == "NVFP4":
        ue = _ue4m3((amax / _F32(6)).astype(_F32))
        scale = _ue4m3_value(ue)
        codes = _best_index(v, scale * _F32(0.5))
        scales = scale
    else:  # pragma: no cover - callers pass a KINDS key
        raise KeyError(kind)
    return codes, scales


def quantize_offset_blocks(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's codes, scales and minimums for ``x`` (f32, last axis whole blocks of an offset ``kind``).

    Returns ``(codes, d, m)``: codes uint8 shaped as ``x`` (``0 .. 15`` for Q4_1, ``0 .. 31`` for
    Q5_1), ``d`` and ``m`` f32 (their f16 values, as ggml stores them) shaped
    ``(*x.shape[:-1], x.shape[-1] // 32)``, with ``x = code * d + m`` as ggml dequantizes it (the
    product rounded to f32, then the sum).

    >>> x = np.array([[-1.0, 0.9, 0.95, 2.0] + [0.0] * 28], np.float32)
    >>> codes, d, m = quantize_offset_blocks(x, "Q4_1")  # codes from d = 0.2 in f32, stored d its f16
    >>> codes[0, :4].tolist(), d.tolist(), m.tolist()
    ([0, 10, 10, 15], [[0.199951171875]], [[-1.0]])
    """
    per = OFFSET_KINDS[kind][1]
    x = np.asarray(x, dtype=_F32)
    v = x.reshape(-1, per)
    codes = np.empty(v.shape, np.uint8)
    d, m = np.empty(v.shape[0], _F32), np.empty(v.shape[0], _F32)
    step = max(1, _CHUNK // per)
    for i in range(0, v.shape[0], step):
        codes[i : i + step], d[i : i + step], m[i : i + step] = _offset_blocks(v[i : i + step], kind)
    lead = (*x.shape[:-1], x.shape[-1] // per)
    return codes.reshape(x.shape), d.reshape(lead), m.reshape(lead)


def quantize_offset_host(x: Any, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`quantize_offset_blocks` of any backend's floats, on the host in f32, checked finite."""
    with np.errstate(over="ignore"):
        host = np.asarray(shim.to_host(x)).astype(np.float32)
    check_finite(host, np)
    return quantize_offset_blocks(host, kind)


def _offset_blocks(v: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes ``(n, 32)``, ``d`` and ``m`` ``(n,)`` of ``n`` Q4_1 or Q5_1 blocks."""
    # ggml's loop keeps the first element of least (greatest) value: min's zero keeps its sign
    lo = np.take_along_axis(v, np.argmin(v, axis=1)[:, None], axis=1)[:, 0]
    hi = np.take_along_axis(v, np.argmax(v, axis=1)[:, None], axis=1)[:, 0]
    with np.errstate(over="ignore", invalid="ignore"):  # f32 range overflow and 1 / d = inf: C's UB
        d = ((hi - lo) / _F32(15 if kind == "Q4_1" else 31)).astype(_F32)
        t = _trunc_c((v - lo[:, None]) * _inverse(d)[:, None] + _F32(0.5))  # in [0.5, 31.5]: half up
    if kind == "Q4_1":
        codes = np.minimum(t, _F32(15)).astype(np.uint8)
    elif kind == "Q5_1":
        codes = t.astype(np.uint8)  # (uint8_t), no clamp: the value stays below 32
    else:  # pragma: no cover - callers pass an OFFSET_KINDS key
        raise KeyError(kind)
    return codes, _to_f16(d), _to_f16(lo)
