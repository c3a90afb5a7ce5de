"""A plain-NumPy oracle for the affine modes and the odd widths, written from the contract alone.

Block by block and line by line, in Python ints and NumPy f32 scalars: the zero-point mode
(``x = s * (q - z)``), the offset mode (``x = d * q + m``), symmetric codes of any width, and
the dense little-endian bit streams of the packed stores. It never calls arrayquant's kernels.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .oracle import round_up

F32 = np.float32
F32_MAX = float(np.finfo(np.float32).max)


def value_range(value: str) -> tuple[int, int, int]:
    """``(bits, qmin, qmax)`` from the value's name: ``u<b>``, ``q<b>f`` or ``q<b>s``."""
    if value.startswith("u"):
        b = int(value[1:])
        return b, 0, 2**b - 1
    b = int(value[1:-1])
    top = 2 ** (b - 1) - 1
    return b, (-top - 1 if value.endswith("f") else -top), top


_NARROW = {"f16": (np.float16, 65504.0), "bf16": (ml_dtypes.bfloat16, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max))}


def _step_down(v: np.ndarray, narrow: type) -> np.ndarray:
    """The next value of the narrow dtype below each ``v`` (sign-magnitude bit patterns)."""
    bits = v.astype(narrow).view(np.uint16).astype(np.int64)
    neg = (bits & 0x8000) != 0
    mag = bits & 0x7FFF
    down = np.where(neg, bits + 1, np.where(mag == 0, 0x8001, bits - 1))
    return down.astype(np.uint16).view(narrow).astype(F32)


def round_down(m: np.ndarray, dtype: str) -> np.ndarray:
    """The largest ``dtype`` value not above each f32 ``m`` (saturating at the dtype's largest magnitude)."""
    m = np.asarray(m, dtype=F32)
    if dtype == "f32":
        return m + F32(0)
    narrow, top = _NARROW[dtype]
    clipped = np.clip(m, F32(-top), F32(top))
    near = clipped.astype(narrow).astype(F32)
    out = np.where(near > clipped, _step_down(near, narrow), near).astype(F32)
    return out + F32(0)


@dataclass(frozen=True)
class Case:
    """An affine or odd-width scheme in the oracle's terms (``mode``: symmetric, zero_point, offset)."""

    value: str
    mode: str
    block: tuple[int, ...] | None
    scale: str
    store: str = "native"
    dim: int = 0

    @property
    def text(self) -> str:
        parts = [self.value]
        if self.block is not None:
            parts += ["block" + "x".join(map(str, self.block)), self.scale]
        else:
            parts += ["tensor", self.scale]
        if self.mode != "symmetric":
            parts.append(self.mode)
        parts.append(self.store if self.dim == 0 else f"{self.store}:{self.dim}")
        return ":".join(parts)


