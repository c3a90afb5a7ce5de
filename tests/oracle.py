"""An independent oracle in plain NumPy (and ml_dtypes) for the numerical contract.

It follows the contract (docs/spec.md) directly, element by element and block by block, and never calls
arrayquant's kernels: the library is checked against it, codes and stored scales exactly.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import ml_dtypes
import numpy as np

F32_TINY = np.float32(1.1754944e-38)
F32_MAX = float(np.finfo(np.float32).max)

VALUES = {  # name: (bits, a, b)
    "q8f": (8, -128, 127),
    "q4f": (4, -8, 7),
    "q2f": (2, -2, 1),
    "q8s": (8, -127, 127),
    "q4s": (4, -7, 7),
    "q2s": (2, -1, 1),
}
FLOATS = {  # name: (bits, ml_dtypes type, max)
    "e4m3": (8, ml_dtypes.float8_e4m3fn, 448.0),
    "e5m2": (8, ml_dtypes.float8_e5m2, 57344.0),
    "e2m1": (4, ml_dtypes.float4_e2m1fn, 6.0),
}
SCALE_MAX = {"f16": 65504.0, "bf16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), "ue4m3": 448.0, "ue8m0": 2.0**127}


def _next_up(v: np.ndarray, dtype: type, bits: type) -> np.ndarray:
    """The next representable value above non-negative ``v`` of a narrow float dtype."""
    raw = v.astype(dtype).view(bits)
    return (raw + bits(1)).view(dtype).astype(np.float32)


def round_up(s: np.ndarray, dtype: str) -> np.ndarray:
    """Stored value of f32 scales ``s``: the smallest ``dtype`` value not below each one."""
    s = np.asarray(s, dtype=np.float32)
    if dtype == "f32":
        return s + np.float32(0.0)
    if dtype == "ue8m0":  # smallest power of two not below s, from frexp: s = m * 2^e, m in [0.5, 1)
        with np.errstate(all="ignore"):
            m, e = np.frexp(s.astype(np.float64))
            up = np.where(m == 0.5, s.astype(np.float64), np.ldexp(1.0, e))
            up = np.where(np.isinf(s), 2.0**127, np.where(s == 0, 0.0, up))
            out = np.clip(up, 2.0**-127, 2.0**127).astype(np.float32)
        return np.where(np.isnan(s), np.float32(np.nan), out)
    narrow, bits = {
        "f16": (np.float16, np.uint16),
        "bf16": (ml_dtypes.bfloat16, np.uint16),
        "ue4m3": (ml_dtypes.float8_e4m3fn, np.uint8),
    }[dtype]
    top = np.float32(SCALE_MAX[dtype])
    with np.errstate(all="ignore"):
        clipped = np.minimum(s, top)  # keeps NaN; avoids the narrow cast overflowing
        near = clipped.astype(narrow).astype(np.float32)  # round to nearest even
        below = near < clipped
        out = np.where(below, _next_up(np.where(below, near, 0), narrow, bits), near)
    return out.astype(np.float32) + np.float32(0.0)


@dataclass(frozen=True)
class Case:
    """A scheme in the oracle's terms."""

    value: str
    block: tuple[int, ...] | None  # canonical block extents, None = per tensor
    scale: str  # innermost scale dtype
    two_level: bool = False
    store: str = "native"
    dim: int = 0

    @property
    def text(self) -> str:
        parts = [self.value]
        if self.block is not None:
            parts += ["block" + "x".join(map(str, self.block)), self.scale]
            if self.two_level:
                parts += ["tensor", "f32"]
        elif self.scale != "f32":
            parts += ["tensor", self.scale]
        parts.append(self.store if self.dim == 0 else f"{self.store}:{self.dim}")
        return ":".join(parts)


