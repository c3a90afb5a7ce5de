"""NVFP4 weights in the compressed-tensors layout (the format vLLM loads), read and written.

A compressed-tensors (``nvfp4-pack-quantized``) checkpoint stores a quantized weight ``<name>`` as
three safetensors entries:

- ``<name>.weight_packed``: uint8, two E2M1 codes per byte, element ``2k`` in the low nibble and
  ``2k + 1`` in the high nibble, shape ``(rows, cols // 2)``;
- ``<name>.weight_scale``: F8_E4M3 block scales, one per 16 elements along the last axis,
  shape ``(rows, cols // 16)``;
- ``<name>.weight_global_scale``: F32, shape ``(1,)``, a **divisor**: the effective scale of a
  block is ``weight_scale / weight_global_scale``.

This is arrayquant's ``nvfp4`` scheme (E2M1, block [16] UE4M3, per-tensor F32, PackedNative(0))
byte for byte in the values and block scales, with one difference: Burn's (and arrayquant's)
per-tensor scale ``g`` is a multiplier, ``eff = g * s``. So ``g = 1 / weight_global_scale``.

Sources, as read in the public repositories:

- vllm-project/compressed-tensors, ``compressors/quantized_compressors/fp4_quantized.py``
  (``NVFP4PackedCompressor``): ``compression_param_names`` are ``weight_packed``,
  ``weight_scale``, ``weight_zero_point``, ``weight_global_scale``; ``pack_fp4_to_uint8`` maps
  E2M1 values to indices 0..7 (0, 0.5, 1, 1.5, 2, 3, 4, 6) with the sign in bit 3 and packs
  ``indices[:, 0] | (indices[:, 1] << 4)``; ``unpack_fp4_from_uint8`` reads the low nibble first.
- compressed-tensors ``quantization/lifecycle/forward.py``: ``_quantize`` and ``_dequantize``
  both do ``scale = scale / global_scale`` before using the scale.
- compressed-tensors ``quantization/utils/helpers.py``, ``generate_gparam``:
  ``global_scale = FP8_E4M3.max * FP4_E2M1.max / amax`` (448 * 6 / amax), the reciprocal of
  Burn's ``g = max(s) / 448`` with ``s = amax / 6``.
- vllm-project/vllm, ``compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py``:
  ``weight_packed`` uint8 ``(out, in // 2)``, ``weight_scale`` float8_e4m3fn ``(out, in // 16)``,
  ``weight_global_scale`` float32, and in ``process_weights_after_loading`` ("CT stores as
  divisors, i.e. 1/scale"): ``layer.weight_global_scale = 1.0 / weight_global_scale`` in f32.

Rounding. Reading takes ``g = f32(1 / weight_global_scale)``, the same f32 division vLLM does,
so a tensor read here dequantizes with the multiplier vLLM uses. Writing stores
``weight_global_scale = f32(1 / g)``. The f32 reciprocal is not its own inverse: for 17.16% of
f32 values (1,439,258 of the 8,388,608 in [1, 2), counted exhaustively; the same share in every
binade) no f32 divisor at all has ``f32(1 / divisor) == g`` (the reciprocal misses them), and
``f32(1 / f32(1 / g))`` lands one ulp away. For the other 82.84%, powers of two included, the
round trip arrayquant -> compressed-tensors -> arrayquant gives ``g`` back exactly. Values and
block scales always go through bit for bit. The other direction, compressed-tensors ->
arrayquant -> compressed-tensors, may store a different divisor that has the same reciprocal in
f32, so vLLM computes the same multiplier from it. compressed-tensors' own emulation divides
(``f32(s / weight_global_scale)``) where arrayquant multiplies (``f32(g * s)``); the two
effective scales can differ by one ulp. tests/test_compressed_tensors.py measures all of this.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...backends import default, shim
from ...errors import CorruptDataError, DTypeError, MissingGlobalScaleError, ParamsError, SchemeError, ShapeError
from ...invariants import check_shape, plan_for
from ...scheme import QuantScheme, ScaleDtype
from ...storage import values_layout
from ...tensor import QuantizedTensor
from ..burn.bytes import check_codes, decode_scales, to_bytes
from ..safetensors.reader import SafetensorsFile

__all__ = ["read_nvfp4", "write_nvfp4"]

PACKED, SCALE, GLOBAL = "weight_packed", "weight_scale", "weight_global_scale"
# entry -> (safetensors header dtype, NumPy dtype of its raw bytes)
_LAYOUT = {PACKED: ("U8", "u1"), SCALE: ("F8_E4M3", "u1"), GLOBAL: ("F32", "<f4")}
GROUP = 16


def _key(name: str | None, part: str) -> str:
    return f"{name}.{part}" if name else part


def _read_file(path: Path, keys: list[str]) -> dict[str, np.ndarray]:
    """Just the entries ``keys`` of a safetensors file, through the one reader (the whole header checked)."""
    out: dict[str, np.ndarray] = {}
    with SafetensorsFile(path) as f:
        for key in keys:
            entry = f.entries.get(key)
            if entry is None:
                continue
            want = _LAYOUT[key.rsplit(".", 1)[-1]][0]
            if entry.dtype != want:
                msg = f"{path}: entry {key!r} has dtype {entry.dtype}, but compressed-tensors NVFP4 stores it as {want}"
                raise CorruptDataError(msg)
            out[key] = f.raw(key)
    return out


def _host(key: str, arr: Any) -> np.ndarray:
    """An entry given in memory as host bytes of its stored dtype (F8_E4M3 arrays as their codes)."""
    want = _LAYOUT[key.rsplit(".", 1)[-1]][1]
    try:
        host = np.asarray(shim.to_host(arr))
    except (TypeError, ValueError, RuntimeError) as exc:
        msg = f"entry {key!r} could not be read as a host array ({exc}); pass NumPy arrays"
        raise DTypeError(msg) from None
    if str(host.dtype) == "float8_e4m3fn":  # ml_dtypes, as aq.load returns F8_E4M3 entries
        host = host.view(np.uint8)
    if host.dtype != np.dtype(want):
        msg = f"entry {key!r} has dtype {host.dtype}, but compressed-tensors NVFP4 stores it as {np.dtype(want)}"
        raise CorruptDataError(msg)
    return host


def read_nvfp4(
    entries_or_path: Mapping[str, Any] | str | os.PathLike[str],
    name: str,
    *,
    backend: str | None = None,
    device: Any = None,
) -> QuantizedTensor:
    """The compressed-tensors NVFP4 weight ``name`` as an arrayquant ``nvfp4`` tensor.

    ``entries_or_path`` is a safetensors file (only the three entries of ``name`` are read) or
    a mapping of entry names to arrays (F8_E4M3 scales as ``ml_dtypes.float8_e4m3fn`` or as
    their uint8 codes). ``name`` is the module prefix, e.g. ``"model.layers.0.mlp.down_proj"``
    for ``model.layers.0.mlp.down_proj.weight_packed``; ``""`` reads unprefixed entries. The
    per-tensor multiplier is ``g = f32(1 / weight_global_scale)`` (see the module notes).

    >>> import numpy as np, arrayquant as aq
    >>> from arrayquant.io import read_nvfp4
    >>> entries = {"fc.weight_packed": np.array([[0x21, 0x0F] * 4], np.uint8),
    ...            "fc.weight_scale": np.array([[0x38]], np.uint8),   # 1.0 in F8_E4M3
    ...            "fc.weight_global_scale": np.array([0.5], np.float32)}
    >>> qt = read_nvfp4(entries, "fc", backend="numpy")
    >>> qt.global_scale.tolist(), aq.dequantize(qt)[0, :4].tolist()
    ([2.0], [1.0, 2.0, -12.0, 0.0])
    """
    keys = [_key(name, part) for part in (PACKED, SCALE, GLOBAL)]
    if isinstance(entries_or_path, (str, os.PathLike)):
        found = _read_file(Path(entries_or_path), keys)
        where = f"file {entries_or_path}"
    else:
        found = {k: _host(k, entries_or_path[k]) for k in keys if k in entries_or_path}
        where = "the mapping"
    packed_key, scale_key, global_key = keys
    for key in (packed_key, scale_key):
        if key not in found:
            msg = f"{where} has no {key!r}; a compressed-tensors NVFP4 weight {name!r} needs {', '.join(keys)}"
            raise CorruptDataError(msg)
    if global_key not in found:
        msg = (
            f"weight {name!r} uses the two-level scheme nvfp4, but {where} has no per-tensor scale "
            f"{global_key!r}; compressed-tensors writes it as an F32 divisor of shape (1,), add it"
        )
        raise MissingGlobalScaleError(msg)
    packed, codes, divisor = found[packed_key], found[scale_key], found[global_key]
    scheme = QuantScheme.nvfp4()
    plan = plan_for(scheme)
    if packed.ndim < 1 or packed.shape[-1] < 1 or min(packed.shape) < 1:
        msg = f"{packed_key!r} has shape {packed.shape}; it must be (rows, cols // 2) with at least one byte per row"
        raise ShapeError(msg)
    shape = check_shape((*packed.shape[:-1], 2 * packed.shape[-1]), f"weight {name!r} shape")
    grid = plan.grid_shape(shape)
    if tuple(codes.shape) != grid:
        msg = (
            f"{scale_key!r} has shape {tuple(codes.shape)}, but {packed_key!r} of shape {packed.shape} holds "
            f"data of shape {shape}, which takes one scale per {GROUP} along the last axis: {grid}"
        )
        raise ShapeError(msg)
    if divisor.size != 1:
        msg = f"{global_key!r} has shape {divisor.shape}; it must hold exactly one f32 divisor, shape (1,)"
        raise ShapeError(msg)
    with np.errstate(all="ignore"):  # NaN (signalling ones too), inf and zero divisors are refused below
        gs = np.float32(divisor.reshape(-1)[0])
        g = np.float32(1) / gs
    if not (np.isfinite(gs) and gs > 0 and np.isfinite(g) and g > 0):
        msg = (
            f"{global_key!r} is {float(gs)!r}; the compressed-tensors global scale is a divisor and must be a "
            f"positive finite f32 whose reciprocal is finite (it is 448 * 6 / amax when written)"
        )
        raise ParamsError(msg)
    vshape, _ = values_layout(plan, shape)
    values = np.ascontiguousarray(packed).reshape(vshape)
    check_codes(values, plan, f"weight {name!r}")
    scales = decode_scales(np.ascontiguousarray(codes).tobytes(), ScaleDtype.UE4M3, math.prod(grid)).reshape(grid)
    target = backend or default().name
    move = lambda a: shim.convert(a, target, device)
    xp = shim.namespace(target)
    return QuantizedTensor(scheme, shape, xp.float32, move(values), move(scales), move(np.array([g], np.float32)))


def _is_nvfp4(scheme: QuantScheme) -> bool:
    return dataclasses.replace(scheme, scale_rule="round_up") == QuantScheme.nvfp4()


def write_nvfp4(qt: QuantizedTensor, name: str | None = None, *, scale_codes: bool = False) -> dict[str, np.ndarray]:
    """The compressed-tensors entries of an ``nvfp4`` tensor, as NumPy arrays.

    Keys are ``weight_packed``, ``weight_scale`` and ``weight_global_scale``, prefixed with
    ``name + "."`` when a name is given. ``weight_scale`` is ``ml_dtypes.float8_e4m3fn`` (needs
    ml_dtypes), or its uint8 codes with ``scale_codes=True``. The divisor is ``f32(1 / g)``.
    The last axis must be a multiple of 16, as compressed-tensors and vLLM require.

    >>> import numpy as np, arrayquant as aq
    >>> from arrayquant.io import write_nvfp4
    >>> qt = aq.quantize(np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32), "nvfp4")
    >>> out = write_nvfp4(qt, "fc", scale_codes=True)
    >>> {k: (v.dtype.name, v.shape) for k, v in out.items()}["fc.weight_packed"]
    ('uint8', (2, 16))
    """
    if not isinstance(qt, QuantizedTensor):
        msg = f"qt must be an aq.QuantizedTensor, got {type(qt).__name__}"
        raise ParamsError(msg)
    if not _is_nvfp4(qt.scheme):
        msg = (
            f"compressed-tensors NVFP4 stores the scheme nvfp4 (E2M1, block [16] UE4M3, per-tensor f32, "
            f"packed_native), not {qt.scheme}; quantize with aq.quantize(x, 'nvfp4')"
        )
        raise SchemeError(msg)
    shape = tuple(qt.shape)
    if not shape or shape[-1] % GROUP:
        msg = (
            f"tensor of shape {shape}: compressed-tensors NVFP4 needs the last axis to be a multiple of {GROUP} "
            "(one F8_E4M3 scale per 16 values, packed two per byte); pad the input before quantizing"
        )
        raise ShapeError(msg)
    plan = plan_for(qt.scheme)
    buf = to_bytes(qt)  # validates the tensor; [values][UE4M3 codes][f32 g]
    vshape, _ = values_layout(plan, shape)
    grid = plan.grid_shape(shape)
    n_values, n_scales = math.prod(vshape), math.prod(grid)
    packed = np.frombuffer(buf, np.uint8, count=n_values).reshape(vshape).copy()
    codes = np.frombuffer(buf, np.uint8, count=n_scales, offset=n_values).reshape(grid).copy()
    g = np.frombuffer(buf, "<f4", count=1, offset=n_values + n_scales).astype(np.float32)[0]
    with np.errstate(over="ignore", divide="ignore"):
        divisor = np.float32(1) / g
    if not (g > 0 and np.isfinite(divisor)):
        msg = (
            f"per-tensor scale {float(g)!r} has no finite f32 reciprocal, so compressed-tensors cannot store it "
            "as a divisor; quantize with aq.quantize, which keeps it at least 1.1754944e-38"
        )
        raise ParamsError(msg)
    scale: np.ndarray = codes
    if not scale_codes:
        try:
            import ml_dtypes
        except ImportError:
            msg = "weight_scale as float8_e4m3fn needs ml_dtypes (pip install ml_dtypes), or pass scale_codes=True"
            raise DTypeError(msg) from None
        scale = codes.view(ml_dtypes.float8_e4m3fn)
    return {
        _key(name, PACKED): packed,
        _key(name, SCALE): scale,
        _key(name, GLOBAL): np.array([divisor], np.float32),
    }
