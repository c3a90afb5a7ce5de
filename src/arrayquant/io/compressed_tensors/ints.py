"""Integer weights (1 to 8 bits, symmetric or with zero points, per tensor, row or group) in compressed-tensors' layout.

compressed-tensors (0.20.1, read in site-packages) stores a weight-only integer ``Linear``
weight ``<name>`` in the ``pack-quantized`` format as these safetensors entries:

- ``<name>.weight_packed``: int32, shape ``(rows, ceil(cols * bits / 32))``. Each row is one
  little-endian bit stream: element ``i`` sits in stream bits ``[i * bits, (i + 1) * bits)``,
  stream bit ``j`` being bit ``j % 32`` of word ``j // 32``, so a 3-, 5-, 6- or 7-bit field may
  cross into the next word. A field holds ``code + 2 ** (bits - 1)`` (unsigned); unused high
  bits of the last word are zero. (``compressors/pack_quantized/helpers.py``, ``pack_to_int32``:
  "dense cross-element packing", the offset ``1 << (num_bits - 1)``; ``unpack_from_int32``
  subtracts it again.) This is arrayquant's own bit stream of ``u{bits}`` fields packed along
  the rows (``u4:packed_u32``), which the codec here packs and unpacks with.
- ``<name>.weight_scale``: the scales in the scale dtype (float32 / float16 / bfloat16), shape
  ``(rows, cols // group_size)`` for ``strategy: group``, ``(rows, 1)`` for ``channel``, ``(1,)``
  for ``tensor``.
- ``<name>.weight_shape``: int64 ``(2,)``, the unpacked shape (``torch.tensor(weight.shape)``).
- ``<name>.weight_zero_point``, only when ``symmetric`` is false (``compression_param_names``):
  for ``group`` and ``channel``, the zero points of the scale grid ``(rows, groups)`` packed the
  same way but down the columns of the grid (``pack_to_int32(zero_point, num_bits,
  packed_dim=0)``): int32 of shape ``(ceil(rows * bits / 32), groups)``, each field
  ``z + 2 ** (bits - 1)``; for ``tensor``, one unpacked int8 ``z`` of shape ``(1,)``.

8-bit weights without activation quantization are ``pack-quantized`` too
(``PackedQuantizationCompressor.can_compress``: INT, 1 <= num_bits <= 8; ``int-quantized`` is
chosen first only when ``input_activations`` is set, e.g. W8A8). ``int-quantized`` (and
``naive-quantized``) store the codes unpacked as ``<name>.weight`` int8, for any width (W4AFP8,
W4A8 and W2A8 write 4- and 2-bit codes so), and zero points unpacked as int8 of the grid's
shape; :func:`read` takes both.

Ranges. compressed-tensors' integer range is ``[-2 ** (bits - 1), 2 ** (bits - 1) - 1]``
(``quantization/utils/helpers.py``, ``_calculate_range``), i.e. arrayquant's ``q{bits}f``
(``Q8F``, ``Q4F``, ``Q2F``, ``q3f`` ... ``q7f``); its symmetric observer scale is
``amax / ((q_max - q_min) / 2)`` (``amax / 7.5`` for 4 bits), so its own weights do use the code
``-8``. Its zero points lie in the same range (``calculate_qparams`` clamps them there). The
symmetric ranges ``q{bits}s`` are subsets: they are written bit for bit, and read back as the
full-range value unless ``value=`` names the symmetric one (a ``-2 ** (bits - 1)`` code or zero
point is then corrupt data for that value). Unsigned codes ``u{bits}`` with zero points are the
same stored bits: the field is the unsigned code, and ``z`` is stored as ``z_u - 2 ** (bits -
1)``; ``value="u4"`` reads them so (``u1``, which has no signed twin, is the default for one bit).

Arithmetic. compressed-tensors dequantizes as ``(code.to(scale.dtype) - zero_point.to(
scale.dtype)) * scale`` (``forward_helpers._dequantize``; no zero point for symmetric weights),
so its decompressed weight is in the scale dtype, rounded there; arrayquant computes
``f32(scale) * (code - z)``, the difference exact in integers. The difference (at most 255 in
magnitude) is exact in bfloat16 and float16 too, and its f32 product with an f16 (11 significant
bits) or bf16 (8) scale is exact, so ``aq.dequantize(qt)`` cast to the scale dtype equals
compressed-tensors' result bit for bit; with f32 scales both round the same f32 product.
Measured in tests/test_ct_int.py and tests/test_ct_affine.py (every width, per-tensor / per-row /
per-group, f32/f16/bf16 scales, both directions): 0 differing bits. Before that cast,
arrayquant's f32 result differs from compressed-tensors' bf16/f16 one by the bf16/f16 rounding of
the product (at most half an ulp of the scale dtype). One difference remains in
``aq.dequantize(qt)`` to float16 itself: where ``|(code - z) * scale|`` passes the f16 maximum
(compressed-tensors' own 2-bit observer makes this possible, as its scale is ``amax / 1.5`` and
the code -2 reaches ``1.33 * amax``), compressed-tensors gives +-inf and arrayquant saturates to
+-65504. A tensor read here has the scale dtype as its dtype, as compressed-tensors'
decompressed weight does.

Rounding: compressed-tensors quantizes with ``torch.round`` (half to even) of ``x / scale + z``
and clamps to its range; arrayquant rounds ``x / scale`` and then adds the integer ``z`` (ONNX's
order). The two agree but where adding ``z`` in floating point moves ``x / scale`` onto a tie
(``0.49999997 + 1`` is ``1.5`` in f32): only the stored codes and parameters cross here, and each
side decodes them alike.

Not mapped (``weight_args`` returns None): offsets, lookup modes, two-level schemes, float
values, 2-D blocks (compressed-tensors' int ``block`` strategy), scale dtypes other than
F32/F16/BF16, and tensors that are not 2-D.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...backends import default, shim
from ...errors import CorruptDataError, DTypeError, ParamsError, SchemeError, ShapeError
from ...scheme import BlockSize, QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype
from ...storage import pack, unpack
from ...tensor import QuantizedTensor

__all__ = ["FORMATS", "read", "weight_args", "write"]

PACK, INT, NAIVE = "pack-quantized", "int-quantized", "naive-quantized"
FORMATS = (PACK, INT, NAIVE)
PACKED, SCALE, SHAPE, WEIGHT, ZERO = "weight_packed", "weight_scale", "weight_shape", "weight", "weight_zero_point"

# arrayquant's integer values -> bits; compressed-tensors' own (full, signed) value of each width
_BITS = {v: v.bits for v in QuantValue if not v.is_float}
_FULL = {b: QuantValue(f"q{b}f") for b in range(2, 9)}
_SCALE_NAMES = {ScaleDtype.F32: "float32", ScaleDtype.F16: "float16", ScaleDtype.BF16: "bfloat16"}
_MODES = (QuantMode.SYMMETRIC, QuantMode.ZERO_POINT)


def _bf16() -> Any:
    try:
        import ml_dtypes
    except ImportError:
        msg = "bfloat16 scales need ml_dtypes (pip install ml_dtypes)"
        raise DTypeError(msg) from None
    return np.dtype(ml_dtypes.bfloat16)


def _key(name: str, part: str) -> str:
    return f"{name}.{part}" if name else part


def _fields_scheme(bits: int, rows: bool = True) -> QuantScheme:
    """``u{bits}`` packed into uint32 words along the rows (or down the columns): compressed-tensors' bit stream."""
    return QuantScheme(QuantValue(f"u{bits}"), QuantStore.packed_u32(0 if rows else 1), QuantMode.ZERO_POINT)


