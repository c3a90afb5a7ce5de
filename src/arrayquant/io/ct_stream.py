"""One weight of a safetensors file quantized into compressed-tensors entries, a row slab at a time.

The model writer never holds a whole float weight: it reads a slab of rows, quantizes it, encodes
it with the format's codec and keeps only the encoded slab, which is several times smaller. The
entries are the same bits as quantizing the whole tensor and encoding it once, because:

- blocks never straddle a slab: slabs are whole block rows, so each block's scale is computed
  from the same values;
- a scale that depends on the whole tensor (one scale per tensor, or a two-level scheme's global
  scale) is computed first, over all slabs, with :func:`~arrayquant.compute_range` and
  :func:`~arrayquant.compute_q_params`, and each slab is then quantized with those parameters,
  as :func:`~arrayquant.quantize` does itself within one call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backends import shim
from ..errors import NonFiniteInputError
from ..invariants import plan_for
from ..kernels import block_scales, normalise_scales
from ..quantize import compute_q_params, compute_range, quantize
from ..scheme import Calibration, QParams, QuantScheme
from .ct_formats import write_weight
from .reader import SafetensorsFile

__all__ = ["SLAB_BYTES", "quantize_entry"]

SLAB_BYTES = 2 << 20  # float32 bytes per slab; the working set is a few times this, beside the output

# entries with one row per weight row (or block row); the others are written once per weight
_ROWS = ("weight_packed", "weight")
_SCALES = ("weight_scale", "weight_zero_point")


def _slab_rows(scheme: QuantScheme, shape: tuple[int, ...], budget: int) -> int:
    """Rows per slab: about ``budget`` bytes of float32, a whole number of block rows."""
    dims = plan_for(scheme).block_dims(shape)
    step = dims[0] if len(dims) == len(shape) else 1  # a block shorter in rank lies within one row
    row_bytes = 4 * int(np.prod(shape[1:], dtype=np.int64))
    return max(step, budget // max(row_bytes, 1) // step * step)


def _range(st: SafetensorsFile, name: str, scheme: QuantScheme, start: int, stop: int) -> tuple[Any, Any]:
    """``compute_range`` of rows ``start:stop``, refusing NaN and infinity as :func:`quantize` does."""
    lo, hi = compute_range(st.rows(name, start, stop), scheme)
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        msg = (
            f"{name!r} holds NaN or infinity in rows {start}:{min(stop, st.entries[name].shape[0])}; "
            "quantize finite weights only (replace or clip the bad values first)"
        )
        raise NonFiniteInputError(msg)
    return lo, hi


def _glob(st: SafetensorsFile, name: str, scheme: QuantScheme, rows: int, step: int) -> Any:
    """The whole tensor's parameter, from one pass: its per-tensor ``QParams``, or a two-level global."""
    ranges = [_range(st, name, scheme, r, r + step) for r in range(0, rows, step)]
    if scheme.block is None:  # one range for the tensor
        lows, highs = zip(*ranges, strict=True)
        return compute_q_params(scheme, np.min(lows).reshape(1), np.max(highs).reshape(1))
    # the global follows the largest block scale, and grows with it: the largest of the slabs' globals
    globs = (compute_q_params(scheme, lo, hi).global_scale for lo, hi in ranges)
    return max(globs, key=lambda g: float(g[0]))


def _slab_params(st: SafetensorsFile, name: str, start: int, stop: int, scheme: QuantScheme, whole: Any) -> Any:
    """The parameters of one slab: none (all its own), the tensor's, or block scales under the global."""
    if whole is None or isinstance(whole, QParams):
        return whole
    plan, xp = plan_for(scheme), shim.kernel_namespace(np)
    lo, hi = _range(st, name, scheme, start, stop)
    raw = block_scales(np.maximum(np.abs(lo), np.abs(hi)), plan, xp=xp)
    return QParams(scales=normalise_scales(raw, whole, xp=xp), global_scale=whole)


def quantize_entry(
    st: SafetensorsFile,
    name: str,
    scheme: QuantScheme,
    module: str,
    *,
    slab_bytes: int = SLAB_BYTES,
    calibration: Any = "minmax",
    importance: Any = None,
) -> dict[str, np.ndarray]:
    """The compressed-tensors entries of the 2-d weight ``name`` of ``st``, quantized slab by slab.

    Equal, bit for bit, to ``write_weight(quantize(st.array(name), scheme, calibration=...,
    importance=...), module)``; raises as they do (a shape the format cannot hold, non-finite
    values, ...). A search calibration on a per-tensor or two-level scheme looks at the whole
    tensor at once, so that case reads it whole.
    """
    shape = st.entries[name].shape
    rows = shape[0]
    step = _slab_rows(scheme, shape, slab_bytes)
    extra: dict[str, Any] = {"calibration": calibration}
    if importance is not None:
        extra["importance"] = importance
    minmax = calibration is Calibration.MINMAX or (isinstance(calibration, str) and calibration.lower() == "minmax")
    if rows <= step or (not minmax and (scheme.block is None or scheme.is_two_level)):  # the plain path
        return write_weight(quantize(st.array(name), scheme, **extra), module)
    dims = plan_for(scheme).block_dims(shape)
    block_rows = dims[0] if len(dims) == len(shape) else 1
    whole = None if scheme.block is not None and not scheme.is_two_level else _glob(st, name, scheme, rows, step)
    out: dict[str, np.ndarray] = {}
    for start in range(0, rows, step):
        params = _slab_params(st, name, start, start + step, scheme, whole)
        slab = st.rows(name, start, start + step)
        # blocks lie within a slab: a search per block sees the same values as on the whole tensor
        entries = write_weight(quantize(slab, scheme, params, **({} if params is not None else extra)), module)
        del slab
        for key, arr in entries.items():
            part = key.rpartition(".")[2]
            if part == "weight_shape":
                out[key] = np.asarray(shape, dtype=arr.dtype)
            elif part in _ROWS or (part in _SCALES and scheme.block is not None):
                per = 1 if part in _ROWS else block_rows  # data rows per row of the entry
                if key not in out:  # filled in place: the output is never held twice
                    out[key] = np.empty((-(-rows // per), *arr.shape[1:]), arr.dtype)
                out[key][start // per : start // per + arr.shape[0]] = arr
            else:
                out.setdefault(key, arr)  # a whole-tensor value, the same in every slab
    return out
