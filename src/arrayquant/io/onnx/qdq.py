"""A quantized weight as the initializers of one ``DequantizeLinear`` (opset 21+), and back.

ONNX's ``DequantizeLinear`` computes ``y = (x - zero_point) * scale`` with one scale per tensor, per
index of ``axis`` (a 1-d scale), or per ``block_size`` run along ``axis`` (a scale of the data's rank).
An arrayquant weight ``(N, K)`` with blocks along K maps onto it exactly:

=========================  ===============================================================
arrayquant                 ONNX
=========================  ===============================================================
q8s, q8f                   INT8 codes, no zero point
u8 / q8f zero point        UINT8 / INT8 codes and zero points
q4s, q4f                   INT4 codes, no zero point
u4 / q4f zero point        UINT4 / INT4 codes and zero points
e4m3, e5m2                 FLOAT8E4M3FN, FLOAT8E5M2 codes
e2m1 (NVFP4, MXFP4)        FLOAT4E2M1 codes (opset 23)
stored scale               ``scale`` in f32: the effective scale, ``min(g * s, F32_MAX)`` for a
                           two-level scheme (NVFP4), so one node holds it; values are equal
=========================  ===============================================================

Offset mode (``x = d * q + m``), lookup codebooks and widths other than 4 and 8 bits have no
``DequantizeLinear`` form and are refused with a message. Read back, a tensor keeps the
orientation and blocks of the ONNX data (``K x 1`` blocks for a ``MatMul`` weight ``(K, N)``),
its codes and scales exactly, with native storage and f32 (or the scale's f16 / bf16) scales.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as compat
import numpy as np

from ...errors import SchemeError
from ...invariants import plan_for
from ...scheme import QuantMode, QuantScheme, QuantValue
from ...storage import pack
from ...tensor import QuantizedTensor

__all__ = ["checked", "decode", "effective_scales", "encode", "opset_for", "positive_scales"]

_F32_MAX = np.float32(np.finfo(np.float32).max)


def checked(qt: QuantizedTensor, where: str) -> QuantizedTensor:
    """``qt`` once its scales and zero points pass the invariant layer's checks (a typed error naming ``where``)."""
    from ...invariants import check_params, check_zero
    from ...scheme import QParams

    plan = plan_for(qt.scheme)
    stored = QParams(qt.scales, qt.global_scale, qt.table, qt.zero_point, qt.offset)
    xp, device = compat.array_namespace(qt.values), compat.device(qt.values)
    check_params(stored, plan, qt.shape, xp, device, what=where)
    check_zero(stored, plan, qt.shape, xp, device, what=where)
    return qt


def _ml() -> Any:
    import ml_dtypes

    return ml_dtypes


def _code_dtype(qt: QuantizedTensor) -> Any:
    """The ml_dtypes / NumPy dtype ONNX stores the codes of ``qt`` in, or a SchemeError saying why none."""
    scheme = qt.scheme
    ml = _ml()
    floats = {QuantValue.E4M3: ml.float8_e4m3fn, QuantValue.E5M2: ml.float8_e5m2, QuantValue.E2M1: ml.float4_e2m1fn}
    if scheme.mode is QuantMode.LOOKUP or qt.table is not None:
        why = "a lookup codebook has no DequantizeLinear form"
    elif scheme.mode is QuantMode.OFFSET:
        why = "offset mode (x = d * q + m) has no DequantizeLinear form (its zero point is an integer code)"
    elif scheme.value in floats:
        return floats[scheme.value]
    elif scheme.value.is_float:
        why = f"{scheme.value.value} has no ONNX type"
    else:
        plan = plan_for(scheme)
        signed = plan.qmin < 0
        if plan.bits == 8:
            return np.int8 if signed else np.uint8
        if plan.bits == 4:
            return ml.int4 if signed else ml.uint4
        why = f"{plan.bits}-bit codes have no ONNX type (4 and 8 bits do)"
    msg = f"scheme {scheme} cannot be written as a DequantizeLinear: {why}"
    raise SchemeError(msg)


def opset_for(qt: QuantizedTensor) -> int:
    """The default-domain opset the node needs: 21 (blocked quantization, INT4), 23 for FLOAT4E2M1."""
    return 23 if qt.scheme.value is QuantValue.E2M1 else 21


def effective_scales(qt: QuantizedTensor) -> np.ndarray:
    """The f32 scales that multiply the codes: the stored ones, or ``min(g * s, F32_MAX)`` (two-level)."""
    s = np.asarray(qt.scales, dtype=np.float32)
    if qt.global_scale is None:
        return s
    with np.errstate(over="ignore"):
        return np.minimum(np.float32(np.asarray(qt.global_scale).reshape(-1)[0]) * s, _F32_MAX).astype(np.float32)