def _shift(value: QuantValue) -> int:
    """What turns an arrayquant code of ``value`` into compressed-tensors' stored field (``code + 2**(b-1)``)."""
    return 0 if value.is_unsigned else 1 << (value.bits - 1)


def _group(scheme: QuantScheme) -> int | None:
    """The group size of a mapped block scheme (0 for per-tensor), None when it does not map."""
    if (
        scheme.value not in _BITS
        or scheme.mode not in _MODES
        or (scheme.mode is QuantMode.SYMMETRIC and scheme.value.is_unsigned)
        or scheme.codebook is not None
        or scheme.is_two_level
        or scheme.scale_dtype not in _SCALE_NAMES
    ):
        return None
    if scheme.block is None:
        return 0
    dims = scheme.block[0].dims
    if len(dims) == 2 and dims[0] == 1:  # [1, g]: the same blocks, one row high
        return dims[1]
    return dims[0] if len(dims) == 1 else None


def weight_args(scheme: QuantScheme, *, shape: tuple[int, ...] | None = None) -> tuple[str, dict[str, Any]] | None:
    """The compressed-tensors format and ``weights`` arguments of ``scheme``, or None if it does not map.

    Parameters
    ----------
    scheme : QuantScheme
        An integer value of 1 to 8 bits (``q2f`` ... ``q8f``, ``q2s`` ... ``q8s``, or ``u1`` ...
        ``u8`` with zero points), symmetric or with a zero point, one level: per-tensor, or a
        1-D block ``[g]`` (``[1, g]`` is the same block) with F32, F16 or BF16 scales.
    shape : tuple of int, optional
        The weight's shape. When the block spans its whole last axis (per-row: a block at least
        as long as the row, which arrayquant clamps to it), the strategy is ``channel`` instead
        of ``group`` (both store the same entries and dequantize alike).

    Returns
    -------
    tuple of (str, dict) or None
        ``("pack-quantized", args)`` with ``args`` as compressed-tensors'
        ``QuantizationArgs.model_dump(mode="json")`` writes them (``symmetric: false`` for zero points).

    Examples
    --------
    >>> from arrayquant import QuantScheme
    >>> weight_args(QuantScheme().with_value("q4s").per_block(128, "bf16"))[1]["strategy"]
    'group'
    >>> weight_args(QuantScheme().with_value("q8s").per_block(64), shape=(32, 64))[1]["strategy"]
    'channel'
    >>> args = weight_args(QuantScheme.parse("u5:block32:f16:zero_point"))[1]
    >>> args["num_bits"], args["symmetric"]
    (5, False)
    >>> weight_args(QuantScheme.nvfp4()) is None
    True
    """
    group = _group(scheme)
    if group is None:
        return None
    if group == 0:
        strategy, group_size = "tensor", None
    elif shape is not None and len(shape) >= 1 and shape[-1] <= group:  # a block clamps to the row
        strategy, group_size = "channel", None
    else:
        strategy, group_size = "group", group
    args: dict[str, Any] = {
        "num_bits": _BITS[scheme.value],
        "type": "int",
        "symmetric": scheme.mode is QuantMode.SYMMETRIC,
        "group_size": group_size,
        "strategy": strategy,
        "dynamic": False,
        "scale_dtype": f"torch.{_SCALE_NAMES[scheme.scale_dtype]}",
    }
    return PACK, args


