"""Storage of codes: native arrays, PackedU32 words, PackedNative bytes, and their sizes."""

from __future__ import annotations

import math
from typing import Any

from .backends import shim
from .errors import DTypeError, ShapeError
from .invariants import Plan, check_shape, namespace_of, plan_for
from .kernels import pack_fields, packed_length, unpack_fields
from .kernels import pack_unit as _unit
from .scheme import QuantMode, QuantScheme

__all__ = [
    "check_values",
    "pack",
    "pack_codes",
    "pack_unit",
    "quantized_nbytes",
    "unpack",
    "unpack_values",
    "values_layout",
    "zero_nbytes",
]


def _word_bits(plan: Plan) -> int:
    return 32 if plan.store_kind == "packed_u32" else 8


def pack_unit(plan: Plan) -> tuple[int, int]:
    """``(fields, words)`` of the packed axis's smallest whole run (``(1, 1)`` for a native store).

    ``32 / bits`` fields in one word for 1, 2, 4 and 8 bits; a 3-bit PackedU32 line repeats every
    32 fields in 3 words. Slabs and chunks along the packed axis are cut at whole units.
    """
    if not plan.scheme.store.is_packed:
        return 1, 1
    return _unit(plan.bits, _word_bits(plan))


def values_layout(plan: Plan, shape: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """Shape and dtype name of the stored values for data of ``shape``."""
    axis = plan.packed_axis(len(shape))
    if axis is None:
        return shape, plan.code_dtype
    word_bits = _word_bits(plan)
    stored = packed_length(shape[axis], plan.bits, word_bits)
    return (*shape[:axis], stored, *shape[axis + 1 :]), "uint32" if word_bits == 32 else "uint8"


def quantized_nbytes(scheme: QuantScheme | str, shape: tuple[int, ...]) -> int:
    """Exact length of the Burn byte layout: values, scales, then zero points or offsets, then the f32 global.

    Parameters
    ----------
    scheme : QuantScheme or str
        The scheme, or its text form (``"q4s:block32:f16"``, a preset such as ``"nvfp4"``).
    shape : int or tuple of int
        The data's shape (an int is 1-d).

    Returns
    -------
    int
        The byte count :func:`to_bytes` writes and :func:`from_bytes` expects.

    Raises
    ------
    SchemeError, ShapeError
        An invalid scheme; a shape with no axes, an extent below 1, more than 32 axes, or a
        packed axis the data lacks.

    Examples
    --------
    >>> quantized_nbytes("q8s:block4:ue4m3:tensor:f32:native", (8,))
    14
    >>> quantized_nbytes("q4s", (3, 3))  # each line padded to a whole word
    16
    >>> quantized_nbytes("u4:block32:f16:offset", (64,))  # 8 words, 2 f16 scales, 2 f16 offsets
    40
    """
    plan = plan_for(QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme)
    shape = check_shape(shape)
    vshape, dtype = values_layout(plan, shape)
    item = {"int8": 1, "uint8": 1, "uint32": 4}[dtype]
    n_scales = math.prod(plan.grid_shape(shape))
    return math.prod(vshape) * item + n_scales * (plan.scale_dtype.nbytes + zero_nbytes(plan)) + 4 * plan.two_level


def zero_nbytes(plan: Plan) -> int:
    """Bytes of one zero point (1: int8 or uint8 as the codes) or offset (the scale dtype's), else 0."""
    if plan.mode is QuantMode.ZERO_POINT:
        return 1
    return plan.scale_dtype.nbytes if plan.mode is QuantMode.OFFSET else 0


def pack_codes(codes: Any, plan: Plan, *, xp: Any) -> Any:
    """Codes (int8 or uint8) in the scheme's storage form."""
    axis = plan.packed_axis(codes.ndim)
    if axis is None:
        return codes
    word_bits = _word_bits(plan)
    packed = pack_fields(codes, plan.bits, axis, word_bits, xp=xp)
    return shim.bytes_to_words(packed, axis, xp=xp) if word_bits == 32 else packed


def unpack_values(values: Any, plan: Plan, rank: int, n: int, *, xp: Any) -> Any:
    """Codes from stored values; ``n`` is the unpadded length along the packed axis."""
    axis = plan.packed_axis(rank)
    if axis is None:
        return values
    raw = shim.words_to_bytes(values, axis, xp=xp) if plan.store_kind == "packed_u32" else values
    return unpack_fields(raw, plan.bits, axis, n, signed=plan.code_dtype == "int8", xp=xp)


def check_values(values: Any, plan: Plan, shape: tuple[int, ...], xp: Any, name: str = "values") -> None:
    """Stored values must have the dtype and shape the scheme gives data of ``shape``."""
    want_shape, want_dtype = values_layout(plan, shape)
    dtype = getattr(xp, want_dtype)
    if values.dtype != dtype or tuple(values.shape) != want_shape:
        msg = (
            f"{name} of dtype {values.dtype} and shape {tuple(values.shape)} do not fit scheme "
            f"{plan.scheme} for data of shape {shape}: expected {want_dtype} {want_shape}; build them with "
            "aq.quantize or aq.pack"
        )
        raise ShapeError(msg)


def pack(codes: Any, scheme: QuantScheme | str) -> Any:
    """Pack codes along the scheme's packed axis (``rank - 1 - dim``) into its storage.

    Parameters
    ----------
    codes : array
        int8 codes (signed integer values), uint8 codes (unsigned ``u1`` .. ``u8``, E4M3/E5M2/E2M1),
        at least 1-d.
    scheme : QuantScheme or str
        The scheme, or its text form (``"q4s:block32:f16"``, a preset such as ``"nvfp4"``).

    Returns
    -------
    array
        The stored values: the codes themselves for a native store, uint32 words for
        ``packed_u32`` and uint8 bytes for ``packed_native``. Each line along the packed axis is
        one little-endian bit stream (field k in stream bits ``[k*bits, (k+1)*bits)``, so a 3-,
        5-, 6- or 7-bit field may cross a word), zero-padded to whole words.

    Raises
    ------
    DTypeError
        Codes of the wrong dtype for the value kind.
    ShapeError
        0-d codes, or a packed axis the codes lack.
    SchemeError
        An invalid scheme.

    Examples
    --------
    >>> import numpy as np
    >>> words = pack(np.array([[1, -1, 2]], dtype=np.int8), "q4s")
    >>> hex(int(words[0, 0]))
    '0x2f1'
    >>> pack(np.array([5, 1, 7], dtype=np.uint8), "u3:zero_point:packed_native").tolist()  # 101 001 111
    [205, 1]
    """
    plan = plan_for(QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme)
    xp = namespace_of(codes, "codes")
    want = getattr(xp, plan.code_dtype)
    if codes.dtype != want:
        msg = f"codes must be {plan.code_dtype} for {plan.value.name}, got {codes.dtype}; use QuantizedTensor.codes()"
        raise DTypeError(msg)
    if codes.ndim == 0:
        msg = f"codes has shape {tuple(codes.shape)}, but packing needs at least one axis; reshape to (1,)"
        raise ShapeError(msg)
    return pack_codes(codes, plan, xp=xp)


def unpack(values: Any, scheme: QuantScheme | str, shape: tuple[int, ...]) -> Any:
    """Codes of data of ``shape`` from stored ``values`` (int8, or uint8 for float values).

    Parameters
    ----------
    values : array
        Stored values as :func:`pack` (or :func:`quantize`) made them.
    scheme : QuantScheme or str
        The scheme, or its text form (``"q4s:block32:f16"``, a preset such as ``"nvfp4"``).
    shape : int or tuple of int
        The data's shape (an int is 1-d, as in NumPy); it gives the unpadded packed length.

    Returns
    -------
    array
        int8 codes (signed integer values, sign-extended) or uint8 codes (unsigned and float
        values) of ``shape``.

    Raises
    ------
    ShapeError
        A shape with no axes or more than 32, or values of the wrong dtype or shape for it.
    SchemeError
        An invalid scheme.

    Examples
    --------
    >>> import numpy as np
    >>> unpack(np.array([0x2F1], dtype=np.uint32), "q4s", 3).tolist()
    [1, -1, 2]
    """
    plan = plan_for(QuantScheme.parse(scheme) if isinstance(scheme, str) else scheme)
    xp = namespace_of(values, "values")
    if isinstance(shape, tuple) and not shape:
        msg = f"shape {shape!r} has no axes, but unpack needs at least one axis; pass the data's shape, e.g. (n,)"
        raise ShapeError(msg)
    shape = check_shape(shape)
    check_values(values, plan, shape, xp)
    axis = plan.packed_axis(len(shape))
    return unpack_values(values, plan, len(shape), shape[axis] if axis is not None else 0, xp=xp)