def blocks(shape: tuple[int, ...], block: tuple[int, ...] | None):
    """``(grid index, slices)`` of every block of data of ``shape``, row-major."""
    if block is None:
        yield (0,) * len(shape), tuple(slice(0, n) for n in shape)
        return
    dims = (1,) * (len(shape) - len(block)) + tuple(block)
    dims = tuple(min(b, n) for b, n in zip(dims, shape, strict=True))
    counts = [-(-n // b) for n, b in zip(shape, dims, strict=True)]
    for idx in itertools.product(*(range(c) for c in counts)):
        yield idx, tuple(slice(i * b, min((i + 1) * b, n)) for i, b, n in zip(idx, dims, shape, strict=True))


def grid_of(shape: tuple[int, ...], block: tuple[int, ...] | None) -> tuple[int, ...]:
    if block is None:
        return (1,)
    dims = (1,) * (len(shape) - len(block)) + tuple(block)
    return tuple(-(-n // min(b, n)) for n, b in zip(shape, dims, strict=True))


def _round(y: np.ndarray, rounding: str) -> np.ndarray:
    if rounding == "half_even":
        return np.rint(y)
    return np.where(np.abs(y - np.trunc(y)) == 0.5, np.trunc(y) + np.sign(y), np.rint(y))  # ties away from 0


def _spread(hi: F32, lo: F32, n: int) -> F32:
    with np.errstate(over="ignore"):
        diff = F32(hi - lo)
    if np.isinf(diff):
        return F32(F32(hi / F32(n)) - F32(lo / F32(n)))
    return F32(diff / F32(n))


def block_params(lo: F32, hi: F32, case: Case) -> tuple[F32, F32 | None]:
    """The stored scale and zero point (f32 integer) or offset of a block whose range is ``(lo, hi)``."""
    _, qmin, qmax = value_range(case.value)
    with np.errstate(divide="ignore", invalid="ignore"):
        if case.mode == "symmetric":
            alpha = max(abs(lo), abs(hi))
            return round_up(np.array([F32(alpha) / F32((qmax - qmin) / 2)], F32), case.scale)[0], None
        if case.mode == "zero_point":
            lo0, hi0 = min(lo, F32(0)), max(hi, F32(0))
            s = round_up(np.array([_spread(hi0, lo0, qmax - qmin)], F32), case.scale)[0]
            z = F32(0) if s == 0 else F32(np.clip(np.rint(F32(qmin) - F32(lo0 / s)), qmin, qmax))
            return s, z
        m = round_down(np.array([lo], F32), case.scale)[0]
        return round_up(np.array([_spread(hi, m, qmax)], F32), case.scale)[0], m


def block_codes(blk: np.ndarray, s: F32, z: F32 | None, case: Case, rounding: str = "half_even") -> np.ndarray:
    """Codes (as f32 integers) of a block's values under its stored parameters."""
    _, qmin, qmax = value_range(case.value)
    with np.errstate(divide="ignore", invalid="ignore"):
        if case.mode == "offset":
            y = (blk - z) / s if s != 0 else np.zeros_like(blk)
            return np.clip(_round(y, rounding), 0, qmax)
        y = blk / s if s != 0 else np.zeros_like(blk)
        return np.clip(_round(y, rounding) + (z if case.mode == "zero_point" else F32(0)), qmin, qmax)


def block_values(q: np.ndarray, s: F32, z: F32 | None, case: Case) -> np.ndarray:
    """f32 values of a block's codes: ``s * q``, ``(q - z) * s`` or ``d * q + m``."""
    q = q.astype(np.int64)
    with np.errstate(over="ignore"):
        if case.mode == "symmetric":
            y = q.astype(F32) * s
        elif case.mode == "zero_point":
            y = (q - int(z)).astype(F32) * s
        else:
            y = (q.astype(F32) * s).astype(F32) + z
    return np.clip(y, -F32_MAX, F32_MAX).astype(F32)


def quantize(x: np.ndarray, case: Case, rounding: str = "half_even"):
    """``(codes, scales, zero)``: codes of ``x``'s shape, the stored grids (zero None when symmetric)."""
    x = np.asarray(x, dtype=F32)
    shape = x.shape
    grid = grid_of(shape, case.block)
    codes = np.zeros(shape, np.uint8 if case.value.startswith("u") else np.int8)
    scales = np.zeros(grid, F32)
    zero = np.zeros(grid, F32) if case.mode != "symmetric" else None
    for idx, sl in blocks(shape, case.block):
        blk = x[sl]
        gi = idx if case.block is not None else (0,)
        s, z = block_params(F32(blk.min()), F32(blk.max()), case)
        scales[gi] = s
        if zero is not None:
            zero[gi] = z
        codes[sl] = block_codes(blk, s, z, case, rounding).astype(codes.dtype)
    return codes, scales, zero


def dequantize(codes: np.ndarray, scales: np.ndarray, zero: np.ndarray | None, case: Case) -> np.ndarray:
    """f32 values, block by block: ``s * q``, ``(q - z) * s`` or ``d * q + m``."""
    out = np.zeros(codes.shape, F32)
    for idx, sl in blocks(codes.shape, case.block):
        gi = idx if case.block is not None else (0,)
        out[sl] = block_values(codes[sl], scales[gi], None if zero is None else zero[gi], case)
    return out


def pack(codes: np.ndarray, bits: int, axis: int, word_bits: int) -> np.ndarray:
    """Each line along ``axis`` as one little-endian bit stream in words of ``word_bits``, zero-padded."""
    moved = np.moveaxis(codes, axis, -1)
    n = moved.shape[-1]
    n_words = -(-n * bits // word_bits)
    out = np.zeros((*moved.shape[:-1], n_words), np.uint32 if word_bits == 32 else np.uint8)
    for lead in itertools.product(*(range(k) for k in moved.shape[:-1])):
        stream = 0
        for k, c in enumerate(moved[lead].tolist()):
            stream |= (int(c) & ((1 << bits) - 1)) << (k * bits)
        for w in range(n_words):
            out[lead + (w,)] = (stream >> (w * word_bits)) & ((1 << word_bits) - 1)
    return np.moveaxis(out, -1, axis)