_SLAB = 1 << 18  # elements per step of the (un)packing below: temporaries of a few MiB


def _pack_rows(fields: np.ndarray, bits: int) -> np.ndarray:
    """Stored fields (uint8, ``code + 2**(bits-1)``) of shape (rows, cols) as compressed-tensors' int32 words."""
    rows, cols = fields.shape
    out = np.empty((rows, -(-cols * bits // 32)), np.int32)
    step = max(1, _SLAB // max(cols, 1))
    for r0 in range(0, rows, step):  # a slab of rows at a time: no full-size temporaries
        out[r0 : r0 + step] = np.asarray(pack(fields[r0 : r0 + step], _fields_scheme(bits))).view(np.int32)
    return out


def _unpack_rows(packed: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """The inverse of :func:`_pack_rows`: uint8 fields (rows, cols); bits past ``cols`` are ignored."""
    words = np.ascontiguousarray(packed).view(np.uint32)
    rows = words.shape[0]
    out = np.empty((rows, cols), np.uint8)
    step = max(1, _SLAB // max(cols, 1))
    for r0 in range(0, rows, step):
        part = words[r0 : r0 + step]
        out[r0 : r0 + step] = np.asarray(unpack(part, _fields_scheme(bits), (part.shape[0], cols)))
    return out


def _as_fields(codes: np.ndarray, value: QuantValue) -> np.ndarray:
    """Codes of ``value`` as compressed-tensors' stored fields, uint8."""
    return (codes.astype(np.int16) + _shift(value)).astype(np.uint8)


def _as_codes(fields: np.ndarray, value: QuantValue) -> np.ndarray:
    """Stored fields as codes of ``value``: int8 for signed values, uint8 for unsigned ones."""
    if value.is_unsigned:
        return fields.astype(np.uint8, copy=False)
    return (fields.astype(np.int16) - _shift(value)).astype(np.int8)


def _packed_words(qt: QuantizedTensor, shape: tuple[int, int], bits: int) -> np.ndarray:
    """compressed-tensors' words of ``qt``'s codes, unpacked and repacked a slab of rows at a time."""
    rows, cols = shape
    scheme, value = qt.scheme, qt.scheme.value
    values = np.asarray(shim.to_host(qt.values))
    if value.is_unsigned and scheme.store == QuantStore.packed_u32(0):  # already the same bit stream
        return values.view(np.int32).copy()
    if scheme.store.is_packed and scheme.store.dim != 0:  # packed down the columns: slabs of rows would split words
        return _pack_rows(_as_fields(np.asarray(shim.to_host(qt.codes())).reshape(shape), value), bits)
    out = np.empty((rows, -(-cols * bits // 32)), np.int32)
    step = max(1, _SLAB // cols)
    for r0 in range(0, rows, step):
        r1 = min(r0 + step, rows)
        codes = np.asarray(unpack(values[r0:r1], scheme, (r1 - r0, cols)))
        out[r0:r1] = _pack_rows(_as_fields(codes, value), bits)
    return out


def _zero_entry(qt: QuantizedTensor, strategy: str, bits: int) -> np.ndarray:
    """The ``weight_zero_point`` entry: packed down the grid's columns, or one int8 for ``tensor``."""
    fields = _as_fields(np.asarray(shim.to_host(qt.zero_point)), qt.scheme.value)
    if strategy == "tensor":
        return (fields.astype(np.int16) - (1 << (bits - 1))).astype(np.int8).reshape(1)
    grid = fields.reshape(qt.shape[0], -1)
    return np.asarray(pack(grid, _fields_scheme(bits, rows=False))).view(np.int32)


def write(qt: QuantizedTensor, name: str) -> dict[str, np.ndarray]:
    """The compressed-tensors ``pack-quantized`` entries of an integer tensor, as NumPy arrays.

    Parameters
    ----------
    qt : QuantizedTensor
        A 2-D tensor whose scheme :func:`weight_args` maps, in any store and on any backend.
    name : str
        The module prefix (``"model.layers.0.mlp.down_proj"``); ``""`` for unprefixed keys.

    Returns
    -------
    dict of str to numpy.ndarray
        ``weight_packed`` (int32), ``weight_scale`` (float32, float16 or ml_dtypes bfloat16, as
        the scheme's scale dtype), ``weight_shape`` (int64) and, for a zero-point scheme,
        ``weight_zero_point`` (int32 words, or one int8 per tensor).

    Raises
    ------
    ParamsError
        ``qt`` is not a QuantizedTensor.
    SchemeError
        The scheme does not map (see :func:`weight_args`).
    ShapeError
        The tensor is not 2-D, or a group does not divide the columns.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.array([[7.0, -7.0, 1.0, 0.0]], np.float32), aq.QuantScheme().with_value("q4s").per_block(4))
    >>> write(qt, "fc")["fc.weight_packed"].view(np.uint32).tolist()
    [[35103]]
    >>> zp = aq.quantize(np.array([[-1.0, 0.0, 0.5, 2.0]], np.float32), "u4:block4:f32:zero_point")
    >>> zp.zero_point.tolist(), write(zp, "fc")["fc.weight_zero_point"].tolist()  # fields z: 5, little end
    ([[5]], [[5]])
    """
    if not isinstance(qt, QuantizedTensor):
        msg = f"qt must be an aq.QuantizedTensor, got {type(qt).__name__}"
        raise ParamsError(msg)
    mapped = weight_args(qt.scheme, shape=tuple(qt.shape))
    if mapped is None:
        msg = (
            f"compressed-tensors pack-quantized does not hold the scheme {qt.scheme}; it takes integer values of "
            "1 to 8 bits (q2f ... q8f, q2s ... q8s, symmetric or with zero points; u1 ... u8 with zero points), "
            "per-tensor or with a 1-D block [g], and f32/f16/bf16 scales"
        )
        raise SchemeError(msg)
    args = mapped[1]
    shape = tuple(int(n) for n in qt.shape)
    if len(shape) != 2 or min(shape) < 1:
        msg = f"tensor of shape {shape}: compressed-tensors pack-quantized stores 2-D (rows, cols) Linear weights"
        raise ShapeError(msg)
    rows, cols = shape
    group = args["group_size"]
    if group is not None and cols % group:
        msg = (
            f"tensor of shape {shape}: compressed-tensors needs the columns to be a multiple of the group "
            f"size {group} (it refuses ragged groups); pad the input or pick a group that divides {cols}"
        )
        raise ShapeError(msg)
    bits = args["num_bits"]
    packed = _packed_words(qt, shape, bits)
    scales = np.asarray(shim.to_host(qt.scales), np.float32)
    scales = scales.reshape((1,) if args["strategy"] == "tensor" else (rows, -1))
    sdt = qt.scheme.scale_dtype
    scale_np = scales.astype(_bf16() if sdt is ScaleDtype.BF16 else _SCALE_NAMES[sdt])
    if not np.array_equal(scale_np.astype(np.float32), scales, equal_nan=True):
        msg = f"qt.scales are not all {sdt.name} values; build the tensor with aq.quantize"
        raise ParamsError(msg)
    out = {
        _key(name, PACKED): packed,
        _key(name, SCALE): scale_np,
        _key(name, SHAPE): np.array(shape, np.int64),
    }
    if not args["symmetric"]:
        out[_key(name, ZERO)] = _zero_entry(qt, args["strategy"], bits)
    return out


def _host(entries: Mapping[str, Any], key: str) -> np.ndarray:
    try:
        return np.asarray(shim.to_host(entries[key]))
    except KeyError:
        raise
    except (TypeError, ValueError, RuntimeError) as exc:
        msg = f"entry {key!r} could not be read as a host array ({exc}); pass NumPy arrays"
        raise DTypeError(msg) from None


def _need(entries: Mapping[str, Any], key: str, fmt: str, name: str) -> np.ndarray:
    if key not in entries:
        msg = f"the entries have no {key!r}, which a compressed-tensors {fmt} weight {name!r} needs"
        raise CorruptDataError(msg)
    return _host(entries, key)


def _scale_dtype(arr: np.ndarray, key: str) -> ScaleDtype:
    kind = str(arr.dtype)
    for sdt, text in _SCALE_NAMES.items():
        if kind == text:
            return sdt
    msg = f"entry {key!r} has dtype {kind}; compressed-tensors integer scales are float32, float16 or bfloat16"
    raise CorruptDataError(msg)


class _Args:
    """The weight arguments this module reads, checked."""

    def __init__(self, fmt: str, args: Mapping[str, Any]) -> None:
        if fmt not in FORMATS:
            msg = f"format {fmt!r} is not an integer compressed-tensors format; this reader takes {', '.join(FORMATS)}"
            raise SchemeError(msg)
        bits = args.get("num_bits")
        kind = args.get("type", "int")
        strategy = args.get("strategy")
        group = args.get("group_size")
        symmetric = args.get("symmetric", True)
        if kind != "int" or type(bits) is not int or not 1 <= bits <= 8:
            msg = f"weights of type {kind!r} with {bits!r} bits do not map; arrayquant holds int weights of 1 to 8 bits"
            raise SchemeError(msg)
        if not isinstance(symmetric, bool):
            msg = f"'symmetric' must be true or false, got {symmetric!r}"
            raise CorruptDataError(msg)
        if symmetric and bits == 1:
            msg = "1-bit symmetric weights (codes -1 and 0) have no arrayquant value; u1 holds 1-bit zero-point weights"
            raise SchemeError(msg)
        zp_dtype = args.get("zp_dtype")
        if not symmetric and zp_dtype is not None and str(zp_dtype) != "torch.int8":
            msg = f"zero points of zp_dtype {zp_dtype!r} do not map; compressed-tensors integer zero points are int8"
            raise SchemeError(msg)
        if args.get("dynamic", False):
            msg = "dynamic weight quantization stores no scales; nothing to read"
            raise SchemeError(msg)
        if strategy not in ("tensor", "channel", "group"):
            msg = f"strategy {strategy!r} does not map; this reader takes tensor, channel and group"
            raise SchemeError(msg)
        if strategy == "group" and (isinstance(group, bool) or not isinstance(group, int) or group < 1):
            msg = f"strategy 'group' needs a positive integer group_size, got {group!r}"
            raise CorruptDataError(msg)
        self.fmt, self.bits, self.strategy, self.symmetric = fmt, int(bits), str(strategy), symmetric
        self.group: int | None = group if strategy == "group" else None
        self.declared_scale = args.get("scale_dtype")

    def value(self, value: QuantValue | str | None) -> QuantValue:
        """The arrayquant value to read the codes as: compressed-tensors' own (signed) by default."""
        bits = self.bits
        own = _FULL.get(bits, QuantValue.U1)
        val = own if value is None else QuantValue.coerce(value)
        if _BITS.get(val) != bits:
            other = "its symmetric kind" if self.symmetric else f"its symmetric kind, or u{bits}"
            use = own.value if bits > 1 else "u1"
            msg = f"value {val.value} does not hold {bits}-bit compressed-tensors codes; use {use} (or {other})"
            raise SchemeError(msg)
        if val.is_unsigned and self.symmetric:
            msg = f"value {val.value} needs a zero point, but these weights are symmetric; use {own.value}"
            raise SchemeError(msg)
        return val

    def grid(self, rows: int, cols: int) -> tuple[int, ...]:
        """The scale grid of a (rows, cols) weight."""
        if self.strategy == "tensor":
            return (1,)
        if self.strategy == "channel":
            return (rows, 1)
        assert self.group is not None
        if cols % self.group:
            msg = f"weight of shape ({rows}, {cols}) cannot be split into groups of {self.group}"
            raise ShapeError(msg)
        return (rows, cols // self.group)


def _int8_fields(arr: np.ndarray, key: str, bits: int, shape: tuple[int, ...], what: str) -> np.ndarray:
    """Unpacked int8 codes or zero points, checked, as stored fields (uint8, ``+ 2**(bits-1)``)."""
    if arr.dtype != np.int8:
        msg = f"entry {key!r} has dtype {arr.dtype} for {bits}-bit {what}; compressed-tensors stores them as int8"
        raise CorruptDataError(msg)
    if tuple(arr.shape) != shape:
        msg = f"entry {key!r} has shape {tuple(arr.shape)}; {what} of this weight take {shape}"
        raise ShapeError(msg)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    outside = (arr < lo) | (arr > hi)
    if bits < 8 and np.any(outside):
        i = int(np.argmax(outside.reshape(-1)))
        code = int(arr.reshape(-1)[i])
        msg = f"entry {key!r} holds {code} at flat index {i}, outside the {bits}-bit range [{lo}, {hi}]"
        raise CorruptDataError(msg)
    return (arr.astype(np.int16) + (1 << (bits - 1))).astype(np.uint8)


def _fields(entries: Mapping[str, Any], name: str, a: _Args) -> np.ndarray:
    """The stored fields (uint8, rows x cols) of either layout, checked against its shape entry."""
    fmt, bits = a.fmt, a.bits
    if fmt == PACK:
        pkey, skey = _key(name, PACKED), _key(name, SHAPE)
        packed, wshape = _need(entries, pkey, fmt, name), _need(entries, skey, fmt, name)
        if packed.dtype != np.int32:
            msg = f"entry {pkey!r} has dtype {packed.dtype}; compressed-tensors packs into int32"
            raise CorruptDataError(msg)
        if wshape.dtype.kind not in "iu" or wshape.shape != (2,):
            msg = f"entry {skey!r} is {wshape.dtype} of shape {wshape.shape}; it must be 2 integers (rows, cols)"
            raise CorruptDataError(msg)
        rows, cols = (int(n) for n in wshape)
        want = (rows, -(-cols * bits // 32))
        if rows < 1 or cols < 1 or packed.shape != want:
            msg = (
                f"entry {pkey!r} has shape {packed.shape}, but {skey!r} says ({rows}, {cols}), which "
                f"{bits}-bit packing stores as {want}"
            )
            raise ShapeError(msg)
        return _unpack_rows(packed, bits, cols)
    wkey = _key(name, WEIGHT)
    weight = _need(entries, wkey, fmt, name)
    # compressed-tensors' naive compressor casts the codes of any width up to 8 bits to int8
    # (QuantizationArgs.pytorch_dtype), e.g. the 4-bit weights of W4AFP8 and W4A8
    if weight.dtype != np.int8:
        msg = f"entry {wkey!r} has dtype {weight.dtype} for {bits}-bit weights; {fmt} stores codes as int8"
        raise CorruptDataError(msg)
    if weight.ndim != 2 or min(weight.shape) < 1:
        msg = f"entry {wkey!r} has shape {weight.shape}; compressed-tensors integer weights are 2-D (rows, cols)"
        raise ShapeError(msg)
    return _int8_fields(weight, wkey, bits, tuple(weight.shape), "weights")


def _zero_fields(entries: Mapping[str, Any], name: str, a: _Args, grid: tuple[int, ...]) -> np.ndarray:
    """The zero points' stored fields (uint8, shaped as the grid): packed down the grid, or int8 as stored."""
    key = _key(name, ZERO)
    zp = _need(entries, key, a.fmt, name)
    if a.fmt != PACK or a.strategy == "tensor":  # compressed-tensors packs group and channel zero points only
        return _int8_fields(zp, key, a.bits, grid, "zero points")
    rows, groups = grid
    want = (-(-rows * a.bits // 32), groups)
    if zp.dtype != np.int32:
        msg = f"entry {key!r} has dtype {zp.dtype}; compressed-tensors packs {a.strategy} zero points into int32"
        raise CorruptDataError(msg)
    if tuple(zp.shape) != want:
        msg = (
            f"entry {key!r} has shape {tuple(zp.shape)}; {a.bits}-bit zero points of the ({rows}, {groups}) scale grid "
            f"are packed down its columns into {want}"
        )
        raise ShapeError(msg)
    words = np.ascontiguousarray(zp).view(np.uint32)
    return np.asarray(unpack(words, _fields_scheme(a.bits, rows=False), grid))


def _check_range(arr: np.ndarray, val: QuantValue, what: str, full: str) -> None:
    low = int(val.range[0])
    if not val.is_unsigned and np.any(arr < low):
        i = int(np.argmax(arr.reshape(-1) < low))
        code = int(arr.reshape(-1)[i])
        msg = f"{what} {code} at flat index {i} is outside {val.value}'s range; read it as {full}"
        raise CorruptDataError(msg)


def read(
    entries: Mapping[str, Any],
    name: str,
    fmt: str,
    args: Mapping[str, Any],
    *,
    value: QuantValue | str | None = None,
    backend: str | None = None,
    device: Any = None,
) -> QuantizedTensor:
    """The arrayquant tensor for an integer weight compressed-tensors wrote.

    Parameters
    ----------
    entries : mapping of str to array
        The safetensors entries (at least those of ``name``), as NumPy arrays (bfloat16 as
        ml_dtypes).
    name : str
        The module prefix; ``""`` for unprefixed keys.
    fmt : str
        ``"pack-quantized"``, ``"int-quantized"`` or ``"naive-quantized"``.
    args : mapping
        The ``weights`` quantization arguments from ``config.json``.
    value : QuantValue or str, optional
        The value kind: the full signed range of the width (``q8f`` ... ``q2f``,
        compressed-tensors' own) by default, ``u1`` for one bit; or the symmetric one of the
        same width when the weights were written from it, or ``u{bits}`` for zero-point weights.
    backend, device : optional
        Where the result lives (default backend, its default device).

    Returns
    -------
    QuantizedTensor
        Codes, scales and zero points bit for bit; the store is arrayquant's default (``packed_u32``).

    Raises
    ------
    SchemeError
        Format or arguments that do not map (float, dynamic, other strategies, 1-bit
        symmetric), or a ``value`` of another width.
    CorruptDataError
        Missing entries, wrong dtypes, a zero point the arguments do not declare (or none where
        they do), negative or non-finite scales, or a code or zero point outside the range of ``value``.
    ShapeError
        Entries whose shapes disagree.

    Examples
    --------
    >>> import numpy as np
    >>> entries = {"fc.weight_packed": np.array([[35103]], np.int32),
    ...            "fc.weight_scale": np.array([[0.5]], np.float32),
    ...            "fc.weight_shape": np.array([1, 4])}
    >>> args = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 4}
    >>> qt = read(entries, "fc", "pack-quantized", args, backend="numpy")
    >>> str(qt.scheme), qt.codes().tolist()
    ('q4f:block4:f32', [[7, -7, 1, 0]])
    >>> entries["fc.weight_zero_point"] = np.array([[9]], np.int32)  # the field z + 8
    >>> qt = read(entries, "fc", "pack-quantized", {**args, "symmetric": False}, backend="numpy")
    >>> str(qt.scheme), qt.zero_point.tolist()
    ('q4f:block4:f32:zero_point', [[1]])
    """
    a = _Args(fmt, args)
    val = a.value(value)
    full = _FULL.get(a.bits, QuantValue.U1).value
    zkey = _key(name, ZERO)
    if a.symmetric and zkey in entries:
        msg = f"entry {zkey!r} is present, but the arguments say symmetric; the data is inconsistent"
        raise CorruptDataError(msg)
    codes = _as_codes(_fields(entries, name, a), val)
    rows, cols = codes.shape
    grid = a.grid(rows, cols)
    skey = _key(name, SCALE)
    scale = _need(entries, skey, fmt, name)
    sdt = _scale_dtype(scale, skey)
    declared = a.declared_scale
    if declared is not None and str(declared).removeprefix("torch.") != _SCALE_NAMES[sdt]:
        msg = f"entry {skey!r} is {_SCALE_NAMES[sdt]}, but the arguments declare scale_dtype {declared!r}"
        raise CorruptDataError(msg)
    if tuple(scale.shape) != grid:
        msg = f"entry {skey!r} has shape {tuple(scale.shape)}; strategy {a.strategy!r} on ({rows}, {cols}) takes {grid}"
        raise ShapeError(msg)
    scales = scale.astype(np.float32)
    if not np.all(np.isfinite(scales) & (scales >= 0)):
        i = int(np.argmin(np.isfinite(scales) & (scales >= 0)))
        msg = f"entry {skey!r} holds {float(scales.reshape(-1)[i])!r} at flat index {i}; scales must be finite and >= 0"
        raise CorruptDataError(msg)
    _check_range(codes, val, "code", full)
    zero = None
    if not a.symmetric:
        zero = _as_codes(_zero_fields(entries, name, a, grid), val)
        _check_range(zero, val, "zero point", full)
    mode = QuantMode.SYMMETRIC if a.symmetric else QuantMode.ZERO_POINT
    scheme = QuantScheme(val, QuantStore(), mode)
    if a.strategy == "tensor":
        scheme = scheme.per_tensor(sdt)
    else:
        scheme = scheme.per_block(BlockSize(cols if a.group is None else a.group), sdt)
    target = backend or default().name
    xp = shim.namespace(target)
    move = lambda arr: shim.convert(arr, target, device)
    values = pack(codes, scheme)
    dtype = getattr(xp, _SCALE_NAMES[sdt], xp.float32)
    extra = {} if zero is None else {"zero_point": move(zero.reshape(grid))}
    return QuantizedTensor(scheme, (rows, cols), dtype, move(values), move(scales.reshape(grid)), **extra)
