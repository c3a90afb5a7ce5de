"""Burn's byte layout: ``[values][scales at the innermost scale dtype][f32 global, two-level]``.

Dense and little-endian. Scales are encoded exactly: a stored scale is already on its dtype's
grid, so each encoding below is a bit-exact change of representation, not a rounding.

The affine modes are arrayquant's extension of this layout (Burn has no zero points): after
the scales come the zero points, one byte each (int8, or uint8 for unsigned values), or the
offsets, each in the scale dtype, in the scale grid's row-major order.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat as compat
import numpy as np

from ...backends import default, shim
from ...errors import CorruptDataError, DTypeError, MissingGlobalScaleError, ParamsError
from ...invariants import Plan, check_params, check_scale_values, check_shape, check_zero, namespace_of, plan_for
from ...kernels import round_up_scales
from ...scheme import QParams, QuantMode, QuantScheme, QuantValue, ScaleDtype
from ...storage import check_values, values_layout, zero_nbytes
from ...tensor import QuantizedTensor

__all__ = ["check_codes", "decode_scales", "encode_scales", "from_bytes", "to_bytes"]

_WIDE = {"int8": "i1", "uint8": "u1", "uint32": "<u4"}


def _exponent(v: np.ndarray) -> np.ndarray:
    """``floor(log2(v))`` exactly, for positive finite f32 ``v`` (frexp, no log2)."""
    return np.frexp(v)[1].astype(np.int32) - 1


def encode_scales(s: np.ndarray, dtype: ScaleDtype) -> bytes:
    """Stored f32 scales as ``dtype`` bytes; refuses scales that are not on the grid."""
    s = np.ascontiguousarray(s, dtype=np.float32).reshape(-1)
    # the signed dtypes keep a sign bit (ggml's negative Q4_0 scales): their magnitude is on the grid
    mag = np.abs(s) if dtype in (ScaleDtype.F32, ScaleDtype.F16, ScaleDtype.BF16) else s
    with np.errstate(all="ignore"):
        on_grid = round_up_scales(mag, dtype, xp=np)
    # 0 stands for UE8M0's smallest value on backends that flush 2^-127 to zero
    ok = (on_grid == mag) | ((dtype is ScaleDtype.UE8M0) & (s == 0))
    if not np.all(ok):
        i = int(np.argmin(ok))
        msg = (
            f"scale {float(s[i])} at flat index {i} is not a stored {dtype.name} value; a QuantizedTensor "
            "holds rounded-up scales, so build it with aq.quantize or round with aq.round_up_scales"
        )
        raise ParamsError(msg)
    if dtype is ScaleDtype.F32:
        return s.astype("<f4").tobytes()
    if dtype is ScaleDtype.F16:
        return s.astype("<f2").tobytes()
    if dtype is ScaleDtype.BF16:
        return (s.view(np.uint32) >> 16).astype("<u2").tobytes()
    codes = np.zeros(s.shape, dtype=np.uint8)
    pos = s > 0
    if dtype is ScaleDtype.UE8M0:
        codes[pos] = (_exponent(s[pos]) + 127).astype(np.uint8)
        return codes.tobytes()
    # UE4M3: e4m3 bit pattern without the sign; subnormals below 2^-6 in steps of 2^-9
    e = np.maximum(_exponent(np.where(pos, s, 1)), -6)
    mant = np.where(s >= 2.0**-6, s / np.ldexp(1.0, e) - 1, s / 2.0**-6) * 8
    field = np.where(s >= 2.0**-6, e + 7, 0)
    codes = ((field << 3) + mant.astype(np.int32)).astype(np.uint8)
    return codes.tobytes()


def decode_scales(raw: bytes, dtype: ScaleDtype, count: int) -> np.ndarray:
    """f32 scales from ``count`` encoded ``dtype`` values; undecodable codes are corrupt data."""
    if dtype is ScaleDtype.F32:
        return np.frombuffer(raw, dtype="<f4", count=count).astype(np.float32)
    if dtype is ScaleDtype.F16:
        return np.frombuffer(raw, dtype="<f2", count=count).astype(np.float32)
    if dtype is ScaleDtype.BF16:
        bits = np.frombuffer(raw, dtype="<u2", count=count).astype(np.uint32) << 16
        return bits.view(np.float32)
    codes = np.frombuffer(raw, dtype=np.uint8, count=count).astype(np.int32)
    if dtype is ScaleDtype.UE8M0:
        bad = codes == 0xFF
        out = np.ldexp(np.float32(1), np.minimum(codes, 254) - 127).astype(np.float32)
    else:
        bad = (codes & 0x80 != 0) | (codes == 0x7F)
        field, mant = codes >> 3, (codes & 7).astype(np.float32)
        out = np.where(field == 0, mant * 2.0**-9, np.ldexp(1 + mant / 8, field - 7)).astype(np.float32)
    if np.any(bad):
        i = int(np.argmax(bad))
        msg = (
            f"scale code 0x{codes[i]:02X} at index {i} is not a {dtype.name} scale (NaN or signed); the data is corrupt"
        )
        raise CorruptDataError(msg)
    return out


def check_codes(values: np.ndarray, plan: Plan, what: str) -> None:
    """Stored values read from outside that no decoder could read are corrupt data.

    Every int8 value decodes (as ``eff * code``) and packed fields are masked to their width,
    but E2M1 in a native store keeps one 4-bit code per byte: a byte above 0x0F is no code.
    """
    if not plan.value.is_burn and not plan.value.is_float and not plan.scheme.store.is_packed:
        flat = np.asarray(values).reshape(-1)
        bad = (flat < plan.qmin) | (flat > plan.qmax)
        if np.any(bad):
            i = int(np.argmax(bad))
            msg = (
                f"{what}: {int(flat[i])} at flat index {i} is not a {plan.value.name} code ({plan.qmin}..{plan.qmax}); "
                "the data is corrupt"
            )
            raise CorruptDataError(msg)
    if plan.value is QuantValue.E2M1 and not plan.scheme.store.is_packed:
        bad = np.asarray(values).reshape(-1) > 0x0F
        if np.any(bad):
            i = int(np.argmax(bad))
            msg = (
                f"{what}: byte 0x{int(np.asarray(values).reshape(-1)[i]):02X} at flat index {i} is not an E2M1 "
                "code (a native store holds one 4-bit code, 0x00-0x0F, per byte); the data is corrupt"
            )
            raise CorruptDataError(msg)


def to_bytes(qt: QuantizedTensor) -> bytes:
    """The Burn byte layout of ``qt``: values, then scales in their dtype, then the f32 global.

    Parameters
    ----------
    qt : QuantizedTensor
        Any backend; its arrays are read to the host.

    Returns
    -------
    bytes
        Little-endian, exactly :func:`quantized_nbytes` long.

    Raises
    ------
    ParamsError, ShapeError
        A tensor whose scales or values do not fit its scheme and shape.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.QuantizedTensor(aq.QuantScheme.parse("q8s:block4:ue4m3:tensor:f32:native"), (8,),
    ...     np.float32, np.array([0, 25, 51, 76, 102, 127, -128, -1], np.int8),
    ...     np.array([0.5, 0.125], np.float32), np.array([3.0], np.float32))
    >>> aq.to_bytes(qt).hex(" ")
    '00 19 33 4c 66 7f 80 ff 30 20 00 00 40 40'

    An affine tensor's zero points (or offsets) follow its scales:

    >>> qt = aq.quantize(np.array([-1.0, 0.0, 2.0, 3.0], np.float32), "u8:zero_point:native")
    >>> aq.to_bytes(qt).hex(" ")  # codes, the f32 scale 4/255, the zero point 64
    '00 40 bf ff 81 80 80 3c 40'
    """
    if not isinstance(qt, QuantizedTensor):
        msg = f"qt must be an aq.QuantizedTensor, got {type(qt).__name__}"
        raise ParamsError(msg)
    plan = plan_for(qt.scheme)
    shape = check_shape(qt.shape, "qt.shape")
    xp = namespace_of(qt.values, "qt.values")
    stored = QParams(qt.scales, qt.global_scale, qt.table, qt.zero_point, qt.offset)
    scales, glob, _ = check_params(stored, plan, shape, xp, compat.device(qt.values), what="qt")
    zero = check_zero(stored, plan, shape, xp, compat.device(qt.values), what="qt")
    check_values(qt.values, plan, shape, xp, "qt.values")
    _, vdtype = values_layout(plan, shape)
    values = np.ascontiguousarray(shim.to_host(qt.values)).astype(_WIDE[vdtype], copy=False)
    parts = [values.tobytes(), encode_scales(shim.to_host(scales), plan.scale_dtype)]
    if plan.mode is QuantMode.ZERO_POINT:
        parts.append(np.asarray(shim.to_host(zero)).astype(plan.code_dtype).reshape(-1).tobytes())
    elif plan.mode is QuantMode.OFFSET:
        parts.append(encode_scales(shim.to_host(zero), plan.scale_dtype))
    if glob is not None:
        parts.append(np.asarray(shim.to_host(glob), dtype="<f4").reshape(-1).tobytes())
    return b"".join(parts)


def from_bytes(
    buf: bytes | bytearray | memoryview,
    scheme: QuantScheme | str,
    shape: tuple[int, ...],
    *,
    backend: str | None = None,
    device: Any = None,
) -> QuantizedTensor:
    """Read the Burn byte layout back into a tensor on ``backend``/``device``, checking everything.

    Parameters
    ----------
    buf : bytes, bytearray or memoryview
        Exactly :func:`quantized_nbytes` of the scheme and shape.
    scheme : QuantScheme or str
        The scheme the bytes were written with (the layout does not record it). Lookup schemes
        need a named codebook (``"nf4"``): the layout has no room for a table.
    shape : int or tuple of int
        The data's shape.
    backend, device : optional
        Where the arrays go (default: the default backend and its default device).

    Returns
    -------
    QuantizedTensor

    Raises
    ------
    MissingGlobalScaleError
        A two-level scheme whose buffer is 4 bytes short (no global scale).
    CorruptDataError
        Any other length, or codes or scales the scheme cannot produce (NaN scales, E2M1 bytes
        above 0x0F, ...).
    DTypeError
        ``buf`` is not a contiguous bytes-like object.
    SchemeError, ShapeError, ParamsError
        An invalid scheme or shape (more than 32 axes included), a lookup scheme without codebook.

    Examples
    --------
    >>> import arrayquant as aq
    >>> buf = bytes.fromhex("00 19 33 4C 66 7F 80 FF 30 20 00 00 40 40")
    >>> qt = aq.from_bytes(buf, "q8s:block4:ue4m3:tensor:f32:native", (8,), backend="numpy")
    >>> qt.scales.tolist(), qt.global_scale.tolist(), aq.dequantize(qt).tolist()[:3]
    ([0.5, 0.125], [3.0], [0.0, 37.5, 76.5])
    """
    plan = plan_for(scheme if isinstance(scheme, QuantScheme) else QuantScheme.parse(scheme))
    shape = check_shape(shape)
    if plan.scheme.mode is QuantMode.LOOKUP and plan.scheme.codebook is None:
        msg = (
            f"scheme {plan.scheme} looks its values up in a table of your own, which the Burn byte layout does "
            "not hold; build the tensor with aq.QuantizedTensor(..., table=...) instead, or use a scheme "
            "with a named codebook (such as nf4)"
        )
        raise ParamsError(msg)
    try:
        raw = memoryview(buf).cast("B").tobytes()
    except (TypeError, ValueError, BufferError) as exc:  # not a buffer; non-contiguous; a dtype with no format
        msg = (
            f"buf must be a contiguous bytes-like object (bytes, bytearray, memoryview), got "
            f"{type(buf).__name__} ({exc})"
        )
        raise DTypeError(msg) from None
    vshape, vdtype = values_layout(plan, shape)
    n_scales = math.prod(plan.grid_shape(shape))
    value_bytes = math.prod(vshape) * np.dtype(_WIDE[vdtype]).itemsize
    scale_bytes = n_scales * plan.scale_dtype.nbytes
    zero_bytes = n_scales * zero_nbytes(plan)
    glob_bytes = 4 if plan.two_level else 0
    want = value_bytes + scale_bytes + zero_bytes + glob_bytes
    if len(raw) != want:
        layout = f"values {value_bytes} + scales {n_scales}x{plan.scale_dtype.nbytes} = {scale_bytes}" + (
            " + per-tensor scale 4" if glob_bytes else ""
        )
        if zero_bytes:
            layout += f" + {plan.mode.value.replace('_', ' ')}s {n_scales}x{zero_nbytes(plan)} = {zero_bytes}"
        if plan.two_level and len(raw) == want - 4:
            msg = (
                f"buffer of {len(raw)} bytes for the two-level scheme {plan.scheme} on shape {shape} is exactly "
                f"4 bytes short: the f32 per-tensor scale is missing ({layout} = {want}); append the "
                "per-tensor scale as 4 little-endian bytes, or re-export the tensor with it"
            )
            raise MissingGlobalScaleError(msg)
        region = "values" if len(raw) < value_bytes else "scales" if len(raw) < value_bytes + scale_bytes else None
        where = f"; the {region} region is cut short" if region and len(raw) < want else ""
        msg = (
            f"buffer has {len(raw)} bytes but scheme {plan.scheme} on shape {shape} needs exactly {want} "
            f"({layout}); it is {abs(len(raw) - want)} bytes {'short' if len(raw) < want else 'long'}{where}. "
            "Check the scheme and shape it was written with"
        )
        raise CorruptDataError(msg)
    values = np.frombuffer(raw, dtype=_WIDE[vdtype], count=math.prod(vshape)).reshape(vshape)
    values = values.astype(vdtype)
    check_codes(values, plan, "stored values")
    scales = decode_scales(raw[value_bytes : value_bytes + scale_bytes], plan.scale_dtype, n_scales)
    scales = scales.reshape(plan.grid_shape(shape))
    check_scale_values(scales, "stored scales", np, signed=plan.signed_scales)
    glob = None
    if plan.two_level:
        glob = np.frombuffer(raw[value_bytes + scale_bytes :], dtype="<f4", count=1).astype(np.float32)
        check_scale_values(glob, "stored per-tensor scale", np)
    zp = offset = None
    zero_raw = raw[value_bytes + scale_bytes : value_bytes + scale_bytes + zero_bytes]
    if plan.mode is QuantMode.ZERO_POINT:
        zp = np.frombuffer(zero_raw, dtype=plan.code_dtype, count=n_scales).reshape(plan.grid_shape(shape))
        flat = zp.reshape(-1)
        bad = (flat < plan.qmin) | (flat > plan.qmax)
        if np.any(bad):
            i = int(np.argmax(bad))
            msg = (
                f"stored zero point {int(flat[i])} at index {i} lies outside the {plan.value.name} code range "
                f"{plan.qmin}..{plan.qmax}; the data is corrupt"
            )
            raise CorruptDataError(msg)
        zp = zp.copy()
    elif plan.mode is QuantMode.OFFSET:
        offset = decode_scales(zero_raw, plan.scale_dtype, n_scales).reshape(plan.grid_shape(shape))
        check_scale_values(offset, "stored offsets", np, signed=True)
    name = backend or default().name
    move = lambda a: None if a is None else shim.convert(a, name, device)
    xp = shim.namespace(name)
    return QuantizedTensor(
        plan.scheme, shape, xp.float32, move(values), move(scales), move(glob), zero_point=move(zp), offset=move(offset)
    )
