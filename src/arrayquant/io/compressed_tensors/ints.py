"""Integer weights (Q8/Q4/Q2, symmetric, per-tensor / per-row / per-group) in compressed-tensors' layout.

compressed-tensors (0.20.1, read in site-packages) stores a weight-only integer ``Linear``
weight ``<name>`` in the ``pack-quantized`` format as three safetensors entries:

- ``<name>.weight_packed``: int32, shape ``(rows, ceil(cols * bits / 32))``. Each row is one
  little-endian bit stream: element ``i`` sits in bits ``[i * bits, (i + 1) * bits)`` (word
  ``i * bits // 32``), stored as ``code + 2 ** (bits - 1)`` (unsigned). Unused high bits of the
  last word are zero. (``compressors/pack_quantized/helpers.py``, ``pack_to_int32``: "offset =
  1 << (num_bits - 1)", scatter of ``value << (i * num_bits) % 32``; ``unpack_from_int32``
  subtracts the offset again.) For 2, 4 and 8 bits no field straddles a word.
- ``<name>.weight_scale``: the scales in the scale dtype (float32 / float16 / bfloat16), shape
  ``(rows, cols // group_size)`` for ``strategy: group``, ``(rows, 1)`` for ``channel``, ``(1,)``
  for ``tensor``.
- ``<name>.weight_shape``: int64 ``(2,)``, the unpacked shape (``torch.tensor(weight.shape)``).
- no ``weight_zero_point``: ``compression_param_names`` adds it only when ``symmetric`` is false.

8-bit weights without activation quantization are ``pack-quantized`` too
(``PackedQuantizationCompressor.can_compress``: INT, 1 <= num_bits <= 8; ``int-quantized`` is
chosen first only when ``input_activations`` is set, e.g. W8A8). ``int-quantized`` (and
``naive-quantized``) store the codes unpacked as ``<name>.weight`` int8, for any width (W4AFP8,
W4A8 and W2A8 write 4- and 2-bit codes so); :func:`read` takes both.

Ranges. compressed-tensors' integer range is ``[-2 ** (bits - 1), 2 ** (bits - 1) - 1]``
(``quantization/utils/helpers.py``, ``_calculate_range``), i.e. arrayquant's ``Q8F``, ``Q4F``,
``Q2F``; its symmetric observer scale is ``amax / ((q_max - q_min) / 2)`` (``amax / 7.5`` for
4 bits), so its own weights do use the code ``-8``. arrayquant's ``Q8S``/``Q4S``/``Q2S`` ranges
(``[-127, 127]``, ``[-7, 7]``, ``[-1, 1]``) are subsets: they are written bit for bit, and read
back as the full-range value unless ``value=`` names the symmetric one (a ``-2 ** (bits - 1)``
code is then corrupt data for that value).

Arithmetic. compressed-tensors dequantizes as ``code.to(scale.dtype) * scale``
(``forward_helpers._dequantize``, zero point None for symmetric weights), so its decompressed
weight is in the scale dtype, rounded there; arrayquant computes ``f32(scale) * code`` in f32.
The f32 product of a code (at most 8 significant bits) and an f16 (11) or bf16 (8) scale is
exact, so ``aq.dequantize(qt)`` cast to the scale dtype equals compressed-tensors' result bit
for bit; with f32 scales both round the same f32 product. Measured in tests/test_ct_int.py
(Q8/Q4/Q2, per-tensor/per-row/per-group, f32/f16/bf16 scales, 19 shape/scheme cases x 8
distributions, both directions): 0 differing bits. Before that cast, arrayquant's f32 result
differs from compressed-tensors' bf16/f16 one by the bf16/f16 rounding of the product (at most
half an ulp of the scale dtype). One difference remains in ``aq.dequantize(qt)`` to float16 itself:
where ``|code * scale|`` passes the f16 maximum (compressed-tensors' own 2-bit observer makes
this possible, as its scale is ``amax / 1.5`` and the code -2 reaches ``1.33 * amax``),
compressed-tensors gives +-inf and arrayquant saturates to +-65504. A tensor read here has the
scale dtype as its dtype, as compressed-tensors' decompressed weight does.

Rounding: compressed-tensors quantizes with ``torch.round`` (half to even) after ``x / scale``
and clamps to its range, as arrayquant's default; only the stored codes and scales cross here.

Not mapped (``weight_args`` returns None): asymmetric or lookup modes, two-level schemes, float
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

# arrayquant value -> bits; the full-range value compressed-tensors uses for each width
_BITS = {
    QuantValue.Q8F: 8,
    QuantValue.Q8S: 8,
    QuantValue.Q4F: 4,
    QuantValue.Q4S: 4,
    QuantValue.Q2F: 2,
    QuantValue.Q2S: 2,
}
_FULL = {8: QuantValue.Q8F, 4: QuantValue.Q4F, 2: QuantValue.Q2F}
_SCALE_NAMES = {ScaleDtype.F32: "float32", ScaleDtype.F16: "float16", ScaleDtype.BF16: "bfloat16"}


def _bf16() -> Any:
    try:
        import ml_dtypes
    except ImportError:
        msg = "bfloat16 scales need ml_dtypes (pip install ml_dtypes)"
        raise DTypeError(msg) from None
    return np.dtype(ml_dtypes.bfloat16)


def _key(name: str, part: str) -> str:
    return f"{name}.{part}" if name else part


def _group(scheme: QuantScheme) -> int | None:
    """The group size of a mapped block scheme (0 for per-tensor), None when it does not map."""
    if (
        scheme.value not in _BITS
        or scheme.mode is not QuantMode.SYMMETRIC
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
        Q8F/Q8S/Q4F/Q4S/Q2F/Q2S, symmetric, one level: per-tensor, or a 1-D block ``[g]``
        (``[1, g]`` is the same block) with F32, F16 or BF16 scales.
    shape : tuple of int, optional
        The weight's shape. When the block spans its whole last axis (per-row: a block at least
        as long as the row, which arrayquant clamps to it), the strategy is ``channel`` instead
        of ``group`` (both store the same entries and dequantize alike).

    Returns
    -------
    tuple of (str, dict) or None
        ``("pack-quantized", args)`` with ``args`` as compressed-tensors'
        ``QuantizationArgs.model_dump(mode="json")`` writes them.

    Examples
    --------
    >>> from arrayquant import QuantScheme
    >>> weight_args(QuantScheme().with_value("q4s").per_block(128, "bf16"))[1]["strategy"]
    'group'
    >>> weight_args(QuantScheme().with_value("q8s").per_block(64), shape=(32, 64))[1]["strategy"]
    'channel'
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
        "symmetric": True,
        "group_size": group_size,
        "strategy": strategy,
        "dynamic": False,
        "scale_dtype": f"torch.{_SCALE_NAMES[scheme.scale_dtype]}",
    }
    return PACK, args


_SLAB = 1 << 18  # elements per step of the (un)packing below: temporaries of a few MiB


def _pack_rows(codes: np.ndarray, bits: int) -> np.ndarray:
    """int8 codes (rows, cols) as compressed-tensors' int32 words: offset, then a little-endian bit stream per row."""
    per = 32 // bits
    rows, cols = codes.shape
    words = -(-cols // per)
    out = np.empty((rows, words), np.uint32)
    shifts = (np.arange(per, dtype=np.uint32) * np.uint32(bits)).astype(np.uint32)
    step = max(1, _SLAB // max(words * per, 1))
    for r0 in range(0, rows, step):  # a slab of rows at a time, so no full-size uint32 temporaries
        block = codes[r0 : r0 + step]
        u = np.zeros((block.shape[0], words * per), np.uint32)
        u[:, :cols] = (block.astype(np.int32) + (1 << (bits - 1))).astype(np.uint32)
        out[r0 : r0 + step] = np.bitwise_or.reduce(u.reshape(-1, words, per) << shifts, axis=-1)
    return out.view(np.int32)


def _packed_words(qt: QuantizedTensor, shape: tuple[int, int], bits: int) -> np.ndarray:
    """compressed-tensors' words of ``qt``'s codes, unpacked and repacked a slab of rows at a time."""
    rows, cols = shape
    store = qt.scheme.store
    if store.is_packed and store.dim != 0:  # packed down the columns: slabs of rows would split words
        return _pack_rows(np.asarray(shim.to_host(qt.codes())).astype(np.int8).reshape(shape), bits)
    values = np.asarray(shim.to_host(qt.values))
    out = np.empty((rows, -(-cols // (32 // bits))), np.int32)
    step = max(1, _SLAB // cols)
    for r0 in range(0, rows, step):
        r1 = min(r0 + step, rows)
        codes = unpack(values[r0:r1], qt.scheme, (r1 - r0, cols))
        out[r0:r1] = _pack_rows(np.asarray(codes, np.int8), bits)
    return out


def _unpack_rows(packed: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """The inverse of :func:`_pack_rows`: int8 codes (rows, cols); bits past ``cols`` are ignored."""
    per = 32 // bits
    words = packed.view(np.uint32)
    rows = packed.shape[0]
    out = np.empty((rows, cols), np.int8)
    shifts = (np.arange(per, dtype=np.uint32) * np.uint32(bits)).astype(np.uint32)
    step = max(1, _SLAB // max(words.shape[-1] * per, 1))
    for r0 in range(0, rows, step):
        fields = (words[r0 : r0 + step, :, None] >> shifts) & np.uint32((1 << bits) - 1)
        flat = fields.reshape(fields.shape[0], -1)[:, :cols].astype(np.int32) - (1 << (bits - 1))
        out[r0 : r0 + step] = flat
    return out


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
        the scheme's scale dtype) and ``weight_shape`` (int64).

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
    """
    if not isinstance(qt, QuantizedTensor):
        msg = f"qt must be an aq.QuantizedTensor, got {type(qt).__name__}"
        raise ParamsError(msg)
    mapped = weight_args(qt.scheme, shape=tuple(qt.shape))
    if mapped is None:
        msg = (
            f"compressed-tensors pack-quantized does not hold the scheme {qt.scheme}; it takes symmetric "
            "q8f/q8s/q4f/q4s/q2f/q2s per-tensor or with a 1-D block [g] and f32/f16/bf16 scales"
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
    packed = _packed_words(qt, shape, args["num_bits"])
    scales = np.asarray(shim.to_host(qt.scales), np.float32)
    scales = scales.reshape((1,) if args["strategy"] == "tensor" else (rows, -1))
    sdt = qt.scheme.scale_dtype
    scale_np = scales.astype(_bf16() if sdt is ScaleDtype.BF16 else _SCALE_NAMES[sdt])
    if not np.array_equal(scale_np.astype(np.float32), scales, equal_nan=True):
        msg = f"qt.scales are not all {sdt.name} values; build the tensor with aq.quantize"
        raise ParamsError(msg)
    return {
        _key(name, PACKED): packed,
        _key(name, SCALE): scale_np,
        _key(name, SHAPE): np.array(shape, np.int64),
    }


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


def _check_args(fmt: str, args: Mapping[str, Any]) -> tuple[int, str, int | None]:
    """(bits, strategy, group_size) of arguments this module reads; SchemeError otherwise."""
    if fmt not in FORMATS:
        msg = f"format {fmt!r} is not an integer compressed-tensors format; this reader takes {', '.join(FORMATS)}"
        raise SchemeError(msg)
    bits = args.get("num_bits")
    kind = args.get("type", "int")
    strategy = args.get("strategy")
    group = args.get("group_size")
    if kind != "int" or type(bits) is not int or bits not in _FULL:
        msg = f"weights of type {kind!r} with {bits!r} bits do not map; arrayquant holds int weights of 2, 4 or 8 bits"
        raise SchemeError(msg)
    if not args.get("symmetric", True):
        msg = "asymmetric compressed-tensors weights (with a weight_zero_point) do not map to an arrayquant scheme"
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
    return int(bits), str(strategy), group if strategy == "group" else None


def _codes(entries: Mapping[str, Any], name: str, fmt: str, bits: int) -> np.ndarray:
    """The int8 codes (rows, cols) of either layout, checked against its shape entry."""
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
        return _unpack_rows(np.ascontiguousarray(packed), bits, cols)
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
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    outside = (weight < lo) | (weight > hi)
    if bits < 8 and np.any(outside):
        i = int(np.argmax(outside.reshape(-1)))
        code = int(weight.reshape(-1)[i])
        msg = f"entry {wkey!r} holds {code} at flat index {i}, outside the {bits}-bit range [{lo}, {hi}]"
        raise CorruptDataError(msg)
    return np.ascontiguousarray(weight)


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
        The value kind: the full range (``q8f``/``q4f``/``q2f``, compressed-tensors' own) by
        default, or the symmetric one of the same width when the weights were written from it.
    backend, device : optional
        Where the result lives (default backend, its default device).

    Returns
    -------
    QuantizedTensor
        Codes and scales bit for bit; the store is arrayquant's default (``packed_u32``).

    Raises
    ------
    SchemeError
        Format or arguments that do not map (float, asymmetric, dynamic, other strategies), or
        a ``value`` of another width.
    CorruptDataError
        Missing entries, wrong dtypes, a zero point, negative or non-finite scales, or a code
        outside the range of ``value``.
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
    """
    bits, strategy, group = _check_args(fmt, args)
    full = _FULL[bits]
    val = full if value is None else QuantValue.coerce(value)
    if _BITS.get(val) != bits:
        msg = (
            f"value {val.value} does not hold {bits}-bit compressed-tensors codes; "
            f"use {full.value} (or its symmetric kind)"
        )
        raise SchemeError(msg)
    if _key(name, ZERO) in entries:
        msg = f"entry {_key(name, ZERO)!r} is present, but the arguments say symmetric; the data is inconsistent"
        raise CorruptDataError(msg)
    codes = _codes(entries, name, fmt, bits)
    rows, cols = codes.shape
    skey = _key(name, SCALE)
    scale = _need(entries, skey, fmt, name)
    sdt = _scale_dtype(scale, skey)
    declared = args.get("scale_dtype")
    if declared is not None and str(declared).removeprefix("torch.") != _SCALE_NAMES[sdt]:
        msg = f"entry {skey!r} is {_SCALE_NAMES[sdt]}, but the arguments declare scale_dtype {declared!r}"
        raise CorruptDataError(msg)
    if strategy == "tensor":
        grid: tuple[int, ...] = (1,)
    elif strategy == "channel":
        grid = (rows, 1)
    else:
        assert group is not None
        if cols % group:
            msg = f"weight of shape ({rows}, {cols}) cannot be split into groups of {group}"
            raise ShapeError(msg)
        grid = (rows, cols // group)
    if tuple(scale.shape) != grid:
        msg = f"entry {skey!r} has shape {tuple(scale.shape)}; strategy {strategy!r} on ({rows}, {cols}) takes {grid}"
        raise ShapeError(msg)
    scales = scale.astype(np.float32)
    if not np.all(np.isfinite(scales) & (scales >= 0)):
        i = int(np.argmin(np.isfinite(scales) & (scales >= 0)))
        msg = f"entry {skey!r} holds {float(scales.reshape(-1)[i])!r} at flat index {i}; scales must be finite and >= 0"
        raise CorruptDataError(msg)
    low = -(1 << (bits - 1)) + (0 if val is full else 1)
    if val is not full and np.any(codes < low):
        i = int(np.argmax(codes.reshape(-1) < low))
        code = int(codes.reshape(-1)[i])
        msg = f"code {code} at flat index {i} is outside {val.value}'s range; read it as {full.value}"
        raise CorruptDataError(msg)
    scheme = QuantScheme(val, QuantStore(), QuantMode.SYMMETRIC)
    if strategy == "tensor":
        scheme = scheme.per_tensor(sdt)
    else:
        scheme = scheme.per_block(BlockSize(cols if group is None else group), sdt)
    target = backend or default().name
    xp = shim.namespace(target)
    move = lambda a: shim.convert(a, target, device)
    values = pack(codes, scheme)
    dtype = getattr(xp, _SCALE_NAMES[sdt], xp.float32)
    return QuantizedTensor(scheme, (rows, cols), dtype, move(values), move(scales.reshape(grid)))