def _blocks(shape: tuple[int, ...], block: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
    dims = (1,) * (len(shape) - len(block)) + block
    grid = [range(-(-n // b)) for n, b in zip(shape, dims, strict=False)]
    return [
        (idx, tuple(slice(i * b, min((i + 1) * b, n)) for i, b, n in zip(idx, dims, shape, strict=False)))
        for idx in itertools.product(*grid)
    ]


def float_codes(y: np.ndarray, value: str) -> np.ndarray:
    """ml_dtypes' codes of ``y`` after clipping to ±max; NaN is code 0 for E2M1 (no NaN there)."""
    _, kind, top = FLOATS[value]
    with np.errstate(all="ignore"):
        codes = np.clip(y.astype(np.float32), -top, top).astype(kind).view(np.uint8)
    return np.where(np.isnan(y), 0, codes).astype(np.uint8) if value == "e2m1" else codes


def float_values(codes: np.ndarray, value: str) -> np.ndarray:
    return codes.astype(np.uint8).view(FLOATS[value][1]).astype(np.float32)


def value_range(value: str) -> tuple[int, float, float]:
    if value in FLOATS:
        bits, _, top = FLOATS[value]
        return bits, -top, top
    return VALUES[value]


def effective(glob: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """``g * s_r`` of a two-level scheme: exact in f64, saturated at the f32 maximum, rounded to f32."""
    return np.minimum(np.float64(glob[0]) * stored.astype(np.float64), F32_MAX).astype(np.float32)


def quantize(x: np.ndarray, case: Case, rounding: str = "half_even", table: np.ndarray | None = None):
    """Codes (int8, or uint8 for float values), stored scales (f32 grid) and the global."""
    x = np.asarray(x, dtype=np.float32)
    bits, a, b = value_range(case.value)
    is_float = case.value in FLOATS
    span = np.float32(b - a)
    if case.block is None:
        alpha = np.maximum(np.abs(x.min()), np.abs(x.max())).reshape(1)
        regions = [((0,), tuple(slice(None) for _ in x.shape))]
    else:
        regions = _blocks(x.shape, case.block)
        grid = tuple(max(i[d] for i, _ in regions) + 1 for d in range(x.ndim))
        alpha = np.zeros(grid, dtype=np.float32)
        for idx, sl in regions:
            alpha[idx] = max(abs(x[sl].min()), abs(x[sl].max()))
    if table is None:
        # in f64, then one rounding to f32: the correctly rounded quotient, with no overflow of 2 * alpha
        s = (alpha.astype(np.float64) * 2.0 / float(span)).astype(np.float32)
    else:
        s = alpha / np.float32(np.abs(table).max())
    glob = None
    if case.two_level:
        g = np.float32(s.max()) / np.float32(SCALE_MAX[case.scale])
        g = np.maximum(g, F32_TINY)
        s = s / g
        glob = np.array([g], dtype=np.float32)
    stored = round_up(s, case.scale)
    eff = stored if glob is None else effective(glob, stored)
    codes = np.zeros(x.shape, dtype=np.uint8 if is_float else np.int8)
    for idx, sl in regions:
        e = eff.reshape(-1)[0] if case.block is None else eff[idx]
        if e == 0:
            continue  # zero-scale rule: codes stay 0
        y = x[sl] / e
        if table is not None:  # nearest entry, first (lowest) index on ties, stored as a signed field
            idx = np.argmin(np.abs(y[..., None] - table), axis=-1).astype(np.int16)
            half = 1 << (bits - 1)
            codes[sl] = ((idx ^ half) - half).astype(np.int8)
            continue
        if is_float:
            codes[sl] = float_codes(y, case.value)
            continue
        if rounding == "half_even":
            r = np.round(y)
        else:  # Rust f32::round, computed exactly in f64
            y64 = y.astype(np.float64)
            r = (np.sign(y64) * np.floor(np.abs(y64) + 0.5)).astype(np.float32)
        codes[sl] = np.clip(r, a, b).astype(np.int8)
    return codes, stored, glob


def dequantize(
    codes: np.ndarray, stored: np.ndarray, glob: np.ndarray | None, case: Case, table: np.ndarray | None = None
) -> np.ndarray:
    """``eff * code`` in f32, element by element from the block map."""
    eff = stored if glob is None else effective(glob, stored)
    out = np.zeros(codes.shape, dtype=np.float32)
    regions = (
        [((0,), tuple(slice(None) for _ in codes.shape))] if case.block is None else _blocks(codes.shape, case.block)
    )
    for idx, sl in regions:
        e = eff.reshape(-1)[0] if case.block is None else eff[idx]
        if table is not None:
            q = table[codes[sl].astype(np.int64) & ((1 << value_range(case.value)[0]) - 1)]
        elif case.value in FLOATS:
            q = float_values(codes[sl], case.value)
        else:
            q = codes[sl].astype(np.float32)
        # the exact product in f64, saturated at the f32 maximum, then rounded to f32
        prod = q.astype(np.float64) * np.float64(e)
        out[sl] = np.clip(prod, -F32_MAX, F32_MAX).astype(np.float32)
    return out


def pack_u32(codes: np.ndarray, bits: int, dim: int) -> np.ndarray:
    """Burn's PackedU32 words along axis ``rank - 1 - dim``, first field in the low bits."""
    axis = codes.ndim - 1 - dim
    moved = np.moveaxis(codes.astype(np.int64) & ((1 << bits) - 1), axis, -1)
    per_word = 32 // bits
    n = moved.shape[-1]
    words = np.zeros((*moved.shape[:-1], -(-n // per_word)), dtype=np.uint64)
    for i in range(n):
        words[..., i // per_word] |= moved[..., i].astype(np.uint64) << np.uint64((i % per_word) * bits)
    return np.moveaxis(words.astype(np.uint32), -1, axis)


def pack_native(codes: np.ndarray, dim: int) -> np.ndarray:
    """PackedNative bytes along axis ``rank - 1 - dim``: element 2k low nibble, 2k+1 high."""
    axis = codes.ndim - 1 - dim
    moved = np.moveaxis(codes.astype(np.uint8) & 0xF, axis, -1)
    if moved.shape[-1] % 2:
        moved = np.concatenate([moved, np.zeros(moved.shape[:-1] + (1,), np.uint8)], axis=-1)
    return np.moveaxis(moved[..., 0::2] | (moved[..., 1::2] << 4), -1, axis)
