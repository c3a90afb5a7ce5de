"""Float weights in compressed-tensors' MXFP8, MXFP4 and FP8 layouts, tensor by tensor.

Three compressed-tensors formats hold arrayquant's float schemes value for value:

============================  ===================================================  =======================
arrayquant scheme             compressed-tensors format, ``weights`` arguments      safetensors entries
============================  ===================================================  =======================
``mxfp8``                     ``mxfp8-quantized``: float 8 bits, ``group`` 32,      ``weight`` F8_E4M3
                              ``scale_dtype: "torch.uint8"``                        ``(rows, cols)``,
                                                                                    ``weight_scale`` U8
                                                                                    ``(rows, cols // 32)``
``mxfp4``                     ``mxfp4-pack-quantized``: float 4 bits, ``group``     ``weight_packed`` U8
                              32, ``scale_dtype: "torch.uint8"``                    ``(rows, cols // 2)``,
                                                                                    ``weight_scale`` U8
``e4m3:tensor:<f>:native``    ``float-quantized``, strategy ``tensor``              ``weight`` F8_E4M3,
                                                                                    ``weight_scale`` (1,)
``e4m3:block<cols>:<f>``      ``float-quantized``, strategy ``channel``             ``weight_scale``
(one scale per row)                                                                 ``(rows, 1)``
``e4m3:block<n>:<f>``         ``float-quantized``, strategy ``group``, n            ``(rows, cols // n)``
``e4m3:block<h>x<w>:<f>``     ``float-quantized``, strategy ``block``,              ``(ceil(rows / h),
                              ``block_structure: [h, w]``                           ceil(cols / w))``
============================  ===================================================  =======================

``<f>`` is f32, f16 or bf16; ``weight_scale`` is stored in that dtype (F32 / F16 / BF16), as
compressed-tensors stores the scale in the dtype its observer produced (the model's dtype).

Sources, compressed-tensors 0.20.1 as installed:

- ``compressors/mxfp8/base.py`` (``MXFP8QuantizationCompressor``): the naive compressor's
  ``weight`` (``weights.pytorch_dtype()``: float8_e4m3fn) and ``weight_scale`` turned to uint8
  by ``mx_utils.compress_mx_scale``: ``127 + floor(log2(scale))``.
- ``compressors/mxfp4/base.py`` (``MXFP4PackedCompressor``, subclass of the NVFP4 compressor):
  entries ``weight_packed``, ``weight_scale`` (no global scale: strategy ``group``), the
  NVFP4 packing (E2M1 magnitude index 0..7 with the sign in bit 3; element ``2k`` in the low
  nibble, ``2k + 1`` in the high nibble), scales as for MXFP8.
- ``mx_utils.decompress_mx_scale``: ``2 ** (code - 127)`` in bfloat16 — UE8M0 with bias 127,
  the same decoding as arrayquant's UE8M0 (code 255 is NaN in OCP MX; arrayquant refuses it).
- ``quantization/lifecycle/forward_helpers.py`` ``_dequantize``: ``x_q.to(scale.dtype) * scale``:
  the stored scale is a **multiplier**, as arrayquant's (``x' = scale * decode(code)``); no
  reciprocal anywhere in these formats.
- ``quantization/lifecycle/initialize.py``: scale shapes ``(1,)`` (tensor), ``(rows, 1)``
  (channel), ``(rows, cols // g)`` (group), ``(ceil(rows / h), ceil(cols / w))`` (block);
  scale dtype = the observed weight's dtype (f16 / bf16 / f32).

Scale rule. compressed-tensors computes MX scales in ``mxfp_utils.generate_mx_scales``:
``floor(log2(round_to_power_2(amax))) - floor(log2(elem_max))``, where ``round_to_power_2``
first rounds ``amax``'s mantissa to 1 bit (E2M1's, for MXFP8 too). That is neither OCP's floor
rule (arrayquant ``scale_rule="ocp"``) nor arrayquant's round-up in general. Measured on 131,072
groups of 32 (f32 normal rows with log-normal row magnitudes): for MXFP8 compressed-tensors'
code equals arrayquant's round-up code in 100% of groups (they differ only when amax's mantissa
is exactly 1.75, e.g. amax 448: compressed-tensors picks the next power of two) and the OCP code
in 80.95% (19.05% one larger); for MXFP4 it equals round-up in 77.52% (22.48% one smaller: amax
mantissa in (1.5, 1.75), where compressed-tensors clips the largest values, e.g. 6.5 -> 6) and
OCP in 80.95% (19.05% one larger). Worked cases are in tests/test_ct_float.py.
Every UE8M0 code 0..254 is a valid scale for both libraries, so the stored scale is whichever
rule arrayquant used and compressed-tensors decodes it unchanged; reading gives the scheme with the
default ``round_up`` rule (the rule only decides how scales are chosen, not how they decode).

Measured differences (tests/test_ct_float.py, several shapes and distributions):

- arrayquant -> compressed-tensors' decompression: MXFP8, MXFP4 and float-quantized with f32
  scales equal ``aq.dequantize`` bit for bit (MX decompression runs in bfloat16, exact for a
  power-of-two scale times an E4M3/E2M1 value in the normal range). With bf16 / f16 scales
  compressed-tensors multiplies in bf16 / f16, so its output is ``aq.dequantize(qt)`` (exact in
  f32) rounded to nearest-even bf16 / f16 — measured equal to that rounding bit for bit.
- compressed-tensors' compressor -> :func:`read` -> ``aq.dequantize`` equals
  compressed-tensors' decompression bit for bit (f32 and MX); values and scales are taken
  unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...backends import default, shim
from ...errors import CorruptDataError, DTypeError, ParamsError, SchemeError, ShapeError
from ...invariants import check_shape, plan_for
from ...scheme import QuantScheme, ScaleDtype
from ...scheme.block import BlockSize
from ...scheme.store import QuantStore
from ...scheme.values import QuantMode, QuantValue
from ...storage import values_layout
from ...tensor import QuantizedTensor
from ..burn.bytes import decode_scales, to_bytes

__all__ = ["FORMATS", "MAPPED", "read", "weight_args", "write"]

MXFP8, MXFP4, FLOAT = "mxfp8-quantized", "mxfp4-pack-quantized", "float-quantized"
FORMATS = (MXFP8, MXFP4, FLOAT)
MAPPED = (
    "mxfp8 -> mxfp8-quantized",
    "mxfp4 -> mxfp4-pack-quantized",
    "e4m3 with one f32/f16/bf16 scale per tensor, per row, per group of n or per h x w block "
    "(native store, no per-tensor level over blocks) -> float-quantized",
)
MX_GROUP = 32
# float scale dtypes: arrayquant's name -> (safetensors dtype, NumPy dtype name compressed-tensors' entry has)
_FLOAT_SCALES = {
    ScaleDtype.F32: ("F32", "float32"),
    ScaleDtype.F16: ("F16", "float16"),
    ScaleDtype.BF16: ("BF16", "bfloat16"),
}


def _key(name: str, part: str) -> str:
    return f"{name}.{part}" if name else part


def _kind(scheme: QuantScheme) -> str | None:
    """``"mxfp8"``, ``"mxfp4"``, ``"fp8"`` for a scheme these formats hold, else None."""
    import dataclasses

    plain = dataclasses.replace(scheme, scale_rule="round_up")
    if plain == QuantScheme.mxfp8():
        return "mxfp8"
    if plain == QuantScheme.mxfp4():
        return "mxfp4"
    if (
        scheme.value is not QuantValue.E4M3
        or scheme.store != QuantStore.native()
        or scheme.mode is not QuantMode.SYMMETRIC
        or scheme.codebook is not None
    ):
        return None
    if scheme.block is None:
        return "fp8" if scheme.tensor_scale in _FLOAT_SCALES else None
    if scheme.tensor is not None or scheme.block_scale not in _FLOAT_SCALES:
        return None  # two-level, or UE4M3/UE8M0 blocks other than MX's
    return "fp8" if len(scheme.block[0].dims) <= 2 else None


def _float_args(strategy: str, group_size: int | None = None, block: list[int] | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": group_size}
    args["strategy"] = strategy
    if block is not None:
        args["block_structure"] = block
    args["dynamic"] = False
    return args


def weight_args(scheme: QuantScheme, shape: tuple[int, ...] | None = None) -> tuple[str, dict[str, Any]] | None:
    """The compressed-tensors format and ``weights`` arguments for ``scheme``, or None.

    The arguments are the dict compressed-tensors itself serializes into ``config.json``
    (``QuantizationArgs.model_dump()``). A 1-d block of ``n`` (or ``[1, n]``) is per-row
    (strategy ``channel``) when ``shape`` is given and its last axis is at most ``n`` (arrayquant
    clamps a block to the data), otherwise strategy ``group`` of ``n``.

    Parameters
    ----------
    scheme : QuantScheme
        Any scheme; those this module does not map give None (see ``MAPPED``).
    shape : tuple of int, optional
        The weight's shape, to tell one scale per row from groups.

    Returns
    -------
    tuple of (str, dict) or None

    Examples
    --------
    >>> from arrayquant import QuantScheme
    >>> weight_args(QuantScheme.mxfp8())[0]
    'mxfp8-quantized'
    >>> weight_args(QuantScheme.parse("e4m3:block128x128:f32:native"))[1]["block_structure"]
    [128, 128]
    >>> weight_args(QuantScheme.parse("e4m3:block64:bf16:native"), (32, 64))[1]["strategy"]
    'channel'
    >>> weight_args(QuantScheme.parse("q8s")) is None
    True
    """
    kind = _kind(scheme)
    if kind in ("mxfp8", "mxfp4"):
        bits = 8 if kind == "mxfp8" else 4
        args = {"num_bits": bits, "type": "float", "symmetric": True, "group_size": MX_GROUP, "strategy": "group"}
        args.update({"dynamic": False, "scale_dtype": "torch.uint8"})
        return (MXFP8 if kind == "mxfp8" else MXFP4), args
    if kind != "fp8":
        return None
    if scheme.block is None:
        return FLOAT, _float_args("tensor")
    dims = scheme.block[0].dims
    if len(dims) == 2 and dims[0] != 1:
        return FLOAT, _float_args("block", block=[int(dims[0]), int(dims[1])])
    if shape is not None and len(shape) >= 1 and shape[-1] <= dims[-1]:  # the block clamps to the row
        return FLOAT, _float_args("channel")
    return FLOAT, _float_args("group", group_size=int(dims[-1]))


def _refuse(scheme: QuantScheme) -> SchemeError:
    return SchemeError(
        f"scheme {scheme} has no compressed-tensors float layout; the schemes that map are: " + "; ".join(MAPPED)
    )


def write(qt: QuantizedTensor, name: str) -> dict[str, np.ndarray]:
    """The compressed-tensors safetensors entries of ``qt`` as NumPy arrays.

    ``weight`` is ``ml_dtypes.float8_e4m3fn`` (F8_E4M3), ``weight_packed`` and MX
    ``weight_scale`` uint8, float ``weight_scale`` float32 / float16 / ``ml_dtypes.bfloat16``.

    Parameters
    ----------
    qt : QuantizedTensor
        A rank-2 tensor of a scheme :func:`weight_args` maps.
    name : str
        The module prefix (``"model.layers.0.mlp.up_proj"``); ``""`` for unprefixed entries.

    Returns
    -------
    dict of str to numpy.ndarray

    Raises
    ------
    ParamsError
        ``qt`` is not a QuantizedTensor, or its arrays do not fit its scheme.
    SchemeError
        A scheme these formats cannot hold (the message lists the ones that map).
    ShapeError
        Not rank 2, or MX / group data whose last axis is not a multiple of the group.
    DTypeError
        ml_dtypes is missing.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> qt = aq.quantize(np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64), "mxfp4")
    >>> {k: (v.dtype.name, v.shape) for k, v in write(qt, "fc").items()}
    {'fc.weight_packed': ('uint8', (2, 32)), 'fc.weight_scale': ('uint8', (2, 2))}
    """
    if not isinstance(qt, QuantizedTensor):
        msg = f"qt must be an aq.QuantizedTensor, got {type(qt).__name__}"
        raise ParamsError(msg)
    shape = tuple(int(d) for d in qt.shape)
    mapped = weight_args(qt.scheme, shape)
    if mapped is None:
        raise _refuse(qt.scheme)
    fmt, args = mapped
    if len(shape) != 2:
        msg = f"tensor of shape {shape}: compressed-tensors stores Linear weights, which are rank 2 (rows, cols)"
        raise ShapeError(msg)
    group = args["group_size"]
    if group is not None and shape[1] % group:
        msg = (
            f"tensor of shape {shape}: {fmt} with groups of {group} needs the last axis to be a multiple of {group} "
            "(compressed-tensors refuses partial groups); pad the input before quantizing"
        )
        raise ShapeError(msg)
    try:
        import ml_dtypes
    except ImportError:
        msg = "compressed-tensors entries need ml_dtypes for float8_e4m3fn / bfloat16 (pip install ml_dtypes)"
        raise DTypeError(msg) from None
    plan = plan_for(qt.scheme)
    buf = to_bytes(qt)  # validates values and scales against the scheme
    vshape, _ = values_layout(plan, shape)
    grid = plan.grid_shape(shape)
    n_values = math.prod(vshape)
    values = np.frombuffer(buf, np.uint8, count=n_values).reshape(vshape).copy()
    scale_bytes = buf[n_values:]
    if fmt in (MXFP8, MXFP4):
        scale = np.frombuffer(scale_bytes, np.uint8, count=math.prod(grid)).reshape(grid).copy()
        if fmt == MXFP4:
            return {_key(name, "weight_packed"): values, _key(name, "weight_scale"): scale}
    else:
        sdtype = qt.scheme.scale_dtype
        raw = {ScaleDtype.F32: "<f4", ScaleDtype.F16: "<f2", ScaleDtype.BF16: "<u2"}[sdtype]
        native = {"<f4": np.float32, "<f2": np.float16, "<u2": np.uint16}[raw]
        scale = np.frombuffer(scale_bytes, raw, count=math.prod(grid)).astype(native)
        if sdtype is ScaleDtype.BF16:
            scale = scale.view(ml_dtypes.bfloat16)
        scale = scale.reshape(grid)  # (1,) per tensor, as compressed-tensors shapes it
    return {_key(name, "weight"): values.view(ml_dtypes.float8_e4m3fn), _key(name, "weight_scale"): scale}


def _host(key: str, arr: Any) -> np.ndarray:
    try:
        return np.asarray(shim.to_host(arr))
    except (TypeError, ValueError, RuntimeError) as exc:
        msg = f"entry {key!r} could not be read as a host array ({exc}); pass NumPy arrays"
        raise DTypeError(msg) from None


def _args_scheme(fmt: str, args: Mapping[str, Any], shape: tuple[int, int]) -> QuantScheme:
    """The arrayquant scheme the ``weights`` arguments describe, for a weight of ``shape``."""
    if fmt not in FORMATS:
        msg = f"format {fmt!r} is not one of this module's compressed-tensors formats {FORMATS}"
        raise SchemeError(msg)
    bits, typ, strategy = args.get("num_bits"), args.get("type"), args.get("strategy")
    if typ != "float" or not args.get("symmetric", True) or args.get("dynamic", False) not in (False, None):
        msg = f"{fmt} weights must be symmetric, static float; the config's weights arguments are {dict(args)}"
        raise SchemeError(msg)
    if fmt in (MXFP8, MXFP4):
        want = 8 if fmt == MXFP8 else 4
        if bits != want or strategy != "group" or args.get("group_size") != MX_GROUP:
            msg = f"{fmt} takes num_bits {want}, strategy 'group', group_size 32; the config says {dict(args)}"
            raise SchemeError(msg)
        return QuantScheme.mxfp8() if fmt == MXFP8 else QuantScheme.mxfp4()
    if bits != 8:
        msg = f"float-quantized weights are FP8 (num_bits 8); the config says num_bits {bits!r}"
        raise SchemeError(msg)
    base = QuantScheme().with_value("e4m3").with_store("native")
    if strategy == "tensor":
        return base.per_tensor()
    if strategy == "channel":
        return base.per_block(shape[1])
    if strategy == "group":
        g = args.get("group_size")
        if not isinstance(g, int) or g < 1:
            msg = f"float-quantized strategy 'group' needs a positive group_size, got {g!r}"
            raise SchemeError(msg)
        return base.per_block(g)
    if strategy == "block":
        bs = args.get("block_structure")
        if not (isinstance(bs, (list, tuple)) and len(bs) == 2 and all(isinstance(b, int) and b >= 1 for b in bs)):
            msg = f"float-quantized strategy 'block' needs block_structure [rows, cols], got {bs!r}"
            raise SchemeError(msg)
        return base.per_block(BlockSize(tuple(bs)))
    msg = f"float-quantized strategy {strategy!r} has no arrayquant scheme; tensor, channel, group and block map"
    raise SchemeError(msg)


def read(
    entries: Mapping[str, Any],
    name: str,
    fmt: str,
    args: Mapping[str, Any],
    *,
    backend: str | None = None,
    device: Any = None,
) -> QuantizedTensor:
    """The arrayquant tensor, bit for bit, that compressed-tensors' entries of ``name`` hold.

    Parameters
    ----------
    entries : mapping of str to array
        Safetensors entries as arrays (``weight`` as ``float8_e4m3fn`` or its uint8 codes,
        bf16 scales as ``ml_dtypes.bfloat16``).
    name : str
        The module prefix; ``""`` for unprefixed entries.
    fmt : str
        ``"mxfp8-quantized"``, ``"mxfp4-pack-quantized"`` or ``"float-quantized"``.
    args : mapping
        The ``weights`` QuantizationArgs of the config group, as in ``config.json``.
    backend, device : optional
        Where the result's arrays go (default backend, its default device).

    Returns
    -------
    QuantizedTensor
        dtype float32; MX schemes carry the default ``round_up`` scale rule.

    Raises
    ------
    SchemeError
        A format or arguments that do not describe a mapped scheme.
    CorruptDataError
        A missing entry, an entry of the wrong dtype, a NaN E4M3 code or UE8M0 code 255, a
        float scale that is not positive and finite.
    ShapeError
        Entries whose shapes disagree with each other or with the arguments.

    Examples
    --------
    >>> import numpy as np, arrayquant as aq
    >>> entries = {"fc.weight": np.array([[0x38, 0xC0]], np.uint8),       # 1.0, -2.0 in E4M3
    ...            "fc.weight_scale": np.array([0.5], np.float32)}
    >>> args = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"}
    >>> aq.dequantize(read(entries, "fc", "float-quantized", args, backend="numpy")).tolist()
    [[0.5, -1.0]]
    """
    wkey = _key(name, "weight_packed" if fmt == MXFP4 else "weight")
    skey = _key(name, "weight_scale")
    for key in (wkey, skey):
        if key not in entries:
            msg = f"the entries have no {key!r}; a compressed-tensors {fmt} weight {name!r} needs {wkey!r} and {skey!r}"
            raise CorruptDataError(msg)
    weight, scale = _host(wkey, entries[wkey]), _host(skey, entries[skey])
    if weight.dtype.name == "float8_e4m3fn" and fmt != MXFP4:
        weight = weight.view(np.uint8)
    if weight.dtype != np.uint8:
        want = "U8" if fmt == MXFP4 else "F8_E4M3"
        msg = f"entry {wkey!r} has dtype {weight.dtype}, but compressed-tensors {fmt} stores it as {want}"
        raise CorruptDataError(msg)
    if weight.ndim != 2 or min(weight.shape) < 1:
        msg = f"{wkey!r} has shape {weight.shape}; compressed-tensors weights are (rows, cols) with both at least 1"
        raise ShapeError(msg)
    rows, cols = int(weight.shape[0]), int(weight.shape[1]) * (2 if fmt == MXFP4 else 1)
    shape = check_shape((rows, cols), f"weight {name!r} shape")
    scheme = _args_scheme(fmt, args, (rows, cols))
    plan = plan_for(scheme)
    grid = plan.grid_shape(shape)
    group = args.get("group_size") if args.get("strategy") == "group" else None
    if group is not None and cols % group:
        msg = f"{wkey!r} holds {cols} columns, not a multiple of the group of {group} compressed-tensors requires"
        raise ShapeError(msg)
    if tuple(scale.shape) != grid:
        msg = f"{skey!r} has shape {tuple(scale.shape)}, but a {fmt} weight of shape {shape} ({scheme}) takes {grid}"
        raise ShapeError(msg)
    n = math.prod(grid)
    if fmt in (MXFP8, MXFP4):
        if scale.dtype != np.uint8:
            msg = f"entry {skey!r} has dtype {scale.dtype}, but {fmt} stores E8M0 scales as U8 (biased exponents)"
            raise CorruptDataError(msg)
        scales = decode_scales(np.ascontiguousarray(scale).tobytes(), ScaleDtype.UE8M0, n).reshape(grid)
    else:
        by_name = {v[1]: k for k, v in _FLOAT_SCALES.items()}
        sdtype = by_name.get(scale.dtype.name)
        if sdtype is None:
            msg = f"entry {skey!r} has dtype {scale.dtype}; float-quantized scales are float32, float16 or bfloat16"
            raise CorruptDataError(msg)
        scales = np.asarray(scale, np.float32).reshape(grid)
        if not np.all(np.isfinite(scales) & (scales > 0)):
            i = int(np.argmin(np.isfinite(scales) & (scales > 0)))
            msg = (
                f"{skey!r} holds {float(scales.reshape(-1)[i])!r} at flat index {i}; scales must be positive and finite"
            )
            raise CorruptDataError(msg)
        block = scheme.block
        scheme = scheme.per_tensor(sdtype) if block is None else scheme.per_block(block[0], sdtype)
    values = np.ascontiguousarray(weight)
    if fmt != MXFP4:
        nan = (values & 0x7F) == 0x7F
        if np.any(nan):
            i = int(np.argmax(nan))
            byte = int(values.reshape(-1)[i])
            msg = f"{wkey!r}: byte 0x{byte:02X} at flat index {i} is an E4M3 NaN; the data is corrupt"
            raise CorruptDataError(msg)
    qt = QuantizedTensor(scheme, shape, np.float32, values, scales, None)
    to_bytes(qt)  # the layout and every scale checked against the scheme
    return qt.to_backend(backend or default().name, device)
