"""A quantized weight as onnxruntime's ``com.microsoft.MatMulNBits`` initializers, and back.

``MatMulNBits(A, B, scales, zero_points)`` computes ``A @ W.T`` for a weight ``W`` of ``N`` rows and
``K`` columns stored row by row in blocks of ``block_size`` (a power of two, at least 16) along K:
``B`` is uint8 ``(N, K / block_size, block_size * bits / 8)``, two 4-bit codes per byte with the
first in the low nibble; ``scales`` one f32 per block (``N * K / block_size``); each code is
unsigned and ``W = (code - zero_point) * scale``, the zero point ``2^(bits - 1)`` (8 or 128) when
``zero_points`` is absent, else uint8 per block (4-bit ones two per byte, per row, padded to a byte).

arrayquant writes symmetric Q4 / Q8 codes (``q4s``, ``q4f``, ``q8s``, ``q8f``) shifted up by
``2^(bits - 1)`` with no zero points, and zero-point schemes (``u4``, ``u8``, signed with a zero point)
with theirs; the values are the same as the scheme's. Read back, a weight without zero points is
the signed symmetric scheme (``q4f``, ``q8f``), one with them the unsigned zero-point scheme.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import SchemeError
from ...invariants import plan_for
from ...scheme import QuantMode, QuantScheme
from ...storage import pack
from ...tensor import QuantizedTensor
from .qdq import checked, positive_scales

__all__ = ["decode", "encode"]


def encode(qt: QuantizedTensor, name: str) -> tuple[list[Any], dict[str, int]]:
    """``B``, ``scales`` (and ``zero_points``) of a 2-d weight ``qt`` ``(N, K)``, and the node's attributes.

    Raises
    ------
    SchemeError
        A scheme MatMulNBits cannot hold: not 4-bit or 8-bit integer codes, offset mode or a codebook,
        a two-level scheme, blocks not along K, a block that is not a power of two of at least 16, or
        K not a multiple of it.
    """
    from onnx import numpy_helper

    scheme, plan = qt.scheme, plan_for(qt.scheme)
    n, k = qt.shape
    dims = plan.block_dims(qt.shape)
    b = dims[1] if dims else 0
    why = ""
    if scheme.value.is_float or plan.bits not in (4, 8):
        why = "MatMulNBits holds 4-bit and 8-bit integer codes"
    elif scheme.mode not in (QuantMode.SYMMETRIC, QuantMode.ZERO_POINT) or qt.table is not None:
        why = f"{scheme.mode.value} mode has no MatMulNBits form (symmetric and zero-point schemes do)"
    elif not dims or dims[0] != 1:
        why = "MatMulNBits needs one scale per block along K (a scheme such as q4s:block32)"
    elif b < 16 or b & (b - 1) or k % b:
        why = f"MatMulNBits needs a block of a power of two, at least 16, dividing K ({k}); got {b}"
    if why:
        msg = f"scheme {scheme} cannot be written as MatMulNBits: {why}"
        raise SchemeError(msg)
    bits = plan.bits
    mid = 1 << (bits - 1)
    codes = np.asarray(qt.codes()).astype(np.int16)
    blocks = k // b
    zero = None
    if scheme.mode is QuantMode.ZERO_POINT:
        z = np.asarray(qt.zero_point).astype(np.int16).reshape(n, blocks)
        if plan.qmin < 0:  # signed codes and zero points: both shifted up, the differences unchanged
            codes, z = codes + mid, z + mid
        zero = z.astype(np.uint8)
    else:
        codes = codes + mid
    u = codes.astype(np.uint8)
    if bits == 4:
        u = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)
    tensors = [
        numpy_helper.from_array(np.ascontiguousarray(u.reshape(n, blocks, b * bits // 8)), f"{name}_Q{bits}"),
        numpy_helper.from_array(np.asarray(qt.scales, np.float32).reshape(n * blocks), f"{name}_scales"),
    ]
    if zero is not None:
        tensors.append(numpy_helper.from_array(_packed_zero(zero, bits), f"{name}_zero_points"))
    return tensors, {"K": k, "N": n, "bits": bits, "block_size": b}


def _packed_zero(z: np.ndarray, bits: int) -> np.ndarray:
    """Zero points ``(N, blocks)`` as MatMulNBits packs them (4-bit: two a byte, low first, per row)."""
    if bits == 8:
        return z.reshape(-1)
    n, blocks = z.shape
    padded = np.zeros((n, blocks + blocks % 2), np.uint8)
    padded[:, :blocks] = z
    return (padded[:, 0::2] | (padded[:, 1::2] << 4)).astype(np.uint8).reshape(-1)


def decode(
    b_init: np.ndarray, scales: np.ndarray, zero: np.ndarray | None, attrs: dict[str, int], where: str
) -> QuantizedTensor:
    """The ``(N, K)`` weight a MatMulNBits node's initializers stand for; ``where`` names the node in messages."""
    try:
        k, n, bits, block = (int(attrs[a]) for a in ("K", "N", "bits", "block_size"))
    except KeyError as exc:
        msg = f"{where}: MatMulNBits without its {exc.args[0]} attribute"
        raise SchemeError(msg) from None
    if bits not in (4, 8) or block < 16 or block & (block - 1):
        msg = (
            f"{where}: MatMulNBits with bits={bits}, block_size={block} is not read (4 or 8 bits, a power of two >= 16)"
        )
        raise SchemeError(msg)
    blocks = -(-k // block)
    blob = block * bits // 8
    if b_init.dtype != np.uint8 or b_init.size != n * blocks * blob:
        msg = f"{where}: B must be uint8 of {n} x {blocks} x {blob} bytes, got {b_init.dtype} {b_init.shape}"
        raise SchemeError(msg)
    if k % block:
        msg = f"{where}: K ({k}) not a multiple of block_size ({block}) is not read"
        raise SchemeError(msg)
    if scales.size != n * blocks or np.dtype(scales.dtype).name not in ("float32", "float16"):
        msg = f"{where}: scales must be {n * blocks} float32 or float16 values, got {scales.dtype} {scales.shape}"
        raise SchemeError(msg)
    raw = b_init.reshape(n, blocks * blob)
    u = np.stack((raw & 15, raw >> 4), axis=-1).reshape(n, k) if bits == 4 else raw.reshape(n, k)
    sdt = "f32" if scales.dtype == np.float32 else "f16"
    grid = np.asarray(scales, np.float32).reshape(n, blocks)
    value = f"u{bits}" if bits == 4 else "u8"
    if zero is None and np.any(np.signbit(grid)):  # negative scales: mirrored blocks need zero points
        zero = _packed_zero(np.full((n, blocks), 1 << (bits - 1), np.uint8), bits)
    if zero is None:  # the default zero point 2^(bits - 1): signed symmetric codes
        scheme = QuantScheme.parse(f"q{bits}f:block{block}:{sdt}:native")
        codes = (u.astype(np.int16) - (1 << (bits - 1))).astype(np.int8)
        return checked(QuantizedTensor(scheme, (n, k), np.float32, pack(codes, scheme), grid), where)
    if zero.dtype != np.uint8:
        msg = f"{where}: zero points of type {zero.dtype} are not read (uint8 ones are)"
        raise SchemeError(msg)
    per_row = -(-blocks * bits // 8)
    if zero.size != n * per_row:
        msg = f"{where}: zero_points must hold {n * per_row} bytes, got {zero.size}"
        raise SchemeError(msg)
    zr = zero.reshape(n, per_row)
    z = np.stack((zr & 15, zr >> 4), axis=-1).reshape(n, -1)[:, :blocks] if bits == 4 else zr
    u, grid, z2 = positive_scales(
        u.astype(np.uint8), grid, z.astype(np.uint8), (1, block), (n, k), bits=bits, signed=False, floats=False
    )
    assert z2 is not None
    z = z2
    scheme = QuantScheme.parse(f"{value}:block{block}:{sdt}:native:zero_point")
    qt = QuantizedTensor(scheme, (n, k), np.float32, pack(u.astype(np.uint8), scheme), grid, zero_point=z.copy())
    return checked(qt, where)