def encode(qt: QuantizedTensor, name: str, *, transpose: bool) -> tuple[list[Any], dict[str, Any]]:
    """The initializers (codes, scale, zero point) and the node attributes of ``qt`` as a ``DequantizeLinear``.

    ``qt`` is a 2-d weight ``(N, K)`` with one scale per tensor, per row or per block along K. With
    ``transpose`` the node yields ``qt``'s transpose ``(K, N)`` (a ``MatMul`` weight): codes and scales
    are written transposed and the blocks run along axis 0. The initializers are named
    ``{name}_quantized``, ``{name}_scale`` and ``{name}_zero_point``.
    """
    from onnx import numpy_helper

    dtype = _code_dtype(qt)
    n, k = qt.shape
    dims = plan_for(qt.scheme).block_dims(qt.shape)
    if dims and dims[0] != 1:
        msg = f"scheme {qt.scheme} has blocks spanning rows; DequantizeLinear blocks run along one axis"
        raise SchemeError(msg)
    codes = np.asarray(qt.codes())
    codes = codes.astype(np.uint8).view(dtype) if qt.scheme.value.is_float else codes.astype(dtype)
    scales = effective_scales(qt).reshape(n, -1) if dims else effective_scales(qt).reshape(())
    zero = None if qt.zero_point is None else np.asarray(qt.zero_point).astype(dtype).reshape(scales.shape)
    attrs: dict[str, Any] = {}
    if not dims:
        pass  # one scale: a scalar
    elif dims[1] >= k:  # per row of W: one scale per output, along N
        scales, zero = scales[:, 0], None if zero is None else zero[:, 0]
        attrs["axis"] = 1 if transpose else 0
    else:
        attrs["axis"], attrs["block_size"] = (0 if transpose else 1), int(dims[1])
        if transpose:
            scales, zero = scales.T, None if zero is None else zero.T
    if transpose:
        codes = codes.T
    tensors = [
        numpy_helper.from_array(np.ascontiguousarray(codes), f"{name}_quantized"),
        numpy_helper.from_array(np.ascontiguousarray(scales), f"{name}_scale"),
    ]
    if zero is not None:
        tensors.append(numpy_helper.from_array(np.ascontiguousarray(zero), f"{name}_zero_point"))
    return tensors, attrs


def _value(dtype: np.dtype, has_zero: bool) -> tuple[str, bool]:
    """The arrayquant value of ONNX codes of ``dtype`` and whether the codes are signed integers."""
    ml = _ml()
    table = {
        np.dtype(np.int8): ("q8f", True),
        np.dtype(np.uint8): ("u8", False),
        np.dtype(ml.int4): ("q4f", True),
        np.dtype(ml.uint4): ("u4", False),
        np.dtype(ml.float8_e4m3fn): ("e4m3", False),
        np.dtype(ml.float8_e5m2): ("e5m2", False),
        np.dtype(ml.float4_e2m1fn): ("e2m1", False),
    }
    if np.dtype(dtype) not in table:
        msg = f"DequantizeLinear codes of type {dtype} are not read (int8, uint8, int4, uint4, float8, float4 are)"
        raise SchemeError(msg)
    return table[np.dtype(dtype)]


def decode(
    x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, axis: int, block_size: int, where: str
) -> QuantizedTensor:
    """The :class:`QuantizedTensor` a ``DequantizeLinear`` of initializers ``x``, ``scale``, ``zero`` stands for.

    ``where`` names the node in messages. Raises :class:`SchemeError` for what arrayquant cannot hold
    (a scale or zero point of the wrong shape, codes of another type, a float scale type other than
    f32 / f16 / bf16).
    """
    value, signed = _value(x.dtype, zero is not None)
    rank = x.ndim
    if rank == 0:
        msg = f"{where}: a 0-d quantized initializer is not read as a tensor"
        raise SchemeError(msg)
    scale_dtype = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(np.dtype(scale.dtype).name)
    if scale_dtype is None:
        msg = f"{where}: scale of type {scale.dtype} (float32, float16 and bfloat16 are read)"
        raise SchemeError(msg)
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < rank:
        msg = f"{where}: axis {axis} is outside the data's {rank} axes"
        raise SchemeError(msg)
    shape = tuple(int(d) for d in x.shape)
    if block_size == 0 and scale.ndim <= 1 and scale.size == 1:  # one scale (a scalar, or one entry)
        dims: tuple[int, ...] = ()
        grid: tuple[int, ...] = (1,)
    elif block_size == 0:
        if scale.shape != (shape[ax],):
            msg = f"{where}: a per-axis scale must have shape ({shape[ax]},), got {scale.shape}"
            raise SchemeError(msg)
        dims = tuple(1 if i == ax else d for i, d in enumerate(shape))
        grid = tuple(shape[ax] if i == ax else 1 for i in range(rank))
    else:
        want = tuple(-(-d // block_size) if i == ax else d for i, d in enumerate(shape))
        if scale.shape != want:
            msg = f"{where}: a scale blocked by {block_size} along axis {ax} must have shape {want}, got {scale.shape}"
            raise SchemeError(msg)
        dims = tuple(block_size if i == ax else 1 for i in range(rank))
        grid = want
    nonzero = zero is not None and bool(np.any(np.asarray(zero).astype(np.float32) != 0))
    if zero is not None and zero.shape != scale.shape:
        msg = f"{where}: zero point shape {zero.shape} differs from the scale's {scale.shape}"
        raise SchemeError(msg)
    if zero is not None and zero.dtype != x.dtype:
        msg = f"{where}: zero point type {zero.dtype} differs from the codes' {x.dtype}"
        raise SchemeError(msg)
    if value.startswith("e") and nonzero:
        msg = f"{where}: a float8 / float4 zero point other than 0 is not read"
        raise SchemeError(msg)
    floats = value.startswith("e")
    if floats:
        codes = np.ascontiguousarray(x).view(np.uint8).copy()
    else:
        codes = np.asarray(x).astype(np.int8 if signed else np.uint8)
    scales = np.asarray(scale, dtype=np.float32).reshape(grid)
    zp = None if zero is None or floats else np.asarray(zero).astype(np.int8 if signed else np.uint8).reshape(grid)
    bits = {"q8f": 8, "u8": 8, "q4f": 4, "u4": 4, "e4m3": 8, "e5m2": 8, "e2m1": 4}[value]
    codes, scales, zp = positive_scales(codes, scales, zp, dims, shape, bits=bits, signed=signed, floats=floats)
    affine = not floats and (not signed or (zp is not None and bool(np.any(zp != 0))))
    block = "tensor" if not dims else "block" + "x".join(str(d) for d in dims)
    scheme = QuantScheme.parse(f"{value}:{block}:{scale_dtype}:native" + (":zero_point" if affine else ""))
    extra: dict[str, Any] = {}
    if affine:
        extra["zero_point"] = (np.zeros(grid, np.uint8) if zp is None else zp).reshape(grid)
    return checked(QuantizedTensor(scheme, shape, np.float32, pack(codes, scheme), scales, **extra), where)


def positive_scales(
    codes: np.ndarray,
    scales: np.ndarray,
    zero: np.ndarray | None,
    dims: tuple[int, ...],
    shape: tuple[int, ...],
    *,
    bits: int,
    signed: bool,
    floats: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Codes, scales and zero points with every scale made non-negative, the values unchanged.

    Some writers (onnxruntime's symmetric MatMulNBits quantizer) store negative scales; arrayquant's
    scales are never negative. Where a scale is negative (or -0.0) its block is mirrored: integer
    codes and zero points complemented within their width (``q -> ~q``: ``(~q - ~z) * |s|`` is
    ``(q - z) * s`` exactly; a block without a zero point gets the complement of 0), a minifloat's
    sign bit flipped. ``dims`` are the block extents over data of ``shape`` (``()``: one scale).
    """
    neg = np.signbit(scales)
    if not neg.any():
        return codes, scales, zero
    mask = neg.reshape(()) if not dims else neg
    for axis, d in enumerate(dims):
        mask = np.repeat(mask, d, axis=axis)
    if dims:
        mask = mask[tuple(slice(0, n) for n in shape)]
    if floats:
        sign = np.uint8(1 << (bits - 1))
        return np.where(mask, codes ^ sign, codes), np.abs(scales), zero
    top = (1 << bits) - 1
    if signed:
        flip = lambda a: (-1 - a.astype(np.int16)).astype(np.int8)
    else:
        flip = lambda a: (top - a.astype(np.int16)).astype(np.uint8)
    z = np.zeros(scales.shape, codes.dtype) if zero is None else zero
    return np.where(mask, flip(codes), codes), np.abs(scales), np.where(neg, flip(z), z)
